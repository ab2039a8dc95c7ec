"""GPUs, money and the value decision: oracles for the load and capacity figures, the
price catalog, properties of the cost objective (a free GPU makes nothing pay; a dearer
one never turns a pool into not-worth-it), every verdict reason of the test logs checked
against the report's own numbers, and the recommended option passing its own pilot plan."""

from __future__ import annotations

import importlib.util
import json
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
from analyzer.advisor.economics import load_figures, values
from analyzer.advisor.figures import (
    BandwidthFigures,
    ReuseFigures,
    TierFigure,
    TraceFigures,
    lookup,
    show,
)
from analyzer.advisor.plan import (
    Capacities,
    DeploymentPlan,
    Fleet,
    PlanLoad,
    PlanStatus,
    price,
    repriced,
)
from analyzer.advisor.validate import validate
from analyzer.cli import app
from analyzer.cost.prices import PriceOverrides, resolve_prices
from analyzer.errors import InputError, UsageError
from analyzer.replay import ClusterConfig
from analyzer.replay.run import TtftSummary
from analyzer.report.document import report_json

ROOT = Path(__file__).resolve().parents[2]
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


def plan(
    option: str, gpus: int | None, ttft: float, gpu_hour: float, gb: float = 0.0
) -> DeploymentPlan:
    """A plan of ``gpus`` instances of one GPU on nodes of one, whose option adds ``gb``
    of DRAM (a pool: its whole store), priced at ``gpu_hour``."""
    prices = resolve_prices("h100", PriceOverrides(gpu_hour_usd=gpu_hour))
    caps = Capacities(
        131072,
        400_000,
        dram_per_node=None if option != "local+dram" or not gpus else int(gb * 1e9 / 131072 / gpus),
        pool=int(gb * 1e9 / 131072) if option == "pooled" else None,
    )
    return DeploymentPlan(
        option=option,
        model="llama-3.1-8b",
        served_as="",
        gpu="h100",
        tp=1,
        gpus_per_node=1,
        router="prefix-aware",
        status=PlanStatus.MEETS if gpus else PlanStatus.CANNOT_MEET,
        instances=gpus,
        capacities=caps,
        load=PlanLoad(2.0, 3.0, 300.0),
        ttft_slo_s=2.0,
        money=price(
            option,
            instances=gpus,
            tp=1,
            gpus_per_node=1,
            capacities=caps,
            prices=prices,
            gpu="h100",
        ),
        ttft=TtftSummary(ttft, ttft, 2 * ttft, 3 * ttft, 4 * ttft),
    )


