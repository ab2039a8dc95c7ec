"""The decision, sizing, product settings, sensitivity and gate plan as pure functions,
driven with hand-written figures whose answer is known."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.advisor import gates as gates_mod
from analyzer.advisor.decide import decide, project
from analyzer.advisor.figures import (
    VERDICTS,
    BandwidthFigures,
    ReuseFigures,
    TierFigure,
    TraceFigures,
)
from analyzer.advisor.gates import GATE_IDS, evaluate, gate_from_json, gate_to_json
from analyzer.advisor.plan import Fleet, PlanStatus
from analyzer.advisor.products import DOCS_CHECKED, translate
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import ClusterFigures, choose_block_size, choose_router, pick_nic, size
from tests.helpers.advisor import fleets, plan

TRACE = TraceFigures(
    n_requests=5000,
    count_only=False,
    duration_s=3600.0,
    prompt_tokens_total=10_000_000,
    mean_prompt_tokens=2000.0,
    block_size=16,
    sessions_known=True,
    tenants_known=True,
)
REUSE = ReuseFigures(
    measurable=True,
    ceiling_hit_rate=0.6,
    cold_ceiling_hit_rate=0.62,
    knee_tokens=2_000_000,
    footprint_tokens=3_000_000,
    median_prefix_tokens=4000,
    p25_prefix_tokens=1000,
    same_session_share=0.3,
    same_tenant_share=0.6,
    cross_tenant_share=0.1,
)


def bw(pool_gbps: float = 25.0, dram_gbps: float = 45.0, be: float = 5.0) -> BandwidthFigures:
    return BandwidthFigures(
        prefix_tokens=4000,
        break_even_gbps=be,
        bytes_per_token=131072,
        prefill_tokens_per_s=be * 1e9 / 131072,
        tiers=(
            TierFigure("dram", "pcie-gen5-dram", dram_gbps, 5e-6),
            TierFigure("pool", "rdma-200", pool_gbps, 2e-5),
        ),
    )


def test_the_cheapest_plan_meeting_the_slo_wins_and_the_reasons_say_why():
    # 8 GPUs for the baseline, 6 for the pool: two GPUs saved ($5,825) pay for 1,000 GB
    # of DRAM ($2,881) and the store's servers ($851)
    d = decide(TRACE, REUSE, bw(), fleets())
    assert d.verdict == "deploy-pooled" and d.scenario == "pooled"
    assert d.projection.pooled_ttft_reduction == pytest.approx(0.5)
    assert d.projection.pooled_throughput_gain == pytest.approx(8 / 6 - 1)
    assert any("on 6 GPUs where the baseline needs 8 GPUs" in r for r in d.reasons)
    assert any("saves 500 ms" not in r for r in d.reasons)  # no signed figures in reasons
    # DRAM bundled with the nodes: local offload is as cheap as the baseline, the pool
    # still saves two GPUs
    free = decide(TRACE, REUSE, bw(), fleets(dram_gb=0.0, pool_gb=0.0))
    assert free.verdict == "deploy-pooled"


def test_a_pool_saving_less_than_the_margin_is_not_deployed():
    # the pool needs as many GPUs as the baseline: it only adds cost
    d = decide(TRACE, REUSE, bw(), fleets(pooled=(8, 0.5)))
    assert d.verdict == "not-worth-it" and d.scenario == "local"
    assert any("No option lowers the monthly cost" in r for r in d.reasons)


def test_local_offload_wins_when_it_saves_a_gpu_for_less():
    d = decide(TRACE, REUSE, bw(), fleets(dram=(7, 0.9), pooled=(7, 0.5), dram_gb=100.0))
    assert d.verdict == "local-offload-only" and d.scenario == "local+dram"
    assert any("not cheaper by the" in r and "do not pool" in r for r in d.reasons)


def test_nvme_offload_can_be_the_verdict_and_says_which_tier():
    d = decide(
        TRACE,
        REUSE,
        bw(),
        fleets(dram=(7, 0.9), pooled=(8, 0.5), nvme=(7, 0.95), dram_gb=2000.0),
    )
    assert d.verdict == "local-offload-only" and d.scenario == "local+dram+nvme"
    assert any("NVMe tier holds the working set for less" in r for r in d.reasons)


def test_low_reuse_is_not_worth_it_with_the_30_percent_reason():
    d = decide(TRACE, replace(REUSE, ceiling_hit_rate=0.12), bw(), fleets())
    assert d.verdict == "not-worth-it"
    assert "30.0%" in d.reasons[0] and "12.0%" in d.reasons[0]
    assert d.checks[0].passed is False


def test_reuse_of_a_log_without_sessions_or_tenants_is_not_said_to_be_nobodys():
    """The reuse check names where the reused tokens come from; a log naming no sessions
    or tenants (Mooncake's hash_ids) cannot tell, and says so, rather than 0% of each."""
    d = decide(TRACE, REUSE, bw(), fleets())
    assert "of the reused tokens: same session 30.0%, same tenant 60.0%" in d.checks[0].text
    bare = replace(REUSE, same_session_share=0.0, same_tenant_share=0.0, cross_tenant_share=0.0)
    text = decide(TRACE, bare, bw(), fleets()).checks[0].text
    assert "the log names no sessions or tenants" in text and "same session 0.0%" not in text


def test_reuse_threshold_is_inclusive():
    assert (
        decide(TRACE, replace(REUSE, ceiling_hit_rate=0.30), bw(), fleets()).verdict
        != "not-worth-it"
    )
    assert (
        decide(TRACE, replace(REUSE, ceiling_hit_rate=0.2999), bw(), fleets()).verdict
        == "not-worth-it"
    )


def test_slow_pool_link_takes_the_pool_out():
    d = decide(TRACE, REUSE, bw(pool_gbps=1.0, be=5.0), fleets(dram=(7, 0.9), dram_gb=100.0))
    assert d.verdict == "local-offload-only"
    assert any("slower than recomputing" in r and "1 GB/s" in r for r in d.reasons)
    pool_check = next(c for c in d.checks if c.name == "bandwidth: the pool link")
    assert pool_check.passed is False and pool_check.value == 1.0 and pool_check.threshold == 5.0


def test_no_tier_beats_recompute_is_not_worth_it():
    d = decide(TRACE, REUSE, bw(pool_gbps=1.0, dram_gbps=2.0, be=5.0), fleets())
    assert d.verdict == "not-worth-it"


def test_no_option_meeting_the_slo_is_an_answer_not_a_fallback():
    d = decide(
        TRACE,
        REUSE,
        bw(),
        fleets(
            local=(None, 5.0),
            dram=(None, 4.0),
            pooled=(None, 3.0),
        ),
    )
    assert d.verdict == "cannot-meet-slo" and d.scenario is None
    assert d.confidence != "high"
    assert any("No tier is recommended" in r for r in d.reasons)
    # the size that would meet it, above the cap
    above = tuple(
        Fleet.of(o, (plan(o, None, 1.0, status=PlanStatus.ABOVE_CAP, above=90),))
        for o in ("local", "local+dram", "pooled")
    )
    d2 = decide(TRACE, REUSE, bw(), above)
    assert d2.verdict == "cannot-meet-slo"
    assert any("would meet it on 90 GPUs, above the cap of 64 GPUs" in r for r in d2.reasons)


def test_an_option_meeting_the_slo_where_the_baseline_cannot_is_the_answer():
    d = decide(TRACE, REUSE, bw(), fleets(local=(None, 5.0), dram=(None, 4.0), pooled=(30, 1.0)))
    assert d.verdict == "deploy-pooled"
    assert any("The baseline, the engines' HBM prefix cache alone" in r for r in d.reasons)


def test_without_a_gpu_price_the_fewest_gpus_decide():
    d = decide(TRACE, REUSE, bw(), fleets(priced=False))
    assert d.verdict == "deploy-pooled"
    assert "No GPU price" in " ".join(d.reasons)
    same = decide(TRACE, REUSE, bw(), fleets(pooled=(8, 0.5), priced=False))
    assert same.verdict == "not-worth-it"  # a tie goes to the simpler option


def test_count_only_is_insufficient_and_names_what_is_missing():
    t = replace(TRACE, count_only=True)
    d = decide(t, ReuseFigures(measurable=False, reason="counts only"), None, None)
    assert d.verdict == "insufficient-data"
    assert d.confidence == "low"
    assert "prompt content or block hashes" in d.missing[0]
    assert "hash_ids" in d.reasons[0] and "messages" in d.reasons[0]


def test_too_few_requests_is_insufficient():
    d = decide(replace(TRACE, n_requests=150), REUSE, bw(), fleets())
    assert d.verdict == "insufficient-data"
    assert "150 found, at least 200" in d.reasons[0]


def test_confidence_drops_near_thresholds_and_for_small_logs():
    assert (
        decide(TRACE, replace(REUSE, ceiling_hit_rate=0.9), bw(be=1.0), fleets()).confidence
        == "high"
    )
    near = decide(TRACE, replace(REUSE, ceiling_hit_rate=0.31), bw(), fleets())
    assert near.confidence == "medium" and "prefix reuse" in near.confidence_statement
    small = decide(replace(TRACE, n_requests=300), REUSE, bw(), fleets())
    assert small.confidence == "low"


def test_project_without_plans_or_baseline():
    assert project(()).pooled_ttft_reduction is None
    only = (Fleet.of("pooled", (plan("pooled", 4, 0.5),)),)
    assert project(only).pooled_ttft_reduction is None


gbps_st = st.floats(0.01, 500.0)
gpus_st = st.one_of(st.none(), st.integers(1, 40))


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 1.0), gbps_st, gbps_st, gpus_st, gpus_st, gpus_st, st.floats(0, 3000))
def test_verdict_rules_hold_on_random_plans(ceiling, pool, dram, local_n, dram_n, pool_n, dram_gb):
    """An independent restatement of the rules, checked on random plans."""
    r = replace(REUSE, ceiling_hit_rate=ceiling)
    b = bw(pool_gbps=pool, dram_gbps=dram, be=5.0)
    fl = fleets(local=(local_n, 1.0), dram=(dram_n, 0.9), pooled=(pool_n, 0.5), dram_gb=dram_gb)
    d = decide(TRACE, r, b, fl)
    assert d.verdict in VERDICTS
    cands = ["local"]
    if ceiling >= 0.3:
        cands += [o for o, g in (("local+dram", dram), ("pooled", pool)) if g >= 5.0]
    by = {f.option: f for f in fl}
    meeting = [c for c in cands if by[c].meets_slo]
    if not meeting:
        assert d.verdict == "cannot-meet-slo" and d.confidence != "high"
        return
    total = {c: by[c].money.total_usd_month for c in meeting}
    local = [c for c in ("local", "local+dram") if c in meeting]
    best = (
        min(local, key=lambda c: (total[c], ["local", "local+dram"].index(c)))
        if local
        else "pooled"
    )
    if "pooled" in meeting and local:
        ref = "local" if "local" in meeting else local[0]
        margin = 0.05 * total[ref]
        if total[best] - total["pooled"] >= margin and total[best] - total["pooled"] > 0:
            best = "pooled"
    assert d.scenario == best
    # a recommended tier always meets the SLO; a price of zero for the GPUs never makes
    # an option with more GPUs win
    assert by[d.scenario].meets_slo


