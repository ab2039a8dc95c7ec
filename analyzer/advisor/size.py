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
2. *bracket*: while it fails, double the count until one passes or the cap is reached
   (straight to the cap when the next doubling would pass it: a cap that fails, the
   usual reason a doubled count fails too, then costs one replay, not two);
   while it passes, step down (to the count whose GPUs the passing run kept busy
   all the time when that is known, else to half) until one fails or one instance
   passes;
3. *bisect* the bracket down to neighbouring counts: ``n - 1`` failed, ``n`` passed.

Every count is replayed at most once (the probes are remembered), and a count that
fails stops its replay as soon as it has lost the SLO, so only passing counts cost a
whole replay. A count above the cap is searched only to say which size would meet
the SLO (``beyond``), never planned.

**A search with a hint** (:class:`Hint`) starts where its answer probably is: after a
pass at the start it steps down by 1, 1, 2, 4, ... (``near``), after a failure up by 1,
2, 4, ... (``gallop``), so a right guess costs two replays and one off by one three;
counts known to fail (``fails_to``, from an easier question's answer) are not replayed,
and the doubling stops at a count known to pass (``passes_at``); the probes of the same
option and load kept from a question at another SLO tighten both where they answer
this one's (:func:`_bracketed`). The plan searches each model's baseline first and
starts the other options one below its answer
(:func:`plan_sizes`); the explore stage's variants start from the plan's answers.

**The options are searched in parallel**
(:func:`analyzer.advisor.probing.size_options`), probe by probe over ``jobs``
processes: the replays of one option depend on
each other and those of different options do not, and a process no search waits on
replays the count a search probably asks next.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from analyzer.advisor.decide import BASELINE
from analyzer.advisor.economics import load_figures
from analyzer.advisor.figures import Objective
from analyzer.advisor.plan import (
    Capacities,
    DeploymentPlan,
    Fleet,
    PlanLoad,
    PlanStatus,
    Tried,
    nodes_for,
    price,
)
from analyzer.advisor.price import OPTIONS
from analyzer.cost.model import CostModel
from analyzer.cost.prices import Prices
from analyzer.progress import progress
from analyzer.replay.config import ClusterConfig, ScenarioSpec, Tier
from analyzer.replay.engine import TraceTree
from analyzer.replay.memo import NotRemembered
from analyzer.replay.probe import Probe, probe
from analyzer.replay.run import _Memo, resolve
from analyzer.trace import BlockTrace

if TYPE_CHECKING:
    from analyzer.advisor.options import AnalyzeOptions
    from analyzer.advisor.price import ModelSetup, Priced
    from analyzer.advisor.replay import Replayed, ReplayTrace, Services


@dataclass(frozen=True, slots=True)
class SizeQuestion:
    """What one option's search asks: the fewest instances of ``spec`` on ``cfg``
    (whose ``instances`` is where the search starts) that keep p90 TTFT within
    ``ttft_slo_s`` with the log's gaps multiplied by ``time_scale``, up to ``cap``
    instances; above the cap it looks on up to ``beyond`` for the size that would."""

    spec: ScenarioSpec
    cfg: ClusterConfig
    cost: CostModel
    time_scale: float
    ttft_slo_s: float
    cap: int
    beyond: int | None = None
    # What the search knows before replaying (:class:`Hint`): ``cfg.instances`` is
    # probably the answer or just above it (``near``) or just below it (``gallop``),
    # counts up to ``fails_to`` fail, ``passes_at`` (when given) passes.
    near: bool = False
    gallop: bool = False
    fails_to: int = 0
    passes_at: int | None = None
    # A failing replay goes on until it has lost this looser SLO too (when the analysis
    # will ask it later, :func:`analyzer.replay.probe.probe`), else stops at its own.
    stop_slo_s: float | None = None
    # Probes of the same option, trace and load from earlier questions (another SLO):
    # a count one of them decides is not replayed again.
    known: tuple[Probe, ...] = field(default=(), compare=False, repr=False)

    @property
    def start(self) -> int:
        return max(1, min(self.cfg.instances, self.cap))


@dataclass(frozen=True, slots=True)
class Hint:
    """Where one (model, option) search starts and what it may take as known:

    * ``start``: the count to replay first; ``near``: it is probably the answer or just
      above, so after a pass ``n - 1`` is tried next, then one fewer again, then 2, 4,
      ... fewer (a right guess costs two replays);
      ``gallop``: it is probably the answer or just below, so after a failure the
      search steps up by 1, 2, 4, ... rather than doubling the count;
    * ``fails_to``: every count up to it fails without being replayed, because a search
      of an easier question (less load, a looser SLO, a faster pool link) found its
      answer at ``fails_to + 1``, and the harder question never needs fewer;
    * ``passes_at``: a count the answer is at most (an easier question's answer from a
      harder one), where the search's doubling stops; it is replayed, not assumed.
    """

    start: int
    near: bool = True
    gallop: bool = False
    fails_to: int = 0
    passes_at: int | None = None


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
    ask: Callable[[int], Probe],
    *,
    start: int,
    cap: int,
    beyond: int | None = None,
    near: bool = False,
    gallop: bool = False,
    fails_to: int = 0,
    passes_at: int | None = None,
) -> tuple[int | None, int | None, dict[int, Probe]]:
    """The smallest count in ``1..cap`` whose probe passes (None when ``cap`` fails),
    found by bracketing from ``start`` and bisecting (module docstring); when the cap
    fails and ``beyond`` is above it, the smallest passing count up to ``beyond``
    (None when that fails too). ``near``, ``gallop``, ``fails_to`` and ``passes_at``
    are a :class:`Hint`'s. Returns ``(within, above, probes by count)``; each count is asked
    at most once, and none up to ``fails_to``."""
    if cap < 1:
        raise ValueError("the cap must be at least one instance")
    known: dict[int, Probe] = {}
    floor = max(0, fails_to)

    def ok(n: int) -> bool:
        if n <= floor:
            return False
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

    def up_from(lo: int, top: int, step: int = 0) -> tuple[int | None, int]:
        """Up from a failing ``lo`` until a count passes or ``top`` fails, doubling the
        count (``step`` 0) or the step (``lo + step``, the step doubling each time: a
        close guess failed, so the answer is probably just above), no further than
        ``passes_at`` while below it: (the smallest passing, the last failing)."""
        while lo < top:
            up = min(top, lo + step if step else 2 * lo)
            if not step and 2 * up > top:
                up = top  # the doubling after this one would reach the top anyway
            if passes_at is not None and lo < passes_at:
                up = min(up, passes_at)
            if ok(up):
                return smallest(lo, up), lo
            lo = up
            step *= 2
        return None, lo

    top = max(cap, beyond or cap)
    if floor >= cap:  # nothing within the cap passes
        above, _ = up_from(floor, top)
        return None, above, known
    n = max(floor + 1, min(start, cap))
    lo, hi = floor, 0  # the largest count known to fail, the smallest known to pass
    if ok(n):
        hi = n
        steps = 0
        while hi - lo > 1:  # step down until a count fails
            if near:  # the guess was probably right: one fewer, one more, then 2, 4, ...
                down = max(lo + 1, hi - (1 if steps < 2 else 2 ** (steps - 1)))
                steps += 1
            else:
                down = max(lo + 1, _step_down(known[hi], hi))
            if ok(down):
                hi = down
            else:
                lo = down
                break
        return smallest(lo, hi), None, known
    within, lo = up_from(n, cap, 1 if gallop else 0)
    if within is not None:
        return within, None, known
    above, _ = up_from(lo, top)
    return None, above, known


