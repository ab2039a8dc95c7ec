"""The ``kvpool.report/3`` document: the one JSON form of an analysis, and its typed view.

:class:`ReportDocument` is made once from the advisor's typed result
(:class:`~analyzer.advisor.pipeline.AnalysisResult`); ``report.json``, ``kvpool analyze
--json`` and the dashboard's download are its :meth:`ReportDocument.to_json`. This module
alone knows the schema's layout: it builds the JSON (:func:`report_document`), rounds it
(:func:`canonical`), and reads it back into :class:`Report`, a tree of frozen dataclasses
whose fields are the schema's keys (units in the names, enums where the schema holds a
verdict, objective, deploy option, scenario or tier name). The Markdown, HTML and
terminal renderers, the summary and the dashboard read attributes of that view, never
keys, and a ``report.json`` loaded back (:meth:`ReportDocument.load`) gives the same
view, so every output prints the same rounded figures whether it is made fresh or from
the file.

Floats are rounded to 6 significant digits and NaN or infinity become ``null``
(:func:`canonical`), so the same input and flags give the same bytes.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from enum import Enum
from functools import cache
from pathlib import Path
from types import NoneType, UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints

import numpy as np

from analyzer import __version__
from analyzer.advisor import gates as gates_mod
from analyzer.advisor.economics import economics_json, values
from analyzer.advisor.figures import (
    DeployOption,
    Objective,
    Undefined,
    Verdict,
)
from analyzer.advisor.plan import PlanStatus
from analyzer.advisor.products import DOCS_CHECKED
from analyzer.advisor.sensitivity import summarize
from analyzer.advisor.served import model_label
from analyzer.errors import InputError, Location
from analyzer.outputs import note_input
from analyzer.replay.config import Scenario, Tier

if TYPE_CHECKING:
    from analyzer.advisor.pipeline import AnalysisResult, AnalyzeOptions
    from analyzer.advisor.plan import DeploymentPlan

SCHEMA = "kvpool.report/3"


# -- reading the schema into frozen dataclasses --------------------------------------------
#
# A view class's fields are the JSON object's keys. ``rest`` collects the keys a view
# does not name (a stage's output carries more than the renderers read): they travel
# through unchanged, so ``to_json(from_json(d)) == d``. An ``absent`` field is a key some
# documents leave out: None in the view, its name in ``missing``, and left out again on
# the way back (a key written as null stays null). Numbers
# keep their JSON type (an int stays an int in a float field), so the text written back
# is the text read.


class ReportFormatError(ValueError):
    """A document that does not fit the schema; ``field`` is the dotted path to it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


