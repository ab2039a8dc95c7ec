"""Re-pricing a recorded replay for another link bandwidth or latency
(analyzer/replay/reprice.py), checked against its oracle: a full replay at the new
settings. Where the re-pricing says it is exact, every figure of the scenario (its JSON,
its TTFTs, its rate search) equals the replay's; where it does not, it says so with a
count of the requests it could not vouch for (bench/reprice.py measures that error)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.replay import ClusterConfig, ScenarioSpec, resolve, run_replay
from analyzer.replay.engine import simulate
from analyzer.replay.reprice import Unrepriceable, reprice_scenario, retime, timing_only
from tests.helpers.replay import AnalyticCost, build_trace, chained_requests

COST = AnalyticCost(bytes_per_token=10_000)
SCENARIOS = (
    ScenarioSpec("pooled", local=True, dram=True, pool=True),
    ScenarioSpec("pool-only", local=False, pool=True),
    ScenarioSpec("dram-nvme", local=True, dram=True, nvme=True),
)


def cluster(**kw) -> ClusterConfig:
    # re-timing is the prefill pool's: an aggregated replay is not re-timed
    base = dict(
        serving="disaggregated",
        model="test-model",
        gpu="test-gpu",
        instances=2,
        gpus_per_node=1,
        warmup_fraction=0.0,
        prefill_chunk_tokens=32,
        local_capacity_tokens=64,
        dram_capacity_tokens=128,
        pool_capacity_tokens=400,
        nvme_capacity_tokens=400,
    )
    base.update(kw)
    return ClusterConfig(**base)


def trace_of(spec, gaps):
    blocks = chained_requests(spec)
    arrivals = list(itertools.accumulate(gaps[: len(blocks)]))
    arrivals += [arrivals[-1] + 0.001 * i for i in range(1, len(blocks) - len(arrivals) + 1)]
    return build_trace(blocks, block_size=4, arrivals=arrivals)


def scenario(trace, c, spec, slo, search, record=True):
    return run_replay(
        trace, c, scenarios=[spec], ttft_slo_s=slo, search_rate=search, cost=COST, record=record
    ).scenarios[spec.name]


def _assert_equal(got, want) -> None:
    np.testing.assert_array_equal(got.stats.ttft_s, want.stats.ttft_s)
    assert got.to_json() == want.to_json()


requests = st.lists(
    st.tuples(st.integers(0, 50), st.integers(0, 10), st.integers(0, 6)), min_size=2, max_size=30
)
gaps = st.lists(st.sampled_from([0.0, 0.0005, 0.002, 0.01, 0.05]), min_size=30, max_size=30)
gbps = st.sampled_from([0.001, 0.004, 0.02, 0.1, 1.0])
latency = st.sampled_from([0.0, 0.0005, 0.003])


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests,
    gaps,
    st.sampled_from(SCENARIOS),
    st.sampled_from(["round-robin", "least-loaded", "prefix-aware", "session"]),
    st.sampled_from(["write-through", "on-evict"]),
    st.integers(1, 3),
    gbps,
    gbps,
    latency,
    st.booleans(),
)
def test_exact_repricing_equals_a_full_replay(
    spec, gap, sc, router, write, instances, old_gbps, new_gbps, new_latency, aggregate
):
    trace = trace_of(spec, gap)
    old_cfg = cluster(
        router=router,
        write_policy=write,
        instances=instances,
        pool_gbps=old_gbps,
        dram_gbps=old_gbps,
        nvme_gbps=old_gbps,
        pool_latency_s=0.001,
        pool_aggregate_gbps=old_gbps * 1.5 if aggregate else None,
    )
    new_cfg = dataclasses.replace(
        old_cfg,
        pool_gbps=new_gbps,
        dram_gbps=new_gbps * 2,
        nvme_gbps=new_gbps,
        pool_latency_s=new_latency,
        pool_aggregate_gbps=new_gbps * 1.5 if aggregate else None,
    )
    old = scenario(trace, old_cfg, sc, 0.05, True)
    new = resolve(new_cfg, sc, trace.block_size, cost=COST)
    want = scenario(trace, new_cfg, sc, 0.05, True, record=False)
    try:
        got = reprice_scenario(trace, old, new, 0.05, True)
    except Unrepriceable:
        return  # said so: the dashboard replays instead
    if got.exact:
        _assert_equal(got.result, want)
        assert got.result.search == want.search
    else:
        assert got.reordered + got.rerouted > 0  # never inexact without saying why


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, gaps, st.sampled_from(SCENARIOS), gbps, gbps)
def test_the_rate_one_run_retimed_exactly_equals_the_replay(spec, gap, sc, old_gbps, new_gbps):
    """The run at the trace's rate alone (no search), with a router that reads loads."""
    trace = trace_of(spec, gap)
    old_cfg = cluster(router="least-loaded", pool_gbps=old_gbps, dram_gbps=old_gbps)
    new_cfg = dataclasses.replace(old_cfg, pool_gbps=new_gbps, dram_gbps=new_gbps)
    old = scenario(trace, old_cfg, sc, 1.0, False)
    new = resolve(new_cfg, sc, trace.block_size, cost=COST)
    want = scenario(trace, new_cfg, sc, 1.0, False, record=False)
    again = retime(trace, new.plan, old.stats.recording, 1.0, recorded=old.stats)
    if again.exact:
        np.testing.assert_array_equal(again.stats.ttft_s, want.stats.ttft_s)
        assert again.stats.gpu_s_all == want.stats.gpu_s_all
        assert again.stats.duration_s == want.stats.duration_s
        assert [lk.busy_s for lk in again.stats.links] == [lk.busy_s for lk in want.stats.links]
    elif not np.array_equal(again.stats.ttft_s, want.stats.ttft_s):
        assert again.reordered + again.rerouted > 0


