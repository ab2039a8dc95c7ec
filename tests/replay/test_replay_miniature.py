"""The miniature replay (SHARDS-style spatial sampling, analyzer/replay/miniature.py):
what it keeps, how it scales the cluster, and an exact oracle where one exists."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.replay import ClusterConfig, run_replay
from analyzer.replay import miniature as mini
from analyzer.replay import run as replay_run
from analyzer.replay.config import select_scenarios
from analyzer.replay.run import resolve
from tests.helpers.replay import AnalyticCost, build_trace

# The analytic cost prices a prefill pool (it names no GPU to size an engine's KV pool).
PREFILL_POOL = "disaggregated"

COST = AnalyticCost()


def _sessions_trace(n_sessions: int = 200, turns: int = 4, seed: int = 3):
    """Independent chat sessions: each turn repeats the session's history and adds
    blocks of its own; sessions share no block."""
    rng = np.random.default_rng(seed)
    blocks, sessions, arrivals = [], [], []
    fresh = 0
    history: dict[int, list[int]] = {}
    order = rng.permutation(np.repeat(np.arange(n_sessions), turns))
    for k, s in enumerate(order):
        add = list(range(fresh, fresh + int(rng.integers(1, 6))))
        fresh += len(add)
        history[s] = history.get(s, []) + add
        blocks.append(list(history[s]))
        sessions.append(f"s{s}")
        arrivals.append(float(k))
    return build_trace(blocks, arrivals=arrivals, sessions=sessions)


def test_sampling_rate_above_the_documented_size_only():
    assert mini.sampling_rate(mini.MIN_ACCESSES) is None
    n = mini.MIN_ACCESSES + 1
    r = mini.sampling_rate(n)
    assert r is not None and n * r <= mini.TARGET_ACCESSES
    assert n * r * 2 > mini.TARGET_ACCESSES  # the largest such power of 2
    assert mini.sampling_rate(10**12) == mini.MIN_RATE
    assert 1 / r == 2 ** round(np.log2(1 / r))


def test_a_session_is_kept_or_dropped_whole_and_its_blocks_keep_their_hashes():
    trace = _sessions_trace()
    small, info = mini.sample(trace, 0.25)
    names = trace.session_names
    kept = {names[c] for c in small.session}
    for k in range(trace.n_requests):
        assert (names[trace.session[k]] in kept) == (
            k in {int(i) for i in np.nonzero(np.isin(trace.session, small.session))[0]}
        )
    # about a quarter of the sessions (a hash, so not exactly)
    assert 0.15 < len(kept) / len(names) < 0.35
    assert info.sampled_requests == small.n_requests < trace.n_requests
    # the same chained hashes, request by request, renumbered densely by first use
    full_rows = [k for k in range(trace.n_requests) if names[trace.session[k]] in kept]
    for j, k in enumerate(full_rows):
        a = trace.block_hashes[trace.blocks_of(k)]
        b = small.block_hashes[small.blocks_of(j)]
        assert a.tolist() == b.tolist()
    ids = small.block_ids
    first_use = np.maximum.accumulate(ids)
    assert ids[0] == 0 and np.all(np.diff(first_use) <= 1)
    assert small.n_blocks == len(set(ids.tolist()))


def test_the_sample_is_stable_and_does_not_depend_on_the_rest_of_the_trace():
    trace = _sessions_trace()
    a, _ = mini.sample(trace, 0.25)
    b, _ = mini.sample(trace, 0.25)
    assert a.session.tolist() == b.session.tolist()
    # a lower rate keeps a subset (the threshold on the same hashes only moves down)
    c, _ = mini.sample(trace, 0.125)
    assert set(c.session.tolist()) <= set(a.session.tolist())


def _oracle_hit_rate(trace) -> float:
    """One instance, unbounded cache, cold start: a request hits the longest prefix any
    earlier request held (a hit never covers the last prompt token)."""
    seen: set[int] = set()
    hit = total = 0
    for k in range(trace.n_requests):
        blocks = trace.blocks_of(k).tolist()
        m = 0
        while m < len(blocks) and blocks[m] in seen:
            m += 1
        prompt = int(trace.prompt_tokens[k])
        hit += min(m * trace.block_size, prompt - 1)
        total += prompt
        seen.update(blocks)
    return hit / total


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.integers(1, 4))
def test_miniature_of_independent_sessions_equals_the_full_replay_of_them(seed, shift):
    """With unbounded caches a session's hits depend only on its own history, so the
    miniature's hit rate is exactly the full replay's over the sampled sessions."""
    trace = _sessions_trace(n_sessions=60, seed=seed)
    cfg = ClusterConfig(
        model="m",
        gpu="g",
        serving=PREFILL_POOL,
        instances=1,
        local_capacity_tokens=10**9,
        warmup_fraction=0.0,
        free_loads=True,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_run, "sampling_rate", lambda n: 1 / 2**shift)
        res = run_replay(trace, cfg, scenarios=["local"], search_rate=False, cost=COST)
    assert res.miniature is not None and res.miniature.sampling_rate == 1 / 2**shift
    small, _ = mini.sample(trace, 1 / 2**shift)
    doc = res.to_json()["scenarios"]["local"]
    if small.n_requests:
        assert doc["hit_rate"] == pytest.approx(_oracle_hit_rate(small), abs=1e-12)


def test_a_miniature_scales_caches_and_time_and_scales_totals_back(monkeypatch):
    trace = _sessions_trace()
    cfg = ClusterConfig(
        model="m", gpu="g", serving=PREFILL_POOL, instances=2, local_capacity_tokens=4_000
    )
    (spec,) = select_scenarios(["pooled"])
    full = resolve(cfg, spec, trace.block_size, cost=COST)
    small = resolve(cfg, spec, trace.block_size, cost=COST, sampling_rate=0.25)
    assert small.plan.local_capacity_blocks == full.plan.local_capacity_blocks // 4
    assert small.local_capacity_tokens == full.local_capacity_tokens  # reported as asked
    monkeypatch.setattr(replay_run, "sampling_rate", lambda n: 0.25)
    res = run_replay(trace, cfg, scenarios=["none"], search_rate=False, cost=COST)
    doc = res.to_json()
    s = res.scenarios["none"]
    assert s.scale == 4.0
    # totals over requests are the sample's times 1 / rate; rates and percentiles its own
    assert doc["scenarios"]["none"]["prompt_tokens"] == round(s.stats.prompt_tokens * 4)
    assert doc["scenarios"]["none"]["makespan_s"] == pytest.approx(s.stats.duration_s * 4)
    # the typed figures the advisor reads are the JSON's
    assert s.makespan_s == pytest.approx(doc["scenarios"]["none"]["makespan_s"])
    assert s.network_bytes == pytest.approx(doc["scenarios"]["none"]["network_bytes"])
    assert doc["scenarios"]["none"]["ttft_s"]["p90"] == pytest.approx(
        float(np.percentile(s.stats.ttft_s, 90))
    )
    m = doc["miniature"]
    assert m["sampling_rate"] == 0.25 and m["requests"] == trace.n_requests
    assert doc["cluster"]["requests"] == trace.n_requests
    # the sample arrives four times faster: the same load on the same cluster
    assert s.stats.duration_s == pytest.approx(
        float(np.ptp(mini.sample(trace, 0.25)[0].arrival_s)) * 0.25, rel=0.2
    )
    # --full-replay: every request, and the same bytes as a replay below the size
    monkeypatch.setattr(replay_run, "sampling_rate", lambda n: None)
    plain = run_replay(trace, cfg, scenarios=["none"], search_rate=False, cost=COST).to_json()
    monkeypatch.setattr(replay_run, "sampling_rate", lambda n: 0.25)
    forced = run_replay(
        trace, cfg, scenarios=["none"], search_rate=False, cost=COST, full_replay=True
    ).to_json()
    assert "miniature" not in forced
    assert json.dumps(forced, sort_keys=True) == json.dumps(plain, sort_keys=True)


def test_the_measured_error_printed_is_the_one_the_bench_recorded():
    err = mini.measured_error()
    assert err, "models/replay-miniature.toml holds the measured error"
    line = mini.describe(
        {"sampled_requests": 10, "requests": 160, "sampling_rate": 1 / 16, "measured_error": err}
    )
    assert "10 of 160 requests" in line and "1/16" in line
    assert f"{err['hit_rate_abs_error'] * 100:.1f} points" in line
    assert f"{err['ttft_p90_rel_error']:.0%}" in line
    assert "--full-replay" in line


def test_a_remembered_miniature_searches_a_new_slo_on_the_same_sample(monkeypatch):
    from analyzer.replay import memo as replay_memo
    from analyzer.replay.memo import ReplayMemo

    # both the replay and the memo (which imported the name) sample at 1/2
    monkeypatch.setattr(replay_run, "sampling_rate", lambda n: 0.5)
    monkeypatch.setattr(replay_memo, "sampling_rate", lambda n: 0.5)
    trace = _sessions_trace(n_sessions=80)
    cfg = ClusterConfig(
        model="m", gpu="g", serving=PREFILL_POOL, instances=2, local_capacity_tokens=4_000
    )
    memo = ReplayMemo()
    args = dict(scenarios=["local"], cost=COST, trace_key="t", cost_key="c")
    memo.run(trace, cfg, ttft_slo_s=0.5, **args)
    again = memo.run(trace, cfg, ttft_slo_s=0.3, **args).to_json()
    fresh = run_replay(trace, cfg, scenarios=["local"], ttft_slo_s=0.3, cost=COST).to_json()
    assert memo.searched_again == 1
    got, want = again["scenarios"]["local"], fresh["scenarios"]["local"]
    assert got["max_rate_scale_at_slo"] == want["max_rate_scale_at_slo"]
    assert (
        got["prompt_tokens"] == want["prompt_tokens"] and again["miniature"] == fresh["miniature"]
    )
