"""Pilot gates: a validation plan derived from the projection, and its evaluation.

Five gates, run in order; stop at the first one missed (the gated pilot of
docs/advisor.md):

``arrival``   Arrival acceptance: the benchmark replays the trace's load (at least
              99 % of requests complete, achieved request rate within 10 % of the
              trace's, or of the rate the benchmark asked for).
``baseline``  Single-node baseline with HBM prefix caching only: the measured mean TTFT
              lies within 50 % of the projection, so the cost model describes this
              hardware (re-calibrate with ``kvpool cost fit`` otherwise).
``isolation`` The paired salt check on the recommended deployment, idle: one prefix sent
              under one cache salt, then under others and none (``kvpool probe``,
              :mod:`analyzer.advisor.probe`): no request may read KV cached under another
              salt, and the same salt must hit (else the probe saw no cache at all). Under
              ``--isolation shared`` it tells whether the stack could keep tenants apart.
``main``      The recommended deployment against the baseline at the same load. It tests
              what the projection promises, never more: mean TTFT reduction at least
              half (``pilot_fraction``) of the projected one, request throughput gain at
              least half of the projected one (the GPU saving rests on it; not lower
              when none is projected), p90 TTFT within the SLO and p99 TTFT at most 10 %
              above the baseline's (each relaxed to the projected figure when the
              projection itself is worse). So the recommended option passes its own plan
              when it performs as projected.
``stability`` 72 hours at production load: at least 99.9 % of requests complete and
              p99 TTFT within 20 % of the main gate's.

Measured metrics use the names of ``vllm bench serve --save-result`` converted to
seconds: ``mean_ttft_s``, ``median_ttft_s``, ``p99_ttft_s``, ``request_throughput``,
``completed``, ``num_prompts``, ``duration_s`` (see :mod:`analyzer.advisor.validate`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from analyzer.advisor.figures import Projection, ScenarioFigures, Thresholds, Verdict

GATE_IDS = ("arrival", "baseline", "isolation", "main", "stability")


@dataclass(frozen=True, slots=True)
class Criterion:
    metric: str  # derived metric name, see evaluate()
    op: str  # ">=" or "<="
    threshold: float
    text: str


@dataclass(frozen=True, slots=True)
class Gate:
    id: str
    name: str
    run: str  # what to run
    results_role: str  # which results file the gate reads
    criteria: tuple[Criterion, ...]
    projected: dict[str, float]  # what the replay projects for the gate's metrics


@dataclass(frozen=True, slots=True)
class CriterionResult:
    criterion: Criterion
    measured: float | None
    passed: bool | None  # None: not measured


@dataclass(frozen=True, slots=True)
class GateResult:
    gate: Gate
    results: tuple[CriterionResult, ...]

    @property
    def status(self) -> str:
        states = [r.passed for r in self.results]
        if any(s is False for s in states):
            return "fail"
        if states and all(s is True for s in states):
            return "pass"
        if any(s is True for s in states):
            return "partial"
        return "not-run"


def plan(
    *,
    verdict: str,
    projection: Projection,
    trace_rate_rps: float,
    projected_baseline_ttft_s: float | None,
    stability_hours: float = 72.0,
    th: Thresholds | None = None,
    candidate: ScenarioFigures | None = None,
    baseline: ScenarioFigures | None = None,
    ttft_slo_s: float | None = None,
    throughput_gain: float | None = None,
) -> tuple[Gate, ...]:
    """The gate plan; the main gate's thresholds come from the projection of the
    recommended option (``candidate`` against ``baseline`` when given, else the
    ``projection``'s figures for the verdict)."""
    th = th or Thresholds()
    targets: dict[str, str] = {
        Verdict.DEPLOY_POOLED: "the pooled deployment (pool + HBM prefix cache)",
        Verdict.LOCAL_OFFLOAD_ONLY: "local DRAM offload (HBM prefix cache + host DRAM tier)",
    }
    target = targets.get(verdict, "the candidate deployment")
    # The throughput gain the plans project: the same load on fewer GPUs (the
    # baseline's GPUs over the option's, minus one).
    proj_thr = (
        projection.pooled_throughput_gain
        if verdict != Verdict.LOCAL_OFFLOAD_ONLY
        else projection.dram_throughput_gain
    )
    if throughput_gain is not None:
        proj_thr = throughput_gain
    if candidate is not None and baseline is not None:
        proj_red = (
            1.0 - candidate.ttft_mean_s / baseline.ttft_mean_s if baseline.ttft_mean_s > 0 else None
        )
    else:
        proj_red = (
            projection.pooled_ttft_reduction
            if verdict != Verdict.LOCAL_OFFLOAD_ONLY
            else projection.dram_ttft_reduction
        )
    f = th.pilot_fraction
    red_min = f * proj_red if proj_red is not None and proj_red > 0 else min(proj_red or 0.0, 0.0)
    thr_min = f * proj_thr if proj_thr is not None and proj_thr > 0 else min(proj_thr or 0.0, 0.0)
    main_projected: dict[str, float] = {}
    if proj_red is not None:
        main_projected["ttft_reduction"] = proj_red
    if proj_thr is not None:
        main_projected["throughput_gain"] = proj_thr
    p99_max = 1.10
    p90_max = ttft_slo_s
    if candidate is not None and baseline is not None:
        if baseline.ttft_p99_s > 0:
            ratio = candidate.ttft_p99_s / baseline.ttft_p99_s
            main_projected["p99_ttft_ratio"] = ratio
            p99_max = max(p99_max, ratio)
        main_projected["p90_ttft_s"] = candidate.ttft_p90_s
        if p90_max is not None:
            p90_max = max(p90_max, candidate.ttft_p90_s)
    main_criteria = [
        Criterion(
            "ttft_reduction",
            ">=",
            red_min,
            f"mean TTFT at least {100 * red_min:.1f}% below the baseline's"
            + (
                f" ({100 * f:.0f}% of the projected {100 * proj_red:.1f}%)"
                if proj_red is not None and proj_red > 0
                else ""
            ),
        ),
        Criterion(
            "throughput_gain",
            ">=",
            thr_min,
            (
                f"request throughput per GPU at least {100 * thr_min:.1f}% above the baseline's"
                if thr_min > 0
                else f"request throughput per GPU at most {100 * -thr_min:.1f}% below the "
                "baseline's"
                if thr_min < 0
                else "request throughput per GPU not below the baseline's"
            )
            + (
                f" ({100 * f:.0f}% of the projected {100 * proj_thr:.1f}% gain, which the "
                "GPU saving rests on)"
                if proj_thr is not None and proj_thr > 0
                else ""
            ),
        ),
    ]
    if p90_max is not None:
        main_criteria.append(
            Criterion(
                "p90_ttft_s",
                "<=",
                p90_max,
                f"p90 TTFT at most {1000 * p90_max:,.0f} ms (the TTFT SLO; no SLO regression)",
            )
        )
    main_criteria.append(
        Criterion(
            "p99_ttft_ratio",
            "<=",
            p99_max,
            f"p99 TTFT no more than {100 * (p99_max - 1):.0f}% above the baseline's",
        )
    )
    gates = (
        Gate(
            "arrival",
            "Arrival acceptance",
            f"Replay the trace against one instance at its logged rate ({trace_rate_rps:.3g} "
            "req/s for the whole cluster; scale by 1/instances): `vllm bench serve "
            "--save-result` at the logged rate and mean lengths, or the Mooncake export "
            "(`kvpool convert --to mooncake`) replayed by AIPerf; see Pilot commands.",
            "baseline",
            (
                Criterion("completed_ratio", ">=", 0.99, "at least 99% of requests complete"),
                Criterion(
                    "rate_ratio",
                    ">=",
                    0.9,
                    "achieved request rate at least 90% of the requested rate",
                ),
            ),
            {},
        ),
        Gate(
            "baseline",
            "Single-node baseline",
            "One node with HBM prefix caching only (vLLM --enable-prefix-caching), same "
            "trace and rate.",
            "baseline",
            (
                Criterion(
                    "model_error",
                    "<=",
                    0.5,
                    "measured mean TTFT within 50% of the projected baseline TTFT",
                ),
            ),
            ({"mean_ttft_s": projected_baseline_ttft_s} if projected_baseline_ttft_s else {}),
        ),
        isolation_gate(target),
        Gate(
            "main",
            "Main gate (TTFT and throughput KPIs)",
            f"The same load on {target}, compared with the baseline run; for the throughput "
            "criterion run both at their highest rate within the SLO (or at saturation, "
            "`vllm bench serve --request-rate inf`), on the same GPUs.",
            "candidate",
            tuple(main_criteria),
            main_projected,
        ),
        Gate(
            "stability",
            f"{stability_hours:g}-hour stability run",
            f"{stability_hours:g} hours of production-shaped load on {target}.",
            "stability",
            (
                Criterion(
                    "duration_h", ">=", stability_hours, f"ran at least {stability_hours:g} h"
                ),
                Criterion("completed_ratio", ">=", 0.999, "at least 99.9% of requests complete"),
                Criterion(
                    "p99_drift", "<=", 1.20, "p99 TTFT within 20% of the main gate's candidate run"
                ),
            ),
            {},
        ),
    )
    return gates


def isolation_gate(target: str) -> Gate:
    """The paired salt check (module docstring)."""
    return Gate(
        "isolation",
        "Tenant isolation (the same prefix under two salts)",
        f"On {target}, with no other traffic: `kvpool probe URL_A URL_B --model MODEL -o "
        "isolation-probe.json` (two engines sharing the pool; see Pilot commands), then "
        "`kvpool validate isolation=isolation-probe.json`; or save two `/metrics` "
        "snapshots around the probe's other-salt requests and give them as "
        "`--prometheus isolation=before.prom --prometheus isolation=after.prom`.",
        "isolation",
        (
            Criterion(
                "cross_salt_hit_tokens",
                "<=",
                0.0,
                "no request read KV cached under another salt, or under none",
            ),
            Criterion(
                "same_salt_hit_tokens",
                ">=",
                1.0,
                "the same salt hit (the probe saw the cache at all)",
            ),
        ),
        {},
    )


def derived_metrics(results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per role, the derived metrics the criteria test (only those computable)."""
    out: dict[str, dict[str, float]] = {}
    base = results.get("baseline", {})
    cand = results.get("candidate", {})
    stab = results.get("stability", {})

    def ratios(m: dict[str, float]) -> dict[str, float]:
        d: dict[str, float] = {}
        if m.get("num_prompts") and "completed" in m:
            d["completed_ratio"] = m["completed"] / m["num_prompts"]
        if m.get("requested_rate") and "request_throughput" in m:
            d["rate_ratio"] = m["request_throughput"] / m["requested_rate"]
        if "duration_s" in m:
            d["duration_h"] = m["duration_s"] / 3600.0
        return d

    if base:
        out["baseline"] = ratios(base)
    if cand:
        d = ratios(cand)
        if "p90_ttft_s" in cand:
            d["p90_ttft_s"] = cand["p90_ttft_s"]
        if base.get("mean_ttft_s") and "mean_ttft_s" in cand:
            d["ttft_reduction"] = 1.0 - cand["mean_ttft_s"] / base["mean_ttft_s"]
        if base.get("request_throughput") and "request_throughput" in cand:
            d["throughput_gain"] = cand["request_throughput"] / base["request_throughput"] - 1.0
        if base.get("p99_ttft_s") and "p99_ttft_s" in cand:
            d["p99_ttft_ratio"] = cand["p99_ttft_s"] / base["p99_ttft_s"]
        out["candidate"] = d
    if stab:
        d = ratios(stab)
        if cand.get("p99_ttft_s") and "p99_ttft_s" in stab:
            d["p99_drift"] = stab["p99_ttft_s"] / cand["p99_ttft_s"]
        out["stability"] = d
    iso = results.get("isolation", {})
    if iso:
        # A leak counts whether the answers or the engines' counters saw it.
        leaks = [
            iso[k] for k in ("cross_salt_hit_tokens", "cross_salt_counter_hit_tokens") if k in iso
        ]
        d = {"cross_salt_hit_tokens": max(leaks)} if leaks else {}
        if "same_salt_hit_tokens" in iso:
            d["same_salt_hit_tokens"] = iso["same_salt_hit_tokens"]
        out["isolation"] = d
    return out


def evaluate(
    gates: tuple[Gate, ...], results: dict[str, dict[str, float]]
) -> tuple[GateResult, ...]:
    """Test each gate's criteria on the measured results (roles: baseline, candidate,
    stability); a criterion without a measurement is ``None`` (not run)."""
    derived = derived_metrics(results)
    out = []
    for gate in gates:
        metrics = dict(derived.get(gate.results_role, {}))
        if gate.id == "baseline":
            proj = gate.projected.get("mean_ttft_s")
            meas = results.get("baseline", {}).get("mean_ttft_s")
            if proj and meas is not None:
                metrics["model_error"] = abs(meas - proj) / proj
        rows = []
        for c in gate.criteria:
            v = metrics.get(c.metric)
            if v is None:
                rows.append(CriterionResult(c, None, None))
                continue
            ok = v >= c.threshold if c.op == ">=" else v <= c.threshold
            rows.append(CriterionResult(c, float(v), bool(ok)))
        out.append(GateResult(gate, tuple(rows)))
    return tuple(out)


class CriterionJSON(TypedDict):
    metric: str
    op: str
    threshold: float
    text: str


class GateJSON(TypedDict):
    """A gate as ``report.json`` keeps it (``gates.plan[]``), read back by
    :func:`gate_from_json` for ``kvpool validate``."""

    id: str
    name: str
    run: str
    results_role: str
    criteria: list[CriterionJSON]
    projected: dict[str, float]


def gate_to_json(g: Gate) -> GateJSON:
    return {
        "id": g.id,
        "name": g.name,
        "run": g.run,
        "results_role": g.results_role,
        "criteria": [
            {"metric": c.metric, "op": c.op, "threshold": c.threshold, "text": c.text}
            for c in g.criteria
        ],
        "projected": dict(sorted(g.projected.items())),
    }


def _number(value: object, field: str) -> float:
    if isinstance(value, str | int | float):
        return float(value)
    raise TypeError(f"{field}: expected a number, got {type(value).__name__}")


def _criterion(c: object) -> Criterion:
    if not isinstance(c, Mapping):
        raise TypeError(f"criteria: expected objects, got {type(c).__name__}")
    return Criterion(
        str(c["metric"]),
        str(c["op"]),
        _number(c["threshold"], "threshold"),
        str(c.get("text", "")),
    )


def gate_from_json(d: Mapping[str, object]) -> Gate:
    """A gate of a report read back (untrusted JSON): a missing key is a ``KeyError``, a
    mistyped value a ``TypeError`` or ``ValueError``."""
    gate_id, name, run, role = (
        str(d["id"]),
        str(d["name"]),
        str(d.get("run", "")),
        str(d["results_role"]),
    )
    criteria = d["criteria"]
    if not isinstance(criteria, list):
        raise TypeError(f"criteria: expected a list, got {type(criteria).__name__}")
    projected = d.get("projected") or {}
    if not isinstance(projected, Mapping):
        raise TypeError(f"projected: expected an object, got {type(projected).__name__}")
    return Gate(
        id=gate_id,
        name=name,
        run=run,
        results_role=role,
        criteria=tuple(_criterion(c) for c in criteria),
        projected={str(k): _number(v, f"projected.{k}") for k, v in projected.items()},
    )