def fleets_of(
    gpus: dict[str, int | None],
    gpu_hour: float = 4.0,
    dram_gb: float = 100.0,
    pool_gb: float = 200.0,
    ttft: dict[str, float] | None = None,
) -> tuple[Fleet, ...]:
    ttft = ttft or {"local": 1.0, "local+dram": 0.9, "pooled": 0.6}
    gb = {"local": 0.0, "local+dram": dram_gb, "pooled": pool_gb}
    return tuple(
        Fleet.of(o, (plan(o, gpus[o], ttft[o], gpu_hour, gb[o]),))
        for o in ("local", "local+dram", "pooled")
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


def test_plan_money_adds_up_for_its_own_gpus_and_nodes():
    f = {x.option: x for x in fleets_of({"local": 12, "local+dram": 10, "pooled": 6})}
    prices = resolve_prices("h100", PriceOverrides(gpu_hour_usd=4.0))
    month = 4.0 * prices.hours_per_month
    base, pool, dram = f["local"], f["pooled"], f["local+dram"]
    assert base.money.total_usd_month == pytest.approx(12 * month)
    # the pool's DRAM, a NIC on each of its own 6 nodes, the store's servers
    added = 200 * prices.dram_gb_month.usd + 6 * prices.nic_node_month.usd + prices.store_month.usd
    assert pool.money.added_usd_month == pytest.approx(added, rel=1e-6)
    assert pool.money.nic_nodes == 6 == pool.nodes
    # local offload: DRAM per node times its own 10 nodes
    assert dram.money.dram_gb == pytest.approx(
        10 * dram.plans[0].capacities.gb(dram.plans[0].capacities.dram_per_node)
    )
    v = values(tuple(f.values()), prices)
    assert v["pooled"].gpus_saved == 6 and v["local"].gpus_saved == 0
    assert v["pooled"].net_usd_month == pytest.approx(6 * month - added, rel=1e-6)
    assert v["pooled"].payback_months == pytest.approx(72 * 6 * 4.0 / v["pooled"].net_usd_month)
    assert v["local"].payback_months is None


def test_nodes_follow_the_instances_and_tensor_parallelism():
    from analyzer.advisor.plan import nodes_for

    assert nodes_for(9, 1, 8) == 2 and nodes_for(8, 1, 8) == 1
    assert nodes_for(3, 4, 8) == 2  # two TP4 instances per 8-GPU node
    assert nodes_for(2, 16, 8) == 4  # a TP16 instance spans two nodes


# -- prices --------------------------------------------------------------------------------


def test_every_catalog_price_is_sourced_and_dated():
    p = resolve_prices("h100")
    assert p.gpu_hour is not None and p.gpu_hour.usd > 0
    for row in p.used():
        assert row.source and re.fullmatch(r"\d{4}-\d{2}-\d{2}", row.date), row
    for _gpu, gpu_price in p.gpu_hours_by_gpu:
        assert gpu_price.source and re.fullmatch(r"\d{4}-\d{2}-\d{2}", gpu_price.date)
    # a GPU without a catalog price is not priced, and the report says how to price it
    a800 = resolve_prices("a800")
    assert a800.gpu_hour is None
    assert "--gpu-hour-usd" in a800.used()[0].source
    # GPUs named as vendors and clouds write them find their price
    for name in ("H100-SXM", "h100_sxm", "NVIDIA H100 80GB HBM3", "p5.48xlarge"):
        assert resolve_prices(name).gpu_hour == p.gpu_hour, name
    assert resolve_prices("L40S").gpu_hour is not None


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


# -- the value decision: properties of the cost objective ------------------------------


def test_cost_objective_pools_when_the_gpus_saved_pay_for_the_pool():
    d = decide(TRACE, REUSE, BW, fleets_of({"local": 12, "local+dram": 12, "pooled": 6}))
    assert d.verdict == "deploy-pooled", d.reasons
    assert all(f.holds() for facts in d.facts for f in facts)
    assert "on 6 GPUs where the baseline needs 12 GPUs" in d.reasons[0]
    assert any("mean TTFT 1,000 ms for the baseline, 600 ms" in r for r in d.reasons)


def test_cost_objective_keeps_the_baseline_when_nothing_saves_a_gpu():
    fl = fleets_of({"local": 8, "local+dram": 8, "pooled": 8})
    d = decide(TRACE, REUSE, BW, fl)
    assert d.verdict == "not-worth-it"
    assert "No option lowers the monthly cost" in d.reasons[-1]
    # a latency-first team gets the pool: 40% lower mean TTFT on as many GPUs
    assert decide(TRACE, REUSE, BW, fl, Thresholds(objective="ttft")).verdict == "deploy-pooled"


def test_pool_margin_pays_for_the_operational_risk():
    # the pool saves two GPUs over local DRAM offload; a 50% margin is too much to ask
    fl = fleets_of({"local": 12, "local+dram": 8, "pooled": 6}, pool_gb=0.0)
    loose = decide(TRACE, REUSE, BW, fl, Thresholds(min_pool_saving=0.0))
    strict = decide(TRACE, REUSE, BW, fl, Thresholds(min_pool_saving=0.5))
    assert loose.verdict == "deploy-pooled"
    assert strict.verdict == "local-offload-only"
    assert any("margin" in r for r in strict.reasons)


counts = st.integers(1, 40)
gb = st.floats(0.0, 5000.0)


@settings(max_examples=200, deadline=None)
@given(counts, counts, counts, gb, gb)
def test_a_free_gpu_makes_no_option_with_more_gpus_pay(local, dram, pooled, dram_gb, pool_gb):
    fl = fleets_of({"local": local, "local+dram": dram, "pooled": pooled}, 0.0, dram_gb, pool_gb)
    d = decide(TRACE, REUSE, BW, fl)
    # with free GPUs an option costs only what it adds, and the baseline adds nothing
    assert d.verdict == "not-worth-it", d.reasons


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(counts, counts, counts, gb, gb, st.floats(0.1, 20.0), st.floats(0.0, 0.3))
def test_a_dearer_gpu_never_turns_a_pool_into_not_worth_it(
    local, dram, pooled, dram_gb, pool_gb, price_, margin
):
    th = Thresholds(min_pool_saving=margin)
    fl = fleets_of({"local": local, "local+dram": dram, "pooled": pooled}, price_, dram_gb, pool_gb)
    if decide(TRACE, REUSE, BW, fl, th).verdict != "deploy-pooled":
        return
    prices = resolve_prices("h100", PriceOverrides(gpu_hour_usd=price_))
    for f in (2.0, 10.0):
        dearer = tuple(
            Fleet.of(x.option, tuple(repriced(p, prices.scaled(gpu=f)) for p in x.plans))
            for x in fl
        )
        assert decide(TRACE, REUSE, BW, dearer, th).verdict != "not-worth-it"


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
                cluster=ClusterConfig(instances=8, gpus_per_node=1),
                sensitivity_replays=False,
            ),
        ),
        # the same cluster for a latency-first team: a recommended option to pilot
        "mooncake-ttft": run_analysis(
            [str(shared_traces / "mooncake" / "conversation_trace.jsonl")],
            AnalyzeOptions(
                cluster=ClusterConfig(instances=8, gpus_per_node=1),
                sensitivity_replays=False,
                thresholds=Thresholds(objective="ttft"),
            ),
        ),
    }
    return {k: report_json(r) for k, r in out.items()}


