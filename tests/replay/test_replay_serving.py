"""The aggregated engine (analyzer/replay/serving.py) against a continuous-batching
oracle written step by step, its decode runs against one step at a time, and the
invariants of its KV pool."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.replay import ClusterConfig, ScenarioSpec, resolve
from analyzer.replay import jobs as jobs_mod
from analyzer.replay import serving as serving_mod
from analyzer.replay.config import CONNECTORS, Connector, select_scenarios
from analyzer.replay.decode import size_decode_pool
from analyzer.replay.engine import simulate
from analyzer.replay.serving import AggregatedSimulation, output_lengths
from analyzer.replay.steps import StepPricing
from tests.helpers.replay import AnalyticCost, build_trace, ceiling_oracle, chained_requests

COST = AnalyticCost()


def lin_step(c, prefill_tokens, prefill_attn, decode_seqs, decode_kv):
    """A step time the oracle recomputes by hand: fixed + per token + attention + per
    decoding request + per KV token read."""
    if prefill_tokens + decode_seqs <= 0.0:
        return 0.0
    return (
        c[0] + c[1] * prefill_tokens + c[2] * prefill_attn + c[3] * decode_seqs + c[4] * decode_kv
    )


PRICING = StepPricing(
    "test", np.array([5e-3, 2e-5, 1e-9, 1e-4, 1e-7], dtype=np.float64), 0.0, lin_step
)


def agg_plan(trace, scenario="none", *, capacity, mnbt, mns, connector=None, **kw):
    # resolved as a prefill pool under the analytic cost (which names no GPU to take the
    # engine's defaults from), then given this module's engine: its limits, pool and steps
    base = dict(
        model="test-model",
        gpu="test-gpu",
        instances=1,
        free_loads=True,
        warmup_fraction=0.0,
        serving="disaggregated",
    )
    base.update(kw)
    spec = scenario if isinstance(scenario, ScenarioSpec) else select_scenarios(scenario)[0]
    plan = resolve(ClusterConfig(**base), spec, trace.block_size, cost=COST).plan
    return dataclasses.replace(
        plan,
        serving="aggregated",
        step=PRICING,
        max_num_batched_tokens=mnbt,
        max_num_seqs=mns,
        hbm_capacity_tokens=capacity,
        connector=connector,
        num_layers=4,
    )


# -- the oracle -------------------------------------------------------------------------


class _Req:
    def __init__(self, k, prompt, out):
        self.k, self.prompt, self.out = k, prompt, out
        self.gen = 0  # tokens generated
        self.tokens = self.done = self.held = 0
        self.decoding = False
        self.first = math.nan


def continuous_batching_oracle(arrivals, prompts, outs, capacity, mnbt, mns):
    """One Python iteration per step, no prefix cache, one instance: running requests
    first (a decode token each, then partial prefills in admission order, within the
    token budget), then waiting ones first come first served while the budget, the
    request limit and the KV pool allow; a step whose decode tokens do not fit preempts
    the newest running request, which recomputes its prompt and generated tokens later.
    Returns (TTFT, TPOT) per request."""
    n = len(arrivals)
    ttft = [math.nan] * n
    tpot = [math.nan] * n
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    nxt = 0
    t = 0.0

    def finish(r, now):
        running.remove(r)
        if r.out > 1:
            tpot[r.k] = (now - r.first) / (r.out - 1)

    while nxt < n or waiting or running:
        if not waiting and not running:
            t = max(t, arrivals[nxt])
            waiting.append(_Req(nxt, prompts[nxt], outs[nxt]))
            nxt += 1
        decoding = [r for r in running if r.decoding]
        preempted = False
        while decoding and sum(r.held for r in running) + len(decoding) > capacity:
            victim = running.pop()
            victim.decoding = False
            victim.held = victim.done = 0
            waiting.appendleft(victim)
            preempted = True
            decoding = [r for r in running if r.decoding]
        budget = mnbt - len(decoding)
        chunks = []
        for r in running:
            if r.decoding or budget <= 0:
                continue
            take = min(r.tokens - r.done, budget)
            chunks.append((r, take))
            budget -= take
        while not preempted and budget > 0 and waiting and len(running) < mns:
            r = waiting[0]
            need = r.prompt + r.gen
            if running and sum(x.held for x in running) + len(decoding) + need > capacity:
                break
            waiting.popleft()
            r.tokens, r.done, r.held = need, 0, need
            running.append(r)
            take = min(need, budget)
            chunks.append((r, take))
            budget -= take
        pt = sum(take for _, take in chunks)
        pa = sum(take * (r.done + take / 2.0) for r, take in chunks)
        kv = sum(r.prompt + r.gen for r in decoding)
        t += lin_step(PRICING.coefficients, float(pt), pa, float(len(decoding)), float(kv))
        for r in decoding:
            r.gen += 1
            r.held += 1
            if r.gen >= r.out:
                finish(r, t)
        for r, take in chunks:
            r.done += take
            if r.done < r.tokens:
                continue
            r.gen += 1
            if math.isnan(r.first):
                r.first = t
                ttft[r.k] = t - arrivals[r.k]
            if r.gen >= r.out:
                finish(r, t)
            else:
                r.decoding = True
        while nxt < n and arrivals[nxt] < t:
            waiting.append(_Req(nxt, prompts[nxt], outs[nxt]))
            nxt += 1
    return np.array(ttft), np.array(tpot)


requests = st.lists(
    st.tuples(
        st.floats(0.0005, 0.3), st.integers(1, 3000), st.integers(1, 60)
    ),  # gap, prompt, output
    min_size=1,
    max_size=25,
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    requests,
    st.integers(400, 30_000),
    st.sampled_from([64, 512, 4096]),
    st.sampled_from([1, 2, 4, 64]),
)
def test_engine_is_the_continuous_batching_oracle(reqs, capacity, mnbt, mns):
    arrivals = np.cumsum([g for g, _, _ in reqs]).tolist()
    prompts = [p for _, p, _ in reqs]
    outs = [o for _, _, o in reqs]
    trace = build_trace(
        [[] for _ in reqs], block_size=16, arrivals=arrivals, prompts=prompts, outputs=outs
    )
    plan = agg_plan(trace, capacity=capacity, mnbt=mnbt, mns=mns)
    st_ = simulate(trace, plan, 1.0)
    t0 = trace.arrival_s[0]
    want_ttft, want_tpot = continuous_batching_oracle(
        [a - t0 for a in trace.arrival_s.tolist()], prompts, outs, capacity, mnbt, mns
    )
    np.testing.assert_allclose(st_.ttft_s, want_ttft, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(st_.tpot_s, want_tpot, rtol=1e-9, atol=1e-12)


def _generated(n, seed, block_size=4):
    rng = np.random.default_rng(seed)
    spec = [
        (int(rng.integers(0, 50)), int(rng.integers(0, 12)), int(rng.integers(1, 6)))
        for _ in range(n)
    ]
    blocks = chained_requests(spec)
    prompts = [len(b) * block_size + int(rng.integers(1, block_size)) for b in blocks]
    arrivals = np.cumsum(rng.exponential(0.02, n)).tolist()
    outs = rng.integers(1, 40, n).tolist()
    sessions = [f"s{int(x)}" for x in rng.integers(0, 8, n)]
    return build_trace(
        blocks,
        block_size=block_size,
        arrivals=arrivals,
        prompts=prompts,
        outputs=outs,
        sessions=sessions,
    )


CHUNKED = Connector("chunked", 8, False, "test: 8-token chunks, two 4-token blocks")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("scenario", "policy", "router", "connector"),
    [
        ("local", "write-through", "prefix-aware", None),
        ("local+dram", "write-through", "prefix-aware", None),
        ("local+dram", "on-evict", "least-loaded", None),
        ("local+dram", "write-through-selective", "prefix-aware", CONNECTORS["hicache"]),
        ("pooled", "write-through", "session", CHUNKED),
        ("local+dram", "write-through", "kv-router", CHUNKED),
        ("local+dram", "write-through", "prefix-aware", CONNECTORS["hicache"]),
    ],
)
def test_decode_runs_equal_one_step_at_a_time(
    monkeypatch, seed, scenario, policy, router, connector
):
    """Advancing decode-only stretches in one compiled run, cut short by arrivals and
    loads, gives what one event per step gives (caches, tiers, links and routing)."""
    trace = _generated(120, seed)
    plan = agg_plan(
        trace,
        scenario,
        capacity=160,
        mnbt=48,
        mns=6,
        instances=3,
        free_loads=False,
        dram_capacity_tokens=3 * 200,
        pool_capacity_tokens=400,
        dram_gbps=0.002,
        pool_gbps=0.001,
        write_policy=policy,
        router=router,
        connector=connector,
    )
    plan = dataclasses.replace(plan, hit_overhead_s=lambda tokens: 2e-6 * tokens)
    fast = simulate(trace, plan, 1.0)
    monkeypatch.setattr(serving_mod, "BURST_MAX", 1)
    slow = simulate(trace, plan, 1.0)
    assert fast.events < slow.events
    np.testing.assert_allclose(fast.ttft_s, slow.ttft_s, rtol=1e-9)
    np.testing.assert_allclose(fast.tpot_s, slow.tpot_s, rtol=1e-9)
    assert fast.hit_tokens_by_tier == slow.hit_tokens_by_tier
    assert fast.preemptions == slow.preemptions
    assert [lk.bytes_total for lk in fast.links] == [lk.bytes_total for lk in slow.links]


@pytest.mark.parametrize("scenario", ["none", "local", "local+dram", "pooled"])
def test_every_request_ends_and_gives_its_kv_back(scenario):
    trace = _generated(150, 7)
    plan = agg_plan(
        trace,
        scenario,
        capacity=120,
        mnbt=32,
        mns=5,
        instances=2,
        dram_capacity_tokens=2 * 100,
        pool_capacity_tokens=200,
    )
    sim = AggregatedSimulation(trace, plan, 1.0)
    st_ = sim.run()
    assert not np.isnan(st_.ttft_s).any()
    outs = output_lengths(trace)[0]
    assert (np.isnan(st_.tpot_s) == (outs <= 1)).all()
    assert st_.preemptions > 0  # the pool is tight: decode growth preempts
    for e in sim.engines:
        assert not e.running and not e.waiting and not e.prefill
        assert sim._held_blocks(e) == 0 and e.priv == 0 and e.n_dec == 0 and e.kv_dec == 0
        if e.inst.hbm is not None:
            assert len(e.inst.hbm) * trace.block_size <= plan.hbm_capacity_tokens


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 12), st.integers(0, 6)),
        min_size=1,
        max_size=40,
    )
)
def test_unbounded_pool_one_request_at_a_time_is_the_ceiling(spec):
    """Requests far apart on one instance with room for everything: every earlier
    prompt's blocks are cached (the reuse ceiling)."""
    blocks = chained_requests(spec)
    prompts = [len(b) * 4 + 1 + i % 3 for i, b in enumerate(blocks)]
    trace = build_trace(blocks, block_size=4, prompts=prompts, outputs=[3] * len(blocks))
    plan = agg_plan(trace, "local", capacity=10**9, mnbt=64, mns=8)
    st_ = simulate(trace, plan, 1.0)
    assert sum(st_.hit_tokens_by_tier) / st_.prompt_tokens == pytest.approx(ceiling_oracle(trace))


