"""Fuzzing: Hypothesis builds hostile logs (every text reader), hostile canonical Parquet,
hostile model, scenario and calibration files, and hostile flags, and the real commands
run on them in a subprocess capped by ``resource.setrlimit`` (address space, CPU time).

Every case must end with no traceback, an exit code from docs/conventions.md's set (0, 2, 3, 4),
and its input files byte-identical. The budget is fixed (``max_examples`` below, no
deadline, derandomized) so the file runs in well under a minute and the same cases run
in CI every time; ``KVPOOL_FUZZ_EXAMPLES`` raises it for a longer local hunt.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# Part of the full suite (CI), not of the development loop (`-m "not slow"`).
pytestmark = pytest.mark.slow

DRIVER = Path(__file__).resolve().parents[1] / "helpers" / "fuzz_driver.py"
MEM_BYTES = 4 << 30  # numba and pyarrow map ~1.5 GiB of address space at start-up
EXAMPLES = int(os.environ.get("KVPOOL_FUZZ_EXAMPLES", "2"))
OK_CODES = {0, 2, 3, 4}

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
    # No shrinking: each example is a subprocess; a failure is reported as generated.
    phases=[Phase.explicit, Phase.generate],
)

# --- building blocks ---------------------------------------------------------------------

text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
)
weird_number = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e308, 1e-308, 2**63, 2**64, 1e12, 253402300799]),
)
json_scalar = st.one_of(st.none(), st.booleans(), weird_number, text)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def chat_record(draw) -> dict:
    """An OpenAI-style request with any field possibly replaced by something hostile."""
    rec: dict = {
        "timestamp": 1_700_000_000 + draw(st.integers(0, 10_000)),
        "messages": [{"role": "user", "content": draw(text) or "hi"}],
        "model": "llama-3.1-8b",
    }
    for key in draw(
        st.lists(
            st.sampled_from(
                ["timestamp", "messages", "model", "tenant", "usage", "session_id", "request"]
            ),
            max_size=3,
        )
    ):
        rec[key] = draw(json_value)
    return rec


def _line(draw) -> bytes:
    kind = draw(st.sampled_from(["record", "record", "record", "junk", "deep", "bytes"]))
    if kind == "record":
        return json.dumps(draw(chat_record())).encode()
    if kind == "junk":
        return draw(text).encode()
    if kind == "deep":
        n = draw(st.integers(100, 5000))
        return b'{"messages": ' + b"[" * n + b"]" * n + b"}"
    return draw(st.binary(max_size=60)).replace(b"\n", b" ")


@st.composite
def jsonl_log(draw) -> bytes:
    good = [
        json.dumps(
            {
                "timestamp": 1_700_000_000 + i,
                "messages": [{"role": "user", "content": f"shared prefix {i % 3} " * 10}],
            }
        ).encode()
        for i in range(12)
    ]
    lines = good + [_line(draw) for _ in range(draw(st.integers(1, 8)))]
    order = draw(st.permutations(range(len(lines))))
    return b"\n".join(lines[i] for i in order) + b"\n"


@st.composite
def csv_log(draw) -> bytes:
    header = draw(
        st.sampled_from(
            [
                "TIMESTAMP,ContextTokens,GeneratedTokens",
                "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                "timestamp,prompt",
            ]
        )
    )
    ncol = header.count(",") + 1
    rows = []
    for i in range(draw(st.integers(3, 12))):
        cells = [
            draw(
                st.one_of(
                    st.just(str(1_700_000_000 + i)),
                    text.map(lambda s: '"' + s.replace('"', '""') + '"'),
                    weird_number.map(str),
                )
            )
            for _ in range(draw(st.sampled_from([ncol, ncol, ncol, ncol - 1, ncol + 1])))
        ]
        rows.append(",".join(cells))
    return (header + "\n" + "\n".join(rows) + "\n").encode()


# --- running -----------------------------------------------------------------------------


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir() if p.is_file()}


def run_cases(d: Path, cases: list[list[str]], inputs: list[str]) -> None:
    """Run ``cases`` in ``d`` under the caps; check codes, tracebacks and the inputs."""
    before = {n: h for n, h in _digest(d).items() if n in inputs}
    spec = d / "cases.json.spec"
    spec.write_text(json.dumps({"mem_bytes": MEM_BYTES, "cpu_s": 120, "cases": cases}))
    out = d / "results.json.spec"
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(spec), str(out)],
        cwd=d,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1", "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # the driver itself: not killed
    for r in json.loads(out.read_text()):
        assert r["code"] in OK_CODES, (r["args"], r["code"], r["stderr"])
        assert "Traceback" not in r["stderr"], (r["args"], r["stderr"])
    after = {n: h for n, h in _digest(d).items() if n in inputs}
    assert after == before, "an input file was modified"


@pytest.fixture
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz")
    (d / "out").mkdir()
    return d


# --- the fuzzers -------------------------------------------------------------------------


@FUZZ
@given(log=jsonl_log(), gz=st.booleans())
def test_hostile_jsonl_logs(work, log, gz):
    import gzip

    name = "log.jsonl.gz" if gz else "log.jsonl"
    data = gzip.compress(log, mtime=0) if gz else log
    if gz and len(data) > 40:
        data = data[: len(data) - 7] if log[:1] == b"{" else data  # sometimes truncated
    (work / name).write_bytes(data)
    run_cases(
        work,
        [
            ["convert", name, "-o", "out/t.parquet"],
            ["reuse", name, "--json", "out/r.json"],
            ["convert", name, "--to", "mooncake", "-o", "out/m.jsonl"],
        ],
        [name],
    )


@FUZZ
@given(log=csv_log())
def test_hostile_csv_logs(work, log):
    (work / "log.csv").write_bytes(log)
    run_cases(
        work,
        [
            ["convert", "log.csv", "-o", "out/t.parquet"],
            [
                "replay",
                "log.csv",
                "--model",
                "llama-3.1-8b",
                "--gpu",
                "h100",
                "--instances",
                "2",
                "--scenarios",
                "none,local",
                "--no-search",
            ],
        ],
        ["log.csv"],
    )


@pytest.fixture(scope="module")
def canonical_table(tmp_path_factory) -> pa.Table:
    d = tmp_path_factory.mktemp("canon")
    rows = [
        json.dumps(
            {
                "timestamp": 1_700_000_000 + i,
                "tenant": f"t{i % 2}",
                "messages": [{"role": "user", "content": f"prefix {i % 4} " * 30}],
            }
        )
        for i in range(30)
    ]
    (d / "log.jsonl").write_text("\n".join(rows) + "\n")
    from typer.testing import CliRunner

    from analyzer.cli import app

    r = CliRunner().invoke(app, ["convert", str(d / "log.jsonl"), "-o", str(d / "t.parquet")])
    assert r.exit_code == 0, r.output
    return pq.read_table(d / "t.parquet")


@FUZZ
@given(data=st.data())
def test_hostile_canonical_parquet(work, canonical_table, data):
    t = canonical_table
    column = data.draw(st.sampled_from(["prompt_tokens", "arrival_s", "output_tokens", "meta"]))
    if column == "meta":
        meta = dict(t.schema.metadata)
        key = data.draw(
            st.sampled_from([b"kvpool.block_size", b"kvpool.t0_epoch_s", b"kvpool.schema_version"])
        )
        meta[key] = data.draw(text).encode()
        t = t.replace_schema_metadata(meta)
    else:
        values = t.column(column).to_pylist()
        i = data.draw(st.integers(0, len(values) - 1))
        if column == "arrival_s":
            values[i] = data.draw(st.floats(allow_nan=True, allow_infinity=True))
        else:
            values[i] = data.draw(st.integers(-(2**62), 2**62))
        t = t.set_column(
            t.column_names.index(column), column, pa.array(values, t.schema.field(column).type)
        )
    pq.write_table(t, work / "t.parquet")
    run_cases(
        work,
        [
            ["reuse", "t.parquet"],
            [
                "replay",
                "t.parquet",
                "--model",
                "llama-3.1-8b",
                "--gpu",
                "h100",
                "--instances",
                "2",
                "--scenarios",
                "none,local",
                "--no-search",
            ],
        ],
        ["t.parquet"],
    )


model_config = st.fixed_dictionaries(
    {},
    optional={
        "num_hidden_layers": json_value,
        "hidden_size": json_value,
        "num_attention_heads": json_value,
        "num_key_value_heads": json_value,
        "intermediate_size": json_value,
        "vocab_size": json_value,
        "head_dim": json_value,
        "text_config": json_value,
    },
)


@FUZZ
@given(
    config=st.one_of(model_config.map(json.dumps), text, st.just("[" * 5000 + "]" * 5000)),
    scenario=st.one_of(
        st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "pool",
                    "pool_gbps",
                    "local_capacity_tokens",
                    "instances",
                    "eviction",
                    "router",
                    "dram_gbps",
                ]
            ),
            json_scalar,
            max_size=5,
        ).map(lambda d: json.dumps({"scenario": [d]})),
        text,
    ),
    calibration=st.lists(st.tuples(weird_number, weird_number), max_size=6).map(
        lambda rows: "prompt_tokens,ttft_s\n" + "".join(f"{a},{b}\n" for a, b in rows)
    ),
)
def test_hostile_config_and_calibration_files(work, config, scenario, calibration):
    (work / "config.json").write_text(config)
    (work / "s.json").write_text(scenario)
    (work / "cal.csv").write_text(calibration)
    (work / "log.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 1_700_000_000 + i,
                    "messages": [{"role": "user", "content": "same prefix " * 20}],
                }
            )
            + "\n"
            for i in range(10)
        )
    )
    run_cases(
        work,
        [
            ["cost", "show", "--model", "config.json", "--gpu", "h100"],
            [
                "cost",
                "ttft",
                "--model",
                "llama-3.1-8b",
                "--gpu",
                "h100",
                "--calibration",
                "cal.csv",
            ],
            [
                "replay",
                "log.jsonl",
                "--model",
                "llama-3.1-8b",
                "--gpu",
                "h100",
                "--instances",
                "2",
                "--config",
                "s.json",
                "--no-search",
            ],
        ],
        ["config.json", "s.json", "cal.csv", "log.jsonl"],
    )


flag_value = st.one_of(
    weird_number.map(lambda v: repr(v) if isinstance(v, float) and math.isfinite(v) else str(v)),
    text,
    st.sampled_from(["nan", "inf", "-inf", "1e300", "-5", "0", "unbounded", ""]),
)


@FUZZ
@given(
    flags=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "--instances",
                    "--tp",
                    "--pool-gbps",
                    "--ttft-slo",
                    "--warmup",
                    "--block-size",
                    "--time-scale",
                    "--local-capacity-tokens",
                    "--gpus-per-node",
                    "--token-ratio",
                ]
            ),
            flag_value,
        ),
        min_size=1,
        max_size=3,
    )
)
def test_hostile_flags(work, flags):
    (work / "log.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 1_700_000_000 + i,
                    "messages": [{"role": "user", "content": "same prefix " * 20}],
                }
            )
            + "\n"
            for i in range(10)
        )
    )
    replay_flags = [x for p in flags if p[0] != "--token-ratio" for x in p]
    cases = [
        [
            "replay",
            "log.jsonl",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--instances",
            "2",
            "--no-search",
            *replay_flags,
        ],
        [
            "convert",
            "log.jsonl",
            "-o",
            "out/t.parquet",
            *[x for p in flags if p[0] in ("--block-size", "--token-ratio") for x in p],
        ],
    ]
    run_cases(work, cases, ["log.jsonl"])
