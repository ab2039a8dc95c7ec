"""Fit the cost model to a user's own measurements (profiles: analyzer/cost/profile_file.py).

The physical forms stay; only their coefficients move:

* prefill (``--prefill CSV``: ``prompt_tokens, cached_tokens`` and ``prefill_s`` or
  ``ttft_s``, optional ``concurrency``): ``t = c0 + K*(c1*S + c2*P*S + c3*S^2)`` on the
  features of the FLOPs formula (S new tokens after P cached, K requests batched). With
  fewer than 4 points, or points that do not vary S and P enough to separate the terms,
  only a scale on the analytic compute time and a fixed overhead are fitted, and the
  rest stays from the catalog.
* load (``--load CSV``: ``bytes, concurrency, seconds``): ``t = latency + bytes*K/BW``.
* TTFT (``--calibration CSV``: ``prompt_tokens, cached_tokens, concurrency, load_gbps,
  ttft_s``): ``t = overhead + latency*[C>0] + a*load_s + b*compute_s``; coefficients
  enter in the order compute scale, overhead, load scale, latency as long as the points
  determine them (one more point than coefficients is not required, but the matrix must
  have full rank), the others keep their catalog values.

Fits are relative (1/y^2-weighted) linear least squares with non-negative coefficients (scikit-learn
``LinearRegression(positive=True)``); the error reported is the cross-validated mean
absolute percentage error (leave-one-out up to 20 points, else 5-fold with a fixed
shuffle), so it is the error on points the fit did not see.

Imported on first use, not at the top: scikit-learn (about a second), so that the
commands that fit nothing never pay for it.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from analyzer.cost.coefficients import LoadLink, PrefillCoefficients, TtftCoefficients
from analyzer.cost.model import CostModel

# Profiles are saved and read by analyzer.cost.profile_file; the loader keeps this import
# path for the callers that use it.
from analyzer.cost.profile_file import load_profile as load_profile
from analyzer.errors import InputError, Location, shown
from analyzer.outputs import note_input

PREFILL_TIME_COLUMNS = ("prefill_s", "ttft_s", "seconds")
TTFT_COLUMNS = ("prompt_tokens", "cached_tokens", "concurrency", "load_gbps", "ttft_s")
LOAD_COLUMNS = ("bytes", "concurrency", "seconds")


@dataclass(frozen=True, slots=True)
class CsvRows:
    """Usable rows of a measurement CSV, with what was skipped and why."""

    path: str
    rows: list[dict[str, float]]
    lines: list[int]
    skipped: int
    examples: list[str]

    def summary(self, name: str | None = None) -> str:
        """How many rows were usable, from the file (called ``name`` where given: the
        dashboard names an upload as its user did, not by its copy's temporary path)."""
        shown_as = self.path if name is None else name
        out = f"{len(self.rows)} usable rows from {shown_as}"
        if self.skipped:
            example = self.examples[0]  # "PATH:LINE: problem"
            if example.startswith(f"{self.path}:"):
                example = shown_as + example[len(self.path) :]
            out += f", {self.skipped} skipped (e.g. {example})"
        return out


def read_measurements(
    path: str | Path,
    required: Sequence[str],
    *,
    one_of: Sequence[str] = (),
    optional: dict[str, float] | None = None,
    positive: Sequence[str] = (),
    nonnegative: Sequence[str] = (),
) -> CsvRows:
    """Read a CSV of numbers; rows with bad values are skipped and counted.

    ``one_of``: at least one of these columns must exist; the first present is read
    under its own name. InputError (file, line, field) for missing columns or when no
    row is usable.
    """
    p = Path(path)
    optional = optional or {}
    note_input(p)
    try:
        text = p.read_text(encoding="utf-8-sig")  # measurement files are small
    except FileNotFoundError as exc:
        raise InputError(f"measurement file not found: {p}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(
            f"not a UTF-8 text CSV (byte {exc.start} cannot be decoded)", Location(str(p))
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc}") from exc
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in (reader.fieldnames or [])]
        if not header:
            raise InputError("empty file: expected a CSV header line", Location(str(p), 1))
        reader.fieldnames = header
        missing = [c for c in required if c not in header]
        choice = next((c for c in one_of if c in header), None)
        if one_of and choice is None:
            missing.append(" or ".join(one_of))
        if missing:
            raise InputError(
                f"missing column(s) {', '.join(missing)}; found {', '.join(header)}",
                Location(str(p), 1, missing[0]),
                hint=f"the header needs {', '.join([*required, *(one_of[:1] or ())])}",
            )
        wanted = [*required, *([choice] if choice else []), *(c for c in optional if c in header)]
        rows: list[dict[str, float]] = []
        lines: list[int] = []
        skipped = 0
        examples: list[str] = []
        for raw in reader:
            line = reader.line_num
            if not any((v or "").strip() for v in raw.values() if isinstance(v, str)):
                continue  # blank line
            row: dict[str, float] = dict(optional)
            problem = None
            for col in wanted:
                text = (raw.get(col) or "").strip()
                if not text and col in optional:
                    continue  # empty optional cell: keep the default
                try:
                    value = float(text)
                except ValueError:
                    problem = f"field '{col}' is not a number: {text!r}"
                    break
                if not math.isfinite(value):
                    problem = f"field '{col}' is not finite: {text!r}"
                    break
                if col in positive and value <= 0:
                    problem = f"field '{col}' must be > 0, got {text}"
                    break
                if col in nonnegative and value < 0:
                    problem = f"field '{col}' must be >= 0, got {text}"
                    break
                row[col] = value
            if problem is None and row.get("cached_tokens", 0) > row.get("prompt_tokens", math.inf):
                problem = "field 'cached_tokens' exceeds prompt_tokens"
            if problem is None and choice:
                row["_time_s"] = row[choice]
            if problem is not None:
                skipped += 1
                if len(examples) < 5:
                    examples.append(f"{shown(str(p))}:{line}: {problem}")
                continue
            rows.append(row)
            lines.append(line)
    if not rows:
        detail = f"; {skipped} rows skipped, e.g. {examples[0]}" if examples else ""
        raise InputError(f"no usable measurement rows{detail}", Location(str(p)))
    return CsvRows(shown(str(p)), rows, lines, skipped, examples)  # stdin: <stdin>


