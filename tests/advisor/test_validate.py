"""`kvpool validate`: readers for vLLM bench JSON and CSV, gate evaluation, exit code 5."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.advisor.decide import decide
from analyzer.advisor.figures import (
    BandwidthFigures,
    ReuseFigures,
    TierFigure,
    TraceFigures,
)
from analyzer.advisor.gates import gate_to_json, plan
from analyzer.advisor.validate import assign_roles, read_results, validate
from analyzer.cli import app
from analyzer.errors import EXIT_GATES, InputError, UsageError
from tests.helpers.advisor import fleets

# What `vllm bench serve --save-result` writes (a subset of its keys, same names and units).
VLLM_BASE = {
    "date": "20261201-120000",
    "backend": "vllm",
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "num_prompts": 1000,
    "request_rate": 4.0,
    "duration": 251.3,
    "completed": 1000,
    "total_input_tokens": 2_000_000,
    "request_throughput": 3.98,
    "output_throughput": 512.0,
    "mean_ttft_ms": 820.0,
    "median_ttft_ms": 700.0,
    "std_ttft_ms": 300.0,
    "p99_ttft_ms": 2400.0,
    "errors": [""] * 3,
}


def _report(tmp_path: Path) -> Path:
    trace = TraceFigures(5000, False, 3600.0, 10_000_000, 2000.0, 16)
    reuse = ReuseFigures(True, 0.6, 0.6, knee_tokens=10_000, median_prefix_tokens=4000)
    bw = BandwidthFigures(
        4000,
        5.0,
        131072,
        38_000.0,
        (TierFigure("dram", "d", 45.0, 0.0), TierFigure("pool", "p", 25.0, 0.0)),
    )
    # the pool serves the load on 4 GPUs where the baseline needs 6: +50% per GPU
    d = decide(trace, reuse, bw, fleets(local=(6, 0.8), dram=(6, 0.7), pooled=(4, 0.4)))
    gates = plan(
        verdict=d.verdict,
        projection=d.projection,
        trace_rate_rps=4.0,
        projected_baseline_ttft_s=0.8,
    )
    doc = {
        "schema": "kvpool.report/3",
        "verdict": {"verdict": d.verdict},
        "gates": {"plan": [gate_to_json(g) for g in gates]},
    }
    p = tmp_path / "report.json"
    p.write_text(json.dumps(doc))
    return p


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_vllm_json_is_read_in_seconds(tmp_path):
    m = read_results(str(_write(tmp_path / "b.json", VLLM_BASE)), "baseline")
    assert m.fmt == "vllm-json"
    assert m.metrics["mean_ttft_s"] == pytest.approx(0.82)
    assert m.metrics["p99_ttft_s"] == pytest.approx(2.4)
    assert m.metrics["requested_rate"] == 4.0 and m.metrics["duration_s"] == 251.3
    inf = dict(VLLM_BASE, request_rate=float("inf"))
    (tmp_path / "inf.json").write_text(json.dumps(inf))  # Python writes Infinity
    assert "requested_rate" not in read_results(str(tmp_path / "inf.json"), "baseline").metrics


def test_json_lines_uses_the_last_run(tmp_path):
    p = tmp_path / "runs.jsonl"
    p.write_text(
        json.dumps(VLLM_BASE) + "\n" + json.dumps(dict(VLLM_BASE, mean_ttft_ms=500.0)) + "\n"
    )
    assert read_results(str(p), "baseline").metrics["mean_ttft_s"] == pytest.approx(0.5)


def test_csv_metric_value_and_per_request(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("metric,value\nmean_ttft_s,0.4\np99_ttft_ms,1500\nrequest_throughput,4.2\n")
    m = read_results(str(p), "candidate")
    assert m.fmt == "csv-metrics"
    assert m.metrics == {"mean_ttft_s": 0.4, "p99_ttft_s": 1.5, "request_throughput": 4.2}
    q = tmp_path / "r.csv"
    rows = ["start_s,ttft_s,latency_s,error"] + [
        f"{i},{0.1 * (i % 10 + 1)},2.0," for i in range(100)
    ]
    rows.append("100,,,timeout")
    q.write_text("\n".join(rows) + "\n")
    r = read_results(str(q), "candidate").metrics
    assert r["completed"] == 100 and r["failed"] == 1 and r["num_prompts"] == 101
    assert r["mean_ttft_s"] == pytest.approx(0.55)
    assert r["median_ttft_s"] == pytest.approx(0.55)
    assert r["duration_s"] == pytest.approx(101.0)  # first start 0, last end 99 + 2
    assert r["request_throughput"] == pytest.approx(100 / 101.0)


def test_bad_results_name_file_line_and_field(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("metric,value\nmean_ttft_s,fast\n")
    with pytest.raises(InputError) as e:
        read_results(str(p), "baseline")
    assert "bad.csv:2" in str(e.value) and "value" in str(e.value)
    q = tmp_path / "r.csv"
    q.write_text("ttft_s\n0.1\n-1\n")
    with pytest.raises(InputError, match=r"r\.csv:3 \(field 'ttft_s'\)"):
        read_results(str(q), "baseline")
    j = _write(tmp_path / "x.json", {"completed": 3})
    with pytest.raises(InputError, match="no TTFT figures"):
        read_results(str(j), "baseline")
    h = tmp_path / "h.csv"
    h.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="unrecognised CSV header"):
        read_results(str(h), "baseline")


def test_roles_from_labels_names_and_order():
    assert assign_roles(["candidate=a.json", "base.json"]) == [
        ("candidate", "a.json"),
        ("baseline", "base.json"),
    ]
    assert assign_roles(["x.json", "y.json", "soak.json"]) == [
        ("stability", "soak.json"),
        ("baseline", "x.json"),
        ("candidate", "y.json"),
    ]
    with pytest.raises(UsageError):
        assign_roles(["a", "b", "c", "d"])


def test_validate_passes_and_fails_gates(tmp_path):
    report = _report(tmp_path)
    base = _write(tmp_path / "baseline.json", VLLM_BASE)
    good = _write(
        tmp_path / "pool.json",
        # capacity runs: throughput +30% against the projected +50% (the gate asks half)
        dict(VLLM_BASE, mean_ttft_ms=410.0, p99_ttft_ms=2500.0, request_throughput=5.17),
    )
    v = validate([str(base), f"candidate={good}"], str(report))
    status = {g.gate.id: g.status for g in v.gates}
    assert status == {
        "arrival": "pass",
        "baseline": "pass",
        "isolation": "not-run",
        "main": "pass",
        "stability": "not-run",
    }
    assert not v.failed
    comp = {c.metric: c for c in v.comparisons}
    assert comp["ttft_reduction"].measured == pytest.approx(1 - 410 / 820, abs=1e-6)
    assert comp["ttft_reduction"].projected == pytest.approx(0.5)
    assert comp["ttft_reduction"].to_json()["difference"] == pytest.approx(-0.0, abs=1e-6)
    bad = _write(tmp_path / "pool2.json", dict(VLLM_BASE, mean_ttft_ms=700.0))
    v2 = validate([str(base), f"candidate={bad}"], str(report))
    assert v2.failed and {g.gate.id: g.status for g in v2.gates}["main"] == "fail"


def test_cli_validate_exit_codes(tmp_path):
    report = _report(tmp_path)
    base = _write(tmp_path / "baseline.json", VLLM_BASE)
    good = _write(
        tmp_path / "cand.json", dict(VLLM_BASE, mean_ttft_ms=400.0, request_throughput=5.2)
    )
    bad = _write(
        tmp_path / "cand2.json", dict(VLLM_BASE, mean_ttft_ms=800.0, request_throughput=5.2)
    )
    runner = CliRunner()
    ok = runner.invoke(
        app,
        [
            "validate",
            str(base),
            str(good),
            "--report",
            str(report),
            "--json",
            str(tmp_path / "v.json"),
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert "no gate failed" in ok.output
    assert json.loads((tmp_path / "v.json").read_text())["failed"] is False
    fail = runner.invoke(app, ["validate", str(base), str(bad), "--report", str(report)])
    assert fail.exit_code == EXIT_GATES, fail.output
    assert "gate failed" in fail.output and "Main gate" in fail.output


def test_validate_refuses_a_non_report(tmp_path):
    p = _write(tmp_path / "r.json", {"schema": "something-else"})
    with pytest.raises(InputError, match="not a kvpool report"):
        validate([str(p)], str(p))


def test_malformed_results_and_reports_are_input_errors(tmp_path):
    """Broken files name where they break; non-finite or negative figures are refused
    (they would otherwise be written to --json as invalid JSON ``Infinity``)."""
    pretty = tmp_path / "pretty.json"
    pretty.write_text('{"mean_ttft_ms": x,\n "completed": 3\n}\n')
    with pytest.raises(InputError, match=r"pretty\.json:1: invalid JSON"):
        read_results(str(pretty), "baseline")
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(VLLM_BASE) + "\n" + '{"mean_ttft_ms": \n')
    with pytest.raises(InputError, match=r"cut\.json:2: invalid JSON"):
        read_results(str(cut), "baseline")
    for value, what in (("inf", "finite"), (-5, "negative")):
        j = _write(tmp_path / "v.json", {**VLLM_BASE, "mean_ttft_ms": value})
        with pytest.raises(InputError, match=rf"\(field 'mean_ttft_ms'\).*{what}"):
            read_results(str(j), "baseline")
    closed = read_results(
        str(_write(tmp_path / "c.json", {**VLLM_BASE, "request_rate": "inf"})), "b"
    )
    assert "requested_rate" not in closed.metrics
    r = tmp_path / "r.csv"
    r.write_text("ttft_s\n0.1\ninf\n")
    with pytest.raises(InputError, match=r"r\.csv:3 \(field 'ttft_s'\)"):
        read_results(str(r), "baseline")

    good = _write(tmp_path / "base.json", VLLM_BASE)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not a UTF-8"):
        validate([str(good)], str(binary))
    for entries, field in (
        ([{"id": "main"}], "missing 'name'"),
        (["main"], "expected an object"),
        ([{"id": "m", "name": "M", "results_role": "candidate", "criteria": "x"}], "malformed"),
        (
            [
                {
                    "id": "m",
                    "name": "M",
                    "results_role": "candidate",
                    "criteria": [{"metric": "x", "op": ">=", "threshold": None}],
                }
            ],
            "threshold: expected a number, got NoneType",
        ),
        (
            [{"id": "m", "name": "M", "results_role": "c", "criteria": [], "projected": [1]}],
            "projected: expected an object",
        ),
    ):
        rep = _write(
            tmp_path / "rep.json", {"schema": "kvpool.report/3", "gates": {"plan": entries}}
        )
        with pytest.raises(InputError, match=rf"gates\.plan\[0\].*{field}"):
            validate([str(good)], str(rep))
    doc = json.loads(_report(tmp_path).read_text())
    doc["gates"]["plan"][0]["criteria"][0]["op"] = "=="
    with pytest.raises(InputError, match="unknown criterion operator"):
        validate([str(good)], str(_write(tmp_path / "op.json", doc)))
    doc = {"schema": "kvpool.report/3", "verdict": "x", "gates": {"plan": []}}
    assert validate([str(good)], str(_write(tmp_path / "v.json", doc))).verdict == ""


def test_an_empty_role_path_or_a_directory_is_named(tmp_path):
    with pytest.raises(UsageError, match="'candidate=' names no file"):
        assign_roles(["candidate="])
    with pytest.raises(InputError, match="is a directory"):
        read_results(str(tmp_path), "baseline")


def _probe(tmp_path: Path, **engine: bool) -> Path:
    """A real `kvpool probe` of two loopback engines sharing a pool."""
    from analyzer.advisor.probe import run_probe
    from tests.helpers.salted_engine import Engine, Pool, Served

    pool = Pool()
    served = [Served(Engine(pool=pool, **engine)) for _ in range(2)]
    try:
        result = run_probe([s.url for s in served], "m", words=120)
    finally:
        for s in served:
            s.close()
    return _write(tmp_path / "isolation-probe.json", result.to_json())


@pytest.mark.parametrize("leak", [False, True])
def test_the_isolation_gate_reads_the_probe(tmp_path, leak):
    report = _report(tmp_path)
    probe = _probe(tmp_path, leak_pool=leak)
    # Recognised by its schema, whatever its place on the command line.
    assert assign_roles([str(probe)]) == [("isolation", str(probe))]
    v = validate([str(probe)], str(report))
    gate = next(g for g in v.gates if g.gate.id == "isolation")
    assert gate.status == ("fail" if leak else "pass")
    assert v.failed is leak
    assert {g.gate.id: g.status for g in v.gates}["main"] == "not-run"
    r = CliRunner().invoke(app, ["validate", str(probe), "--report", str(report)])
    assert r.exit_code == (5 if leak else 0), r.output


def test_a_probe_cannot_stand_for_a_benchmark(tmp_path):
    probe = _probe(tmp_path)
    with pytest.raises(UsageError, match="cannot be the candidate role"):
        validate([f"candidate={probe}"], str(_report(tmp_path)))
    base = _write(tmp_path / "baseline.json", VLLM_BASE)
    with pytest.raises(UsageError, match="cannot be the isolation role"):
        validate([f"isolation={base}"], str(_report(tmp_path)))


@pytest.mark.parametrize("leak", [False, True])
def test_the_isolation_gate_reads_engine_counters(tmp_path, leak):
    """Two /metrics snapshots around the other-salt requests, as saved expositions."""
    from analyzer.advisor.probe import probe_prompt
    from tests.helpers.salted_engine import Engine, Pool

    pool = Pool()
    a, b = Engine(pool=pool, leak_pool=leak), Engine(pool=pool, leak_pool=leak)
    prompt = probe_prompt("n0nce", 120)
    a.complete({"prompt": prompt, "cache_salt": "a"})
    before = _write_text(tmp_path / "before.prom", b.metrics())
    b.complete({"prompt": prompt, "cache_salt": "b"})
    after = _write_text(tmp_path / "after.prom", b.metrics())
    report = _report(tmp_path)
    args = ["validate", "--report", str(report)]
    args += ["--prometheus", f"isolation={before}", "--prometheus", f"isolation={after}"]
    r = CliRunner().invoke(app, [*args, "--json", str(tmp_path / "v.json")])
    assert r.exit_code == (5 if leak else 0), r.output
    doc = json.loads((tmp_path / "v.json").read_text())
    gate = next(g for g in doc["gates"] if g["id"] == "isolation")
    counted = [c for c in gate["criteria"] if c["metric"] == "cross_salt_counter_hit_tokens"]
    assert counted and (counted[0]["measured"] > 0) is leak


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
