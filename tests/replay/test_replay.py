"""Replay: cross-checks against independent oracles (issue 6, item 6) and unit tests of
the event loop, links, routers, write policies and the rate search."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.errors import InputError, UsageError
from analyzer.replay import (
    STANDARD_SCENARIOS,
    UNBOUNDED,
    ClusterConfig,
    ScenarioSpec,
    load_scenarios,
    parse_capacity,
    resolve,
    run_replay,
)
from analyzer.replay.engine import simulate
from analyzer.replay.links import Link
from analyzer.replay.routers import session_instance
from analyzer.replay.run import (
    BISECTIONS,
    GRID,
    J_BOTTOM,
    J_TOP,
    MAX_DOWN,
    MAX_RUNS,
    MAX_UP,
    STEP,
    grid_rate,
    search_grid,
)
from analyzer.reuse.analysis import ReuseOptions, analyze_reuse
from tests.helpers.replay import (
    AnalyticCost,
    build_trace,
    ceiling_oracle,
    chained_requests,
    fluid_oracle,
    load_mooncake,
    lru_oracle,
    single_instance_oracle,
)

COST = AnalyticCost()
POOL_ONLY = ScenarioSpec("pool-only", local=False, pool=True)


# These tests pin the prefill pool's queue, loads and caches against hand-worked figures
# and oracles under an analytic cost, so they replay ``--serving disaggregated``; the
# continuous batch of the default aggregated serving has its own in test_replay_serving.py.
PREFILL_POOL = "disaggregated"


def cfg(**kw) -> ClusterConfig:
    # Cold start unless a test says otherwise: these figures count every request.
    base = dict(
        model="test-model",
        gpu="test-gpu",
        instances=1,
        free_loads=True,
        warmup_fraction=0.0,
        serving=PREFILL_POOL,
    )
    base.update(kw)
    return ClusterConfig(**base)


def replay(trace, c, scenarios, **kw):
    return run_replay(trace, c, scenarios=scenarios, search_rate=False, cost=COST, **kw)


specs = st.lists(
    st.tuples(st.integers(0, 50), st.integers(0, 12), st.integers(0, 6)), min_size=1, max_size=40
)


def trace_from(spec, tails=None):
    blocks = chained_requests(spec)
    tails = tails or [1 + (i % 3) for i in range(len(blocks))]
    prompts = [len(b) * 4 + (tails[i] if b else 1 + tails[i]) for i, b in enumerate(blocks)]
    return build_trace(blocks, block_size=4, prompts=prompts)


@pytest.fixture(scope="module")
def mooncake_spaced(shared_traces):
    return load_mooncake(shared_traces / "mooncake" / "conversation_trace.jsonl", 3000, True)


@pytest.fixture(scope="module")
def mooncake_timed(shared_traces):
    return load_mooncake(shared_traces / "mooncake" / "conversation_trace.jsonl", 2000)


# -- 1. one instance, unbounded capacity = the reuse ceiling -------------------------


@settings(max_examples=40, deadline=None)
@given(specs)
def test_unbounded_single_instance_is_the_ceiling(spec):
    trace = trace_from(spec)
    res = replay(trace, cfg(local_capacity_tokens=UNBOUNDED), ["local"]).to_json()
    assert res["scenarios"]["local"]["hit_rate"] == pytest.approx(ceiling_oracle(trace), abs=1e-12)


def test_ceiling_on_mooncake(mooncake_spaced):
    expected = ceiling_oracle(mooncake_spaced)
    res = replay(mooncake_spaced, cfg(local_capacity_tokens=UNBOUNDED), ["local"]).to_json()
    assert res["scenarios"]["local"]["hit_rate"] == pytest.approx(expected, abs=1e-12)
    # golden figure for the first 3000 requests (full 512-token blocks, cold start)
    assert round(expected, 4) == 0.3196


# -- 2. one instance, capacity C, free loads = exact LRU at C -----------------------


@settings(max_examples=40, deadline=None)
@given(specs, st.integers(1, 30))
def test_bounded_single_instance_is_exact_lru(spec, cap_blocks):
    trace = trace_from(spec)
    res = replay(trace, cfg(local_capacity_tokens=cap_blocks * 4), ["local"]).to_json()
    assert res["scenarios"]["local"]["hit_rate"] == pytest.approx(
        lru_oracle(trace, cap_blocks), abs=1e-12
    )


@pytest.mark.parametrize("cap_tokens", [200_000, 1_000_000, 3_000_000])
def test_lru_on_mooncake(mooncake_spaced, cap_tokens):
    res = replay(mooncake_spaced, cfg(local_capacity_tokens=cap_tokens), ["local"]).to_json()
    assert res["scenarios"]["local"]["hit_rate"] == pytest.approx(
        lru_oracle(mooncake_spaced, cap_tokens // 512), abs=1e-12
    )


@pytest.mark.parametrize("warmup", [0.0, 0.5])
def test_local_replay_matches_the_reuse_lru_curve(mooncake_spaced, warmup):
    """The two stages agree: one instance, free loads, spaced arrivals = the reuse
    stage's exact LRU curve at the same capacity and warm-up."""
    rep = analyze_reuse(mooncake_spaced, ReuseOptions(warmup=warmup, policies=("lru",)))
    for cap_tokens in (200_000, 1_000_000):
        c = cfg(local_capacity_tokens=cap_tokens, warmup_fraction=warmup)
        res = replay(mooncake_spaced, c, ["local"]).to_json()
        assert res["scenarios"]["local"]["hit_rate"] == pytest.approx(
            rep.hit_rate_at(cap_tokens), abs=1e-12
        )