# -- sizing and settings -------------------------------------------------------------------

CLUSTER = ClusterFigures(
    instances=8,
    tp=1,
    gpus_per_node=4,
    hbm_cache_tokens_per_instance=400_000,
    bytes_per_token=131072,
)


def _sizing(pool: bool):
    return size(
        pool=pool,
        knee_tokens=2_000_000,
        cluster=CLUSTER,
        break_even_short_gbps=6.0,
        replay_pool_read_gbps_per_node=3.0,
        network_tiers=[("tcp", 2.0), ("rdma-100", 10.875), ("rdma-200", 21.75)],
        granularity={16: 0.60, 64: 0.595, 256: 0.57, 512: 0.50},
        engine_block=16,
        same_session_share=0.3,
        sessions_known=True,
        policy_at_knee={"lru": 0.54, "s3fifo": 0.58, "optimal": 0.59},
    )


def test_sizing_pool_and_local():
    sp = _sizing(True)
    assert sp.nodes == 2 and sp.instances_per_node == 4
    assert sp.pool_capacity_tokens == 2_000_000
    assert sp.dram_per_node_tokens == 1_000_000  # pool / nodes
    assert sp.pool_capacity_gb == pytest.approx(2_000_000 * 131072 / 1e9)
    assert sp.network_per_node_gbps == pytest.approx(12.0)  # 2 x break-even > replay's 3
    assert sp.nic == "rdma-200"
    assert sp.chunk_size_tokens == 64  # 256 loses 3 points
    assert sp.router == "prefix-aware"
    assert "s3fifo would gain 4.0 points" in sp.eviction_reason
    sl = _sizing(False)
    assert sl.pool_capacity_tokens == 0
    assert sl.dram_per_node_tokens == 2_000_000  # the knee: DRAM is the node's full cache
    assert "upper bound over 2 nodes" in sl.dram_reason


