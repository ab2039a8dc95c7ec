"""The replay's hits that cross tenants: the tokens of a hit whose block another
tenant's request last stored or refreshed, counted per scenario (RunStats), against a
hand-counted trace, a slow replay of one unbounded cache, and the reuse analysis's
last-holder split."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_replay_serving import PRICING

from analyzer.replay import UNBOUNDED, ClusterConfig, resolve, run_replay
from analyzer.replay.config import select_scenarios
from analyzer.replay.engine import RunStats, simulate
from analyzer.reuse.analysis import ReuseOptions, analyze_reuse
from analyzer.trace import BlockTrace
from tests.helpers.replay import AnalyticCost, build_trace, chained_requests

COST = AnalyticCost()


def cfg(**kw) -> ClusterConfig:
    base = dict(
        model="test-model",
        gpu="test-gpu",
        instances=1,
        free_loads=True,
        warmup_fraction=0.0,
        serving="disaggregated",
        local_capacity_tokens=UNBOUNDED,
        pool_capacity_tokens=UNBOUNDED,
    )
    base.update(kw)
    return ClusterConfig(**base)


def scenario(trace: BlockTrace, c: ClusterConfig, name: str = "local") -> dict:
    doc = run_replay(trace, c, scenarios=[name], search_rate=False, cost=COST).to_json()
    return doc["scenarios"][name]


def stats(trace: BlockTrace, serving: str, name: str = "local") -> RunStats:
    """One run of ``name`` with unbounded caches: the prefill pool, or the aggregated
    engine with a KV pool no request fills (under the analytic cost, which names no GPU
    to take the engine's defaults from)."""
    plan = resolve(cfg(), select_scenarios(name)[0], trace.block_size, cost=COST).plan
    if serving == "aggregated":
        plan = dataclasses.replace(
            plan,
            serving="aggregated",
            step=PRICING,
            max_num_batched_tokens=4096,
            max_num_seqs=64,
            hbm_capacity_tokens=10**9,
            num_layers=4,
        )
    return simulate(trace, plan, 1.0)


# Six requests, 4-token blocks, each arriving after the one before has finished. The
# tenant that last held each block, and the hits another tenant left:
#   r0 A [0,1]      no hit                      holders 0:A 1:A
#   r1 B [0,1,2]    hits 0,1 (A, A): 8 of 8     holders 0:B 1:B 2:B
#   r2 A [0,1,2,3]  hits 0,1,2 (B): 12 of 12    holders 0:A 1:A 2:A 3:A
#   r3 B [0,5]      hit 0 (A): 4 of 4           holders 0:B 5:B
#   r4 A [0,1]      hits 0 (B), 1 (A): 4 of 8   holders 0:A 1:A
#   r5 B [0,1], an 8-token prompt: the hit stops at 7 tokens, the last block's 3
#                   hits 0,1 (A, A): 7 of 7
HAND_BLOCKS = [[0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 5], [0, 1], [0, 1]]
HAND_TENANTS = ["A", "B", "A", "B", "A", "B"]
HAND_PROMPTS = [9, 13, 17, 9, 9, 8]


def hand_trace(tenants: list[str | None] = HAND_TENANTS) -> BlockTrace:
    return build_trace(HAND_BLOCKS, block_size=4, prompts=HAND_PROMPTS, tenants=tenants)


@pytest.mark.parametrize("name", ["local", "pooled"])
def test_hand_counted_cross_tenant_hits(name):
    res = scenario(hand_trace(), cfg(), name)
    assert sum(res["hit_tokens_by_tier"].values()) == 8 + 12 + 4 + 8 + 7
    assert res["cross_tenant_hit_tokens"] == 8 + 12 + 4 + 4 + 7
    assert res["cross_tenant_hit_share"] == pytest.approx(35 / 39)


@pytest.mark.parametrize("name", ["local", "pooled"])
def test_hand_counted_cross_tenant_hits_aggregated(name):
    st_ = stats(hand_trace(), "aggregated", name)
    assert sum(st_.hit_tokens_by_tier) == 39
    assert st_.cross_tenant_hit_tokens == 35


def test_one_tenant_or_unknown_tenants_cross_nothing():
    for tenants in (["A"] * 6, [None] * 6, ["A", None, "A", None, "A", None]):
        res = scenario(hand_trace(tenants), cfg())
        assert sum(res["hit_tokens_by_tier"].values()) == 39
        assert res["cross_tenant_hit_tokens"] == 0 and res["cross_tenant_hit_share"] == 0.0


def test_a_request_of_unknown_tenant_neither_crosses_nor_is_crossed():
    # r1 has no tenant: its hits are nobody's, and the blocks it refreshes are held by
    # no known tenant, so r2's hits on them cross nothing (the reuse analysis's
    # "unattributed").
    res = scenario(hand_trace(["A", None, "A", "B", "A", "B"]), cfg())
    assert res["cross_tenant_hit_tokens"] == 0 + 0 + 4 + 4 + 7


def test_only_measured_requests_are_counted():
    res = scenario(hand_trace(), cfg(warmup_fraction=0.5))
    # r3, r4, r5 measured
    assert res["cross_tenant_hit_tokens"] == 4 + 4 + 7


def slow_cross_tenant(trace: BlockTrace) -> tuple[int, int]:
    """One unbounded cache, each request finished before the next arrives: its hit is
    its leading blocks seen before (the prompt's last token never), and a hit token
    crosses tenants when the block's previous user was another known tenant."""
    holder: dict[int, int] = {}
    hits = cross = 0
    bs = trace.block_size
    for k in range(trace.n_requests):
        blocks = trace.blocks_of(k).tolist()
        tenant = int(trace.tenant[k])
        cap = max(int(trace.prompt_tokens[k]) - 1, 0)
        m = 0
        while m < len(blocks) and blocks[m] in holder:
            m += 1
        for i in range(m):
            tokens = min((i + 1) * bs, cap) - min(i * bs, cap)
            hits += tokens
            held = holder[blocks[i]]
            if tenant >= 0 and held >= 0 and held != tenant:
                cross += tokens
        for b in blocks:
            holder[b] = tenant
    return hits, cross


specs = st.lists(
    st.tuples(st.integers(0, 50), st.integers(0, 12), st.integers(0, 6), st.integers(-1, 3)),
    min_size=1,
    max_size=40,
)


def spec_trace(spec) -> BlockTrace:
    blocks = chained_requests([s[:3] for s in spec])
    tenants = [None if s[3] < 0 else f"t{s[3]}" for s in spec]
    prompts = [len(b) * 4 + 1 + (i % 3) for i, b in enumerate(blocks)]
    return build_trace(blocks, block_size=4, prompts=prompts, tenants=tenants)


@settings(max_examples=40, deadline=None)
@given(specs, st.sampled_from(["disaggregated", "aggregated"]))
def test_unbounded_cache_matches_the_slow_replay_and_the_reuse_split(spec, serving):
    trace = spec_trace(spec)
    st_ = stats(trace, serving)
    hits, cross = slow_cross_tenant(trace)
    assert sum(st_.hit_tokens_by_tier) == hits
    assert st_.cross_tenant_hit_tokens == cross
    # with unlimited capacity the option's figure is the log-wide one of the reuse
    # analysis (every request counted, no sessions: same tenant or another)
    rep = analyze_reuse(trace, ReuseOptions(warmup=0.0, capacities_tokens=(16,)))
    assert rep.sources is not None
    assert rep.sources.hit_tokens_by_source["cross_tenant"] == cross
    assert rep.sources.share_of_hits["cross_tenant"] == pytest.approx(
        cross / hits if hits else 0.0, abs=1e-12
    )