# -- 3. free loads: TTFT saved == prefill compute saved ------------------------------


@settings(max_examples=25, deadline=None)
@given(specs, st.sampled_from([8, 64, 8192]))
def test_ttft_saved_equals_compute_saved(spec, chunk):
    trace = trace_from(spec)
    c = cfg(local_capacity_tokens=40, prefill_chunk_tokens=chunk)
    res = replay(trace, c, ["none", "local"])
    none, local = res.scenarios["none"], res.scenarios["local"]
    ttft_saved = float(none.stats.ttft_s.sum() - local.stats.ttft_s.sum())
    gpu_saved = none.stats.gpu_s - local.stats.gpu_s
    assert ttft_saved == pytest.approx(gpu_saved, rel=1e-9, abs=1e-9)
    # and the no-cache GPU time is the cost model's prefill of every prompt, by hand
    by_hand = sum(COST.prefill_time_s(int(p), 0) for p in trace.prompt_tokens)
    assert none.stats.gpu_s == pytest.approx(by_hand, rel=1e-9)


# -- 4. unbounded pool = the ceiling under any router --------------------------------


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "session", "prefix-aware"])
def test_unbounded_pool_reaches_ceiling_under_any_router(mooncake_spaced, router):
    c = cfg(
        instances=4, router=router, local_capacity_tokens=4 * 512, pool_capacity_tokens=UNBOUNDED
    )
    res = replay(mooncake_spaced, c, ["pooled"]).to_json()["scenarios"]["pooled"]
    assert res["hit_rate"] == pytest.approx(ceiling_oracle(mooncake_spaced), abs=1e-12)
    assert res["hit_rate_by_tier"]["pool"] > 0


@settings(max_examples=20, deadline=None)
@given(specs, st.sampled_from(["round-robin", "least-loaded", "prefix-aware"]))
def test_unbounded_pool_ceiling_generated(spec, router):
    trace = trace_from(spec)
    c = cfg(instances=3, router=router, local_capacity_tokens=8, pool_capacity_tokens=UNBOUNDED)
    res = replay(trace, c, ["pooled"]).to_json()["scenarios"]["pooled"]
    assert res["hit_rate"] == pytest.approx(ceiling_oracle(trace), abs=1e-12)


# -- 5. local caches under round-robin never beat the pool at equal total capacity ---


@pytest.mark.parametrize("cap_tokens", [100_000, 500_000, 2_000_000])
def test_local_round_robin_never_beats_pool(mooncake_spaced, cap_tokens):
    n = 4
    c = cfg(
        instances=n,
        router="round-robin",
        local_capacity_tokens=cap_tokens,
        pool_capacity_tokens=n * cap_tokens,
    )
    res = replay(mooncake_spaced, c, [STANDARD_SCENARIOS["local"], POOL_ONLY]).to_json()
    local = res["scenarios"]["local"]["hit_rate"]
    pooled = res["scenarios"]["pool-only"]["hit_rate"]
    assert pooled >= local
    assert res["scenarios"]["pool-only"]["hit_rate_by_tier"]["hbm"] == 0.0


# -- 6. the same run twice gives identical JSON --------------------------------------


