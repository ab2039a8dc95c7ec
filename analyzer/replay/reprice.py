"""Re-pricing a recorded replay for other link bandwidths or latencies, without a replay.

A change of a tier's bandwidth or latency (the pool's, the host DRAM's, the NVMe's)
changes how long each load and write takes, and nothing else directly: the arrivals
stay where the trace puts them. :func:`retime` takes a run's
:class:`~analyzer.replay.engine.Recording` (which instance each request went to, what it
hit and loaded, what each completion wrote) and runs only the timing again, in the
engine's own event loop: the loads over the new links (processor sharing, as in the
replay), the instances' FIFO chunked prefill, the writes. It skips every cache lookup
and insertion, which is most of a replay's work.

**When it is exact.** The cache hits are held at the recorded ones. They depend on the
timing only through the order of the cache operations (lookups at arrivals, inserts
at completions; the eviction policies order blocks by their last use with ties in
operation order, never by the times' values) and through the router, which reads the
instances' queued tokens. So the re-timed run equals a full replay at the new settings
when, at every step, (1) the completions run in the recorded order, each after the
same number of arrivals, and (2) the router, given the re-timed queues and the recorded
HBM prefixes, picks the recorded instance. By induction over the operations, the caches
then hold exactly what they held in the recorded run at every lookup, so every hit,
load and write is the recorded one. :func:`retime` checks both at every step and says
so (``Retimed.exact``); it never claims exactness it did not check.

When a check fails the re-timed figures are an approximation (the hits of the recorded
run with the new timing): ``Retimed`` counts the completions that ran out of order and
the routes the router would have changed, and ``bench/reprice.py`` measures the error
against full replays. A run the rate search stopped early (its SLO lost) recorded only
the requests it reached: re-timed, it decides its rate only when it loses the SLO again
before reaching the end of the recording (``Retimed.decided``).

:func:`reprice_scenario` re-prices a scenario's replay and its SLO rate search (every
step of the search that a recorded run decides); :class:`Unrepriceable` says why not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from analyzer.replay.engine import (
    Plan,
    Recording,
    Req,
    RunStats,
    Simulation,
    TraceTree,
    collector_paused,
)
from analyzer.replay.miniature import sample
from analyzer.replay.rate_grid import (
    J_BOTTOM,
    J_TOP,
    _allowed,
    _passes,
    first_guess,
    grid_rate,
    search_grid,
)
from analyzer.replay.results import RateSearch, ScenarioResult, _point
from analyzer.trace import BlockTrace

_NONEMPTY = [0]  # stands for a request's blocks in a re-timed run (only their presence is read)

# Plan fields a re-timing may change: per tier, the links' speeds and latency.
_TIER_TIMING = ("read_bytes_per_s", "write_bytes_per_s", "latency_s", "aggregate_bytes_per_s")


class Unrepriceable(LookupError):
    """The recorded replay cannot answer for these settings (the reason in the message)."""


def timing_only(old: Plan, new: Plan) -> bool:
    """Whether ``new`` differs from ``old`` only in link bandwidths and latencies (the
    compute model, which both read from one cost model, is compared by the caller)."""
    for f in fields(Plan):
        if f.name == "prefill_s":
            continue
        a, b = getattr(old, f.name), getattr(new, f.name)
        if f.name in ("dram", "nvme", "pool"):
            if (a is None) != (b is None):
                return False
            if a is not None and replace(a, **{k: 0.0 for k in _TIER_TIMING}) != replace(
                b, **{k: 0.0 for k in _TIER_TIMING}
            ):
                return False
        elif a != b:
            return False
    return not old.free_loads


@dataclass(slots=True)
class Retimed:
    """A recorded run re-timed: its figures, and how far they are the replay's own.

    ``exact``: checked equal to a full replay at the new settings (see the module
    docstring); ``reordered``: requests that completed in another slot than recorded
    (after another number of arrivals, or in another order among the completions
    between the same two arrivals);
    ``rerouted``: requests the router would have sent elsewhere; ``decided``: False
    when the recording ended before the re-timed run could decide its rate (a stopped
    rate-search run that no longer loses its SLO where it stopped)."""

    stats: RunStats
    exact: bool
    reordered: int
    rerouted: int
    decided: bool = True


class _Retimer(Simulation):
    """The engine's loop with the recorded decisions in place of the caches."""

    def __init__(
        self,
        trace: BlockTrace,
        plan: Plan,
        rec: Recording,
        time_scale: float,
        slo_abort: tuple[float, int] | None,
        tree: TraceTree | None,
    ) -> None:
        super().__init__(trace, plan, time_scale, slo_abort, tree=tree)
        self.r = rec
        self.reordered = 0
        self.rerouted = 0
        self.beyond = False  # reached an arrival the recording does not have
        self.completions = 0
        # Each recorded completion's slot: (arrivals before it, its rank among the
        # completions between the same two arrivals).
        self.slot: dict[int, tuple[int, int]] = {}
        self.nth: dict[int, int] = {}  # request -> its completion's index (its writes)
        rank = 0
        last = -1
        for c, (k, a) in enumerate(zip(rec.order_k, rec.order_a, strict=True)):
            rank = rank + 1 if a == last else 0
            last = a
            self.slot[k] = (a, rank)
            self.nth[k] = c
        self.rank = 0
        self.last = -1

    def _on_arrival(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        t = ev[0]
        k = ev[3]
        rec = self.r
        out: list[tuple[Any, ...]] = []
        if k >= len(rec.picks):
            self.beyond = self.aborted = True
            return out
        if k + 1 < self.n:
            out.append((self.times[k + 1], 3, self._next_seq(), k + 1, None))
        self._arrived = k + 1
        n_blocks = self.offsets[k + 1] - self.offsets[k]
        i = rec.picks[k]
        c0 = rec.cached_at[k]
        asked = rec.cached
        loads = self.loads
        got = self.router.pick(
            k,
            self.sessions[k],
            range(n_blocks),
            loads,
            (lambda j, _b: asked[c0 + j]) if rec.cached_at[k + 1] > c0 else _no_cache,
        )
        if got != i:
            self.rerouted += 1
        inst = self.instances[i]
        prompt = self.prompts[k]
        hit = rec.hits[k]
        new = prompt - hit if prompt > hit else 1
        measured = k >= self.warm
        r = Req(k, t, inst, _NONEMPTY if n_blocks else [], hit, new, measured=measured)
        loads[i] += new
        if measured:
            self.prompt_measured += prompt
        j0, j1 = rec.load_at[k], rec.load_at[k + 1]
        if j1 > j0:
            r.pending = j1 - j0
            lower = inst.lower
            for j in range(j0, j1):
                tier = lower[rec.load_level[j]]
                n_bytes = rec.load_bytes[j]
                if tier.latency_s > 0:
                    out.append((t + tier.latency_s, 1, self._next_seq(), tier.read, (n_bytes, r)))
                else:
                    end = tier.read.add(t, n_bytes, r)
                    out.append((end, 0, self._next_seq(), tier.read, tier.read.version))
            return out
        self._ready(r, t, out)
        return out

    def _complete(self, r: Req, t: float, out: list[tuple[Any, ...]]) -> None:
        self.done_count += 1
        if self.advance is not None and self.done_count % 1024 == 0:
            self.advance(1024)
        if r.measured:
            ttft = t - r.arrival
            self.ttft[r.k - self.warm] = ttft
            if self.slo_abort is not None and ttft > self.slo_abort[0]:
                self.violations += 1
                if self.violations > self.slo_abort[1]:
                    self.aborted = True
        rec = self.r
        self.completions += 1
        a = self._arrived
        self.rank = self.rank + 1 if a == self.last else 0
        self.last = a
        was = self.slot.get(r.k)
        if was is None:
            # Not recorded: a stopped run ended before this request completed, so it
            # completed after every arrival the recording has, if at all.
            if rec.complete or a < len(rec.picks):
                self.reordered += 1
        elif was != (a, self.rank):
            self.reordered += 1
        if not r.blocks:
            return
        if self.track_dup:
            self._dup_tick(t)
            self.dup_blocks = rec.dup_blocks.get(r.k, self.dup_blocks)
        c = self.nth.get(r.k)
        if c is None:
            return  # past a stopped run's recording: its writes are unknown (no read waits)
        lower = r.inst.lower
        for j in range(rec.write_at[c], rec.write_at[c + 1]):
            self._write(lower[rec.write_level[j]].write, rec.write_bytes[j], t, out)


def _no_cache(_i: int, _blocks: Sequence[int]) -> int:
    raise AssertionError("the recorded router asked no cached prefix")


def retime(
    trace: BlockTrace,
    plan: Plan,
    rec: Recording | None,
    time_scale: float,
    slo_abort: tuple[float, int] | None = None,
    recorded: RunStats | None = None,
    tree: TraceTree | None = None,
) -> Retimed:
    """A recorded run (``rec``, on ``trace`` at ``time_scale``) re-timed for ``plan``,
    which may differ from the recorded run's plan only in link bandwidths and latencies
    (:func:`timing_only`). ``recorded``: that run's stats, whose hit and byte totals a
    run that goes to the end keeps (a rate-search run is read for its TTFTs alone).
    ``tree``: the trace's :class:`~analyzer.replay.engine.TraceTree`, when the caller
    re-times it more than once. Like a replay, it runs with the cyclic collector paused
    (in the dashboard's process, holding the remembered replays, a collection walks
    them all)."""
    if rec is None:
        raise Unrepriceable("the replay kept no recording")
    with collector_paused():
        sim = _Retimer(trace, plan, rec, time_scale, slo_abort, tree)
        stats = sim.run()
    if recorded is not None:
        stats.hit_tokens_by_tier = list(recorded.hit_tokens_by_tier)
        stats.cross_tenant_hit_tokens = recorded.cross_tenant_hit_tokens
        stats.loaded_bytes_by_tier = list(recorded.loaded_bytes_by_tier)
        stats.hbm_blocks_end = recorded.hbm_blocks_end
        stats.dup_blocks_end = recorded.dup_blocks_end
    decided = not sim.beyond
    if sim.beyond:  # stopped where the recording stops: the rest is unknown
        stats.aborted = True
    exact = decided and sim.reordered == 0 and sim.rerouted == 0
    if not sim.beyond and not stats.aborted and sim.completions != len(rec.order_k):
        exact = False
    return Retimed(stats, exact, sim.reordered, sim.rerouted, decided)


@dataclass(frozen=True, slots=True)
class RepricedScenario:
    """A scenario's replay re-priced: the result (a ``ScenarioResult`` as a replay
    gives it) and how it was obtained. ``exact``: every run it read (the run at the
    trace's rate and the rate search's) was re-timed exactly (equal to a replay);
    otherwise ``reordered`` and ``rerouted`` sum the
    departures of the runs it read (see :class:`Retimed`)."""

    result: Any  # analyzer.replay.run.ScenarioResult
    exact: bool
    main_exact: bool  # the run at the trace's rate (the TTFTs and hit rates reported)
    runs: int
    reordered: int
    rerouted: int


def reprice_scenario(
    trace: BlockTrace,
    old: Any,
    resolved: Any,
    ttft_slo_s: float,
    search_rate: bool,
    points: Sequence[Any] = (),
) -> RepricedScenario:
    """``old`` (a ``ScenarioResult`` replayed with recordings, see ``run_replay(...,
    record=True)``) re-priced for ``resolved`` (the scenario resolved for the new
    settings), with its rate search for ``ttft_slo_s`` when ``search_rate``. The search
    is the replay's own (:func:`analyzer.replay.run.search_grid` from the same start),
    each step answered by the recorded run at that rate re-timed; raises
    :class:`Unrepriceable` when a step has no recorded run that decides it.
    ``points``: rate-search points of other searches of the same replay (other SLOs),
    whose recordings answer too."""

    if old.resolved.plan.serving != "disaggregated":
        # An aggregated run's decisions (admission, preemption, what the cache holds)
        # depend on every step's timing: it is replayed afresh instead.
        raise Unrepriceable("an aggregated replay is not re-timed")
    if not timing_only(old.resolved.plan, resolved.plan):
        raise Unrepriceable("settings other than link bandwidths and latencies changed")
    rate = 1.0 / old.scale
    if rate < 1.0:
        trace = sample(trace, rate)[0]
    plan = resolved.plan
    time_scale = resolved.cluster.time_scale * rate
    tree = TraceTree(trace)
    main = retime(trace, plan, old.stats.recording, time_scale, recorded=old.stats, tree=tree)
    runs = [main]
    search = None
    if search_rate:
        n_measured = trace.n_requests - int(plan.warmup_fraction * trace.n_requests)
        if n_measured > 0:
            allowed = _allowed(n_measured)
            recorded: dict[float, Recording] = {}
            for p in (*points, *(old.search.points if old.search is not None else ())):
                rec = p.recording
                if rec is not None and (
                    p.rate not in recorded or len(rec.picks) > len(recorded[p.rate].picks)
                ):
                    recorded[p.rate] = rec  # the longest: a stopped run saw fewer requests
            found: list[Any] = []

            def ok(j: int) -> bool:
                r = grid_rate(j)
                got = recorded.get(r)
                if got is None:
                    raise Unrepriceable(f"the search needs the rate x{r:.3g}, not replayed before")
                again = retime(trace, plan, got, time_scale / r, (ttft_slo_s, allowed), tree=tree)
                if not again.decided:
                    raise Unrepriceable(
                        f"the recorded run at x{r:.3g} stopped before it could decide"
                    )
                runs.append(again)
                found.append(_point(r, again.stats, ttft_slo_s))
                return bool(found[-1].passed)

            lo, hi = search_grid(ok, _passes(main.stats, ttft_slo_s), first_guess(main.stats, plan))
            pts = tuple(sorted(found, key=lambda p: p.rate))
            if lo is None:
                search = RateSearch(0.0, grid_rate(J_BOTTOM), len(found), False, pts)
            elif hi is None:
                search = RateSearch(grid_rate(J_TOP), None, len(found), True, pts)
            else:
                search = RateSearch(grid_rate(lo), grid_rate(hi), len(found), False, pts)
        else:
            search = RateSearch(None, None, 0, False)
    result = ScenarioResult(
        old.spec, resolved, main.stats, search, old.scale, decode_pool=old.decode_pool
    )
    return RepricedScenario(
        result,
        all(r.exact for r in runs),
        main.exact,
        len(runs),
        sum(r.reordered for r in runs),
        sum(r.rerouted for r in runs),
    )


def ttft_error(a: np.ndarray, b: np.ndarray) -> float:
    """Largest relative difference of two runs' TTFT percentiles (p50, p90, p99)."""
    if not a.size or not b.size:
        return 0.0 if a.size == b.size else math.inf
    qa = np.percentile(a, [50, 90, 99])
    qb = np.percentile(b, [50, 90, 99])
    return float(np.max(np.abs(qa - qb) / np.maximum(np.abs(qb), 1e-12)))
