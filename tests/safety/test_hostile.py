"""The hostile-input review's reproducers: each is a one-line error or a counted skip,
in bounded time and memory, with the input untouched (docs/security.md).

The whole-process cases run the real ``kvpool`` in a subprocess under an address-space
limit (``resource.setrlimit``), so "bounded memory" is measured, not assumed.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.errors import InputError, UsageError
from analyzer.ingest import IngestOptions, open_trace
from analyzer.ingest.timeparse import timestamp_outliers
from analyzer.limits import RANGES
from analyzer.trace import read_canonical

SALT = b"hostile test salt"
OPTS = IngestOptions(salt=SALT)
MEM_LIMIT = 3 << 30  # address space: numba and pyarrow map ~1.5 GiB at start-up


def chat_line(i: int, t: float, text: str = "hello") -> str:
    return json.dumps(
        {"timestamp": t, "messages": [{"role": "user", "content": f"{text} {i} " * 20}]}
    )


def write_log(path: Path, n: int = 60, t0: float = 1.7e9) -> Path:
    path.write_text("".join(chat_line(i, t0 + i) + "\n" for i in range(n)))
    return path


def kvpool(*args: str, cwd: Path, timeout: float = 60, env: dict | None = None):
    """The real command, memory-capped; returns the CompletedProcess."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "analyzer.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
        cwd=cwd,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1", **(env or {})},
    )


def one_line_error(r, code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith("error: ")
    return r.stderr


# --- 4. compression bombs and huge lines ---------------------------------------------------


@pytest.mark.slow
def test_zstd_bomb_is_refused_in_bounded_memory(tmp_path):
    # 2 GiB of one repeated line compresses to a few hundred KB.
    cctx = zstandard.ZstdCompressor(level=3)
    line = (chat_line(0, 1.7e9) + "\n").encode()
    with open(tmp_path / "bomb.jsonl.zst", "wb") as f, cctx.stream_writer(f) as w:
        block = line * ((1 << 20) // len(line))
        for _ in range(2048):
            w.write(block)
    size = (tmp_path / "bomb.jsonl.zst").stat().st_size
    assert size < 4 << 20
    # The refusal comes once 64 MiB have inflated and been read as lines (about 15 s on
    # an idle 2-core machine); the timeout only guards against a hang.
    r = kvpool("convert", "bomb.jsonl.zst", "-o", "t.parquet", cwd=tmp_path, timeout=300)
    assert "compression bomb" in one_line_error(r, 3)
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.slow
def test_gzip_bomb_of_one_endless_line(tmp_path):
    raw = gzip.compress(b"{" + b" " * (300 << 20), compresslevel=9)
    (tmp_path / "bomb.jsonl.gz").write_bytes(raw)
    r = kvpool("convert", "bomb.jsonl.gz", "-o", "t.parquet", cwd=tmp_path)
    err = one_line_error(r, 3)
    assert "compression bomb" in err or "longer than" in err


@pytest.mark.slow
def test_a_huge_csv_field_is_an_error_not_a_memory_error(tmp_path):
    p = tmp_path / "big.csv"
    with open(p, "w") as f:
        f.write('timestamp,prompt\n1700000000,hi\n1700000001,"')
        chunk = "x" * (1 << 20)
        for _ in range(80):
            f.write(chunk)
        f.write('"\n')
    r = kvpool("convert", "big.csv", "-o", "t.parquet", cwd=tmp_path)
    assert "longer than 64 MiB" in one_line_error(r, 3)
    r = kvpool(
        "convert", "big.csv", "-o", "t.parquet", cwd=tmp_path, env={"KVPOOL_MAX_LINE_MB": "0"}
    )
    assert "KVPOOL_MAX_LINE_MB" in one_line_error(r, 2)


# --- 5. extreme lengths and flags ----------------------------------------------------------


def test_an_absurd_request_length_is_a_counted_skip(tmp_path):
    p = tmp_path / "az.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{i:02d}.0,{100 + i},10\n" for i in range(30))
        + "2023-11-16 18:16:00.0,1000000000000,16\n"
    )
    lt = open_trace([p], OPTS)
    assert lt.table.num_rows == 30
    assert lt.skipped.by_reason == {"prompt_tokens outside 0..10,000,000": 1}


@pytest.mark.parametrize(
    "flags",
    [
        ["--instances", "100000"],
        ["--instances", "1000000000"],
        ["--pool-gbps", "1e-6"],
        ["--tp", "0"],
        ["--time-scale", "1e-9"],
        ["--ttft-slo", "1e300"],
    ],
)
def test_extreme_replay_flags_are_usage_errors(tmp_path, flags):
    log = write_log(tmp_path / "in.jsonl")
    r = CliRunner().invoke(
        app,
        [
            "replay",
            str(log),
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--instances",
            "2",
            *flags,
        ],
    )
    assert isinstance(r.exception, UsageError), r.output
    assert "must be" in str(r.exception)