@pytest.mark.slow
def test_same_run_twice_identical_json(mooncake_timed):
    c = ClusterConfig(
        serving=PREFILL_POOL,
        model="test-model",
        gpu="test-gpu",
        warmup_fraction=0.0,
        instances=4,
        gpus_per_node=2,
        local_capacity_tokens=300_000,
        dram_capacity_tokens=1_000_000,
        dram_gbps=20.0,
        dram_latency_s=1e-5,
        pool_gbps=5.0,
        pool_latency_s=5e-5,
        time_scale=0.2,
    )
    runs = [
        json.dumps(
            run_replay(mooncake_timed, c, ttft_slo_s=2.0, search_rate=True, cost=COST).to_json()
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    doc = json.loads(runs[0])
    assert set(doc["scenarios"]) == {"none", "local", "local+dram", "pooled"}
    for s in doc["scenarios"].values():
        for key in ("hit_rate", "hit_rate_by_tier", "ttft_s", "prefill_gpu_s", "network_bytes"):
            assert key in s
        assert set(s["ttft_s"]) >= {"mean", "p50", "p90", "p99"}
        assert s["max_rate_scale_at_slo"] is not None
    sc = doc["scenarios"]
    assert sc["none"]["hit_rate"] == 0.0
    assert sc["pooled"]["network_bytes"] > 0 and sc["local"]["network_bytes"] == 0
    assert sc["local+dram"]["links"]["pcie-read"]["bytes"] > 0
    # caching cuts prefill work
    assert sc["local"]["prefill_gpu_s"] < sc["none"]["prefill_gpu_s"]


@pytest.mark.slow
def test_a_stopped_run_leaves_no_garbage_and_the_collector_as_it_was(mooncake_timed):
    """The collector is paused while a replay runs (``collector_paused``), so a run must
    free what it drops without it: a rate-search run stopped with requests queued and
    loads in flight leaves no reference cycle, and the collector is back as it was (on,
    or off when the caller had switched it off), also when threads simulate at once."""
    import gc
    import threading

    from analyzer.replay.config import select_scenarios
    from analyzer.replay.engine import collector_paused
    from analyzer.replay.run import resolve

    c = cfg(instances=2, free_loads=False, pool_gbps=1.0, pool_latency_s=1e-4, time_scale=1e-3)
    (spec,) = select_scenarios(["pooled"])
    plan = resolve(c, spec, mooncake_timed.block_size, cost=COST).plan
    assert gc.isenabled()
    with collector_paused():  # as during a rate search: the next run starts at once
        gc.collect()
        st = simulate(mooncake_timed, plan, 1e-3, slo_abort=(1e-6, 0))
        assert st.aborted and st.ttft_s.size
        del st
        assert gc.collect() == 0
    assert gc.isenabled()
    # Threads share one pause; the last one out restores the collector.
    inside = threading.Barrier(3)
    seen: list[bool] = []

    def hold() -> None:
        with collector_paused():
            inside.wait()
            seen.append(gc.isenabled())
            inside.wait()

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert not gc.isenabled()
    inside.wait()
    for t in threads:
        t.join()
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        simulate(mooncake_timed, plan, 1.0)
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- timing of single requests, by hand ----------------------------------------------


def test_one_request_pool_load_then_prefill_timing():
    # request 0 writes 10 blocks to the pool; request 1 (another instance) reads them.
    blocks = [list(range(10)), list(range(10))]
    trace = build_trace(blocks, block_size=4, prompts=[41, 41], arrivals=[0.0, 100.0])
    c = ClusterConfig(
        serving=PREFILL_POOL,
        model="m",
        gpu="g",
        warmup_fraction=0.0,
        instances=2,
        gpus_per_node=1,
        router="round-robin",
        local_capacity_tokens=UNBOUNDED,
        pool_capacity_tokens=UNBOUNDED,
        pool_gbps=1e-3,  # 1e6 B/s
        pool_latency_s=0.5,
    )
    res = replay(trace, c, ["pooled"]).scenarios["pooled"]
    ttft = res.stats.ttft_s
    assert ttft[0] == pytest.approx(COST.prefill_time_s(41, 0))
    load_s = 0.5 + 40 * COST.bytes_per_token / 1e6
    assert ttft[1] == pytest.approx(load_s + COST.prefill_time_s(1, 40))
    doc = res.to_json()
    assert doc["hit_rate_by_tier"]["pool"] == pytest.approx(40 / 82)
    assert doc["links"]["net-read"]["bytes"] == 40 * COST.bytes_per_token
    assert doc["links"]["net-write"]["bytes"] == 40 * COST.bytes_per_token  # request 0 only


def test_hit_never_covers_last_token():
    trace = build_trace([[0, 1], [0, 1]], block_size=4, prompts=[8, 8])
    res = replay(trace, cfg(local_capacity_tokens=UNBOUNDED), ["local"]).to_json()
    assert res["scenarios"]["local"]["hit_tokens_by_tier"]["hbm"] == 7


def test_chunked_prefill_fifo_queue():
    trace = build_trace([[], []], block_size=4, prompts=[20_000, 100], arrivals=[0.0, 0.0])
    c = cfg(prefill_chunk_tokens=8192)
    res = replay(trace, c, ["none"]).scenarios["none"].stats
    chunks = [(8192, 0), (8192, 8192), (3616, 16384)]
    t0 = sum(COST.prefill_time_s(n, p) for n, p in chunks[:2])
    # the third step holds the last 3616 tokens of request 0 and all of request 1
    t1 = t0 + COST.prefill_time_s(3616, 16384) + COST.prefill_time_s(100, 0)
    assert res.ttft_s[0] == pytest.approx(t1)
    assert res.ttft_s[1] == pytest.approx(t1)


def test_queueing_adds_to_ttft():
    trace = build_trace([[], []], block_size=4, prompts=[1000, 1000], arrivals=[0.0, 0.0])
    res = replay(trace, cfg(prefill_chunk_tokens=1000), ["none"]).scenarios["none"].stats
    one = COST.prefill_time_s(1000, 0)
    assert res.ttft_s.tolist() == pytest.approx([one, 2 * one])


def test_duplicated_blocks_across_instances():
    trace = build_trace([[0, 1, 2], [0, 1, 2], [0, 1, 2]], block_size=4)
    c = cfg(instances=3, router="round-robin", local_capacity_tokens=UNBOUNDED)
    doc = replay(trace, c, ["local"]).to_json()["scenarios"]["local"]
    assert doc["duplicated_kv_bytes"]["end"] == 2 * 3 * 4 * COST.bytes_per_token
    assert 0 < doc["duplicated_kv_bytes"]["time_avg"] < doc["duplicated_kv_bytes"]["end"]


# -- write policies ------------------------------------------------------------------


def test_on_evict_writes_only_evicted_blocks(mooncake_spaced):
    base = dict(local_capacity_tokens=200_000, dram_capacity_tokens=UNBOUNDED)
    wt = replay(mooncake_spaced, cfg(**base), ["local+dram"]).to_json()
    oe = replay(mooncake_spaced, cfg(**base, write_policy="on-evict"), ["local+dram"]).to_json()
    wt_s, oe_s = wt["scenarios"]["local+dram"], oe["scenarios"]["local+dram"]
    assert oe_s["links"]["pcie-write"]["bytes"] < wt_s["links"]["pcie-write"]["bytes"]
    # an unbounded DRAM tier holds every block either way, so both reach the ceiling
    ceiling = ceiling_oracle(mooncake_spaced)
    assert wt_s["hit_rate"] == pytest.approx(ceiling, abs=1e-12)
    assert oe_s["hit_rate"] == pytest.approx(ceiling, abs=1e-12)
    # nothing is evicted from an unbounded HBM cache, so on-evict writes nothing
    none_evicted = replay(
        mooncake_spaced,
        cfg(local_capacity_tokens=UNBOUNDED, write_policy="on-evict"),
        ["local+dram"],
    ).to_json()
    assert none_evicted["scenarios"]["local+dram"]["links"]["pcie-write"]["bytes"] == 0


def test_on_evict_cascades_to_pool():
    # HBM of 2 blocks, DRAM of 3, pool unbounded: old prefixes end up in the pool
    reqs = chained_requests([(0, 0, 3), (0, 0, 3), (0, 0, 3), (0, 3, 0)])
    trace = build_trace(reqs, block_size=4)
    spec = ScenarioSpec("all", dram=True, pool=True)
    c = cfg(
        local_capacity_tokens=8,
        dram_capacity_tokens=12,
        pool_capacity_tokens=UNBOUNDED,
        write_policy="on-evict",
    )
    doc = replay(trace, c, [spec]).to_json()["scenarios"]["all"]
    # r0's third block never fit in HBM, so it was never written; its first two went to
    # DRAM when r1 evicted them, and block 1 went on to the pool when r2 pushed it out.
    assert doc["hit_tokens_by_tier"] == {"hbm": 0, "dram": 4, "nvme": 0, "pool": 4}
    assert doc["links"]["net-write"]["bytes"] > 0


# -- links ---------------------------------------------------------------------------


def _run_link(transfers, bw):
    import heapq

    lk = Link("l", "k", bw, 1.0)
    events = sorted((s, 1, k) for k, (s, _) in enumerate(transfers))
    heap = [(s, 1, k, None) for s, _, k in events]
    heapq.heapify(heap)
    end = [None] * len(transfers)
    while heap:
        t, kind, k, ver = heapq.heappop(heap)
        if kind == 1:
            nxt = lk.add(t, transfers[k][1], k)
            heapq.heappush(heap, (nxt, 0, -1, lk.version))
        else:
            res = lk.finish(t, ver)
            if res is None:
                continue
            done, nxt = res
            for d in done:
                end[d] = t
            if nxt is not None:
                heapq.heappush(heap, (nxt, 0, -1, lk.version))
    return end, lk


def test_link_fair_share_by_hand():
    end, lk = _run_link([(0.0, 10.0), (5.0, 10.0)], 1.0)
    assert end == pytest.approx([15.0, 20.0])
    assert lk.busy_s == pytest.approx(20.0)
    assert lk.stats(40.0)["mean_utilisation"] == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20).map(float), st.integers(1, 50).map(float)),
        min_size=1,
        max_size=12,
    )
)
def test_link_matches_fluid_oracle(transfers):
    end, _ = _run_link(transfers, 2.0)
    assert end == pytest.approx(fluid_oracle(transfers, 2.0), rel=1e-6, abs=1e-6)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40).map(lambda x: x / 4), st.integers(1, 50).map(float)),
        min_size=1,
        max_size=14,
    ),
    st.lists(st.integers(0, 60).map(lambda x: x / 4), max_size=6),
)
def test_a_lazy_link_ends_its_transfers_as_the_events_would(transfers, looks):
    """A write link schedules no end events (nothing waits for a write): a backlog
    drained when next used, and at the end its figures are the event-driven fair-share
    link's (to rounding: the same busy periods, whatever order the bytes go in),
    whenever it is looked at in between."""
    _, eager = _run_link(transfers, 2.0)
    lazy = Link("l", "k", 2.0, 1.0, lazy=True)
    ends = 0
    for t, kind, payload in sorted(
        [(s, 1, b) for s, b in transfers] + [(t, 0, None) for t in looks],
        key=lambda e: (e[0], -e[1]),  # a transfer's start before a look at the same time
    ):
        if kind == 1:
            lazy.add(t, payload, None)
        else:
            ends += lazy.settle(t)
            assert lazy.backlog == 0.0 or lazy.last_t + lazy.backlog / 2.0 > t  # none due
    ends += lazy.settle(math.inf)
    assert lazy.backlog == 0.0 and ends <= len(transfers) and not lazy.heap
    assert (lazy.bytes_total, lazy.transfers) == (eager.bytes_total, eager.transfers)
    assert lazy.busy_s == pytest.approx(eager.busy_s, rel=1e-12)
    assert lazy.last_end_t == pytest.approx(eager.last_end_t, rel=1e-12)
    windows = {k: v for k, v in eager.busy_by_window.items() if v > 1e-9}
    assert {k: v for k, v in lazy.busy_by_window.items() if v > 1e-9} == pytest.approx(windows)


