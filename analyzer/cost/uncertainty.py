"""Ranges on the cost model's figures, from its measured error.

The engine model's leave-one-out error on ``models/measurements.toml``
(:mod:`analyzer.cost.reference`) is kept per kind of deployment: dense or MoE, and the
precision GEMMs run at (bf16, or fp8/fp4). For a figure the tool prints, the band of
time ratios (prediction / measurement) of the rows of the same kind gives the range the
true value lies in, as far as the table can tell:

    true time      in [t / high, t / low]
    true rate      in [r * low, r * high]
    break-even BW  in [BW * low, BW * high]      (BW* = bytes per token x prefill rate)

A kind measured on fewer than three distinct deployments takes the band of every row of
the same MoE-ness, then of the whole table. A prefix longer than the table's longest measured prompt, or an fp4
deployment (no published fp4 row yet), is marked ``extrapolated``: the band is the whole
table's and may be too narrow. A calibrated model (``--profile``, ``--calibration``)
carries its own cross-validated error instead.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from analyzer.cost.catalog import get_gpu
from analyzer.cost.model import CostModel
from analyzer.cost.reference import CheckedRow, default_check

# a band rests on at least this many distinct deployments (model, GPU, TP, parallelism,
# precision, engine): rows of one deployment at several lengths agree with each other more
# than with another deployment, so they count once
MIN_DEPLOYMENTS = 3


def _deployments(checked: Iterable[CheckedRow]) -> int:
    return len(
        {
            (r.model, r.gpu, r.tp, r.parallelism, r.weights_dtype, r.engine)
            for r in (c.row for c in checked)
        }
    )


@dataclass(frozen=True, slots=True)
class ErrorBand:
    """Measured time ratios (prediction / measurement) for one kind of deployment."""

    low: float  # <= 1
    high: float  # >= 1
    kind: str  # "dense, fp8 GEMMs"
    rows: int  # table rows (or profile points) the band rests on
    basis: str  # where the band comes from, in words
    extrapolated: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "low_ratio": self.low,
            "high_ratio": self.high,
            "kind": self.kind,
            "rows": self.rows,
            "basis": self.basis,
            "extrapolated": self.extrapolated,
        }

    def describe(self) -> str:
        out = f"{self.basis} ({self.kind}: model/measured {self.low:.2f}-{self.high:.2f})"
        if self.extrapolated:
            out += "; outside what the table measured, so the range may be too narrow"
        return out


@dataclass(frozen=True, slots=True)
class Range:
    """A figure and the range its true value lies in, by the model's measured error."""

    value: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def _kind_of(is_moe: bool, compute_dtype: str) -> tuple[str, str]:
    return ("MoE" if is_moe else "dense", "bf16" if compute_dtype in ("bf16", "fp16") else "fp8")


def prefill_band(cm: CostModel, context_tokens: int | None = None) -> ErrorBand:
    """The error band for prefill times of ``cm`` at prompts of ``context_tokens``."""
    fits = [f for f in (cm.ttft_fit, cm.prefill) if f is not None and f.fitted]
    if fits:
        f = fits[0]
        if f.cv_mape is not None:
            m = float(f.cv_mape)
            return ErrorBand(
                low=max(1.0 - m, 0.05),
                high=1.0 + m,
                kind="your measurements",
                rows=f.n_points,
                # the calibration CSV by its name: reports carry no directories
                basis="cross-validated error of the calibration "
                f"({os.path.basename(f.source) if f.source else 'profile'})",
                extrapolated=False,
            )
    result = default_check()
    moe, prec = _kind_of(cm.model.is_moe, cm.compute_dtype)
    rows = result.rows
    same = [
        c
        for c in rows
        if _kind_of(c.row.is_moe, _row_dtype(c.row.weights_dtype, c.row.gpu)) == (moe, prec)
    ]
    kind = f"{moe}, {prec} GEMMs"
    if _deployments(same) < MIN_DEPLOYMENTS:
        same = [c for c in rows if c.row.is_moe == cm.model.is_moe]
        kind = f"{moe}, any precision"
    if _deployments(same) < MIN_DEPLOYMENTS:
        same = list(rows)
        kind = "every row"
    longest = max(c.row.prompt_tokens for c in rows)
    extrapolated = cm.engine is None or cm.compute_dtype == "fp4"
    if context_tokens is not None and context_tokens > longest:
        extrapolated = True
    if extrapolated:
        same = list(rows)
        kind = kind if kind == "every row" else f"{kind}; every row used"
    ratios = [c.loo_ratio for c in same]
    basis = f"leave-one-out error on {len(same)} rows of models/measurements.toml"
    if cm.engine is None:
        basis += " (of the engine model; --mfu prices the plain roofline, which is worse)"
    return ErrorBand(
        low=min(min(ratios), 1.0),
        high=max(max(ratios), 1.0),
        kind=kind,
        rows=len(same),
        basis=basis,
        extrapolated=extrapolated,
    )


