"""What would change the verdict: :func:`decide` re-run on perturbed inputs.

Each perturbation is re-priced cheaply rather than re-simulated:

* **reuse x f**: the ceiling scales by ``f``; each scenario's TTFT saving over the
  no-cache scenario scales by ``f`` too (savings are proportional to hit tokens);
  rates at the SLO are kept.
* **pool bandwidth B'**: the pool tier's bandwidth becomes ``B'`` and the pooled
  scenario's mean TTFT changes by the time its pool reads take at ``B'`` instead of
  ``B`` (``pool hit tokens x bytes/token x (1/B' - 1/B)``), without link contention.
* **model / GPU**: the pipeline prices the break-even with the other model or GPU
  and passes a compute-time ratio; every scenario's TTFT scales by it, the pool
  reads by the KV-size ratio, and the rate served within the SLO by its inverse.
* **GPU price, DRAM price, load**: the money figures re-priced
  (:func:`analyzer.advisor.economics.scaled`); the load multiplies the instances each
  option needs to serve it within the SLO.
* **instances**: the pipeline re-runs a quick replay (no SLO search) at other
  instance counts when the trace is small enough, and passes its figures in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from analyzer.advisor.decide import decide
from analyzer.advisor.economics import EconomicsInputs
from analyzer.advisor.figures import (
    BandwidthFigures,
    ReplayFigures,
    ReuseFigures,
    ScenarioFigures,
    Thresholds,
    TraceFigures,
)
from analyzer.replay.config import Scenario, Tier


@dataclass(frozen=True, slots=True)
class Variant:
    dimension: str  # "reuse", "pool bandwidth", "model", "gpu", "instances"
    label: str
    reuse: ReuseFigures
    bandwidth: BandwidthFigures | None
    replay: ReplayFigures | None
    note: str = ""
    economics: EconomicsInputs | None = None  # None: the base analysis's


@dataclass(frozen=True, slots=True)
class FlipRow:
    dimension: str
    label: str
    verdict: str
    flips: bool
    note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "dimension": self.dimension,
            "value": self.label,
            "verdict": self.verdict,
            "flips": self.flips,
            "note": self.note,
        }


def _scenarios(
    replay: ReplayFigures, fn: Callable[[ScenarioFigures], ScenarioFigures]
) -> ReplayFigures:
    return replace(replay, scenarios=tuple(fn(s) for s in replay.scenarios))


def reuse_variant(
    reuse: ReuseFigures, bandwidth: BandwidthFigures | None, replay: ReplayFigures | None, f: float
) -> Variant:
    r2 = replace(
        reuse,
        ceiling_hit_rate=min(1.0, reuse.ceiling_hit_rate * f),
        cold_ceiling_hit_rate=min(1.0, reuse.cold_ceiling_hit_rate * f),
    )
    rp2 = replay
    none = replay.get(Scenario.NONE) if replay is not None else None
    if replay is not None and none is not None:

        def scale(s: ScenarioFigures) -> ScenarioFigures:
            if s.name == Scenario.NONE:
                return s
            saved = none.ttft_mean_s - s.ttft_mean_s
            return replace(
                s,
                hit_rate=min(1.0, s.hit_rate * f),
                pool_hit_rate=min(1.0, s.pool_hit_rate * f),
                dram_hit_rate=min(1.0, s.dram_hit_rate * f),
                ttft_mean_s=max(1e-9, none.ttft_mean_s - f * saved),
            )

        rp2 = _scenarios(replay, scale)
    return Variant(
        "reuse",
        f"x{f:g} ({100 * r2.ceiling_hit_rate:.1f}%)",
        r2,
        bandwidth,
        rp2,
    )


def pool_load_s(
    s: ScenarioFigures, mean_prompt_tokens: float, bytes_per_token: int, gbps: float
) -> float:
    """Mean time per request spent reading the pool at ``gbps`` (no contention)."""
    return s.pool_hit_rate * mean_prompt_tokens * bytes_per_token / (gbps * 1e9)


def bandwidth_variant(
    reuse: ReuseFigures,
    bandwidth: BandwidthFigures,
    replay: ReplayFigures | None,
    gbps: float,
    mean_prompt_tokens: float,
) -> Variant:
    pool = bandwidth.tier(Tier.POOL)
    assert pool is not None
    bw2 = replace(
        bandwidth,
        tiers=tuple(
            replace(t, bandwidth_gbps=gbps) if t.role == Tier.POOL else t for t in bandwidth.tiers
        ),
    )
    rp2 = replay
    if replay is not None:
        bpt = bandwidth.bytes_per_token

        def reprice(s: ScenarioFigures) -> ScenarioFigures:
            if s.name != Scenario.POOLED:
                return s
            delta = pool_load_s(s, mean_prompt_tokens, bpt, gbps) - pool_load_s(
                s, mean_prompt_tokens, bpt, pool.bandwidth_gbps
            )
            return replace(s, ttft_mean_s=max(1e-9, s.ttft_mean_s + delta))

        rp2 = _scenarios(replay, reprice)
    return Variant("pool bandwidth", f"{gbps:g} GB/s per node", reuse, bw2, rp2)


def hardware_variant(
    dimension: str,
    label: str,
    reuse: ReuseFigures,
    bandwidth: BandwidthFigures,
    alt_bandwidth: BandwidthFigures,
    replay: ReplayFigures | None,
    compute_ratio: float,
    mean_prompt_tokens: float,
    note: str = "",
    economics: EconomicsInputs | None = None,
) -> Variant:
    """Another model or GPU: ``alt_bandwidth`` priced by the pipeline, TTFTs scaled by
    ``compute_ratio`` (alternative prefill time / current), pool reads by the KV size."""
    rp2 = replay
    pool = bandwidth.tier(Tier.POOL)
    if replay is not None:

        def reprice(s: ScenarioFigures) -> ScenarioFigures:
            t = s.ttft_mean_s * compute_ratio
            if s.name == Scenario.POOLED and pool is not None:
                load = pool_load_s(
                    s, mean_prompt_tokens, bandwidth.bytes_per_token, pool.bandwidth_gbps
                )
                load2 = pool_load_s(
                    s, mean_prompt_tokens, alt_bandwidth.bytes_per_token, pool.bandwidth_gbps
                )
                t = (s.ttft_mean_s - load) * compute_ratio + load2
            rate = s.max_rate_scale
            return replace(
                s,
                ttft_mean_s=max(1e-9, t),
                ttft_p90_s=max(1e-9, s.ttft_p90_s * t / s.ttft_mean_s if s.ttft_mean_s > 0 else t),
                max_rate_scale=None if rate is None else rate / max(compute_ratio, 1e-9),
            )

        rp2 = _scenarios(replay, reprice)
    return Variant(dimension, label, reuse, alt_bandwidth, rp2, note, economics)


def flip_table(
    trace: TraceFigures,
    reuse: ReuseFigures,
    bandwidth: BandwidthFigures | None,
    replay: ReplayFigures | None,
    variants: list[Variant],
    th: Thresholds | None = None,
    economics: EconomicsInputs | None = None,
) -> tuple[str, list[FlipRow]]:
    """The base verdict and one row per variant."""
    base = decide(trace, reuse, bandwidth, replay, th, economics).verdict
    rows = []
    for v in variants:
        d = decide(trace, v.reuse, v.bandwidth, v.replay, th, v.economics or economics)
        rows.append(FlipRow(v.dimension, v.label, d.verdict, d.verdict != base, v.note))
    return base, rows


def summarize(rows: Sequence[FlipRow]) -> list[str]:
    """One sentence per dimension: the values that flip the verdict, or none."""
    out = []
    dims: list[str] = []
    for r in rows:
        if r.dimension not in dims:
            dims.append(r.dimension)
    for dim in dims:
        mine = [r for r in rows if r.dimension == dim]
        flips = [r for r in mine if r.flips]
        if flips:
            out.append(f"{dim}: " + "; ".join(f"{r.label} -> {r.verdict}" for r in flips))
        else:
            out.append(f"{dim}: no flip across {', '.join(r.label for r in mine)}")
    return out
