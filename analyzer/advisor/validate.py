"""`kvpool validate`: measured pilot results against the projection and the gates.

Readers:

* **vLLM** ``vllm bench serve --save-result`` JSON (also ``benchmark_serving.py``):
  ``mean_ttft_ms``, ``median_ttft_ms``, ``p90_ttft_ms``, ``p99_ttft_ms``,
  ``request_throughput``, ``output_throughput``, ``completed``, ``num_prompts``,
  ``duration``, ``request_rate``. A JSON Lines file of several runs uses the last.
* **CSV**, either ``metric,value`` rows (metric names as vLLM's, in ms, or with an
  ``_s`` suffix in seconds) or one row per request with a ``ttft_s`` (or ``ttft_ms``)
  column and optionally ``start_s``/``end_s`` (or ``latency_s``) and ``error``.

* **kvpool probe** ``-o`` JSON (schema ``kvpool.isolation-probe/1``): the paired salt
  check's ``metrics``, for the isolation gate.

Each results file plays a role: ``baseline`` (HBM prefix cache only), ``candidate``
(the recommended deployment), ``stability`` (the 72-hour run) or ``isolation`` (the
probe). Name it on the command line as ``ROLE=PATH``; otherwise a probe's results are
the isolation role, a file whose name contains ``base`` is the baseline,
``stab``/``soak`` the stability run, and the remaining files fill baseline, candidate,
stability in the order given.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analyzer.advisor.engine_metrics import EngineMeasurement
from analyzer.advisor.gates import (
    Criterion,
    CriterionResult,
    Gate,
    GateResult,
    evaluate,
    gate_from_json,
)
from analyzer.advisor.probe import PROBE_SCHEMA
from analyzer.errors import InputError, Location, UsageError
from analyzer.jsontypes import JSONObject, JSONValue
from analyzer.outputs import note_input

ROLES = ("baseline", "candidate", "stability", "isolation")
# Roles a results file takes by its place on the command line (the probe's by its schema).
ORDERED_ROLES = ("baseline", "candidate", "stability")
REPORT_SCHEMA = "kvpool.report/3"

# vLLM key -> (our key, factor to seconds / plain)
_VLLM_KEYS = {
    "mean_ttft_ms": ("mean_ttft_s", 1e-3),
    "median_ttft_ms": ("median_ttft_s", 1e-3),
    "p90_ttft_ms": ("p90_ttft_s", 1e-3),
    "p99_ttft_ms": ("p99_ttft_s", 1e-3),
    "mean_ttft_s": ("mean_ttft_s", 1.0),
    "median_ttft_s": ("median_ttft_s", 1.0),
    "p90_ttft_s": ("p90_ttft_s", 1.0),
    "p99_ttft_s": ("p99_ttft_s", 1.0),
    "request_throughput": ("request_throughput", 1.0),
    "output_throughput": ("output_throughput", 1.0),
    "completed": ("completed", 1.0),
    "failed": ("failed", 1.0),
    "num_prompts": ("num_prompts", 1.0),
    # older benchmark_serving.py; a later key for the same figure overrides an earlier one
    "benchmark_duration": ("duration_s", 1.0),
    "duration": ("duration_s", 1.0),
    "duration_s": ("duration_s", 1.0),
    "request_rate": ("requested_rate", 1.0),
    "requested_rate": ("requested_rate", 1.0),
}
_TTFT_KEYS = ("mean_ttft_s", "median_ttft_s", "p99_ttft_s")


@dataclass(frozen=True, slots=True)
class Measured:
    path: str
    role: str
    fmt: str  # "vllm-json" | "csv-metrics" | "csv-requests"
    metrics: dict[str, float]


def _num(value: object, loc: Location) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise InputError("expected a number, got a boolean", loc)
    if isinstance(value, int | float):
        v = float(value)
    elif isinstance(value, str):
        t = value.strip().lower()
        if t in ("", "none", "null", "nan"):
            return None
        try:
            v = float(t)
        except ValueError:
            raise InputError(f"expected a number, got {value!r}", loc) from None
    else:
        raise InputError(f"expected a number, got {type(value).__name__}", loc)
    if math.isnan(v):
        return None
    return v


def _from_mapping(doc: Mapping[str, object], path: str, line: int | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, (ours, factor) in _VLLM_KEYS.items():
        if key not in doc:
            continue
        loc = Location(path, line, key)
        v = _num(doc[key], loc)
        if v is None or (ours == "requested_rate" and not math.isfinite(v)):
            continue  # request_rate "inf" means closed loop: no rate to compare with
        if not math.isfinite(v):
            raise InputError(f"expected a finite number, got {doc[key]!r}", loc)
        if v < 0:
            raise InputError("must not be negative", loc)
        out[ours] = v * factor
    if not any(k in out for k in _TTFT_KEYS):
        raise InputError(
            "no TTFT figures found (expected mean_ttft_ms/median_ttft_ms/p99_ttft_ms as "
            "written by `vllm bench serve --save-result`)",
            Location(path, line),
        )
    return out


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def read_json_results(path: str) -> dict[str, float]:
    note_input(path)
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        doc = json.loads(text)
        line = None
    except json.JSONDecodeError as exc:
        # JSON Lines: several runs appended to one file; use the last. A file whose first
        # line is not a document by itself is one broken document: say where it breaks.
        lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
        if len(lines) < 2 or not _parses(lines[0][1]):
            raise InputError(f"invalid JSON: {exc.msg}", Location(path, exc.lineno)) from None
        line, last = lines[-1]
        try:
            doc = json.loads(last)
        except json.JSONDecodeError as exc2:
            raise InputError(f"invalid JSON: {exc2.msg}", Location(path, line)) from None
    if not isinstance(doc, dict):
        raise InputError("expected a JSON object of benchmark results", Location(path, line))
    return _from_mapping(doc, path, line)


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q))


def read_csv_results(path: str) -> tuple[str, dict[str, float]]:
    note_input(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh))
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text CSV", Location(path)) from None
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise InputError("the CSV is empty", Location(path))
    header = [c.strip().lower() for c in rows[0]]
    if header[:2] == ["metric", "value"]:
        doc: dict[str, object] = {}
        for i, r in enumerate(rows[1:], start=2):
            if len(r) < 2:
                raise InputError("expected 'metric,value'", Location(path, i))
            doc[r[0].strip()] = r[1].strip()
        line_of = {r[0].strip(): i for i, r in enumerate(rows[1:], start=2)}
        try:
            return "csv-metrics", _from_mapping(doc, path, None)
        except InputError as exc:
            if exc.location and exc.location.field in line_of:
                f = exc.location.field
                raise InputError(
                    exc.message.split(": ", 1)[-1], Location(path, line_of[f], "value")
                ) from None
            raise
    ttft_col = next((c for c in ("ttft_s", "ttft_ms", "ttft") if c in header), None)
    if ttft_col is None:
        raise InputError(
            f"unrecognised CSV header {rows[0]}: expected 'metric,value' rows or a per-request "
            "'ttft_s' (or 'ttft_ms') column",
            Location(path, 1),
        )
    factor = 1e-3 if ttft_col == "ttft_ms" else 1.0
    col = {name: header.index(name) for name in header}
    ttft: list[float] = []
    starts: list[float] = []
    ends: list[float] = []
    failed = 0
    for i, r in enumerate(rows[1:], start=2):

        def cell(name: str, r: list[str] = r) -> str | None:
            j = col.get(name)
            return r[j].strip() if j is not None and j < len(r) else None

        err = cell("error")
        if err and err.lower() not in ("", "0", "false", "none"):
            failed += 1
            continue
        v = _num(cell(ttft_col), Location(path, i, ttft_col))
        if v is None:
            failed += 1
            continue
        if v < 0 or not math.isfinite(v):
            raise InputError(
                "TTFT must be a finite number, not negative", Location(path, i, ttft_col)
            )
        ttft.append(v * factor)
        s = _num(cell("start_s"), Location(path, i, "start_s")) if "start_s" in col else None
        e = _num(cell("end_s"), Location(path, i, "end_s")) if "end_s" in col else None
        lat = (
            _num(cell("latency_s"), Location(path, i, "latency_s")) if "latency_s" in col else None
        )
        if s is not None:
            starts.append(s)
            if e is None and lat is not None:
                e = s + lat
        if e is not None:
            ends.append(e)
    if not ttft:
        raise InputError("no usable rows with a TTFT value", Location(path))
    arr = np.asarray(ttft)
    out = {
        "mean_ttft_s": float(arr.mean()),
        "median_ttft_s": _percentile(arr, 50),
        "p90_ttft_s": _percentile(arr, 90),
        "p99_ttft_s": _percentile(arr, 99),
        "completed": float(arr.size),
        "failed": float(failed),
        "num_prompts": float(arr.size + failed),
    }
    if starts and ends:
        dur = max(ends) - min(starts)
        if dur > 0:
            out["duration_s"] = dur
            out["request_throughput"] = arr.size / dur
    return "csv-requests", out


def _json_first(p: Path) -> bool:
    """Whether a file without a telling suffix (stdin's copy) starts like JSON."""
    with open(p, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head[:1] in (b"{", b"[")


def read_results(path: str, role: str) -> Measured:
    p = Path(path)
    if p.is_dir():
        raise InputError("is a directory, not a results file", Location(path))
    if not p.is_file():
        raise InputError("results file not found", Location(path))
    if p.suffix.lower() == ".csv" or (p.suffix.lower() != ".json" and not _json_first(p)):
        fmt, metrics = read_csv_results(path)
    elif (probe := read_probe(path)) is not None:
        fmt, metrics = "kvpool-probe", probe
    else:
        fmt, metrics = "vllm-json", read_json_results(path)
    if (fmt == "kvpool-probe") != (role == "isolation"):
        raise UsageError(
            f"{path}: a {'probe' if fmt == 'kvpool-probe' else 'benchmark'} result cannot "
            f"be the {role} role",
            hint="the isolation role takes `kvpool probe -o` results, the others benchmarks",
        )
    return Measured(path=path, role=role, fmt=fmt, metrics=metrics)


def read_probe(path: str) -> dict[str, float] | None:
    """The metrics of a ``kvpool probe -o`` file (None: not one)."""

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("schema") != PROBE_SCHEMA:
        return None
    note_input(path)
    metrics = doc.get("metrics")
    if not isinstance(metrics, dict):
        raise InputError("a probe result without its metrics", Location(path, field="metrics"))
    out: dict[str, float] = {}
    for k, v in metrics.items():
        got = _num(v, Location(path, field=f"metrics.{k}"))
        if got is not None:
            if got < 0:
                raise InputError("must not be negative", Location(path, field=f"metrics.{k}"))
            out[str(k)] = got
    return out


def assign_roles(args: list[str]) -> list[tuple[str, str]]:
    """``ROLE=PATH`` or bare paths -> [(role, path)]; see the module docstring."""
    labelled: list[tuple[str, str]] = []
    bare: list[str] = []
    for a in args:
        head, sep, tail = a.partition("=")
        if sep and head in ROLES:
            if not tail.strip():
                raise UsageError(f"{a!r} names no file: write {head}=PATH")
            labelled.append((head, tail))
        elif Path(a).is_file() and read_probe(a) is not None:
            labelled.append(("isolation", a))
        else:
            bare.append(a)
    taken = {r for r, _ in labelled}
    rest: list[str] = []
    for p in bare:
        name = Path(p).name.lower()
        role = (
            "baseline"
            if "base" in name
            else "stability"
            if ("stab" in name or "soak" in name)
            else None
        )
        if role and role not in taken:
            labelled.append((role, p))
            taken.add(role)
        else:
            rest.append(p)
    for p in rest:
        free = [r for r in ORDERED_ROLES if r not in taken]
        if not free:
            raise UsageError(
                f"too many results files: {p} has no role left (roles: {', '.join(ORDERED_ROLES)})"
            )
        labelled.append((free[0], p))
        taken.add(free[0])
    dup = sorted({r for r, _ in labelled if [x for x, _ in labelled].count(r) > 1})
    if dup:
        raise UsageError(f"role {dup[0]!r} given twice; one results file per role")
    return labelled


@dataclass(frozen=True, slots=True)
class MeasuredVsProjected:
    """A figure the pilot measured beside the one the report projected for it."""

    metric: str
    projected: float
    measured: float

    def to_json(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "projected": round(self.projected, 6),
            "measured": round(self.measured, 6),
            "difference": round(self.measured - self.projected, 6),
        }


@dataclass(frozen=True, slots=True)
class Validation:
    report_path: str
    verdict: str
    measured: tuple[Measured, ...]
    gates: tuple[GateResult, ...]
    comparisons: tuple[MeasuredVsProjected, ...]
    engine: tuple[EngineMeasurement, ...] = ()

    @property
    def failed(self) -> bool:
        return any(g.status == "fail" for g in self.gates)

    def to_json(self) -> dict[str, object]:
        return {
            "schema": "kvpool.validation/1",
            "verdict": self.verdict,
            "results": [
                {
                    "role": m.role,
                    "file": Path(m.path).name,
                    "format": m.fmt,
                    "metrics": {k: round(v, 6) for k, v in sorted(m.metrics.items())},
                }
                for m in self.measured
            ],
            "gates": [
                {
                    "id": g.gate.id,
                    "name": g.gate.name,
                    "status": g.status,
                    "criteria": [
                        {
                            "metric": r.criterion.metric,
                            "op": r.criterion.op,
                            "threshold": r.criterion.threshold,
                            "measured": None if r.measured is None else round(r.measured, 6),
                            "passed": r.passed,
                            "text": r.criterion.text,
                        }
                        for r in g.results
                    ],
                }
                for g in self.gates
            ],
            "comparisons": [c.to_json() for c in self.comparisons],
            **({"engine_metrics": [e.to_json() for e in self.engine]} if self.engine else {}),
            "failed": self.failed,
        }


def load_report(path: str) -> JSONObject:
    """A ``report.json`` of this schema with its gate plan (checked to be a list)."""
    p = Path(path)
    note_input(p)
    try:
        doc: JSONValue = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 JSON file", Location(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read report: {exc.strerror or exc}", Location(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", Location(path, exc.lineno)) from None
    if not isinstance(doc, dict) or doc.get("schema") != REPORT_SCHEMA:
        raise InputError(
            f"not a kvpool report (expected schema {REPORT_SCHEMA!r})",
            Location(path, field="schema"),
            hint="pass the report.json written by `kvpool analyze -o DIR`",
        )
    _gate_plan(doc, path)
    return doc


def _gate_plan(doc: JSONObject, path: str) -> list[JSONValue]:
    gates = doc.get("gates")
    plan = gates.get("plan") if isinstance(gates, dict) else None
    if not isinstance(plan, list):
        raise InputError("the report has no gate plan", Location(path, field="gates.plan"))
    return plan


def report_gates(doc: JSONObject, path: str) -> tuple[Gate, ...]:
    """The gate plan of a report from :func:`load_report`; a malformed entry is an
    :class:`InputError` naming it (a hand-edited or truncated report)."""
    gates = []
    for i, entry in enumerate(_gate_plan(doc, path)):
        try:
            if not isinstance(entry, dict):
                raise TypeError(f"expected an object, got {type(entry).__name__}")
            gate = gate_from_json(entry)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise InputError(
                f"malformed gate ({what})", Location(path, field=f"gates.plan[{i}]")
            ) from None
        bad = [c.op for c in gate.criteria if c.op not in (">=", "<=")]
        if bad:
            raise InputError(
                f"unknown criterion operator {bad[0]!r} (expected '>=' or '<=')",
                Location(path, field=f"gates.plan[{i}]"),
            )
        gates.append(gate)
    return tuple(gates)


# The engine counters' criteria (``kvpool validate --prometheus``), by the gate they
# join: the metric of analyzer.advisor.engine_metrics.compare, its wording, and its
# threshold (None: the report's hit-rate tolerance).
ENGINE_CRITERIA: dict[str, tuple[tuple[str, str, float | None], ...]] = {
    "isolation": (
        (
            "cross_salt_counter_hit_tokens",
            "the engines' counters saw no hit over the probe's other-salt requests",
            0.0,  # any hit is a leak: no tolerance
        ),
    ),
    "baseline": (
        (
            "hbm_hit_rate_error",
            "measured HBM prefix-cache hit rate (engine counters) within {tol} points of "
            "the replay's",
            None,
        ),
    ),
    "main": (
        (
            "hit_rate_shortfall",
            "measured prefix-cache hit rate (engine counters) at most {tol} points below "
            "the projected",
            None,
        ),
        (
            "offload_hit_shortfall",
            "measured hit rate below HBM (KV connector, HiCache host and storage) at most "
            "{tol} points below the projected",
            None,
        ),
    ),
}


def _with_engine(
    results: tuple[GateResult, ...], engine: tuple[EngineMeasurement, ...], tolerance: float
) -> tuple[GateResult, ...]:
    """Each gate with the criteria its role's engine counters decide, added and tested."""
    values = {e.role: e.criteria for e in engine}
    out = []
    for g in results:
        got = values.get(g.gate.results_role, {})
        extra = [
            (
                Criterion(
                    metric,
                    "<=",
                    tolerance if limit is None else limit,
                    text.format(tol=f"{100 * tolerance:g}"),
                ),
                got[metric],
            )
            for metric, text, limit in ENGINE_CRITERIA.get(g.gate.id, ())
            if metric in got
        ]
        if not extra:
            out.append(g)
            continue
        gate = Gate(
            g.gate.id,
            g.gate.name,
            g.gate.run,
            g.gate.results_role,
            g.gate.criteria + tuple(c for c, _ in extra),
            g.gate.projected,
        )
        rows = tuple(CriterionResult(c, v, bool(v <= c.threshold)) for c, v in extra)
        out.append(GateResult(gate, g.results + rows))
    return tuple(out)


def validate(
    results_args: list[str],
    report_path: str,
    engine: tuple[EngineMeasurement, ...] = (),
    tolerance: float = 0.05,
) -> Validation:
    """The gates of the report at ``report_path`` tested on benchmark results files
    (``ROLE=PATH``) and on engine counters (``engine``, one window per role; their TTFT
    histograms count as that role's results)."""
    doc = load_report(report_path)
    gates = report_gates(doc, report_path)
    if not results_args and not engine:
        raise UsageError("give at least one results file or --prometheus source")
    measured = tuple(read_results(p, role) for role, p in assign_roles(results_args))
    by_role = {m.role: m.metrics for m in measured}
    for e in engine:
        if e.role == "isolation":  # its counters decide the gate; no TTFT to test
            continue
        if e.role in by_role:
            raise UsageError(
                f"role {e.role!r} given twice (a results file and --prometheus); one per role"
            )
        ttft = e.window.ttft_metrics()
        if ttft:
            by_role[e.role] = ttft
    results = _with_engine(evaluate(gates, by_role), engine, tolerance)
    comps: list[MeasuredVsProjected] = []
    main = next((g for g in results if g.gate.id == "main"), None)
    if main is not None:
        for r in main.results:
            proj = main.gate.projected.get(r.criterion.metric)
            if proj is None or r.measured is None:
                continue
            comps.append(MeasuredVsProjected(r.criterion.metric, proj, r.measured))
    base_gate = next((g for g in gates if g.id == "baseline"), None)
    if base_gate and "mean_ttft_s" in base_gate.projected and "baseline" in by_role:
        meas = by_role["baseline"].get("mean_ttft_s")
        if meas is not None:
            proj = base_gate.projected["mean_ttft_s"]
            comps.append(MeasuredVsProjected("baseline mean_ttft_s", proj, meas))
    return Validation(
        report_path=report_path,
        verdict=str(v.get("verdict", "")) if isinstance(v := doc.get("verdict"), dict) else "",
        measured=measured,
        gates=results,
        comparisons=tuple(comps),
        engine=engine,
    )