# Field markers: ``rest`` holds the keys a view does not name; an ``absent`` key may be
# left out of the JSON (None here); ``missing`` lists the absent keys this object's JSON
# left out, so they are left out again on the way back.
_REST = {"rest": True}
_ABSENT = {"absent": True}
_MISSING = {"missing": True}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false"}.get(
        type(value), "null" if value is None else "a number"
    )


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _load(tp: Any, value: Any, where: str) -> Any:
    """``value`` (from ``json.loads``) as the type ``tp`` names; a mismatch raises
    :class:`ReportFormatError` naming the field."""
    origin = get_origin(tp)
    if tp is Any:
        return copy.deepcopy(value)
    if origin in (Union, UnionType):
        args = get_args(tp)
        if value is None and NoneType in args:
            return None
        if NotApplicable in args and isinstance(value, dict) and "not_applicable" in value:
            return _load_object(NotApplicable, value, where)
        (one,) = [a for a in args if a not in (NoneType, NotApplicable)]
        return _load(one, value, where)
    if value is None:
        raise ReportFormatError(where, "is null")
    if origin is tuple:
        if not isinstance(value, list):
            raise ReportFormatError(where, f"expected a list, got {_kind(value)}")
        item = get_args(tp)[0]
        return tuple(_load(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, dict):
            raise ReportFormatError(where, f"expected an object, got {_kind(value)}")
        kt, vt = get_args(tp)
        return {
            _load(kt, k, f"{where}.{k}"): _load(vt, v, f"{where}.{k}") for k, v in value.items()
        }
    if isinstance(tp, type) and issubclass(tp, Enum):
        if not isinstance(value, str) or value not in {m.value for m in tp}:
            names = ", ".join(m.value for m in tp)
            what = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", tp.__name__).lower()  # "deploy option"
            raise ReportFormatError(where, f"unknown {what} {value!r} ({names})")
        return tp(value)
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    elif is_dataclass(tp):
        return _load_object(tp, value, where)  # type: ignore[arg-type]
    else:  # pragma: no cover - a view class names a type this reader does not know
        raise TypeError(f"no reader for {tp!r}")
    if not ok:
        raise ReportFormatError(where, f"expected {tp.__name__}, got {_kind(value)}")
    return value


def _load_object(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ReportFormatError(where, f"expected an object, got {_kind(value)}")
    hints = _hints(cls)
    args: dict[str, Any] = {}
    rest: str | None = None
    known: set[str] = set()
    missing: list[str] = []
    for f in fields(cls):
        if f.metadata.get("rest"):
            rest = f.name
            continue
        if f.metadata.get("missing"):
            continue
        known.add(f.name)
        at = f"{where}.{f.name}" if where else f.name
        if f.name in value:
            args[f.name] = _load(hints[f.name], value[f.name], at)
        elif f.metadata.get("absent"):
            missing.append(f.name)
        else:
            raise ReportFormatError(at, "missing")
    unknown = [k for k in value if k not in known]
    if unknown and rest is None:
        raise ReportFormatError(f"{where}.{unknown[0]}" if where else unknown[0], "unknown field")
    if rest is not None:
        args[rest] = {k: copy.deepcopy(value[k]) for k in unknown}
    if missing:
        args["missing"] = frozenset(missing)
    return cls(**args)


def _dump(x: Any) -> Any:
    """A view back to plain JSON values (enums as their names, tuples as lists)."""
    if isinstance(x, Enum):
        return x.value
    if is_dataclass(x) and not isinstance(x, type):
        out: dict[str, Any] = {}
        left_out: frozenset[str] = getattr(x, "missing", frozenset())
        for f in fields(x):
            v = getattr(x, f.name)
            if f.metadata.get("rest"):
                out.update(copy.deepcopy(dict(v)))
            elif not f.metadata.get("missing") and f.name not in left_out:
                out[f.name] = _dump(v)
        return out
    if isinstance(x, tuple | list):
        return [_dump(v) for v in x]
    if isinstance(x, Mapping):
        return {_dump(k): _dump(v) for k, v in x.items()}
    return x


class _View:
    """``to_json`` for every view class."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = _dump(self)
        return out


# -- the view: one class per object of the schema ------------------------------------------


@dataclass(frozen=True, slots=True)
class NotApplicable(_View):
    """A figure the model leaves undefined on this log, and why: where a field's type
    names it (``float | NotApplicable``), the JSON holds ``{"not_applicable": code,
    "reason": words}`` instead of a number. Renderers print :attr:`short` in a table cell
    and :attr:`reason` in a sentence."""

    not_applicable: Undefined
    reason: str

    @property
    def short(self) -> str:
        return self.not_applicable.short


def not_applicable(why: Undefined) -> dict[str, str]:
    """The JSON form of a figure the model leaves undefined."""
    return {"not_applicable": why.value, "reason": why.words}


def _or_na(x: float | None, why: Undefined) -> Any:
    """``x``, or the not-applicable form when it is missing or not finite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return not_applicable(why)
    return x


@dataclass(frozen=True, slots=True)
class InputFile(_View):
    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ThresholdsView(_View):
    """``options.thresholds``: the decision thresholds of this run (fractions)."""

    bandwidth_margin: float
    min_dram_gain: float
    min_pool_advantage: float
    min_pool_saving: float
    min_requests: int
    min_reuse: float
    objective: Objective
    pilot_fraction: float
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class PricesView(_View):
    """``options.prices``: the price flags of this run (None: the catalog's)."""

    dram_gb_month_usd: float | None
    gpu_hour_usd: float | None
    nic_node_month_usd: float | None
    nvme_tb_month_usd: float | None
    prices_file: str | None
    store_month_usd: float | None
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class RunOptions(_View):
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
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class Skipped(_View):
    """``trace.skipped``: input rows left out, by reason, with a few examples."""

    total: int | None = field(default=None, metadata=_ABSENT)
    by_reason: Mapping[str, int] | None = field(default=None, metadata=_ABSENT)
    examples: tuple[str, ...] | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class Tokenization(_View):
    tokenizer: str | None = field(default=None, metadata=_ABSENT)
    template: str | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class TraceSection(_View):
    """``trace``: the log's size and what it carries."""

    n_requests: int
    duration_s: float
    prompt_tokens_total: int
    mean_prompt_tokens: float
    skipped: Skipped
    tokenization: Tokenization
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class ModelFigures(_View):
    """``models.per_model[]``: one served model's share of the log and its reuse."""

    model: str
    requests: int
    prompt_tokens: int
    catalog_id: str | None = field(default=None, metadata=_ABSENT)
    ceiling_hit_rate: float | None = field(default=None, metadata=_ABSENT)
    footprint_gb: float | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class ModelsSection(_View):
    """``models``: the models the log names (an empty object when it names none)."""

    count: int | None = field(default=None, metadata=_ABSENT)
    per_model: tuple[ModelFigures, ...] | None = field(default=None, metadata=_ABSENT)
    shared_pool_note: str | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class MeasuredRate(_View):
    requests: int
    hit_rate: float
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class MeasuredHits(_View):
    """``measured_vs_projected.measured``: the hit rate the log's responses report."""

    requests: int
    steady_requests: int
    hit_rate: float
    by_model: Mapping[str, MeasuredRate] | None = field(default=None, metadata=_ABSENT)
    # responses claiming more cached tokens than their prompt holds, left out
    excluded_requests: int | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class ProjectedHits(_View):
    """``measured_vs_projected.projected``: today's deployment replayed."""

    hit_rate: float
    instances: int
    router: str
    local_capacity_tokens_per_instance: int
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class MeasuredVsProjected(_View):
    """``measured_vs_projected``: the comparison's keys are absent when the trace was too
    small to replay (``projected`` is then null)."""

    measured: MeasuredHits
    projected: ProjectedHits | None
    tolerance: float | None = field(default=None, metadata=_ABSENT)
    within_tolerance: bool | None = field(default=None, metadata=_ABSENT)
    fitted_local_capacity_tokens_per_instance: int | None = field(default=None, metadata=_ABSENT)
    fitted_hit_rate: float | None = field(default=None, metadata=_ABSENT)
    fit_note: str | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class EngineMedium(_View):
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
    peak_gb: float | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class OccupancyPointView(_View):
    """``engine_events.timeline[]``: blocks held per medium ``t_s`` after the first batch."""

    t_s: float
    blocks: Mapping[str, int]
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class EngineEventsView(_View):
    """``engine_events``: what a KV-event recording shows of the engines' own caches
    (present only when the input is a recording; analyzer/ingest/kvevents.py)."""

    engines: int
    batches: int
    events: int
    span_s: float
    block_size: int
    media: tuple[EngineMedium, ...]
    clears: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    gaps: int
    lost_batches: int
    complete: bool
    timeline: tuple[OccupancyPointView, ...]
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class Check(_View):
    """``verdict.checks[]``: one step of the decision (value and threshold in the check's
    unit: a fraction, GB/s or USD, as its name says)."""

    step: int
    name: str
    passed: bool | None
    value: float | None
    threshold: float | None
    text: str
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class ProjectionView(_View):
    """``verdict.projection``: projected gains against the baseline (fractions)."""

    pooled_throughput_gain: float | None
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class VerdictSection(_View):
    verdict: Verdict
    reasons: tuple[str, ...]
    confidence: str
    confidence_statement: str
    missing: tuple[str, ...]
    checks: tuple[Check, ...]
    projection: ProjectionView
    scenario: Scenario | None
    objective: Objective
    reason_facts: Any
    figures: Any
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class CurvePoint(_View):
    """One point of a hit-ratio curve: steady-state hit rate at a cache capacity."""

    capacity_tokens: int
    hit_rate: float | None
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class Capacity(_View):
    """A cache capacity in tokens, GB (1e9 bytes) and GiB."""

    capacity_tokens: int | None = field(default=None, metadata=_ABSENT)
    capacity_gb: float | None = field(default=None, metadata=_ABSENT)
    capacity_gib: float | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class ReuseSources(_View):
    """``reuse.analysis.sources``: whose earlier requests the reused tokens come from."""

    share_of_prompt: Mapping[str, float] | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class TopPrefix(_View):
    prefix_tokens: int | None = field(default=None, metadata=_ABSENT)
    requests: int | None = field(default=None, metadata=_ABSENT)
    reused_tokens: int | None = field(default=None, metadata=_ABSENT)
    preview: str | None = field(default=None, metadata=_ABSENT)
    hash: str | None = field(default=None, metadata=_ABSENT)
    tenants: int | None = field(default=None, metadata=_ABSENT)
    models: tuple[str, ...] | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class TopPrefixes(_View):
    by_volume: tuple[TopPrefix, ...] | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class ReuseAnalysis(_View):
    """``reuse.analysis``: ``kvpool reuse --json`` of the log (the sections the report
    draws are typed; the rest travels as the reuse stage wrote it)."""

    curves: Mapping[str, tuple[CurvePoint, ...]] | None = field(default=None, metadata=_ABSENT)
    knees: Mapping[str, Capacity] | None = field(default=None, metadata=_ABSENT)
    sources: ReuseSources | None = field(default=None, metadata=_ABSENT)
    top_prefixes: TopPrefixes | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class ReuseFiguresView(_View):
    """``reuse.figures``: the steady-state reuse figures the decision used."""

    measurable: bool
    reason: str | None
    ceiling_hit_rate: float
    cold_ceiling_hit_rate: float
    warmup: float
    median_prefix_tokens: int | NotApplicable  # not applicable: no prefix is reused
    knee_tokens: int
    knee_fraction: float
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class ReuseSection(_View):
    figures: ReuseFiguresView
    analysis: ReuseAnalysis


@dataclass(frozen=True, slots=True)
class BreakEvenPoint(_View):
    prefix_tokens: int
    break_even_gbps: float | NotApplicable  # not applicable: loading never beats recomputing
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class TierLink(_View):
    """``bandwidth.tiers[]``: a tier's link (role: dram, nvme or pool)."""

    role: Tier
    tier: str
    bandwidth_gbps: float
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class BandwidthSection(_View):
    """``bandwidth``: the break-even bandwidth at the median reusable prefix (not
    applicable where loading never beats recomputing)."""

    break_even_gbps: float | NotApplicable
    bytes_per_token: int
    prefill_tokens_per_s: float | NotApplicable
    prefix_tokens: int
    tiers: tuple[TierLink, ...]
    curve: tuple[BreakEvenPoint, ...]
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class CostSection(_View):
    """``cost``: the cost model's setting (model, GPU, precision)."""

    bytes_per_token: int
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class Interval(_View):
    """A figure with the low and high ends of its range."""

    value: float
    low: float
    high: float
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class ErrorBand(_View):
    """``uncertainty.band``: the cost model's measured error."""

    basis: str
    kind: str
    extrapolated: bool
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class Uncertainty(_View):
    """``uncertainty``: ranges from the cost model's measured error."""

    band: ErrorBand
    break_even_gbps: Interval | NotApplicable
    prefill_tokens_per_s: Interval | NotApplicable
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class TtftSeconds(_View):
    """A scenario's TTFT statistics, seconds."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class ScenarioView(_View):
    """``replay.scenarios[name]``: one deployment option replayed."""

    hit_rate: float
    hit_rate_by_tier: Mapping[Tier, float]
    ttft_s: TtftSeconds
    prefill_gpu_s: float
    network_bytes: float
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class ReplayCluster(_View):
    """``replay.cluster``: the cluster every scenario ran on."""

    instances: int
    tp: int
    gpu: str
    nodes: int
    router: str
    ttft_slo_s: float
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class ReplaySection(_View):
    """``replay``: ``kvpool replay --json`` of the log."""

    cluster: ReplayCluster
    scenarios: Mapping[Scenario, ScenarioView]
    miniature: Mapping[str, Any] | None = field(
        default=None, metadata=_ABSENT
    )  # read by replay.miniature.describe
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class SizingSection(_View):
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
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class Setting(_View):
    option: str
    value: str
    why: str
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class ProductSettingsView(_View):
    """``settings[]``: one product's settings and its launch snippet."""

    product: str
    mode: DeployOption
    settings: tuple[Setting, ...]
    snippet: str
    snippet_lang: str
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class ProductChecked(_View):
    product: str
    version: str
    pages: str
    options: str
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class FlipRowView(_View):
    """``sensitivity.rows[]``: one perturbed input and the verdict it gives."""

    dimension: str
    value: str
    verdict: Verdict
    flips: bool
    note: str | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class SensitivitySection(_View):
    rows: tuple[FlipRowView, ...]
    summary: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CriterionView(_View):
    metric: str
    op: str
    threshold: float
    text: str
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class GateView(_View):
    """``gates.plan[]``: one pilot gate (``analyzer.advisor.gates.gate_from_json`` reads it
    for ``kvpool validate``)."""

    id: str
    name: str
    run: str
    results_role: str
    criteria: tuple[CriterionView, ...]
    projected: Mapping[str, float]
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class GatesSection(_View):
    plan: tuple[GateView, ...]


@dataclass(frozen=True, slots=True)
class PilotCommandView(_View):
    tool: str
    purpose: str
    note: str
    command: str
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class PilotSection(_View):
    commands: tuple[PilotCommandView, ...]


@dataclass(frozen=True, slots=True)
class DeployFileView(_View):
    """``deploy.files[]``: one file of the deployment bundle (path under deploy/)."""

    path: str
    kind: str
    role: str
    option: DeployOption
    stack: str
    text: str
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class PerProcess(_View):
    """``deploy.per_process[]``: one product setting's size per process, in bytes."""

    option: DeployOption
    stack: str
    setting: str
    per: str
    bytes_each: int
    units: int
    units_per_node: int
    total: str
    total_bytes: int
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class DeploySection(_View):
    files: tuple[DeployFileView, ...]
    per_process: tuple[PerProcess, ...]


@dataclass(frozen=True, slots=True)
class Assumption(_View):
    what: str
    value: str
    source: str


@dataclass(frozen=True, slots=True)
class Load(_View):
    """``economics.load``: requests/s on average and in the busiest window (not
    applicable for a log whose requests share one timestamp)."""

    mean_rps: float | NotApplicable
    peak_rps: float | NotApplicable
    peak_window_s: float
    peak_factor: float | NotApplicable
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class MoneyView(_View):
    """A plan's or a fleet's money per month: its GPUs (not applicable: no size, or no GPU price) and what
    the option adds."""

    gpu_usd_month: float | NotApplicable
    dram_gb: float
    dram_usd_month: float
    nvme_tb: float
    nvme_usd_month: float
    nic_nodes: int
    nic_usd_month: float
    store_usd_month: float
    added_usd_month: float
    total_usd_month: float | NotApplicable
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class FleetView(_View):
    """``fleet[option]``: one option for the whole log, every model's plan of it summed
    (counts, money; TTFT of every model's requests together), and its money against the
    baseline's."""

    option: Scenario
    status: PlanStatus
    models: int
    instances: int | NotApplicable
    gpus: int | NotApplicable
    nodes: int | NotApplicable
    gpus_above_cap: int | None
    cap_gpus: int
    floor_p90_s: float | None
    ttft_s: TtftSeconds | NotApplicable
    hit_rate: float | NotApplicable
    money: MoneyView
    gpus_saved: int | NotApplicable
    gpu_saving_usd_month: float | NotApplicable
    net_usd_month: float | NotApplicable
    pilot_usd: float | NotApplicable
    payback_months: float | NotApplicable
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class PlanCapacity(_View):
    """``plans[].capacity``: what each tier holds, in tokens and GB (null: no such tier)."""

    bytes_per_token: int
    tokens: Mapping[str, int | None]
    gb: Mapping[str, float | None]
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class PlanLoadView(_View):
    """``plans[].load``: the load the plan serves; it is replayed at the busiest window's."""

    mean_rps: float | NotApplicable
    peak_rps: float | NotApplicable
    peak_window_s: float
    sizing_rate_multiple: float | NotApplicable
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class PlanView(_View):
    """``plans[]``: one option for one model, sized by replaying at size: the record
    every count, TTFT and amount of money of the report comes from."""

    option: Scenario
    model: str
    served_as: str
    gpu: str
    tp: int
    status: PlanStatus
    instances: int | NotApplicable
    gpus: int | NotApplicable
    nodes: int | NotApplicable
    instances_per_node: int
    gpus_per_node: int
    instances_above_cap: int | None
    gpus_above_cap: int | None
    cap_gpus: int
    router: str
    capacity: PlanCapacity
    load: PlanLoadView
    ttft_slo_s: float
    ttft_s: TtftSeconds | NotApplicable
    hit_rate: float | NotApplicable
    money: MoneyView
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class Price(_View):
    """``economics.prices[]``: one price used, with its source and the date it was read."""

    what: str
    usd: float | None
    unit: str
    source: str | None = field(default=None, metadata=_ABSENT)
    date: str | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class EconomicsSection(_View):
    """``economics``: the load, the prices used and the money's constants (each option's
    money is its fleet's, ``fleet[option]``)."""

    load: Load | None = field(default=None, metadata=_ABSENT)
    prices: tuple[Price, ...] | None = field(default=None, metadata=_ABSENT)
    aggregated_prefill_share: float | None = field(default=None, metadata=_ABSENT)
    pilot_hours: float | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class SideOption(_View):
    """``side_by_side[].options[name]``: one option re-priced on another model or GPU."""

    ttft_mean_s: float | NotApplicable | None = field(default=None, metadata=_ABSENT)
    ttft_p90_s: float | NotApplicable | None = field(default=None, metadata=_ABSENT)
    gpus_at_peak_load: int | NotApplicable | None = field(default=None, metadata=_ABSENT)
    total_usd_month: float | NotApplicable | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class SideBySideRow(_View):
    """``side_by_side[]``: the log priced on one model and GPU."""

    model: str
    tp: int
    gpu: str
    verdict: Verdict | None = field(default=None, metadata=_ABSENT)
    options: Mapping[Scenario, SideOption] | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)


@dataclass(frozen=True, slots=True)
class IsolationPolicyView(_View):
    """``isolation.options[name].policies[policy]``: one option under one policy, at
    the size that meets the SLO under it (None: not known)."""

    hit_rate: float | None
    ttft_mean_s: float | None
    ttft_p90_s: float | None
    gpus: int | None
    total_usd_month: float | None
    meets_slo: bool
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class IsolationOptionView(_View):
    """``isolation.options[name]``: one option across the policies planned."""

    policies: Mapping[str, IsolationPolicyView]
    hits_lost_share: float | None
    isolating_usd_month: Mapping[str, float | None]
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class IsolationProductView(_View):
    """``isolation.products[]``: whether one stack of the bundle keys every tier by the
    cache salt at the versions it targets (analyzer/advisor/salting.py)."""

    option: str
    stack: str
    holds: bool
    needs: str
    paths: tuple[str, ...]
    leaks: tuple[str, ...]
    refusal: str | None
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class IsolationSection(_View):
    """``isolation``: what keeping tenants apart costs (analyzer/advisor/isolation.py)."""

    policy: str
    described: str
    salt_fields: str
    policies: tuple[str, ...]
    tenants: int
    requests_without_tenant: int
    users_known: bool
    user_groups: int | None
    keyed_by: Mapping[str, int]
    shares_across_tenants: bool
    ceiling: Mapping[str, float]
    cross_tenant_hit_share: float
    options: Mapping[Scenario, IsolationOptionView]
    pool_option: str | None
    sentence: str
    material: bool
    recommended_option: str | None = field(default=None, metadata=_ABSENT)
    products: tuple[IsolationProductView, ...] | None = field(default=None, metadata=_ABSENT)
    rest: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_REST)


