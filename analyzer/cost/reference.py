"""The reference table: published measurements, the model's predictions and its error.

``models/measurements.toml`` holds measured first-token latencies, prefill throughputs and
link bandwidths, each with its public source. This module reads it, predicts every row
with the cost model, fits the engine model's free constants (analyzer/cost/engine_constants.py) on
the prefill rows, and measures the error that matters: the **leave-one-out** error, each
row predicted by constants fitted on all the other rows. ``kvpool cost check`` prints it;
:mod:`analyzer.cost.uncertainty` turns it into ranges on every figure the tool prints.

Fitting is a least-squares on ``log(prediction / measurement)`` (relative error, as the
rows span 7 ms to 2.6 s) over the logarithms of the constants, from a fixed start, so the
result is deterministic.

Imported on first use, not at the top: SciPy's optimizer (it pulls in scipy.linalg, a
start-up cost the commands that fit nothing never pay).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import tomllib
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import numpy as np

from analyzer.cost.aic import measured_step
from analyzer.cost.catalog import get_model, get_tier, models_dir
from analyzer.cost.coefficients import DEFAULT_OVERHEAD_S
from analyzer.cost.engine_constants import DEFAULT_ENGINE, FITTED, EngineConstants
from analyzer.cost.model import CostModel, default_mfu
from analyzer.cost.step_formula import chunk_attn, step_seconds
from analyzer.errors import InputError, Location, shown
from analyzer.spawn import main_not_rerun

QUANTITIES = ("ttft_s", "prefill_tokens_per_s")
_BACKENDS = {"vLLM": "vllm", "SGLang": "sglang", "TensorRT-LLM": "trtllm"}
PARALLELISMS = ("tp", "dp-attention+ep")
# the fit starts here (not at the shipped defaults, so that a test refitting from scratch
# checks those defaults) and stays inside these bounds
_START = {
    "gemm_eff_bf16": 0.5,
    "gemm_eff_fp8": 0.5,
    "gemm_half_tokens": 64.0,
    "layer_step_s": 1e-4,
    "moe_eff": 0.5,
}
_BOUNDS = {
    "gemm_eff_bf16": (0.01, 1.0),
    "gemm_eff_fp8": (0.01, 1.0),
    "gemm_half_tokens": (1e-3, 1e5),
    "layer_step_s": (1e-7, 1e-2),
    "moe_eff": (0.01, 1.0),
}


def measurements_path() -> Path:
    return models_dir() / "measurements.toml"


@dataclass(frozen=True, slots=True)
class PrefillRow:
    """One published prefill measurement (see the header of models/measurements.toml)."""

    id: str
    model: str
    gpu: str
    tp: int
    parallelism: str
    weights_dtype: str
    kv_dtype: str
    engine: str
    engine_version: str
    prompt_tokens: int
    cached_tokens: int
    batch: int
    quantity: str
    value: float
    source: str
    url: str
    # the measured TTFT includes the server's per-request overhead (HTTP, tokenization,
    # scheduling): the prediction adds the cost model's request overhead
    includes_overhead: bool = False
    # the cached tokens were loaded from this catalog tier (a hit: load, scatter and the
    # engine's fixed costs are in the TTFT); "" when they were already in HBM or none
    load_tier: str = ""
    # the engine's prefill chunk (max_num_batched_tokens); 0: one forward
    chunk_tokens: int = 0
    # not used to fit the engine model's constants (their LOO ratio is their ratio)
    held_out: bool = False

    @property
    def backend(self) -> str:
        """The serving back end aiconfigurator-core names the row's engine by."""
        return _BACKENDS.get(self.engine, "")

    @property
    def is_moe(self) -> bool:
        return get_model(self.model).is_moe


@dataclass(frozen=True, slots=True)
class LinkRow:
    """One published link bandwidth, against the catalog tier it would be priced with."""

    id: str
    tier: str
    links: int
    measured_gbps: float
    engine: str
    source: str
    url: str

    @property
    def predicted_gbps(self) -> float:
        return get_tier(self.tier).bandwidth_gbps * self.links


@dataclass(frozen=True, slots=True)
class Measurements:
    prefill: tuple[PrefillRow, ...]
    links: tuple[LinkRow, ...]
    path: str