def _row_dtype(weights_dtype: str, gpu: str) -> str:
    return get_gpu(gpu).compute_dtype_for(weights_dtype)


def time_range(seconds: float, band: ErrorBand) -> Range:
    """A modelled time's range: the true time is the prediction over the ratio."""
    return Range(seconds, seconds / band.high, seconds / band.low)


def ttft_range(ttft_s: float, band: ErrorBand) -> Range:
    """A whole TTFT (load, compute and overhead) with the band: the reference rows the band
    comes from compare whole TTFTs, with the load and the per-request overhead where the
    measurement includes them, so every TTFT the tool prints carries it the same way."""
    return time_range(ttft_s, band)


def rate_range(rate: float, band: ErrorBand) -> Range:
    return Range(rate, rate * band.low, rate * band.high)


def break_even_range(gbps: float, band: ErrorBand) -> Range:
    """Break-even bandwidth is bytes per token x prefill rate: it scales with the rate."""
    return Range(gbps, gbps * band.low, gbps * band.high)


@dataclass(frozen=True, slots=True)
class FlipFinding:
    """Whether the bandwidth verdict could flip within the model's measured error."""

    inside: bool
    tiers: tuple[str, ...]  # the tiers whose check flips inside the range
    statement: str

    def to_json(self) -> dict[str, object]:
        return {
            "flip_inside_range": self.inside,
            "tiers": list(self.tiers),
            "statement": self.statement,
        }


SETTLE = (
    "Settle it by measuring prefill on your own GPUs: `kvpool cost profile` "
    "(or time a few prompts and run `kvpool cost fit --prefill`), then rerun with --profile."
)


def bandwidth_flip(
    break_even_gbps: float,
    prefix_tokens: int,
    tiers: list[tuple[str, float]],
    band: ErrorBand,
    margin: float = 1.0,
) -> FlipFinding:
    """Does a tier's bandwidth check (``tier >= break-even x margin``) flip inside the range?

    ``tiers`` are (label, GB/s) pairs, e.g. the host-DRAM tier and the pool link.
    """
    if not math.isfinite(break_even_gbps):
        return FlipFinding(
            False,
            (),
            f"At the {prefix_tokens:,}-token reusable prefix loading never beats recomputing "
            "in the cost model (the prefill it saves is less than placing the loaded KV "
            "takes), so no tier's bandwidth check can pass; the model's measured error "
            f"({band.describe()}) scales a finite break-even and leaves this one unbounded.",
        )
    r = break_even_range(break_even_gbps, band)
    need = Range(r.value * margin, r.low * margin, r.high * margin)
    head = (
        f"Break-even bandwidth at the {prefix_tokens:,}-token reusable prefix: "
        f"{r.value:.3g} GB/s, between {r.low:.3g} and {r.high:.3g} GB/s by the model's "
        f"measured error ({band.describe()})."
    )
    flips = []
    for label, gbps in tiers:
        if need.contains(gbps):
            now = gbps >= need.value
            if now:
                pct = gbps / need.value - 1  # a faster prefill raises the break-even
                how = (
                    f"passes now, but fails if your GPUs prefill more than {pct:.0%} faster "
                    "than modelled"
                )
            else:
                pct = 1 - gbps / need.value
                how = (
                    f"fails now, but passes if your GPUs prefill more than {pct:.0%} slower "
                    "than modelled"
                )
            flips.append(f"{label} ({gbps:.3g} GB/s) {how}")
    if flips:
        text = (
            f"{head} A flip of the verdict lies inside that range: "
            + "; ".join(flips)
            + ". "
            + SETTLE
        )
        return FlipFinding(True, tuple(label for label, g in tiers if need.contains(g)), text)
    text = f"{head} No tier's bandwidth check flips inside that range."
    return FlipFinding(False, (), text)