# ---------------------------------------------------------------------------------------
# The fitting core


@dataclass(frozen=True, slots=True)
class LinearFit:
    coefficients: dict[str, float]
    fitted: tuple[str, ...]
    from_catalog: tuple[str, ...]
    cv_mape: float | None
    n_points: int


def _rank(columns: list[np.ndarray]) -> int:
    m = np.column_stack(columns)
    scale = np.abs(m).max(axis=0)
    scale[scale == 0] = 1.0
    return int(np.linalg.matrix_rank(m / scale, tol=1e-9))


def _solve(m: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    from sklearn.linear_model import LinearRegression

    scale = np.abs(m).max(axis=0)
    scale[scale == 0] = 1.0
    reg = LinearRegression(fit_intercept=False, positive=True)
    reg.fit(m / scale, y, sample_weight=weight)
    coef: np.ndarray = reg.coef_ / scale
    return coef


def fit_physical(
    columns: dict[str, np.ndarray],
    y: np.ndarray,
    priority: Sequence[str],
    defaults: dict[str, float],
) -> LinearFit:
    """Fit ``y = sum coef[c] * columns[c]``, coefficients >= 0, as many as the data determine.

    Coefficients enter in ``priority`` order while the design matrix keeps full rank and
    there are at least as many points as coefficients; the others keep ``defaults``.
    """
    n = len(y)
    chosen: list[str] = []
    for name in priority:
        col = columns[name]
        if not np.any(col):
            continue
        cand = [*chosen, name]
        if n >= len(cand) and _rank([columns[c] for c in cand]) == len(cand):
            chosen = cand
    if not chosen:
        raise InputError("the measurements determine no coefficient (all features are zero)")
    fixed = [c for c in priority if c not in chosen]
    offset = np.zeros(n)
    for c in fixed:
        offset = offset + defaults[c] * columns[c]
    m = np.column_stack([columns[c] for c in chosen])
    # Relative least squares (weights 1/y^2): measured times span orders of magnitude and
    # a 1 ms error matters on a 5 ms load, not on a 5 s prefill.
    weight = 1.0 / np.square(y)
    coef = _solve(m, y - offset, weight)
    out = dict(defaults)
    out.update({c: float(v) for c, v in zip(chosen, coef, strict=True)})
    cv = None
    if n > len(chosen):
        cv = _cv_mape(m, y, offset, weight)
    return LinearFit(out, tuple(chosen), tuple(fixed), cv, n)


def _cv_mape(m: np.ndarray, y: np.ndarray, offset: np.ndarray, weight: np.ndarray) -> float:
    from sklearn.model_selection import KFold, LeaveOneOut

    n = len(y)
    splitter = LeaveOneOut() if n <= 20 else KFold(n_splits=5, shuffle=True, random_state=0)
    pred = np.zeros(n)
    for train, test in splitter.split(m):
        coef = _solve(m[train], (y - offset)[train], weight[train])
        pred[test] = m[test] @ coef + offset[test]
    return float(np.mean(np.abs(pred - y) / np.abs(y)))


def _range(name: str, values: Sequence[float]) -> tuple[str, float, float]:
    return (name, float(min(values)), float(max(values)))


# ---------------------------------------------------------------------------------------
# Prefill, load and TTFT fits


def fit_prefill(cm: CostModel, data: CsvRows) -> PrefillCoefficients:
    """Prefill coefficients from measured (prompt, cached, time) points."""
    s, p, k, y = [], [], [], []
    for row in data.rows:
        prompt = int(row["prompt_tokens"])
        cached = min(int(row["cached_tokens"]), prompt - 1)
        s.append(prompt - cached)
        p.append(cached)
        k.append(int(row.get("concurrency", 1)))
        y.append(row["_time_s"])
    sa, pa, ka, ya = (np.asarray(v, dtype=float) for v in (s, p, k, y))
    poly = {
        "overhead_s": np.ones(len(ya)),
        "per_token_s": ka * sa,
        "per_context_token_s": ka * pa * sa,
        "per_token_sq_s": ka * sa * sa,
    }
    order = ["overhead_s", "per_token_s", "per_context_token_s", "per_token_sq_s"]
    ranges = (
        _range("new_tokens", s),
        _range("cached_tokens", p),
        _range("concurrency", k),
    )
    if len(ya) >= len(order) and _rank([poly[c] for c in order]) == len(order):
        fit = fit_physical(poly, ya, order, dict.fromkeys(order, 0.0))
        if len(fit.fitted) == len(order):
            c = fit.coefficients
            return PrefillCoefficients(
                compute_scale=0.0,
                per_token_s=c["per_token_s"],
                per_context_token_s=c["per_context_token_s"],
                per_token_sq_s=c["per_token_sq_s"],
                overhead_s=c["overhead_s"],
                fitted=fit.fitted,
                cv_mape=fit.cv_mape,
                n_points=fit.n_points,
                ranges=ranges,
                source=data.path,
            )
    # Too few or too similar points: scale the analytic compute term, fit an overhead.
    base = replace(cm, prefill=PrefillCoefficients(overhead_s=cm.prefill.overhead_s))
    analytic = np.array(
        [base.analytic_compute_s(si, pi, ki) for si, pi, ki in zip(s, p, k, strict=True)]
    )
    cols = {"compute_scale": analytic, "overhead_s": np.ones(len(ya))}
    fit = fit_physical(
        cols,
        ya,
        ["compute_scale", "overhead_s"],
        {"compute_scale": 1.0, "overhead_s": cm.prefill.overhead_s},
    )
    c = fit.coefficients
    if c["compute_scale"] <= 0:
        raise InputError(
            "the measured times do not grow with the prompt: cannot fit a compute term",
            Location(data.path),
        )
    return PrefillCoefficients(
        compute_scale=c["compute_scale"],
        overhead_s=c["overhead_s"],
        fitted=fit.fitted,
        cv_mape=fit.cv_mape,
        n_points=fit.n_points,
        ranges=ranges,
        source=data.path,
    )


def fit_load(data: CsvRows) -> LoadLink:
    """Link bandwidth and first-byte latency from measured (bytes, concurrency, seconds)."""
    b = np.array([r["bytes"] for r in data.rows])
    k = np.array([r.get("concurrency", 1.0) for r in data.rows])
    y = np.array([r["_time_s"] for r in data.rows])
    cols = {"seconds_per_byte": b * k, "latency_s": np.ones(len(y))}
    fit = fit_physical(
        cols, y, ["seconds_per_byte", "latency_s"], {"seconds_per_byte": 0.0, "latency_s": 0.0}
    )
    slope = fit.coefficients["seconds_per_byte"]
    if slope <= 0:
        raise InputError(
            "the measured times do not grow with the bytes moved: cannot fit a bandwidth",
            Location(data.path),
        )
    return LoadLink(
        bandwidth_gbps=1.0 / slope / 1e9,
        latency_s=fit.coefficients["latency_s"],
        fitted=tuple("bandwidth_gbps" if f == "seconds_per_byte" else f for f in fit.fitted),
        cv_mape=fit.cv_mape,
        n_points=fit.n_points,
        ranges=(_range("load_bytes", list(b)), _range("concurrency", list(k))),
        source=data.path,
    )


def fit_ttft(cm: CostModel, data: CsvRows, latency_s: float = 0.0) -> TtftCoefficients:
    """TTFT coefficients from measured points of the user's own system."""
    cm = replace(cm, ttft_fit=None)  # features from the uncalibrated TTFT form
    compute, load, has_load, y = [], [], [], []
    prompts, cacheds, ks, bws = [], [], [], []
    for row in data.rows:
        prompt = int(row["prompt_tokens"])
        cached = min(int(row["cached_tokens"]), prompt - 1)
        k = int(row["concurrency"])
        bw = row["load_gbps"]
        compute.append(cm.compute_time_s(prompt - cached, cached, k))
        load.append(k * cm.transfer_bytes(cached) / (bw * 1e9) if cached > 0 else 0.0)
        has_load.append(1.0 if cached > 0 else 0.0)
        y.append(row["ttft_s"])
        prompts.append(prompt)
        cacheds.append(cached)
        ks.append(k)
        bws.append(bw)
    n = len(y)
    cols = {
        "compute_scale": np.array(compute),
        "overhead_s": np.ones(n),
        "load_scale": np.array(load),
        "latency_s": np.array(has_load),
    }
    defaults = {
        "compute_scale": 1.0,
        "overhead_s": cm.prefill.overhead_s,
        "load_scale": 1.0,
        "latency_s": latency_s,
    }
    fit = fit_physical(cols, np.array(y), list(cols), defaults)
    c = fit.coefficients
    return TtftCoefficients(
        overhead_s=c["overhead_s"],
        latency_s=c["latency_s"],
        load_scale=c["load_scale"],
        compute_scale=c["compute_scale"],
        fitted=fit.fitted,
        cv_mape=fit.cv_mape,
        n_points=fit.n_points,
        ranges=(
            _range("prompt_tokens", prompts),
            _range("cached_tokens", cacheds),
            _range("concurrency", ks),
            _range("load_gbps", bws),
        ),
        source=data.path,
    )


def read_prefill_csv(path: str | Path) -> CsvRows:
    return read_measurements(
        path,
        ["prompt_tokens", "cached_tokens"],
        one_of=PREFILL_TIME_COLUMNS,
        optional={"concurrency": 1.0},
        positive=["prompt_tokens", *PREFILL_TIME_COLUMNS, "concurrency"],
        nonnegative=["cached_tokens"],
    )


def read_load_csv(path: str | Path) -> CsvRows:
    return read_measurements(
        path,
        ["bytes"],
        one_of=("seconds", "load_s"),
        optional={"concurrency": 1.0},
        positive=["bytes", "seconds", "load_s", "concurrency"],
    )


@dataclass(frozen=True, slots=True)
class TtftMeasurement:
    """One usable row of a TTFT calibration CSV (:data:`TTFT_COLUMNS`)."""

    prompt_tokens: int
    cached_tokens: int
    concurrency: int
    load_gbps: float
    ttft_s: float

    @classmethod
    def of(cls, row: dict[str, float]) -> TtftMeasurement:
        """A row of :func:`read_ttft_csv`'s ``rows``."""
        return cls(
            prompt_tokens=int(row["prompt_tokens"]),
            cached_tokens=int(row["cached_tokens"]),
            concurrency=int(row["concurrency"]),
            load_gbps=float(row["load_gbps"]),
            ttft_s=float(row["ttft_s"]),
        )


def ttft_measurements(data: CsvRows) -> list[TtftMeasurement]:
    """The rows of a TTFT calibration CSV (:func:`read_ttft_csv`) as typed records."""
    return [TtftMeasurement.of(row) for row in data.rows]


def read_ttft_csv(path: str | Path) -> CsvRows:
    return read_measurements(
        path,
        TTFT_COLUMNS,
        positive=["prompt_tokens", "concurrency", "load_gbps", "ttft_s"],
        nonnegative=["cached_tokens"],
    )


def calibrate_ttft(cm: CostModel, path: str | Path, latency_s: float = 0.0) -> CostModel:
    """``cm`` with TTFT coefficients fitted to the CSV at ``path``."""
    return replace(cm, ttft_fit=fit_ttft(cm, read_ttft_csv(path), latency_s))