def test_spaced_requests_reprice_exactly_and_the_ttft_moves_with_the_link():
    """Requests far apart never queue behind each other: re-pricing is exact, and the
    pool's loads take bytes / bandwidth longer at a quarter of the bandwidth."""
    spec = [(0, 0, 8)] + [(0, 8, 2)] * 5
    trace = trace_of(spec, [1.0] * 6)
    sc = ScenarioSpec("pool-only", local=False, pool=True)
    old_cfg = cluster(router="round-robin", pool_gbps=0.004)
    new_cfg = dataclasses.replace(old_cfg, pool_gbps=0.001)
    old = scenario(trace, old_cfg, sc, 1.0, False)
    got = reprice_scenario(trace, old, resolve(new_cfg, sc, 4, cost=COST), 1.0, False)
    want = scenario(trace, new_cfg, sc, 1.0, False, record=False)
    assert got.exact and got.main_exact and got.reordered == 0 and got.rerouted == 0
    _assert_equal(got.result, want)
    # Request 1 loads 8 blocks of 4 tokens at 10,000 bytes per token from the pool.
    load = 8 * 4 * 10_000
    slower = got.result.stats.ttft_s[1] - old.stats.ttft_s[1]
    assert slower == pytest.approx(load / 1e6 - load / 4e6, rel=1e-9)


def test_recording_changes_no_figure():
    spec = [(i, 6, 3) for i in range(30)]
    trace = trace_of(spec, [0.002] * 30)
    sc = SCENARIOS[0]
    c = cluster(router="prefix-aware", pool_gbps=0.001, dram_gbps=0.002)
    plain = scenario(trace, c, sc, 0.05, True, record=False)
    kept = scenario(trace, c, sc, 0.05, True, record=True)
    _assert_equal(kept, plain)
    assert kept.search == plain.search
    assert plain.stats.recording is None and kept.stats.recording is not None
    assert all(p.recording is not None for p in kept.search.points)


def test_settings_other_than_link_speeds_are_not_repriced():
    trace = trace_of([(0, 0, 4), (0, 4, 2)], [0.01, 0.01])
    sc = SCENARIOS[0]
    c = cluster(pool_gbps=0.01)
    old = scenario(trace, c, sc, 1.0, False)
    for other in (dict(instances=3), dict(pool_capacity_tokens=40), dict(router="session")):
        new = resolve(dataclasses.replace(c, **other), sc, 4, cost=COST)
        assert not timing_only(old.resolved.plan, new.plan)
        with pytest.raises(Unrepriceable):
            reprice_scenario(trace, old, new, 1.0, False)
    unrecorded = scenario(trace, c, sc, 1.0, False, record=False)
    with pytest.raises(Unrepriceable, match="no recording"):
        reprice_scenario(trace, unrecorded, resolve(c, sc, 4, cost=COST), 1.0, False)


def test_a_stopped_search_run_that_no_longer_stops_is_not_decided():
    """A rate-search run stopped once its SLO was lost recorded only what it reached; at
    a faster link it may meet the SLO, which the recording cannot tell."""
    spec = [(i, 4, 4) for i in range(40)]
    trace = trace_of(spec, [0.05] * 40)
    sc = ScenarioSpec("pool-only", local=False, pool=True)
    slow = cluster(router="round-robin", pool_gbps=0.001)
    plan_fast = resolve(dataclasses.replace(slow, pool_gbps=1.0), sc, 4, cost=COST).plan
    st = simulate(
        trace, resolve(slow, sc, 4, cost=COST).plan, 1.0, slo_abort=(0.01, 0), record=True
    )
    assert st.aborted and not st.recording.complete
    again = retime(trace, plan_fast, st.recording, 1.0, slo_abort=(0.01, 0))
    assert not again.decided and not again.exact
