"""`run_analysis`: log -> reuse -> cost -> replay -> verdict, sizing, settings, gates.

Each stage is called through its pinned API (ingest ``open_trace``, reuse
``analyze_reuse``, cost ``CostModel``, replay ``run_replay``); this module only turns
their outputs into the small records of :mod:`analyzer.advisor.figures` and calls the
pure decision, sizing, sensitivity and gate functions on them.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from analyzer.advisor import gates as gates_mod
from analyzer.advisor.decide import decide
from analyzer.advisor.deploy import (
    DeployFile,
    PerProcessRow,
    bundle,
    deploy_sizings,
    per_process,
)
from analyzer.advisor.economics import (
    PEAK_WINDOW_S,
    EconomicsInputs,
    OptionResources,
    load_figures,
    scaled,
)
from analyzer.advisor.figures import (
    VERDICT_SCENARIO,
    AnalyzedInput,
    BandwidthFigures,
    BreakEvenPoint,
    CostFigures,
    Decision,
    DeployOption,
    Objective,
    PricedChoice,
    PricedOption,
    ReplayFigures,
    ReuseFigures,
    ScenarioFigures,
    SkippedRows,
    Thresholds,
    TierFigure,
    TokenCounting,
    TraceFigures,
    Verdict,
)
from analyzer.advisor.pilot import PilotCommand, pilot_commands
from analyzer.advisor.products import ProductSettings, translate
from analyzer.advisor.sensitivity import (
    FlipRow,
    Variant,
    bandwidth_variant,
    flip_table,
    hardware_variant,
    reuse_variant,
)
from analyzer.advisor.served import model_label, served_model
from analyzer.advisor.sizing import ClusterFigures, Sizing, size
from analyzer.cost.prices import PriceOverrides, Prices, resolve_prices
from analyzer.errors import UsageError, shown
from analyzer.ingest.options import IngestOptions
from analyzer.ingest.pipeline import release_freed_memory
from analyzer.progress import Advance, progress
from analyzer.replay.config import ClusterConfig, Scenario, Tier
from analyzer.trace import BlockTrace, read_metadata

if TYPE_CHECKING:
    from analyzer.advisor.current import MeasuredAgainstProjected
    from analyzer.advisor.models import ModelsFigures
    from analyzer.cost import CostModel
    from analyzer.cost.uncertainty import ErrorBand, FlipFinding, Range
    from analyzer.ingest import LoadedTrace
    from analyzer.ingest.kvevents import EngineEvents
    from analyzer.replay import ReplayResult
    from analyzer.reuse import ReuseReport

SCENARIOS = (
    Scenario.NONE,
    Scenario.LOCAL,
    Scenario.LOCAL_DRAM,
    Scenario.LOCAL_DRAM_NVME,
    Scenario.POOLED,
)
REUSE_FACTORS = (0.25, 0.5, 0.75, 1.5)
ALT_MODELS = ("llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b", "deepseek-v3")
ALT_GPUS = ("a100", "h100", "h200", "b200")
# Instance-count re-runs in the sensitivity table are skipped for traces beyond this.
MAX_SENSITIVITY_ACCESSES = 3_000_000


@dataclass(frozen=True, slots=True)
class AnalyzeOptions:
    """One ``kvpool analyze`` run: how the logs are read (:class:`IngestOptions`), the
    cluster they are replayed on (:class:`ClusterConfig`, whose ``warmup_fraction`` also
    sets the reuse analysis's warm-up), and what the advisor adds on top.

    The defaults are the library's own (``IngestOptions()``, ``ClusterConfig()``), which
    the CLI flags and the dashboard's controls also start from.
    """

    ingest: IngestOptions = field(default_factory=IngestOptions)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    ttft_slo_s: float = 2.0
    only_model: str | None = None  # analyze one of the log's models alone
    # Today's deployment, replayed beside the hits the log measured (None: as `cluster`).
    current_instances: int | None = None
    current_router: str | None = None
    current_local_capacity_tokens: int | None = None
    profile: str | None = None  # a `kvpool cost profile` / `kvpool cost fit` JSON
    search_rate: bool = True
    full_replay: bool = False  # replay every request, also above the miniature's size
    sensitivity_replays: bool = True
    knee_fraction: float = 0.9
    thresholds: Thresholds = field(default_factory=Thresholds)
    peak_window_s: float = PEAK_WINDOW_S
    prices: PriceOverrides = field(default_factory=PriceOverrides)
    # Who may share KV blocks (analyzer/reuse/isolation.py): every figure is measured
    # under it, and the report's isolation section compares it with the others.
    isolation: str = "shared"

    def __post_init__(self) -> None:
        from analyzer.reuse.isolation import check_policy

        check_policy(self.isolation)
        if not (self.peak_window_s > 0 and math.isfinite(self.peak_window_s)):
            raise UsageError(
                f"--peak-window must be a positive number of seconds, got {self.peak_window_s}"
            )
        if not (self.ttft_slo_s > 0 and math.isfinite(self.ttft_slo_s)):
            raise UsageError(f"--ttft-slo must be a positive number, got {self.ttft_slo_s}")
        if not 0.0 < self.knee_fraction <= 1.0:
            raise UsageError("knee fraction must be in (0, 1]")
        from analyzer import limits

        # The cluster's and the ingest's numbers are checked by their own options.
        limits.check(self.ttft_slo_s, "ttft_slo_s", "--ttft-slo")
        from analyzer.replay.config import ROUTERS

        if self.current_instances is not None:
            limits.check(self.current_instances, "instances", "--current-instances")
        if self.current_router is not None and self.current_router not in ROUTERS:
            raise UsageError(
                f"unknown --current-router {self.current_router!r}; choose one of {ROUTERS}"
            )

    # Read-only views of the composed options, under the names the advisor uses.
    @property
    def model(self) -> str:
        return self.cluster.model

    @property
    def gpu(self) -> str:
        return self.cluster.gpu

    @property
    def tp(self) -> int:
        return self.cluster.tp

    @property
    def instances(self) -> int:
        return self.cluster.instances

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node

    @property
    def dram_scope(self) -> str:
        return self.cluster.dram_scope

    @property
    def tokenizer(self) -> str:
        return self.ingest.tokenizer

    @property
    def kv_dtype(self) -> str:
        return self.cluster.kv_dtype

    @property
    def mfu(self) -> float | None:
        return self.cluster.mfu

    @property
    def weights_dtype(self) -> str | None:
        return self.cluster.weights_dtype

    @property
    def router(self) -> str:
        return self.cluster.router

    @property
    def pool_gbps(self) -> float | None:
        return self.cluster.pool_gbps

    @property
    def pool_tier(self) -> str:
        return self.cluster.pool_tier

    @property
    def dram_tier(self) -> str:
        return self.cluster.dram_tier

    @property
    def local_capacity_tokens(self) -> int | None:
        return self.cluster.local_capacity_tokens

    @property
    def dram_capacity_tokens(self) -> int | None:
        return self.cluster.dram_capacity_tokens

    @property
    def pool_capacity_tokens(self) -> int | None:
        return self.cluster.pool_capacity_tokens

    @property
    def warmup(self) -> float:
        return self.cluster.warmup_fraction

    @property
    def block_size(self) -> int | None:
        return self.ingest.block_size


@dataclass(frozen=True, slots=True)
class AnalysisResult:
    """What one analysis found, stage by stage, as frozen records; the report's JSON is
    made from it in :mod:`analyzer.report.document` only."""

    options: AnalyzeOptions
    inputs: tuple[AnalyzedInput, ...]
    trace: TraceFigures
    reuse: ReuseFigures
    bandwidth: BandwidthFigures | None
    replay: ReplayFigures | None
    decision: Decision
    sizing: Sizing | None
    settings: tuple[ProductSettings, ...]
    flips: tuple[FlipRow, ...]
    gates: tuple[gates_mod.Gate, ...]
    skipped: SkippedRows
    reuse_report: ReuseReport
    replay_result: ReplayResult | None
    cost: CostFigures | None
    break_even_curve: tuple[BreakEvenPoint, ...]
    economics: EconomicsInputs | None = None
    side_by_side: tuple[PricedChoice, ...] = ()
    uncertainty: CostUncertainty | None = None  # ranges from the cost model's measured error
    # how prompts were tokenized: the trace's tokenizer and template names
    tokenization: TokenCounting = field(default_factory=TokenCounting)
    models: ModelsFigures | None = None  # per-model figures (advisor.models)
    measured: MeasuredAgainstProjected | None = None  # the log's hit rate beside the replay's
    engine_events: EngineEvents | None = None  # a KV-event recording's own figures
    warnings: tuple[str, ...] = ()
    pilot: tuple[PilotCommand, ...] = ()
    deploy: tuple[DeployFile, ...] = ()
    per_process: tuple[PerProcessRow, ...] = ()  # deploy.per_process

    @property
    def verdict(self) -> str:
        return self.decision.verdict


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def reusable_prefix_percentiles(trace: BlockTrace, warmup: float) -> tuple[int, int]:
    """Token-weighted 50th and 25th percentiles of the reusable prefix per request.

    A request's reusable prefix is its leading run of blocks seen in any earlier
    request, capped at ``prompt - 1`` (the last token is always recomputed): its prefix
    hits with unlimited capacity (:func:`analyzer.reuse.analysis.prefix_hit_tokens`).
    Each request is weighted by its reusable tokens, so the figure is the prefix length
    at which half of the reusable tokens sit.
    """
    n = trace.n_requests
    if n == 0 or trace.n_accesses == 0:
        return 0, 0
    from analyzer.reuse.analysis import first_counted_request, prefix_hit_tokens

    hit = prefix_hit_tokens(trace)
    start = first_counted_request(n, warmup)
    h = hit[start:]
    h = h[h > 0]
    if h.size == 0:
        return 0, 0
    order = np.sort(h)
    cum = np.cumsum(order)
    total = cum[-1]

    def q(f: float) -> int:
        return int(order[int(np.searchsorted(cum, f * total, side="left"))])

    return q(0.5), q(0.25)


def _trace_figures(loaded: LoadedTrace) -> TraceFigures:
    t: BlockTrace = loaded.trace
    n = t.n_requests
    approx = False
    if "approx_lengths" in loaded.table.column_names and loaded.table.num_rows:
        import pyarrow.compute as pc

        approx = bool(pc.any(loaded.table.column("approx_lengths")).as_py())
    total = int(t.prompt_tokens.sum()) if n else 0
    return TraceFigures(
        n_requests=n,
        count_only=bool(t.count_only),
        duration_s=float(t.arrival_s[-1] - t.arrival_s[0]) if n else 0.0,
        prompt_tokens_total=total,
        mean_prompt_tokens=total / n if n else 0.0,
        block_size=t.block_size,
        approx_lengths=approx,
        skipped_lines=int(loaded.skipped.total),
        sessions_known=bool((t.session >= 0).any()) if n else False,
        tenants_known=bool((t.tenant >= 0).any()) if n else False,
    )


def _reuse_figures(
    rep: ReuseReport, trace: BlockTrace, warmup: float, knee_fraction: float
) -> ReuseFigures:
    if not rep.measurable:
        return ReuseFigures(measurable=False, warmup=warmup, reason=rep.reason)
    med, p25 = reusable_prefix_percentiles(trace, warmup)
    src = rep.sources.share_of_hits if rep.sources is not None else {}
    return ReuseFigures(
        measurable=True,
        ceiling_hit_rate=float(rep.ceiling_hit_rate),
        cold_ceiling_hit_rate=float(rep.cold_ceiling_hit_rate),
        warmup=warmup,
        knee_tokens=int(rep.knee_tokens(knee_fraction)),
        knee_fraction=knee_fraction,
        footprint_tokens=int(rep.footprint_tokens),
        median_prefix_tokens=med,
        p25_prefix_tokens=p25,
        same_session_share=float(src.get("same_session", 0.0)),
        same_tenant_share=float(src.get("same_tenant", 0.0)),
        cross_tenant_share=float(src.get("cross_tenant", 0.0)),
    )


def _cost(
    model: str,
    gpu: str,
    tp: int,
    kv_dtype: str,
    mfu: float | None,
    weights_dtype: str | None = None,
) -> CostModel:
    from analyzer.cost import CostModel

    return CostModel.from_catalog(
        model, gpu, tp=tp, kv_dtype=kv_dtype, mfu=mfu, weight_dtype=weights_dtype
    )


def _options_cost(opts: AnalyzeOptions) -> tuple[CostModel, AnalyzeOptions]:
    """The cost model of the options, and the options it implies.

    With a profile, the model, GPU and TP are the profile's (the command checks that any
    given explicitly agree), so the replay's cluster is the measured one.
    """
    if opts.profile is None:
        cm = _cost(opts.model, opts.gpu, opts.tp, opts.kv_dtype, opts.mfu, opts.weights_dtype)
        return cm, opts
    from analyzer.cost.calibrate import load_profile

    cm = load_profile(
        opts.profile, kv_dtype=opts.kv_dtype, mfu=opts.mfu, weight_dtype=opts.weights_dtype
    )
    cluster = replace(
        opts.cluster, model=cm.model_ref, gpu=cm.gpu.id, tp=cm.tp, weights_dtype=cm.weight_dtype
    )
    return cm, replace(opts, cluster=cluster)


def _bandwidth(cm: CostModel, opts: AnalyzeOptions, prefix_tokens: int) -> BandwidthFigures:
    from analyzer.cost import get_tier

    p = max(int(prefix_tokens), 1)
    be = cm.break_even_bandwidth_gbps(p)
    dram = cm.tier_link(opts.dram_tier)
    pool_spec = get_tier(opts.pool_tier)
    pool_bw = (
        float(opts.pool_gbps) if opts.pool_gbps is not None else float(pool_spec.bandwidth_gbps)
    )
    return BandwidthFigures(
        prefix_tokens=p,
        break_even_gbps=float(be),
        bytes_per_token=int(cm.transfer_bytes_per_token),
        prefill_tokens_per_s=float(cm.prefill_tokens_per_s(p)),
        tiers=(
            TierFigure(Tier.DRAM, dram.name, float(dram.bandwidth_gbps), float(dram.latency_s)),
            TierFigure(
                Tier.POOL,
                pool_spec.name
                if opts.pool_gbps is None
                else f"{pool_spec.name} link at {pool_bw:g} GB/s",
                pool_bw,
                float(pool_spec.latency_s),
            ),
        ),
    )


def _replay_figures(result: ReplayResult, slo: float) -> ReplayFigures:
    out = []
    for name, s in result.scenarios.items():
        t = s.ttft
        by = s.hit_rate_by_tier
        rate = s.max_rate_scale_at_slo
        out.append(
            ScenarioFigures(
                name=name,
                hit_rate=s.hit_rate,
                ttft_mean_s=t.mean_s or 0.0,
                ttft_p90_s=t.p90_s or 0.0,
                ttft_p99_s=t.p99_s or 0.0,
                max_rate_scale=None if rate is None else float(rate),
                max_rate_capped=s.search is not None and s.search.capped,
                pool_hit_rate=by[Tier.POOL],
                dram_hit_rate=by[Tier.DRAM],
                network_bytes=float(s.network_bytes),
            )
        )
    return ReplayFigures(
        scenarios=tuple(out),
        baseline=Scenario.LOCAL,
        ttft_slo_s=slo,
        nodes=result.cluster.nodes,
        dram_scope=result.cluster.dram_scope,
    )


def _cluster_config(opts: AnalyzeOptions, instances: int | None = None) -> ClusterConfig:
    return replace(opts.cluster, instances=instances) if instances else opts.cluster


def _fits(model: str, gpu: str, kv_dtype: str) -> tuple[CostModel, int] | None:
    """The smallest TP (1, 2, 4, 8) at which ``model`` fits on ``gpu`` with KV room."""
    for tp in (1, 2, 4, 8):
        try:
            cm = _cost(model, gpu, tp, kv_dtype, None)
        except UsageError:
            continue
        if cm.hbm_kv_capacity_tokens() > 0:
            return cm, tp
    return None


def run_analysis(
    paths: list[str] | str,
    opts: AnalyzeOptions | None = None,
    advance: Advance | None = None,
    loaded: LoadedTrace | None = None,
    replayer: Any = None,
    reuse: Any = None,
    models: Any = None,
) -> AnalysisResult:
    """The whole pipeline; ``advance`` (if given) receives percentage points (100 in all).

    ``replayer`` replaces :func:`analyzer.replay.run_replay` (same arguments, same
    result), for a caller that remembers replays across calls (the dashboard's
    :class:`analyzer.replay.memo.ReplayMemo`); the per-model replays of a multi-model log
    also pass it ``part``, the model whose requests alone are replayed. ``reuse`` is the reuse report of this
    trace with ``ReuseOptions(warmup=opts.warmup, bytes_per_token=...)`` of the model,
    and ``models`` its :func:`models_document` (warm-up and KV dtype), when the caller
    has them already.

    ``loaded`` is what ``open_trace(paths, ...)`` already returned, for a caller that
    ingested the logs itself (the dashboard): ingestion is then skipped, so the options'
    ``ingest`` plays no part, and ``paths`` (its
    ``sources``) only name the files in the report.
    """
    from analyzer.ingest import open_trace
    from analyzer.reuse import ReuseOptions, analyze_reuse

    opts = opts or AnalyzeOptions()
    th = opts.thresholds
    step = advance or (lambda _n: None)
    plist = [paths] if isinstance(paths, str) else [str(p) for p in paths]
    if loaded is not None and plist != loaded.sources:
        raise ValueError(f"paths {plist} are not the loaded trace's sources {loaded.sources}")

    # Catalog lookups and the cluster's checks first, so an unknown model or GPU, router
    # or node shape fails before any work (not after minutes of reading a large log).
    cm, opts = _options_cost(opts)
    served = served_model(cm.model, opts.model)  # what launch scripts and pilots name
    cfg = _cluster_config(opts)
    prices = resolve_prices(opts.gpu, opts.prices)

    read_here = loaded is None
    if loaded is None:
        with progress(
            "reading logs",
            sum(Path(p).stat().st_size for p in plist if Path(p).is_file()) or None,
            unit="bytes",
        ) as adv:
            loaded = open_trace(plist, opts.ingest, advance=adv)
    step(15)
    from analyzer.advisor.models import model_warning, models_document, select_model, served_models

    if opts.only_model is not None:
        loaded = select_model(loaded, opts.only_model)
    warnings: list[str] = []
    named = served_models(loaded.table)
    mismatch = model_warning(named, opts.model)
    if mismatch:
        warnings.append(mismatch)
    if read_here and len(named) < 2:
        # Nothing below reads the table's block hashes again (only a multi-model log's
        # per-model figures do): keep them once, as the trace's dense ids.
        loaded.drop_block_columns()
    trace = loaded.trace
    if read_here:  # not on a caller's trace (the dashboard's what-ifs): built already
        release_freed_memory()  # building the trace's ids freed as much as they hold
    # Reports are made to be shared: inputs are named by position, size and hash unless
    # --keep-names (a file name can carry a customer's name).
    names = {
        # shown: a copy of stdin or of an object keeps the name it was given by
        p: Path(shown(p)).name if opts.ingest.keep_names else f"input-{i + 1}"
        for i, p in enumerate(plist)
    }
    inputs = tuple(AnalyzedInput(names[p], Path(p).stat().st_size, _sha256(p)) for p in plist)
    tf = _trace_figures(loaded)
    bpt = int(cm.bytes_per_token)
    if reuse is not None:
        rep = reuse
    else:
        with progress("reuse analysis", 100) as adv:
            rep = analyze_reuse(
                trace,
                ReuseOptions(warmup=opts.warmup, bytes_per_token=bpt, jobs=opts.ingest.jobs),
                advance=adv,
            )
    step(20)
    rf = _reuse_figures(rep, trace, opts.warmup, opts.knee_fraction)
    skipped = SkippedRows(
        total=int(loaded.skipped.total),
        by_reason=tuple(sorted(loaded.skipped.by_reason.items())),
        examples=tuple(_private_example(e, names) for e in loaded.skipped.examples),
    )
    models_figures = (
        models
        if models is not None
        else models_document(loaded, ReuseOptions(warmup=opts.warmup), opts.kv_dtype)
    )

    usable = not (tf.count_only or tf.n_requests < th.min_requests or not rf.measurable)
    bw: BandwidthFigures | None = None
    replay: ReplayFigures | None = None
    replay_result: ReplayResult | None = None
    economics: EconomicsInputs | None = None
    be_curve: tuple[BreakEvenPoint, ...] = ()
    if usable:
        prefix = rf.median_prefix_tokens or max(trace.block_size, int(tf.mean_prompt_tokens // 2))
        bw = _bandwidth(cm, opts, prefix)
        be_curve = _break_even_curve(cm, bw, prompt_max=int(trace.prompt_tokens.max()))
        from analyzer.replay import ScenarioSpec, run_replay

        run = replayer or run_replay

        # The SLO rate search is the costly part (five to eight replays per scenario); it
        # runs for every option, since each one's GPUs at the log's load come from it.
        # Below the reuse guideline no gain is projected, so nothing is searched.
        search = opts.search_rate and rf.ceiling_hit_rate >= th.min_reuse
        nvme_spec = ScenarioSpec(
            Scenario.LOCAL_DRAM_NVME,
            dram=True,
            nvme=True,
            description="HBM cache plus per-node host DRAM and local NVMe tiers (LMCache "
            "local CPU + disk, HiCache L2 + L3 file)",
        )
        with progress("replay", None) as adv:
            replay_result = run(
                trace,
                cfg,
                scenarios=(
                    Scenario.NONE,
                    Scenario.LOCAL,
                    Scenario.LOCAL_DRAM,
                    nvme_spec,
                    Scenario.POOLED,
                ),
                ttft_slo_s=opts.ttft_slo_s,
                search_rate=search,
                advance=adv,
                cost=cm,
                # Scenarios in parallel (each simulated alone: the same figures); the
                # rate search is most of analyze's time on a large log. Only asked for
                # above one: a caller's own replay function (the dashboard's) has no such
                # argument.
                **_workers(opts),
                **_full_replay(opts),
            )
        replay = _replay_figures(replay_result, opts.ttft_slo_s)
        economics = _economics(opts, trace, rf, replay_result, prices, bpt)
    measured_apart = [m for m in models_figures.per_model if m.reuse is not None]
    if usable and len(measured_apart) > 1:
        from analyzer.advisor.models import per_model_replay

        with progress("replay per model", None):
            models_figures = per_model_replay(loaded, cfg, models_figures, _fits, replayer)
    step(45)

    decision = decide(tf, rf, bw, replay, th, economics)
    uncertainty: CostUncertainty | None = None
    if bw is not None:
        decision, uncertainty = _with_uncertainty(decision, cm, bw, replay, th)
    measured = _measured_vs_projected(trace, cfg, cm, opts, usable)
    if measured is not None and measured.comparison is not None:
        from analyzer.advisor.current import with_comparison

        decision = with_comparison(decision, measured.comparison)

    sizing: Sizing | None = None
    sizings: dict[DeployOption, Sizing] = {}
    settings: list[ProductSettings] = []
    if usable and replay_result is not None:
        sc = replay_result.scenarios
        pooled, local = sc.get(Scenario.POOLED), sc.get(Scenario.LOCAL)
        hbm_tokens = None if local is None else local.capacity.local_per_instance
        if hbm_tokens is None:
            hbm_tokens = int(cm.hbm_kv_capacity_tokens())
        nodes = replay_result.cluster.nodes
        makespan = 0.0 if pooled is None else pooled.makespan_s
        pool_read = 0.0 if pooled is None else float(pooled.bytes_read_by_tier[Tier.POOL])
        read_gbps = pool_read / makespan / nodes / 1e9 if makespan > 0 else 0.0
        from analyzer.cost import list_tiers

        net = [
            (t.name, float(t.bandwidth_gbps))
            for t in list_tiers()
            if t.kind == "network" and t.name.startswith(("rdma", "tcp"))
        ]
        short = max(rf.p25_prefix_tokens, trace.block_size)
        gran = rep.granularity.hit_rate_by_block_size() if rep.granularity is not None else {}
        knee = rf.knee_tokens
        pol = {"lru": rep.hit_rate_at(knee)} if knee else {}
        for name, pts in rep.policy_points.items():
            for cap, rate in pts:
                if cap == knee:
                    pol[name] = float(rate)
        dram_run = sc.get(Scenario.LOCAL_DRAM)
        dram_sim = None if dram_run is None else dram_run.capacity.dram_per_node
        sized = partial(
            size,
            knee_tokens=knee,
            dram_simulated_tokens=dram_sim,
            cluster=ClusterFigures(
                instances=opts.instances,
                tp=opts.tp,
                gpus_per_node=opts.gpus_per_node,
                hbm_cache_tokens_per_instance=hbm_tokens,
                bytes_per_token=bpt,
                router=opts.router,
            ),
            break_even_short_gbps=_finite_or(float(cm.break_even_bandwidth_gbps(short)), bw),
            replay_pool_read_gbps_per_node=read_gbps,
            network_tiers=net,
            granularity=gran,
            engine_block=trace.block_size,
            same_session_share=rf.same_session_share,
            sessions_known=tf.sessions_known,
            policy_at_knee=pol,
        )
        sizing = sized(pool=decision.verdict == Verdict.DEPLOY_POOLED)
        # The runner-up option is sized too: its deploy/ files sit beside the
        # recommended one's.
        sizings = deploy_sizings(sizing, decision.verdict, lambda pool: sized(pool=pool))
        settings = translate(sizing, decision.verdict, model=served, tp=opts.tp)

    flips: list[FlipRow] = []
    side: list[PricedChoice] = []
    if usable and bw is not None:
        with progress("sensitivity", None):
            flips, side = _sensitivity(trace, tf, rf, bw, replay, cm, opts, economics, replayer)
    step(15)

    trace_rate = tf.n_requests / tf.duration_s if tf.duration_s > 0 else 0.0
    base = replay.get(Scenario.LOCAL) if replay else None
    chosen = VERDICT_SCENARIO.get(decision.verdict)
    gate_plan = gates_mod.plan(
        verdict=decision.verdict,
        projection=decision.projection,
        trace_rate_rps=trace_rate,
        projected_baseline_ttft_s=base.ttft_mean_s if base else None,
        th=th,
        candidate=replay.get(chosen) if replay and chosen else None,
        baseline=base,
        ttft_slo_s=opts.ttft_slo_s if replay else None,
    )
    outs = trace.output_tokens[trace.output_tokens >= 0]
    pilot = pilot_commands(
        inputs=[i.name for i in inputs],
        model=served,
        rate_rps=trace_rate,
        duration_s=tf.duration_s,
        n_requests=tf.n_requests,
        mean_input_tokens=tf.mean_prompt_tokens,
        mean_output_tokens=float(outs.mean()) if outs.size else None,
        tokenizer=read_metadata(loaded.table).get("tokenizer", ""),
        sessions=tf.sessions_known,
    )
    deploy = (
        bundle(
            sizings,
            next(iter(sizings)),
            model=served,
            pilot=pilot,
        )
        if sizings
        else ()
    )
    step(5)
    return AnalysisResult(
        options=opts,
        inputs=inputs,
        trace=tf,
        reuse=rf,
        bandwidth=bw,
        replay=replay,
        decision=decision,
        sizing=sizing,
        settings=tuple(settings),
        flips=tuple(flips),
        gates=gate_plan,
        pilot=pilot,
        deploy=deploy,
        per_process=per_process(sizings),
        skipped=skipped,
        reuse_report=rep,
        replay_result=replay_result,
        cost=_cost_figures(cm) if usable else None,
        break_even_curve=be_curve,
        economics=economics,
        side_by_side=tuple(side),
        tokenization=TokenCounting(
            tokenizer=trace.meta.get("tokenizer", ""),
            template=trace.meta.get("template", ""),
        ),
        models=models_figures,
        warnings=tuple(warnings),
        measured=measured,
        uncertainty=uncertainty,
        engine_events=(
            None if loaded.engine is None else replace(loaded.engine, bytes_per_token=bpt)
        ),
    )


def _economics(
    opts: AnalyzeOptions,
    trace: BlockTrace,
    rf: ReuseFigures,
    replay_result: ReplayResult,
    prices: Prices,
    bytes_per_token: int,
) -> EconomicsInputs:
    """What each option adds, sized as the recommendation sizes it: host DRAM per node and
    the pool at the knee of the hit-ratio curve, capped at what the replay simulated (so
    the projection backs the figure); NVMe holds what DRAM does not, up to its simulated
    size; a pool adds a NIC per node and the store's servers."""
    from analyzer.replay import ScenarioCapacity

    nodes = replay_result.cluster.nodes
    sc = replay_result.scenarios

    def simulated(name: str) -> ScenarioCapacity:
        s = sc.get(name)
        return ScenarioCapacity(None, None, None, None, None) if s is None else s.capacity

    def capped(tokens: int, cap: int | None) -> int:
        return tokens if cap is None else min(tokens, cap)

    knee = rf.knee_tokens
    dram = capped(knee, simulated(Scenario.LOCAL_DRAM).dram_per_node)
    nvme = capped(max(knee - dram, 0), simulated(Scenario.LOCAL_DRAM_NVME).nvme_per_node)
    pool = capped(knee, simulated(Scenario.POOLED).pool)

    def gb(tokens: int) -> float:
        return tokens * bytes_per_token / 1e9

    return EconomicsInputs(
        instances=opts.instances,
        tp=opts.tp,
        gpu=opts.gpu,
        load=load_figures(trace.arrival_s, opts.peak_window_s),
        prices=prices,
        resources=(
            OptionResources(Scenario.LOCAL_DRAM, dram_gb=nodes * gb(dram)),
            OptionResources(
                Scenario.LOCAL_DRAM_NVME, dram_gb=nodes * gb(dram), nvme_tb=nodes * gb(nvme) / 1000
            ),
            OptionResources(Scenario.POOLED, dram_gb=gb(pool), nic_nodes=nodes, store=True),
        ),
    )


