"""The size search (analyzer.advisor.size) and the replay question it asks
(analyzer.replay.probe): checked against the obvious answers, a scan over every count
and a full replay at each size."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analyzer.advisor.probing as probing
import analyzer.advisor.size as size_mod
from analyzer.advisor.probing import size_options
from analyzer.advisor.replay import ProbeStore
from analyzer.advisor.size import Search, SizeQuestion, search_size, size_option
from analyzer.replay import ClusterConfig, run_replay
from analyzer.replay.config import STANDARD_SCENARIOS, Scenario
from analyzer.replay.probe import Probe, allowed_misses, deciding_ttft_s, probe
from analyzer.replay.run import worker_pool
from tests.helpers.replay import AnalyticCost, build_trace, chained_requests

COST = AnalyticCost(bytes_per_token=1000, hbm_tokens=4000)


def fake(threshold: int | None, asked: list[int]):
    """A probe that passes from ``threshold`` instances on (never, for None)."""

    def ask(n: int) -> Probe:
        asked.append(n)
        ok = threshold is not None and n >= threshold
        return Probe("local", n, 1.0, 1.0, ok, ok, 100, 0 if ok else 50)

    return ask


@settings(max_examples=300, deadline=None)
@given(
    threshold=st.one_of(st.none(), st.integers(1, 600)),
    start=st.integers(1, 600),
    cap=st.integers(1, 512),
    beyond=st.one_of(st.none(), st.integers(1, 2048)),
)
def test_search_finds_the_smallest_passing_count(threshold, start, cap, beyond):
    asked: list[int] = []
    within, above, known = search_size(fake(threshold, asked), start=start, cap=cap, beyond=beyond)
    # the oracle: scan every count
    scan = next((n for n in range(1, cap + 1) if threshold is not None and n >= threshold), None)
    assert within == scan
    top = max(cap, beyond or cap)
    if within is None and threshold is not None and cap < threshold <= top:
        assert above == threshold
    else:
        assert above is None
    # never the same count twice, never above what it may look at, logarithmically many
    assert len(asked) == len(set(asked)) == len(known)
    assert all(1 <= n <= top for n in asked)
    assert len(asked) <= 2 * max(1, top).bit_length() + 2
    # the answer is bracketed: it passed, and the count below it failed (or is 0)
    answer = within if within is not None else above
    if answer is not None:
        assert known[answer].passed
        assert answer == 1 or not known[answer - 1].passed


@settings(max_examples=300, deadline=None)
@given(
    threshold=st.integers(1, 300),
    start=st.integers(1, 300),
    cap=st.integers(1, 256),
    near=st.booleans(),
    gallop=st.booleans(),
    below=st.integers(0, 300),
    above=st.one_of(st.none(), st.integers(0, 300)),
)
def test_a_hinted_search_finds_what_the_scan_finds(
    threshold, start, cap, near, gallop, below, above
):
    """Whatever the hint (a start, its neighbour first, a step up, counts known to fail
    below the answer and one known to pass above it), the answer is the scan's, no count
    known to fail is replayed, and the search stays logarithmic."""
    fails_to = min(below, threshold - 1)
    passes_at = None if above is None else threshold + above
    asked: list[int] = []
    within, over, _ = search_size(
        fake(threshold, asked),
        start=start,
        cap=cap,
        beyond=4 * cap,
        near=near,
        gallop=gallop,
        fails_to=fails_to,
        passes_at=passes_at,
    )
    assert within == (threshold if threshold <= cap else None)
    assert over == (threshold if cap < threshold <= 4 * cap else None)
    assert len(asked) == len(set(asked)) and all(n > fails_to for n in asked)
    assert len(asked) <= 4 * (4 * cap).bit_length() + 4


@pytest.mark.parametrize("threshold", [1, 2, 5, 17])
def test_a_right_guess_costs_two_replays(threshold):
    """Started at the answer with ``near``, or one below it with ``gallop``, the search
    replays the answer and the count below it, nothing else."""
    asked: list[int] = []
    search_size(fake(threshold, asked), start=threshold, cap=64, near=True)
    assert sorted(asked) == sorted({threshold, max(1, threshold - 1)})
    asked.clear()
    search_size(fake(threshold, asked), start=max(1, threshold - 1), cap=64, gallop=True)
    assert sorted(asked) == sorted({threshold, max(1, threshold - 1)})
    asked.clear()  # a harder question whose easier one needed ``threshold``: one replay
    search_size(fake(threshold, asked), start=threshold, cap=64, fails_to=threshold - 1)
    assert asked == [threshold]


def test_a_failing_count_near_the_cap_goes_to_the_cap():
    """A failure at 13 with the cap at 32: the doubled 26 would leave the cap the next
    step anyway, so the cap is asked next; when it fails too, two replays say so."""
    asked: list[int] = []
    within, above, _ = search_size(fake(None, asked), start=13, cap=32)
    assert within is None and above is None
    assert asked == [13, 32]
    asked.clear()  # far below the cap it doubles as before
    within, _, _ = search_size(fake(20, asked), start=3, cap=64)
    assert within == 20 and asked[:3] == [3, 6, 12]


def test_probes_at_another_slo_bound_the_search(monkeypatch):
    """A question at 1 s after one at 2 s: a kept run that decides 1 s (a pass at 2 s
    whose deciding TTFT is above 1 s, a failure at 2 s) is not replayed, and nothing
    below a known failure is asked."""
    replayed: list[int] = []

    def fake_probe(trace, cfg, spec, *, instances, ttft_slo_s, **kw):
        replayed.append(instances)
        ok = instances >= 9
        return Probe(spec.name, instances, 1.0, ttft_slo_s, ok, ok, 100, 0 if ok else 50)

    monkeypatch.setattr(size_mod, "probe", fake_probe)
    kept = (
        Probe("local", 8, 1.0, 2.0, True, True, 100, 0, rank_s=1.5),  # fails 1 s
        Probe("local", 4, 1.0, 2.0, False, False, 100, 50),  # fails 1 s (and 2 s)
    )
    local = STANDARD_SCENARIOS[Scenario.LOCAL]
    q = SizeQuestion(local, _cfg(instances=10), COST, 1.0, 1.0, cap=64, known=kept)
    s = size_option(_trace(20, gap=0.01), q)
    assert s.instances == 9
    assert replayed[:2] == [10, 9] and set(replayed) == {9, 10}
    # without what the kept runs say, the search looks below them
    replayed.clear()
    size_option(_trace(20, gap=0.01), dataclasses.replace(q, known=()))
    assert min(replayed) < 8


def test_search_steps_down_to_the_busy_bound(monkeypatch):
    """A passing run whose GPUs were busy 30% of the time: the next count tried is the
    one that would be busy all the time (fewer cannot serve the work)."""
    trace = _trace(400, gap=0.05)
    cfg = _cfg(instances=16)
    q = SizeQuestion(STANDARD_SCENARIOS[Scenario.LOCAL], cfg, COST, 1.0, 2.0, cap=64)
    s = size_option(trace, q)
    counts = [p.instances for p in s.probes]
    assert counts[-1] == 16 and s.instances is not None
    assert len(counts) <= 6  # 16, then the busy bound, then a few bisections
    assert s.at_size is not None and s.at_size.passed and s.at_size.result is not None
    # a short log's search keeps every complete run; a long one's only the chosen size's
    assert sum(p.complete for p in s.probes) >= 2
    assert all((p.result is not None) == p.complete for p in s.probes)
    monkeypatch.setattr(size_mod, "KEEP_FIGURES_REQUESTS", 0)
    s = size_option(trace, q)
    assert all((p.result is not None) == (p.instances == s.instances) for p in s.probes)


def _cfg(**kw) -> ClusterConfig:
    # the analytic cost prices a prefill pool (it names no GPU to size an engine's KV pool)
    base = dict(
        model="test-model",
        gpu="test-gpu",
        instances=4,
        gpus_per_node=1,
        serving="disaggregated",
    )
    base.update(kw)
    return ClusterConfig(**base)


def _trace(n: int, gap: float, seed: int = 3):
    rng = np.random.default_rng(seed)
    spec = [
        (int(rng.integers(0, 50)), int(rng.integers(0, 12)), int(rng.integers(1, 8)))
        for _ in range(n)
    ]
    blocks = chained_requests(spec)
    return build_trace(blocks, block_size=64, arrivals=[gap * i for i in range(n)])


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 6),
    scale=st.sampled_from([0.05, 0.2, 1.0]),
    slo=st.sampled_from([0.05, 0.2, 1.0]),
    option=st.sampled_from([Scenario.LOCAL, Scenario.LOCAL_DRAM, Scenario.POOLED]),
)
def test_probe_is_the_replay_at_that_size(n, scale, slo, option):
    """A probe's verdict is the p90 test of a full replay at that size and load, and a
    passing probe's figures are that replay's."""
    trace = _trace(120, gap=0.02)
    cfg = _cfg(instances=n, time_scale=scale)
    full = run_replay(trace, cfg, scenarios=(option,), search_rate=False, cost=COST)
    s = full.scenarios[option]
    ttft = s.stats.ttft_s
    expect = int(np.count_nonzero(ttft > slo)) <= allowed_misses(ttft.size)
    p = probe(
        trace,
        dataclasses.replace(cfg, time_scale=1.0),
        STANDARD_SCENARIOS[option],
        instances=n,
        time_scale=scale,
        ttft_slo_s=slo,
        cost=COST,
    )
    assert p.passed == expect
    assert p.passes(slo) == expect
    if p.passed:
        assert p.complete and p.result is not None
        assert p.ttft == s.ttft
        assert p.result.to_json() == s.to_json()
        assert p.rank_s == deciding_ttft_s(ttft)
    else:
        assert p.passes(slo / 2) is False  # a lower SLO fails too


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 4),
    scale=st.sampled_from([0.05, 0.2, 1.0]),
    slo=st.sampled_from([0.05, 0.2, 1.0]),
    looser=st.sampled_from([1.0, 2.0, 4.0]),
)
def test_a_probe_told_a_looser_slo_runs_on_until_it_loses_that(n, scale, slo, looser):
    """With ``stop_slo_s`` a run that fails its SLO goes on: to the end when it meets
    the looser one (its percentiles then answer any SLO), else until it has lost that."""
    trace = _trace(120, gap=0.02)
    cfg = _cfg(instances=n, time_scale=scale)
    full = run_replay(
        trace, cfg, scenarios=(Scenario.LOCAL,), search_rate=False, cost=COST
    ).scenarios[Scenario.LOCAL]
    ttft = full.stats.ttft_s
    p = probe(
        trace,
        dataclasses.replace(cfg, time_scale=1.0),
        STANDARD_SCENARIOS[Scenario.LOCAL],
        instances=n,
        time_scale=scale,
        ttft_slo_s=slo,
        cost=COST,
        stop_slo_s=slo * looser,
    )
    assert p.passed == (int(np.count_nonzero(ttft > slo)) <= allowed_misses(ttft.size))
    if int(np.count_nonzero(ttft > slo * looser)) <= allowed_misses(ttft.size):
        assert p.complete and p.result is not None and p.ttft == full.ttft
        assert p.rank_s == deciding_ttft_s(ttft)
        assert p.passes(slo * looser) is True
    else:
        assert not p.complete and not p.passed and p.ttft_slo_s == slo * looser
        assert p.passes(slo * looser) is False and p.passes(slo * looser * 2) is None


def test_a_looser_question_takes_the_runs_that_ran_on_for_it(monkeypatch):
    """A search told the looser SLO a later question asks: that question replays none of
    the counts the first one tried, and when it chooses one of them it takes that run's
    figures (a short log keeps every complete run's)."""
    trace = _trace(400, gap=0.05)
    local = STANDARD_SCENARIOS[Scenario.LOCAL]
    replays: list[int] = []
    real = size_mod.probe

    def counted(*args, **kw):
        replays.append(kw["instances"])
        return real(*args, **kw)

    monkeypatch.setattr(size_mod, "probe", counted)
    first = SizeQuestion(local, _cfg(instances=8), COST, 1.0, 0.5, cap=64, stop_slo_s=1.0)
    a = size_option(trace, first)
    tried = {p.instances for p in a.probes}
    replays.clear()
    later = dataclasses.replace(first, ttft_slo_s=1.0, stop_slo_s=None, known=a.probes)
    b = size_option(trace, later)
    assert not tried & set(replays)
    replays.clear()
    alone = size_option(trace, dataclasses.replace(later, known=()))
    assert tried & set(replays)  # which it would replay, alone
    assert (b.instances, b.above_cap) == (alone.instances, alone.above_cap)
    assert b.at_size is not None and alone.at_size is not None and b.at_size.result is not None
    assert b.at_size.result.to_json() == alone.at_size.result.to_json()


def test_the_store_keeps_figures_within_its_budget():
    """Past its budget of requests' figures the store strips the oldest keys' runs of
    their figures (their answers stay); a run with figures replaces one without."""
    one = probe(
        _trace(120, gap=0.02),
        _cfg(instances=2),
        STANDARD_SCENARIOS[Scenario.LOCAL],
        instances=2,
        time_scale=1.0,
        ttft_slo_s=60.0,
        cost=COST,
    )
    assert one.complete and one.result is not None
    store = ProbeStore(max_figures_requests=int(2.5 * one.requests))
    for key in ("a", "b", "c"):
        assert store.put((key,), [one]) == 1
    (a,) = store.get(("a",))
    assert a.result is None and (a.rank_s, a.passed) == (one.rank_s, one.passed)
    assert all(p.result is not None for k in ("b", "c") for p in store.get((k,)))
    assert store.put(("a",), [one]) == 1  # its figures back, and "b" is now the oldest
    assert [store.get((k,))[0].result is not None for k in "abc"] == [True, False, True]
    assert store.put(("a",), [one]) == 0  # nothing new
    unbounded = ProbeStore()
    for key in ("a", "b", "c"):
        unbounded.put((key,), [one])
    assert all(unbounded.get((k,))[0].result is not None for k in "abc")


def _counting_replays(monkeypatch) -> list[tuple[str, int]]:
    """The replays run in this process from now on, as (option, count) in order."""
    seen: list[tuple[str, int]] = []
    run = probing._Replay.run

    def counted(r, *args):
        seen.append((r.question.spec.name, r.instances))
        return run(r, *args)

    monkeypatch.setattr(probing._Replay, "run", counted)
    return seen


def _local_and_pooled() -> tuple[Search, Search]:
    """The local and pooled searches of one 200-request trace, from 2 instances."""
    trace = _trace(200, gap=0.01)
    local, pooled = (
        Search(
            None,
            trace,
            SizeQuestion(STANDARD_SCENARIOS[o], _cfg(instances=2), COST, 0.5, 0.3, cap=32),
        )
        for o in (Scenario.LOCAL, Scenario.POOLED)
    )
    return local, pooled


@pytest.mark.slow
def test_parallel_search_gives_the_same_answers(monkeypatch):
    local, pooled = _local_and_pooled()
    # the pooled search after the local one starts from its answer, wherever each runs
    batch = [local, dataclasses.replace(pooled, after=0), pooled, local]
    one = size_options(batch, jobs=1)
    two = size_options(batch, jobs=2)
    here = _counting_replays(monkeypatch)  # this process's, not the worker's
    with worker_pool(1) as pool:
        shared = size_options(batch, pool=pool, workers=1, share=True)
    # one worker and this process, each replaying some of the batch's counts
    assert 0 < len(here) < sum(len(s.probes) for s in one)
    for got in (two, shared):
        assert [(s.instances, [p.instances for p in s.probes]) for s in one] == [
            (s.instances, [p.instances for p in s.probes]) for s in got
        ]
        for a, b in zip(one, got, strict=True):
            assert a.at_size is not None and b.at_size is not None
            assert a.at_size.ttft == b.at_size.ttft


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_idle_processes_replay_ahead_and_the_answers_stay(monkeypatch, workers):
    """Processes no search waits on replay the count a search asks next if its pending
    replay passes (or fails): more counts are replayed than the searches ask for, and
    each search still ends with the answers and the tried counts of one search after
    another in one process (those replayed ahead and not asked are dropped)."""
    local, pooled = _local_and_pooled()
    batch = [local, dataclasses.replace(pooled, after=0)]
    alone = size_options(batch, jobs=1)
    replayed = _counting_replays(monkeypatch)
    with ThreadPoolExecutor(workers) as pool:
        got = size_options(batch, pool=pool, workers=workers, share=True)
    assert [(s.instances, s.above_cap, [p.instances for p in s.probes]) for s in got] == [
        (s.instances, s.above_cap, [p.instances for p in s.probes]) for s in alone
    ]
    for a, b in zip(alone, got, strict=True):
        assert a.at_size is not None and b.at_size is not None
        assert a.at_size.result is not None and b.at_size.result is not None
        assert a.at_size.result.to_json() == b.at_size.result.to_json()
        # a short log's complete runs keep their figures, as alone
        assert [p.result is not None for p in b.probes] == [p.complete for p in a.probes]
    asked = {(s.option, p.instances) for s in alone for p in s.probes}
    assert asked <= set(replayed)  # each count asked was replayed, once
    assert len(replayed) == len(set(replayed))
    assert len(replayed) > len(asked)  # and some ahead of time


def test_a_shared_pool_of_unknown_size_gets_no_replay_ahead(monkeypatch):
    """A caller's pool shared with other work (workers None: the dashboard's) gets only
    the replays the searches ask for, however idle it is."""
    trace = _trace(200, gap=0.01)
    q = SizeQuestion(STANDARD_SCENARIOS[Scenario.LOCAL], _cfg(instances=2), COST, 0.5, 0.3, cap=32)
    batch = [Search(None, trace, q), Search(None, trace, dataclasses.replace(q, ttft_slo_s=0.6))]
    alone = size_options(batch, jobs=1)
    replayed = _counting_replays(monkeypatch)
    with ThreadPoolExecutor(4) as pool:
        got = size_options(batch, pool=pool)
    assert [[p.instances for p in s.probes] for s in got] == [
        [p.instances for p in s.probes] for s in alone
    ]
    assert len(replayed) == sum(len(s.probes) for s in alone)


def test_no_size_within_the_cap_reports_the_one_above():
    trace = _trace(200, gap=0.002)
    q = SizeQuestion(
        STANDARD_SCENARIOS[Scenario.LOCAL], _cfg(instances=1), COST, 1.0, 0.05, cap=2, beyond=64
    )
    s = size_option(trace, q)
    assert s.instances is None
    if s.above_cap is not None:
        assert s.above_cap > 2 and s.at_size is not None and s.at_size.passed
    assert all(not p.passed for p in s.probes if p.instances <= 2)


@pytest.mark.parametrize("cap", [0, -1])
def test_cap_must_be_positive(cap):
    with pytest.raises(ValueError):
        search_size(fake(1, []), start=1, cap=cap)


class _FailingPool:
    """An executor that runs its first search and refuses the next (a pool whose worker
    has died), from the thread where the first one's answer arrives."""

    def __init__(self) -> None:
        self.sent = 0

    def submit(self, fn, *args):
        self.sent += 1
        if self.sent > 1:
            raise RuntimeError("the pool is broken")
        f: Future = Future()
        threading.Thread(target=lambda: f.set_result(fn(*args))).start()
        return f


def test_a_pool_that_breaks_between_searches_raises_its_error():
    """Not a hang: the search after the first cannot be sent, from the thread the first
    one's answer arrived on, and the caller gets that error."""
    trace = _trace(60, gap=0.01)
    q = SizeQuestion(STANDARD_SCENARIOS[Scenario.LOCAL], _cfg(instances=2), COST, 0.5, 0.3, cap=8)
    first = Search(None, trace, q)
    got: list[BaseException] = []

    def run() -> None:
        try:
            size_options(
                [first, dataclasses.replace(first, after=0)], pool=_FailingPool(), workers=1
            )
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "size_options hung on a pool that broke"
    assert len(got) == 1 and "the pool is broken" in str(got[0])
