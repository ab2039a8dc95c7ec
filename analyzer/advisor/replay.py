"""The replay stage: how the plan's questions reach the replay, and the questions that
do not depend on a size.

The plan asks the replay two kinds of questions: "the fewest instances of this option
that meet the SLO at this load" (a size search, :mod:`analyzer.advisor.size`) and
"does this one size meet it" (a probe, :mod:`analyzer.replay.probe`). A
:class:`Replayer` answers both; :class:`LocalReplayer` replays them in this process
(with ``--jobs``, in this process and ``jobs - 1`` worker processes), remembering
every answer for the rest of the analysis, and the dashboard plugs in its own, which
remembers them across analyses (:class:`Services`).

Before any size is searched, this stage replays the **floor**: each request alone on an
idle instance, every reusable prefix of the log already cached and loaded for free.
No deployment of any size gives a request a lower TTFT, so when the floor's p90 misses
the SLO no size meets it, and the verdict says so without searching. It also replays
today's deployment for a log whose responses carry ``cached_tokens``
(:mod:`analyzer.advisor.current`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from analyzer.advisor.current import CurrentDeployment, MeasuredAgainstProjected, compare
from analyzer.advisor.probing import size_options, warm_up
from analyzer.advisor.size import Search, SizeQuestion, SizeSearch, size_option
from analyzer.progress import progress
from analyzer.replay.config import UNBOUNDED, ClusterConfig, Scenario, ScenarioSpec
from analyzer.replay.miniature import sample, sampling_rate
from analyzer.replay.probe import Probe, deciding_ttft_s
from analyzer.replay.run import worker_pool
from analyzer.reuse.analysis import first_counted_request, prefix_hit_tokens
from analyzer.reuse.measured import measure_cached
from analyzer.spawn import main_not_rerun
from analyzer.trace import BlockTrace

if TYPE_CHECKING:
    from analyzer.advisor.current import MeasuredAgainstProjected
    from analyzer.advisor.measure import Measured
    from analyzer.advisor.models import ModelsFigures
    from analyzer.advisor.options import AnalyzeOptions
    from analyzer.advisor.price import ModelSetup, Priced
    from analyzer.replay.miniature import Miniature
    from analyzer.reuse import ReuseReport

# The floor's arrivals are spread this many times apart: no two requests that the log
# does not start at the same instant meet on an instance.
FLOOR_TIME_SCALE = 1e6


class Replayer(Protocol):
    """Answers the plan's questions to the replay for one trace. ``part`` names the
    requests replayed (one model's of a multi-model log; None: the whole log), for a
    replayer that remembers answers across analyses; ``sampling_rate`` below 1 says
    ``trace`` is a miniature of them (:mod:`analyzer.replay.miniature`)."""

    def size(self, searches: Sequence[Search]) -> list[SizeSearch]:
        """Each search's answer, in order (a search ``after`` another starts from that
        one's answer: :func:`analyzer.advisor.size.start_after`)."""
        ...

    def probe(
        self,
        part: str | None,
        trace: BlockTrace,
        question: SizeQuestion,
        instances: int,
        sampling_rate: float,
    ) -> Probe:
        """The answer at one size."""
        ...


def cost_key(cost: object) -> tuple[object, ...]:
    """What a cost model prices a replay with, as a key (a calibrated model by its fitted
    coefficients too)."""
    c = cost
    fit = getattr(c, "engine", None)
    return (
        getattr(c, "model_ref", None),
        getattr(getattr(c, "gpu", None), "id", None),
        getattr(c, "tp", None),
        getattr(c, "kv_dtype", None),
        getattr(c, "weight_dtype", None),
        getattr(c, "mfu", None),
        None if fit is None else repr(fit),
        getattr(c, "bytes_per_token", None),
    )


_TIER_FIELDS = {
    "dram": (
        "dram_tier",
        "dram_gbps",
        "dram_latency_s",
        "dram_capacity_tokens",
        "dram_capacity_gb",
        "dram_scope",
    ),
    "nvme": (
        "nvme_tier",
        "nvme_gbps",
        "nvme_latency_s",
        "nvme_capacity_tokens",
        "nvme_capacity_gb",
    ),
    "pool": (
        "pool_tier",
        "pool_gbps",
        "pool_latency_s",
        "pool_capacity_tokens",
        "pool_aggregate_gbps",
    ),
}


def _relevant(cfg: ClusterConfig, spec: ScenarioSpec) -> ClusterConfig:
    """``cfg`` with the settings of tiers ``spec`` has not set to their defaults: a
    probe of the HBM cache alone answers whatever the pool link is."""
    default = ClusterConfig()
    unused = {
        name: getattr(default, name)
        for tier, names in _TIER_FIELDS.items()
        if not getattr(spec, tier)
        for name in names
    }
    # a pool's default capacity is the nodes' DRAM summed: it reads the DRAM's size
    if spec.pool:
        for name in ("dram_capacity_tokens", "dram_capacity_gb"):
            unused.pop(name, None)
    return replace(cfg, instances=1, **unused)


def _key(part: str | None, q: SizeQuestion, rate: float) -> tuple[object, ...]:
    """What a probe's answer depends on besides its size and SLO."""
    return (part, q.spec, _relevant(q.cfg, q.spec), cost_key(q.cost), q.time_scale, rate)


class ProbeStore:
    """Probes remembered across questions and analyses, by what their answers depend on
    (:func:`_key`): a later question whose answer a probe already gives (the same size
    at a lower SLO that it met, or a higher one it missed) is not replayed again.
    Thread-safe (the dashboard's page and its background prefetch share one), and
    bounded: past ``max_keys`` the oldest are forgotten, and past
    ``max_figures_requests`` measured requests' worth of runs' figures (when given; a
    run's figures take about 12-30 bytes a request) the oldest keys' probes keep their
    answers and lose their figures (a question that chooses such a count replays it)."""

    def __init__(self, max_keys: int = 1024, max_figures_requests: int | None = None) -> None:

        self.max_keys = max_keys
        self.max_figures_requests = max_figures_requests
        self._lock = threading.Lock()
        self._known: dict[tuple[object, ...], dict[int, Probe]] = {}
        self._figures = 0  # measured requests of the runs whose figures are kept

    def get(self, key: tuple[object, ...]) -> tuple[Probe, ...]:
        with self._lock:
            return tuple(self._known.get(key, {}).values())

    def put(self, key: tuple[object, ...], probes: Sequence[Probe]) -> int:
        """Keep ``probes``; returns how many said something new."""
        added = 0
        with self._lock:
            known = self._known.pop(key, {})
            for p in probes:
                old = known.get(p.instances)
                if (
                    old is None
                    or (
                        old.rank_s is None
                        and (p.rank_s is not None or p.ttft_slo_s > old.ttft_slo_s)
                    )
                    or (old.result is None and p.result is not None)
                ):
                    self._figures += _figures(p) - (0 if old is None else _figures(old))
                    known[p.instances] = p
                    added += 1
            self._known[key] = known  # most recent last
            while len(self._known) > self.max_keys:
                gone = self._known.pop(next(iter(self._known)))
                self._figures -= sum(_figures(p) for p in gone.values())
            top = self.max_figures_requests
            if top is not None and self._figures > top:
                for k, kept in self._known.items():  # the oldest first, never the newest
                    if self._figures <= top or k == key:
                        break
                    for n, p in kept.items():
                        if p.result is not None:
                            self._figures -= _figures(p)
                            kept[n] = p.without_result()
        return added


def _figures(p: Probe) -> int:
    """The measured requests whose figures ``p`` keeps (none without its run's)."""
    return 0 if p.result is None else p.requests


class LocalReplayer:
    """Replays the plan's questions (with ``jobs > 1`` in this process and ``jobs - 1``
    worker processes, or in ``pool`` when given) and remembers every probe in ``store``.

    A caller that keeps the store across analyses (the dashboard) gives ``trace_key``,
    what identifies the trace on screen; ``only_known`` asks nothing new (a question no
    remembered probe answers raises :class:`analyzer.replay.memo.NotRemembered`);
    ``gate`` is called before each batch (a background caller waits there while the page
    computes), ``on_run`` with each option that replayed something new."""

    def __init__(
        self,
        jobs: int = 1,
        *,
        store: ProbeStore | None = None,
        trace_key: object = None,
        pool: Executor | None = None,
        only_known: bool = False,
        gate: Callable[[float], None] | None = None,
        on_run: Callable[[str], None] | None = None,
    ) -> None:
        self.jobs = max(1, jobs)
        self.store = store if store is not None else ProbeStore()
        self.trace_key = trace_key
        self.pool = pool
        self.only_known = only_known
        self.gate = gate
        self.on_run = on_run
        self._own: Executor | None = None  # worker processes started here, for jobs > 1

    def _pool(self, questions: int) -> Executor | None:
        """The pool to run ``questions`` searches in: the caller's, or one of ``jobs - 1``
        workers started once for this replayer (so an analysis pays for their start-up
        once), beside which this process searches too."""
        if self.pool is not None:
            return self.pool
        if self.jobs <= 1 or (questions <= 1 and self._own is None):
            return None
        if self._own is None:
            self._own = worker_pool(self.jobs - 1)
        return self._own

    def start(self) -> None:
        """Start the worker processes now, without waiting for them, so that their
        start (a process, its imports) overlaps what the caller does before the first
        search (reading the log, measuring its reuse) instead of delaying that search."""
        if self.pool is not None or self.jobs <= 1 or self._own is not None:
            return
        self._own = worker_pool(self.jobs - 1)
        with main_not_rerun():
            for _ in range(self.jobs - 1):
                self._own.submit(warm_up)

    @property
    def workers(self) -> Executor | None:
        """The worker processes :meth:`start` started (None: none yet, or ``jobs`` 1)."""
        return self._own

    def close(self) -> None:
        """Stop the worker processes this replayer started (none: nothing to do)."""
        if self._own is not None:
            self._own.shutdown(cancel_futures=True)
            self._own = None

    def _k(self, part: str | None, q: SizeQuestion, rate: float) -> tuple[object, ...]:
        return (self.trace_key, *_key(part, q, rate))

    def _keep(
        self, part: str | None, q: SizeQuestion, rate: float, probes: Sequence[Probe]
    ) -> None:
        if self.store.put(self._k(part, q, rate), probes) and self.on_run is not None:
            self.on_run(q.spec.name)

    def size(self, searches: Sequence[Search]) -> list[SizeSearch]:
        if self.gate is not None:
            self.gate(0)
        # What each search may take as known is what was remembered when the batch came
        # (not what another search of it finds meanwhile): the answers do not depend on
        # which search ends first.
        seeded = [
            replace(
                sr,
                question=replace(
                    sr.question,
                    known=self.store.get(self._k(sr.part, sr.question, sr.sampling_rate)),
                ),
            )
            for sr in searches
        ]
        pool = None if self.only_known else self._pool(len(seeded))
        out = size_options(
            seeded,
            pool=pool,
            workers=self.jobs - 1 if pool is not None and pool is self._own else None,
            share=pool is not None and pool is self._own,
            replay_missing=not self.only_known,
        )
        for sr, s in zip(searches, out, strict=True):
            self._keep(sr.part, sr.question, sr.sampling_rate, s.probes)
        return out

    def probe(
        self,
        part: str | None,
        trace: BlockTrace,
        question: SizeQuestion,
        instances: int,
        sampling_rate: float,
    ) -> Probe:
        if self.gate is not None:
            self.gate(0)
        known = self.store.get(self._k(part, question, sampling_rate))
        q = replace(
            question, cap=instances, known=known, cfg=replace(question.cfg, instances=instances)
        )
        s = size_option(trace, q, sampling_rate, only=instances, replay_missing=not self.only_known)
        self._keep(part, question, sampling_rate, s.probes)
        return next(p for p in s.probes if p.instances == instances)


@dataclass(frozen=True, slots=True)
class Services:
    """What a caller plugs into an analysis: the replayer that answers the plan's
    questions, and the reuse report (with this warm-up and the primary model's bytes per
    token) and models document of the trace, when it remembers them."""

    replayer: Replayer = field(default_factory=LocalReplayer)
    reuse: ReuseReport | None = None
    models: ModelsFigures | None = None


@dataclass(frozen=True, slots=True)
class ReplayTrace:
    """One model's requests as the replay takes them: the trace, or its miniature."""

    part: str | None
    trace: BlockTrace
    sampling_rate: float = 1.0
    miniature: Miniature | None = None


def replay_trace(setup: ModelSetup, full_replay: bool) -> ReplayTrace:
    """A model's requests, in miniature above the replay's size unless ``full_replay``
    (the same sample for every question)."""

    t = setup.trace
    rate = None if full_replay or t.count_only else sampling_rate(t.n_accesses)
    if rate is None:
        return ReplayTrace(setup.part, t)
    small, mini = sample(t, rate)
    return ReplayTrace(setup.part, small, rate, mini)


@dataclass(frozen=True, slots=True)
class Floor:
    """The lowest TTFT any size of any option gives the model's requests: each alone on
    an idle instance, every reusable prefix already cached and free to load. ``p90_s`` is
    the TTFT that decides the p90 test: no SLO below it can be met."""

    p90_s: float
    ttft_slo_s: float

    @property
    def meets_slo(self) -> bool:
        return self.p90_s <= self.ttft_slo_s

    def to_json(self) -> dict[str, object]:
        return {"p90_s": self.p90_s, "ttft_slo_s": self.ttft_slo_s, "meets_slo": self.meets_slo}


def floor_question(setup: ModelSetup, trace: BlockTrace, slo_s: float) -> tuple[SizeQuestion, int]:
    """The floor as a probe: an unbounded pool loaded for free (the ceiling's hits under
    any router), one instance for each request arriving at the same instant, arrivals
    spread so that no others meet."""
    import numpy as np

    _, counts = np.unique(trace.arrival_s, return_counts=True)
    instances = int(min(4096, counts.max())) if counts.size else 1
    cfg = replace(
        setup.cluster,
        free_loads=True,
        router="least-loaded",
        local_capacity_tokens=UNBOUNDED,
        pool_capacity_tokens=UNBOUNDED,
    )
    spec = ScenarioSpec("floor", pool=True, description="each request alone, every prefix cached")
    q = SizeQuestion(spec, cfg, setup.cost, FLOOR_TIME_SCALE, slo_s, cap=instances)
    return q, instances


@dataclass(frozen=True, slots=True)
class Replayed:
    """What this stage replayed: each model's trace as the replay takes it, its floor,
    and today's deployment beside the log's measured hits."""

    traces: tuple[ReplayTrace, ...]
    floors: tuple[Floor, ...]
    measured: MeasuredAgainstProjected | None = None


def compute_floor_s(setup: ModelSetup, warmup: float) -> float:
    """A lower bound on the floor's p90 without replaying: each measured request's own
    compute for the tokens no cache can hold (those after its reusable prefix), the
    TTFT that decides the p90 test."""
    import numpy as np

    t = setup.trace
    if t.n_requests == 0 or t.n_accesses == 0:
        return 0.0
    start = first_counted_request(t.n_requests, warmup)
    hit = prefix_hit_tokens(t)[start:]
    prompt = t.prompt_tokens[start:]
    f = setup.cost.compute_time_s
    pairs: dict[tuple[int, int], float] = {}
    out = np.empty(prompt.size)
    for i, (p, h) in enumerate(zip(prompt.tolist(), hit.tolist(), strict=True)):
        key = (int(p) - int(h), int(h))
        v = pairs.get(key)
        if v is None:
            v = pairs[key] = float(f(*key))
        out[i] = v
    return deciding_ttft_s(out)


def floor_searches(
    models: Sequence[tuple[ModelSetup, ReplayTrace]], slo_s: float, warmup: float
) -> tuple[list[float], list[tuple[int, int, Search]]]:
    """Each model's compute bound, and the replays :func:`floors_of` asks for the models
    whose bound does not settle the question: (model's position, instances, search)."""
    bounds = [compute_floor_s(setup, warmup) for setup, _ in models]
    asked: list[tuple[int, int, Search]] = []
    for k, ((setup, rt), bound) in enumerate(zip(models, bounds, strict=True)):
        if slo_s / 2 < bound <= slo_s:
            q, n = floor_question(setup, rt.trace, slo_s)
            q = replace(q, cap=n, cfg=replace(q.cfg, instances=n))
            asked.append((k, n, Search(rt.part, rt.trace, q, rt.sampling_rate, only=n)))
    return bounds, asked


def floors_of(
    models: Sequence[tuple[ModelSetup, ReplayTrace]],
    slo_s: float,
    warmup: float,
    replayer: Replayer,
) -> list[Floor]:
    """Each model's floor (:class:`Floor`): its compute bound when that settles the
    question (above the SLO: nothing meets it; under half of it: the floor is far from
    binding), else the floor replayed, the models' replays at once."""
    bounds, asked = floor_searches(models, slo_s, warmup)
    out = [Floor(b, slo_s) for b in bounds]
    got = replayer.size([sr for _, _, sr in asked]) if asked else []
    for (k, n, _), s in zip(asked, got, strict=True):
        p = next(p for p in s.probes if p.instances == n)
        out[k] = Floor(math.inf if p.rank_s is None else max(p.rank_s, bounds[k]), slo_s)
    return out


def replay(
    m: Measured, priced: Priced, opts: AnalyzeOptions, services: Services, usable: bool
) -> Replayed:
    """Each model's floor (when the options are sized), and today's deployment replayed
    (module docstring); nothing for a log too small or too thin to replay."""
    traces = tuple(replay_trace(s, opts.full_replay) for s in priced.setups)
    floors: list[Floor] = []
    if usable and opts.size_search:
        with progress("replay: the lowest TTFT any size reaches", None):
            floors = floors_of(
                list(zip(priced.setups, traces, strict=True)),
                opts.ttft_slo_s,
                opts.warmup,
                services.replayer,
            )
    measured = _measured_vs_projected(m, priced, opts, usable)
    return Replayed(traces, tuple(floors), measured)


def _measured_vs_projected(
    m: Measured, priced: Priced, opts: AnalyzeOptions, usable: bool
) -> MeasuredAgainstProjected | None:
    """When the log's responses carry cached_tokens: the measured rate always; the
    replay of today's deployment beside it when the log is usable."""

    measured = measure_cached(m.trace, opts.warmup)
    if measured is None:
        return None
    if not usable or measured.overall.requests == 0:  # nothing measured to compare
        return MeasuredAgainstProjected(measured)
    s = priced.primary
    current = CurrentDeployment(
        opts.current_instances, opts.current_router, opts.current_local_capacity_tokens
    )
    cfg: ClusterConfig = s.cluster
    with progress("replay of today's deployment", None):
        comparison = compare(m.trace, cfg, s.cost, measured, current)
    return MeasuredAgainstProjected(measured, comparison)


BASELINE = Scenario.LOCAL
