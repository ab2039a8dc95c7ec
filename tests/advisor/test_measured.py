"""The hits the log already measured (usage.prompt_tokens_details.cached_tokens): the
measured rate, computed here independently from the raw lines, today's deployment
replayed beside it, and the fitted effective HBM capacity."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

from analyzer.advisor.current import FIT_ABS, CurrentDeployment, compare, with_comparison
from analyzer.advisor.figures import Decision
from analyzer.ingest import IngestOptions, open_trace
from analyzer.replay import ClusterConfig, run_replay
from analyzer.reuse.measured import measure_cached

ROOT = Path(__file__).resolve().parents[2]
CFG = ClusterConfig(model="llama-3.1-8b", gpu="h100", instances=2, warmup_fraction=0.5)


def _lines(name: str = "chat") -> list[str]:
    with open(ROOT / "traces" / f"{name}.jsonl.zst", "rb") as fh:
        return zstandard.ZstdDecompressor().stream_reader(fh).read().decode().splitlines()


def log_with_cached(tmp_path: Path, share, every: int = 7, name: str = "chat") -> Path:
    """The sample log with cached_tokens in its responses: ``share(k)`` of each prompt
    (as the engine counted it, usage.prompt_tokens); every ``every``-th leaves it out."""
    out = []
    for k, line in enumerate(_lines(name)):
        rec = json.loads(line)
        usage = rec["response"]["usage"]
        if every and k % every == 3:
            out.append(json.dumps(rec))
            continue
        usage["prompt_tokens_details"] = {"cached_tokens": int(share(k) * usage["prompt_tokens"])}
        out.append(json.dumps(rec))
    p = tmp_path / "cached.jsonl"
    p.write_text("\n".join(out) + "\n")
    return p


def independent_rate(path: Path, warmup: float = 0.5) -> tuple[float, int]:
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    order = sorted(range(len(recs)), key=lambda k: (recs[k]["timestamp"], k))
    steady = [recs[k] for k in order[math.floor(warmup * len(recs)) :]]
    cached = prompt = n = 0
    for r in steady:
        u = r["response"]["usage"]
        if "prompt_tokens_details" in u:
            cached += u["prompt_tokens_details"]["cached_tokens"]
            prompt += u["prompt_tokens"]
            n += 1
    return cached / prompt, n


@pytest.mark.slow
def test_measured_rate_is_cached_over_prompt_on_steady_requests(tmp_path):
    path = log_with_cached(tmp_path, lambda k: ((k * 37) % 100) / 100)
    trace = open_trace([path], IngestOptions()).trace
    m = measure_cached(trace, 0.5)
    want, n = independent_rate(path)
    assert m is not None and m.overall.requests == n
    assert m.overall.hit_rate == pytest.approx(want, rel=1e-12)
    assert m.steady_requests == trace.n_requests - trace.n_requests // 2
    assert 0.8 < m.coverage < 0.9  # one in seven responses left the field out
    # per model and over time add up to the whole
    assert sum(r.cached_tokens for r in m.by_model.values()) == m.overall.cached_tokens
    assert sum(w["prompt_tokens"] for w in m.over_time) == m.overall.prompt_tokens
    # a log without the field has no measured rate
    plain = open_trace([ROOT / "traces" / "chat.jsonl.zst"], IngestOptions()).trace
    assert measure_cached(plain) is None


@pytest.mark.slow
def test_today_is_replayed_and_a_capacity_fitted_when_they_differ(tmp_path):
    target = 0.30
    path = log_with_cached(tmp_path, lambda k: target, every=0)
    trace = open_trace([path], IngestOptions()).trace
    m = measure_cached(trace, 0.5)
    assert m is not None and m.overall.hit_rate == pytest.approx(target, abs=0.002)
    cmp = compare(trace, CFG, None, m, CurrentDeployment(router="round-robin"))
    # the projection is the replay of today's deployment, run here independently
    again = run_replay(
        trace, replace(CFG, router="round-robin"), ["local"], search_rate=False
    ).to_json()
    assert cmp.projected_hit_rate == again["scenarios"]["local"]["hit_rate"]
    assert (cmp.instances, cmp.router) == (2, "round-robin")
    assert not cmp.within_tolerance and cmp.projected_hit_rate > target + 0.05
    fitted = cmp.fitted_local_capacity_tokens
    assert fitted is not None and fitted < cmp.local_capacity_tokens
    redo = run_replay(
        trace,
        replace(CFG, router="round-robin", local_capacity_tokens=fitted),
        ["local"],
        search_rate=False,
    ).to_json()["scenarios"]["local"]["hit_rate"]
    assert redo == cmp.fitted_hit_rate and redo >= m.overall.hit_rate - FIT_ABS
    half = run_replay(
        trace,
        replace(CFG, router="round-robin", local_capacity_tokens=fitted // 2),
        ["local"],
        search_rate=False,
    ).to_json()["scenarios"]["local"]["hit_rate"]
    assert half < m.overall.hit_rate  # the fit is not just any large capacity
    # the verdict's confidence drops a step and says why
    d = Decision("local-offload-only", (), (), "high", ())
    d2 = with_comparison(d, cmp)
    assert (
        d2.confidence == "medium" and f"{fitted:,} tokens per instance" in d2.confidence_notes[-1]
    )


@pytest.mark.slow
def test_a_rate_no_capacity_reaches_is_said_so(tmp_path):
    path = log_with_cached(tmp_path, lambda k: 0.99, every=0)
    trace = open_trace([path], IngestOptions()).trace
    cmp = compare(trace, CFG, None, measure_cached(trace, 0.5))
    assert cmp.fitted_local_capacity_tokens is None
    assert "No HBM capacity reproduces it" in cmp.fit_note


@pytest.mark.slow
def test_analyze_reports_measured_against_projected(tmp_path, monkeypatch):
    from analyzer.cli import app

    monkeypatch.chdir(tmp_path)
    path = log_with_cached(tmp_path, lambda k: ((k * 37) % 100) / 100)
    out = tmp_path / "report"
    r = CliRunner().invoke(
        app,
        [
            "analyze",
            str(path),
            "-o",
            str(out),
            "--no-rate-search",
            "--current-instances",
            "2",
            "--current-router",
            "round-robin",
            "--current-local-capacity-tokens",
            "200000",
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "report.json").read_text())
    mp = doc["measured_vs_projected"]
    want, n = independent_rate(path)
    assert mp["measured"]["requests"] == n
    assert mp["measured"]["hit_rate"] == pytest.approx(want, abs=1e-6)
    pr = mp["projected"]
    assert (pr["instances"], pr["router"], pr["local_capacity_tokens_per_instance"]) == (
        2,
        "round-robin",
        200000,
    )
    assert mp["difference"] == pytest.approx(mp["measured"]["hit_rate"] - pr["hit_rate"], abs=2e-6)
    notes = " ".join(doc["verdict"]["confidence_statement"].split())
    assert ("differs from the replay of today's deployment" in notes) == (
        not mp["within_tolerance"]
    )
    md = (out / "report.md").read_text()
    assert "Measured against projected" in md
    bad = CliRunner().invoke(app, ["analyze", str(path), "-o", str(out), "--current-router", "x"])
    assert bad.exit_code != 0 and "current-router" in str(bad.exception)


def test_an_impossible_cached_count_is_a_counted_skip(tmp_path):
    recs = [json.loads(x) for x in _lines()[:5]]
    u = recs[2]["response"]["usage"]
    u["prompt_tokens_details"] = {"cached_tokens": u["prompt_tokens"] + 1}
    recs[3]["response"]["usage"]["prompt_tokens_details"] = {"cached_tokens": -1}
    p = tmp_path / "bad.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    loaded = open_trace([p], IngestOptions())
    assert loaded.skipped.by_reason == {"invalid value": 1, "negative value": 1}
    assert "usage.prompt_tokens_details.cached_tokens" in loaded.skipped.examples[0]
    assert loaded.table.num_rows == 3