@dataclass(frozen=True, slots=True)
class Report(_View):
    """A ``kvpool.report/3`` document as typed, frozen objects (module docstring)."""

    schema: str
    kvpool_version: str
    summary: tuple[str, ...]
    inputs: tuple[InputFile, ...]
    options: RunOptions
    trace: TraceSection
    models: ModelsSection
    warnings: tuple[str, ...]
    measured_vs_projected: MeasuredVsProjected | None
    verdict: VerdictSection
    reuse: ReuseSection
    bandwidth: BandwidthSection | None
    cost: CostSection | None
    uncertainty: Uncertainty | None
    replay: ReplaySection | None
    sizing: SizingSection | None
    settings: tuple[ProductSettingsView, ...]
    products_checked: tuple[ProductChecked, ...]
    sensitivity: SensitivitySection
    gates: GatesSection
    pilot: PilotSection
    deploy: DeploySection
    assumptions: tuple[Assumption, ...]
    economics: EconomicsSection | None
    side_by_side: tuple[SideBySideRow, ...]
    plans: tuple[PlanView, ...]
    fleet: Mapping[Scenario, FleetView]
    arrivals: Mapping[str, Any] | None
    engine_events: EngineEventsView | None = field(default=None, metadata=_ABSENT)
    isolation: IsolationSection | None = field(default=None, metadata=_ABSENT)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=_MISSING)

    @classmethod
    def from_json(cls, doc: Any) -> Report:
        """The view of a document as ``json.loads`` gives it; :class:`ReportFormatError`
        names the first field that does not fit (the schema version first)."""
        if not isinstance(doc, dict):
            raise ReportFormatError("", f"expected a JSON object, got {_kind(doc)}")
        if doc.get("schema") != SCHEMA:
            raise ReportFormatError(
                "schema", f"not a {SCHEMA} document (schema {doc.get('schema')!r})"
            )
        out: Report = _load_object(cls, doc, "")
        return out

    @property
    def scenarios(self) -> Mapping[Scenario, ScenarioView]:
        """The replayed scenarios by name (empty without a replay)."""
        return {} if self.replay is None else self.replay.scenarios


