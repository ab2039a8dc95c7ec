"""`run_analysis` and `kvpool analyze` end to end on logs built to have a known answer."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from analyzer.advisor import AnalyzeOptions, Thresholds, run_analysis
from analyzer.advisor.measure import reusable_prefix_percentiles
from analyzer.cli import app
from analyzer.replay import ClusterConfig
from analyzer.report import render_json
from analyzer.report.document import report_json
from tests.helpers.traces import make_trace

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("advisor-logs")
    return {
        "low": make_logs.low_reuse(d / "low.jsonl"),
        "high": make_logs.high_reuse(d / "high.jsonl.gz"),
    }


def test_low_reuse_log_is_not_worth_it(logs):
    r = run_analysis([str(logs["low"])], AnalyzeOptions(sensitivity_replays=False))
    assert r.verdict == "not-worth-it"
    assert r.reuse.ceiling_hit_rate < 0.05
    assert "below the 30.0% guideline" in r.decision.reasons[0]


@pytest.fixture(scope="module")
def pooled(logs):
    return run_analysis([str(logs["high"])], make_logs.pooled_options())


def test_high_reuse_fast_pool_deploys_pooled(pooled):
    r = pooled
    assert r.verdict == "deploy-pooled", r.decision.reasons
    assert r.reuse.ceiling_hit_rate > 0.9
    assert r.decision.projection.pooled_ttft_reduction >= 0.25
    assert r.sizing is not None and r.sizing.pool
    # the pool deployed is the pool replayed: --pool-capacity-tokens here, else the knee
    plan = next(p for p in r.plans if p.option == "pooled")
    assert r.sizing.pool_capacity_tokens == plan.capacities.pool == 200_000
    assert r.sizing.instances == plan.instances and r.sizing.nodes == plan.nodes
    modes = {p.product: p.mode for p in r.settings}
    assert set(modes.values()) == {"pooled"}


def test_small_log_pays_on_latency_not_on_cost(logs, pooled):
    """One GPU serves this log's load whatever the option: on cost nothing pays, and the
    reason says so with the GPUs and money of each option."""
    opts = make_logs.pooled_options()
    r = run_analysis([str(logs["high"])], replace(opts, thresholds=Thresholds(objective="cost")))
    assert r.verdict == "not-worth-it"
    doc = report_json(r)
    fleet = doc["fleet"]
    assert fleet["pooled"]["gpus"] == fleet["local"]["gpus"]
    assert fleet["pooled"]["net_usd_month"] < 0
    assert any("No option lowers the monthly cost" in x for x in doc["verdict"]["reasons"])
    assert pooled.verdict == "deploy-pooled"  # the same log, objective ttft (latency first)


@pytest.mark.slow
def test_high_reuse_slow_network_is_local_offload_only(logs):
    # Host DRAM large enough for the documents (the pool link is what is slow).
    opts = make_logs.pooled_options(0.05, dram_capacity_tokens=50_000)
    r = run_analysis([str(logs["high"])], opts)
    assert r.verdict == "local-offload-only", r.decision.reasons
    pool = next(c for c in r.decision.checks if c.name == "bandwidth: the pool link")
    assert pool.passed is False and pool.value == 0.05
    assert "slower than recomputing" in r.decision.reasons[0]
    assert r.decision.projection.dram_ttft_reduction >= 0.02
    assert {p.mode for p in r.settings} == {"local-offload"}


def test_count_only_azure_trace_is_insufficient_data(shared_traces):
    path = shared_traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    r = run_analysis([str(path)], AnalyzeOptions())
    assert r.verdict == "insufficient-data"
    assert r.trace.count_only
    assert any("prompt content or block hashes" in m for m in r.decision.missing)
    assert r.replay is None and r.sizing is None and r.settings == ()
    doc = report_json(r)
    assert doc["verdict"]["missing"] and doc["schema"] == "kvpool.report/3"
    assert doc["plans"] == [] and doc["fleet"] == {}
    # nothing is sized, so deploy/ says so instead of shipping a tier
    assert [f["path"] for f in doc["deploy"]["files"]] == ["deploy/README.md"]


@pytest.mark.slow
def test_same_input_gives_byte_identical_json(logs, pooled, tmp_path):
    opts = make_logs.pooled_options()
    a = render_json(pooled)
    b = render_json(run_analysis([str(logs["high"])], opts))
    assert a == b
    doc = json.loads(a)
    assert doc["inputs"][0]["name"] == "input-1"  # file names only with --keep-names
    assert len(doc["inputs"][0]["sha256"]) == 64
    assert str(tmp_path) not in a and str(logs["high"].parent) not in a


@pytest.mark.slow
def test_an_already_loaded_trace_gives_the_same_report(logs, pooled):
    """The dashboard hands over its own ingestion: the report is the same bytes as a run
    that read the log itself (and dropped its table's block hashes once the trace was
    built), and the caller's table keeps its columns for the next what-if."""
    from analyzer.ingest import open_trace

    loaded = open_trace([str(logs["high"])])
    opts = make_logs.pooled_options()
    assert render_json(run_analysis(loaded.sources, opts, loaded=loaded)) == render_json(pooled)
    assert {"block_hashes", "content_hashes"} <= set(loaded.table.column_names)
    own = open_trace([str(logs["high"])])
    own.drop_block_columns()  # what a run that read the log itself does
    assert not {"block_hashes", "content_hashes"} & set(own.table.column_names)
    for name in ("offsets", "block_ids", "block_hashes", "content_ids", "arrival_s"):
        assert np.array_equal(getattr(own.trace, name), getattr(loaded.trace, name)), name
    with pytest.raises(ValueError, match="sources"):
        run_analysis([str(logs["low"])], opts, loaded=loaded)