def _step_down(passed: Probe, n: int) -> int:
    """Where to look below a passing count ``n``: the count that would keep the GPUs of
    the passing run busy all the time (fewer cannot serve its prefill work at all, so
    it fails, and the bracket is then tight), or half when the run does not say."""
    busy = passed.busy or 0.0
    if 0.0 < busy < 1.0:
        return max(1, min(n - 1, math.ceil(n * busy) - 1))
    return max(1, n // 2)


def at_slo(p: Probe, slo_s: float) -> Probe | None:
    """``p`` as a probe for ``slo_s`` would have answered, when it can say."""
    passed = p.passes(slo_s)
    if passed is None:
        return None
    return replace(p, ttft_slo_s=slo_s, passed=passed)


def size_option(
    trace: BlockTrace,
    q: SizeQuestion,
    sampling_rate: float = 1.0,
    only: int | None = None,
    replay_missing: bool = True,
) -> SizeSearch:
    """One option's search, every replay in this process (one remembered prefill time
    per chunk and one trace tree shared by its probes); ``only``: just that count.
    Without ``replay_missing`` a count ``q.known`` does not answer raises
    :class:`analyzer.replay.memo.NotRemembered` instead of being replayed."""

    tree: TraceTree | None = None
    memo = _Memo(q.cost.compute_time_s)
    before = {p.instances: p for p in q.known}

    def ask(n: int) -> Probe:
        nonlocal tree
        seen = before.get(n)
        if seen is not None:
            again = at_slo(seen, q.ttft_slo_s)
            if again is not None:
                return again
        if not replay_missing:
            raise NotRemembered([q.spec.name])
        tree = tree if tree is not None else TraceTree(trace)
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
            stop_slo_s=q.stop_slo_s,
        )

    if only is not None:
        one = ask(only)
        if one.passed and one.result is None:
            before.pop(only, None)
            one = ask(only)
        return SizeSearch(q.spec.name, q.cap, only if one.passed else None, None, (one,))
    fails_to, passes_at = _bracketed(q, before.values())
    within, above, known = search_question(ask, q, fails_to, passes_at)
    chosen = within if within is not None else above
    if chosen is not None and known[chosen].result is None:
        # answered by a remembered probe that kept no figures: replay that size for them
        before.pop(chosen, None)
        known[chosen] = ask(chosen)
    return SizeSearch(q.spec.name, q.cap, within, above, kept_probes(known, chosen))