@dataclass(frozen=True, slots=True)
class ReportDocument:
    """One analysis in the report's schema, built once: ``report`` is the typed view of
    the canonical document (rounded floats, keys in the order report.json reads back in),
    its ``summary`` the three opening sentences, written from the rounded figures the
    reader sees."""

    report: Report

    @classmethod
    def of(cls, result: AnalysisResult) -> ReportDocument:
        from analyzer.report.summary import summary_sentences

        doc: dict[str, Any] = canonical(report_document(result))
        doc["summary"] = []
        # the order a reloaded report.json has, so a fresh and a reloaded view render alike
        doc = json.loads(json.dumps(doc, sort_keys=True))
        view = Report.from_json(doc)
        return cls(replace(view, summary=tuple(summary_sentences(view))))

    @classmethod
    def from_json(cls, doc: Any, source: str = "report.json") -> ReportDocument:
        """A document loaded back; a malformed one is an :class:`InputError` naming
        ``source`` and the field."""
        try:
            return cls(Report.from_json(doc))
        except ReportFormatError as exc:
            raise InputError(
                exc.message,
                Location(source, field=exc.field or None),
                hint="pass the report.json written by `kvpool analyze -o DIR`",
            ) from None

    @classmethod
    def load(cls, path: str | Path) -> ReportDocument:
        """``report.json`` read back; an unreadable or malformed file is a one-line
        :class:`InputError` naming the file (and the field)."""
        p = Path(path)
        note_input(p)
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise InputError("not a UTF-8 JSON file", Location(str(path))) from None
        except OSError as exc:
            raise InputError(
                f"cannot read report: {exc.strerror or exc}", Location(str(path))
            ) from None
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON: {exc.msg}", Location(str(path), exc.lineno)) from None
        except RecursionError:
            raise InputError("JSON nested too deeply", Location(str(path))) from None
        return cls.from_json(doc, str(path))

    @property
    def summary(self) -> tuple[str, ...]:
        return self.report.summary

    @property
    def verdict(self) -> Verdict:
        return self.report.verdict.verdict

    def to_json(self) -> dict[str, Any]:
        """The document as ``report.json`` holds it (a fresh copy, free to change)."""
        return self.report.to_json()


