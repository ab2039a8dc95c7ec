"""Conventions every command follows: `--json -` writes the JSON alone on stdout (tables
go to stderr), piped tables are not cut at 80 columns, help text prints brackets as
written, and `synth` takes `-o/--out` like the other commands."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.cli.output import PIPE_WIDTH, console
from analyzer.report.schema import SCHEMA
from tests.fixtures.advisor import make_logs
from tests.helpers.traces import ROWS, canonical


def _stdout_json(result):  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_reuse_json_to_stdout(tmp_path):
    src = canonical(tmp_path / "t.parquet", ROWS)
    r = CliRunner().invoke(app, ["reuse", str(src), "--warmup", "0", "--json", "-"])
    doc = _stdout_json(r)
    assert doc["ceiling"]["block_size"] == 16
    assert "Ceiling" in r.stderr and "Ceiling" not in r.stdout
    assert not (tmp_path / "-").exists()


def test_replay_json_to_stdout(tmp_path):
    src = canonical(tmp_path / "t.parquet", ROWS)
    args = ["replay", str(src), "--instances", "1", "--scenarios", "local", "--no-search"]
    doc = _stdout_json(CliRunner().invoke(app, [*args, "--json", "-"]))
    assert set(doc["scenarios"]) == {"local"}


def test_analyze_json_to_stdout_is_report_json(tmp_path):
    log = make_logs.low_reuse(tmp_path / "low.jsonl")
    out = tmp_path / "report"
    r = CliRunner().invoke(
        app, ["analyze", str(log), "-o", str(out), "--no-rate-search", "--json", "-"]
    )
    assert r.exit_code == 0, r.output
    assert r.stdout == (out / "report.json").read_text(encoding="utf-8")
    assert json.loads(r.stdout)["schema"] == SCHEMA


def test_piped_tables_are_not_cut_at_80_columns():
    assert console().width == PIPE_WIDTH  # CliRunner and pytest capture: not a terminal


def test_help_prints_brackets_as_written():
    r = CliRunner().invoke(app, ["replay", "--help"], terminal_width=200)
    assert "[[scenario]]" in r.stdout


def test_synth_takes_out(tmp_path):
    out = tmp_path / "log.jsonl"
    r = CliRunner().invoke(app, ["synth", "--out", str(out), "-n", "5", "--profile", "chat"])
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 5


def test_verbose_logs_each_stage_and_quiet_logs_nothing(tmp_path):
    src = canonical(tmp_path / "t.parquet", ROWS)
    r = CliRunner().invoke(app, ["-v", "reuse", str(src), "--warmup", "0"])
    assert r.exit_code == 0, r.output
    assert "kvpool: reading:" in r.stderr and "kvpool: analysing reuse:" in r.stderr
    r = CliRunner().invoke(app, ["-q", "reuse", str(src), "--warmup", "0"])
    assert r.exit_code == 0, r.output
    assert "kvpool:" not in r.stderr