# -- routers -------------------------------------------------------------------------


def _routing(trace, router, n=3):
    c = cfg(instances=n, router=router, local_capacity_tokens=UNBOUNDED)
    res = resolve(c, STANDARD_SCENARIOS["local"], trace.block_size, cost=COST)
    from analyzer.replay.engine import Simulation

    sim = Simulation(trace, res.plan, 1.0)
    picked = []
    orig = sim.router.pick

    def spy(*a):
        picked.append(orig(*a))
        return picked[-1]

    sim.router.pick = spy  # type: ignore[method-assign]
    sim.run()
    return picked


def test_round_robin_and_session_routing():
    trace = build_trace(
        [[0], [1], [2], [3], [4], [5]],
        sessions=["a", "b", "a", None, "b", "a"],
    )
    assert _routing(trace, "round-robin") == [0, 1, 2, 0, 1, 2]
    got = _routing(trace, "session")
    assert got[0] == got[2] == got[5] == session_instance("a", 3)
    assert got[1] == got[4] == session_instance("b", 3)
    assert got[3] == 0  # no session: least-loaded, lowest index on ties (all idle)


def test_prefix_aware_follows_the_cache_and_balances_load():
    # r0 on instance 0; r1 shares its prefix and goes there; r2 is unrelated and goes
    # to an idle instance.
    blocks = [list(range(10)), [*range(10), 99], [200, 201]]
    trace = build_trace(blocks)
    assert _routing(trace, "prefix-aware") == [0, 0, 0]
    # with requests arriving together, load pushes unrelated work elsewhere
    trace = build_trace(blocks, arrivals=[0.0, 0.0, 0.0])
    got = _routing(trace, "prefix-aware")
    assert got[0] == 0 and got[2] != 0