_PREFILL_FIELDS: dict[str, type] = {
    "id": str,
    "model": str,
    "gpu": str,
    "tp": int,
    "parallelism": str,
    "weights_dtype": str,
    "kv_dtype": str,
    "engine": str,
    "engine_version": str,
    "prompt_tokens": int,
    "cached_tokens": int,
    "batch": int,
    "quantity": str,
    "value": float,
    "source": str,
    "url": str,
}
_OPTIONAL_PREFILL: dict[str, type] = {
    "includes_overhead": bool,
    "load_tier": str,
    "chunk_tokens": int,
    "held_out": bool,
}
_LINK_FIELDS: dict[str, type] = {
    "id": str,
    "tier": str,
    "links": int,
    "measured_gbps": float,
    "engine": str,
    "source": str,
    "url": str,
}


# a field's value once its type is checked
Value = str | int | float | bool
T = TypeVar("T", str, int, float, bool)


def _row(
    entry: object, spec: dict[str, type], where: str, index: int, table: str
) -> dict[str, Value]:
    if not isinstance(entry, dict):
        raise InputError(f"[[{table}]] #{index + 1} is not a table", Location(where))
    out: dict[str, Value] = {}
    name = entry.get("id", f"#{index + 1}")
    for key, kind in spec.items():
        value = entry.get(key)
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok or not isinstance(value, str | int | float):
            raise InputError(
                f"[[{table}]] '{name}': field '{key}' must be a {kind.__name__}, got {value!r}",
                Location(where, None, key),
            )
        if isinstance(value, int | float) and not value > 0 and key != "cached_tokens":
            raise InputError(
                f"[[{table}]] '{name}': field '{key}' must be positive, got {value!r}",
                Location(where, None, key),
            )
        out[key] = value
    return out


def _get(r: Mapping[str, Value], key: str, kind: type[T], default: T | None = None) -> T:
    """A checked field of a row (``default`` where the table may leave it out)."""
    value = r.get(key, default)
    assert isinstance(value, kind), (key, value)
    return value


def _prefill_row(r: Mapping[str, Value]) -> PrefillRow:
    return PrefillRow(
        id=_get(r, "id", str),
        model=_get(r, "model", str),
        gpu=_get(r, "gpu", str),
        tp=_get(r, "tp", int),
        parallelism=_get(r, "parallelism", str),
        weights_dtype=_get(r, "weights_dtype", str),
        kv_dtype=_get(r, "kv_dtype", str),
        engine=_get(r, "engine", str),
        engine_version=_get(r, "engine_version", str),
        prompt_tokens=_get(r, "prompt_tokens", int),
        cached_tokens=_get(r, "cached_tokens", int),
        batch=_get(r, "batch", int),
        quantity=_get(r, "quantity", str),
        value=_get(r, "value", float),
        source=_get(r, "source", str),
        url=_get(r, "url", str),
        includes_overhead=_get(r, "includes_overhead", bool, False),
        load_tier=_get(r, "load_tier", str, ""),
        chunk_tokens=_get(r, "chunk_tokens", int, 0),
        held_out=_get(r, "held_out", bool, False),
    )


def _link_row(r: Mapping[str, Value]) -> LinkRow:
    return LinkRow(
        id=_get(r, "id", str),
        tier=_get(r, "tier", str),
        links=_get(r, "links", int),
        measured_gbps=_get(r, "measured_gbps", float),
        engine=_get(r, "engine", str),
        source=_get(r, "source", str),
        url=_get(r, "url", str),
    )


