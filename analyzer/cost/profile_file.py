"""Fitted profiles as reviewable JSON files (schema ``kvpool.cost-profile/1``).

``kvpool cost fit`` and ``kvpool cost profile`` write one; ``--profile FILE`` reads it
back into a :class:`~analyzer.cost.model.CostModel`: the catalog model the profile names,
with its fitted sections (prefill, load link, TTFT) in place of the catalog
coefficients. Every malformed field is an InputError naming the file and field; the
flags a command is given must agree with the profile.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

from analyzer.cost.catalog import get_gpu, get_model
from analyzer.cost.coefficients import LoadLink, PrefillCoefficients, TtftCoefficients, fit_json
from analyzer.cost.model import CostModel
from analyzer.errors import InputError, Location, UsageError, shown
from analyzer.outputs import note_input, write_text

PROFILE_SCHEMA = "kvpool.cost-profile/1"


def profile_json(cm: CostModel, measured: Mapping[str, object] | None = None) -> dict[str, object]:
    """The fitted parts of ``cm`` as a JSON-ready dict (schema ``kvpool.cost-profile/1``).

    ``measured`` (from ``kvpool cost profile``: the device, the layer shapes timed, the
    raw CSVs, copy and NVMe fits) is kept under ``measured``; loading ignores it.
    """
    out: dict[str, object] = {
        "schema": PROFILE_SCHEMA,
        "model": cm.model_ref,
        "gpu": cm.gpu.id,
        "tp": cm.tp,
        "kv_dtype": cm.kv_dtype,
        "compute_dtype": cm.compute_dtype,
        "weight_dtype": cm.weight_dtype,
        "mfu": cm.mfu if cm.engine is None else None,  # null: the engine model
        "prefill": None,
        "load": None,
        "ttft": None,
    }
    c = cm.prefill
    if c.fitted:
        form = "polynomial" if c.compute_scale == 0 else "scaled-analytic"
        out["prefill"] = {"form": form, **fit_json(c, provenance=True)}
    if cm.link is not None:
        out["load"] = fit_json(cm.link, provenance=True)
    if cm.ttft_fit is not None:
        out["ttft"] = fit_json(cm.ttft_fit, provenance=True)
    if measured is not None:
        out["measured"] = dict(measured)
    return out


def save_profile(
    cm: CostModel, path: str | Path, measured: Mapping[str, object] | None = None
) -> Path:
    p = Path(path)
    text = json.dumps(profile_json(cm, measured), indent=2, sort_keys=True) + "\n"
    return write_text(p, text)


def _num(
    section: Mapping[str, object], key: str, where: str, *, default: float | None = None
) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"'{key}' must be a number, got {value!r}", Location(where, None, key))
    if value < 0:
        raise InputError(f"'{key}' must be >= 0, got {value}", Location(where, None, key))
    return float(value)


def _ranges(section: Mapping[str, object], where: str) -> tuple[tuple[str, float, float], ...]:
    raw = section.get("ranges") or {}
    if not isinstance(raw, dict):
        raise InputError("'ranges' must be an object", Location(where, None, "ranges"))
    out = []
    for name, pair in sorted(raw.items()):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise InputError(f"range '{name}' must be [min, max]", Location(where, None, name))
        out.append((name, float(pair[0]), float(pair[1])))
    return tuple(out)


def load_profile(
    path: str | Path,
    *,
    model: str | None = None,
    gpu: str | None = None,
    tp: int | None = None,
    kv_dtype: str | None = None,
    mfu: float | None = None,
    weight_dtype: str | None = None,
) -> CostModel:
    """A :class:`CostModel` from a profile JSON; explicit arguments must agree with it."""
    p = Path(path)
    where = shown(str(p))  # stdin: <stdin>
    note_input(p)
    try:
        data: object = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"profile not found: {p}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(
            f"profile is not UTF-8 JSON (byte {exc.start} cannot be decoded)", Location(where)
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read profile {p}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"profile is not valid JSON: {exc.msg}", Location(where, exc.lineno)
        ) from exc
    if not isinstance(data, dict) or data.get("schema") != PROFILE_SCHEMA:
        raise InputError(
            f'not a kvpool cost profile (expected "schema": "{PROFILE_SCHEMA}")',
            Location(where, None, "schema"),
            hint="write one with `kvpool cost fit ... -o models/<name>.json`",
        )
    pmodel, pgpu = data.get("model"), data.get("gpu")
    for key, value in (("model", pmodel), ("gpu", pgpu)):
        if not isinstance(value, str):
            raise InputError(f"profile lacks '{key}'", Location(where, None, key))
    assert isinstance(pmodel, str) and isinstance(pgpu, str)
    if model is not None and get_model(model).id != get_model(pmodel).id:
        raise UsageError(
            f"profile {where} was fitted for model '{pmodel}', not '{model}'",
            hint=f"drop --model or fit a profile for '{model}'",
        )
    if gpu is not None and get_gpu(gpu).id != get_gpu(pgpu).id:
        raise UsageError(
            f"profile {where} was fitted for gpu '{pgpu}', not '{gpu}'",
            hint=f"drop --gpu or fit a profile for '{gpu}'",
        )
    ptp = data.get("tp", 1)
    if isinstance(ptp, bool) or not isinstance(ptp, int) or ptp < 1:
        raise InputError(
            f"'tp' must be a positive integer, got {ptp!r}", Location(where, None, "tp")
        )
    pmfu = data.get("mfu")
    if pmfu is not None and (isinstance(pmfu, bool) or not isinstance(pmfu, int | float)):
        raise InputError(f"'mfu' must be a number, got {pmfu!r}", Location(where, None, "mfu"))
    dtypes: dict[str, str | None] = {}
    for key in ("kv_dtype", "compute_dtype", "weight_dtype"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise InputError(f"'{key}' must be a string", Location(where, None, key))
        dtypes[key] = value
    if tp is not None and tp != ptp:
        raise UsageError(f"profile {where} was fitted at tp={ptp}, not tp={tp}")
    pw = dtypes["weight_dtype"]
    if weight_dtype is not None and pw is not None and weight_dtype.lower() != pw.lower():
        raise UsageError(
            f"profile {where} was measured with weights in {pw}, not {weight_dtype}",
            hint="drop --weights-dtype or profile that precision",
        )
    cm = CostModel.from_catalog(
        pmodel,
        pgpu,
        tp=ptp,
        kv_dtype=kv_dtype or dtypes["kv_dtype"] or "bf16",
        mfu=mfu if mfu is not None else pmfu,
        compute_dtype=dtypes["compute_dtype"],
        weight_dtype=weight_dtype or pw,
    )
    sections: dict[str, Mapping[str, object] | None] = {}
    for key in ("prefill", "load", "ttft"):
        sec = data.get(key)
        if sec is not None and not isinstance(sec, dict):
            raise InputError(f"'{key}' must be an object or null", Location(where, None, key))
        sections[key] = sec
    if not any(sections.values()):
        raise InputError("profile holds no fitted section (prefill, load or ttft)", Location(where))
    try:
        prefill, link, ttft = _sections(cm, sections, where)
    except (TypeError, ValueError) as exc:
        raise InputError(f"malformed profile section: {exc}", Location(where)) from exc
    measured = data.get("measured")
    source = where
    if isinstance(measured, dict) and str(measured.get("device", "")).startswith("cpu"):
        source += " (measured on a CPU, not a GPU)"
    return replace(cm, prefill=prefill, link=link, ttft_fit=ttft, profile_source=source)


class _FitFields(TypedDict):
    """The bookkeeping every fitted section carries: what was fitted, its error, range."""

    fitted: tuple[str, ...]
    cv_mape: float | None
    n_points: int
    ranges: tuple[tuple[str, float, float], ...]
    source: str


def _fit_fields(sec: Mapping[str, object], w: str, where: str) -> _FitFields:
    fitted = sec.get("fitted", ())
    if not isinstance(fitted, list | tuple):
        raise TypeError(f"'fitted' must be a list, got {fitted!r}")
    cv = sec.get("cv_mape")
    n = sec.get("n_points", 0)
    if not isinstance(n, int | float | str):
        raise TypeError(f"'n_points' must be a number, got {n!r}")
    return _FitFields(
        fitted=tuple(str(f) for f in fitted),
        cv_mape=None if cv is None else _num(sec, "cv_mape", w),
        n_points=int(n),
        ranges=_ranges(sec, w),
        source=str(sec.get("source", where)),
    )


def _sections(
    cm: CostModel, sections: Mapping[str, Mapping[str, object] | None], where: str
) -> tuple[PrefillCoefficients, LoadLink | None, TtftCoefficients | None]:
    prefill, link, ttft = cm.prefill, None, None
    if sec := sections["prefill"]:
        w = f"{where} [prefill]"
        prefill = PrefillCoefficients(
            compute_scale=_num(sec, "compute_scale", w, default=0.0),
            per_token_s=_num(sec, "per_token_s", w, default=0.0),
            per_context_token_s=_num(sec, "per_context_token_s", w, default=0.0),
            per_token_sq_s=_num(sec, "per_token_sq_s", w, default=0.0),
            overhead_s=_num(sec, "overhead_s", w),
            **_fit_fields(sec, w, where),
        )
    if sec := sections["load"]:
        w = f"{where} [load]"
        bw = _num(sec, "bandwidth_gbps", w)
        if bw <= 0:
            raise InputError("'bandwidth_gbps' must be > 0", Location(w, None, "bandwidth_gbps"))
        link = LoadLink(
            bandwidth_gbps=bw,
            latency_s=_num(sec, "latency_s", w),
            **_fit_fields(sec, w, where),
        )
    if sec := sections["ttft"]:
        w = f"{where} [ttft]"
        ttft = TtftCoefficients(
            overhead_s=_num(sec, "overhead_s", w),
            latency_s=_num(sec, "latency_s", w),
            load_scale=_num(sec, "load_scale", w, default=1.0),
            compute_scale=_num(sec, "compute_scale", w, default=1.0),
            **_fit_fields(sec, w, where),
        )
    return prefill, link, ttft
