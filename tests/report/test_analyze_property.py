"""End to end, as a user runs it: `kvpool analyze` on logs from the synthetic generator
and on degenerate logs (one request, identical, unique, empty, short and long shared
prefixes, one timestamp, several models) exits 0 or with a documented code, and every
report.json it writes loads with the report view and renders to Markdown and HTML.

Each example runs the real entry point in a memory-capped driver process
(tests/helpers/fuzz_driver.py). The degenerate logs are explicit examples, run every time; the
generator adds derandomized ones (``KVPOOL_E2E_EXAMPLES`` raises their number).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

DRIVER = Path(__file__).resolve().parents[1] / "helpers" / "fuzz_driver.py"
MEM_BYTES = 6 << 30
DOCUMENTED = {0, 2, 3, 4}  # docs/conventions.md "Exit codes"
EXAMPLES = int(os.environ.get("KVPOOL_E2E_EXAMPLES", "3"))
KINDS = (
    "one-request",
    "identical",
    "unique",
    "empty",
    "short-prefix",
    "long-prefix",
    "synth-chat",
    "synth-api",
    "synth-rag",
    "synth-agent",
)

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(f"{rng.choice(WORDS)}{rng.randrange(1000)}" for _ in range(n))


def degenerate_log(path: Path, kind: str, n: int, one_time: bool, models: int, seed: int) -> Path:
    """A log of ``kind`` (KINDS, not the synth ones) with ``n`` requests."""
    rng = random.Random(seed)
    n = 1 if kind == "one-request" else n
    doc = _text(rng, 2500)  # about 10k tokens, shared by every request of long-prefix
    same = _text(rng, 40)
    names = ["llama-3.1-8b", "qwen2.5-7b", "evil[/x] $(touch PWNED)"][:models]
    lines = []
    for i in range(n):
        if kind in ("identical", "one-request"):
            msgs = [{"role": "user", "content": same}]
        elif kind == "unique":
            msgs = [{"role": "user", "content": _text(rng, 60)}]
        elif kind == "empty":
            msgs = [{"role": "user", "content": ""}]
        elif kind == "short-prefix":
            msgs = [
                {"role": "system", "content": "Answer briefly and politely, in English only."},
                {"role": "user", "content": _text(rng, 8)},
            ]
        else:  # long-prefix
            msgs = [{"role": "system", "content": doc}, {"role": "user", "content": _text(rng, 8)}]
        lines.append(
            json.dumps(
                {
                    "timestamp": 1.7e9 if one_time else 1.7e9 + 0.5 * i,
                    "model": names[i % len(names)],
                    "user": f"tenant-{i % 3}",
                    "messages": msgs,
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def synth_log(path: Path, profile: str, n: int, seed: int) -> Path:
    from analyzer.synth import SynthConfig, generate

    generate(SynthConfig(profile=profile, requests=n, seed=seed), path)
    return path


def check_reports(out: Path) -> None:
    """What a successful run wrote loads with the view and renders, and names its files."""
    from analyzer.report import render_html, render_json, render_markdown
    from analyzer.report.document import ReportDocument

    doc = ReportDocument.load(out / "report.json")
    assert render_json(doc) == (out / "report.json").read_text()
    assert render_markdown(doc) == (out / "report.md").read_text()
    assert render_html(doc).startswith("<!DOCTYPE html>")
    for f in doc.report.deploy.files:
        assert (out / f.path).read_text() == f.text, f.path
    if doc.verdict != "insufficient-data":
        assert doc.report.deploy.files, "a verdict with no deployment bundle"


def run_analyze(root: Path, log: Path, flags: list[str]) -> dict:
    out = root / "report"
    out.mkdir()
    cases, results = root / "cases.json", root / "results.json"
    cases.write_text(
        json.dumps(
            {
                "mem_bytes": MEM_BYTES,
                "cpu_s": 900,
                "cases": [["-q", "analyze", str(log), "-o", str(out), *flags]],
            }
        )
    )
    r = subprocess.run(
        [sys.executable, str(DRIVER), str(cases), str(results)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (res,) = json.loads(results.read_text())
    return res


E2E = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate],
)


@pytest.mark.slow
@E2E
@given(
    kind=st.sampled_from(KINDS),
    n=st.integers(1, 260),
    one_time=st.booleans(),
    models=st.integers(1, 3),
    search=st.booleans(),
    seed=st.integers(0, 2**16),
)
@example(kind="one-request", n=1, one_time=False, models=1, search=False, seed=0)
@example(kind="identical", n=250, one_time=False, models=1, search=False, seed=0)
@example(kind="unique", n=250, one_time=False, models=1, search=False, seed=0)
@example(kind="empty", n=250, one_time=False, models=1, search=False, seed=0)
@example(kind="short-prefix", n=250, one_time=False, models=1, search=True, seed=0)
@example(kind="long-prefix", n=250, one_time=False, models=1, search=False, seed=0)
@example(kind="short-prefix", n=250, one_time=True, models=1, search=False, seed=1)
@example(kind="long-prefix", n=250, one_time=True, models=3, search=True, seed=2)
@example(kind="short-prefix", n=250, one_time=False, models=3, search=False, seed=3)
@example(kind="synth-api", n=260, one_time=False, models=1, search=False, seed=4)
def test_analyze_writes_reports_that_load_and_render(
    tmp_path_factory, kind, n, one_time, models, search, seed
):
    root = tmp_path_factory.mktemp("e2e")
    if kind.startswith("synth-"):
        log = synth_log(root / "log.jsonl", kind.removeprefix("synth-"), max(n, 2), seed)
    else:
        log = degenerate_log(root / "log.jsonl", kind, n, one_time, models, seed)
    flags = [] if search else ["--no-size-search"]
    res = run_analyze(root, log, flags)
    assert res["code"] in DOCUMENTED, res
    assert "Traceback" not in res["stderr"], res["stderr"]
    assert not list(root.rglob("PWNED*"))
    if res["code"] == 0:
        check_reports(root / "report")
    else:  # a refused run leaves no half-written report
        assert not list((root / "report").iterdir()), res