def search_question(
    ask: Callable[[int], Probe], q: SizeQuestion, fails_to: int, passes_at: int | None
) -> tuple[int | None, int | None, dict[int, Probe]]:
    """:func:`search_size` from ``q``'s start, cap and hints, with ``fails_to`` and
    ``passes_at`` as the probes kept from earlier questions tightened them
    (:func:`_bracketed`)."""
    return search_size(
        ask,
        start=q.start,
        cap=q.cap,
        beyond=q.beyond,
        near=q.near,
        gallop=q.gallop,
        fails_to=fails_to,
        passes_at=passes_at,
    )


# A complete run's figures take about 30 bytes a measured request (its TTFTs, TPOTs and
# hits): up to this many requests a search keeps them whatever count it chooses, and a
# later question (the sensitivity table's looser SLO) that chooses that count takes
# them instead of replaying it; a longer log keeps the chosen count's only.
KEEP_FIGURES_REQUESTS = 20_000


def kept_probes(known: dict[int, Probe], chosen: int | None) -> tuple[Probe, ...]:
    """A search's probes by count, the chosen count's with its run's figures, and every
    other complete run's too while they are small (``KEEP_FIGURES_REQUESTS``)."""
    return tuple(
        p if p.instances == chosen or p.requests <= KEEP_FIGURES_REQUESTS else p.without_result()
        for _, p in sorted(known.items())
    )