@pytest.mark.slow
def test_remembered_replays_give_the_same_report(logs, pooled, monkeypatch):
    """The dashboard's incremental what-if: one replayer remembers every probe across
    analyses; the report is the same bytes, a change that no replay reads (a decision
    threshold) replays nothing, and a pool bandwidth replays only the pool's."""
    from dataclasses import replace

    import analyzer.advisor.size as size_mod
    from analyzer.advisor.figures import Thresholds
    from analyzer.advisor.replay import LocalReplayer, Services
    from analyzer.ingest import open_trace

    ran: list[str] = []
    real = size_mod.probe

    def counted(trace, cfg, spec, **kw):
        ran.append(spec.name)
        return real(trace, cfg, spec, **kw)

    monkeypatch.setattr(size_mod, "probe", counted)
    loaded = open_trace([str(logs["high"])])
    opts = make_logs.pooled_options()
    services = Services(LocalReplayer())
    first = run_analysis(loaded.sources, opts, loaded=loaded, services=services)
    assert render_json(first) == render_json(pooled)
    assert ran  # the first analysis replays
    ran.clear()
    stricter = replace(opts, thresholds=Thresholds(min_reuse=0.99, objective="ttft"))
    again = run_analysis(loaded.sources, stricter, loaded=loaded, services=services)
    assert ran == []
    assert render_json(again) == render_json(run_analysis(loaded.sources, stricter, loaded=loaded))
    ran.clear()
    slower = replace(opts, cluster=replace(opts.cluster, pool_gbps=5.0))
    third = run_analysis(loaded.sources, slower, loaded=loaded, services=services)
    assert ran and set(ran) == {"pooled"}
    assert render_json(third) == render_json(run_analysis(loaded.sources, slower, loaded=loaded))


def _percentiles_by_loop(t, warmup: float) -> tuple[int, int]:
    """The reusable prefix of each request block by block, with a set of seen blocks."""
    from analyzer.reuse.analysis import first_counted_request

    start = first_counted_request(t.n_requests, warmup)
    seen: set[int] = set()
    hits = []
    for i in range(t.n_requests):
        blocks = t.blocks_of(i).tolist()
        run = 0
        for b in blocks:
            if b not in seen:
                break
            run += 1
        if i >= start:
            hits.append(min(run * t.block_size, max(int(t.prompt_tokens[i]) - 1, 0)))
        seen.update(blocks)
    h = np.sort(np.array([x for x in hits if x > 0], dtype=np.int64))
    if h.size == 0:
        return 0, 0
    cum = np.cumsum(h)
    return int(h[np.searchsorted(cum, 0.5 * cum[-1])]), int(h[np.searchsorted(cum, 0.25 * cum[-1])])