def report_json(result: AnalysisResult) -> dict[str, Any]:
    """``ReportDocument.of(result).to_json()``: the analysis as ``report.json`` holds it."""
    return ReportDocument.of(result).to_json()


def _round(x: float) -> float | None:
    if not math.isfinite(x):
        return None
    if x == 0:
        return 0.0
    return float(f"{x:.6g}")


def canonical(obj: Any) -> Any:
    """Rounded floats (6 significant digits), no NaN/inf, plain types: stable bytes."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        return _round(float(obj))
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [canonical(v) for v in obj]
    return str(obj)


def _options_json(o: AnalyzeOptions) -> dict[str, Any]:
    """The report's ``options`` section (flat, as ``kvpool.report/1`` has it). Ingest
    settings that could name a file or a tenant (salt file, columns) stay out."""
    c, i = o.cluster, o.ingest
    return {
        # a config.json or a model folder: its folder's name, never its path
        "model": model_label(c.model),
        "gpu": c.gpu,
        "tp": c.tp,
        "instances": c.instances,
        "gpus_per_node": c.gpus_per_node,
        "dram_scope": c.dram_scope,
        "kv_dtype": c.kv_dtype,
        "mfu": c.mfu,
        "pool_gbps": c.pool_gbps,
        "pool_tier": c.pool_tier,
        "dram_tier": c.dram_tier,
        "local_capacity_tokens": c.local_capacity_tokens,
        "dram_capacity_tokens": c.dram_capacity_tokens,
        "pool_capacity_tokens": c.pool_capacity_tokens,
        "router": c.router,
        "ttft_slo_s": o.ttft_slo_s,
        "warmup": c.warmup_fraction,
        "block_size": i.block_size,
        "fmt": i.fmt,
        "template": i.template,
        # a tokenizer folder: keep the name only
        "tokenizer": i.tokenizer
        if i.tokenizer in ("cl100k", "cl100k_base")
        else Path(i.tokenizer).name,
        "only_model": o.only_model,
        "current_instances": o.current_instances,
        "current_router": o.current_router,
        "current_local_capacity_tokens": o.current_local_capacity_tokens,
        "size_search": o.size_search,
        "max_gpus": o.max_gpus,
        "model_given": o.model_given,
        "tp_given": o.tp_given,
        "sensitivity_replays": o.sensitivity_replays,
        "knee_fraction": o.knee_fraction,
        "thresholds": asdict(o.thresholds),
        "peak_window_s": o.peak_window_s,
        "prices": {
            **asdict(o.prices),
            # a path: keep the file's name only
            "prices_file": None
            if o.prices.prices_file is None
            else Path(o.prices.prices_file).name,
        },
    }


def report_document(r: AnalysisResult) -> dict[str, Any]:
    """The analysis in the schema's layout; a ``--model`` given as a config or a folder
    is named by the folder's name wherever a stage echoes the flag (no path leaves)."""
    doc = _report_document(r)
    flag = r.options.model
    return doc if model_label(flag) == flag else _renamed(doc, flag, model_label(flag))


