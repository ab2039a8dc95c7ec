"""The :class:`ReuseReport`: every section of the reuse stage's answer, its capacity
queries (hit rate at a size, knees, footprint, plot points) and its ``--json`` document.

It is built in one place, :func:`analyzer.reuse.assemble.measure`, whichever way the
trace was read (in memory or as a lazy frame), or by :func:`unmeasurable` when the
trace cannot say anything about reuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from analyzer.reuse.records import (
    GB,
    GIB,
    NO_CONTENT,
    NO_TOP_PREFIXES,
    Breakdowns,
    CapacityRow,
    CurvePoint,
    Granularity,
    NonPrefixReuse,
    ReuseDistance,
    ReuseOptions,
    ReuseSources,
    ReuseTime,
    ShardsRun,
    StepCurve,
    TopPrefixes,
    WorkingSet,
    capacity_json,
    first_counted_request,
    round6,
    round_floats,
)


@dataclass(frozen=True, slots=True)
class TraceShape:
    """What each way of reading a trace knows of it before measuring it."""

    block_size: int
    n_requests: int
    n_accesses: int
    all_prompt_tokens: int  # every request's, the warm-up's too


@dataclass(frozen=True)
class ReuseReport:
    measurable: bool
    reason: str | None
    block_size: int
    warmup: float
    n_requests: int
    counted_requests: int
    n_accesses: int
    n_blocks: int
    prompt_tokens: int  # counted requests
    hit_tokens: int  # counted requests, unlimited capacity
    ceiling_hit_rate: float
    cold_ceiling_hit_rate: float
    bytes_per_token: int | None = None
    curve: StepCurve | None = None
    cold_curve: StepCurve | None = None  # every request counted (exact runs only)
    curve_method: str = "exact"  # or "shards"
    shards: ShardsRun | None = None
    policy_points: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    policy_notes: list[str] = field(default_factory=list)
    capacities_tokens: tuple[int, ...] = ()
    sources: ReuseSources | None = None
    top_prefixes: TopPrefixes = NO_TOP_PREFIXES
    granularity: Granularity | None = None
    non_prefix: NonPrefixReuse = NO_CONTENT
    reuse_distance: ReuseDistance | None = None
    reuse_time: ReuseTime | None = None
    working_set: WorkingSet | None = None
    curve_points: int = 200
    breakdowns: Breakdowns | None = None  # ceilings per tenant, per hour

    # -- capacity queries ----------------------------------------------------------

    def hit_rate_at(self, capacity_tokens: int, policy: str = "lru") -> float:
        """Steady-state hit rate with ``capacity_tokens`` of cache (whole blocks)."""
        if not self.measurable:
            return 0.0
        blocks = int(capacity_tokens) // self.block_size
        if policy == "lru":
            assert self.curve is not None
            return self.curve.at(blocks)
        points = dict(self.policy_points.get(policy, []))
        for cap, rate in points.items():
            if cap // self.block_size == blocks:
                return rate
        raise ValueError(
            f"policy {policy!r} was not simulated at {capacity_tokens} tokens "
            f"(simulated: {sorted(points)}); pass it in ReuseOptions.capacities_tokens"
        )

    def knee_tokens(self, fraction: float = 0.9) -> int:
        """Smallest capacity (tokens) whose LRU hit rate reaches ``fraction`` x ceiling."""
        if not self.measurable or self.curve is None or self.ceiling_hit_rate <= 0:
            return 0
        if self.curve.top_rate <= 0:  # a sampled curve that kept no reused block
            return 0
        target = fraction * self.curve.top_rate
        blocks = self.curve.smallest_reaching(target)
        return (blocks if blocks is not None else self.curve.full_blocks) * self.block_size

    @property
    def lru_curve(self) -> list[tuple[int, float]]:
        """(capacity_tokens, hit_rate) at capacities dense enough to plot (log and linear)."""
        if not self.measurable or self.curve is None:
            return []
        return self._plot_points(self.curve)

    def _plot_points(self, curve: StepCurve) -> list[tuple[int, float]]:
        if curve.full_blocks == 0:
            return []
        top = curve.full_blocks
        n = max(self.curve_points // 2, 2)
        caps = np.unique(
            np.concatenate(
                [
                    np.round(np.geomspace(1, top, n)),
                    np.round(np.linspace(0, top, n)),
                    [0, top],
                ]
            ).astype(np.int64)
        )
        return [(int(c) * self.block_size, curve.at(int(c))) for c in caps]

    @property
    def footprint_tokens(self) -> int:
        """Capacity at which LRU reaches the ceiling (the whole reusable working set)."""
        return self.curve.full_blocks * self.block_size if self.curve is not None else 0

    # -- output ---------------------------------------------------------------------

    def _capacity_fields(self, capacity_tokens: int) -> dict[str, object]:
        return capacity_json(int(capacity_tokens), *self._capacity_gb(capacity_tokens))

    def _capacity_gb(self, capacity_tokens: int) -> tuple[float | None, float | None]:
        """``capacity_tokens`` of KV in GB and GiB (3 places), when bytes per token are known."""
        if not self.bytes_per_token:
            return None, None
        n_bytes = capacity_tokens * self.bytes_per_token
        return round(n_bytes / GB, 3), round(n_bytes / GIB, 3)

    def _points(self, points: list[tuple[int, float]]) -> tuple[CurvePoint, ...]:
        return tuple(CurvePoint(int(c), h, *self._capacity_gb(c)) for c, h in points)

    def curves(self) -> dict[str, tuple[CurvePoint, ...]]:
        """Hit-ratio curve per policy: LRU dense enough to plot, the others at the
        capacities compared (empty when the trace was not measurable)."""
        if not self.measurable:
            return {}
        out = {"lru": self._points(self.lru_curve)}
        for policy, points in self.policy_points.items():
            out[policy] = self._points(points)
        return out

    def lru_cold_curve(self) -> tuple[CurvePoint, ...]:
        """LRU with every request counted (exact runs only)."""
        if self.cold_curve is None:
            return ()
        return self._points(self._plot_points(self.cold_curve))

    def capacity_rows(self) -> tuple[CapacityRow, ...]:
        """The capacities compared, each with every policy's steady hit rate."""
        rows = []
        for cap in self.capacities_tokens:
            by_policy: dict[str, float | None] = {}
            for policy, points in self.policy_points.items():
                at = dict(points)
                by_policy[policy] = at.get(cap)
            rows.append(
                CapacityRow(
                    capacity_tokens=int(cap),
                    capacity_blocks=cap // self.block_size,
                    lru_hit_rate=self.hit_rate_at(cap),
                    hit_rate_by_policy=by_policy,
                    capacity_gb=self._capacity_gb(cap)[0],
                    capacity_gib=self._capacity_gb(cap)[1],
                )
            )
        return tuple(rows)

    def to_json(self) -> dict[str, object]:
        """Plain, deterministic JSON (floats rounded to 6 places)."""
        doc: dict[str, object] = {
            "measurable": self.measurable,
            "reason": self.reason,
            "trace": {
                "requests": self.n_requests,
                "block_accesses": self.n_accesses,
                "distinct_blocks": self.n_blocks,
                "block_size": self.block_size,
            },
            "ceiling": {
                "hit_rate": round6(self.ceiling_hit_rate),
                "cold_hit_rate": round6(self.cold_ceiling_hit_rate),
                "warmup": self.warmup,
                "block_size": self.block_size,
                "counted_requests": self.counted_requests,
                "prompt_tokens": self.prompt_tokens,
                "hit_tokens": self.hit_tokens,
                "token_weighted": True,
                "last_token_recomputed": True,
            },
            "bytes_per_token": self.bytes_per_token,
        }
        if not self.measurable:
            doc["curves"] = {}
            return doc
        doc.update(
            {
                "curves": {
                    policy: [p.to_json() for p in points]
                    for policy, points in self.curves().items()
                },
                "lru_cold_curve": [p.to_json() for p in self.lru_cold_curve()],
                "curve_method": self.curve_method,
                "shards": round_floats(self.shards),
                "policy_notes": list(self.policy_notes),
                "capacities": [r.to_json() for r in self.capacity_rows()],
                "knees": {
                    str(f): self._capacity_fields(self.knee_tokens(f))
                    for f in (0.5, 0.8, 0.9, 0.95)
                },
                "footprint": self._capacity_fields(self.footprint_tokens),
                "sources": round_floats(self.sources.to_json() if self.sources else {}),
                "top_prefixes": round_floats(self.top_prefixes.to_json()),
                "granularity": round_floats(self.granularity.to_json() if self.granularity else {}),
                "non_prefix": round_floats(self.non_prefix.to_json()),
                "reuse_distance": round_floats(self.reuse_distance or {}),
                "reuse_time": round_floats(self.reuse_time or {}),
                "working_set": round_floats(self.working_set or {}),
                "breakdowns": round_floats(self.breakdowns or {}),
            }
        )
        return doc