def test_least_loaded_spreads_simultaneous_requests():
    trace = build_trace([[i] for i in range(6)], arrivals=[0.0] * 6)
    assert _routing(trace, "least-loaded") == [0, 1, 2, 0, 1, 2]


# -- rate search ---------------------------------------------------------------------


@pytest.mark.slow
def test_rate_search_brackets_the_slo(mooncake_timed):
    c = ClusterConfig(
        serving=PREFILL_POOL,
        model="m",
        gpu="g",
        instances=8,
        local_capacity_tokens=500_000,
        free_loads=True,
        warmup_fraction=0.0,
    )
    # Prefill alone takes over 2 s for more than 10% of these prompts, and requests come
    # in bursts with equal timestamps that no time scale separates: hence 8 instances
    # and a 6 s SLO, so that the answer lies inside the searched range.
    slo = 6.0
    res = run_replay(mooncake_timed, c, scenarios=["local"], ttft_slo_s=slo, cost=COST)
    sr = res.scenarios["local"]
    search = sr.search
    assert search is not None and search.value and search.fail_at
    assert search.fail_at / search.value <= STEP ** (1 / 2**BISECTIONS) * (1 + 1e-12)

    def p90(rate):
        st_ = simulate(mooncake_timed, sr.resolved.plan, 1.0 / rate)
        ttft = np.sort(st_.ttft_s)
        return ttft[math.ceil(0.9 * ttft.size) - 1]

    assert p90(search.value) <= slo < p90(search.fail_at)
    # every run of the search is kept with its TTFT percentiles, by rate
    rates = [p.rate for p in search.points]
    assert rates == sorted(rates) and len(rates) == search.runs
    assert search.value in rates and search.fail_at in rates
    top = next(p for p in search.points if p.rate == search.value)
    assert top.passed and top.ttft_p90_s is not None
    ttft = simulate(mooncake_timed, sr.resolved.plan, 1.0 / search.value).ttft_s
    assert top.ttft_p90_s == pytest.approx(float(np.percentile(ttft, 90)), rel=1e-12)
    assert all(p.passed == (p.rate <= search.value) for p in search.points)


