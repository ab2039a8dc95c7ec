"""A batch of size searches run probe by probe over worker processes, with the idle ones
replaying the count a search will probably ask next.

A search's probes depend on each other (each count follows from the answers before
it), so one search keeps one process busy at a time; a batch with fewer searches left
than processes leaves the others idle: while a model's baseline is searched alone,
before the options that start from its answer, and at a batch's tail. Here each probe
is a task of its own, and a process with nothing asked of it replays, ahead of time, a
count the search waiting on a probe asks next if that probe passes (or, failing that,
if it fails). The search itself runs as :func:`analyzer.advisor.size.search_size`
runs it, answer by answer, from the same answers: a count replayed ahead is taken
when the search asks for it and dropped when it does not, so the answers, and the
counts each search reports it tried, are those of one search after another in one
process.

The search's next count under a supposed answer is found by running
:func:`~analyzer.advisor.size.search_size` on the answers so far plus that one (a
search is a pure function of its answers). A supposed pass does not say how busy the
run kept its GPUs, which an unhinted search steps down by; then only a failure is
supposed.

:func:`size_options` answers a batch: here with worker processes
(:class:`ProbeScheduler`), else one search after another in this process.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from analyzer.advisor.size import (
    Search,
    SizeQuestion,
    SizeSearch,
    _bracketed,
    at_slo,
    kept_probes,
    search_question,
    size_option,
    start_after,
)
from analyzer.cost.aic import Fits, fitted, remember_fitted
from analyzer.cost.model import CostModel
from analyzer.replay.engine import TraceTree
from analyzer.replay.probe import Probe, probe
from analyzer.replay.run import _Memo, worker_pool
from analyzer.replay.steps import step_pricing
from analyzer.spawn import main_not_rerun

if TYPE_CHECKING:
    from analyzer.trace import BlockTrace

_TOKENS = itertools.count(1)


class _Need(Exception):
    """The search asks for a count it has no answer for."""

    def __init__(self, n: int) -> None:
        self.n = n


class _Unknowable(Exception):
    """A supposed answer was asked what only a replay says (how busy it kept the GPUs)."""


@dataclass(frozen=True, slots=True)
class _Supposed:
    """A probe's answer supposed ahead of its replay."""

    instances: int
    passed: bool

    @property
    def busy(self) -> float | None:
        raise _Unknowable


def _next_count(
    q: SizeQuestion, fails_to: int, passes_at: int | None, answers: dict[int, object]
) -> int | tuple[int | None, int | None, dict[int, Probe]]:
    """The count ``q``'s search asks next given ``answers`` (by count), or its result
    ``(within, above, probes by count)`` once it asks nothing more."""

    def ask(n: int) -> Probe:
        got = answers.get(n)
        if got is None:
            raise _Need(n)
        return got  # type: ignore[return-value]  # a Probe, or a _Supposed one

    try:
        return search_question(ask, q, fails_to, passes_at)
    except _Need as need:
        return need.n


@dataclass(slots=True)
class _Searching:
    """One search of the batch in progress: what it knows and what it waits on."""

    index: int
    question: SizeQuestion
    before: dict[int, Probe]  # probes remembered from earlier questions, by count
    fails_to: int
    passes_at: int | None
    answers: dict[int, Probe] = field(default_factory=dict)
    waiting: int | None = None  # the count whose replay it waits on
    again: int | None = None  # the chosen count, replayed for the figures it lacks
    result: tuple[int | None, int | None] = (None, None)  # the search's (within, above)


@dataclass(frozen=True, slots=True)
class _Task:
    search: int
    instances: int


@dataclass(frozen=True, slots=True)
class _Replay:
    """One probe of a search, as a process runs it (``trace_token`` and ``cost_token``
    name the trace and the cost model within the batch, for what a worker keeps)."""

    trace: BlockTrace
    trace_token: int
    question: SizeQuestion
    cost_token: int
    sampling_rate: float
    instances: int

    def run(self, tree: TraceTree | None = None, memo: _Memo | None = None) -> Probe:
        """The probe; ``tree`` and ``memo``, the trace's tree and the cost model's
        remembered prefill times, when the caller keeps them for its probes (this
        process's), else made for this one (a worker's: it keeps nothing between
        tasks, as a dashboard's long-lived workers must not)."""
        q = self.question
        return probe(
            self.trace,
            q.cfg,
            q.spec,
            instances=self.instances,
            time_scale=q.time_scale,
            ttft_slo_s=q.ttft_slo_s,
            cost=q.cost,
            sampling_rate=self.sampling_rate,
            tree=tree if tree is not None else TraceTree(self.trace),
            prefill_s=memo if memo is not None else _Memo(q.cost.compute_time_s),
            stop_slo_s=q.stop_slo_s,
        )