def _renamed(x: Any, old: str, new: str) -> Any:
    if isinstance(x, str):
        return new if x == old else x
    if isinstance(x, dict):
        return {k: _renamed(v, old, new) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_renamed(v, old, new) for v in x]
    return x


def _report_document(r: AnalysisResult) -> dict[str, Any]:
    d = r.decision
    opts = _options_json(r.options)
    sizing = None
    if r.sizing is not None:
        s = r.sizing
        sizing = {
            **asdict(s),
            "pool_capacity_gb": s.pool_capacity_gb,
            "pool_capacity_gib": s.gib(s.pool_capacity_tokens),
            "dram_per_node_gb": s.dram_per_node_gb,
            "dram_per_node_gib": s.gib(s.dram_per_node_tokens),
            "pool_segment_per_node_gb": s.pool_segment_per_node_gb,
            "hbm_cache_per_instance_gb": s.gb(s.hbm_cache_per_instance_tokens),
            "knee_fraction": r.reuse.knee_fraction,
        }
    flips = [f.to_json() for f in r.flips]
    return {
        "schema": SCHEMA,
        "kvpool_version": __version__,
        "inputs": [i.to_json() for i in r.inputs],
        "options": opts,
        "trace": {
            **asdict(r.trace),
            "skipped": r.skipped.to_json(),
            "tokenization": r.tokenization.to_json(),
        },
        "models": {} if r.models is None else r.models.to_json(),
        "warnings": list(r.warnings),
        "measured_vs_projected": None if r.measured is None else r.measured.to_json(),
        "verdict": {
            "verdict": d.verdict,
            "reasons": list(d.reasons),
            "confidence": d.confidence,
            "confidence_statement": d.confidence_statement,
            "missing": list(d.missing),
            "checks": [asdict(c) for c in d.checks],
            "projection": asdict(d.projection),
            "reason_facts": [[asdict(f) for f in facts] for facts in d.facts],
            "figures": dict(d.derived),
            "scenario": d.scenario,
            "objective": r.options.thresholds.objective,
        },
        "reuse": {"figures": _reuse_figures_json(r), "analysis": r.reuse_report.to_json()},
        "bandwidth": _bandwidth_json(r),
        "cost": None if r.cost is None else r.cost.to_json(),
        "uncertainty": _uncertainty_json(r),
        "replay": _replay_json(r),
        "sizing": sizing,
        "settings": [p.to_json() for p in r.settings],
        "products_checked": list(DOCS_CHECKED),
        "sensitivity": {"rows": flips, "summary": summarize(r.flips)},
        "gates": {"plan": [gates_mod.gate_to_json(g) for g in r.gates]},
        "pilot": {"commands": [c.to_json() for c in r.pilot]},
        "deploy": {
            "files": [f.to_json() for f in r.deploy],
            "per_process": [p.to_json() for p in r.per_process],
        },
        "assumptions": assumptions(r),
        "economics": _economics_json(r),
        "side_by_side": _side_by_side_json(r),
        "plans": [_plan_json(p) for p in r.plans],
        "fleet": _fleet_json(r),
        "arrivals": _arrivals_json(r),
        # only for a KV-event recording: other inputs' reports keep their bytes
        **({} if r.engine_events is None else {"engine_events": r.engine_events.to_json()}),
        "isolation": None if r.isolation is None else r.isolation.to_json(),
    }


def _load_json(load: dict[str, Any], mean_rps: float) -> dict[str, Any]:
    """A load's figures; a log whose requests share one timestamp has no request rate."""
    if not mean_rps > 0:
        for key in ("mean_rps", "peak_rps", "peak_factor", "sizing_rate_multiple"):
            if key in load:
                load[key] = not_applicable(Undefined.NO_REQUEST_RATE)
    return load


# The reason a plan has no size, by how its search ended.
_UNSIZED = {
    PlanStatus.ABOVE_CAP: Undefined.ABOVE_CAP,
    PlanStatus.CANNOT_MEET: Undefined.SLO_NEVER_MET,
    PlanStatus.PREFILL_BOUND: Undefined.PREFILL_BOUND,
}


def _unsized(status: str | None) -> Undefined:
    """Why a plan (or a fleet) has no instances, and so no GPUs, TTFT or money."""
    return _UNSIZED.get(
        PlanStatus(status) if status else PlanStatus.CANNOT_MEET, Undefined.SLO_NEVER_MET
    )


def _money_json(money: dict[str, Any], sized: bool, status: str) -> dict[str, Any]:
    why = Undefined.NOT_PRICED if sized else _unsized(status)
    for key in ("gpu_usd_month", "total_usd_month"):
        money[key] = _or_na(money[key], why)
    return money


def _sized_json(out: dict[str, Any]) -> dict[str, Any]:
    """A plan's or a fleet's counts, TTFT, hit rate and money: each one it has no value
    for (no count within the cap meets the SLO) in its not-applicable form."""
    sized = out["instances"] is not None
    why = _unsized(out["status"])
    for key in ("instances", "gpus", "nodes", "ttft_s", "hit_rate"):
        out[key] = _or_na(out[key], why)
    out["money"] = _money_json(out["money"], sized, out["status"])
    return out