def _search_from_one(ok, passed_at_1):
    """The search as it was before it started from a guess (the oracle): from rate 1
    multiply the rate by STEP until the answer flips, then bisect BISECTIONS times."""
    if passed_at_1:
        lo, hi = 0, None
        for k in range(1, MAX_UP + 1):
            if ok(k * GRID):
                lo = k * GRID
            else:
                hi = k * GRID
                break
        if hi is None:
            return lo, None
    else:
        lo, hi = None, 0
        for k in range(1, MAX_DOWN + 1):
            if ok(-k * GRID):
                lo = -k * GRID
                break
            hi = -k * GRID
        if lo is None:
            return None, hi
    for _ in range(BISECTIONS):
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


@settings(max_examples=300, deadline=None)
@given(
    threshold=st.integers(J_BOTTOM - 1, J_TOP),
    guess=st.one_of(st.none(), st.integers(J_BOTTOM - 40, J_TOP + 40)),
)
def test_search_from_any_guess_finds_what_the_search_from_one_found(threshold, guess):
    """When meeting the SLO is monotone in the rate, the answer does not depend on where
    the search starts: the grid rate that passes below one that fails."""
    asked: list[int] = []

    def ok(j: int) -> bool:
        asked.append(j)
        return j <= threshold

    got = search_grid(ok, threshold >= 0, guess)
    assert got == _search_from_one(lambda j: j <= threshold, threshold >= 0)
    assert len(asked) == len(set(asked)) <= MAX_RUNS and 0 not in asked
    if guess is not None and J_BOTTOM < guess == threshold < J_TOP:
        assert len(asked) <= 3  # a good guess: itself, the next step up, then between


def test_the_grid_holds_the_old_bracket_ends_exactly():
    assert grid_rate(0) == 1.0 and grid_rate(J_TOP) == STEP**MAX_UP
    assert grid_rate(J_BOTTOM) == STEP**-MAX_DOWN and grid_rate(GRID) == STEP


# -- config --------------------------------------------------------------------------


def test_parse_capacity():
    assert parse_capacity("1e6", "--x") == 1_000_000
    assert parse_capacity("2_000", "--x") == 2000
    assert parse_capacity("unbounded", "--x") == UNBOUNDED
    with pytest.raises(UsageError, match="--x"):
        parse_capacity("lots", "--x")
    with pytest.raises(UsageError):
        parse_capacity("1.5", "--x")


def test_cluster_config_validation():
    with pytest.raises(UsageError, match="router"):
        cfg(router="random")
    with pytest.raises(UsageError, match="instances"):
        cfg(instances=0)
    with pytest.raises(UsageError, match="time-scale"):
        cfg(time_scale=0)
    assert cfg(instances=10, tp=2).nodes == 3  # 4 instances of 2 GPUs per 8-GPU node


def test_load_scenarios_toml_and_json(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[[scenario]]\nname = "big-pool"\npool = true\npool_capacity_tokens = "unbounded"\n'
        "pool_gbps = 50\n"
    )
    (s,) = load_scenarios(toml)
    assert s == ScenarioSpec("big-pool", pool=True, pool_capacity_tokens=UNBOUNDED, pool_gbps=50.0)
    js = tmp_path / "s.json"
    js.write_text(json.dumps({"scenario": [{"name": "x", "dram": True, "router": "session"}]}))
    assert load_scenarios(js)[0].router == "session"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[scenario]]\nname = "x"\npool_gbps = -1\n')
    with pytest.raises(InputError, match=r"scenario\[0\]\.pool_gbps"):
        load_scenarios(bad)
    for body, field in (
        ("local_capacity_tokens = 1e400", "local_capacity_tokens"),  # inf: no traceback
        ("pool_gbps = nan", "pool_gbps"),
        ("pool_latency_s = -1", "pool_latency_s"),
    ):
        bad.write_text(f'[[scenario]]\nname = "x"\n{body}\n')
        with pytest.raises(InputError, match=rf"scenario\[0\]\.{field}"):
            load_scenarios(bad)
    ok = tmp_path / "ok.toml"
    ok.write_text('[[scenario]]\nname = "x"\npool = true\npool_latency_s = 0\n')
    assert load_scenarios(ok)[0].pool_latency_s == 0.0
    bad.write_text('[[scenario]]\nname = "x"\ncolour = "red"\n')
    with pytest.raises(InputError, match="unknown key"):
        load_scenarios(bad)
    bad.write_text("[[scenario]\n")
    with pytest.raises(InputError, match="invalid TOML"):
        load_scenarios(bad)