def test_extreme_values_in_a_scenario_file(tmp_path):
    log = write_log(tmp_path / "in.jsonl")
    cfg = tmp_path / "s.toml"
    cfg.write_text('[[scenario]]\nname = "slow"\npool = true\npool_gbps = 1e-6\n')
    r = CliRunner().invoke(
        app,
        [
            "replay",
            str(log),
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--instances",
            "2",
            "--config",
            str(cfg),
            "--scenarios",
            "slow",
        ],
    )
    assert isinstance(r.exception, UsageError | InputError), r.output


def test_convert_token_ratio_and_block_size_are_bounded(tmp_path):
    log = write_log(tmp_path / "in.jsonl")
    for flags in (["--token-ratio", "1e300"], ["--block-size", "12345678901234567890"]):
        r = CliRunner().invoke(
            app, ["convert", str(log), "-o", str(tmp_path / "t.parquet"), *flags]
        )
        assert isinstance(r.exception, UsageError), r.output


# --- 6. timestamps -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.0, 1.5e308, 253402300799.0, -1.7e9])
def test_one_outlier_timestamp_is_skipped_and_counted(tmp_path, bad):
    lines = [chat_line(i, 1.7e9 + i) for i in range(300)]
    lines[150] = chat_line(150, bad)
    p = tmp_path / "in.jsonl"
    p.write_text("\n".join(lines) + "\n")
    lt = open_trace([p], OPTS)
    assert lt.table.num_rows == 299
    assert sum(lt.skipped.by_reason.values()) == 1
    assert next(iter(lt.skipped.by_reason)) in (
        "timestamp far outside the file's others (outlier)",
        "negative timestamp",
    )
    assert f"{p}:151" in lt.skipped.examples[0]
    span = lt.table.column("arrival_s").to_numpy()
    assert span.max() == 299.0  # the trace spans its real 299 s, in seconds
    r = CliRunner().invoke(app, ["convert", str(p), "-o", str(tmp_path / "t.parquet")])
    assert "time span: 299.0 s" in r.output


def test_outlier_rule_leaves_real_traces_alone():
    rng = np.random.default_rng(0)
    burst = np.r_[np.zeros(900), rng.uniform(0, 3.6e6, 100)]  # relative ms, bursty
    mooncake = np.sort(rng.uniform(0, 3.6e6, 5000))
    epoch = 1.7e9 + np.sort(rng.exponential(0.1, 10_000)).cumsum()
    for v in (burst, mooncake, epoch, np.arange(5.0)):
        assert not timestamp_outliers(v).any()


# --- 7. canonical Parquet invariants -------------------------------------------------------