def load_measurements(path: str | Path | None = None) -> Measurements:
    """Read and validate the reference table (InputError naming the row and field)."""
    p = Path(path) if path is not None else measurements_path()
    where = shown(str(p))  # stdin: <stdin>
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"reference table not found: {p}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read reference table {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"reference table is not valid TOML: {exc}", Location(where)) from None
    prefill = []
    seen: set[str] = set()
    for i, entry in enumerate(data.get("prefill", [])):
        r = _row(entry, _PREFILL_FIELDS, where, i, "prefill")
        if r["quantity"] not in QUANTITIES:
            raise InputError(
                f"[[prefill]] '{r['id']}': quantity must be one of {', '.join(QUANTITIES)}",
                Location(where, None, "quantity"),
            )
        if r["parallelism"] not in PARALLELISMS:
            raise InputError(
                f"[[prefill]] '{r['id']}': parallelism must be one of {', '.join(PARALLELISMS)}",
                Location(where, None, "parallelism"),
            )
        for key, kind in _OPTIONAL_PREFILL.items():
            if key not in entry:
                continue
            value = entry[key]
            ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not ok or (kind is int and value < 0):
                raise InputError(
                    f"[[prefill]] '{r['id']}': field '{key}' must be a "
                    f"{'non-negative ' if kind is int else ''}{kind.__name__}, got {value!r}",
                    Location(where, None, key),
                )
            r[key] = value
        row = _prefill_row(r)
        if row.load_tier:
            try:
                get_tier(row.load_tier)
            except Exception:
                raise InputError(
                    f"[[prefill]] '{row.id}': load_tier '{row.load_tier}' is not a catalog tier",
                    Location(where, None, "load_tier"),
                ) from None
            if not row.cached_tokens:
                raise InputError(
                    f"[[prefill]] '{row.id}': load_tier needs cached_tokens > 0",
                    Location(where, None, "load_tier"),
                )
        if row.cached_tokens < 0 or row.cached_tokens >= row.prompt_tokens:
            raise InputError(
                f"[[prefill]] '{row.id}': cached_tokens must be in [0, prompt_tokens)",
                Location(where, None, "cached_tokens"),
            )
        prefill.append(row)
    links = [
        _link_row(_row(e, _LINK_FIELDS, where, i, "link"))
        for i, e in enumerate(data.get("link", []))
    ]
    rows: list[PrefillRow | LinkRow] = [*prefill, *links]
    for item in rows:
        if item.id in seen:
            raise InputError(f"duplicate row id '{item.id}'", Location(where, None, "id"))
        seen.add(item.id)
    if not prefill:
        raise InputError("the reference table has no [[prefill]] rows", Location(where))
    return Measurements(tuple(prefill), tuple(links), where)


# ---------------------------------------------------------------------------------------
# predictions


@lru_cache(maxsize=256)
def _cost_model(row: PrefillRow) -> CostModel:
    return CostModel.from_catalog(
        row.model,
        row.gpu,
        tp=row.tp,
        kv_dtype=row.kv_dtype,
        weight_dtype=row.weights_dtype,
        expert_parallel=row.parallelism == "dp-attention+ep",
        overhead_s=0.0,
    )


def predict(row: PrefillRow, engine: EngineConstants = DEFAULT_ENGINE) -> float:
    """The engine model's value of ``row.quantity`` for the row's deployment (with
    constants ``engine``): :func:`predict_with` on its step coefficients."""
    cm = _cost_model(row)
    return predict_with(row, cm.engine_coefficients(engine))


def predict_with(row: PrefillRow, coefficients: np.ndarray) -> float:
    """The row's quantity from step coefficients (analyzer/cost/step_formula.py): the prompt's
    new tokens prefilled in chunks of ``chunk_tokens`` (one forward when 0), ``batch``
    requests alike in each step; for a hit from ``load_tier``, the load of the cached
    tokens over that tier's link (first-byte latency, transfer, scatter into the paged
    KV, the engine's fixed cost per load) before them; the request overhead when the
    measurement includes it. A throughput row is the batch's prompt tokens over that
    time.
    """
    cm = _cost_model(row)
    new = row.prompt_tokens - row.cached_tokens
    chunk = row.chunk_tokens or new
    t = 0.0
    done = 0
    while done < new:
        s = min(chunk, new - done)
        attn = row.batch * chunk_attn(s, row.cached_tokens + done)
        t += step_seconds(coefficients, float(s * row.batch), attn, 0.0, 0.0)
        done += s
    if row.load_tier:
        link = cm.tier_link(row.load_tier)
        t += cm.load_prefix_s(row.cached_tokens, link.bandwidth_gbps, link.latency_s, row.batch)
    if row.includes_overhead:
        t += DEFAULT_OVERHEAD_S
    if row.quantity == "ttft_s":
        return float(t)
    return float(new * row.batch / t)


def ratio(row: PrefillRow, engine: EngineConstants = DEFAULT_ENGINE) -> float:
    """prediction / measurement, always as a ratio of TIMES (>1: the model is too slow).

    For throughput rows this is measurement / prediction, so that every ratio reads the
    same way: above 1 the model overestimates the time a prefill takes.
    """
    return time_ratio(row, predict(row, engine))


def time_ratio(row: PrefillRow, predicted: float) -> float:
    return predicted / row.value if row.quantity == "ttft_s" else row.value / predicted