def test_running_requests_crowd_out_the_prefix_cache():
    """The same prompts, served one at a time or all at once: while many run, their KV
    holds the pool and a later request finds less of the shared prefix cached."""
    shared = list(range(20))
    blocks = [[*shared, 100 + 10 * i, 101 + 10 * i] for i in range(30)]
    prompts = [len(b) * 4 + 1 for b in blocks]
    outs = [200] * 30
    plan_kw = dict(capacity=700, mnbt=4096, mns=64)
    apart = build_trace(
        blocks, 4, arrivals=[100.0 * i for i in range(30)], prompts=prompts, outputs=outs
    )
    # a burst of long prompts that do not share the prefix, then the shared ones
    crowd = [[1000 + 40 * i + j for j in range(30)] for i in range(5)]
    crowded = build_trace(
        crowd + blocks,
        4,
        arrivals=[0.0] * 5 + [0.01 * (i + 1) for i in range(30)],
        prompts=[len(b) * 4 + 1 for b in crowd] + prompts,
        outputs=[400] * 5 + outs,
    )
    hit_apart = simulate(apart, agg_plan(apart, "local", **plan_kw), 1.0)
    hit_crowd = simulate(crowded, agg_plan(crowded, "local", **plan_kw), 1.0)
    rate_apart = sum(hit_apart.hit_tokens_by_tier) / hit_apart.prompt_tokens
    shared_tokens = sum(prompts)
    crowd_hits = sum(hit_crowd.hit_tokens_by_tier)
    assert rate_apart > 0.8
    assert crowd_hits / shared_tokens < rate_apart