def test_user_scenario_overrides_apply():
    trace = trace_from([(0, 0, 5), (0, 5, 0)])
    big = ScenarioSpec("tiny-hbm", local_capacity_tokens=4)
    res = replay(trace, cfg(local_capacity_tokens=UNBOUNDED), ["local", big]).to_json()
    assert res["scenarios"]["tiny-hbm"]["capacity_tokens"]["local_per_instance"] == 4
    assert res["scenarios"]["local"]["hit_rate"] > res["scenarios"]["tiny-hbm"]["hit_rate"]


def test_count_only_trace_replays_without_hits():
    trace = build_trace([[], [], []], prompts=[100, 200, 300])
    trace = dataclasses.replace(trace, count_only=True)
    doc = replay(trace, cfg(), ["none", "local"]).to_json()
    assert doc["scenarios"]["local"]["hit_rate"] == 0.0
    assert doc["scenarios"]["local"]["ttft_s"]["p50"] == doc["scenarios"]["none"]["ttft_s"]["p50"]


def test_fifo_and_lru_eviction_by_hand():
    # capacity 2 blocks; A B A C A: LRU keeps A (recently hit), FIFO drops it (oldest)
    trace = build_trace([[0], [1], [0], [2], [0]], block_size=4, prompts=[5] * 5)
    lru = replay(trace, cfg(local_capacity_tokens=8), ["local"]).to_json()
    fifo = replay(trace, cfg(local_capacity_tokens=8, eviction="fifo"), ["local"]).to_json()
    assert lru["scenarios"]["local"]["hit_tokens_by_tier"]["hbm"] == 8
    assert fifo["scenarios"]["local"]["hit_tokens_by_tier"]["hbm"] == 4


@pytest.mark.parametrize(("aggregate_gbps", "share"), [(None, 1), (1e-3, 2), (1.0, 1)])
def test_pool_aggregate_bandwidth_is_shared(aggregate_gbps, share):
    # r0 writes 10 blocks to the pool; r1 and r2, on two other nodes, read them together
    blocks = [list(range(10))] * 3
    trace = build_trace(blocks, block_size=4, prompts=[41] * 3, arrivals=[0.0, 100.0, 100.0])
    c = ClusterConfig(
        serving=PREFILL_POOL,
        model="m",
        gpu="g",
        warmup_fraction=0.0,
        instances=3,
        gpus_per_node=1,
        router="round-robin",
        local_capacity_tokens=UNBOUNDED,
        pool_capacity_tokens=UNBOUNDED,
        pool_gbps=1e-3,  # 1e6 B/s per node
        pool_aggregate_gbps=aggregate_gbps,
        pool_latency_s=0.0,
    )
    ttft = replay(trace, c, ["pooled"]).scenarios["pooled"].stats.ttft_s
    load_s = 40 * COST.bytes_per_token * share / 1e6
    assert ttft[1] == pytest.approx(load_s + COST.prefill_time_s(1, 40))
    assert ttft[2] == pytest.approx(ttft[1])


@pytest.mark.slow
def test_workers_give_the_same_json():
    trace = trace_from([(0, 0, 5), (0, 3, 2), (1, 4, 1), (0, 5, 3)] * 5)
    c = cfg(instances=2, free_loads=False, dram_gbps=1.0, pool_gbps=0.5, pool_latency_s=1e-4)
    c = dataclasses.replace(c, dram_latency_s=1e-5, local_capacity_tokens=40)
    one = run_replay(trace, c, cost=COST, workers=1).to_json()
    two = run_replay(trace, c, cost=COST, workers=2).to_json()
    assert json.dumps(one) == json.dumps(two)


def test_steady_ceiling_on_full_mooncake_is_the_published_figure(shared_traces):
    # the published 39.8% steady-state ceiling of Mooncake's conversation trace (docs/reuse.md,
    # Reference figures)
    from analyzer.ingest import IngestOptions, open_trace

    path = shared_traces / "mooncake" / "conversation_trace.jsonl"
    trace = open_trace([path], IngestOptions()).trace
    trace = dataclasses.replace(trace, arrival_s=np.arange(trace.n_requests) * 1000.0)
    c = cfg(local_capacity_tokens=UNBOUNDED, warmup_fraction=0.5)
    hit = replay(trace, c, ["local"]).to_json()["scenarios"]["local"]["hit_rate"]
    assert round(hit, 3) == 0.398


@settings(max_examples=40, deadline=None)
@given(
    specs,
    st.lists(st.integers(0, 40), min_size=40, max_size=40),
    st.sampled_from([4, 16, 8192]),
    st.booleans(),
)
def test_event_loop_matches_step_loop_oracle(spec, gaps, chunk, cache):
    """Queueing, chunked prefill and cache timing against a plain loop over steps."""
    blocks = chained_requests(spec)
    arrivals = np.cumsum([g / 100 for g in gaps[: len(blocks)]]).tolist()
    prompts = [len(b) * 4 + 1 + (k % 3) for k, b in enumerate(blocks)]
    trace = build_trace(blocks, block_size=4, arrivals=arrivals, prompts=prompts)
    cost = AnalyticCost()
    cost.overhead_s = 1e-4  # a fixed cost per step makes batching visible
    c = cfg(local_capacity_tokens=UNBOUNDED, prefill_chunk_tokens=chunk)
    name = "local" if cache else "none"
    res = run_replay(trace, c, scenarios=[name], search_rate=False, cost=cost)
    expected = single_instance_oracle(trace, cost, chunk, cache)
    assert res.scenarios[name].stats.ttft_s.tolist() == pytest.approx(expected, abs=1e-9)