def _plan_json(p: DeploymentPlan) -> dict[str, Any]:
    out = _sized_json(p.to_json())
    out["load"] = _load_json(out["load"], p.load.mean_rps)
    return out


def _fleet_json(r: AnalysisResult) -> dict[str, Any]:
    """``fleet``: each option for the whole log, with its money against the baseline's
    (a figure it has none for says why: its own size's reason, the baseline's, no GPU
    price, no saving)."""
    worth = values(r.fleets, r.prices)
    base = next((f for f in r.fleets if f.option == Scenario.LOCAL), None)
    base_why = Undefined.SLO_NEVER_MET if base is None else _unsized(base.status)
    out = {}
    for f in r.fleets:
        v = worth[f.option]
        own = _unsized(f.status)
        priced = r.prices.gpu_month_usd(f.plans[0].gpu) is not None if f.plans else False
        saved_why = own if f.gpus is None else base_why
        saving_why = saved_why if v.gpus_saved is None or priced else Undefined.NOT_PRICED
        net_why = (
            (own if f.gpus is None else Undefined.NOT_PRICED)
            if f.money.total_usd_month is None
            else base_why
            if base is None or base.gpus is None
            else Undefined.NOT_PRICED
        )
        pilot_why = own if f.gpus is None else Undefined.NOT_PRICED
        if f.option == Scenario.LOCAL:
            payback_why = Undefined.BASELINE
        elif v.net_usd_month is None:
            payback_why = net_why
        elif v.net_usd_month <= 0:
            payback_why = Undefined.NO_NET_SAVING
        else:
            payback_why = pilot_why
        row = {**_sized_json(f.to_json()), **v.to_json()}
        row["gpus_saved"] = _or_na(row["gpus_saved"], saved_why)
        row["gpu_saving_usd_month"] = _or_na(row["gpu_saving_usd_month"], saving_why)
        row["net_usd_month"] = _or_na(row["net_usd_month"], net_why)
        row["pilot_usd"] = _or_na(row["pilot_usd"], pilot_why)
        row["payback_months"] = _or_na(row["payback_months"], payback_why)
        out[f.option] = row
    return out


def _replay_json(r: AnalysisResult) -> dict[str, Any] | None:
    """``replay``: each option's replay at its planned size and the busiest load (the
    replay of the primary model's requests; ``kvpool replay --instances N`` gives the
    same figures at the log's own rate)."""
    runs = {p.option: p for p in r.plans if p.run is not None and p.model == r.plans[0].model}
    if not runs:
        return None
    first = next(iter(runs.values()))
    assert first.run is not None
    c = r.cluster if r.cluster is not None else first.run.resolved.cluster
    cluster = {
        **asdict(replace(c, instances=first.instances or c.instances)),
        "nodes": first.nodes,
        "instances_per_node": first.instances_per_node,
        "dram_caches_per_node": c.dram_sharers,
        "bytes_per_token": first.capacities.bytes_per_token,
        "block_size": first.run.resolved.block_size,
        "requests": r.trace.n_requests,
        "ttft_slo_s": r.options.ttft_slo_s,
        "slo_quantile": 0.9,
        "sizing_rate_multiple": first.load.peak_factor,
    }
    for k in (
        "local_capacity_tokens",
        "dram_capacity_tokens",
        "nvme_capacity_tokens",
        "pool_capacity_tokens",
    ):
        v = cluster[k]
        cluster[k] = "unbounded" if v is not None and v >= 2**62 else v
    scenarios = {}
    for name, p in runs.items():
        assert p.run is not None
        run = p.run.to_json()
        for key in ("max_rate_scale_at_slo", "rate_search"):  # a plan is sized by count
            run.pop(key, None)
        scenarios[name] = {
            **run,
            "instances": p.instances if p.instances is not None else p.instances_above_cap,
        }
    out: dict[str, Any] = {
        "schema": "kvpool.replay/1",
        "cluster": cluster,
        "scenarios": scenarios,
    }
    mini = next((x for x in r.miniatures if x is not None), None)
    if mini is not None:
        out["miniature"] = mini.to_json()
    return out


def _arrivals_json(r: AnalysisResult) -> dict[str, Any] | None:
    if r.arrivals is None:
        return None
    out: dict[str, Any] = dict(r.arrivals.to_json())
    out["effect"] = None if r.arrivals_effect is None else r.arrivals_effect.to_json()
    return out


# -- figures the model leaves undefined, in their not-applicable form ------------------------


def _reuse_figures_json(r: AnalysisResult) -> dict[str, Any]:
    """``reuse.figures``: the median reusable prefix of a log that reuses none is no
    length at all (the median of nothing)."""
    out = asdict(r.reuse)
    if r.reuse.measurable and not r.reuse.median_prefix_tokens:
        out["median_prefix_tokens"] = not_applicable(Undefined.NO_REUSE)
    return out


def _bandwidth_json(r: AnalysisResult) -> dict[str, Any] | None:
    """``bandwidth``: where a prefix's prefill saves less than placing its loaded KV
    costs, the break-even is never reached (the cost model's infinity)."""
    if r.bandwidth is None:
        return None
    never = Undefined.LOADING_NEVER_PAYS
    return {
        **asdict(r.bandwidth),
        "break_even_gbps": _or_na(r.bandwidth.break_even_gbps, never),
        "prefill_tokens_per_s": _or_na(
            r.bandwidth.prefill_tokens_per_s, Undefined.NO_PREFILL_SAVING
        ),
        "curve": [
            {**p.to_json(), "break_even_gbps": _or_na(p.break_even_gbps, never)}
            for p in r.break_even_curve
        ],
    }


def _uncertainty_json(r: AnalysisResult) -> dict[str, Any] | None:
    """``uncertainty``: a range around an undefined figure is undefined too."""
    if r.uncertainty is None:
        return None
    out = r.uncertainty.to_json()
    for key, why in (
        ("break_even_gbps", Undefined.LOADING_NEVER_PAYS),
        ("prefill_tokens_per_s", Undefined.NO_PREFILL_SAVING),
    ):
        if not math.isfinite(out[key]["value"]):
            out[key] = not_applicable(why)
    return out


