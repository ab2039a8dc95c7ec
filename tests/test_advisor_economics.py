"""GPUs, money and the value decision: oracles for the load and capacity figures, the
price catalog, properties of the cost objective (a free GPU makes nothing pay; a dearer
one never turns a pool into not-worth-it), every verdict reason of the test logs checked
against the report's own numbers, and the recommended option passing its own pilot plan."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from analyzer.advisor import AnalyzeOptions, Thresholds, run_analysis
from analyzer.advisor.decide import decide
from analyzer.advisor.economics import (
    EconomicsInputs,
    LoadFigures,
    OptionResources,
    capacity,
    load_figures,
    option_costs,
    scaled,
)
from analyzer.advisor.figures import (
    BandwidthFigures,
    ReplayFigures,
    ReuseFigures,
    ScenarioFigures,
    TierFigure,
    TraceFigures,
    lookup,
    show,
)
from analyzer.advisor.validate import validate
from analyzer.cli import app
from analyzer.cost.prices import PriceOverrides, resolve_prices
from analyzer.errors import InputError, UsageError
from analyzer.replay import ClusterConfig
from analyzer.report.document import report_json

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)

TRACE = TraceFigures(
    n_requests=5000,
    count_only=False,
    duration_s=3600.0,
    prompt_tokens_total=10_000_000,
    mean_prompt_tokens=2000.0,
    block_size=16,
)
REUSE = ReuseFigures(measurable=True, ceiling_hit_rate=0.6, cold_ceiling_hit_rate=0.6)
BW = BandwidthFigures(
    prefix_tokens=4000,
    break_even_gbps=5.0,
    bytes_per_token=131072,
    prefill_tokens_per_s=5e9 / 131072,
    tiers=(
        TierFigure("dram", "pcie-gen5-dram", 45.0, 5e-6),
        TierFigure("pool", "rdma-200", 25.0, 2e-5),
    ),
)


def replay_of(rates: dict[str, float], ttft: dict[str, float] | None = None) -> ReplayFigures:
    ttft = ttft or {"local": 1.0, "local+dram": 0.9, "pooled": 0.6}
    return ReplayFigures(
        tuple(
            ScenarioFigures(n, 0.5, ttft[n], 2 * ttft[n], 3 * ttft[n], rates[n])
            for n in ("local", "local+dram", "pooled")
        ),
        nodes=8,
    )


def econ(gpu_hour: float = 4.0, dram_gb: float = 100.0, pool_gb: float = 200.0) -> EconomicsInputs:
    prices = resolve_prices("h100", PriceOverrides(gpu_hour_usd=gpu_hour))
    return EconomicsInputs(
        instances=8,
        tp=1,
        gpu="h100",
        load=LoadFigures(2.0, 3.0, 300.0),
        prices=prices,
        resources=(
            OptionResources("local+dram", dram_gb=dram_gb),
            OptionResources("pooled", dram_gb=pool_gb, nic_nodes=8, store=True),
        ),
    )


# -- load and capacity ---------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(0.0, 1000.0).map(lambda x: round(x, 3)), min_size=2, max_size=60),
    st.floats(1.0, 400.0),
)
def test_peak_window_against_a_brute_force_count(times, window):
    t = np.array(times)
    got = load_figures(t, window)
    s = np.sort(t)
    span = s[-1] - s[0]
    if span <= 0:
        assert got.mean_rps == 0.0
        return
    assert got.mean_rps == pytest.approx(len(s) / span)
    if span <= window:
        assert got.peak_rps == pytest.approx(got.mean_rps)
        return
    most = max(sum(1 for x in s if a <= x < a + window) for a in s)
    assert got.peak_rps == pytest.approx(max(got.mean_rps, most / window))


def test_capacity_is_instances_times_load_over_the_rate_multiple():
    inp = econ()
    cap = capacity(ScenarioFigures("pooled", 0.5, 1.0, 1.0, 1.0, 1.6), inp)
    assert cap.instances_mean == math.ceil(8 / 1.6) == 5
    assert cap.instances_peak == math.ceil(8 * 1.5 / 1.6) == 8
    assert cap.bound == "exact"
    assert capacity(ScenarioFigures("local", 0.5, 1.0, 1.0, 1.0, 1.0), inp).instances_mean == 8
    top = capacity(ScenarioFigures("x", 0.5, 1.0, 1.0, 1.0, 64.0, max_rate_capped=True), inp)
    assert top.bound == "at most" and top.instances_peak == 1
    assert capacity(ScenarioFigures("x", 0.5, 1.0, 1.0, 1.0, 0.0), inp).bound == "infeasible"
    assert capacity(ScenarioFigures("x", 0.5, 1.0, 1.0, 1.0, None), inp).bound == "unknown"
    tp2 = capacity(ScenarioFigures("x", 0.5, 1.0, 1.0, 1.0, 2.0), replace(inp, tp=2))
    assert tp2.gpus_mean == 2 * tp2.instances_mean


def test_option_costs_add_up():
    inp = econ(gpu_hour=4.0, dram_gb=100.0, pool_gb=200.0)
    costs = option_costs(replay_of({"local": 1.0, "local+dram": 1.2, "pooled": 2.0}), inp)
    month = 4.0 * inp.prices.hours_per_month
    base, pool = costs["local"], costs["pooled"]
    assert base.capacity.gpus_peak == 12 and pool.capacity.gpus_peak == 6
    assert base.total_usd_month == pytest.approx(12 * month)
    dram = inp.prices.dram_gb_month.usd
    added = 200 * dram + 8 * inp.prices.nic_node_month.usd + inp.prices.store_month.usd
    assert pool.added_usd_month == pytest.approx(added)
    assert pool.net_usd_month == pytest.approx(6 * month - added)
    assert pool.payback_months == pytest.approx(72 * 6 * 4.0 / pool.net_usd_month)
    assert base.payback_months is None and base.gpus_saved == 0


# -- prices --------------------------------------------------------------------------------


def test_every_catalog_price_is_sourced_and_dated():
    p = resolve_prices("h100")
    assert p.gpu_hour is not None and p.gpu_hour.usd > 0
    for row in p.used():
        assert row["source"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row
    for _gpu, price in p.gpu_hours_by_gpu:
        assert price.source and re.fullmatch(r"\d{4}-\d{2}-\d{2}", price.date)
    # a GPU without a catalog price is not priced, and the report says how to price it
    l40s = resolve_prices("l40s")
    assert l40s.gpu_hour is None
    assert "--gpu-hour-usd" in l40s.used()[0]["source"]


def test_price_file_and_flags_override_the_catalog(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text(
        '[gpus.h100]\nusd_per_gpu_hour = 2.0\nsource = "our contract"\ndate = "2026-11-01"\n'
        '[dram]\nusd_per_gb_month = 0.0\nsource = "bundled with the nodes"\n'
    )
    p = resolve_prices("h100", PriceOverrides(prices_file=str(f), nic_node_month_usd=120.0))
    assert p.gpu_hour.usd == 2.0 and p.gpu_hour.source == "our contract"
    assert p.dram_gb_month.usd == 0.0
    assert p.nic_node_month.usd == 120.0 and "--nic-node-month-usd" in p.nic_node_month.source
    assert p.store_month.usd == resolve_prices("h100").store_month.usd  # the catalog's


def test_bad_prices_are_user_errors(tmp_path):
    with pytest.raises(UsageError, match="--gpu-hour-usd"):
        PriceOverrides(gpu_hour_usd=-1.0)
    bad = tmp_path / "bad.toml"
    bad.write_text('[dram]\nusd_per_gb_month = "cheap"\nsource = "x"\n')
    with pytest.raises(InputError, match=r"bad\.toml.*dram\.usd_per_gb_month"):
        resolve_prices("h100", PriceOverrides(prices_file=str(bad)))
    nosrc = tmp_path / "nosrc.toml"
    nosrc.write_text("[dram]\nusd_per_gb_month = 1.0\n")
    with pytest.raises(InputError, match="source"):
        resolve_prices("h100", PriceOverrides(prices_file=str(nosrc)))
    with pytest.raises(UsageError, match="--objective"):
        Thresholds(objective="speed")


# -- the value decision --------------------------------------------------------------------


def test_cost_objective_pools_when_the_gpus_saved_pay_for_the_pool():
    rp = replay_of({"local": 1.0, "local+dram": 1.05, "pooled": 2.0})
    d = decide(TRACE, REUSE, BW, rp, Thresholds(), econ())
    assert d.verdict == "deploy-pooled", d.reasons
    assert all(f.holds() for facts in d.facts for f in facts)
    assert "6 GPUs instead of 12" in d.reasons[0]
    assert any("mean TTFT 1,000 ms -> 600 ms" in r for r in d.reasons)


def test_cost_objective_keeps_the_baseline_when_nothing_saves_a_gpu():
    rp = replay_of({"local": 1.0, "local+dram": 1.0, "pooled": 1.0})
    d = decide(TRACE, REUSE, BW, rp, Thresholds(), econ())
    assert d.verdict == "not-worth-it"
    assert "No option lowers the monthly cost" in d.reasons[-1]
    # a latency-first team gets the pool: 40% lower mean TTFT at no rate loss
    assert decide(TRACE, REUSE, BW, rp, Thresholds(objective="ttft"), econ()).verdict == (
        "deploy-pooled"
    )


def test_pool_margin_pays_for_the_operational_risk():
    # the pool saves two GPUs over local DRAM offload; a 50% margin is too much to ask
    rp = replay_of({"local": 1.0, "local+dram": 1.5, "pooled": 2.0})
    loose = decide(TRACE, REUSE, BW, rp, Thresholds(min_pool_saving=0.0), econ(pool_gb=0))
    strict = decide(TRACE, REUSE, BW, rp, Thresholds(min_pool_saving=0.5), econ(pool_gb=0))
    assert loose.verdict == "deploy-pooled"
    assert strict.verdict == "local-offload-only"
    assert any("margin" in r for r in strict.reasons)


rates = st.floats(0.05, 64.0)
gb = st.floats(0.0, 5000.0)


@settings(max_examples=200, deadline=None)
@given(rates, rates, rates, gb, gb)
def test_a_free_gpu_makes_no_option_pay(local, dram, pooled, dram_gb, pool_gb):
    rp = replay_of({"local": local, "local+dram": dram, "pooled": pooled})
    inp = econ(gpu_hour=0.0, dram_gb=dram_gb, pool_gb=pool_gb)
    d = decide(TRACE, REUSE, BW, rp, Thresholds(), inp)
    assert d.verdict == "not-worth-it", d.reasons
    for name, o in option_costs(rp, inp).items():
        assert o.net_usd_month <= 0, name


@settings(max_examples=300, deadline=None)
@given(rates, rates, rates, gb, gb, st.floats(0.1, 20.0), st.floats(0.0, 0.3))
def test_a_dearer_gpu_never_turns_a_pool_into_not_worth_it(
    local, dram, pooled, dram_gb, pool_gb, price, margin
):
    rp = replay_of({"local": local, "local+dram": dram, "pooled": pooled})
    th = Thresholds(min_pool_saving=margin)
    inp = econ(gpu_hour=price, dram_gb=dram_gb, pool_gb=pool_gb)
    if decide(TRACE, REUSE, BW, rp, th, inp).verdict != "deploy-pooled":
        return
    for f in (2.0, 10.0):
        assert decide(TRACE, REUSE, BW, rp, th, scaled(inp, gpu_price=f)).verdict != (
            "not-worth-it"
        )


# -- the test logs: reasons against the report's numbers, pilot plans ----------------------

NUMBER = re.compile(r"-?\$[\d,]+|[\d,]+ ms|\d[\d.]* GB/s|\d+\.\d%")


@pytest.fixture(scope="module")
def docs(tmp_path_factory, shared_traces) -> dict[str, dict]:
    d = tmp_path_factory.mktemp("econ-logs")
    high = make_logs.high_reuse(d / "high.jsonl")
    low = make_logs.low_reuse(d / "low.jsonl")
    ttft = make_logs.pooled_options()  # latency first (the fixture's objective)
    out = {
        "low": run_analysis([str(low)], AnalyzeOptions(sensitivity_replays=False)),
        "high-cost": run_analysis([str(high)], replace(ttft, thresholds=Thresholds())),
        "high-ttft": run_analysis([str(high)], ttft),
        "high-slow-pool": run_analysis(
            [str(high)], make_logs.pooled_options(0.05, dram_capacity_tokens=50_000)
        ),
        "mooncake": run_analysis(
            [str(shared_traces / "mooncake" / "conversation_trace.jsonl")],
            AnalyzeOptions(
                cluster=ClusterConfig(instances=8, gpus_per_node=1, router="round-robin"),
                sensitivity_replays=False,
            ),
        ),
        # the same cluster for a latency-first team: a recommended option to pilot
        "mooncake-ttft": run_analysis(
            [str(shared_traces / "mooncake" / "conversation_trace.jsonl")],
            AnalyzeOptions(
                cluster=ClusterConfig(instances=8, gpus_per_node=1, router="round-robin"),
                sensitivity_replays=False,
                thresholds=Thresholds(objective="ttft"),
            ),
        ),
    }
    return {k: report_json(r) for k, r in out.items()}


def test_every_reason_agrees_with_the_figures_it_shows(docs):
    walked = 0
    for name, doc in docs.items():
        v = doc["verdict"]
        assert len(v["reason_facts"]) == len(v["reasons"]), name
        for text, facts in zip(v["reasons"], v["reason_facts"], strict=True):
            shown = set()
            for f in facts:
                value = lookup(doc, f["figure"])
                assert value == pytest.approx(f["value"], rel=1e-5, abs=1e-9), (name, f)
                assert show(value, f["unit"]) in text, (name, f, text)
                shown.add(show(value, f["unit"]))
                if f["op"]:
                    other = lookup(doc, f["against"]) if f["against"] else f["against_value"]
                    assert other == pytest.approx(f["against_value"], rel=1e-5, abs=1e-9)
                    assert {
                        "<": value < other,
                        "<=": value <= other,
                        ">": value > other,
                        ">=": value >= other,
                        "==": value == other,
                    }[f["op"]], (name, f, text)
                walked += 1
            # every amount, latency, bandwidth and percentage a reason prints is a fact
            for number in NUMBER.findall(text):
                assert any(number in s for s in shown) or ("%" in number and facts), (
                    name,
                    number,
                    text,
                )
    assert walked >= 10


def test_the_mooncake_conversation_trace_decides_on_value(docs):
    doc = docs["mooncake"]
    econ_doc = doc["economics"]
    opts = econ_doc["options"]
    for name in ("local", "local+dram", "pooled"):
        assert opts[name]["gpus_at_peak_load"] >= opts[name]["gpus_at_mean_load"] >= 1
        assert opts[name]["total_usd_month"] > 0
    v = doc["verdict"]
    chosen = v["scenario"]
    # the verdict is the cheapest option (the pool by the margin), as its reasons say
    cheapest_local = min(opts["local"]["total_usd_month"], opts["local+dram"]["total_usd_month"])
    if chosen == "pooled":
        assert (
            opts["pooled"]["total_usd_month"]
            <= cheapest_local - v["figures"]["pool_margin_usd_month"]
        )
    else:
        assert opts[chosen]["total_usd_month"] == cheapest_local
    assert any(p["what"].startswith("GPU (h100)") and p["usd"] for p in econ_doc["prices"])
    assert len(doc["summary"]) == 3 and "GPU" in doc["summary"][1] and "$" in doc["summary"][1]
    sbs = doc["side_by_side"]
    assert sbs[0]["gpu"] == "h100" and 4 <= len(sbs) <= 6
    # the same two properties on the real trace's sensitivity rows
    rows = {
        r["value"].split(" ")[0]: r["verdict"]
        for r in doc["sensitivity"]["rows"]
        if r["dimension"] == "GPU price"
    }
    assert rows["x0"] == "not-worth-it"
    if v["verdict"] == "deploy-pooled":
        assert rows["x2"] != "not-worth-it" and rows["x10"] != "not-worth-it"


def _bench(scenario: dict, throughput: float, n: int = 1000) -> dict:
    t = scenario["ttft_s"]
    return {
        "num_prompts": n,
        "completed": n,
        "request_rate": throughput,
        "request_throughput": throughput,
        "duration": n / throughput,
        "mean_ttft_ms": 1000 * t["mean"],
        "p90_ttft_ms": 1000 * t["p90"],
        "p99_ttft_ms": 1000 * t["p99"],
    }


@pytest.mark.parametrize("name", ["mooncake-ttft", "high-ttft", "high-slow-pool"])
def test_the_recommended_option_passes_its_own_pilot_plan(docs, name, tmp_path):
    doc = docs[name]
    chosen = doc["verdict"]["scenario"]
    assert chosen in ("pooled", "local+dram"), doc["verdict"]["reasons"]
    report = tmp_path / "report.json"
    report.write_text(json.dumps(doc))
    sc = doc["replay"]["scenarios"]
    rate = 4.0
    a, b = sc[chosen]["max_rate_scale_at_slo"], sc["local"]["max_rate_scale_at_slo"]
    gain = (a / b) if a and b else 1.0
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_bench(sc["local"], rate)))
    cand = tmp_path / "cand.json"
    cand.write_text(json.dumps(_bench(sc[chosen], rate * gain)))
    v = validate([f"baseline={base}", f"candidate={cand}"], str(report))
    status = {g.gate.id: g.status for g in v.gates}
    assert status["main"] == "pass" and not v.failed, [
        (r.criterion.text, r.measured) for g in v.gates for r in g.results
    ]
    same = tmp_path / "same.json"
    same.write_text(json.dumps(_bench(sc["local"], rate)))
    v2 = validate([f"baseline={base}", f"candidate={same}"], str(report))
    assert {g.gate.id: g.status for g in v2.gates}["main"] == "fail"


def test_terminal_output_opens_with_the_summary(tmp_path):
    log = make_logs.high_reuse(tmp_path / "high.jsonl")
    out = CliRunner().invoke(
        app,
        [
            "analyze",
            str(log),
            "-o",
            str(tmp_path / "r"),
            "--pool-gbps",
            "50",
            "--instances",
            "4",
            "--gpus-per-node",
            "1",
            "--gpu-hour-usd",
            "2.5",
        ],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    first = " ".join(out.output.split())
    assert first.startswith(" ".join(doc["summary"][0].split()))
    assert doc["economics"]["prices"][0]["source"] == "set by --gpu-hour-usd"
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.splitlines()[2] == "## Summary"


def test_a_sub_millisecond_ttft_change_reads_as_less_than_1_ms_never_minus_zero():
    from analyzer.report.summary import _signed_ms

    assert _signed_ms(-0.0004) == "less than 1 ms"
    assert _signed_ms(0.0) == "less than 1 ms"
    assert _signed_ms(-0.002) == "-2 ms"
    assert _signed_ms(0.0126) == "+13 ms"