@pytest.mark.parametrize(
    ("connector", "kept"), [(None, 3), (CONNECTORS["vllm"], 3), (CONNECTORS["hicache"], 0)]
)
def test_a_finished_requests_answer_stays_cached_as_vllm_keeps_it(connector, kept):
    """vLLM caches every full block of a request, generated ones too, and frees them
    tail first: after a 9-token prompt (2 blocks of 4 and a partial one) and 12
    generated tokens, 3 more blocks stay cached, and a later request that needs room
    takes them before the prompt's. SGLang behind HiCache keeps the prompt only."""
    trace = build_trace(
        [[1, 2], [3, 4, 5], [1, 2]],
        4,
        arrivals=[0.0, 10.0, 20.0],
        prompts=[9, 13, 9],
        outputs=[12, 1, 1],
    )
    # room for 7 blocks: the second request holds 3 and a private token, so 2 of the
    # first request's 5 cached blocks go, its answer's last two
    plan = agg_plan(trace, "local", capacity=28, mnbt=64, mns=4, connector=connector)
    sim = AggregatedSimulation(trace, plan, 1.0)
    seen: list[int] = []
    finish = sim._finish

    def spy(j, t):
        finish(j, t)
        seen.append(len(sim.engines[0].inst.hbm))

    sim._finish = spy  # type: ignore[method-assign]
    st_ = sim.run()
    assert seen[0] == 2 + kept  # the first request's prompt blocks and its answer's
    # the second's 3 prompt blocks beside the first's 2 and what is left of its answer
    assert seen[1] == (6 if kept else 5)
    assert st_.hit_tokens[2] == 8  # the first prompt is still cached for the third