def roofline_ratio(row: PrefillRow) -> float:
    """The time ratio of the plain roofline this model replaced: bf16 peak, MFU 0.5 dense /
    0.35 MoE, the checkpoint's weights, 10 ms of overhead on TTFT rows."""
    cm = CostModel.from_catalog(
        row.model,
        row.gpu,
        tp=row.tp,
        kv_dtype=row.kv_dtype,
        mfu=default_mfu(_cost_model(row).model),
        compute_dtype="bf16",
    )
    new = row.prompt_tokens - row.cached_tokens
    if row.quantity == "ttft_s":
        return cm.prefill_time_s(new, row.cached_tokens, row.batch) / row.value
    return row.value / (new * row.batch / cm.compute_time_s(new, row.cached_tokens, row.batch))


def fit_engine(
    rows: tuple[PrefillRow, ...], base: EngineConstants = DEFAULT_ENGINE
) -> EngineConstants:
    """Least-squares fit of the FITTED constants on ``rows`` (relative error, log space)."""
    from scipy.optimize import least_squares

    rows = tuple(r for r in rows if not r.held_out)
    names = [n for n in FITTED if _used(n, rows)]
    lo = np.log([_BOUNDS[n][0] for n in names])
    hi = np.log([_BOUNDS[n][1] for n in names])
    x0 = np.log([_START[n] for n in names])

    def residuals(x: np.ndarray) -> list[float]:
        e = base.with_values(dict(zip(names, np.exp(x), strict=True)))
        return [math.log(ratio(r, e)) for r in rows]

    res = least_squares(residuals, x0, bounds=(lo, hi), method="trf", xtol=1e-12, ftol=1e-12)
    values = {n: float(v) for n, v in zip(names, np.exp(res.x), strict=True)}
    return base.with_values(values)


def _used(name: str, rows: tuple[PrefillRow, ...]) -> bool:
    """Whether any row informs ``name`` (a constant no row touches keeps its default)."""
    if name == "gemm_eff_bf16":
        return any(_cost_model(r).compute_dtype == "bf16" for r in rows)
    if name == "gemm_eff_fp8":
        return any(_cost_model(r).compute_dtype != "bf16" for r in rows)
    if name == "moe_eff":
        return any(r.is_moe for r in rows)
    return True


@dataclass(frozen=True, slots=True)
class CheckedRow:
    row: PrefillRow
    predicted: float  # with the constants fitted on every row
    ratio: float  # time ratio, prediction / measurement
    loo_predicted: float  # with the constants fitted on every other row
    loo_ratio: float  # a held-out row's is its ratio (it is in no fit)
    roofline_ratio: float  # the plain roofline (bf16 peak x default MFU), for comparison
    # aiconfigurator-core's measured step times (analyzer/cost/aic.py) where they cover
    # the row, else None and why in measured_source
    measured_predicted: float | None = None
    measured_ratio: float | None = None
    measured_source: str = ""


@dataclass(frozen=True, slots=True)
class CheckResult:
    rows: tuple[CheckedRow, ...]
    links: tuple[LinkRow, ...]
    fitted: EngineConstants  # on every row
    path: str

    @property
    def loo_median_error(self) -> float:
        """Median of |LOO ratio - 1| over the prefill rows."""
        return statistics.median(abs(r.loo_ratio - 1) for r in self.rows)

    @property
    def loo_worst_factor(self) -> float:
        """The largest max(ratio, 1/ratio) among the LOO predictions."""
        return max(max(r.loo_ratio, 1 / r.loo_ratio) for r in self.rows)

    def to_json(self) -> dict[str, object]:
        return {
            "table": self.path,
            "fitted_constants": self.fitted.to_json(),
            "prefill": [
                {
                    "id": c.row.id,
                    "model": c.row.model,
                    "gpu": c.row.gpu,
                    "tp": c.row.tp,
                    "parallelism": c.row.parallelism,
                    "weights_dtype": c.row.weights_dtype,
                    "engine": f"{c.row.engine} {c.row.engine_version}",
                    "prompt_tokens": c.row.prompt_tokens,
                    "cached_tokens": c.row.cached_tokens,
                    "batch": c.row.batch,
                    "quantity": c.row.quantity,
                    "measured": c.row.value,
                    "predicted": c.predicted,
                    "ratio": c.ratio,
                    "loo_predicted": c.loo_predicted,
                    "loo_ratio": c.loo_ratio,
                    "roofline_ratio": c.roofline_ratio,
                    "measured_predicted": c.measured_predicted,
                    "measured_ratio": c.measured_ratio,
                    "measured_source": c.measured_source,
                    "includes_overhead": c.row.includes_overhead,
                    "load_tier": c.row.load_tier or None,
                    "chunk_tokens": c.row.chunk_tokens,
                    "fitted": not c.row.held_out,
                    "source": c.row.source,
                    "url": c.row.url,
                }
                for c in self.rows
            ],
            "links": [
                {
                    "id": r.id,
                    "tier": r.tier,
                    "links": r.links,
                    "measured_gbps": r.measured_gbps,
                    "predicted_gbps": r.predicted_gbps,
                    "ratio": r.predicted_gbps / r.measured_gbps,
                    "source": r.source,
                    "url": r.url,
                }
                for r in self.links
            ],
            "summary": {
                "prefill_rows": len(self.rows),
                "loo_median_abs_error": self.loo_median_error,
                "loo_worst_factor": self.loo_worst_factor,
                "loo_within_1_5x": sum(1 for r in self.rows if 1 / 1.5 <= r.loo_ratio <= 1.5),
            },
        }