def _measured_vs_projected(
    trace: Any, cfg: Any, cm: Any, opts: AnalyzeOptions, usable: bool
) -> MeasuredAgainstProjected | None:
    """When the log's responses carry cached_tokens: the measured rate always; the
    replay of today's deployment beside it when the log is usable."""
    from analyzer.advisor.current import CurrentDeployment, MeasuredAgainstProjected, compare
    from analyzer.reuse.measured import measure_cached

    measured = measure_cached(trace, opts.warmup)
    if measured is None:
        return None
    if not usable or measured.overall.requests == 0:  # nothing measured to compare
        return MeasuredAgainstProjected(measured)
    current = CurrentDeployment(
        opts.current_instances, opts.current_router, opts.current_local_capacity_tokens
    )
    with progress("replay of today's deployment", None):
        comparison = compare(trace, cfg, cm, measured, current)
    return MeasuredAgainstProjected(measured, comparison)


_LOWER = {"high": "medium", "medium": "low", "low": "low"}


@dataclass(frozen=True, slots=True)
class CostUncertainty:
    """Ranges on the deciding figures from the cost model's measured error (``band``),
    and whether a flip of the bandwidth verdict lies inside them; the replayed mean TTFT
    of each scenario as a range when a replay ran."""

    band: ErrorBand
    break_even_gbps: Range
    prefill_tokens_per_s: Range
    flip: FlipFinding
    ttft_mean_s_by_scenario: dict[str, Range] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "band": self.band.to_json(),
            "break_even_gbps": self.break_even_gbps.to_json(),
            "prefill_tokens_per_s": self.prefill_tokens_per_s.to_json(),
            "flip": self.flip.to_json(),
        }
        if self.ttft_mean_s_by_scenario is not None:
            out["ttft_mean_s"] = {n: r.to_json() for n, r in self.ttft_mean_s_by_scenario.items()}
        return out