def test_block_size_and_nic_choices():
    assert choose_block_size({16: 0.5, 64: 0.49, 256: 0.485}, 16)[0] == 256
    assert choose_block_size({}, 16)[0] == 16
    assert pick_nic(100.0, [("a", 10.0), ("b", 50.0)]) == "b"  # nothing fits: the fastest


@given(
    share=st.floats(0.0, 1.0),
    known=st.booleans(),
    replayed=st.sampled_from(["prefix-aware", "kv-router", "session", "round-robin"]),
)
def test_the_router_recommended_is_the_router_replayed(share, known, replayed):
    """The plan's size and TTFT hold for the router it was replayed with: that is the one
    recommended, and another is named only as a suggestion not replayed."""
    router, why = choose_router(share, known, replayed)
    assert router == replayed
    assert why.startswith("the router the plan was replayed with")
    other = "session" if known and share >= 0.7 else "prefix-aware"
    suggests = replayed != other and not (other == "prefix-aware" and replayed == "kv-router")
    assert ("a suggestion not replayed" in why) == suggests
    if suggests:
        assert f"--router {other} sizes it" in why


def test_product_settings_use_documented_option_names():
    documented = " ".join(d["options"] for d in DOCS_CHECKED)
    for verdict in ("deploy-pooled", "local-offload-only", "not-worth-it"):
        sz = _sizing(verdict == "deploy-pooled")
        products = translate(
            sz, verdict, model=ServedModel(repo="meta-llama/Llama-3.1-8B-Instruct"), tp=1
        )
        assert [p.product for p in products] == [
            "vLLM",
            "LMCache",
            "Mooncake Store",
            "SGLang HiCache",
        ]
        for p in products:
            for s in p.settings:
                if not s.option.startswith("("):
                    for part in s.option.split("."):  # extra_config.global_segment_size
                        assert part in documented, (p.product, s.option)
    pooled = {
        p.product: p
        for p in translate(_sizing(True), "deploy-pooled", model=ServedModel(repo="m"), tp=1)
    }
    mc = json.loads(pooled["Mooncake Store"].snippet)
    # Embedded mode: every GPU rank contributes an equal segment (8 ranks, 4 per node),
    # in bytes (Mooncake reads "GB" as GiB).
    assert mc["global_segment_size"] == -(-2_000_000 * 131072 // 8)
    assert mc["protocol"] == "rdma" and mc["mode"] == "embedded"
    assert "--hicache-storage-backend mooncake" in pooled["SGLang HiCache"].snippet
    assert "MooncakeStoreConnector" in pooled["vLLM"].snippet
    assert "MOONCAKE_CONFIG_PATH=mooncake.json" in pooled["vLLM"].snippet
    local = {
        p.product: p
        for p in translate(_sizing(False), "local-offload-only", model=ServedModel(repo="m"), tp=1)
    }
    cfg = json.loads(local["vLLM"].snippet.split("--kv-transfer-config '")[1].rstrip("'"))
    assert cfg["kv_connector"] == "OffloadingConnector"
    per_instance = 2_000_000 * 131072 / 4
    assert cfg["kv_connector_extra_config"]["cpu_bytes_to_use"] >= per_instance
    assert "remote_url" not in local["LMCache"].snippet


# -- gates ---------------------------------------------------------------------------------


def test_gate_plan_and_evaluation():
    d = decide(TRACE, REUSE, bw(), fleets(pooled=(4, 0.5)))
    gates = gates_mod.plan(
        verdict=d.verdict,
        projection=d.projection,
        trace_rate_rps=2.0,
        projected_baseline_ttft_s=1.0,
    )
    assert tuple(g.id for g in gates) == GATE_IDS
    main = next(g for g in gates if g.id == "main")
    assert main.projected["ttft_reduction"] == pytest.approx(0.5)
    assert main.projected["throughput_gain"] == pytest.approx(1.0)  # 8 GPUs -> 4
    assert tuple(gate_from_json(json.loads(json.dumps(gate_to_json(g)))) for g in gates) == gates
    results = {
        "baseline": {
            "mean_ttft_s": 1.2,
            "p99_ttft_s": 3.0,
            "request_throughput": 2.0,
            "completed": 1000,
            "num_prompts": 1000,
            "requested_rate": 2.0,
        },
        "candidate": {
            "mean_ttft_s": 0.8,
            "p99_ttft_s": 3.2,
            "request_throughput": 2.1,
            "completed": 1000,
            "num_prompts": 1000,
        },
    }
    out = {g.gate.id: g for g in evaluate(gates, results)}
    assert out["arrival"].status == "pass"
    assert out["baseline"].status == "pass"  # |1.2 - 1.0| / 1.0 = 0.2 <= 0.5
    # 1 - 0.8/1.2 = 33% >= half of the projected 50%; throughput +5% < half of +100%
    assert out["main"].status == "fail"
    results["candidate"]["request_throughput"] = 3.2  # +60% >= +50%
    out = {g.gate.id: g for g in evaluate(gates, results)}
    assert out["main"].status == "pass"  # p99 ratio 1.067 <= 1.10
    assert out["stability"].status == "not-run"
    results["candidate"]["mean_ttft_s"] = 1.0  # 16.7% reduction < 25%
    out = {g.gate.id: g for g in evaluate(gates, results)}
    assert out["main"].status == "fail"
    red = next(r for r in out["main"].results if r.criterion.metric == "ttft_reduction")
    assert red.measured == pytest.approx(1 - 1.0 / 1.2) and red.passed is False
    assert red.criterion.threshold == pytest.approx(0.25)  # half of the projection


def test_local_dram_sizing_and_router_choice():
    kw = dict(
        pool=False,
        cluster=CLUSTER,
        break_even_short_gbps=6.0,
        replay_pool_read_gbps_per_node=0.0,
        network_tiers=[("rdma-200", 21.75)],
        granularity={},
        engine_block=16,
        same_session_share=0.9,
        sessions_known=True,
        policy_at_knee={},
    )
    s = size(knee_tokens=1_000_000, **kw)
    assert s.dram_per_node_tokens == 1_000_000
    assert "split across instances" in s.dram_reason  # 1M < 4 x 400k of HBM per node
    # 90% of reuse within sessions: the router replayed is deployed, session affinity
    # is named as a suggestion only
    assert s.router == CLUSTER.router == "prefix-aware"
    assert "session affinity may keep them local as well" in s.router_reason
    s0 = size(knee_tokens=0, **kw)
    modes = {p.mode for p in translate(s0, "local-offload-only", model=ServedModel(repo="m"), tp=1)}
    assert modes == {"prefix-cache-only"}


def test_coarse_trace_blocks_fall_back_to_vllm_default_block_size():
    sz = replace(_sizing(False), block_size_tokens=512, chunk_size_tokens=512)
    vllm = translate(sz, "local-offload-only", model=ServedModel(repo="m"), tp=1)[0]
    row = next(s for s in vllm.settings if s.option == "--block-size")
    assert row.value == "16" and "lower bound" in row.why
    assert "--block-size 16" in vllm.snippet


def test_local_dram_is_capped_at_what_the_replay_simulated():
    assert _sizing(False).dram_per_node_tokens == 2_000_000
    capped = size(
        pool=False,
        knee_tokens=2_000_000,
        cluster=CLUSTER,
        dram_simulated_tokens=500_000,
        break_even_short_gbps=6.0,
        replay_pool_read_gbps_per_node=0.0,
        network_tiers=[("rdma-200", 21.75)],
        granularity={},
        engine_block=16,
        same_session_share=0.1,
        sessions_known=True,
        policy_at_knee={},
    )
    assert capped.dram_per_node_tokens == 500_000
    assert "more DRAM would still add hits" in capped.dram_reason
