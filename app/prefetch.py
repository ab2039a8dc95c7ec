"""What-ifs a user is likely to try next, computed in the background while they read.

After the Recommendation is shown, one background thread analyses the neighbouring
settings: half and twice the instances, and the next slower and faster pool network in
the catalog. Their replays land in the server's :class:`~analyzer.replay.memo.ReplayMemo`
and their results here, so the click that asks for one answers at once.

The thread never competes with the page: while a page computes (:func:`foreground`)
its replay's worker processes are stopped where they are and continued after
(:func:`app.workers.hold_prefetch`), the thread waits at its next progress step, and a
new set of neighbours replaces the ones not started yet. The Recommendation keeps them
stopped :data:`DRAW_S` longer, while the browser draws what the page sent (on two cores
a replay beside it doubled that drawing), even the neighbour the user asked for. While
the page is idle the prefetch runs at the server's own priority, so it finishes in a
bounded time however busy the machine is with other work. It touches no page element (no Streamlit call),
so it logs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import streamlit as st

log = logging.getLogger("kvpool.dashboard")

Job = tuple[Hashable, Callable[[Callable[[float], None]], object]]
HOLD_S = 2.0  # the longest a run_now job waits for the page to draw
# How long the prefetch stays stopped after a page's script has ended, while the browser
# draws it (the Recommendation's deltas take it 0.4 to 1.1 s on the idle 2-core machine,
# longer when replays share the cores); a background replay behind a re-priced answer
# waits as long.
DRAW_S = 1.0


class Prefetcher:
    """One background worker running the latest list of jobs, pausing for the page.

    ``hold(True)`` is called when the page starts computing while a neighbour the user
    has not asked for is prefetched, ``hold(False)`` when it may go on: the dashboard
    stops the prefetch's worker processes meanwhile (:func:`app.workers.hold_prefetch`),
    as the thread itself waits at its next progress step."""

    def __init__(self, max_results: int = 32, hold: Callable[[bool], None] | None = None) -> None:
        self._hold = hold
        self._held = False
        self._lock = threading.Lock()
        self._pending: list[Job] = []
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._busy = 0
        self._drawing = 0  # pages whose script is over, drawn by the browser (linger_s)
        self._results: OrderedDict[Hashable, object] = OrderedDict()
        self._max = max_results
        self._urgent: dict[Hashable, list[float]] = {}  # run_now jobs: [simulated, started]
        self._failed: dict[Hashable, str] = {}
        self._threads: list[threading.Thread] = []
        # The neighbour being prefetched, its [simulated, started], and the one the user
        # asked for while it ran (it then runs on without pausing for the page).
        self._current: Hashable | None = None
        self._progress: list[float] = [0.0, 0.0]
        self._promoted: Hashable | None = None
        self.started: list[Hashable] = []  # what ran, in order (tests read it)

    def _rehold(self) -> None:
        """Hold the prefetch's processes exactly while a page is drawn, and while the
        page computes unless the neighbour they work on is the one asked for (the lock
        held)."""
        want = self._drawing > 0 or (
            self._busy > 0 and not (self._current is not None and self._current == self._promoted)
        )
        if want != self._held and self._hold is not None:
            self._hold(want)
        self._held = want

    def get(self, key: Hashable):
        with self._lock:
            if key in self._results:
                self._results.move_to_end(key)
            return self._results.get(key)

    def put(self, key: Hashable, result: object) -> None:
        """Remember an answer computed elsewhere (the page's own)."""
        with self._lock:
            self._store(key, result)

    def _store(self, key: Hashable, result: object) -> None:
        self._results[key] = result
        self._results.move_to_end(key)
        self._failed.pop(key, None)
        while len(self._results) > self._max:
            self._results.popitem(last=False)

    def run_now(
        self,
        key: Hashable,
        fn: Callable[[Callable[[float], None]], object],
        hold: threading.Event | None = None,
    ) -> None:
        """Start ``fn(advance)`` at once in a thread of its own, ahead of the queue (which
        waits meanwhile): the answer the user asked for, while the page shows the last
        one. Nothing happens if ``key`` is known, running, or failed already. ``hold``:
        ``fn`` starts :data:`DRAW_S` after it is set (the page has sent what it shows
        meanwhile, which the browser then draws), or after :data:`HOLD_S` at most."""
        with self._lock:
            if key in self._results or key in self._urgent or key in self._failed:
                return
            if key == self._current:  # the prefetch is on it: let it run unpaused
                self._promoted = key
                self._rehold()
                return
            self._urgent[key] = [0.0, time.monotonic()]
            self._busy += 1
            self._idle.clear()
            self._rehold()

        def advance(n: float) -> None:
            with self._lock:
                self._urgent[key][0] += n

        def work() -> None:
            if hold is not None and hold.wait(HOLD_S):
                time.sleep(DRAW_S)  # the page's script is over: let the browser draw it
            try:
                result = fn(advance)
            except Exception as exc:  # shown by the page, which runs it again itself
                log.debug("background analysis of %r failed: %s", key, exc)
                with self._lock:
                    self._failed[key] = str(exc)
            else:
                with self._lock:
                    self._store(key, result)
            finally:
                with self._lock:
                    self._urgent.pop(key, None)
                    self._busy -= 1
                    self._settle()

        thread = threading.Thread(target=work, name="kvpool-whatif", daemon=True)
        with self._lock:
            self._threads.append(thread)
            self._threads = [t for t in self._threads if t.is_alive() or t is thread]
        thread.start()

    def running(self, key: Hashable) -> tuple[float, float] | None:
        """(requests simulated, seconds since it started) of a :meth:`run_now` job still
        running; None once it is done (its answer is then in :meth:`get`) or failed."""
        with self._lock:
            got = self._urgent.get(key)
            if got is None and key == self._current == self._promoted:
                got = self._progress
            return None if got is None else (got[0], time.monotonic() - got[1])

    def failed(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._failed

    def submit(self, jobs: list[Job]) -> None:
        """Replace the jobs not started yet with ``jobs`` (those already known skipped)."""
        with self._lock:
            self._pending = [
                (k, fn) for k, fn in jobs if k not in self._results and k not in self._urgent
            ]
            if self._pending and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(
                    target=self._loop, name="kvpool-prefetch", daemon=True
                )
                self._thread.start()

    def _gate(self, n: float) -> None:
        with self._lock:
            self._progress[0] += n
            asked = self._current == self._promoted
        if not asked:  # a neighbour the user has not asked for yet waits for the page
            self._idle.wait()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                key, fn = self._pending.pop(0)
                self.started.append(key)
                self._current, self._progress = key, [0.0, time.monotonic()]
                self._rehold()
            self._idle.wait()
            try:
                result = fn(self._gate)
            except Exception as exc:  # a neighbour that cannot be analysed: skip it
                log.debug("prefetch of %r failed: %s", key, exc)
                with self._lock:
                    if key == self._promoted:  # asked for: the page runs it and says why
                        self._failed[key] = str(exc)
                    self._current = None
                continue
            with self._lock:
                self._store(key, result)
                self._current = None

    @contextmanager
    def foreground(self, linger_s: float = 0.0) -> Iterator[None]:
        """Pause the background work while the page computes, and ``linger_s`` seconds
        after: the browser draws what the page sent after the script has ended (half a
        second to a second for the Recommendation on two cores), and a prefetch
        continued at once takes the cores it draws with."""
        with self._lock:
            self._busy += 1
            self._idle.clear()
            self._rehold()
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                if linger_s > 0:
                    # Drawn: even the neighbour the user asked for waits, its answer a
                    # moment later, the page's meanwhile drawn at once.
                    self._drawing += 1
                    timer = threading.Timer(linger_s, self._drawn)
                    timer.daemon = True
                    timer.start()
                self._settle()

    def _drawn(self) -> None:
        with self._lock:
            self._drawing -= 1
            self._settle()

    def _settle(self) -> None:
        """Let the background go on when nothing is computed or drawn (the lock held)."""
        if self._busy == 0 and self._drawing == 0:
            self._idle.set()
        self._rehold()

    def wait(self, timeout_s: float) -> bool:
        """Block until the queue and every :meth:`run_now` job are done (tests); False
        on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = [self._thread, *self._threads]
        for thread in threads:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    return False
        return self._thread is None or not self._thread.is_alive()


@st.cache_resource(show_spinner=False)
def prefetcher() -> Prefetcher:
    from app import workers

    return Prefetcher(hold=workers.hold_prefetch)


def analysis_key(cur, opts) -> Hashable:
    return (cur.content, cur.ingest_key, repr(opts))


def neighbours(opts) -> list:
    """The what-ifs most likely next, cheapest first: the other objective (a latency-first
    decision reads quick replays at half and twice the instances), the next slower and
    faster pool network and half and twice the pool's bandwidth (the pooled scenario
    alone), then half and twice the instances (every scenario)."""
    from analyzer.cost import list_tiers

    def with_cluster(**kw):
        return replace(opts, cluster=replace(opts.cluster, **kw))

    th = opts.thresholds
    out = [
        replace(
            opts, thresholds=replace(th, objective="cost" if th.objective == "ttft" else "ttft")
        )
    ]
    nets = sorted(
        (t for t in list_tiers() if t.kind == "network"), key=lambda t: (t.bandwidth_gbps, t.name)
    )
    names = [t.name for t in nets]
    if opts.pool_tier in names:
        i = names.index(opts.pool_tier)
        out += [with_cluster(pool_tier=names[j]) for j in (i - 1, i + 1) if 0 <= j < len(names)]
    if opts.pool_gbps:
        out += [with_cluster(pool_gbps=opts.pool_gbps * f) for f in (0.5, 2.0)]
    half_twice = (max(1, opts.instances // 2), opts.instances * 2)
    out += [with_cluster(instances=n) for n in half_twice if n != opts.instances]
    return out


def after_analysis(cur, opts) -> None:
    """Queue the neighbours of the analysis just shown."""
    from app import answers, replays

    memo = replays.replay_memo()  # fetched here: the thread makes no Streamlit call

    def job(o):
        return lambda gate: answers.run_whatif(cur, o, gate=gate, memo=memo, parallel=False)

    prefetcher().submit([(analysis_key(cur, o), job(o)) for o in neighbours(opts)])
