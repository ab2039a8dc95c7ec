"""`kvpool reuse` end to end: summary, JSON document, count-only inputs, flag errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.cli.reuse import parse_tokens_list
from analyzer.errors import UsageError
from tests.helpers.traces import ROWS, canonical


def test_summary_and_json(tmp_path):
    src = canonical(tmp_path / "t.parquet", ROWS)
    out = tmp_path / "reuse.json"
    r = CliRunner().invoke(
        app,
        ["reuse", str(src), "--warmup", "0", "--capacity-tokens", "32,64", "--json", str(out)],
    )
    assert r.exit_code == 0, r.output
    assert "Ceiling" in r.output and "same session" in r.output
    doc = json.loads(out.read_text())
    # independent count: r1 reuses 4 blocks (64 tok), r2 2, r3 2, r4 3, r5 2:
    # 64 + 32 + 32 + 48 + 32 of 370 prompt tokens
    assert doc["ceiling"]["hit_rate"] == pytest.approx(round(208 / 370, 6))
    assert doc["ceiling"]["warmup"] == 0.0 and doc["ceiling"]["block_size"] == 16
    assert [p["capacity_tokens"] for p in doc["curves"]["fifo"]] == [32, 64]
    assert set(doc["sources"]["tokens"]) >= {"same_session", "same_tenant", "cross_tenant"}
    assert doc["top_prefixes"]["by_count"][0]["requests"] == 5
    # the same flags give byte-identical JSON
    out2 = tmp_path / "again.json"
    r = CliRunner().invoke(
        app,
        ["reuse", str(src), "--warmup", "0", "--capacity-tokens", "32,64", "--json", str(out2)],
    )
    assert out2.read_bytes() == out.read_bytes()


@pytest.mark.slow
def test_block_size_coarsens_a_canonical_trace(tmp_path):
    src = canonical(tmp_path / "t.parquet", ROWS)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["reuse", str(src), "--block-size", "32", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["ceiling"]["block_size"] == 32
    r = CliRunner().invoke(app, ["reuse", str(src), "--block-size", "24"])
    assert isinstance(r.exception, UsageError) and "multiple" in str(r.exception)


def test_count_only_trace_says_reuse_cannot_be_measured(tmp_path):
    src = canonical(tmp_path / "c.parquet", [(None, None, 100, [])] * 3, count_only=True)
    out = tmp_path / "c.json"
    r = CliRunner().invoke(app, ["reuse", str(src), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "cannot be measured" in " ".join(r.output.split())
    assert json.loads(out.read_text())["measurable"] is False


def test_capacity_flags(tmp_path):
    src = canonical(tmp_path / "t.parquet", ROWS)
    r = CliRunner().invoke(app, ["reuse", str(src), "--capacity-gib", "8"])
    assert isinstance(r.exception, UsageError) and "--model" in str(r.exception)
    r = CliRunner().invoke(app, ["reuse", str(src), "--capacity-tokens", "lots"])
    assert isinstance(r.exception, UsageError)
    for bad in ("inf", "nan"):
        args = ["reuse", str(src), "--model", "llama-3.1-8b", "--capacity-gib", bad]
        r = CliRunner().invoke(app, args)
        assert isinstance(r.exception, UsageError) and "finite" in str(r.exception)
    r = CliRunner().invoke(app, ["reuse", str(src), "--kv-dtype", "fp8"])
    assert isinstance(r.exception, UsageError) and "--model" in str(r.exception)
    r = CliRunner().invoke(app, ["reuse", str(src), "--top", "-1"])
    assert isinstance(r.exception, UsageError) and "--top" in str(r.exception)
    assert parse_tokens_list("1M,4M,250k,1.5K") == (1_000_000, 4_000_000, 250_000, 1500)


def test_capacity_gib_with_a_model(tmp_path):
    cost = pytest.importorskip("analyzer.cost")
    bpt = cost.get_model("llama-3.1-8b").kv_bytes_per_token()
    src = canonical(tmp_path / "t.parquet", ROWS)
    out = tmp_path / "g.json"
    r = CliRunner().invoke(
        app,
        ["reuse", str(src), "--model", "llama-3.1-8b", "--capacity-gib", "1", "--json", str(out)],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["bytes_per_token"] == bpt
    row = doc["capacities"][0]
    assert row["capacity_tokens"] == 2**30 // bpt
    assert row["capacity_gib"] == pytest.approx(row["capacity_tokens"] * bpt / 2**30, abs=1e-3)


@pytest.mark.slow
def test_mooncake_trace_from_the_command_line(shared_traces, tmp_path):
    out = tmp_path / "m.json"
    path = shared_traces / "mooncake" / "conversation_trace.jsonl"
    r = CliRunner().invoke(app, ["reuse", str(path), "--policies", "lru", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "39.8%" in r.output
    assert json.loads(out.read_text())["ceiling"]["hit_rate"] == pytest.approx(0.397791)