def _with_uncertainty(
    decision: Decision, cm: CostModel, bw: BandwidthFigures, replay: Any, th: Thresholds
) -> tuple[Decision, CostUncertainty]:
    """Ranges on the deciding figures from the cost model's measured error, and the
    confidence note saying whether a flip of the verdict lies inside them.

    The verdict itself is the point estimate's; a flip inside the range lowers the
    confidence one level and names the measurement that settles it.
    """
    from analyzer.cost import uncertainty as unc

    band = unc.prefill_band(cm, bw.prefix_tokens)
    labels: dict[str, str] = {Tier.DRAM: "host DRAM", Tier.POOL: "the pool link"}
    tiers = [(f"{labels.get(t.role, t.role)} ({t.tier})", t.bandwidth_gbps) for t in bw.tiers]
    flip = unc.bandwidth_flip(
        bw.break_even_gbps, bw.prefix_tokens, tiers, band, th.bandwidth_margin
    )
    # the compute share of a replayed TTFT carries the band; applying it to the whole
    # TTFT (queueing and loads included) gives a range at least as wide as the truth's
    out = CostUncertainty(
        band=band,
        break_even_gbps=unc.break_even_range(bw.break_even_gbps, band),
        prefill_tokens_per_s=unc.rate_range(bw.prefill_tokens_per_s, band),
        flip=flip,
        ttft_mean_s_by_scenario=(
            None
            if replay is None
            else {s.name: unc.time_range(s.ttft_mean_s, band) for s in replay.scenarios}
        ),
    )
    if decision.verdict == Verdict.INSUFFICIENT_DATA:
        return decision, out
    notes = (*decision.confidence_notes, flip.statement)
    level = _LOWER[decision.confidence] if flip.inside else decision.confidence
    return replace(decision, confidence=level, confidence_notes=notes), out