def test_reusable_prefix_percentiles_against_a_loop(logs):
    from analyzer.ingest import open_trace

    t = open_trace([str(logs["high"])]).trace
    assert reusable_prefix_percentiles(t, 0.5) == _percentiles_by_loop(t, 0.5)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 12), max_size=9), min_size=1, max_size=30),
    st.lists(st.integers(0, 5), min_size=30, max_size=30),
    st.sampled_from([0.0, 0.3, 0.5]),
    st.sampled_from([1, 3, 7, 1 << 22]),
)
def test_reusable_prefix_percentiles_in_slices_against_a_loop(picks, extra, warmup, slice_):
    """Requests with repeated, new and no blocks, cut into slices of any size (a request
    larger than a slice included): the percentiles are the loop's."""
    from unittest import mock

    from analyzer.reuse import analysis

    dense: dict[int, int] = {}
    chains = [[dense.setdefault(b, len(dense)) for b in p] for p in picks]
    t = make_trace(chains, extra=extra[: len(chains)])
    with mock.patch.object(analysis, "PREFIX_SLICE", slice_):
        assert reusable_prefix_percentiles(t, warmup) == _percentiles_by_loop(t, warmup)


def test_cli_analyze_writes_three_reports(logs, tmp_path):
    out = tmp_path / "rep"
    res = CliRunner().invoke(app, ["analyze", str(logs["low"]), "-o", str(out), "--no-rate-search"])
    assert res.exit_code == 0, res.output
    assert "not-worth-it" in res.output
    for name in ("report.html", "report.md", "report.json"):
        assert (out / name).stat().st_size > 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"]["verdict"] == "not-worth-it"


def test_cli_unknown_model_is_a_usage_error(logs, tmp_path):
    from analyzer.errors import KvpoolError

    res = CliRunner().invoke(
        app, ["analyze", str(logs["low"]), "-o", str(tmp_path), "--model", "nope-1b"]
    )
    assert res.exit_code != 0
    assert isinstance(res.exception, KvpoolError)


@pytest.mark.slow
def test_bundled_mixed_sample_runs_with_defaults(tmp_path):
    sample = ROOT / "traces" / "mixed.jsonl.zst"
    if not sample.is_file():
        pytest.skip("traces/mixed.jsonl.zst is not generated yet")
    res = CliRunner().invoke(app, ["analyze", str(sample), "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["verdict"]["verdict"] in ("deploy-pooled", "local-offload-only", "not-worth-it")
    # the README quotes this run's summary as it is
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quoted = " ".join(line[2:] for line in readme.splitlines() if line.startswith("> "))
    assert " ".join(quoted.split()) == " ".join(" ".join(doc["summary"]).split())


def test_bad_cluster_options_fail_before_reading_the_log(tmp_path):
    from analyzer.errors import UsageError

    never_read = str(tmp_path / "absent.jsonl")
    with pytest.raises(UsageError, match="unknown router"):
        run_analysis([never_read], AnalyzeOptions(cluster=ClusterConfig(router="nope")))
    with pytest.raises(UsageError, match="gpus_per_node"):
        run_analysis([never_read], AnalyzeOptions(cluster=ClusterConfig(gpus_per_node=0)))


def test_cli_bad_inputs_are_user_errors(logs, tmp_path):
    from analyzer.errors import InputError, UsageError

    runner = CliRunner()
    missing = runner.invoke(app, ["analyze", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path)])
    assert isinstance(missing.exception, InputError)
    assert "nope.jsonl" in str(missing.exception)
    zero = runner.invoke(
        app, ["analyze", str(logs["low"]), "-o", str(tmp_path), "--pool-gbps", "0"]
    )
    assert isinstance(zero.exception, UsageError)
    assert "--pool-gbps" in str(zero.exception)
    cap = runner.invoke(
        app, ["analyze", str(logs["low"]), "-o", str(tmp_path), "--pool-capacity-tokens", "lots"]
    )
    assert isinstance(cap.exception, UsageError)