def _replay_apart(r: _Replay, fits: Fits) -> Probe:
    """:meth:`_Replay.run` in a worker process, given the step-time fits the parent made
    (:func:`analyzer.cost.aic.fitted`: the worker then neither imports aiconfigurator-core
    nor fits again)."""
    remember_fitted(fits)
    return r.run()


def warm_up() -> bool:
    """A worker's first task, sent as it starts (:meth:`analyzer.advisor.replay.LocalReplayer.start`):
    it imports this module, and what the replays need, before the first probe."""
    return True


class ProbeScheduler:
    """Runs ``searches`` (as :func:`size_options` takes them) probe
    by probe on ``workers`` processes of ``pool``, and in this process too when
    ``share`` (module docstring). ``workers`` None: a pool of unknown size, shared with
    other work (the dashboard's), which gets every replay a search waits on as it is
    asked and no replay ahead of time."""

    def __init__(
        self,
        searches: Sequence[Search],
        pool: Executor,
        workers: int | None,
        share: bool,
        fits: Fits,
    ) -> None:
        self.searches = searches
        self.pool = pool
        self.workers = workers
        self.share = share
        self.fits = fits
        self.order = _Order(searches)
        self.active: dict[int, _Searching] = {}
        self.ended: set[int] = set()
        self.found = 0
        self.asked: list[_Task] = []  # replays a search waits on, not yet started
        self.started: dict[_Task, Future[Probe] | None] = {}  # None: in this process
        self.replayed: dict[_Task, Probe] = {}  # replays ended and not yet taken
        self.in_pool = 0
        self.lock = threading.Condition()
        self.failed: list[BaseException] = []
        # this process's probes' trees and remembered prefill times, by token
        self.trees: dict[int, TraceTree] = {}
        self.memos: dict[int, _Memo] = {}
        tokens: dict[int, int] = {}
        self.trace_token = [tokens.setdefault(id(sr.trace), next(_TOKENS)) for sr in searches]
        self.cost_token = [
            tokens.setdefault(id(sr.question.cost), next(_TOKENS)) for sr in searches
        ]

    # -- the searches -------------------------------------------------------------------

    def _start_ready(self) -> None:
        while self.order.ready:
            i = self.order.take()
            q = self.order.question(i)
            before = {p.instances: p for p in q.known}
            fails_to, passes_at = _bracketed(q, before.values())
            s = _Searching(i, q, before, fails_to, passes_at)
            self.active[i] = s
            self._advance(s)

    def _advance(self, s: _Searching) -> None:
        """Take ``s`` as far as its answers go: to the count it waits on, or its end."""
        only = self.searches[s.index].only
        while True:
            if s.again is not None:  # the chosen count, answered by a remembered probe
                got = self._take(s, s.again)
                if got is None:
                    return
                s.answers[s.again] = got
                self._end(s, s.again)
                return
            if only is not None:
                n: int | None = only if only not in s.answers else None
            else:
                nxt = _next_count(s.question, s.fails_to, s.passes_at, dict(s.answers))
                n = nxt if isinstance(nxt, int) else None
            if n is not None:
                seen = s.before.get(n)
                again = at_slo(seen, s.question.ttft_slo_s) if seen is not None else None
                got = again if again is not None else self._take(s, n)
                if got is None:
                    return
                s.answers[n] = got
                continue
            if only is not None:
                chosen = only if s.answers[only].passed else None
            else:
                assert not isinstance(nxt, int)
                within, above, _ = nxt
                s.result = (within, above)
                chosen = within if within is not None else above
            if chosen is not None and s.answers[chosen].result is None:
                s.again = chosen  # replayed for the figures a remembered probe lacks
                continue
            self._end(s, chosen)
            return

    def _take(self, s: _Searching, n: int) -> Probe | None:
        """The replay of ``n`` for ``s`` when it has ended (taken from those kept), else
        None, ``s`` then waiting on it (asked unless it is under way)."""
        task = _Task(s.index, n)
        got = self.replayed.pop(task, None)
        if got is not None:
            self.started.pop(task, None)
            s.waiting = None
            return got
        s.waiting = n
        if task not in self.started and task not in self.asked:
            self.asked.append(task)
        return None

    def _end(self, s: _Searching, chosen: int | None) -> None:
        sr = self.searches[s.index]
        q = s.question
        if sr.only is not None:
            result = SizeSearch(q.spec.name, q.cap, chosen, None, (s.answers[sr.only],))
        else:
            within, above = s.result
            probes = kept_probes(s.answers, chosen)
            result = SizeSearch(q.spec.name, q.cap, within, above, probes)
        del self.active[s.index]
        self.ended.add(s.index)
        # replays ahead of time this search did not ask for are dropped
        for task in [t for t in self.replayed if t.search == s.index]:
            del self.replayed[task]
            self.started.pop(task, None)
        self.found += 1
        self.order.done(s.index, result)
        self._start_ready()

    # -- the replays ----------------------------------------------------------------------

    def _ahead(self) -> _Task | None:
        """A count a waiting search asks next if the replay it waits on passes (else
        if it fails), not asked or replayed yet; where that replay would end the
        search, the first count of each search that starts from its answer."""
        for s in list(self.active.values()):
            n = s.waiting
            if n is None or s.again is not None or self.searches[s.index].only is not None:
                continue
            for passed in (True, False):
                supposed = {**s.answers, n: _Supposed(n, passed)}
                try:
                    nxt = _next_count(s.question, s.fails_to, s.passes_at, supposed)
                except _Unknowable:
                    continue
                if isinstance(nxt, int):
                    task = self._unasked(s.index, s.question, s.before, nxt)
                    if task is not None:
                        return task
                    continue
                within, above, _ = nxt
                answer = SizeSearch(s.question.spec.name, s.question.cap, within, above)
                for j in self.order.waiting.get(s.index, ()):
                    task = self._first_after(j, answer)
                    if task is not None:
                        return task
        return None

    def _first_after(self, j: int, base: SizeSearch) -> _Task | None:
        """Search ``j``'s first count, were its baseline's answer ``base``."""
        sr = self.searches[j]
        if sr.after is None:
            return None
        q = start_after(sr.question, self.searches[sr.after].question, base)
        before = {p.instances: p for p in q.known}
        if sr.only is not None:
            first: object = sr.only
        else:
            first = _next_count(q, *_bracketed(q, before.values()), {})
        return self._unasked(j, q, before, first) if isinstance(first, int) else None

    def _unasked(self, i: int, q: SizeQuestion, before: dict[int, Probe], n: int) -> _Task | None:
        """Search ``i``'s replay of ``n``, unless a remembered probe answers it or it
        is under way or done."""
        seen = before.get(n)
        if seen is not None and at_slo(seen, q.ttft_slo_s) is not None:
            return None
        task = _Task(i, n)
        if task in self.started or task in self.replayed:
            return None
        return task

    def _next_task(self, ahead: bool = True) -> _Task | None:
        """The next replay to start: one a search waits on, else (``ahead``) one a
        search will probably ask for."""
        while self.asked:
            task = self.asked.pop(0)
            if task.search in self.active and task not in self.started:
                return task
        return self._ahead() if ahead else None

    def _replay(self, task: _Task) -> _Replay:
        sr = self.searches[task.search]
        # a search not started yet is replayed ahead from its question as given: where
        # it starts changes nothing in a replay at a given count
        s = self.active.get(task.search)
        return _Replay(
            sr.trace,
            self.trace_token[task.search],
            s.question if s is not None else sr.question,
            self.cost_token[task.search],
            sr.sampling_rate,
            task.instances,
        )

    def _send(self) -> None:
        """Fill the pool's free processes (with the lock held)."""
        while not self.failed and (self.workers is None or self.in_pool < self.workers):
            # a pool of unknown size (the caller's, shared) queues what it cannot start:
            # only what a search waits on goes there, never a replay ahead of time
            task = self._next_task(ahead=self.workers is not None)
            if task is None:
                return
            with main_not_rerun():  # a new worker starts at this submit
                f = self.pool.submit(_replay_apart, self._replay(task), self.fits)
            self.started[task] = f
            self.in_pool += 1
            f.add_done_callback(functools.partial(self._ended, task))

    def _ended(self, task: _Task, f: Future[Probe]) -> None:
        with self.lock:
            self.in_pool -= 1
            if not f.cancelled():
                err = f.exception()
                if err is not None:
                    self.failed.append(err)
                else:
                    self._record(task, f.result())
                    try:
                        self._send()
                    except BaseException as e:  # a broken pool: raised in the caller
                        self.failed.append(e)
            self.lock.notify_all()

    def _record(self, task: _Task, got: Probe) -> None:
        if task.search in self.ended:  # its search ended without it
            self.started.pop(task, None)
            return
        self.replayed[task] = got
        s = self.active.get(task.search)  # None: the search has not started yet
        if s is not None and s.waiting == task.instances:
            self._advance(s)

    def _run_here(self, r: _Replay) -> Probe:
        """``r`` in this process, with the tree and prefill times its batch keeps here."""
        tree = self.trees.get(r.trace_token)
        if tree is None:
            tree = self.trees[r.trace_token] = TraceTree(r.trace)
        memo = self.memos.get(r.cost_token)
        if memo is None:
            memo = self.memos[r.cost_token] = _Memo(r.question.cost.compute_time_s)
        return r.run(tree, memo)

    def run(self) -> list[SizeSearch]:
        total = len(self.searches)
        try:
            with self.lock:
                self._start_ready()
                self._send()
            while True:
                with self.lock:
                    while True:
                        if self.failed:
                            raise self.failed[0]
                        if self.found == total:
                            return self.order.answers()
                        task = self._next_task() if self.share else None
                        if task is not None:
                            self.started[task] = None
                            replay = self._replay(task)
                            break
                        if not self.started:
                            raise ValueError("a search waits on a search that is not in the batch")
                        self.lock.wait()
                got = self._run_here(replay)
                with self.lock:
                    self._record(task, got)
                    self._send()
        finally:  # a failure: the others are not waited for
            with self.lock:
                for f in self.started.values():
                    if f is not None:
                        f.cancel()