def _finite_or(gbps: float, bw: BandwidthFigures | None) -> float:
    """``gbps`` if finite, else the median-prefix break-even (or 0 when that is not either):
    very short prefixes may never pay to load, which must not size an infinite NIC."""
    if math.isfinite(gbps):
        return gbps
    if bw is not None and math.isfinite(bw.break_even_gbps):
        return bw.break_even_gbps
    return 0.0


def _break_even_curve(
    cm: CostModel, bw: BandwidthFigures, prompt_max: int
) -> tuple[BreakEvenPoint, ...]:
    top = max(1024, min(int(prompt_max), 1 << 20))
    lengths = sorted({int(x) for x in np.geomspace(16, top, 24)} | {bw.prefix_tokens})
    return tuple(BreakEvenPoint(p, float(cm.break_even_bandwidth_gbps(p))) for p in lengths)


def _cost_figures(cm: CostModel) -> CostFigures:
    return CostFigures(
        model=cm.model.name if hasattr(cm.model, "name") else str(cm.model),
        gpu=cm.gpu.name if hasattr(cm.gpu, "name") else str(cm.gpu),
        tp=cm.tp,
        kv_dtype=cm.kv_dtype,
        weight_dtype=cm.weight_dtype,
        prefill_model="roofline" if cm.engine is None else "engine",
        mfu=cm.mfu if cm.engine is None else None,
        bytes_per_token=int(cm.bytes_per_token),
        transfer_bytes_per_token=int(cm.transfer_bytes_per_token),
        hbm_kv_capacity_tokens=int(cm.hbm_kv_capacity_tokens()),
    )