def test_output_lengths_from_the_log_else_the_stated_distribution():
    trace = build_trace([[1], [2], [3]], 4, outputs=[5, None, 0])
    out, drawn = output_lengths(trace)
    assert drawn == 1
    assert out[0] == 5 and out[2] == 1  # a zero-token answer still takes its first step
    median, _, lo, hi = jobs_mod.DEFAULT_OUTPUT
    assert lo <= out[1] <= hi
    many = build_trace([[i] for i in range(4000)], 4, outputs=[None] * 4000)
    assert np.median(output_lengths(many)[0]) == pytest.approx(median, rel=0.05)


def _dram_hit_ttft(connector):
    """Request 1 computes a 40-block prompt (written to host DRAM); 2 and 3, as long,
    push it out of a 170-token HBM pool; request 4 repeats request 1 with one more block
    and loads the 40 blocks back (1,000 bytes a token over 0.01 GB/s: 16 ms, then the
    scatter)."""
    first = list(range(40))
    blocks = [first, [100 + i for i in range(40)], [200 + i for i in range(40)], [*first, 300]]
    prompts = [len(b) * 4 + 1 for b in blocks]
    trace = build_trace(
        blocks, 4, arrivals=[0.0, 10.0, 20.0, 30.0], prompts=prompts, outputs=[1] * 4
    )
    plan = agg_plan(
        trace,
        "local+dram",
        capacity=170,
        mnbt=4096,
        mns=8,
        connector=connector,
        free_loads=False,
        dram_capacity_tokens=10_000,
        dram_gbps=0.01,
        dram_latency_s=0.0,
    )
    plan = dataclasses.replace(plan, hit_overhead_s=lambda tokens: 1e-5 * tokens)
    st_ = simulate(trace, plan, 1.0)
    assert st_.hit_tokens[3] == 160 == st_.hit_tokens_by_tier[1]  # the 40 blocks, from DRAM
    return float(st_.ttft_s[3]), plan


def test_a_layerwise_load_overlaps_the_prefill():
    load = 160 * 1000 / 0.01e9  # 16 ms
    c = PRICING.coefficients
    compute = lin_step(c, 5.0, 5.0 * (160 + 2.5), 0.0, 0.0)  # the 5 tokens after the hit
    waited, _ = _dram_hit_ttft(CONNECTORS["vllm"])
    assert waited == pytest.approx(load + 160 * 1e-5 + compute)  # load, scatter, prefill
    beside, plan = _dram_hit_ttft(CONNECTORS["hicache"])
    # HiCache: the prefill runs with the load; its last layer waits for the last bytes
    assert beside == pytest.approx(max(compute, load + compute / plan.num_layers))
    assert beside < waited


def test_lower_tiers_store_and_return_whole_chunks():
    """With 8-token chunks (two blocks) a 5-block prompt stores 4 blocks, and a later
    request finds 4 of them in DRAM."""
    blocks = [
        [1, 2, 3, 4, 5],
        [10, 11, 12, 13, 14, 15],
        [20, 21, 22, 23, 24, 25],
        [1, 2, 3, 4, 5, 6],
    ]
    trace = build_trace(
        blocks,
        4,
        arrivals=[0.0, 10.0, 20.0, 30.0],
        prompts=[len(b) * 4 + 1 for b in blocks],
        outputs=[1] * 4,
    )
    plan = agg_plan(
        trace,
        "local+dram",
        capacity=28,
        mnbt=4096,
        mns=8,
        connector=CHUNKED,
        dram_capacity_tokens=10_000,
    )
    st_ = simulate(trace, plan, 1.0)
    assert st_.hit_tokens_by_tier[1] == 16  # 4 blocks of request 1, not its fifth