def test_link_peak_utilisation_windows_by_hand():
    lk = Link("l", "k", 1.0, 2.0)  # 2 s windows
    lk.add(0.5, 3.0, None)  # busy [0.5, 3.5]: 1.5 s of window 0, 1.5 s of window 1
    assert lk.finish(3.5, lk.version) == ([None], None)
    s = lk.stats(10.0)
    assert s["peak_utilisation"] == pytest.approx(0.75)
    assert s["mean_utilisation"] == pytest.approx(0.3)


def test_warmup_requests_are_not_measured():
    trace = trace_from([(0, 0, 3), (0, 3, 1), (1, 4, 1), (0, 3, 0)])
    full = replay(trace, cfg(local_capacity_tokens=UNBOUNDED), ["local"]).to_json()
    half = replay(
        trace, cfg(local_capacity_tokens=UNBOUNDED, warmup_fraction=0.5), ["local"]
    ).to_json()
    assert full["scenarios"]["local"]["requests"] == 4
    assert half["scenarios"]["local"]["requests"] == 2
    p = trace.prompt_tokens.tolist()
    # requests 2 and 3 reuse 4 and 3 blocks of 4 tokens
    assert half["scenarios"]["local"]["hit_rate"] == pytest.approx((16 + 12) / (p[2] + p[3]))


# -- chained caches ------------------------------------------------------------------


def test_is_chained_on_real_and_broken_traces(mooncake_timed):
    from analyzer.replay.engine import is_chained

    assert is_chained(mooncake_timed)
    assert is_chained(build_trace(chained_requests([(0, 0, 3), (0, 2, 2)])))
    # block 7 after 1 in one request, after 2 in another: not one tree
    assert not is_chained(build_trace([[1, 7], [2, 7]]))
    # a first block that is elsewhere a second one
    assert not is_chained(build_trace([[5], [4, 5]]))
    assert not is_chained(build_trace([[3, 3]]))


@pytest.mark.slow
@pytest.mark.parametrize("write_policy", ["write-through", "on-evict"])
def test_chained_caches_replay_as_the_plain_ones(shared_traces, monkeypatch, write_policy):
    """The replay's caches rely on the trace being chained (bisected matches, touches
    kept on a chain's last block); with that switched off every figure, rate search
    included, is the same."""
    from analyzer.replay import engine

    trace = load_mooncake(shared_traces / "mooncake" / "conversation_trace.jsonl", 800)
    c = ClusterConfig(
        serving=PREFILL_POOL,
        model="test-model",
        gpu="test-gpu",
        warmup_fraction=0.25,
        instances=3,
        gpus_per_node=2,
        local_capacity_tokens=60_000,
        dram_capacity_tokens=200_000,
        nvme_capacity_tokens=300_000,
        pool_capacity_tokens=400_000,
        dram_gbps=20.0,
        pool_gbps=5.0,
        time_scale=0.2,
        write_policy=write_policy,
    )
    nvme = ScenarioSpec("local+dram+nvme", dram=True, nvme=True)
    scenarios = ["local", "local+dram", nvme, "pooled"]

    def run() -> str:
        return json.dumps(
            run_replay(
                trace, c, scenarios=scenarios, ttft_slo_s=2.0, search_rate=True, cost=COST
            ).to_json()
        )

    fast = run()
    monkeypatch.setattr(engine, "is_chained", lambda trace: False)
    assert run() == fast


def test_a_router_is_one_class_and_one_line(monkeypatch):
    """A toy router registered by name routes every replayed request, in both serving
    modes, with no other change (the registry, as eviction policies have one)."""
    from analyzer.replay import routers

    class Busiest(routers.Router):
        def pick(self, k, session, blocks, loads, cached):
            return max(range(len(loads)), key=lambda i: (loads[i], -i))

    monkeypatch.setitem(routers.ROUTERS, "busiest", Busiest)
    trace = build_trace([[i] for i in range(6)], arrivals=[0.0] * 6)
    assert _routing(trace, "busiest") == [0] * 6  # the first takes the load, then all
    for serving in ("disaggregated", "aggregated"):  # the catalog model: real step times
        c = ClusterConfig(instances=3, router="busiest", serving=serving, warmup_fraction=0.0)
        res = resolve(c, STANDARD_SCENARIOS["local"], trace.block_size)
        assert len(simulate(trace, res.plan, 1.0).ttft_s) == 6
    with pytest.raises(UsageError, match="unknown router 'idlest'"):
        cfg(router="idlest")
