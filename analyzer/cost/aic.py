"""Step times from measured kernel data: NVIDIA aiconfigurator-core, fitted once per deployment.

aiconfigurator-core (PyPI ``aiconfigurator-core``, Apache-2.0, offline) holds per-kernel
latencies measured on H100/H200/B200/A100/L40S under vLLM, SGLang and TensorRT-LLM, and
its ``RustForwardPassPerfModel.estimate_forward_pass_time_ms`` composes them into the
time of one forward over a step's counts (prefill requests, tokens and cached tokens;
decode requests and their KV tokens). A replay takes millions of steps, so it is not
called in the hot loop: as Vidur evaluates its predictor over a grid before simulating,
:func:`measured_step` asks it once per (model, GPU, TP, back end, precision) for a fixed
grid of steps (prefill-only, decode-only and mixed, chunks of 1 to 8,192 tokens after up
to 32,768 cached ones, 1 to 512 decoding requests of 128 to 65,536 tokens), fits the
step model's coefficients (analyzer/cost/step_formula.py) to those predictions by least squares
on the log ratio, and reports the fit's error against the library on the grid and on a
second, held-out grid. The hot loop then does arithmetic only.

The fitted quantities are scales of kvpool's own engine coefficients (GEMM seconds per
row, attention seconds per unit of context, weight and KV bytes), the GEMM half-rows and
the two fixed costs (a step with prefill, a decode-only step), so what the library's
data cannot inform (a window, the MoE routing) keeps the engine model's value.

Coverage comes from ``models/aiconfigurator.toml`` (kvpool ids to its system and model
names) and from the library itself: a deployment it cannot compile or has no kernel data
for falls back to the engine model, and the step model's ``source`` says why.

Imported on first use, not at the top: aiconfigurator-core (only here, and only when a
step model is asked for, so that ``kvpool --help`` does not pay its import) and SciPy's
optimizer (which pulls in scipy.linalg, a start-up cost ``kvpool reuse`` never pays).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import multiprocessing
import os
import re
import tempfile
import tomllib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import version as package_version
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from analyzer.cost import step_formula as step
from analyzer.cost.catalog import models_dir
from analyzer.cost.model import CostModel
from analyzer.spawn import main_not_rerun

if TYPE_CHECKING:
    from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

LIBRARY = "aiconfigurator-core"

# (prefill requests, new tokens each, cached tokens each, decoding requests, context each)
Point = tuple[int, int, int, int, int]


def _fit_grid() -> tuple[Point, ...]:
    out: list[Point] = []
    for n in (1, 2, 4, 8):
        for s in (1, 16, 64, 256, 1024, 2048, 4096, 8192):
            if n * s > 16384:
                continue
            for p in (0, 1024, 8192, 32768):
                out.append((n, s, p, 0, 0))
    for d in (1, 2, 8, 32, 64, 128, 256, 512):
        for ctx in (128, 1024, 4096, 16384, 65536):
            if d * ctx <= 8_388_608:
                out.append((0, 0, 0, d, ctx))
    for s in (16, 256, 2048):
        for p in (0, 8192):
            for d in (4, 64, 256):
                for ctx in (1024, 8192):
                    out.append((1, s, p, d, ctx))
    return tuple(out)


def _held_out_grid() -> tuple[Point, ...]:
    """Shapes the fit does not see: odd sizes between the fitted grid's."""
    out: list[Point] = []
    for n, s, p in ((1, 100, 0), (1, 700, 3000), (3, 1500, 500), (2, 3000, 20000), (6, 40, 12000)):
        out.append((n, s, p, 0, 0))
    for d, ctx in ((3, 700), (24, 3000), (96, 12000), (200, 2500), (384, 900)):
        out.append((0, 0, 0, d, ctx))
    for s, p, d, ctx in ((512, 2000, 16, 2000), (1200, 0, 120, 5000), (64, 30000, 40, 30000)):
        out.append((1, s, p, d, ctx))
    return tuple(out)


FIT_GRID = _fit_grid()
HELD_OUT_GRID = _held_out_grid()


@dataclass(frozen=True, slots=True)
class MeasuredStep:
    """Step coefficients fitted to aiconfigurator-core's predictions for one deployment."""

    coefficients: np.ndarray
    source: str  # e.g. "aiconfigurator-core 0.12.0 (vllm 0.24.0, h100_sxm, ..., TP1)"
    fit_median_error: float  # |fit / library - 1| over the fitted grid
    fit_worst_factor: float  # max(r, 1/r) over the fitted grid
    held_out_median_error: float  # the same on the held-out grid
    held_out_worst_factor: float
    points: int