def check(path: str | Path | None = None, measured: bool = False) -> CheckResult:
    """Predict every row, fit on the rows not held out, and leave each fitted row out in
    turn; with ``measured``, also price every row with aiconfigurator-core's step times
    where they cover it (a few seconds per deployment)."""
    m = load_measurements(path)
    return _check(m, measured)


@lru_cache(maxsize=4)
def _check(m: Measurements, measured: bool = False) -> CheckResult:
    fitted = fit_engine(m.prefill)
    out = []
    for i, row in enumerate(m.prefill):
        if row.held_out:
            loo = fitted
        else:
            others = m.prefill[:i] + m.prefill[i + 1 :]
            loo = fit_engine(others)
        mp: float | None = None
        mr: float | None = None
        msrc = ""
        if measured:
            mp, msrc = _measured_prediction(row)
            mr = None if mp is None else time_ratio(row, mp)
        out.append(
            CheckedRow(
                row=row,
                predicted=predict(row, fitted),
                ratio=ratio(row, fitted),
                loo_predicted=predict(row, loo),
                loo_ratio=ratio(row, loo),
                roofline_ratio=roofline_ratio(row),
                measured_predicted=mp,
                measured_ratio=mr,
                measured_source=msrc,
            )
        )
    return CheckResult(tuple(out), m.links, fitted, m.path)


def _measured_prediction(row: PrefillRow) -> tuple[float | None, str]:
    """aiconfigurator-core's prediction of the row, or None and why not."""
    if not row.backend:
        return None, f"aiconfigurator-core has no back end for {row.engine}"
    got = measured_step(_cost_model(row), row.backend)
    if isinstance(got, str):
        return None, got
    return predict_with(row, got.coefficients), got.source


_warming: threading.Thread | None = None
_aside: Future[tuple[Measurements, CheckResult]] | None = None


def warm_default_check(pool: Executor | None = None) -> None:
    """Start :func:`default_check` (once per process) for a caller that has a while to
    wait before it needs the answer: in ``pool`` when given (the analysis's worker
    processes, idle while the command imports its stages and reads the log), else in a
    thread of this process. It takes 0.8 s, most of it importing and running scipy's
    least squares. Errors are left to the call that needs the answer, which raises
    them (a pool that fails to answer: it computes the check itself)."""
    global _warming, _aside
    if _warming is not None or _aside is not None:
        return
    if pool is not None:
        try:
            with main_not_rerun():
                _aside = pool.submit(_table_and_check)
            return
        except RuntimeError:  # a pool shut down or broken: a thread here instead
            pass

    def run() -> None:
        with contextlib.suppress(Exception):  # the caller's own default_check() raises it
            default_check()

    _warming = threading.Thread(target=run, name="kvpool-error-band", daemon=True)
    _warming.start()


def default_check() -> CheckResult:
    """The shipped table's check, computed once per process (waiting for
    :func:`warm_default_check`'s thread or worker when one is computing it; a worker's
    answer holds while the table it read is the one this process reads)."""
    global _aside
    m = load_measurements()
    a = _aside
    if a is not None:
        try:
            table, check = a.result()
        except Exception:  # a pool shut down or broken before it answered
            _aside = None
        else:
            if table == m:
                return check
    w = _warming
    if w is not None and w is not threading.current_thread():
        w.join()
    return _check(m)


def _table_and_check() -> tuple[Measurements, CheckResult]:
    """:func:`default_check` in a worker, with the table it read."""
    m = load_measurements()
    return m, _check(m)
