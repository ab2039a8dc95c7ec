"""Coefficients fitted to measurements: prefill, the load link and the TTFT form.

Each record holds a fit's coefficients and its provenance (what was fitted, the
cross-validated error, the ranges measured, the source). ``analyzer.cost.calibrate``
fits them, ``analyzer.cost.profile_file`` saves and reads them, and
:class:`analyzer.cost.model.CostModel` applies them; the catalog form is each record's
defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

DEFAULT_OVERHEAD_S = 0.01  # scheduling, sampling, HTTP per request, outside the forward


@dataclass(frozen=True, slots=True)
class PrefillCoefficients:
    """Coefficients of the prefill time; analytic defaults, or fitted to measurements.

    ``compute_s = compute_scale * analytic_compute_s + K * (per_token_s * S
    + per_context_token_s * P * S + per_token_sq_s * S^2)`` and ``prefill_s = compute_s
    + overhead_s``. The analytic catalog form is ``compute_scale = 1`` and zero polynomial
    terms; a polynomial fit sets ``compute_scale = 0``.
    """

    compute_scale: float = 1.0
    per_token_s: float = 0.0
    per_context_token_s: float = 0.0
    per_token_sq_s: float = 0.0
    overhead_s: float = DEFAULT_OVERHEAD_S
    fitted: tuple[str, ...] = ()  # names fitted to measurements; the rest are catalog
    cv_mape: float | None = None
    n_points: int = 0
    ranges: tuple[tuple[str, float, float], ...] = ()  # (quantity, min, max) measured
    source: str = ""


@dataclass(frozen=True, slots=True)
class LoadLink:
    """A measured (or assumed) link: ``load_s = latency_s + bytes * K / (bandwidth * 1e9)``."""

    bandwidth_gbps: float
    latency_s: float
    fitted: tuple[str, ...] = ()
    cv_mape: float | None = None
    n_points: int = 0
    ranges: tuple[tuple[str, float, float], ...] = ()
    source: str = ""


@dataclass(frozen=True, slots=True)
class TtftCoefficients:
    """Scales of the TTFT form, fitted by ``kvpool cost ttft --calibration``.

    ``ttft_s = overhead_s + latency_s * [C > 0] + load_scale * K * bytes(C) / B
    + compute_scale * compute_s(S, C, K)``. Once attached to a :class:`CostModel`, the
    compute scale and overhead apply to every prefill time it gives (replay included).
    """

    overhead_s: float
    latency_s: float
    load_scale: float = 1.0
    compute_scale: float = 1.0
    fitted: tuple[str, ...] = ()
    cv_mape: float | None = None
    n_points: int = 0
    ranges: tuple[tuple[str, float, float], ...] = ()
    source: str = ""


def fit_json(
    fit: PrefillCoefficients | LoadLink | TtftCoefficients, provenance: bool
) -> dict[str, object]:
    """A fit's fields as JSON, in field order; ``ranges`` and ``source`` only with
    ``provenance`` (profiles keep them, :meth:`CostModel.describe` does not)."""
    out: dict[str, object] = {}
    for f in fields(fit):
        value = getattr(fit, f.name)
        if f.name in ("ranges", "source") and not provenance:
            continue
        if f.name == "fitted":
            value = list(value)
        elif f.name == "ranges":
            value = {name: [lo, hi] for name, lo, hi in value}
        out[f.name] = value
    return out
