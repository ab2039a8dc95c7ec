"""The figures the decision rests on, as small frozen records.

The pipeline (:mod:`analyzer.advisor.pipeline`) fills these from the ingest, reuse,
cost and replay stages; the decision, sizing, sensitivity and gate functions read
only these records, so each of them is a pure function a test can drive with
hand-written numbers.

Units are in the field names: ``*_tokens`` are token counts, ``*_gbps`` are GB/s
(decimal, 1e9 bytes per second), ``*_s`` are seconds, ``*_bytes`` are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VERDICTS = ("deploy-pooled", "local-offload-only", "not-worth-it", "insufficient-data")


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The decision's thresholds; each one is documented in docs/advisor.md.

    ``min_reuse``: below about 30 % steady-state prefix reuse, the prefill a pool
    saves cannot pay for the pool's memory, NICs and operations (FIELD.md section 6).
    ``min_ttft_reduction`` and ``min_throughput_gain`` are the pilot's main-gate KPIs;
    ``min_pool_advantage`` is how much better than local DRAM offload the pool must
    project before its extra infrastructure is recommended.
    """

    min_requests: int = 200
    min_reuse: float = 0.30
    min_ttft_reduction: float = 0.25
    min_throughput_gain: float = 0.0  # pooled / baseline max rate at SLO, minus 1
    min_pool_advantage: float = 0.10  # pooled TTFT below local+dram TTFT by this fraction
    bandwidth_margin: float = 1.0  # a tier must reach break-even x this
    min_dram_gain: float = 0.02  # local+dram TTFT below local TTFT by this fraction


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
class ReplayFigures:
    scenarios: tuple[ScenarioFigures, ...]
    baseline: str = "local"  # what the pilot's TTFT reduction is measured against
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

    @property
    def confidence_statement(self) -> str:
        head = f"Confidence: {self.confidence}."
        return head + (" " + " ".join(self.confidence_notes) if self.confidence_notes else "")
