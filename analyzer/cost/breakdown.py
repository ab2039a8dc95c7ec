"""What the cost model's questions answer: a TTFT broken into its parts, and the
recompute-against-load break-even per prefix length and per tier.

Frozen records with units in their field names; ``to_json`` is the shape ``kvpool
cost`` writes and the dashboard tabulates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict


class TierBreakEven(TypedDict):
    """One tier of :meth:`analyzer.cost.model.CostModel.tier_break_even`: the shortest
    prefix above which loading it over the tier pays (None: never, up to 2M tokens)."""

    tier: str
    kind: str
    bandwidth_gbps: float
    latency_s: float
    break_even_prefix_tokens: int | None


@dataclass(frozen=True, slots=True)
class TtftBreakdown:
    """Mean TTFT of K identical requests arriving together (see :meth:`CostModel.ttft`)."""

    ttft_s: float
    load_s: float
    compute_s: float
    overhead_s: float
    prompt_tokens: int
    cached_tokens: int
    new_tokens: int
    concurrency: int
    load_gbps: float
    load_latency_s: float
    load_bytes_per_request: int
    recompute_ttft_s: float  # the same K requests with nothing cached
    overlap_bound_s: float  # compute the front while loading the back
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "ttft_s": self.ttft_s,
            "load_s": self.load_s,
            "compute_s": self.compute_s,
            "overhead_s": self.overhead_s,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "new_tokens": self.new_tokens,
            "concurrency": self.concurrency,
            "load_gbps": self.load_gbps,
            "load_latency_s": self.load_latency_s,
            "load_bytes_per_request": self.load_bytes_per_request,
            "recompute_ttft_s": self.recompute_ttft_s,
            "overlap_bound_s": self.overlap_bound_s,
            "speedup_vs_recompute": self.recompute_ttft_s / self.ttft_s if self.ttft_s else None,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, slots=True)
class BreakEvenRow:
    """One (prefix length, link) of :meth:`CostModel.break_even_table`: seconds to
    recompute the prefix against seconds to load it over the link, and the bandwidth at
    which the two are equal (``break_even_gbps``; None: loading never beats recomputing)."""

    prefix_tokens: int
    tier: str  # the link's name
    bandwidth_gbps: float
    latency_s: float
    concurrency: int
    kv_bytes: int
    transfer_bytes: int
    recompute_s: float
    load_s: float
    overlap_bound_s: float
    break_even_gbps: float | None
    load_wins: bool
    speedup: float | None  # recompute_s / load_s

    def to_json(self) -> dict[str, object]:
        return {
            "prefix_tokens": self.prefix_tokens,
            "tier": self.tier,
            "bandwidth_gbps": self.bandwidth_gbps,
            "latency_s": self.latency_s,
            "concurrency": self.concurrency,
            "kv_bytes": self.kv_bytes,
            "transfer_bytes": self.transfer_bytes,
            "recompute_s": self.recompute_s,
            "load_s": self.load_s,
            "overlap_bound_s": self.overlap_bound_s,
            "break_even_gbps": self.break_even_gbps,
            "load_wins": self.load_wins,
            "speedup": self.speedup,
        }