def _bracketed(q: SizeQuestion, known: Iterable[Probe]) -> tuple[int, int | None]:
    """``q``'s ``fails_to`` and ``passes_at``, tightened by the probes of earlier
    questions that answer ``q``'s SLO (:func:`at_slo`): the largest count known to fail
    below the smallest known to pass, and that smallest."""
    fails: list[int] = []
    passes: list[int] = []
    for p in known:
        again = at_slo(p, q.ttft_slo_s)
        if again is not None:
            (passes if again.passed else fails).append(p.instances)
    top = min(passes, default=None)
    below = [n for n in fails if top is None or n < top]
    fails_to = max(q.fails_to, max(below, default=0))
    if top is not None and q.passes_at is not None:
        top = min(top, q.passes_at)
    return fails_to, top if top is not None else q.passes_at


@dataclass(frozen=True, slots=True)
class Search:
    """One search to run: ``question`` on ``trace`` (``part`` names its requests and
    ``sampling_rate`` says whether it is a miniature, as :class:`Replayer` takes them).
    ``after``: the index, in the same batch, of the baseline search this one starts from
    (:func:`start_after`); it runs once that one has answered. ``only``: not a search but
    the probe at that one count (:func:`size_option`)."""

    part: str | None
    trace: BlockTrace
    question: SizeQuestion
    sampling_rate: float = 1.0
    after: int | None = None
    only: int | None = None


def start_after(q: SizeQuestion, base_q: SizeQuestion, base: SizeSearch) -> SizeQuestion:
    """``q`` starting near where its model's baseline, asked the same question, ended.
    Unhinted (the plan): one below the baseline's answer, since an offload tier or a pool
    saves an instance or a few where it pays at all, and a guess a little low costs a
    failed replay, which stops early, where one a little high costs a whole passing one.
    Hinted (a variant, which starts from the plan's answer): its start moved as the
    baseline's answer moved from its own start, within the hint's bounds."""
    n = base.instances or base.above_cap
    if n is None:
        return q
    hinted = q.near or q.gallop or q.fails_to > 0 or q.passes_at is not None
    start = round(q.start * n / base_q.start) if hinted else n - 1
    start = max(q.fails_to + 1, min(start, q.passes_at or start))
    return replace(q, cfg=replace(q.cfg, instances=max(1, start)), near=True, gallop=True)


# -- the stage: every model's plan of every option ---------------------------------------

# The size search looks up to this many times the analysis cluster's GPUs (--instances x
# TP) unless --max-gpus says otherwise, and past the cap up to BEYOND times it for the
# size that would meet the SLO.
MAX_GPUS_MULTIPLE = 64
BEYOND = 8


@dataclass(frozen=True, slots=True)
class Sized:
    """Every model's plan of every option, and each option's fleet (the whole log)."""

    plans: tuple[DeploymentPlan, ...]
    fleets: tuple[Fleet, ...]

    def fleet(self, option: str) -> Fleet | None:
        return next((f for f in self.fleets if f.option == option), None)

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(f.option for f in self.fleets)


def max_gpus(opts: AnalyzeOptions) -> int:
    """The most GPUs a plan may use (``--max-gpus``; by default MAX_GPUS_MULTIPLE x the
    analysis cluster's)."""
    if opts.max_gpus is not None:
        return opts.max_gpus
    return MAX_GPUS_MULTIPLE * opts.cluster.instances * opts.cluster.tp


