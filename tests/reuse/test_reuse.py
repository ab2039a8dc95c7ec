"""Reuse analytics against brute-force oracles, and golden numbers on the public traces."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.cache import POLICIES, kernels
from analyzer.cache.kernels import optimal_all, optimal_stack, simulate_fast
from analyzer.cache.radix import ROOT
from analyzer.cache.simulate import next_use_requests, simulate
from analyzer.cache.stack import access_weights, lru_histogram
from analyzer.reuse import ReuseOptions, analysis, analyze_reuse
from analyzer.reuse.analysis import (
    first_counted_request,
    prefix_hit_tokens,
    shards_curve,
    shards_error,
)
from analyzer.reuse.synthetic import chained_trace
from analyzer.trace import BlockTrace
from tests.helpers.traces import make_trace, mooncake_table, read_jsonl

# -- building traces -------------------------------------------------------------


@st.composite
def chained(draw, max_requests: int = 30, max_new: int = 5):
    """Chains that extend prefixes of earlier ones (heavy reuse, so positions compact often)."""
    n = draw(st.integers(1, max_requests))
    chains: list[list[int]] = []
    next_id = 0
    for _ in range(n):
        prefix: list[int] = []
        if chains and draw(st.integers(0, 9)) < 7:
            base = chains[draw(st.integers(0, len(chains) - 1))]
            prefix = base[: draw(st.integers(0, len(base)))]
        m = draw(st.integers(0, max_new))
        chains.append(prefix + list(range(next_id, next_id + m)))
        next_id += m
    extra = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return chains, extra


def hit_of(k: int, prompt: int, bs: int) -> int:
    return max(min(k * bs, prompt - 1), 0)


def naive_lru(chains, prompts, bs, first, capacity) -> int:
    """Per-capacity LRU over blocks, each request touching its blocks tail-first."""
    cache: OrderedDict[int, None] = OrderedDict()
    hit = 0
    for r, chain in enumerate(chains):
        k = 0
        while k < len(chain) and chain[k] in cache:
            k += 1
        if r >= first:
            hit += hit_of(k, prompts[r], bs)
        for b in reversed(chain):
            cache[b] = None
            cache.move_to_end(b)
            while len(cache) > capacity:
                cache.popitem(last=False)
    return hit


def naive_ceiling(chains, prompts, bs, first) -> int:
    """Longest prefix equal to a prefix of any earlier request, by brute force."""
    seen: set[tuple[int, ...]] = set()
    hit = 0
    for r, chain in enumerate(chains):
        k = 0
        while k < len(chain) and tuple(chain[: k + 1]) in seen:
            k += 1
        if r >= first:
            hit += hit_of(k, prompts[r], bs)
        seen.update(tuple(chain[:j]) for j in range(1, len(chain) + 1))
    return hit


def naive_belady(chains, prompts, bs, first, capacity) -> int:
    """Leaf-only Belady by scanning every cached block (ties: most recently inserted)."""
    n = len(chains)
    cache: dict[int, list[int]] = {}  # b -> [parent, next_use, insert_order]
    order = 0
    hit = 0
    for r, chain in enumerate(chains):
        k = 0
        while k < len(chain) and chain[k] in cache:
            k += 1
        if r >= first:
            hit += hit_of(k, prompts[r], bs)
        chain = chain[:capacity]
        parent = ROOT
        for b in chain:
            if b not in cache:
                order += 1
                cache[b] = [parent, n, order]
            nxt = next((q for q in range(r + 1, n) if b in chains[q]), n)
            cache[b][1] = nxt
            parent = b
        while len(cache) > capacity:
            parents = {v[0] for v in cache.values()}
            leaves = [b for b in cache if b not in parents]  # the new blocks too (bypass)
            victim = max(leaves, key=lambda b: (cache[b][1], cache[b][2]))
            del cache[victim]
    return hit


# -- oracles ---------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(data=chained(), warmup=st.sampled_from([0.0, 0.3, 0.5]))
def test_one_pass_lru_curve_equals_naive_lru_at_every_capacity(data, warmup):
    chains, extra = data
    tr = make_trace(chains, extra)
    first = first_counted_request(tr.n_requests, warmup)
    prompts = tr.prompt_tokens.tolist()
    hist = lru_histogram(
        tr.block_ids,
        tr.offsets,
        tr.prompt_tokens,
        np.empty(0, np.int64),
        4,
        first,
        tr.n_blocks,
        True,
    )
    cum = np.concatenate([[0], np.cumsum(hist[:-1])])
    rep = analyze_reuse(tr, ReuseOptions(warmup=warmup, policies=("lru",)))
    den = int(tr.prompt_tokens[first:].sum())
    for cap in range(tr.n_blocks + 2):
        want = naive_lru(chains, prompts, 4, first, cap)
        assert int(cum[min(cap, tr.n_blocks)]) == want
        assert rep.hit_rate_at(cap * 4) == pytest.approx(want / den if den else 0.0, abs=1e-12)
        assert rep.hit_rate_at(cap * 4 + 3) == rep.hit_rate_at(cap * 4)  # whole blocks


@settings(max_examples=120, deadline=None)
@given(
    data=chained(),
    warmup=st.sampled_from([0.0, 0.5]),
    slice_=st.sampled_from([1, 2, 5, 1 << 22]),
)
def test_ceiling_equals_naive_prefix_matching(data, warmup, slice_):
    from unittest import mock

    from analyzer.reuse import analysis

    chains, extra = data
    tr = make_trace(chains, extra)
    first = first_counted_request(tr.n_requests, warmup)
    prompts = tr.prompt_tokens.tolist()
    rep = analyze_reuse(tr, ReuseOptions(warmup=warmup))
    json.dumps(rep.to_json())  # every report, however degenerate, serialises
    assert rep.hit_tokens == naive_ceiling(chains, prompts, 4, first)
    # the vectorised route (coarser block sizes, a slice of requests at a time, a request
    # larger than a slice included) agrees with the scan
    with mock.patch.object(analysis, "PREFIX_SLICE", slice_):
        vec = prefix_hit_tokens(tr)
        assert int(vec[first:].sum()) == rep.hit_tokens
        # and at twice the block size with BlockTrace.coarsen plus naive matching, request
        # by request
        coarse = tr.coarsen(2)
        chains2 = [coarse.blocks_of(i).tolist() for i in range(tr.n_requests)]
        per_req = [
            naive_ceiling(chains2[: i + 1], prompts[: i + 1], 8, i) for i in range(len(chains2))
        ]
        assert prefix_hit_tokens(tr, 2).tolist() == per_req
    den = sum(prompts[first:])
    assert rep.ceiling_hit_rate == pytest.approx(rep.hit_tokens / den if den else 0.0)
    cold = naive_ceiling(chains, prompts, 4, 0) / sum(prompts) if sum(prompts) else 0.0
    assert rep.cold_ceiling_hit_rate == pytest.approx(cold)


@settings(max_examples=100, deadline=None)
@given(data=chained(max_requests=18), capacity=st.integers(1, 12))
def test_policy_simulations_against_oracles(data, capacity):
    chains, extra = data
    tr = make_trace(chains, extra)
    prompts = tr.prompt_tokens.tolist()
    first = first_counted_request(tr.n_requests, 0.3)
    args = (tr.block_ids, tr.offsets, tr.prompt_tokens, 4, first)
    assert simulate(*args, capacity, "lru") == naive_lru(chains, prompts, 4, first, capacity)
    assert simulate(*args, capacity, "optimal") == naive_belady(chains, prompts, 4, first, capacity)
    # with room for everything no policy ever evicts: all reach the ceiling
    ceiling = naive_ceiling(chains, prompts, 4, first)
    for policy in POLICIES:
        assert simulate(*args, max(tr.n_blocks, 1), policy) == ceiling
        # the numba versions take the same decisions as the Python reference
        assert simulate_fast(*args, capacity, policy) == simulate(*args, capacity, policy)
    # the offline optimum bounds every online policy at the same capacity
    best = simulate(*args, capacity, "optimal")
    for policy in ("lru", "fifo", "s3fifo"):
        assert simulate(*args, capacity, policy) <= best, policy


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(data=chained(max_requests=24), warmup=st.sampled_from([0.0, 0.3, 0.5]))
def test_one_stack_pass_gives_belady_at_every_capacity(data, warmup):
    # Belady's MIN is a stack algorithm: one pass over the trace gives the hit tokens of
    # the per-capacity simulation (and of the brute-force oracle) at every capacity.
    chains, extra = data
    tr = make_trace(chains, extra)
    prompts = tr.prompt_tokens.tolist()
    first = first_counted_request(tr.n_requests, warmup)
    args = (tr.block_ids, tr.offsets, tr.prompt_tokens, 4, first)
    caps = list(range(tr.n_blocks + 3))
    next_use = next_use_requests(tr.block_ids, tr.offsets)
    got = optimal_stack(*args, np.array(caps, dtype=np.int64), next_use).tolist()
    want = [simulate(*args, cap, "optimal") for cap in caps]
    assert got == want
    assert got == [naive_belady(chains, prompts, 4, first, cap) for cap in caps]
    # any subset, in any order, reads the same figures
    some = caps[::-2]
    assert optimal_all(*args, some, next_use) == [want[c] for c in some]


def test_the_stack_pass_declines_what_is_not_a_prefix_tree():
    # block 1 after block 0 in one request and first in another: not a tree
    tr = make_trace([[0, 1], [1, 2]])
    args = (tr.block_ids, tr.offsets, tr.prompt_tokens, 4, 0)
    next_use = next_use_requests(tr.block_ids, tr.offsets)
    assert optimal_stack(*args, np.array([1, 2], dtype=np.int64), next_use).size == 0
    assert optimal_all(*args, [1, 2], next_use) is None
    # and the analysis then runs the per-capacity simulations
    rep = analyze_reuse(
        tr, ReuseOptions(warmup=0.0, capacities_tokens=(4, 8), policies=("lru", "optimal"))
    )
    want = [simulate(*args, c, "optimal") / int(tr.prompt_tokens.sum()) for c in (1, 2)]
    assert [rate for _, rate in rep.policy_points["optimal"]] == pytest.approx(want)


@settings(max_examples=60, deadline=None)
@given(data=chained())
def test_shards_at_rate_one_is_the_exact_curve(data):
    chains, extra = data
    tr = make_trace(chains, extra)
    first = first_counted_request(tr.n_requests, 0.5)
    prompts = tr.prompt_tokens.tolist()
    den = sum(prompts[first:])
    curve = shards_curve(tr, 1.0, first)
    for cap in range(tr.n_blocks + 2):
        want = naive_lru(chains, prompts, 4, first, cap) / den if den else 0.0
        assert curve.at(cap) == pytest.approx(want, abs=1e-12)


def test_next_use_requests():
    tr = make_trace([[0, 1], [0], [2], [0, 1]])
    assert next_use_requests(tr.block_ids, tr.offsets).tolist() == [1, 3, 3, 4, 4, 4]
    assert kernels.next_use_requests(tr.block_ids, tr.offsets).tolist() == [1, 3, 3, 4, 4, 4]


@settings(max_examples=200, deadline=None)
@given(
    chains=st.lists(st.lists(st.integers(0, 12), max_size=8), min_size=1, max_size=30),
    tail=st.integers(0, 3),
    shift=st.sampled_from([0, -3, 1 << 40]),
)
def test_the_compiled_next_use_is_the_reference(chains, tail, shift):
    # Any ids, a block repeated inside a request, empty requests, ids beyond the last
    # request's end (ignored), negative and sparse ids (left to the reference): the one
    # backward pass gives what the sort gives.
    counts = [len(c) for c in chains]
    offsets = np.zeros(len(chains) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = np.array([b + shift for c in chains for b in c] + [7] * tail, dtype=np.int64)
    got = kernels.next_use_requests(ids, offsets)
    used = ids[: offsets[-1]]
    dense = not used.size or (used.min() >= 0 and used.max() < 2 * used.size + 1024)
    # the compiled pass gives int32 (every request index fits), the reference int64
    assert got.dtype == (np.int32 if dense else np.int64)
    assert got.tolist() == next_use_requests(ids, offsets).tolist()


def test_simulation_state_is_int32_only_where_every_counter_fits():
    assert kernels.state_dtype(11_874_649, 50_000) is np.int32
    assert kernels.state_dtype(700_000_000, 10) is np.int32
    assert kernels.state_dtype(716_000_000, 10) is np.int64  # 3 steps an access overflow
    assert kernels.state_dtype(10, 2**31) is np.int64


@pytest.mark.slow
def test_narrow_and_wide_simulation_state_take_the_same_decisions(monkeypatch):
    tr = chained_trace(80, seed=5, system_blocks=6, mean_new_blocks=3)
    first = first_counted_request(tr.n_requests, 0.5)
    args = (tr.block_ids, tr.offsets, tr.prompt_tokens, tr.block_size, first)
    runs = [(cap, policy) for cap in (1, 3, 20, 400) for policy in POLICIES]
    narrow = [simulate_fast(*args, cap, policy) for cap, policy in runs]
    assert kernels.next_use_requests(tr.block_ids, tr.offsets).dtype == np.int32
    monkeypatch.setattr(kernels, "state_dtype", lambda *_: np.int64)
    assert kernels.next_use_requests(tr.block_ids, tr.offsets).dtype == np.int64
    assert [simulate_fast(*args, cap, policy) for cap, policy in runs] == narrow


def test_last_token_is_never_a_hit():
    # the second request is entirely cached, but its last token must be recomputed
    tr = make_trace([[0, 1], [0, 1]], extra=[0, 0])
    rep = analyze_reuse(tr, ReuseOptions(warmup=0.0, policies=("lru",)))
    assert rep.hit_tokens == 7
    assert access_weights(tr.offsets, tr.prompt_tokens, 4).tolist() == [4, 3, 4, 3]


def test_shards_error_is_small_on_a_generated_trace():
    tr = chained_trace(600, seed=3)
    err = shards_error(tr, 0.1, 0.5, tr.n_accesses)
    assert err["checked_accesses"] == tr.n_accesses > 200_000
    assert err["max_abs_error"] < 0.03
    assert err["mean_abs_error"] < 0.015
    rep = analyze_reuse(tr, ReuseOptions(shards_rate=0.1, policies=("lru",)))
    assert rep.curve_method == "shards" and rep.shards["rate"] == 0.1
    exact = analyze_reuse(tr, ReuseOptions(policies=("lru",)))
    # the sampled curve ends at the exact ceiling's scale
    assert rep.curve.rates[-1] == pytest.approx(exact.ceiling_hit_rate, abs=0.02)
    # a sampled run skips the exact distances but keeps every other figure exact
    assert rep.ceiling_hit_rate == exact.ceiling_hit_rate
    assert rep.sources == exact.sources and rep.top_prefixes == exact.top_prefixes
    assert rep.working_set == exact.working_set and rep.granularity == exact.granularity
    assert rep.reuse_time == exact.reuse_time
    assert rep.reuse_distance["tokens"]["p50"] == pytest.approx(exact.knee_tokens(0.5), rel=0.1)


def test_generated_trace_is_chained_and_deterministic():
    a, b = chained_trace(50, seed=7), chained_trace(50, seed=7)
    assert np.array_equal(a.block_ids, b.block_ids)
    assert np.array_equal(a.block_hashes, b.block_hashes)
    # dense in first-seen order, and each id always follows the same parent
    ids = a.block_ids
    assert np.array_equal(np.maximum.accumulate(ids), np.maximum.accumulate(ids))
    first_pos = {int(x): i for i, x in reversed(list(enumerate(ids)))}
    assert sorted(first_pos, key=first_pos.get) == list(range(a.n_blocks))
    parent: dict[int, int] = {}
    for r in range(a.n_requests):
        chain = a.blocks_of(r).tolist()
        for k, x in enumerate(chain):
            assert parent.setdefault(x, chain[k - 1] if k else -1) == (chain[k - 1] if k else -1)


# -- report contents -------------------------------------------------------------


def test_sources_top_prefixes_and_previews():
    chains = [[0, 1, 2], [0, 1, 2, 3], [0, 1, 4], [0, 1, 5]]
    tr = make_trace(
        chains,
        extra=[5] * 4,
        block_size=16,
        sessions=[0, 0, 1, 2],
        tenants=[0, 0, 0, 1],
        previews={0: "You are a helpful assistant.", 1: "Tools: search"},
    )
    rep = analyze_reuse(tr, ReuseOptions(warmup=0.0, policies=("lru",)))
    # r1 reuses 0,1,2 last held by r0 (same session); r2 reuses 0,1 last held by r1
    # (same tenant, other session); r3 reuses 0,1 last held by r2 (another tenant)
    assert rep.sources is not None
    assert rep.sources.hit_tokens_by_source == {
        "same_session": 48,
        "same_tenant": 32,
        "cross_tenant": 32,
        "unattributed": 0,
    }
    assert rep.sources.share_of_hits["same_session"] == pytest.approx(48 / 112)
    assert rep.sources.to_json()["same_session"] == rep.sources.share_of_hits["same_session"]
    tops = rep.top_prefixes
    assert [(e.block_id, e.requests, e.prefix_tokens) for e in tops.by_count] == [
        (1, 3, 32),
        (2, 1, 48),
    ]
    assert tops.by_volume[0].reused_tokens == 96
    assert tops.by_volume[0].preview == "You are a helpful assistant. … Tools: search"
    # who holds each prefix, as the report says it instead of a hash: the requests that
    # hold the block, their tenants counted (the log names no model)
    for e in tops.by_count + tops.by_volume:
        holders = [i for i in range(tr.n_requests) if e.block_id in tr.blocks_of(i)]
        assert e.tenants == len({int(tr.tenant[i]) for i in holders})
        assert e.models == ()
    assert [e.tenants for e in tops.by_count] == [2, 1]
    assert rep.reuse_distance["hit_accesses"] == 7
    assert rep.reuse_time["hit_accesses"] == 7


def test_working_set_counts_distinct_blocks_per_window():
    tr = make_trace([[0, 1], [0, 2], [3], [3, 4]])
    rep = analyze_reuse(tr, ReuseOptions(n_windows=2, policies=("lru",)))
    # arrivals 0,1,2,3 over a 3 s span in two 1.5 s windows: {0,1,2} then {3,4}
    counts = [w["distinct_blocks"] for w in rep.working_set["windows"]]
    assert counts == [3, 2]


def test_granularity_token_exact_and_coarser_blocks():
    chains = [[0, 1, 2, 3], [0, 1, 4, 5], [0, 6]]
    tr = make_trace(chains, extra=[2, 2, 2], block_size=4, lcp=[0, 9, 5])
    rep = analyze_reuse(tr, ReuseOptions(warmup=0.0, granularities=(8, 12), policies=("lru",)))
    g = rep.granularity
    assert g is not None
    prompts = [18, 18, 10]
    assert g.token_exact.cold_hit_rate == pytest.approx((0 + 9 + 5) / sum(prompts))
    rows = {r.block_size_tokens: r for r in g.blocks}
    assert rows[4].cold_hit_rate == pytest.approx((0 + 8 + 4) / sum(prompts))
    # at 8 tokens the second request shares one coarse block, the third none
    assert rows[8].cold_hit_rate == pytest.approx((0 + 8 + 0) / sum(prompts))
    assert rows[12].available is True
    assert g.hit_rate_by_block_size()[12] == rows[12].hit_rate
    rep16 = analyze_reuse(tr, ReuseOptions(granularities=(6,), policies=("lru",)))
    assert rep16.granularity is not None
    row6 = next(r for r in rep16.granularity.blocks if r.block_size_tokens == 6)
    assert row6.available is False and "multiple" in (row6.reason or "")
    assert 6 not in rep16.granularity.hit_rate_by_block_size()


def test_non_prefix_reuse_from_content_ids():
    # request 1 holds request 0's content blocks in the other order: no prefix hit
    chains = [[0, 1], [2, 3], [0, 1]]
    content = [[0, 1], [1, 0], [0, 1]]
    tr = make_trace(chains, extra=[1, 1, 1], content=content)
    rep = analyze_reuse(tr, ReuseOptions(warmup=0.0, policies=("lru",)))
    npx = rep.non_prefix
    total = 27
    assert npx.cold_prefix_rate == pytest.approx(8 / total)
    assert npx.cold_content_seen_rate == pytest.approx(16 / total)
    assert npx.cold_hit_rate == pytest.approx(8 / total)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 6), max_size=5), min_size=1, max_size=12),
    st.integers(1, 9),
)
def test_non_prefix_reuse_in_chunks_equals_a_naive_count(content, chunk):
    # content ids renumbered in first-seen order, as BlockTrace holds them
    order: dict[int, int] = {}
    content = [[order.setdefault(c, len(order)) for c in req] for req in content]
    chains, nxt = [], 0
    for req in content:
        chains.append(list(range(nxt, nxt + len(req))))
        nxt += len(req)
    tr = make_trace(chains, extra=[2] * len(chains), content=content)
    zero = np.zeros(tr.n_requests, dtype=np.int64)
    old = analysis.NON_PREFIX_CHUNK
    analysis.NON_PREFIX_CHUNK = chunk
    try:
        got = analysis.non_prefix_reuse(tr, 0, zero)
    finally:
        analysis.NON_PREFIX_CHUNK = old
    seen: set[int] = set()
    naive = []
    for r, req in enumerate(content):
        prompt = int(tr.prompt_tokens[r])
        naive.append(
            sum(
                max(min((k + 1) * 4, prompt - 1) - min(k * 4, prompt - 1), 0)
                for k, c in enumerate(req)
                if c in seen
            )
        )
        seen.update(req)
    total = int(tr.prompt_tokens.sum())
    assert got.cold_content_seen_rate == pytest.approx(sum(naive) / total)


def test_count_only_trace_is_not_measurable():
    tr = make_trace([[], []])
    tr = BlockTrace(**{**{f: getattr(tr, f) for f in tr.__dataclass_fields__}, "count_only": True})
    rep = analyze_reuse(tr)
    assert rep.measurable is False and "cannot be measured" in rep.reason
    doc = rep.to_json()
    assert doc["measurable"] is False and doc["curves"] == {}
    assert rep.hit_rate_at(1000) == 0.0 and rep.knee_tokens() == 0


def test_a_sampled_curve_that_kept_no_reuse_has_no_knee():
    """A report whose ceiling is above zero and whose hit-rate curve has no point (SHARDS
    sampling at half the blocks drops a log's one reused block: the streamed-report
    Hypothesis test found such a log) is written, with knees of zero tokens, not an
    IndexError."""
    import dataclasses

    from analyzer.reuse.records import EMPTY_CURVE

    rep = analyze_reuse(make_trace([[1, 2], [], [1, 3]], block_size=4))
    assert rep.ceiling_hit_rate > 0
    empty = dataclasses.replace(rep, curve=EMPTY_CURVE)
    assert empty.knee_tokens(0.5) == empty.knee_tokens() == 0
    assert all(v["capacity_tokens"] == 0 for v in empty.to_json()["knees"].values())


def test_json_is_deterministic_and_has_the_issue_keys():
    tr = chained_trace(40, seed=2)
    opts = ReuseOptions(capacities_tokens=(1600, 16000), bytes_per_token=131072)
    a = json.dumps(analyze_reuse(tr, opts).to_json(), sort_keys=True)
    b = json.dumps(analyze_reuse(tr, opts).to_json(), sort_keys=True)
    assert a == b
    doc = json.loads(a)
    assert {"hit_rate", "warmup", "block_size"} <= set(doc["ceiling"])
    assert {"lru", "fifo", "s3fifo", "optimal"} <= set(doc["curves"])
    for key in ("sources", "top_prefixes", "granularity", "non_prefix"):
        assert key in doc
    point = doc["curves"]["optimal"][1]
    assert point["capacity_tokens"] == 16000
    assert point["capacity_gib"] == pytest.approx(16000 * 131072 / 2**30, abs=1e-3)
    assert [row["capacity_blocks"] for row in doc["capacities"]] == [100, 1000]
    lru = [p["hit_rate"] for p in doc["curves"]["lru"]]
    assert lru == sorted(lru) and len(lru) > 50


def test_typed_curves_and_capacity_rows_are_what_the_json_says():
    tr = chained_trace(40, seed=2)
    opts = ReuseOptions(capacities_tokens=(1600, 16000), bytes_per_token=131072)
    rep = analyze_reuse(tr, opts)
    doc = rep.to_json()
    rows = rep.capacity_rows()
    assert [r.capacity_tokens for r in rows] == [1600, 16000]
    for row, cap in zip(rows, (1600, 16000), strict=True):
        assert row.capacity_blocks == cap // tr.block_size
        assert row.lru_hit_rate == rep.hit_rate_at(cap)
        assert row.hit_rate_by_policy["fifo"] == rep.hit_rate_at(cap, "fifo")
        assert row.capacity_gib == pytest.approx(cap * 131072 / 2**30, abs=1e-3)
    assert [r.to_json() for r in rows] == doc["capacities"]
    curves = rep.curves()
    assert set(curves) == set(doc["curves"])
    lru = curves["lru"]
    assert [p.capacity_tokens for p in lru] == [p["capacity_tokens"] for p in doc["curves"]["lru"]]
    assert lru[-1].hit_rate == pytest.approx(rep.ceiling_hit_rate)
    assert [p.to_json() for p in rep.lru_cold_curve()] == doc["lru_cold_curve"]
    assert rep.top_prefixes.to_json() == doc["top_prefixes"]


def test_simulations_on_threads_give_the_same_report():
    tr = chained_trace(300, seed=5)
    opts = ReuseOptions(capacities_tokens=(800, 4000, 16000, 64000))
    one = json.dumps(analyze_reuse(tr, opts).to_json(), sort_keys=True)
    steps: list[float] = []
    threaded = analyze_reuse(tr, ReuseOptions(**{**_fields(opts), "jobs": 3}), steps.append)
    assert json.dumps(threaded.to_json(), sort_keys=True) == one
    assert sum(steps) == pytest.approx(100)


def _fields(opts: ReuseOptions) -> dict:
    return {k: getattr(opts, k) for k in ReuseOptions.__dataclass_fields__}


def test_knee_and_hit_rate_at():
    tr = chained_trace(40, seed=2)
    rep = analyze_reuse(tr, ReuseOptions(capacities_tokens=(3200,), policies=("lru", "fifo")))
    knee = rep.knee_tokens(0.9)
    assert rep.hit_rate_at(knee) >= 0.9 * rep.ceiling_hit_rate - 1e-12
    assert rep.hit_rate_at(knee - tr.block_size) < 0.9 * rep.ceiling_hit_rate
    assert rep.hit_rate_at(10**12) == pytest.approx(rep.ceiling_hit_rate)
    assert rep.cold_curve.at(10**9) == pytest.approx(rep.cold_ceiling_hit_rate)
    assert rep.to_json()["lru_cold_curve"][-1]["hit_rate"] == pytest.approx(
        rep.cold_ceiling_hit_rate, abs=1e-6
    )
    assert rep.hit_rate_at(3200, "fifo") == rep.policy_points["fifo"][0][1]
    with pytest.raises(ValueError):
        rep.hit_rate_at(999_999, "fifo")


def test_bad_options_are_usage_errors():
    from analyzer.errors import UsageError

    with pytest.raises(UsageError):
        ReuseOptions(warmup=1.0)
    with pytest.raises(UsageError):
        ReuseOptions(policies=("lfu",))


# -- golden numbers on the public traces -------------------------------------------


def test_golden_mooncake_conversation(shared_traces):
    path = shared_traces / "mooncake" / "conversation_trace.jsonl"
    rows = read_jsonl(path)
    # independent loop: a block hits when its id was seen in an earlier request
    seen: set[int] = set()
    hits, prompts = [], []
    for r in rows:
        full = r["hash_ids"][: r["input_length"] // 512]
        k = 0
        while k < len(full) and full[k] in seen:
            k += 1
        hits.append(max(min(k * 512, r["input_length"] - 1), 0))
        prompts.append(r["input_length"])
        seen.update(full)
    half = len(rows) // 2
    steady = sum(hits[half:]) / sum(prompts[half:])
    cold = sum(hits) / sum(prompts)
    assert round(steady, 4) == 0.3978  # 39.8 %: docs/reuse.md, Reference figures
    assert round(cold, 4) == 0.3734

    tr = BlockTrace.from_table(mooncake_table(path))
    rep = analyze_reuse(tr, ReuseOptions(policies=("lru",)))
    assert rep.hit_tokens == sum(hits[half:])
    assert rep.ceiling_hit_rate == pytest.approx(steady, abs=1e-12)
    assert rep.cold_ceiling_hit_rate == pytest.approx(cold, abs=1e-12)
    assert rep.hit_rate_at(10**10) == pytest.approx(steady, abs=1e-12)
    assert rep.granularity is not None
    assert not rep.granularity.blocks[0].available  # 16 is finer than 512
    # naive LRU at one capacity, on the real trace
    chains = [tr.blocks_of(i).tolist() for i in range(tr.n_requests)]
    cap = 8192
    want = naive_lru(chains, tr.prompt_tokens.tolist(), 512, half, cap)
    assert rep.hit_rate_at(cap * 512) == pytest.approx(want / rep.prompt_tokens, abs=1e-12)


@pytest.mark.slow
def test_golden_mooncake_belady_at_seven_budgets(shared_traces):
    # `kvpool reuse --model llama-3.1-8b --capacity-gib 1,2,...,64 --policies lru,optimal`
    # on the conversation trace: 128 KiB a token, so 16 to 1,024 blocks of 512 tokens.
    tr = BlockTrace.from_table(
        mooncake_table(shared_traces / "mooncake" / "conversation_trace.jsonl")
    )
    first = first_counted_request(tr.n_requests, 0.5)
    args = (tr.block_ids, tr.offsets, tr.prompt_tokens, 512, first)
    caps = [2**30 * g // (128 * 1024) // 512 for g in (1, 2, 4, 8, 16, 32, 64)]
    assert caps == [16, 32, 64, 128, 256, 512, 1024]
    next_use = next_use_requests(tr.block_ids, tr.offsets)
    one_pass = optimal_all(*args, caps, next_use)
    assert one_pass == [simulate_fast(*args, c, "optimal", next_use) for c in caps]
    assert one_pass == [3470336, 3808768, 4405248, 5413888, 7029760, 9627136, 13512704]
    den = int(tr.prompt_tokens[first:].sum())
    # the printed table: 5.1 % at 1 GiB .. 19.9 % at 64 GiB
    assert [round(100 * h / den, 1) for h in one_pass] == [5.1, 5.6, 6.5, 8.0, 10.4, 14.2, 19.9]


def test_mooncake_through_ingest_gives_the_same_ceiling(shared_traces):
    ingest = pytest.importorskip("analyzer.ingest")
    loaded = ingest.open_trace(shared_traces / "mooncake" / "conversation_trace.jsonl")
    rep = analyze_reuse(loaded.trace, ReuseOptions(policies=("lru",)))
    assert round(rep.ceiling_hit_rate, 4) == 0.3978
    assert round(rep.cold_ceiling_hit_rate, 4) == 0.3734


RAGPULSE_ORDER = ("sys_prompt", "passages_ids", "history", "web_search", "user_input")
RAGPULSE_FILES = {
    "1_sys_prompt.jsonl": "sys_prompt_id",
    "2_passages.jsonl": "passage_id",
    "3_history.jsonl": "history_id",
    "4_user_input.jsonl": "user_input_id",
    "5_web_search.jsonl": "web_search_id",
}


@pytest.mark.slow
def test_golden_ragpulse_content_versus_prefix(shared_traces):
    root = shared_traces / "ragpulse"
    length: dict[int, int] = {}
    for name, key in RAGPULSE_FILES.items():
        for rec in read_jsonl(root / name):
            length[rec[key]] = rec["token_length"]
    rows = read_jsonl(root / "0_trace.jsonl")
    rows.sort(key=lambda r: int(r["timestamp"]))
    seqs = [[i for c in RAGPULSE_ORDER for i in r["hash_ids"][c]] for r in rows]
    # independent loops over chunks (README: 72.0 % content seen before, 31.5 % prefix)
    seen: set[int] = set()
    prefixes: set[tuple[int, ...]] = set()
    total = content = prefix = 0
    for seq in seqs:
        sizes = [length[i] for i in seq]
        total += sum(sizes)
        content += sum(s for i, s in zip(seq, sizes, strict=True) if i in seen)
        k = 0
        while k < len(seq) and tuple(seq[: k + 1]) in prefixes:
            k += 1
        prefix += sum(sizes[:k])
        seen.update(seq)
        prefixes.update(tuple(seq[:j]) for j in range(1, len(seq) + 1))
    assert round(content / total, 3) == 0.720
    assert round(prefix / total, 3) == 0.315

    # the same trace as 16-token blocks, each chunk padded to whole blocks
    bs = 16
    chained_id: dict[tuple[int, int, int], int] = {}
    content_id: dict[tuple[int, int], int] = {}
    chains, contents, extra = [], [], []
    for seq in seqs:
        parent, chain, cont = -1, [], []
        for i in seq:
            for j in range(-(-length[i] // bs)):
                c = content_id.setdefault((i, j), len(content_id))
                parent = chained_id.setdefault((parent, i, j), len(chained_id))
                chain.append(parent)
                cont.append(c)
        chains.append(chain)
        contents.append(cont)
        extra.append(1)
    tr = make_trace(chains, extra, block_size=bs, content=contents)
    rep = analyze_reuse(tr, ReuseOptions(warmup=0.0, policies=("lru",), granularities=()))
    npx = rep.non_prefix
    # padding chunks to whole blocks moves the shares by well under a point
    assert npx.cold_content_seen_rate == pytest.approx(content / total, abs=0.01)
    assert npx.cold_prefix_rate == pytest.approx(prefix / total, abs=0.01)
    assert npx.cold_hit_rate == pytest.approx((content - prefix) / total, abs=0.01)
    assert rep.cold_ceiling_hit_rate == pytest.approx(npx.cold_prefix_rate, abs=1e-12)


@pytest.mark.slow
def test_curve_survives_many_position_compactions():
    # 3 distinct blocks touched 600 times: the Fenwick positions are renumbered often
    chains = [[0, 1, 2], [0, 3], [0, 1], [4]] * 50
    chains[0:4] = [[0, 1, 2], [0, 3], [0, 1], [4]]
    tr = make_trace(chains, block_size=4)
    prompts = tr.prompt_tokens.tolist()
    hist = lru_histogram(
        tr.block_ids, tr.offsets, tr.prompt_tokens, np.empty(0, np.int64), 4, 0, tr.n_blocks, True
    )
    cum = np.concatenate([[0], np.cumsum(hist[:-1])])
    for cap in range(tr.n_blocks + 1):
        assert int(cum[cap]) == naive_lru(chains, prompts, 4, 0, cap)


def test_fast_simulations_match_the_reference_on_a_longer_trace():
    tr = chained_trace(80, seed=5, system_blocks=6, mean_new_blocks=3)
    first = first_counted_request(tr.n_requests, 0.5)
    args = (tr.block_ids, tr.offsets, tr.prompt_tokens, tr.block_size, first)
    for cap in (1, 2, 3, 7, 20, 100, 400):
        for policy in POLICIES:
            assert simulate_fast(*args, cap, policy) == simulate(*args, cap, policy), (cap, policy)


@pytest.mark.slow
def test_progress_adds_up_to_100_and_large_traces_skip_simulations():
    tr = chained_trace(30, seed=1)
    for opts in (
        ReuseOptions(),
        ReuseOptions(policies=("lru",)),
        ReuseOptions(policy_max_accesses=10),
        ReuseOptions(shards_rate=0.2),
    ):
        done: list[float] = []
        analyze_reuse(tr, opts, advance=done.append)
        assert sum(done) == pytest.approx(100)
    skipped = analyze_reuse(tr, ReuseOptions(policy_max_accesses=10))
    assert skipped.policy_points == {} and "not simulated" in skipped.policy_notes[0]