def _economics_json(r: AnalysisResult) -> dict[str, Any] | None:
    """``economics``: the load, the prices, the constants; a log whose requests share one
    timestamp has no request rate."""
    gpu = r.plans[0].gpu if r.plans else r.prices.gpu
    tp = r.plans[0].tp if r.plans else r.options.tp
    out = economics_json(r.load, r.prices, gpu, tp)
    if not r.load.mean_rps > 0:
        for key in ("mean_rps", "peak_rps", "peak_factor"):
            out["load"][key] = not_applicable(Undefined.NO_REQUEST_RATE)
    return out


def _side_by_side_json(r: AnalysisResult) -> list[dict[str, Any]]:
    """``side_by_side``: an option without a size there says why (its search's end); one
    sized on a GPU without a price has no cost."""
    out = []
    for c in r.side_by_side:
        row = c.to_json()
        for o in row["options"].values():
            sized = o["gpus_at_peak_load"] is not None
            why = _unsized(o.get("status"))
            for key in ("ttft_mean_s", "ttft_p90_s", "gpus_at_peak_load"):
                o[key] = _or_na(o[key], why)
            o["total_usd_month"] = _or_na(
                o["total_usd_month"], Undefined.NOT_PRICED if sized else why
            )
        out.append(row)
    return out


def assumptions(r: AnalysisResult) -> list[dict[str, Any]]:
    o = r.options
    th = o.thresholds
    out = [
        {
            "what": "Steady-state reuse",
            "value": f"first {100 * o.warmup:.0f}% of requests warm the cache uncounted",
            "source": "warm-up excluded from hit rates, as cache simulators do (e.g. "
            "libCacheSim, github.com/1a1a11a/libCacheSim); docs/reuse.md",
        },
        {
            "what": "Reuse guideline",
            "value": f"{100 * th.min_reuse:.0f}% steady-state prefix reuse",
            "source": "kvpool default threshold (docs/advisor.md, overridable)",
        },
        {
            "what": "Objective",
            "value": (
                "lowest monthly cost serving the peak load within the TTFT SLO; a pool must "
                f"save {100 * th.min_pool_saving:.0f}% of the baseline's monthly cost more than "
                "the best local option"
                if th.objective == Objective.COST
                else "lowest mean TTFT without lowering the rate served within the SLO; a "
                f"pool must beat local DRAM offload by {100 * th.min_pool_advantage:.0f}%"
            ),
            "source": "--objective, --pool-margin (docs/advisor.md)",
        },
        {
            "what": "Pilot KPIs",
            "value": f"at least {100 * th.pilot_fraction:.0f}% of the projected TTFT reduction "
            "and throughput gain, p90 TTFT within the SLO, 72 h stability",
            "source": "gated pilot derived from the projection (docs/advisor.md)",
        },
        {
            "what": "Break-even bandwidth",
            "value": "bytes/token x prefill tokens/s of the prefix's marginal tokens",
            "source": "Mooncake (Qin et al., FAST'25): load KV when faster than recomputing "
            "it; docs/cost-model.md",
        },
        {
            "what": "Model and GPU",
            "value": f"{model_label(o.model)} on {o.tp} x {o.gpu}, KV {o.kv_dtype}",
            "source": "kvpool catalogs models/models.toml, models/hardware.toml (model "
            "config.json files and vendor datasheets)",
        },
        {
            "what": "Pool link",
            "value": (
                f"{o.pool_gbps:g} GB/s per node ({8 * o.pool_gbps:g} Gb/s)"
                if o.pool_gbps
                else o.pool_tier
            ),
            "source": "--pool-gbps (default: the pool tier's catalog figure, models/hardware.toml; RDMA at "
            "about 87% of line rate, as Mooncake's Transfer Engine reaches)",
        },
        {
            "what": "Replay",
            "value": (
                f"{o.instances} instances, router {o.router}, prefill and decode in one "
                "continuous batch per instance (aggregated serving)"
                if o.cluster.serving == "aggregated"
                else f"{o.instances} prefill instances, router {o.router}, decode not modelled"
            )
            + f", TTFT SLO {1000 * o.ttft_slo_s:,.0f} ms (p90)",
            "source": "kvpool replay (docs/replay.md)",
        },
        {
            "what": "GPUs needed",
            "value": "each option's fewest instances whose replay keeps p90 TTFT within the "
            f"SLO at the busiest {o.peak_window_s:g} s window's load, x TP; "
            + (
                "whole serving GPUs (prefill and decode together)"
                if o.cluster.serving == "aggregated"
                else "prefill GPUs only (a disaggregated prefill pool, as in Mooncake)"
            ),
            "source": "kvpool size search, replaying each option at size (docs/advisor.md)",
        },
        {
            "what": "Knee",
            "value": f"{100 * o.knee_fraction:.0f}% of the LRU ceiling",
            "source": "kvpool reuse LRU curve (exact stack distances, Mattson et al., 1970)",
        },
    ]
    if r.cost is not None and r.cost.mfu is not None:
        out.append(
            {
                "what": "Prefill utilisation (MFU)",
                "value": f"{100 * r.cost.mfu:.0f}% of peak FLOP/s",
                "source": "--mfu: the plain roofline instead of the engine model (MFU as "
                "defined by Chowdhery et al., PaLM, 2022)",
            }
        )
    elif r.cost is not None:
        out.append(
            {
                "what": "Prefill speed",
                "value": f"engine model, weights in {r.cost.weight_dtype}",
                "source": "fitted on published measurements, models/measurements.toml "
                "(kvpool cost check; docs/cost-model.md)",
            }
        )
    if r.plans:
        for p in r.prices.used():
            price = "not priced" if p.usd is None else f"${p.usd:,.4g} per {p.unit}"
            out.append(
                {
                    "what": f"Price: {p.what}",
                    "value": price,
                    "source": p.source + (f" (read {p.date})" if p.date else ""),
                }
            )
    return out