def plan_of(
    setup: ModelSetup,
    spec: ScenarioSpec,
    search: SizeSearch | None,
    load: PlanLoad,
    prices: Prices,
    slo_s: float,
    status: PlanStatus | None = None,
    cap: int = 0,
    floor_p90_s: float | None = None,
) -> DeploymentPlan:
    """The plan a search found (or, with ``status``, the plan of an option not searched:
    its tiers as they would be deployed, no size)."""

    cfg = setup.cluster
    n = None if search is None else search.instances
    if status is None:
        assert search is not None
        status = (
            PlanStatus.MEETS
            if n is not None
            else PlanStatus.ABOVE_CAP
            if search.above_cap is not None
            else PlanStatus.CANNOT_MEET
        )
    at = None if search is None else search.at_size
    run = None if at is None else at.result
    res = (
        run.resolved
        if run is not None
        else resolve(
            replace(cfg, instances=n or max(1, cap)), spec, setup.trace.block_size, cost=setup.cost
        )
    )
    c = res.cluster
    caps = Capacities(
        bytes_per_token=int(setup.cost.bytes_per_token),
        hbm_per_instance=int(res.local_capacity_tokens or 0),
        dram_per_node=res.dram_capacity_tokens,
        dram_per_instance=res.dram_per_cache_tokens if c.dram_scope == "instance" else None,
        nvme_per_node=res.nvme_capacity_tokens,
        pool=res.pool_capacity_tokens,
    )
    money = price(
        spec.name,
        instances=n,
        tp=setup.tp,
        gpus_per_node=cfg.gpus_per_node,
        capacities=caps,
        prices=prices,
        gpu=cfg.gpu,
    )
    read = 0.0
    if run is not None:
        nodes = nodes_for(run.resolved.cluster.instances, setup.tp, cfg.gpus_per_node)
        span = run.makespan_s
        read = run.bytes_read_by_tier[Tier.POOL] / span / nodes if span > 0 else 0.0
    return DeploymentPlan(
        option=spec.name,
        model=setup.model,
        served_as=setup.choice.served_as,
        gpu=cfg.gpu,
        tp=setup.tp,
        gpus_per_node=cfg.gpus_per_node,
        router=cfg.router,
        status=status,
        instances=n,
        capacities=caps,
        load=load,
        ttft_slo_s=slo_s,
        money=money,
        ttft=None if run is None else run.ttft,
        hit_rate=None if run is None else run.hit_rate,
        hit_rate_by_tier=()
        if run is None
        else tuple((str(t), float(v)) for t, v in run.hit_rate_by_tier.items()),
        instances_above_cap=None if search is None else search.above_cap,
        cap_instances=cap if search is None else search.cap,
        tried=()
        if search is None
        else tuple(
            Tried(p.instances, p.passed, p.ttft.p90_s if p.complete else None)
            for p in search.probes
        ),
        ttft_s=None if run is None else run.stats.ttft_s,
        pool_read_bytes_per_s_per_node=read,
        network_bytes=0.0 if run is None else run.network_bytes,
        prompt_tokens=0 if run is None else int(run.stats.prompt_tokens),
        cross_tenant_hit_share=None if run is None else run.cross_tenant_hit_share,
        floor_p90_s=floor_p90_s,
        run=run,
    )


def model_load(setup: ModelSetup, window_s: float, factor: float = 1.0) -> PlanLoad:
    """The load a model's plan serves: its busiest window's, x ``factor`` (a what-if),
    replayed with the log's gaps divided by that factor too."""
    lf = load_figures(setup.trace.arrival_s, window_s)
    return PlanLoad(lf.mean_rps * factor, lf.peak_rps * factor, window_s, factor)


@dataclass(frozen=True, slots=True)
class Ask:
    """One (model, option) of a plan or a variant of it: the search question (None: the
    model's floor already misses the SLO, so nothing is searched) and what its plan needs."""

    setup: ModelSetup
    trace: ReplayTrace
    spec: ScenarioSpec
    load: PlanLoad
    slo_s: float
    cap: int
    floor_p90_s: float | None
    question: SizeQuestion | None
    prices: Prices


