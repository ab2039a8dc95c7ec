"""What-ifs a user is likely to try next, computed in the background while they read.

After the Recommendation is shown, one background thread analyses the neighbouring
settings: half and twice the instances, and the next slower and faster pool network in
the catalog. Their replays land in the server's :class:`~analyzer.replay.memo.ReplayMemo`
and their results here, so the click that asks for one answers at once.

The thread never competes with the page: while a page computes (:func:`foreground`)
the background replay waits at its next progress step, and a new set of neighbours
replaces the ones not started yet. It touches no page element (no Streamlit call), so
it logs nothing. On a 2-core machine shared with other work, a prefetch started just
before a click can still slow that click while it finishes its current step.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import streamlit as st

log = logging.getLogger("kvpool.dashboard")

Job = tuple[Hashable, Callable[[Callable[[float], None]], object]]


class Prefetcher:
    """One background worker running the latest list of jobs, pausing for the page."""

    def __init__(self, max_results: int = 16) -> None:
        self._lock = threading.Lock()
        self._pending: list[Job] = []
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._busy = 0
        self._results: OrderedDict[Hashable, object] = OrderedDict()
        self._max = max_results
        self.started: list[Hashable] = []  # what ran, in order (tests read it)

    def get(self, key: Hashable):
        with self._lock:
            return self._results.get(key)

    def submit(self, jobs: list[Job]) -> None:
        """Replace the jobs not started yet with ``jobs`` (those already known skipped)."""
        with self._lock:
            self._pending = [(k, fn) for k, fn in jobs if k not in self._results]
            if self._pending and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(
                    target=self._loop, name="kvpool-prefetch", daemon=True
                )
                self._thread.start()

    def _gate(self, _n: float) -> None:
        self._idle.wait()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                key, fn = self._pending.pop(0)
                self.started.append(key)
            self._idle.wait()
            try:
                result = fn(self._gate)
            except Exception as exc:  # a neighbour that cannot be analysed: skip it
                log.debug("prefetch of %r failed: %s", key, exc)
                continue
            with self._lock:
                self._results[key] = result
                while len(self._results) > self._max:
                    self._results.popitem(last=False)

    @contextmanager
    def foreground(self) -> Iterator[None]:
        """Pause the background work while the page computes."""
        with self._lock:
            self._busy += 1
            self._idle.clear()
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                if self._busy == 0:
                    self._idle.set()

    def wait(self, timeout_s: float) -> bool:
        """Block until the queue is done (tests); False on timeout."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            return not thread.is_alive()
        return True


@st.cache_resource(show_spinner=False)
def prefetcher() -> Prefetcher:
    return Prefetcher()


def analysis_key(cur, opts) -> Hashable:
    return (cur.content, cur.ingest_key, repr(opts))


def neighbours(opts) -> list:
    """Half and twice the instances, and the next slower and faster pool network."""
    from analyzer.cost import list_tiers

    def with_cluster(**kw):
        return replace(opts, cluster=replace(opts.cluster, **kw))

    half_twice = (max(1, opts.instances // 2), opts.instances * 2)
    out = [with_cluster(instances=n) for n in half_twice if n != opts.instances]
    nets = sorted(
        (t for t in list_tiers() if t.kind == "network"), key=lambda t: (t.bandwidth_gbps, t.name)
    )
    names = [t.name for t in nets]
    if opts.pool_tier in names:
        i = names.index(opts.pool_tier)
        out += [with_cluster(pool_tier=names[j]) for j in (i - 1, i + 1) if 0 <= j < len(names)]
    return out


def after_analysis(cur, opts) -> None:
    """Queue the neighbours of the analysis just shown."""
    from app import compute

    memo = compute.replay_memo()  # fetched here: the thread makes no Streamlit call

    def job(o):
        return lambda gate: compute.run_whatif(cur, o, gate=gate, memo=memo)

    prefetcher().submit([(analysis_key(cur, o), job(o)) for o in neighbours(opts)])