def _sensitivity(
    trace: BlockTrace,
    tf: TraceFigures,
    rf: ReuseFigures,
    bw: BandwidthFigures,
    replay: ReplayFigures | None,
    cm: CostModel,
    opts: AnalyzeOptions,
    economics: EconomicsInputs | None,
    replayer: Any = None,
) -> tuple[list[FlipRow], list[PricedChoice]]:
    """The sensitivity table's rows, and the side-by-side pricing of other models and GPUs."""
    from analyzer.cost import list_tiers

    th = opts.thresholds
    variants: list[Variant] = [reuse_variant(rf, bw, replay, f) for f in REUSE_FACTORS]
    pool = bw.tier(Tier.POOL)
    current = pool.bandwidth_gbps if pool else None
    for t in list_tiers():
        if t.kind != "network" or current is None or abs(t.bandwidth_gbps - current) < 1e-9:
            continue
        v = bandwidth_variant(rf, bw, replay, float(t.bandwidth_gbps), tf.mean_prompt_tokens)
        variants.append(
            Variant(
                v.dimension,
                f"{t.bandwidth_gbps:g} GB/s ({8 * t.bandwidth_gbps:g} Gb/s effective, {t.name})",
                v.reuse,
                v.bandwidth,
                v.replay,
            )
        )
    if economics is not None and replay is not None:
        gpu_hour = economics.prices.gpu_hour
        if gpu_hour is not None:
            for f in (0.0, 0.5, 2.0, 10.0):
                variants.append(
                    Variant(
                        "GPU price",
                        f"x{f:g} (${gpu_hour.usd * f:.2f} per GPU-hour)",
                        rf,
                        bw,
                        replay,
                        economics=scaled(economics, gpu_price=f),
                    )
                )
        dram = economics.prices.dram_gb_month
        for f in (0.0, 0.5, 2.0):
            variants.append(
                Variant(
                    "DRAM price",
                    f"x{f:g} (${dram.usd * f:.2f} per GB-month)",
                    rf,
                    bw,
                    replay,
                    economics=scaled(economics, dram_price=f),
                )
            )
        for f in (0.5, 2.0):
            variants.append(
                Variant(
                    "load",
                    f"x{f:g} ({economics.load.mean_rps * f:.3g} requests/s on average)",
                    rf,
                    bw,
                    replay,
                    economics=scaled(economics, load=f),
                )
            )
    s_mean = max(1, round(tf.mean_prompt_tokens))
    base_t = cm.prefill_time_s(s_mean, 0)
    side: list[PricedChoice] = []
    if replay is not None:
        side.append(_side_row(opts.model, opts.gpu, opts.tp, replay, economics, tf, rf, bw, th))
    n_models = 0
    for dim, names in (("gpu", ALT_GPUS), ("model", ALT_MODELS)):
        for name in names:
            if (dim == "model" and name == opts.model) or (dim == "gpu" and name == opts.gpu):
                continue
            m, g = (name, opts.gpu) if dim == "model" else (opts.model, name)
            fit = _fits(m, g, opts.kv_dtype)
            if fit is None:
                continue
            alt, tp = fit
            alt_bw = _bandwidth(alt, opts, bw.prefix_tokens)
            ratio = alt.prefill_time_s(s_mean, 0) / base_t if base_t > 0 else 1.0
            alt_econ = None
            if economics is not None:
                alt_prices = replace(
                    economics.prices, gpu=g, gpu_hour=economics.prices.gpu_hour_for(g)
                )
                alt_econ = replace(economics, gpu=g, tp=tp, prices=alt_prices)
            v = hardware_variant(
                dim,
                f"{name} (tp {tp})",
                rf,
                bw,
                alt_bw,
                replay,
                ratio,
                tf.mean_prompt_tokens,
                note=f"break-even {alt_bw.break_even_gbps:.3g} GB/s"
                if math.isfinite(alt_bw.break_even_gbps)
                else "loading never beats recomputing at this prefix",
                economics=alt_econ,
            )
            variants.append(v)
            if v.replay is not None and (dim == "gpu" or n_models < 2):
                n_models += dim == "model"
                side.append(_side_row(m, g, tp, v.replay, alt_econ, tf, rf, alt_bw, th))
    # Other instance counts are a quick replay without the rate search: they say nothing
    # about GPUs or money, so they only enter a latency-first (objective ttft) table.
    if (
        opts.sensitivity_replays
        and th.objective == Objective.TTFT
        and replay is not None
        and trace.n_accesses <= MAX_SENSITIVITY_ACCESSES
    ):
        from analyzer.replay import run_replay

        run = replayer or run_replay

        counts = sorted({max(1, opts.instances // 2), opts.instances * 2} - {opts.instances})
        for n in counts:
            res = run(
                trace,
                _cluster_config(opts, n),
                scenarios=(Scenario.LOCAL, Scenario.LOCAL_DRAM, Scenario.POOLED),
                ttft_slo_s=opts.ttft_slo_s,
                search_rate=False,
                cost=cm,
                **_workers(opts),
            )
            rp = _replay_figures(res, opts.ttft_slo_s)
            variants.append(
                Variant(
                    "instances",
                    f"{n} instances",
                    rf,
                    bw,
                    rp,
                    "quick replay without the SLO rate search",
                )
            )
    _, rows = flip_table(tf, rf, bw, replay, variants, th, economics)
    return rows, side


def _side_row(
    model: str,
    gpu: str,
    tp: int,
    replay: ReplayFigures,
    economics: EconomicsInputs | None,
    tf: TraceFigures,
    rf: ReuseFigures,
    bw: BandwidthFigures,
    th: Thresholds,
) -> PricedChoice:
    """One model/GPU choice priced on this log: per option TTFT, GPUs and monthly cost."""
    from analyzer.advisor.economics import option_costs

    costs = option_costs(replay, economics) if economics is not None else {}
    options: list[tuple[Scenario, PricedOption]] = []
    for name in (Scenario.LOCAL, Scenario.LOCAL_DRAM, Scenario.POOLED):
        s = replay.get(name)
        if s is None:
            continue
        c = costs.get(name)
        options.append(
            (
                name,
                PricedOption(
                    ttft_mean_s=s.ttft_mean_s,
                    ttft_p90_s=s.ttft_p90_s,
                    gpus_at_peak_load=None if c is None else c.capacity.gpus_peak,
                    total_usd_month=None if c is None else c.total_usd_month,
                ),
            )
        )
    price = economics.prices.gpu_hour if economics is not None else None
    return PricedChoice(
        model=model_label(model),  # a config by its folder's name, never its path
        gpu=gpu,
        tp=tp,
        usd_per_gpu_hour=None if price is None else price.usd,
        verdict=decide(tf, rf, bw, replay, th, economics).verdict,
        options=tuple(options),
    )


def _private_example(example: str, names: dict[str, str]) -> str:
    """A skip example ``path:line: reason`` with the path as the report names it."""
    for path, name in names.items():
        if example.startswith(path + ":"):
            return name + example[len(path) :]
    return example


def _full_replay(opts: AnalyzeOptions) -> dict[str, Any]:
    """``run_replay``'s ``full_replay`` argument when ``--full-replay`` asks for it (a
    caller's own replay function, the dashboard's, need not take it otherwise)."""
    return {"full_replay": True} if opts.full_replay else {}


def _workers(opts: AnalyzeOptions) -> dict[str, Any]:
    """``run_replay``'s ``workers`` argument when ``--jobs`` asks for more than one."""
    return {"workers": opts.ingest.jobs} if opts.ingest.jobs > 1 else {}