def asks(
    priced: Priced,
    replayed: Replayed,
    opts: AnalyzeOptions,
    *,
    options: Sequence[str] = (),
    load_factor: float = 1.0,
    ttft_slo_s: float | None = None,
    hints: dict[tuple[str, str], Hint] | None = None,
    look_beyond: bool = True,
    cap_instances: int | None = None,
    stop_slo_s: float | None = None,
) -> list[Ask]:
    """The questions of every model's plan of every option (``options``: those only), at
    the busiest window's load (x ``load_factor``) and ``ttft_slo_s`` (default: the
    analysis's); ``hints``: where each (model, option) search starts and what it knows
    (default: it starts at ``--instances`` and knows nothing). Without ``look_beyond`` a
    search that finds no count within the cap ends there, not saying which size above
    it would meet the SLO. ``cap_instances``: the most instances searched, when fewer
    than ``--max-gpus`` allows. ``stop_slo_s``: a looser SLO a later question will ask
    of the same sizes, which failing replays run on to lose (:class:`SizeQuestion`)."""

    slo = opts.ttft_slo_s if ttft_slo_s is None else ttft_slo_s
    wanted = tuple(options) or OPTIONS
    top = max_gpus(opts)
    known = hints or {}
    out: list[Ask] = []
    for k, (setup, rt) in enumerate(zip(priced.setups, replayed.traces, strict=True)):
        load = model_load(setup, opts.peak_window_s, load_factor)
        cap = max(1, top // setup.tp)
        if cap_instances is not None:
            cap = max(1, min(cap, cap_instances))
        floor = replayed.floors[k] if k < len(replayed.floors) else None
        low = None if floor is None else floor.p90_s
        bound = floor is not None and floor.p90_s > slo
        for o in wanted:
            spec = setup.spec(o)
            h = known.get((setup.model, o), Hint(setup.cluster.instances, near=False))
            q = (
                None
                if bound
                else SizeQuestion(
                    spec,
                    replace(setup.cluster, instances=max(1, h.start)),
                    setup.cost,
                    load.time_scale,
                    slo,
                    cap=cap,
                    beyond=min(4096, BEYOND * cap) if look_beyond else None,
                    near=h.near,
                    gallop=h.gallop,
                    fails_to=h.fails_to,
                    passes_at=h.passes_at,
                    stop_slo_s=stop_slo_s,
                )
            )
            out.append(Ask(setup, rt, spec, load, slo, cap, low, q, priced.prices))
    return out


def _same_question(a: Ask, b: Ask) -> bool:
    """Whether ``a`` and ``b`` ask of the same model, trace, load and SLO (one plan or
    one variant of it)."""
    return a.setup is b.setup and a.load == b.load and a.slo_s == b.slo_s and a.trace is b.trace


def answer(
    batch: Sequence[Ask],
    services: Services,
    objective: Objective,
    *,
    baseline_first: bool = False,
    also: Sequence[Search] = (),
) -> list[DeploymentPlan]:
    """Every ask's plan, in order. The searches go to the replayer together (so they run
    in parallel); with ``baseline_first`` each model's baseline is searched first and
    the other options start at its answer (:func:`start_after`). A latency-first
    objective plans each option on at least its baseline's instances. ``also``: searches
    for a later stage, sent behind these (a process the baseline leaves idle runs them;
    the replayer remembers their answers)."""
    index: dict[int, int] = {}  # batch position -> its search's
    searches: list[Search] = []
    for i, a in enumerate(batch):
        if a.question is not None:
            index[i] = len(searches)
            searches.append(Search(a.trace.part, a.trace.trace, a.question, a.trace.sampling_rate))
    if baseline_first:
        for i, a in enumerate(batch):
            if i not in index or a.spec.name == BASELINE:
                continue
            j = next(
                (
                    j
                    for j, b in enumerate(batch)
                    if j in index and b.spec.name == BASELINE and _same_question(a, b)
                ),
                None,
            )
            if j is not None:
                searches[index[i]] = replace(searches[index[i]], after=index[j])
    got = services.replayer.size([*searches, *also])
    found = {i: got[k] for i, k in index.items()}
    if objective == Objective.TTFT:
        _match_baseline(batch, found, services)
    out = []
    for i, a in enumerate(batch):
        if a.question is None:
            out.append(
                plan_of(
                    a.setup,
                    a.spec,
                    None,
                    a.load,
                    a.prices,
                    a.slo_s,
                    PlanStatus.PREFILL_BOUND,
                    a.cap,
                    a.floor_p90_s,
                )
            )
        else:
            out.append(
                plan_of(
                    a.setup, a.spec, found[i], a.load, a.prices, a.slo_s, floor_p90_s=a.floor_p90_s
                )
            )
    return out


def sized_of(plans: Sequence[DeploymentPlan]) -> Sized:
    """The plans and each option's fleet (options in the plans' order). One KV store
    serves every model's pool: each model's pooled plan carries an equal share of the
    store's servers, so the fleet's money is the sum of its plans'."""
    order: list[str] = []
    for p in plans:
        if p.option not in order:
            order.append(p.option)
    models = {p.option: sum(1 for q in plans if q.option == p.option) for p in plans}
    plans = [
        repriced_share(p, 1.0 / models[p.option]) if models[p.option] > 1 else p for p in plans
    ]
    fleets = tuple(Fleet.of(o, tuple(p for p in plans if p.option == o)) for o in order)
    return Sized(tuple(plans), fleets)


def plan_sizes(
    priced: Priced,
    replayed: Replayed,
    opts: AnalyzeOptions,
    services: Services,
    *,
    options: Sequence[str] = (),
    load_factor: float = 1.0,
    ttft_slo_s: float | None = None,
    hints: dict[tuple[str, str], Hint] | None = None,
    also: Sequence[Search] = (),
    stop_slo_s: float | None = None,
) -> Sized:
    """Every model's plan of every option (:func:`asks`; a model whose floor misses the
    SLO is planned without a search: no size meets it). Without ``hints`` each model's
    baseline is searched first and the other options start at its answer. ``also``:
    :func:`answer`'s; ``stop_slo_s``: :func:`asks`'."""
    batch = asks(
        priced,
        replayed,
        opts,
        options=options,
        load_factor=load_factor,
        ttft_slo_s=ttft_slo_s,
        hints=hints,
        stop_slo_s=stop_slo_s,
    )
    with progress("sizing every option by replaying", None):
        plans = answer(
            batch, services, opts.thresholds.objective, baseline_first=not hints, also=also
        )
    return sized_of(plans)


def _match_baseline(batch: Sequence[Ask], found: dict[int, SizeSearch], services: Services) -> None:
    """For a latency-first team (``--objective ttft``): every option that needs fewer
    instances than its model's baseline is planned on the baseline's, its TTFT replayed
    there (a team keeps its GPUs and buys latency)."""

    for i, a in enumerate(batch):
        f = found.get(i)
        if f is None or f.instances is None or a.spec.name == BASELINE:
            continue
        base = next(
            (
                found.get(j)
                for j, b in enumerate(batch)
                if b.setup is a.setup
                and b.spec.name == BASELINE
                and b.load == a.load
                and b.slo_s == a.slo_s
                and b.trace is a.trace
            ),
            None,
        )
        if base is None or base.instances is None or f.instances >= base.instances:
            continue
        q = a.question
        assert q is not None
        p = services.replayer.probe(
            a.trace.part, a.trace.trace, q, base.instances, a.trace.sampling_rate
        )
        if not (p.passed and p.result is not None):
            continue
        kept = tuple(x for x in f.probes if x.instances != p.instances)
        probes = tuple(sorted((*kept, p), key=lambda x: x.instances))
        found[i] = replace(f, instances=base.instances, probes=probes)


def repriced_share(p: DeploymentPlan, share: float) -> DeploymentPlan:
    """``p`` carrying ``share`` of the one KV store's servers."""
    money = replace(p.money, store_usd_month=p.money.store_usd_month / p.store_share * share)
    return replace(p, store_share=share, money=money)
