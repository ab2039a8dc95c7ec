"""The figures the decision rests on, as small frozen records.

The pipeline (:mod:`analyzer.advisor.pipeline`) fills these from the ingest, reuse,
cost and replay stages; the decision, sizing, sensitivity and gate functions read
only these records, so each of them is a pure function a test can drive with
hand-written numbers.

Units are in the field names: ``*_tokens`` are token counts, ``*_gbps`` are GB/s
(decimal, 1e9 bytes per second), ``*_s`` are seconds, ``*_bytes`` are bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from analyzer.errors import UsageError
from analyzer.replay.config import Scenario


class Verdict(StrEnum):
    """What the advisor recommends (docs/advisor.md)."""

    DEPLOY_POOLED = "deploy-pooled"
    LOCAL_OFFLOAD_ONLY = "local-offload-only"  # which tier: the decision's scenario
    NOT_WORTH_IT = "not-worth-it"
    CANNOT_MEET_SLO = "cannot-meet-slo"  # no option meets the TTFT SLO within the GPUs allowed
    INSUFFICIENT_DATA = "insufficient-data"


class DeployOption(StrEnum):
    """What a team is told to configure, by the names the deploy bundle (its folders
    under ``deploy/``), the product settings and the report use."""

    POOLED = "pooled"  # HBM cache plus a cluster-wide KV store (Mooncake, LMCache remote)
    LOCAL_OFFLOAD = "local-offload"  # HBM cache plus a host-DRAM tier per instance
    LOCAL_OFFLOAD_NVME = "local-offload-nvme"  # plus a local NVMe tier per node
    PREFIX_CACHE_ONLY = "prefix-cache-only"  # the engine's HBM prefix cache alone


class Objective(StrEnum):
    """What the last step of the decision optimises (``--objective``)."""

    COST = "cost"
    TTFT = "ttft"

    @classmethod
    def parse(cls, text: str) -> Objective:
        """The objective named by ``--objective``; a usage error names the choices."""
        if text not in cls.__members__.values():
            raise UsageError(f"--objective must be one of {', '.join(cls)}, got {text!r}")
        return cls(text)


class Undefined(StrEnum):
    """Why a figure has no value on this log: the code a report writes in its place
    (``{"not_applicable": code, "reason": words}``), with a short form for a table cell
    and the reason in words for a sentence. Each is an answer the model gives, not a
    failure: a log of one-shot calls with a short system prompt has no break-even
    bandwidth because loading never beats recomputing there."""

    LOADING_NEVER_PAYS = "loading-never-pays"
    NO_PREFILL_SAVING = "no-prefill-saving"
    NO_REUSE = "no-reuse"
    NO_REQUEST_RATE = "no-request-rate"
    SIZE_SEARCH_OFF = "size-search-off"
    SLO_NEVER_MET = "slo-never-met"
    ABOVE_CAP = "above-cap"
    PREFILL_BOUND = "prefill-bound"
    NOT_PRICED = "not-priced"
    NO_NET_SAVING = "no-net-saving"
    BASELINE = "baseline"

    @property
    def short(self) -> str:
        return _UNDEFINED_SHORT[self]

    @property
    def words(self) -> str:
        return _UNDEFINED_WORDS[self]


_UNDEFINED_SHORT = {
    Undefined.LOADING_NEVER_PAYS: "never",
    Undefined.NO_PREFILL_SAVING: "no saving",
    Undefined.NO_REUSE: "no reuse",
    Undefined.NO_REQUEST_RATE: "no rate",
    Undefined.SIZE_SEARCH_OFF: "not sized",
    Undefined.SLO_NEVER_MET: "cannot meet the SLO",
    Undefined.ABOVE_CAP: "above the GPU cap",
    Undefined.PREFILL_BOUND: "prefill-bound",
    Undefined.NOT_PRICED: "not priced",
    Undefined.NO_NET_SAVING: "never",
    Undefined.BASELINE: "baseline",
}
_UNDEFINED_WORDS = {
    Undefined.LOADING_NEVER_PAYS: "loading never beats recomputing at these prefix lengths",
    Undefined.NO_PREFILL_SAVING: "skipping a prefix this short saves no prefill time",
    Undefined.NO_REUSE: "no request reuses a prefix of an earlier one",
    Undefined.NO_REQUEST_RATE: "the log's requests share one timestamp, so it has no request rate",
    Undefined.SIZE_SEARCH_OFF: "the size search was skipped (--no-size-search), so no "
    "option was sized or priced",
    Undefined.SLO_NEVER_MET: "no instance count the size search replayed keeps p90 TTFT "
    "within the SLO",
    Undefined.ABOVE_CAP: "it meets the SLO only on more GPUs than the cap (--max-gpus)",
    Undefined.PREFILL_BOUND: "the requests' own prefill already takes longer than the SLO, "
    "at any number of instances",
    Undefined.NOT_PRICED: "no GPU-hour price for this GPU (--gpu-hour-usd or --prices sets one)",
    Undefined.NO_NET_SAVING: "the option saves no money against the baseline, so it "
    "never pays back",
    Undefined.BASELINE: "the baseline is what the other options are measured against",
}


VERDICTS = tuple(Verdict)
OBJECTIVES = tuple(Objective)
# The option each verdict deploys (its replay scenario).
VERDICT_SCENARIO: dict[str, Scenario] = {
    Verdict.DEPLOY_POOLED: Scenario.POOLED,
    Verdict.LOCAL_OFFLOAD_ONLY: Scenario.LOCAL_DRAM,
    Verdict.NOT_WORTH_IT: Scenario.LOCAL,
}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The decision's thresholds; each one is documented in docs/advisor.md.

    ``min_reuse``: below about 30 % steady-state prefix reuse, the prefill a pool
    saves cannot pay for the pool's memory, NICs and operations (the guideline of the
    Mooncake and LMCache deployments; docs/advisor.md). ``objective`` decides the last
    step: ``cost`` recommends the option serving the log's load within the TTFT SLO at
    the lowest monthly cost, ``ttft`` the one with the lowest mean TTFT. A pool must
    beat the best local option by ``min_pool_saving`` of the baseline's monthly cost
    (objective cost) or by ``min_pool_advantage`` of mean TTFT (objective ttft): the
    margin that pays for running a distributed store. ``min_dram_gain`` is the TTFT
    gain below which local DRAM offload is not worth configuring (objective ttft).
    ``pilot_fraction`` is the share of the projected gain the pilot's main gate asks for.
    """

    min_requests: int = 200
    min_reuse: float = 0.30
    objective: Objective = Objective.COST
    min_pool_saving: float = 0.05  # of the baseline's monthly cost (objective cost)
    min_pool_advantage: float = 0.10  # pooled TTFT below local+dram TTFT by this fraction
    bandwidth_margin: float = 1.0  # a tier must reach break-even x this
    min_dram_gain: float = 0.02  # local+dram TTFT below local TTFT by this fraction
    pilot_fraction: float = 0.5  # main gate: at least this share of the projected gains

    def __post_init__(self) -> None:
        # a caller's plain string is checked and kept as the enum
        object.__setattr__(self, "objective", Objective.parse(self.objective))
        if not 0.0 <= self.min_pool_saving < 1.0:
            raise UsageError(f"--pool-margin must be in [0, 1), got {self.min_pool_saving}")


