"""The report's views of what the log shows: inputs and options, the trace and its
models, the engine's events, the verdict's checks, reuse, bandwidth, the cost model,
the replay and the sizing. One frozen class per object of the schema, named with a
``View`` suffix so it never reads as the stage record it is written from (the reuse
stage's ``CurvePoint``, the advisor's ``Check``); :mod:`analyzer.report.schema` reads
and writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from analyzer.advisor.figures import (
    Objective,
    Verdict,
)
from analyzer.replay.config import Scenario, Tier
from analyzer.report.schema import ABSENT, MISSING, REST, NotApplicable, View

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, slots=True)
class InputFileView(View):
    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ThresholdsView(View):
    """``options.thresholds``: the decision thresholds of this run (fractions)."""

    bandwidth_margin: float
    min_dram_gain: float
    min_pool_advantage: float
    min_pool_saving: float
    min_requests: int
    min_reuse: float
    objective: Objective
    pilot_fraction: float
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class PricesView(View):
    """``options.prices``: the price flags of this run (None: the catalog's)."""

    dram_gb_month_usd: float | None
    gpu_hour_usd: float | None
    nic_node_month_usd: float | None
    nvme_tb_month_usd: float | None
    prices_file: str | None
    store_month_usd: float | None
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class RunOptionsView(View):
    """``options``: the flags of this run (file and tenant names left out)."""

    model: str
    gpu: str
    tp: int
    instances: int
    gpus_per_node: int
    dram_scope: str
    kv_dtype: str
    mfu: float | None
    pool_gbps: float | None
    pool_tier: str
    dram_tier: str
    local_capacity_tokens: int | None
    dram_capacity_tokens: int | None
    pool_capacity_tokens: int | None
    router: str
    ttft_slo_s: float
    warmup: float
    block_size: int | None
    fmt: str | None
    template: str | None
    tokenizer: str
    only_model: str | None
    current_instances: int | None
    current_router: str | None
    current_local_capacity_tokens: int | None
    size_search: bool
    max_gpus: int | None
    model_given: bool
    tp_given: bool
    sensitivity_replays: bool
    knee_fraction: float
    thresholds: ThresholdsView
    peak_window_s: float
    prices: PricesView
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class SkippedView(View):
    """``trace.skipped``: input rows left out, by reason, with a few examples."""

    total: int | None = field(default=None, metadata=ABSENT)
    by_reason: Mapping[str, int] | None = field(default=None, metadata=ABSENT)
    examples: tuple[str, ...] | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class TokenizationView(View):
    tokenizer: str | None = field(default=None, metadata=ABSENT)
    template: str | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class TraceView(View):
    """``trace``: the log's size and what it carries."""

    n_requests: int
    duration_s: float
    prompt_tokens_total: int
    mean_prompt_tokens: float
    skipped: SkippedView
    tokenization: TokenizationView
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class ModelFiguresView(View):
    """``models.per_model[]``: one served model's share of the log and its reuse."""

    model: str
    requests: int
    prompt_tokens: int
    catalog_id: str | None = field(default=None, metadata=ABSENT)
    ceiling_hit_rate: float | None = field(default=None, metadata=ABSENT)
    footprint_gb: float | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class ModelsView(View):
    """``models``: the models the log names (an empty object when it names none)."""

    count: int | None = field(default=None, metadata=ABSENT)
    per_model: tuple[ModelFiguresView, ...] | None = field(default=None, metadata=ABSENT)
    shared_pool_note: str | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class MeasuredRateView(View):
    requests: int
    hit_rate: float
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class MeasuredHitsView(View):
    """``measured_vs_projected.measured``: the hit rate the log's responses report."""

    requests: int
    steady_requests: int
    hit_rate: float
    by_model: Mapping[str, MeasuredRateView] | None = field(default=None, metadata=ABSENT)
    # responses claiming more cached tokens than their prompt holds, left out
    excluded_requests: int | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class ProjectedHitsView(View):
    """``measured_vs_projected.projected``: today's deployment replayed."""

    hit_rate: float
    instances: int
    router: str
    local_capacity_tokens_per_instance: int
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class MeasuredVsProjectedView(View):
    """``measured_vs_projected``: the comparison's keys are absent when the trace was too
    small to replay (``projected`` is then null)."""

    measured: MeasuredHitsView
    projected: ProjectedHitsView | None
    tolerance: float | None = field(default=None, metadata=ABSENT)
    within_tolerance: bool | None = field(default=None, metadata=ABSENT)
    fitted_local_capacity_tokens_per_instance: int | None = field(default=None, metadata=ABSENT)
    fitted_hit_rate: float | None = field(default=None, metadata=ABSENT)
    fit_note: str | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class EngineMediumView(View):
    """``engine_events.media[]``: one medium's blocks as the engine's events report them."""

    medium: str
    block_size: int
    stored_blocks: int
    removed_blocks: int
    peak_blocks: int
    peak_tokens: int
    mean_blocks: float
    final_blocks: int
    evictions_per_s: float
    median_lifetime_s: float | None
    p90_lifetime_s: float | None
    peak_gb: float | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class OccupancyPointView(View):
    """``engine_events.timeline[]``: blocks held per medium ``t_s`` after the first batch."""

    t_s: float
    blocks: Mapping[str, int]
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class EngineEventsView(View):
    """``engine_events``: what a KV-event recording shows of the engines' own caches
    (present only when the input is a recording; analyzer/ingest/kvevents.py)."""

    engines: int
    batches: int
    events: int
    span_s: float
    block_size: int
    media: tuple[EngineMediumView, ...]
    clears: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    gaps: int
    lost_batches: int
    complete: bool
    timeline: tuple[OccupancyPointView, ...]
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class CheckView(View):
    """``verdict.checks[]``: one step of the decision (value and threshold in the check's
    unit: a fraction, GB/s or USD, as its name says)."""

    step: int
    name: str
    passed: bool | None
    value: float | None
    threshold: float | None
    text: str
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class ProjectionView(View):
    """``verdict.projection``: projected gains against the baseline (fractions)."""

    pooled_throughput_gain: float | None
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class VerdictView(View):
    verdict: Verdict
    reasons: tuple[str, ...]
    confidence: str
    confidence_statement: str
    missing: tuple[str, ...]
    checks: tuple[CheckView, ...]
    projection: ProjectionView
    scenario: Scenario | None
    objective: Objective
    reason_facts: object  # JSON kept as written (the advisor's facts)
    figures: object
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class CurvePointView(View):
    """One point of a hit-ratio curve: steady-state hit rate at a cache capacity."""

    capacity_tokens: int
    hit_rate: float | None
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class CapacityView(View):
    """A cache capacity in tokens, GB (1e9 bytes) and GiB."""

    capacity_tokens: int | None = field(default=None, metadata=ABSENT)
    capacity_gb: float | None = field(default=None, metadata=ABSENT)
    capacity_gib: float | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class ReuseSourcesView(View):
    """``reuse.analysis.sources``: whose earlier requests the reused tokens come from."""

    share_of_prompt: Mapping[str, float] | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class TopPrefixView(View):
    prefix_tokens: int | None = field(default=None, metadata=ABSENT)
    requests: int | None = field(default=None, metadata=ABSENT)
    reused_tokens: int | None = field(default=None, metadata=ABSENT)
    preview: str | None = field(default=None, metadata=ABSENT)
    hash: str | None = field(default=None, metadata=ABSENT)
    tenants: int | None = field(default=None, metadata=ABSENT)
    models: tuple[str, ...] | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class TopPrefixesView(View):
    by_volume: tuple[TopPrefixView, ...] | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class ReuseAnalysisView(View):
    """``reuse.analysis``: ``kvpool reuse --json`` of the log (the sections the report
    draws are typed; the rest travels as the reuse stage wrote it)."""

    curves: Mapping[str, tuple[CurvePointView, ...]] | None = field(default=None, metadata=ABSENT)
    knees: Mapping[str, CapacityView] | None = field(default=None, metadata=ABSENT)
    sources: ReuseSourcesView | None = field(default=None, metadata=ABSENT)
    top_prefixes: TopPrefixesView | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class ReuseFiguresView(View):
    """``reuse.figures``: the steady-state reuse figures the decision used."""

    measurable: bool
    reason: str | None
    ceiling_hit_rate: float
    cold_ceiling_hit_rate: float
    warmup: float
    median_prefix_tokens: int | NotApplicable  # not applicable: no prefix is reused
    knee_tokens: int
    knee_fraction: float
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class ReuseView(View):
    figures: ReuseFiguresView
    analysis: ReuseAnalysisView


@dataclass(frozen=True, slots=True)
class BreakEvenPointView(View):
    prefix_tokens: int
    break_even_gbps: float | NotApplicable  # not applicable: loading never beats recomputing
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class TierLinkView(View):
    """``bandwidth.tiers[]``: a tier's link (role: dram, nvme or pool)."""

    role: Tier
    tier: str
    bandwidth_gbps: float
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class BandwidthView(View):
    """``bandwidth``: the break-even bandwidth at the median reusable prefix (not
    applicable where loading never beats recomputing)."""

    break_even_gbps: float | NotApplicable
    bytes_per_token: int
    prefill_tokens_per_s: float | NotApplicable
    prefix_tokens: int
    tiers: tuple[TierLinkView, ...]
    curve: tuple[BreakEvenPointView, ...]
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class CostView(View):
    """``cost``: the cost model's setting (model, GPU, precision)."""

    bytes_per_token: int
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class IntervalView(View):
    """A figure with the low and high ends of its range."""

    value: float
    low: float
    high: float
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class ErrorBandView(View):
    """``uncertainty.band``: the cost model's measured error."""

    basis: str
    kind: str
    extrapolated: bool
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class UncertaintyView(View):
    """``uncertainty``: ranges from the cost model's measured error."""

    band: ErrorBandView
    break_even_gbps: IntervalView | NotApplicable
    prefill_tokens_per_s: IntervalView | NotApplicable
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class TtftSecondsView(View):
    """A scenario's TTFT statistics, seconds."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class ScenarioView(View):
    """``replay.scenarios[name]``: one deployment option replayed."""

    hit_rate: float
    hit_rate_by_tier: Mapping[Tier, float]
    ttft_s: TtftSecondsView
    prefill_gpu_s: float
    network_bytes: float
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class ReplayClusterView(View):
    """``replay.cluster``: the cluster every scenario ran on."""

    instances: int
    tp: int
    gpu: str
    nodes: int
    router: str
    ttft_slo_s: float
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class ReplayView(View):
    """``replay``: ``kvpool replay --json`` of the log."""

    cluster: ReplayClusterView
    scenarios: Mapping[Scenario, ScenarioView]
    miniature: Mapping[str, object] | None = field(
        default=None, metadata=ABSENT
    )  # read by replay.miniature.describe
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class SizingView(View):
    """``sizing``: the sized recommendation."""

    pool: bool
    pool_capacity_tokens: int
    pool_capacity_gb: float
    pool_capacity_gib: float
    knee_fraction: float
    dram_per_node_tokens: int
    dram_per_node_gb: float
    dram_per_node_gib: float
    dram_reason: str
    hbm_cache_per_instance_tokens: int
    hbm_cache_per_instance_gb: float
    network_per_node_gbps: float
    nic: str
    block_size_tokens: int
    chunk_size_tokens: int
    block_size_reason: str
    router: str
    router_reason: str
    eviction: str
    eviction_reason: str
    instances: int
    nodes: int
    instances_per_node: int
    nvme_per_node_tokens: int
    bytes_per_token: int
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