def _args(point: Point) -> tuple[float, float, float, float]:
    n, s, p, d, ctx = point
    return float(n * s), n * step.chunk_attn(s, p), float(d), float(d * ctx)


def _fpm(point: Point) -> dict[str, dict[str, float]]:
    n, s, p, d, ctx = point
    return {
        "scheduled_requests": {
            "num_prefill_requests": n,
            "sum_prefill_tokens": n * s,
            "var_prefill_length": 0.0,
            "sum_prefill_kv_tokens": n * p,
            "num_decode_requests": d,
            "sum_decode_kv_tokens": d * ctx,
            "var_decode_kv_tokens": 0.0,
        }
    }


class _Names(TypedDict):
    """``models/aiconfigurator.toml``: kvpool ids to the library's names."""

    systems: dict[str, str]  # GPU id -> system
    models: dict[str, dict[str, str]]  # model id -> weights dtype -> model name


@lru_cache(maxsize=1)
def _mapping() -> _Names:
    with (models_dir() / "aiconfigurator.toml").open("rb") as f:
        data = tomllib.load(f)
    return _Names(systems=dict(data["systems"]), models=dict(data["models"]))


def coverage(cost: CostModel, backend: str) -> tuple[str, str] | str:
    """``(system, model name)`` aiconfigurator-core would be asked for, or why not."""
    if cost.engine is None:
        return "the plain roofline (--mfu) was asked for"
    if cost.prefill.fitted or cost.ttft_fit is not None:
        return "a calibration of your own (--profile, --calibration) takes precedence"
    mapping = _mapping()
    system = mapping["systems"].get(cost.gpu.id)
    if system is None:
        return f"{LIBRARY} has no kernel data for {cost.gpu.name}"
    names = mapping["models"].get(cost.model.id, {})
    name = names.get(cost.weight_dtype)
    if name is None:
        if not names:
            return f"{LIBRARY} has no configuration for {cost.model.name}"
        return f"{LIBRARY} has no {cost.weight_dtype} configuration for {cost.model.name}"
    return system, name