@dataclass(frozen=True, slots=True)
class AnalyzedInput:
    """One input file as the report names it: by position (``input-1``) unless
    ``--keep-names``, its size and its content hash."""

    name: str
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class SkippedRows:
    """Input rows left out, by reason (sorted), with a few ``input:line: reason``
    examples whose paths are named as the report names the inputs."""

    total: int
    by_reason: tuple[tuple[str, int], ...] = ()
    examples: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "total": self.total,
            "by_reason": dict(self.by_reason),
            "examples": list(self.examples),
        }


@dataclass(frozen=True, slots=True)
class TokenCounting:
    """How prompts were tokenized: the trace's tokenizer and chat template names."""

    tokenizer: str = ""
    template: str = ""

    def to_json(self) -> dict[str, object]:
        return {"tokenizer": self.tokenizer, "template": self.template}


@dataclass(frozen=True, slots=True)
class TraceFigures:
    """What the log holds, before any analysis."""

    n_requests: int
    count_only: bool
    duration_s: float
    prompt_tokens_total: int
    mean_prompt_tokens: float
    block_size: int
    approx_lengths: bool = False
    skipped_lines: int = 0
    sessions_known: bool = False
    tenants_known: bool = False


@dataclass(frozen=True, slots=True)
class ReuseFigures:
    """Prefix reuse: ceilings, the LRU knee and the reusable prefix lengths."""

    measurable: bool
    ceiling_hit_rate: float = 0.0  # steady state, unlimited capacity, perfect routing
    cold_ceiling_hit_rate: float = 0.0
    warmup: float = 0.5
    knee_tokens: int = 0  # smallest LRU capacity reaching knee_fraction x ceiling
    knee_fraction: float = 0.9
    footprint_tokens: int = 0  # LRU capacity reaching the ceiling
    median_prefix_tokens: int = 0  # token-weighted median reusable prefix (hits)
    p25_prefix_tokens: int = 0  # token-weighted 25th percentile (short prefixes)
    same_session_share: float = 0.0
    same_tenant_share: float = 0.0
    cross_tenant_share: float = 0.0
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class TierFigure:
    """One tier below HBM: its effective bandwidth and first-byte latency."""

    role: str  # "dram" | "pool" | "nvme"
    tier: str  # catalog name, e.g. "rdma-200"
    bandwidth_gbps: float
    latency_s: float