@pytest.mark.slow
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


@pytest.mark.slow  # a whole analyze of the public trace: 53 s of the development loop
def test_the_mooncake_conversation_trace_decides_on_value(docs):
    doc = docs["mooncake"]
    fleet = doc["fleet"]
    for name in ("local", "local+dram", "local+dram+nvme", "pooled"):
        f = fleet[name]
        if f["status"] == "meets-slo":
            assert f["gpus"] >= 1 and f["nodes"] >= 1 and f["money"]["total_usd_month"] > 0
            assert f["ttft_s"]["p90"] <= doc["options"]["ttft_slo_s"]
    v = doc["verdict"]
    chosen = v["scenario"]
    meeting = [n for n, f in fleet.items() if f["status"] == "meets-slo"]
    totals = {n: fleet[n]["money"]["total_usd_month"] for n in meeting}
    local = [n for n in ("local", "local+dram", "local+dram+nvme") if n in meeting]
    # the verdict is the cheapest option (the pool by the margin), as its reasons say
    if chosen == "pooled":
        assert (
            totals["pooled"]
            <= min(totals[n] for n in local) - v["figures"]["pool_margin_usd_month"]
        )
    else:
        assert totals[chosen] == min(totals[n] for n in local)
    assert any(p["what"].startswith("GPU (h100)") and p["usd"] for p in doc["economics"]["prices"])
    assert len(doc["summary"]) == 3 and "GPU" in doc["summary"][1] and "$" in doc["summary"][1]
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
    assert chosen in ("pooled", "local+dram", "local+dram+nvme"), doc["verdict"]["reasons"]
    report = tmp_path / "report.json"
    report.write_text(json.dumps(doc))
    fl = doc["fleet"]
    rate = 4.0
    gain = fl["local"]["gpus"] / fl[chosen]["gpus"]  # the same load on fewer GPUs
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_bench(fl["local"], rate)))
    cand = tmp_path / "cand.json"
    cand.write_text(json.dumps(_bench(fl[chosen], rate * gain)))
    v = validate([f"baseline={base}", f"candidate={cand}"], str(report))
    status = {g.gate.id: g.status for g in v.gates}
    assert status["main"] == "pass" and not v.failed, [
        (r.criterion.text, r.measured) for g in v.gates for r in g.results
    ]
    same = tmp_path / "same.json"
    same.write_text(json.dumps(_bench(fl["local"], rate)))
    v2 = validate([f"baseline={base}", f"candidate={same}"], str(report))
    assert {g.gate.id: g.status for g in v2.gates}["main"] == "fail"


@pytest.mark.slow
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


def test_a_ttft_change_is_said_in_words_never_with_a_sign():
    from analyzer.advisor.words import count, listed, ms_change

    assert ms_change(-0.0004) == "changes it by less than 1 ms"
    assert ms_change(0.0) == "changes it by less than 1 ms"
    assert ms_change(-0.181) == "saves 181 ms"
    assert ms_change(0.0126) == "adds 13 ms"
    assert count(1, "GPU") == "1 GPU" and count(2, "GPU") == "2 GPUs"
    assert listed(["a", "b", "c", "d", "e", "f", "g"]) == "a, b, c, d, e and 2 more"