def _reason(exc: Exception) -> str:
    """The first line of the library's error, without the file paths it names (no path
    leaves kvpool's output: docs/security.md)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    first = re.sub(r"\s+(at|in|from)\s+/\S*", "", first)
    first = re.sub(r"/\S+", "<path>", first)
    return first[:160]


def _library_version() -> str:
    return package_version(LIBRARY)


def _native_model(
    system: str, name: str, cost: CostModel, backend: str
) -> RustForwardPassPerfModel:
    import aiconfigurator_core
    from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

    config: dict[str, str | int] = {
        "schema_version": aiconfigurator_core.engine_spec_schema_version(),
        "model_name": name,
        "system_name": system,
        "backend": backend,
        "tp_size": cost.tp,
        "pp_size": 1,
        "kvcache_quant_mode": "fp8" if cost.kv_dtype == "fp8" else "bfloat16",
    }
    if cost.model.is_moe:
        # experts split over the ranks as the instance's TP does (vLLM's default), or one
        # expert group per rank under expert parallelism
        config["moe_tp_size"] = 1 if cost.expert_parallel else cost.tp
        config["moe_ep_size"] = cost.tp if cost.expert_parallel else 1
    return RustForwardPassPerfModel.from_native(config)


# x: log of [gemm scale, half rows, attention scale, weights scale, KV scale, fixed with
# prefill beyond the decode one, fixed of a decode-only step, all-reduce scale]
_X_NAMES = ("gemm", "half", "attn", "weights", "kv", "fixed_extra", "fixed_decode", "comm")


def _coefficients(base: np.ndarray, x: np.ndarray) -> np.ndarray:
    v = np.exp(x)
    c = base.copy()
    c[step.GEMM_S_PER_ROW] *= v[0]
    c[step.GEMM_HALF_ROWS] = v[1]
    c[step.ATTN_S] *= v[2]
    c[step.WINDOW_ATTN_S] *= v[2]
    c[step.WEIGHTS_DENSE_S] *= v[3]
    c[step.WEIGHTS_EXPERT_S] *= v[3]
    c[step.KV_S] *= v[4]
    c[step.WINDOW_KV_S] *= v[4]
    c[step.STATE_S] *= v[4]
    c[step.FIXED_DECODE_S] = v[6]
    c[step.FIXED_S] = v[6] + v[5]
    c[step.COMM_S_PER_ROW] *= v[7]
    return c


def _errors(c: np.ndarray, points: tuple[Point, ...], truth: np.ndarray) -> tuple[float, float]:
    ratios = np.array([step.step_seconds(c, *_args(q)) for q in points]) / truth
    return float(np.median(np.abs(ratios - 1.0))), float(np.max(np.maximum(ratios, 1 / ratios)))


def fit_to(base: np.ndarray, points: tuple[Point, ...], truth_s: np.ndarray) -> np.ndarray:
    """Least-squares fit (log ratio) of the step model's free quantities to ``truth_s``,
    from the engine coefficients ``base``; deterministic (fixed start, no randomness)."""
    from scipy.optimize import least_squares

    args = [_args(q) for q in points]
    log_truth = np.log(truth_s)
    x0 = np.log(
        [
            1.0,
            max(base[step.GEMM_HALF_ROWS], 1.0),
            1.0,
            1.0,
            1.0,
            max(base[step.FIXED_S] / 2, 1e-6),
            max(base[step.FIXED_S] / 2, 1e-6),
            1.0,
        ]
    )
    lo = np.log([0.05, 1e-2, 0.05, 0.2, 0.05, 1e-7, 1e-7, 0.05])
    hi = np.log([20.0, 1e5, 20.0, 5.0, 20.0, 1.0, 1.0, 20.0])

    def residuals(x: np.ndarray) -> np.ndarray:
        c = _coefficients(base, x)
        pred = np.array([step.step_seconds(c, *a) for a in args])
        out: np.ndarray = np.log(pred) - log_truth
        return out

    res = least_squares(residuals, x0, bounds=(lo, hi), method="trf", xtol=1e-10, ftol=1e-10)
    return _coefficients(base, res.x)


def measured_step(cost: CostModel, backend: str) -> MeasuredStep | str:
    """The deployment's step coefficients fitted to aiconfigurator-core, or why there are
    none (not installed, not covered, no kernel data for a shape of the grid)."""
    where = coverage(cost, backend)
    if isinstance(where, str):
        return where
    key: _Key = (
        where[0],
        where[1],
        backend,
        cost.model.id,
        cost.gpu.id,
        cost.tp,
        cost.weight_dtype,
        cost.kv_dtype,
        cost.expert_parallel,
    )
    got = _FITTED.get(key)
    if got is None:
        got = _from_disk(key)
        if got is None:
            got = _fit(key)
            if isinstance(got, MeasuredStep):
                _to_disk(key, got)
        _FITTED[key] = got
        while len(_FITTED) > MAX_FITTED:
            _FITTED.pop(next(iter(_FITTED)))
    return got


# (system, model name, back end, model, GPU, TP, weight dtype, KV dtype, expert parallel)
_Key = tuple[str, str, str, str, str, int, str, str, bool]
# Each deployment's fit, made once per process (the oldest forgotten past MAX_FITTED).
Fits = dict[_Key, MeasuredStep | str]
_FITTED: Fits = {}
MAX_FITTED = 64


def fitted() -> Fits:
    """The fits this process has made, by deployment: a replay worker process given them
    (:func:`remember_fitted`) neither imports the library nor fits again (81 MB and about
    15 s of CPU for a worker's first deployment)."""
    return dict(_FITTED)


def remember_fitted(fits: Fits) -> None:
    """Take the fits another process made (:func:`fitted`): the same library, data and
    deployment give the same fit."""
    for key, fit in fits.items():
        _FITTED.setdefault(key, fit)


def _fit(key: _Key) -> MeasuredStep | str:
    """The deployment's fit, made in a process of its own that ends with it, so that this
    one (the analysis, holding the log) never holds the library's data: 80 MB and about
    40 MB more for each GPU system it reads, which it does not give back. In this process
    when no other can be started (a daemonic worker, a sandbox without processes)."""
    try:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            with main_not_rerun():
                made = pool.submit(_measured, *key)
            return made.result()
    except Exception:
        return _measured(*key)


def cache_dir() -> Path:
    """Where fits are kept between runs: ``$KVPOOL_CACHE_DIR``, else kvpool's folder in
    the user's cache (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    own = os.environ.get("KVPOOL_CACHE_DIR")
    if own:
        return Path(own) / "step-fits"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvpool" / "step-fits"


def _disk_name(key: _Key) -> str | None:
    """The file a deployment's fit is kept in: a digest of everything the fit depends
    on (the library's version, the deployment, the grids, kvpool's own coefficients for
    it from the catalog, and this module's and the step formula's code), so that a change
    to any of them is a new file, never a stale fit. None: the library is not installed."""
    try:
        version = _library_version()
    except Exception:
        return None
    *_, model, gpu, tp, weight_dtype, kv_dtype, ep = key
    cost = CostModel.from_catalog(
        model, gpu, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype, expert_parallel=ep
    )
    h = hashlib.sha256()
    for part in (version, repr(key), repr(FIT_GRID), repr(HELD_OUT_GRID)):
        h.update(part.encode())
    h.update(np.ascontiguousarray(cost.engine_coefficients(cost.engine), dtype=float).tobytes())
    for module in (__file__, step.__file__):
        h.update(Path(module).read_bytes())
    return f"{h.hexdigest()[:32]}.json"


def _from_disk(key: _Key) -> MeasuredStep | None:
    """The fit a run before this one made and kept (None: none, or unreadable)."""
    try:
        name = _disk_name(key)
        if name is None:
            return None
        doc = json.loads((cache_dir() / name).read_text())
        return MeasuredStep(
            coefficients=np.array(doc["coefficients"], dtype=float),
            source=str(doc["source"]),
            fit_median_error=float(doc["fit_median_error"]),
            fit_worst_factor=float(doc["fit_worst_factor"]),
            held_out_median_error=float(doc["held_out_median_error"]),
            held_out_worst_factor=float(doc["held_out_worst_factor"]),
            points=int(doc["points"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _to_disk(key: _Key, fit: MeasuredStep) -> None:
    """Keep ``fit`` for later runs, written whole or not at all (a cache: a folder that
    cannot be written only means the next run fits again)."""
    tmp: str | None = None
    try:
        name = _disk_name(key)
        if name is None:
            return
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        doc = {
            "coefficients": [float(x) for x in fit.coefficients],
            "source": fit.source,
            "fit_median_error": fit.fit_median_error,
            "fit_worst_factor": fit.fit_worst_factor,
            "held_out_median_error": fit.held_out_median_error,
            "held_out_worst_factor": fit.held_out_worst_factor,
            "points": fit.points,
        }
        with tempfile.NamedTemporaryFile(
            "w", dir=folder, prefix=".fit-", suffix=".tmp", delete=False
        ) as f:
            tmp = f.name
            json.dump(doc, f)
        os.replace(tmp, folder / name)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _measured(
    system: str,
    name: str,
    backend: str,
    model: str,
    gpu: str,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    expert_parallel: bool,
) -> MeasuredStep | str:
    try:
        version = _library_version()
    except Exception:
        return f"{LIBRARY} is not installed"
    cost = CostModel.from_catalog(
        model,
        gpu,
        tp=tp,
        kv_dtype=kv_dtype,
        weight_dtype=weight_dtype,
        expert_parallel=expert_parallel,
    )
    library_logger = logging.getLogger("aiconfigurator_core")
    level = library_logger.level
    library_logger.setLevel(logging.ERROR)  # its per-table fallback notes are not ours
    try:
        native = _native_model(system, name, cost, backend)
        fit_ms = [native.estimate_forward_pass_time_ms(_fpm(q)) for q in FIT_GRID]
        held_ms = [native.estimate_forward_pass_time_ms(_fpm(q)) for q in HELD_OUT_GRID]
    except Exception as exc:  # the library's own errors: unsupported model, missing data
        return f"{LIBRARY} cannot price {name} on {system} ({backend}): {_reason(exc)}"
    finally:
        library_logger.setLevel(level)
    values = [*fit_ms, *held_ms]
    if any(v is None or not math.isfinite(v) or v <= 0 for v in values):
        return f"{LIBRARY} gave no time for some steps of {name} on {system} ({backend})"
    truth = np.array(fit_ms) / 1e3
    held = np.array(held_ms) / 1e3
    c = fit_to(cost.engine_coefficients(cost.engine), FIT_GRID, truth)
    fit_med, fit_worst = _errors(c, FIT_GRID, truth)
    held_med, held_worst = _errors(c, HELD_OUT_GRID, held)
    source = f"{LIBRARY} {version} ({backend}, {system}, {name}, TP{tp})"
    return MeasuredStep(
        coefficients=c,
        source=source,
        fit_median_error=fit_med,
        fit_worst_factor=fit_worst,
        held_out_median_error=held_med,
        held_out_worst_factor=held_worst,
        points=len(FIT_GRID),
    )
