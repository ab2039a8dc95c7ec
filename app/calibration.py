"""The Cost page's calibration: an uploaded measurements CSV fitted to the cost model
(the fit `kvpool cost fit` makes), cached per file content and model, and the fitted
model the Replay page may replay with."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from app.compute import CALLS, cost_model


@dataclass(frozen=True, slots=True)
class CalibrationView:
    """What the cost page shows for an uploaded calibration CSV."""

    points: Any  # pandas.DataFrame: measured_s, predicted_s, model ("catalog" | "fitted")
    summary: list[str]
    warnings: list[str]


@st.cache_resource(show_spinner=False, max_entries=16)
def _calibrated(model: str, gpu: str, tp: int, kv_dtype: str, name: str, sha: str, _data: bytes):
    from analyzer.cost.calibrate import calibrate_ttft, read_ttft_csv
    from app.state import scratch_dir

    CALLS["calibrate"] += 1
    folder = scratch_dir() / "calibration" / sha[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (Path(name).name or "calibration.csv")
    path.write_bytes(_data)
    rows = read_ttft_csv(path)
    return calibrate_ttft(cost_model(model, gpu, tp, kv_dtype), path), rows


def calibrated_model(w, name: str, data: bytes):
    """The what-if cost model with its TTFT coefficients fitted to a calibration CSV
    (``analyzer.cost.calibrate.calibrate_ttft``), and the CSV's usable rows."""
    sha = hashlib.sha256(data).hexdigest()
    return _calibrated(w.model, w.gpu, w.tp, w.kv_dtype, name, sha, data)


@st.cache_data(show_spinner=False, max_entries=16)
def _calibrate(model: str, gpu: str, tp: int, kv_dtype: str, name: str, data: bytes):
    import pandas as pd

    from analyzer.cost.calibrate import ttft_measurements

    sha = hashlib.sha256(data).hexdigest()
    fitted, rows = _calibrated(model, gpu, tp, kv_dtype, name, sha, data)
    catalog = cost_model(model, gpu, tp, kv_dtype)
    fit = fitted.ttft_fit
    points = []
    for m in ttft_measurements(rows):
        for label, cm in (("catalog", catalog), ("fitted", fitted)):
            predicted = cm.ttft(m.prompt_tokens, m.cached_tokens, m.concurrency, m.load_gbps)
            points.append(
                {
                    "model": label,
                    "measured_s": m.ttft_s,
                    "predicted_s": predicted.ttft_s,
                    "prompt_tokens": m.prompt_tokens,
                    "cached_tokens": m.cached_tokens,
                    "concurrency": m.concurrency,
                    "load_gbps": m.load_gbps,
                }
            )
    coeffs = ", ".join(
        f"{k} = {getattr(fit, k):.4g}"
        for k in ("compute_scale", "overhead_s", "load_scale", "latency_s")
    )
    kept = [
        k for k in ("compute_scale", "overhead_s", "load_scale", "latency_s") if k not in fit.fitted
    ]
    summary = [
        rows.summary(name) + ".",
        f"Fitted {', '.join(fit.fitted) or 'nothing'}"
        + (f"; kept from the catalog: {', '.join(kept)}" if kept else "")
        + f". Coefficients: {coeffs}.",
    ]
    if fit.cv_mape is not None:
        summary.append(
            f"Cross-validated error (MAPE): {fit.cv_mape:.1%} over {fit.n_points} points."
        )
    ranges = "; ".join(f"{n} {lo:g} to {hi:g}" for n, lo, hi in fit.ranges)
    warnings = (
        [f"Predictions outside the measured range ({ranges}) are extrapolated."] if ranges else []
    )
    return CalibrationView(points=pd.DataFrame(points), summary=summary, warnings=warnings)


def calibrate(w, name: str, data: bytes) -> CalibrationView:
    """Fit the TTFT model of the what-if model and GPUs to an uploaded CSV
    (``analyzer.cost.calibrate``) and compare catalog and fitted predictions."""
    return _calibrate(w.model, w.gpu, w.tp, w.kv_dtype, name, data)