@dataclass(frozen=True, slots=True)
class BandwidthFigures:
    """Break-even bandwidth for this workload's prefixes, against each tier."""

    prefix_tokens: int  # the reusable prefix length the comparison is made at
    break_even_gbps: float  # loading beats recomputing above this
    bytes_per_token: int
    prefill_tokens_per_s: float  # recompute speed at that prefix length
    tiers: tuple[TierFigure, ...] = ()

    def tier(self, role: str) -> TierFigure | None:
        for t in self.tiers:
            if t.role == role:
                return t
        return None


@dataclass(frozen=True, slots=True)
class ScenarioFigures:
    """One replayed deployment option."""

    name: str
    hit_rate: float
    ttft_mean_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    max_rate_scale: float | None  # highest rate multiple keeping p90 TTFT under the SLO
    max_rate_capped: bool = False  # the search's top multiple passed: a lower bound only
    pool_hit_rate: float = 0.0  # share of prompt tokens read from the pool
    dram_hit_rate: float = 0.0
    network_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class PricedOption:
    """One replayed option of a side-by-side choice: its TTFT, the GPUs it needs at the
    busiest load and its monthly cost (``None``: none within the cap meets the SLO, as
    ``status`` says, or not priced)."""

    ttft_mean_s: float | None
    ttft_p90_s: float | None
    gpus_at_peak_load: int | None = None
    total_usd_month: float | None = None
    status: str | None = None  # how its size search ended (analyzer.advisor.plan.PlanStatus)
    cap_gpus: int | None = None  # the most GPUs its search looked at

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "cap_gpus": self.cap_gpus,
            "ttft_mean_s": self.ttft_mean_s,
            "ttft_p90_s": self.ttft_p90_s,
            "gpus_at_peak_load": self.gpus_at_peak_load,
            "total_usd_month": self.total_usd_month,
        }


@dataclass(frozen=True, slots=True)
class PricedChoice:
    """One model/GPU choice priced on the log (the report's ``side_by_side`` row): the
    verdict it would get and, per replayed option, a :class:`PricedOption`."""

    model: str
    gpu: str
    tp: int
    usd_per_gpu_hour: float | None
    verdict: str | None  # the verdict there; None: only the verdict's option was planned there
    options: tuple[tuple[Scenario, PricedOption], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "tp": self.tp,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "verdict": self.verdict,
            "options": {name: o.to_json() for name, o in self.options},
        }


@dataclass(frozen=True, slots=True)
class CostFigures:
    """The cost model an analysis priced with (the report's ``cost`` section):
    ``prefill_model`` is "roofline" (at ``mfu``) or "engine" (``mfu`` then ``None``)."""

    model: str
    gpu: str
    tp: int
    kv_dtype: str
    weight_dtype: str
    prefill_model: str
    mfu: float | None
    bytes_per_token: int
    transfer_bytes_per_token: int
    hbm_kv_capacity_tokens: int

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "tp": self.tp,
            "kv_dtype": self.kv_dtype,
            "weight_dtype": self.weight_dtype,
            "prefill_model": self.prefill_model,
            "mfu": self.mfu,
            "bytes_per_token": self.bytes_per_token,
            "transfer_bytes_per_token": self.transfer_bytes_per_token,
            "hbm_kv_capacity_tokens": self.hbm_kv_capacity_tokens,
        }


@dataclass(frozen=True, slots=True)
class BreakEvenPoint:
    """One point of the break-even curve: the load bandwidth at which loading a
    ``prefix_tokens`` prefix costs as long as recomputing it."""

    prefix_tokens: int
    break_even_gbps: float

    def to_json(self) -> dict[str, object]:
        return {"prefix_tokens": self.prefix_tokens, "break_even_gbps": self.break_even_gbps}