def size_options(
    searches: Sequence[Search],
    *,
    jobs: int = 1,
    pool: Executor | None = None,
    workers: int | None = None,
    share: bool = False,
    replay_missing: bool = True,
) -> list[SizeSearch]:
    """Every search's answer, in ``searches``' order, each started once the search it
    comes ``after`` has answered; with ``jobs > 1`` (or a ``pool`` already running) in
    worker processes, probe by probe (:class:`ProbeScheduler`:
    the replays of one search depend on each other, those of different searches do
    not, and a process no search is waiting on replays the count a search probably
    asks next).

    The searches start in their order, and one that waits on a baseline starts as soon
    as that has answered, not after a whole batch: a long search (a GPU on which no
    size meets the SLO) then runs beside the short ones instead of after them.
    ``share``: this process replays too, beside ``workers`` of ``pool`` (so a pool of
    ``jobs - 1`` workers keeps ``jobs`` processes busy, one worker's memory less). The
    answers, and the counts each search tried, do not depend on where or when they
    run: each search asks for its counts as it would alone, from its question and its
    baseline's answer."""

    order = _Order(searches)
    if not replay_missing or (pool is None and (jobs <= 1 or len(searches) <= 1)):
        while order.ready:
            i = order.take()
            order.done(
                i,
                size_option(
                    searches[i].trace,
                    order.question(i),
                    searches[i].sampling_rate,
                    replay_missing=replay_missing,
                ),
            )
        return order.answers()

    with ExitStack() as stack:
        if pool is None:
            workers = min(jobs, len(searches))
            pool = stack.enter_context(worker_pool(workers))
            share = False
        for sr in searches:  # the step times the replays price with, fitted here once
            q = sr.question
            if q.cfg.serving == "aggregated" or isinstance(q.cost, CostModel):
                step_pricing(q.cost)  # the engine's steps; a disaggregated decode pool's
        return ProbeScheduler(searches, pool, workers, share, fitted()).run()


class _Order:
    """Which of a batch's searches may start: those after no other, in order, then each
    one whose baseline has answered; and each one's question as it starts."""

    def __init__(self, searches: Sequence[Search]) -> None:
        self.searches = searches
        self.found: dict[int, SizeSearch] = {}
        self.waiting: dict[int, list[int]] = {}
        self.ready: deque[int] = deque()
        for i, sr in enumerate(searches):
            if sr.after is None:
                self.ready.append(i)
            else:
                self.waiting.setdefault(sr.after, []).append(i)

    def take(self) -> int:
        return self.ready.popleft()

    def question(self, i: int) -> SizeQuestion:
        sr = self.searches[i]
        if sr.after is None:
            return sr.question
        return start_after(sr.question, self.searches[sr.after].question, self.found[sr.after])

    def done(self, i: int, s: SizeSearch) -> None:
        self.found[i] = s
        self.ready.extend(self.waiting.pop(i, ()))

    def answers(self) -> list[SizeSearch]:
        missing = [i for i in range(len(self.searches)) if i not in self.found]
        if missing:
            raise ValueError(f"searches {missing} wait on a search that is not in the batch")
        return [self.found[i] for i in range(len(self.searches))]