@pytest.fixture(scope="module")
def canonical(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("canon")
    log = write_log(d / "in.jsonl", n=40)
    r = CliRunner().invoke(app, ["convert", str(log), "-o", str(d / "t.parquet")])
    assert r.exit_code == 0, r.output
    return d / "t.parquet"


def _edited(src: Path, dst: Path, meta: dict | None = None, **cols) -> Path:
    t = pq.read_table(src)
    for name, fn in cols.items():
        i = t.column_names.index(name)
        t = t.set_column(i, name, fn(t.column(name)))
    if meta:
        m = dict(t.schema.metadata)
        m.update({k.encode(): v.encode() for k, v in meta.items()})
        t = t.replace_schema_metadata(m)
    pq.write_table(t, dst)
    return dst


def _set(i: int, value):
    def fn(col):
        values = col.to_pylist()
        values[i] = value
        return pa.array(values, col.type)

    return fn


@pytest.mark.parametrize(
    "meta, cols, what",
    [
        ({"kvpool.block_size": "3"}, {}, "block_hashes length"),
        ({"kvpool.block_size": "12345678901234567890"}, {}, "block_size"),
        ({}, {"prompt_tokens": _set(5, -3)}, "prompt_tokens outside"),
        ({}, {"prompt_tokens": _set(5, 10**15)}, "prompt_tokens outside"),
        ({}, {"arrival_s": _set(7, float("nan"))}, "not a finite number"),
    ],
    ids=["block_size_3", "block_size_20_digits", "negative", "huge", "nan"],
)
def test_canonical_invariants_are_checked_on_read(canonical, tmp_path, meta, cols, what):
    bad = _edited(canonical, tmp_path / "bad.parquet", meta, **cols)
    with pytest.raises(InputError, match=what):
        read_canonical(bad)
    r = CliRunner().invoke(app, ["reuse", str(bad)])
    assert isinstance(r.exception, InputError)


@pytest.mark.parametrize(
    "key, value",
    [
        ("kvpool.block_size", "sixteen"),
        ("kvpool.block_size", "\u00b2"),  # a digit to str.isdigit, not to int()
        ("kvpool.block_size", "0"),
        ("kvpool.block_size", "1000000"),
        ("kvpool.t0_epoch_s", "soon"),
        ("kvpool.t0_epoch_s", "nan"),
        ("kvpool.t0_epoch_s", "inf"),
    ],
)
def test_an_edited_block_size_or_start_time_is_named_by_every_reader(
    canonical, tmp_path, key, value
):
    """The whole-table read and the streamed one of `reuse` (which read the metadata
    apart) both refuse it naming the field; the streamed one raised a ValueError."""
    bad = _edited(canonical, tmp_path / "bad.parquet", {key: value})
    with pytest.raises(InputError, match=key):
        read_canonical(bad)
    (tmp_path / "r").mkdir()
    analyze = ["analyze", str(bad), "--no-size-search", "-o", str(tmp_path / "r")]
    for args in (["reuse", str(bad)], analyze):
        r = CliRunner().invoke(app, args)
        assert isinstance(r.exception, InputError), (args, r.exception)
        assert key in str(r.exception), (args, r.exception)


# --- 8. detection -------------------------------------------------------------------------


def test_one_malformed_first_line_does_not_hide_a_valid_file(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text(
        '{"timestamp": 1, "messa\n' + "".join(chat_line(i, 1.7e9 + i) + "\n" for i in range(20))
    )
    lt = open_trace([p], OPTS)
    assert lt.table.num_rows == 20 and lt.skipped.total == 1


def test_utf16_is_named(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_bytes("".join(chat_line(i, 1.7e9 + i) + "\n" for i in range(5)).encode("utf-16"))
    with pytest.raises(InputError, match="UTF-16"):
        open_trace([p], OPTS)


# --- tracebacks ---------------------------------------------------------------------------


@pytest.mark.slow
def test_deep_nesting_and_malformed_configs_are_one_line(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.json").write_text(deep)
    (tmp_path / "list.json").write_text("[1, 2, 3]")
    (tmp_path / "layers.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 10**30,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
            }
        )
    )
    for args in (
        ["cost", "show", "--model", "deep.json", "--gpu", "h100"],
        ["cost", "show", "--model", "list.json", "--gpu", "h100"],
        ["cost", "show", "--model", "layers.json", "--gpu", "h100"],
        ["cost", "show", "--profile", "deep.json", "--gpu", "h100"],
        ["validate", "deep.json", "--report", "deep.json"],
    ):
        r = kvpool(*args, cwd=tmp_path, timeout=30)
        assert r.returncode in (2, 3), (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.startswith("error:"), r.stderr


def test_range_table_is_documented():
    doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    for name in RANGES:
        assert f"`{name}`" in doc, name


def test_unsorted_canonical_rows_are_sorted_and_lose_their_token_lcp(canonical, tmp_path):
    reverse = _edited(canonical, tmp_path / "rev.parquet")
    t = pq.read_table(reverse)
    pq.write_table(t.take(pa.array(np.arange(t.num_rows)[::-1].copy())), reverse)
    back = read_canonical(reverse)
    arrival = back.column("arrival_s").to_numpy()
    assert (np.diff(arrival) >= 0).all()
    assert back.column("token_lcp_prev").null_count == back.num_rows
    assert back.column("block_hashes") == read_canonical(canonical).column("block_hashes")


@pytest.mark.slow
def test_analyze_under_an_address_space_limit_writes_its_reports(tmp_path):
    # V8 (inside vl-convert, the chart renderer) aborted the process under any
    # `ulimit -v` (exit 133, no report); the reports are now written without charts.
    write_log(tmp_path / "in.jsonl", n=80)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "analyzer.cli",
            "analyze",
            "in.jsonl",
            "-o",
            "rep",
            "--no-rate-search",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=cap,
        cwd=tmp_path,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "rep" / "report.html").is_file()


def test_duplicate_request_ids_are_counted(tmp_path):
    lines = [
        json.dumps({"request_id": f"r{i % 25}", **json.loads(chat_line(i, 1.7e9 + i))})
        for i in range(30)
    ]
    p = tmp_path / "in.jsonl"
    p.write_text("\n".join(lines) + "\n")
    lt = open_trace([p], OPTS)
    assert lt.table.num_rows == 30
    assert any("duplicate request ids: 5 rows" in n for n in lt.notes)
    assert not open_trace([write_log(tmp_path / "ok.jsonl")], OPTS).notes
