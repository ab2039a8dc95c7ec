"""`run_analysis`: the log to a plan per option and a verdict, in named stages.

    measure -> price -> replay -> size -> decide -> explore -> deliver

Each stage is a module of :mod:`analyzer.advisor` that takes the earlier stages' frozen
records and returns its own: :mod:`~analyzer.advisor.measure` (the log, its reuse, its
models, its arrivals), :mod:`~analyzer.advisor.price` (each model on the GPU, the
break-even bandwidth, the prices), :mod:`~analyzer.advisor.replay` (how questions reach
the replay, the floor no size goes below, today's deployment), :mod:`~analyzer.advisor.size`
(every option's plan, found by replaying at size), :mod:`~analyzer.advisor.decide` (the
verdict), :mod:`~analyzer.advisor.explore` (what would flip it, other GPUs and models,
the arrivals' effect) and :mod:`~analyzer.advisor.deliver` (sizing, settings, deploy/,
gates, pilot commands). A caller plugs its own replayer and remembered reuse figures in
through :class:`~analyzer.advisor.replay.Services`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from analyzer.advisor.decide import CostUncertainty, decide_stage
from analyzer.advisor.deliver import deliver
from analyzer.advisor.economics import LoadFigures, load_figures
from analyzer.advisor.explore import explore, loosest_slo_s, side_floor_searches
from analyzer.advisor.figures import (
    AnalyzedInput,
    BandwidthFigures,
    BreakEvenPoint,
    CostFigures,
    Decision,
    PricedChoice,
    ReplayFigures,
    ReuseFigures,
    ScenarioFigures,
    SkippedRows,
    TokenCounting,
    TraceFigures,
    Verdict,
)
from analyzer.advisor.isolation import isolation_stage
from analyzer.advisor.measure import Arrivals, measure
from analyzer.advisor.models import ModelChoice, _shown_model
from analyzer.advisor.options import AnalyzeOptions as AnalyzeOptions
from analyzer.advisor.price import Priced, price, unpriced_nic
from analyzer.advisor.replay import Floor, LocalReplayer, Services, replay
from analyzer.advisor.salting import bundle_stacks
from analyzer.advisor.served import served_model
from analyzer.advisor.size import Sized, plan_sizes
from analyzer.cost import get_gpu, get_model
from analyzer.cost.prices import Prices, resolve_prices
from analyzer.cost.reference import warm_default_check
from analyzer.progress import Advance
from analyzer.replay.config import ClusterConfig, Tier

if TYPE_CHECKING:
    from analyzer.advisor import gates as gates_mod
    from analyzer.advisor.current import MeasuredAgainstProjected
    from analyzer.advisor.deploy import DeployFile, PerProcessRow
    from analyzer.advisor.explore import ArrivalsEffect
    from analyzer.advisor.isolation import IsolationFigures
    from analyzer.advisor.models import ModelsFigures
    from analyzer.advisor.pilot import PilotCommand
    from analyzer.advisor.plan import DeploymentPlan, Fleet
    from analyzer.advisor.products import ProductSettings
    from analyzer.advisor.sensitivity import FlipRow
    from analyzer.advisor.sizing import Sizing
    from analyzer.ingest import LoadedTrace
    from analyzer.ingest.kvrebuild import EngineEvents
    from analyzer.replay.miniature import Miniature
    from analyzer.reuse import ReuseReport


@dataclass(frozen=True, slots=True)
class AnalysisResult:
    """What one analysis found, stage by stage, as frozen records; the report's JSON is
    made from it in :mod:`analyzer.report.document` only. ``plans`` are every model's
    plan of every option and ``fleets`` each option for the whole log: every count,
    TTFT and amount of money an output shows is one of theirs."""

    options: AnalyzeOptions
    inputs: tuple[AnalyzedInput, ...]
    trace: TraceFigures
    reuse: ReuseFigures
    bandwidth: BandwidthFigures | None
    decision: Decision
    sizing: Sizing | None
    settings: tuple[ProductSettings, ...]
    flips: tuple[FlipRow, ...]
    gates: tuple[gates_mod.Gate, ...]
    skipped: SkippedRows
    reuse_report: ReuseReport
    cost: CostFigures | None
    break_even_curve: tuple[BreakEvenPoint, ...]
    prices: Prices
    load: LoadFigures
    cluster: ClusterConfig | None = None  # the primary model's cluster, as planned
    choices: tuple[ModelChoice, ...] = ()
    plans: tuple[DeploymentPlan, ...] = ()
    fleets: tuple[Fleet, ...] = ()
    floors: tuple[tuple[str, Floor], ...] = ()  # per model: the lowest p90 any size reaches
    arrivals: Arrivals | None = None
    arrivals_effect: ArrivalsEffect | None = None
    runner_up: str | None = None
    miniatures: tuple[Miniature | None, ...] = ()  # per model, when its replay was sampled
    side_by_side: tuple[PricedChoice, ...] = ()
    uncertainty: CostUncertainty | None = None  # ranges from the cost model's measured error
    tokenization: TokenCounting = field(default_factory=TokenCounting)
    models: ModelsFigures | None = None  # per-model figures (advisor.models)
    measured: MeasuredAgainstProjected | None = None  # the log's hit rate beside the replay's
    engine_events: EngineEvents | None = None  # a KV-event recording's own figures
    warnings: tuple[str, ...] = ()
    pilot: tuple[PilotCommand, ...] = ()
    deploy: tuple[DeployFile, ...] = ()
    per_process: tuple[PerProcessRow, ...] = ()  # deploy.per_process
    # Every option under each isolation policy (advisor.isolation); None: nothing sized.
    isolation: IsolationFigures | None = None

    @property
    def verdict(self) -> str:
        return self.decision.verdict

    def fleet(self, option: str) -> Fleet | None:
        return next((f for f in self.fleets if f.option == option), None)

    @property
    def replay(self) -> ReplayFigures | None:
        """Each option's replay at its planned size (None: nothing was sized)."""
        if not self.fleets:
            return None
        out = []
        for f in self.fleets:
            t = f.ttft
            out.append(
                ScenarioFigures(
                    name=f.option,
                    hit_rate=f.hit_rate or 0.0,
                    ttft_mean_s=(t.mean_s or 0.0) if t else 0.0,
                    ttft_p90_s=(t.p90_s or 0.0) if t else 0.0,
                    ttft_p99_s=(t.p99_s or 0.0) if t else 0.0,
                    max_rate_scale=None,
                    pool_hit_rate=f.tier_hit_rate(Tier.POOL),
                    dram_hit_rate=f.tier_hit_rate(Tier.DRAM),
                    network_bytes=f.network_bytes,
                )
            )
        return ReplayFigures(
            scenarios=tuple(out),
            ttft_slo_s=self.options.ttft_slo_s,
            dram_scope=self.options.dram_scope,
        )