def unmeasurable(
    opts: ReuseOptions, shape: TraceShape, distinct_blocks: int, reason: str
) -> ReuseReport:
    """The report of a trace that cannot say how much prefill is repeated (``reason``)."""
    return ReuseReport(
        measurable=False,
        reason=reason,
        prompt_tokens=shape.all_prompt_tokens,
        hit_tokens=0,
        ceiling_hit_rate=0.0,
        cold_ceiling_hit_rate=0.0,
        n_blocks=distinct_blocks,
        **shape_fields(opts, shape),
    )


class ShapeFields(TypedDict):
    block_size: int
    warmup: float
    n_requests: int
    counted_requests: int
    n_accesses: int
    bytes_per_token: int | None
    curve_points: int


def shape_fields(opts: ReuseOptions, shape: TraceShape) -> ShapeFields:
    """The fields of a report that follow from the options and the trace's shape, the
    same for every way of reading it."""
    first = first_counted_request(shape.n_requests, opts.warmup)
    return {
        "block_size": shape.block_size,
        "warmup": opts.warmup,
        "n_requests": shape.n_requests,
        "counted_requests": shape.n_requests - first,
        "n_accesses": shape.n_accesses,
        "bytes_per_token": opts.bytes_per_token,
        "curve_points": opts.curve_points,
    }
