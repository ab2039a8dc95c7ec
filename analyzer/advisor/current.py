"""Measured against projected: today's deployment replayed beside the hits its log shows.

When responses carry ``cached_tokens`` (:mod:`analyzer.reuse.measured`), the deployment
the user describes as today's (``--current-instances``, ``--current-router``,
``--current-local-capacity-tokens``, each defaulting to the analysis cluster's) is
replayed as the ``local`` scenario (per-instance HBM prefix caching, what the engines'
``cached_tokens`` count) over the same steady-state requests. When the projected hit
rate differs from the measured one by more than ``TOLERANCE`` (5 points), the replay
does not describe today's engines well: the verdict's confidence drops one step, and
the effective HBM cache capacity per instance that reproduces the measured rate is
fitted by bisection on the replay (the hit rate grows with capacity). Typical causes:
the engine's real free HBM (``--gpu-memory-utilization``, activations, decode batches),
a different tokenizer or template, or routing unlike the one described.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from analyzer.replay import UNBOUNDED, run_replay
from analyzer.replay.config import Scenario
from analyzer.reuse.measured import MeasuredHits

if TYPE_CHECKING:
    from analyzer.advisor.figures import Decision
    from analyzer.cost.model import CostModel
    from analyzer.replay.config import ClusterConfig
    from analyzer.trace import BlockTrace

TOLERANCE = 0.05  # absolute difference in hit rate (5 points) beyond which we say so
FIT_ITERATIONS = 24  # bisection steps over the capacity in blocks (log scale)
FIT_ABS = 0.0025  # stop when a capacity reproduces the measured rate this closely


@dataclass(frozen=True, slots=True)
class CurrentDeployment:
    """Today's deployment as the user describes it (None: the analysis cluster's)."""

    instances: int | None = None
    router: str | None = None
    local_capacity_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Comparison:
    measured: MeasuredHits
    projected_hit_rate: float
    instances: int
    router: str
    local_capacity_tokens: int  # per instance, as replayed
    fitted_local_capacity_tokens: int | None = None  # None: within tolerance or unreachable
    fitted_hit_rate: float | None = None
    fit_note: str = ""
    tolerance: float = TOLERANCE

    @property
    def difference(self) -> float:
        return self.measured.overall.hit_rate - self.projected_hit_rate

    @property
    def within_tolerance(self) -> bool:
        return abs(self.difference) <= self.tolerance

    def to_json(self) -> dict[str, object]:
        return {
            "measured": self.measured.to_json(),
            "projected": {
                "scenario": Scenario.LOCAL,
                "hit_rate": round(self.projected_hit_rate, 6),
                "instances": self.instances,
                "router": self.router,
                "local_capacity_tokens_per_instance": self.local_capacity_tokens,
            },
            "difference": round(self.difference, 6),
            "tolerance": self.tolerance,
            "within_tolerance": self.within_tolerance,
            "fitted_local_capacity_tokens_per_instance": self.fitted_local_capacity_tokens,
            "fitted_hit_rate": (
                None if self.fitted_hit_rate is None else round(self.fitted_hit_rate, 6)
            ),
            "fit_note": self.fit_note,
        }

    def confidence_note(self) -> str | None:
        if self.within_tolerance:
            return None
        m, p = self.measured.overall.hit_rate, self.projected_hit_rate
        text = (
            f"The log's measured prefix-cache hit rate ({100 * m:.1f}%) differs from the "
            f"replay of today's deployment ({100 * p:.1f}%) by more than "
            f"{100 * self.tolerance:.0f} points, so the replay's projections are less sure."
        )
        if self.fitted_local_capacity_tokens is not None:
            text += (
                f" An effective HBM cache of {self.fitted_local_capacity_tokens:,} tokens per "
                f"instance (replayed: {self.local_capacity_tokens:,}) reproduces the measured "
                "rate; give it with --local-capacity-tokens to project from it."
            )
        elif self.fit_note:
            text += " " + self.fit_note
        return text


@dataclass(frozen=True, slots=True)
class MeasuredAgainstProjected:
    """The report's ``measured_vs_projected``: the hit rate the log's responses measured,
    and the replay of today's deployment beside it (``None`` when the log is too small
    or too thin to replay)."""

    measured: MeasuredHits
    comparison: Comparison | None = None

    def to_json(self) -> dict[str, object]:
        if self.comparison is not None:
            return self.comparison.to_json()
        return {"measured": self.measured.to_json(), "projected": None}


def _hit_rate(
    trace: BlockTrace, cfg: ClusterConfig, cost: CostModel | None, capacity_tokens: int
) -> float:

    c = replace(cfg, local_capacity_tokens=capacity_tokens)
    res = run_replay(trace, c, scenarios=[Scenario.LOCAL], search_rate=False, cost=cost)
    return res.scenarios[Scenario.LOCAL].hit_rate


def fit_capacity(
    trace: BlockTrace, cfg: ClusterConfig, cost: CostModel | None, target: float
) -> tuple[int | None, float | None, str]:
    """Smallest per-instance HBM capacity (tokens, whole blocks) whose replayed hit rate
    reaches ``target``, by bisection on a log scale; (None, best, why) when even an
    unbounded cache stays below it."""

    bs = trace.block_size
    top = _hit_rate(trace, cfg, cost, UNBOUNDED)
    if top < target - FIT_ABS:
        return (
            None,
            top,
            f"No HBM capacity reproduces it: unbounded per-instance caches reach "
            f"{100 * top:.1f}% under this router (the measured rate may count hits the "
            "replay cannot see, e.g. a different tokenizer or template, or a shared tier).",
        )
    lo, hi = 0, max(1, trace.n_blocks)  # in blocks; hi reaches the unbounded rate
    if _hit_rate(trace, cfg, cost, hi * bs) < target - FIT_ABS:
        hi = max(1, trace.n_accesses)
    best = (hi, _hit_rate(trace, cfg, cost, hi * bs))
    for _ in range(FIT_ITERATIONS):
        if hi - lo <= 1:
            break
        mid = max(lo + 1, int(math.sqrt(max(lo, 1) * hi)))
        rate = _hit_rate(trace, cfg, cost, mid * bs)
        if rate >= target - FIT_ABS:
            hi, best = mid, (mid, rate)
            if abs(rate - target) <= FIT_ABS:
                break
        else:
            lo = mid
    return best[0] * bs, best[1], ""


def compare(
    trace: BlockTrace,
    cfg: ClusterConfig,
    cost: CostModel | None,
    measured: MeasuredHits,
    current: CurrentDeployment | None = None,
) -> Comparison:
    """Replay today's deployment and set it beside the measured rate (module docstring)."""

    cur = current or CurrentDeployment()
    c = replace(
        cfg,
        instances=cur.instances or cfg.instances,
        router=cur.router or cfg.router,
        local_capacity_tokens=(
            cur.local_capacity_tokens
            if cur.local_capacity_tokens is not None
            else cfg.local_capacity_tokens
        ),
        warmup_fraction=measured.warmup,
    )
    res = run_replay(trace, c, scenarios=[Scenario.LOCAL], search_rate=False, cost=cost)
    local = res.scenarios[Scenario.LOCAL]
    cap = local.capacity.local_per_instance
    out = Comparison(
        measured=measured,
        projected_hit_rate=local.hit_rate,
        instances=c.instances,
        router=c.router,
        local_capacity_tokens=-1 if cap is None else cap,
    )
    if out.within_tolerance:
        return out
    fitted, rate, note = fit_capacity(trace, c, cost, measured.overall.hit_rate)
    return replace(out, fitted_local_capacity_tokens=fitted, fitted_hit_rate=rate, fit_note=note)


def with_comparison(decision: Decision, comparison: Comparison | None) -> Decision:
    """The decision with its confidence one step lower, and why, when the measured and
    projected hit rates disagree beyond the tolerance."""
    note = comparison.confidence_note() if comparison is not None else None
    if note is None:
        return decision
    levels = ("high", "medium", "low")
    level = levels[min(levels.index(decision.confidence) + 1, 2)]
    return replace(decision, confidence=level, confidence_notes=(*decision.confidence_notes, note))