def test_the_decode_pool_keeps_up_with_the_outputs():
    prompts = np.full(1000, 2000.0)
    outputs = np.full(1000, 200.0)
    held = 10_000 // 2100  # the KV pool holds 4 requests of 2,100 tokens of context
    slow = size_decode_pool(prompts, outputs, 1000.0, PRICING, 10_000, 64, tp=2)
    fast = size_decode_pool(prompts, outputs, 10.0, PRICING, 10_000, 64, tp=2)
    assert slow is not None and fast is not None
    for pool, rate in ((slow, 200.0), (fast, 20_000.0)):
        assert pool.output_tokens_per_s == pytest.approx(rate)
        assert pool.max_batch == held and pool.batch <= held
        # Little's law: the instances generate what the trace asks, each at its batch
        assert pool.instances * pool.batch / pool.tpot_s == pytest.approx(rate, rel=1e-6)
        assert pool.gpus == 2 * pool.instances
    assert fast.instances > slow.instances
    # one fewer instance could not keep up even at the batch it holds
    per = held / PRICING.step_s(0.0, 0.0, held, held * 2100.0)
    assert (fast.instances - 1) * per < 20_000.0 <= fast.instances * per
    assert size_decode_pool(prompts, 0 * outputs, 10.0, PRICING, 10_000, 64, tp=1) is None


def _credit(e, blocks, weights):
    """Blocks of ``blocks`` found in a row in ``e``'s tiers, each weighted by the nearest
    tier holding it (``weights`` by tier level)."""
    m = e.inst.hbm.match(blocks) if e.inst.hbm is not None else 0
    credit = float(m) * weights[0]
    for tier in e.inst.lower:
        w = weights[tier.level]
        mt = tier.cache.match(blocks)
        if w and mt > m:
            credit += w * (mt - m)
            m = mt
    return credit


class _CheckedRouting(AggregatedSimulation):
    """Routes as the engine does, and checks each pick against every engine scored in
    full, the obviously right scan (llm-d's and Dynamo's scores as the docstring says)."""

    picks = 0

    def _route(self, k, blocks, prompt):
        i = super()._route(k, blocks, prompt)
        if blocks and self.plan.router in ("prefix-aware", "kv-router"):
            assert i == self._scan(k, blocks, prompt)
            _CheckedRouting.picks += 1
        return i

    def _scan(self, k, blocks, prompt):
        engines = self.engines
        n = len(engines)
        keys = []
        if self.plan.router == "kv-router":
            for i, e in enumerate(engines):
                credit = _credit(e, blocks, serving_mod.DYNAMO_TIER_WEIGHTS) * self.bs
                credit = min(credit, float(prompt))
                cost = self.plan.prefix_aware_lambda * max(e.prefill_load + prompt - credit, 0.0)
                keys.append((cost + e.kv_dec, i))
            return min(keys)[1]
        queues = [len(e.waiting) for e in engines]
        span = max(queues) - min(queues)
        for i, e in enumerate(engines):
            credit = _credit(e, blocks, serving_mod.LLMD_TIER_WEIGHTS)
            queue = (max(queues) - queues[i]) / span if span else 1.0
            score = 3.0 * (credit / len(blocks)) + 2.0 * queue
            keys.append((-score, float(e.prefill_load + e.kv_dec), (i - k) % n, i))
        return min(keys)[3]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    instances=st.integers(1, 12),
    per_node=st.sampled_from([1, 2, 4]),
    scenario=st.sampled_from(["local", "local+dram", "local+dram+nvme", "pooled"]),
    router=st.sampled_from(["prefix-aware", "kv-router"]),
    dram_scope=st.sampled_from(["instance", "node"]),
)
def test_routing_scores_only_the_engines_that_may_hold_the_prompt(
    seed, instances, per_node, scenario, router, dram_scope
):
    """The routers score the prefix of only the engines whose node was routed a prompt
    with the same first block; each pick is the full scan's, on every setup."""
    trace = _generated(150, seed)
    plan = agg_plan(
        trace,
        scenario,
        capacity=160,
        mnbt=48,
        mns=6,
        instances=instances,
        gpus_per_node=per_node,
        dram_scope=dram_scope,
        free_loads=False,
        dram_capacity_tokens=per_node * 120,
        nvme_capacity_tokens=400,
        pool_capacity_tokens=400,
        dram_gbps=0.002,
        pool_gbps=0.001,
        router=router,
    )
    before = _CheckedRouting.picks
    _CheckedRouting(trace, plan, 1.0).run()
    assert _CheckedRouting.picks > before