def _check_early(opts: AnalyzeOptions) -> None:
    """Catalog lookups and the cluster's checks first, so an unknown model or GPU, router
    or node shape fails before any work (not after minutes of reading a large log)."""

    get_gpu(opts.gpu)
    if opts.model_given and opts.profile is None:
        served_model(get_model(opts.model), opts.model)  # what launch scripts name
    resolve_prices(opts.gpu, opts.prices)


def _warnings(
    choices: tuple[ModelChoice, ...], opts: AnalyzeOptions, priced: Priced | None = None
) -> list[str]:
    """Whole sentences for stderr and the report."""

    out: list[str] = []
    if priced is not None and (nic := unpriced_nic(priced)) is not None:
        out.append(nic)
    if opts.only_model is not None and choices and choices[0].served_as:
        c = choices[0]
        out.append(
            f"Only {c.served_as} is planned (--only-model), as {_shown_model(c.model)}: "
            f"{c.requests:,} requests; the log's other models are left out."
        )
    for c in choices:
        if c.how.startswith("the default"):
            out.append(
                f"The log names no model, so it is planned as {_shown_model(c.model)}; give "
                "--model for the model you serve."
            )
    return out


def run_analysis(
    paths: list[str] | str,
    opts: AnalyzeOptions | None = None,
    advance: Advance | None = None,
    loaded: LoadedTrace | None = None,
    services: Services | None = None,
    replayer: LocalReplayer | None = None,
) -> AnalysisResult:
    """The whole pipeline, stage by stage (module docstring); ``advance`` (if given)
    receives percentage points (100 in all).

    ``loaded`` is what ``open_trace(paths, ...)`` already returned, for a caller that
    ingested the logs itself (the dashboard): ingestion is then skipped, so the options'
    ``ingest`` plays no part, and ``paths`` (its ``sources``) only name the files in the
    report. ``services``: the caller's replayer and remembered reuse figures. Without
    them, ``replayer``: one the caller made (and may have started, so that its workers
    start while the caller imports), run and closed as the analysis's own."""
    opts = opts or AnalyzeOptions()
    if services is None:
        own = replayer if replayer is not None else LocalReplayer(opts.ingest.jobs)
        if opts.size_search:
            own.start()  # its workers start while the log is read and measured
        try:
            return _run(paths, opts, advance, loaded, Services(own), own)
        finally:
            own.close()
    return _run(paths, opts, advance, loaded, services, None)


