"""The size stage: the fewest instances of each option that meet the TTFT SLO at the
load the deployment must serve, found by replaying at that size.

Capacity is not linear in instances: private caches split the working set over more
copies, the router spreads a prefix's requests differently, and bursts queue behind
each other on fewer GPUs. So no count is extrapolated from a replay at another size:
each count the search considers is replayed with that many instances, their caches and
their router (:func:`analyzer.replay.probe.probe`), at the sizing load.

**The search** (:func:`search_size`) treats "``n`` instances meet the SLO" as monotone
in ``n`` (the premise of any bisection) and looks for the smallest ``n`` that does:

1. replay the start (the analysis cluster's ``--instances``);
2. *bracket*: while it fails, double the count until one passes or the cap is reached;
   while it passes, step down (to the count whose GPUs the passing run kept busy
   all the time when that is known, else to half) until one fails or one instance
   passes;
3. *bisect* the bracket down to neighbouring counts: ``n - 1`` failed, ``n`` passed.

Every count is replayed at most once (the probes are remembered), and a count that
fails stops its replay as soon as it has lost the SLO, so only passing counts cost a
whole replay. A count above the cap is searched only to say which size would meet
the SLO (``beyond``), never planned.

**The options are searched in parallel** (:func:`size_options`): each option's search
runs in its own process (``jobs``), since the replays of one option depend on each
other and those of different options do not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from analyzer.replay.config import ClusterConfig, ScenarioSpec
from analyzer.replay.engine import TraceTree
from analyzer.replay.probe import Probe, probe
from analyzer.trace import BlockTrace


@dataclass(frozen=True, slots=True)
class SizeQuestion:
    """What one option's search asks: the fewest instances of ``spec`` on ``cfg``
    (whose ``instances`` is where the search starts) that keep p90 TTFT within
    ``ttft_slo_s`` with the log's gaps multiplied by ``time_scale``, up to ``cap``
    instances; above the cap it looks on up to ``beyond`` for the size that would."""

    spec: ScenarioSpec
    cfg: ClusterConfig
    cost: Any
    time_scale: float
    ttft_slo_s: float
    cap: int
    beyond: int | None = None

    @property
    def start(self) -> int:
        return max(1, min(self.cfg.instances, self.cap))


@dataclass(frozen=True, slots=True)
class SizeSearch:
    """One option's answer: ``instances``, the fewest that met the SLO within the cap
    (None: none did); ``above_cap``, the fewest found above it when none did within;
    ``probes``, every count replayed, by count (only the chosen one keeps its run's
    figures)."""

    option: str
    cap: int
    instances: int | None
    above_cap: int | None
    probes: tuple[Probe, ...] = field(default=())

    @property
    def at_size(self) -> Probe | None:
        """The replay at the chosen size (it passed, so it ran to the end)."""
        n = self.instances if self.instances is not None else self.above_cap
        return next((p for p in self.probes if p.instances == n), None)

    @property
    def runs(self) -> int:
        return len(self.probes)


def search_size(
    ask: Callable[[int], Probe], *, start: int, cap: int, beyond: int | None = None
) -> tuple[int | None, int | None, dict[int, Probe]]:
    """The smallest count in ``1..cap`` whose probe passes (None when ``cap`` fails),
    found by bracketing from ``start`` and bisecting (module docstring); when the cap
    fails and ``beyond`` is above it, the smallest passing count up to ``beyond``
    (None when that fails too). Returns ``(within, above, probes by count)``; each count
    is asked at most once."""
    if cap < 1:
        raise ValueError("the cap must be at least one instance")
    known: dict[int, Probe] = {}

    def ok(n: int) -> bool:
        if n not in known:
            known[n] = ask(n)
        return known[n].passed

    def smallest(lo: int, hi: int) -> int:
        """Bisect: ``lo`` fails (0: nothing below ``hi`` was asked), ``hi`` passes."""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid
        return hi

    n = max(1, min(start, cap))
    lo, hi = 0, 0  # the largest count known to fail (0: none), the smallest known to pass
    if ok(n):
        hi = n
        while lo == 0 and hi > 1:  # step down until a count fails
            down = _step_down(known[hi], hi)
            if ok(down):
                hi = down
            else:
                lo = down
        return smallest(lo, hi), None, known
    lo = n
    while lo < cap:  # double until a count passes
        up = min(cap, 2 * lo)
        if ok(up):
            return smallest(lo, up), None, known
        lo = up
    top = beyond if beyond is not None else cap
    while lo < top:
        up = min(top, 2 * lo)
        if ok(up):
            return None, smallest(lo, up), known
        lo = up
    return None, None, known


def _step_down(passed: Probe, n: int) -> int:
    """Where to look below a passing count ``n``: the count that would keep the GPUs of
    the passing run busy all the time (fewer cannot serve its prefill work at all, so
    it fails, and the bracket is then tight), or half when the run does not say."""
    run = passed.result
    busy = 0.0
    if run is not None:
        st = run.stats
        tp = run.resolved.plan.tp
        if st.duration_s > 0:
            busy = st.gpu_s_all / tp / (n * st.duration_s)
    if 0.0 < busy < 1.0:
        return max(1, min(n - 1, math.ceil(n * busy) - 1))
    return max(1, n // 2)


def size_option(trace: BlockTrace, q: SizeQuestion, sampling_rate: float = 1.0) -> SizeSearch:
    """One option's search, every replay in this process (one remembered prefill time
    per chunk and one trace tree shared by its probes)."""
    from analyzer.replay.run import _Memo

    tree = TraceTree(trace)
    memo = _Memo(q.cost.compute_time_s)

    def ask(n: int) -> Probe:
        return probe(
            trace,
            q.cfg,
            q.spec,
            instances=n,
            time_scale=q.time_scale,
            ttft_slo_s=q.ttft_slo_s,
            cost=q.cost,
            sampling_rate=sampling_rate,
            tree=tree,
            prefill_s=memo,
        )

    within, above, known = search_size(ask, start=q.start, cap=q.cap, beyond=q.beyond)
    chosen = within if within is not None else above
    probes = tuple(
        p if p.instances == chosen else p.without_result() for _, p in sorted(known.items())
    )
    return SizeSearch(q.spec.name, q.cap, within, above, probes)


def size_options(
    trace: BlockTrace,
    questions: Sequence[SizeQuestion],
    *,
    jobs: int = 1,
    sampling_rate: float = 1.0,
    pool: Executor | None = None,
) -> list[SizeSearch]:
    """Every option's search, in ``questions``' order; with ``jobs > 1`` (or a ``pool``
    already running) each option in a worker process of its own. The answers do not
    depend on where they run: each search replays alone."""
    if pool is None and (jobs <= 1 or len(questions) <= 1):
        return [size_option(trace, q, sampling_rate) for q in questions]
    from analyzer.replay.run import worker_pool
    from analyzer.spawn import main_not_rerun

    with ExitStack() as stack:
        if pool is None:
            pool = stack.enter_context(worker_pool(min(jobs, len(questions))))
        with main_not_rerun():  # new workers start at these submits
            futures = [pool.submit(size_option, trace, q, sampling_rate) for q in questions]
        try:
            return [f.result() for f in futures]
        finally:  # a failure: the others are not waited for
            for f in futures:
                f.cancel()