@dataclass(frozen=True, slots=True)
class ReplayFigures:
    scenarios: tuple[ScenarioFigures, ...]
    baseline: str = Scenario.LOCAL  # what the pilot's TTFT reduction is measured against
    ttft_slo_s: float = 2.0
    nodes: int = 0  # hosts the instances span (0: unknown)
    dram_scope: str = "instance"  # host DRAM private to each instance, or one per node

    def get(self, name: str) -> ScenarioFigures | None:
        for s in self.scenarios:
            if s.name == name:
                return s
        return None


@dataclass(frozen=True, slots=True)
class Check:
    """One step of the decision sequence and how it came out."""

    step: int
    name: str
    passed: bool | None  # None: could not be evaluated
    value: float | None
    threshold: float | None
    text: str


@dataclass(frozen=True, slots=True)
class Fact:
    """A figure a reason states, addressed by its path in the report document
    (``replay.scenarios.pooled.ttft_s.mean``; list items by their ``role`` or ``name``),
    and optionally the comparison the reason draws with another figure."""

    figure: str
    value: float
    unit: str  # how the reason shows it: see show()
    op: str = ""  # "<", "<=", ">", ">=", "==" against ``against`` / ``against_value``
    against: str = ""  # a figure path, or "" for a constant (a threshold)
    against_value: float | None = None

    @property
    def shown(self) -> str:
        return show(self.value, self.unit)

    def holds(self) -> bool:
        if not self.op or self.against_value is None:
            return True
        a, b = self.value, self.against_value
        return {
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
            "==": a == b,
        }[self.op]


def show(value: float, unit: str) -> str:
    """A figure as a reason prints it: ``pct`` fractions as percentages, ``ms`` seconds
    as milliseconds, ``usd`` dollars, ``count`` whole numbers, ``gbps`` GB/s, ``tokens``,
    ``x`` rate multiples."""
    if unit == "pct":
        return f"{100 * value:.1f}%"
    if unit == "spct":
        return f"{100 * value:+.1f}%"
    if unit == "ms":
        return f"{1000 * value:,.0f} ms"
    if unit == "usd":
        return f"-${-value:,.0f}" if value < 0 else f"${value:,.0f}"
    if unit == "count":
        return f"{round(value):,}"
    if unit == "gbps":
        return f"{value:.3g} GB/s"
    if unit == "tokens":
        return f"{round(value):,} tokens"
    if unit == "x":
        return f"x{value:.3g}"
    raise ValueError(f"unknown unit {unit!r}")


def lookup(doc: Mapping[str, object], path: str) -> object:
    """The value at ``path`` in a report document (dots; list items by role or name)."""
    cur: object = doc
    for part in _split(path):
        if isinstance(cur, dict):
            cur = cur[part]
        elif isinstance(cur, list):
            cur = next(
                x for x in cur if isinstance(x, dict) and part in (x.get("role"), x.get("name"))
            )
        else:
            raise KeyError(path)
    return cur


def _split(path: str) -> list[str]:
    """Dots separate keys; a key in brackets may hold dots or '+' (``options[local+dram]``)."""
    out: list[str] = []
    for chunk in path.replace("]", "").split("["):
        if not out and chunk:
            out += [p for p in chunk.split(".") if p]
        elif chunk:
            key, _, rest = chunk.partition(".")
            out.append(key)
            out += [p for p in rest.split(".") if p]
    return out


@dataclass(frozen=True, slots=True)
class Projection:
    """The replay's projected gains of the candidate deployments over the baseline."""

    pooled_ttft_reduction: float | None = None
    pooled_throughput_gain: float | None = None
    dram_ttft_reduction: float | None = None
    dram_throughput_gain: float | None = None
    pool_vs_dram_ttft: float | None = None  # 1 - pooled / local+dram TTFT


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: str
    reasons: tuple[str, ...]
    checks: tuple[Check, ...]
    confidence: str  # "high" | "medium" | "low"
    confidence_notes: tuple[str, ...]
    projection: Projection = field(default_factory=Projection)
    missing: tuple[str, ...] = ()  # what data the log lacks (insufficient-data)
    facts: tuple[tuple[Fact, ...], ...] = ()  # per reason: the figures it states
    derived: tuple[tuple[str, float], ...] = ()  # figures the reasons derive (verdict.figures)
    scenario: str | None = None  # the option deployed (None: insufficient data, cannot meet)

    @property
    def confidence_statement(self) -> str:
        head = f"Confidence: {self.confidence}."
        return head + (" " + " ".join(self.confidence_notes) if self.confidence_notes else "")