def _run(
    paths: list[str] | str,
    opts: AnalyzeOptions,
    advance: Advance | None,
    loaded: LoadedTrace | None,
    services: Services,
    own: LocalReplayer | None,
) -> AnalysisResult:
    """:func:`run_analysis` with its services; ``own``: the replayer it started, whose
    worker processes stop once the sizing is done (the isolation stage starts them
    again only if it replays)."""
    step = advance or (lambda _n: None)
    plist = [paths] if isinstance(paths, str) else [str(p) for p in paths]
    if loaded is not None and plist != loaded.sources:
        raise ValueError(f"paths {plist} are not the loaded trace's sources {loaded.sources}")
    _check_early(opts)

    m = measure(plist, opts, loaded=loaded, reuse=services.reuse, models=services.models)
    choices = m.choices
    step(20)
    priced = price(m, choices, opts)
    tf, rf, th = m.trace_figures, m.reuse, opts.thresholds
    usable = not (tf.count_only or tf.n_requests < th.min_requests or not rf.measurable)
    replayed = replay(m, priced, opts, services, usable)
    step(10)
    sized: Sized | None = None
    if usable and opts.size_search:
        warm_default_check()  # the decision's error band, computed while the replays run
        early = side_floor_searches(m, priced, replayed, opts) if opts.ingest.jobs > 1 else []
        sized = plan_sizes(
            priced, replayed, opts, services, also=early, stop_slo_s=loosest_slo_s(opts)
        )
    step(40)
    decision, uncertainty = decide_stage(m, priced, sized, replayed, opts)
    explored = None
    if sized is not None and decision.verdict != Verdict.INSUFFICIENT_DATA:
        explored = explore(m, priced, replayed, sized, decision, opts, services)
    if own is not None:
        own.close()  # idle from here on: ~400 MB of workers beside the last stages
    step(25)
    out = deliver(m, priced, sized, decision, opts)
    planned = sized if decision.verdict != Verdict.INSUFFICIENT_DATA else None
    products = bundle_stacks((f.option, f.stack) for f in out.deploy)
    isolation = isolation_stage(plist, m, opts, services, planned, products, decision.scenario)
    step(5)
    trace = m.trace
    return AnalysisResult(
        options=opts,
        inputs=m.inputs,
        trace=tf,
        reuse=rf,
        bandwidth=priced.bandwidth,
        decision=decision,
        sizing=out.sizing,
        settings=out.settings,
        flips=() if explored is None else explored.flips,
        gates=out.gates,
        skipped=m.skipped,
        reuse_report=m.reuse_report,
        cost=priced.cost if usable else None,
        break_even_curve=priced.break_even_curve,
        prices=priced.prices,
        load=load_figures(trace.arrival_s, opts.peak_window_s),
        cluster=priced.primary.cluster,
        choices=choices,
        plans=() if sized is None else sized.plans,
        fleets=() if sized is None else sized.fleets,
        floors=tuple((s.model, f) for s, f in zip(priced.setups, replayed.floors, strict=False)),
        arrivals=m.arrivals,
        arrivals_effect=None if explored is None else explored.arrivals,
        runner_up=out.runner_up,
        miniatures=tuple(t.miniature for t in replayed.traces),
        side_by_side=() if explored is None else explored.side_by_side,
        uncertainty=uncertainty,
        tokenization=TokenCounting(
            tokenizer=trace.meta.get("tokenizer", ""),
            template=trace.meta.get("template", ""),
        ),
        models=m.models,
        measured=replayed.measured,
        engine_events=(
            None
            if m.loaded.engine is None
            else replace(m.loaded.engine, bytes_per_token=int(priced.primary.cost.bytes_per_token))
        ),
        warnings=tuple(_warnings(choices, opts, priced)),
        pilot=out.pilot,
        deploy=out.deploy,
        per_process=out.per_process,
        isolation=isolation,
    )
