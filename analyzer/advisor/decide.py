"""The decide stage: the verdict, in the order the practice uses, decided last on value.

0. **Enough data?** Count-only logs (lengths, no content), fewer than ``min_requests``
   requests, or a reuse analysis that could not run: ``insufficient-data``.
1. **Prefix reuse.** The steady-state ceiling (unlimited cache, perfect routing) must
   reach ``min_reuse`` (30 %). Below it the prefill a pool or offload tier saves is
   too small to pay for its memory, network and operations: only the baseline (the
   engines' HBM prefix cache) is a candidate.
2. **Bandwidth.** A tier is a candidate only if loading a reusable prefix from it is
   faster than recomputing it: its effective bandwidth must reach the break-even
   bandwidth ``bytes_per_token * prefill_tokens_per_s`` at this workload's reusable
   prefix (the token-weighted median).
3. **The SLO.** Every option was sized by replaying it (:mod:`analyzer.advisor.size`):
   the candidates are those with a size meeting the p90 TTFT SLO at the busiest load.
   When none has one, the verdict is ``cannot-meet-slo``: no tier is recommended by
   fallback, each reason says what happened to each option (the requests' own prefill
   misses the SLO at any size; the size that would meet it is above ``--max-gpus``; no
   size up to the largest searched meets it), and confidence is never high.
4. **Value.** With the ``cost`` objective the verdict is the candidate whose plan costs
   least per month (its GPUs, DRAM, NVMe, NICs and store servers); a pool must beat the
   best local candidate by ``min_pool_saving`` of the baseline's monthly cost, the
   margin that pays for operating a distributed store; ties go to the simpler option.
   Without a GPU price it is the candidate needing the fewest GPUs (a pool at least one
   fewer than the best local candidate). With the ``ttft`` objective every option is
   planned on at least the baseline's GPUs, and the verdict is the lowest mean TTFT:
   local offload from ``min_dram_gain`` below the baseline, a pool from
   ``min_pool_advantage`` below local offload.

Every reason carries the figures it states (:class:`analyzer.advisor.figures.Fact`):
their paths in the report (``fleet[pooled].gpus``), the values as shown and the
comparison drawn, so a test can check each reason against the report's own numbers.
Everything here is a pure function of the records of :mod:`analyzer.advisor.figures`
and :mod:`analyzer.advisor.plan`, so the sensitivity table calls :func:`decide` on
other plans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from analyzer.advisor.current import with_comparison
from analyzer.advisor.figures import (
    BandwidthFigures,
    Check,
    Decision,
    Fact,
    Objective,
    Projection,
    ReuseFigures,
    Thresholds,
    TraceFigures,
    Verdict,
)
from analyzer.advisor.plan import Fleet, PlanStatus
from analyzer.advisor.value import BASELINE as BASELINE  # re-exported for its users
from analyzer.advisor.value import (
    _by_cost,
    _by_gpus,
    _by_ttft,
    _cap,
    _fl,
    _latency_line,
    _pct,
    _reduction,
    _Why,
)
from analyzer.advisor.words import count, gpus, option_name
from analyzer.cost import uncertainty as unc
from analyzer.replay.config import Scenario, Tier

if TYPE_CHECKING:
    from analyzer.advisor.measure import Measured
    from analyzer.advisor.options import AnalyzeOptions
    from analyzer.advisor.price import Priced
    from analyzer.advisor.replay import Replayed
    from analyzer.advisor.size import Sized
    from analyzer.cost import CostModel
    from analyzer.cost.uncertainty import ErrorBand, FlipFinding, Range

# The tier each option adds, whose link must beat recomputing.
TIER_OF: dict[str, Tier] = {
    Scenario.LOCAL_DRAM: Tier.DRAM,
    Scenario.LOCAL_DRAM_NVME: Tier.NVME,
    Scenario.POOLED: Tier.POOL,
}
VERDICT_OF: dict[str, Verdict] = {
    Scenario.LOCAL: Verdict.NOT_WORTH_IT,
    Scenario.LOCAL_DRAM: Verdict.LOCAL_OFFLOAD_ONLY,
    Scenario.LOCAL_DRAM_NVME: Verdict.LOCAL_OFFLOAD_ONLY,
    Scenario.POOLED: Verdict.DEPLOY_POOLED,
}
TIER_WORDS = {Tier.DRAM: "host DRAM", Tier.NVME: "local NVMe", Tier.POOL: "the pool link"}
# Why a break-even bandwidth is infinite (analyzer.cost.model.break_even_bandwidth_gbps).
NEVER_PAYS_WHY = "its prefill saves less time than placing loaded KV in HBM takes, at any bandwidth"


def project(fleets: Sequence[Fleet]) -> Projection:
    """What local DRAM offload and the pool project against the baseline: mean TTFT
    reductions at the busiest load, and request throughput per GPU gained (the baseline's
    GPUs over the option's, minus one: the same load on fewer GPUs)."""
    by = {f.option: f for f in fleets}
    base = by.get(BASELINE)
    if base is None:
        return Projection()

    def red(name: str) -> float | None:
        f = by.get(name)
        if f is None or f.ttft is None or base.ttft is None:
            return None
        return _reduction(f.ttft.mean_s, base.ttft.mean_s)

    def gain(name: str) -> float | None:
        f = by.get(name)
        if f is None or f.gpus is None or base.gpus is None or f.gpus <= 0:
            return None
        return base.gpus / f.gpus - 1.0

    pooled, dram = by.get(Scenario.POOLED), by.get(Scenario.LOCAL_DRAM)
    return Projection(
        pooled_ttft_reduction=red(Scenario.POOLED),
        pooled_throughput_gain=gain(Scenario.POOLED),
        dram_ttft_reduction=red(Scenario.LOCAL_DRAM),
        dram_throughput_gain=gain(Scenario.LOCAL_DRAM),
        pool_vs_dram_ttft=None
        if pooled is None or dram is None or pooled.ttft is None or dram.ttft is None
        else _reduction(pooled.ttft.mean_s, dram.ttft.mean_s),
    )


def missing_data(trace: TraceFigures, reuse: ReuseFigures, th: Thresholds) -> tuple[str, ...]:
    """What the log lacks for a decision; empty when it is enough."""
    missing: list[str] = []
    if trace.count_only:
        missing.append(
            "prompt content or block hashes: the log has token counts only "
            "(e.g. Azure/BurstGPT TIMESTAMP,ContextTokens,GeneratedTokens), so no request "
            "can be compared with another and prefix reuse cannot be measured; log the "
            "request bodies (OpenAI 'messages'/'tools') or per-block hash ids "
            "(Mooncake 'hash_ids')"
        )
    if trace.n_requests < th.min_requests:
        missing.append(
            f"enough requests: {trace.n_requests} found, at least {th.min_requests} are "
            "needed for a steady-state reuse figure (half of them only warm the cache)"
        )
    if not trace.count_only and not reuse.measurable:
        missing.append(f"a measurable reuse analysis: {reuse.reason or 'unknown reason'}")
    return tuple(missing)


def decide(
    trace: TraceFigures,
    reuse: ReuseFigures,
    bandwidth: BandwidthFigures | None,
    fleets: Sequence[Fleet] | None,
    th: Thresholds | None = None,
) -> Decision:
    """The verdict on these figures and plans (module docstring). ``fleets``: every
    option planned for the whole log (None: no replay ran)."""
    th = th or Thresholds()
    missing = missing_data(trace, reuse, th)
    if missing:
        return Decision(
            verdict=Verdict.INSUFFICIENT_DATA,
            reasons=tuple(f"Missing: {m}." for m in missing),
            checks=(
                Check(
                    0,
                    "data",
                    False,
                    float(trace.n_requests) if trace.n_requests < th.min_requests else None,
                    float(th.min_requests) if trace.n_requests < th.min_requests else None,
                    "; ".join(missing),
                ),
            ),
            confidence="low",
            confidence_notes=("The log itself cannot answer the question; nothing was projected.",),
            missing=missing,
            facts=tuple(() for _ in missing),
        )
    checks: list[Check] = []
    why = _Why()
    by = {f.option: f for f in fleets or ()}
    proj = project(fleets or ())

    # (1) prefix reuse
    ceiling = reuse.ceiling_hit_rate
    reuse_ok = ceiling >= th.min_reuse
    shares = (reuse.same_session_share, reuse.same_tenant_share, reuse.cross_tenant_share)
    src = (
        f"of the reused tokens: same session {_pct(shares[0])}, same tenant "
        f"{_pct(shares[1])}, other tenants {_pct(shares[2])}"
        if sum(shares) > 0 or ceiling <= 0
        # a log without sessions or tenants (Mooncake's hash_ids): its reuse is unattributed
        else "the log names no sessions or tenants, so whose prompts the reused tokens "
        "came from is not known"
    )
    checks.append(
        Check(
            1,
            "prefix reuse",
            reuse_ok,
            ceiling,
            th.min_reuse,
            f"Steady-state prefix reuse ceiling is {_pct(ceiling)} (cold start "
            f"{_pct(reuse.cold_ceiling_hit_rate)}, the first {_pct(reuse.warmup)} of requests "
            f"only warming the caches); {src}. Guideline: at least "
            f"{_pct(th.min_reuse)}, because below it the prefill a pool saves cannot pay for "
            "the pool's memory, network and operations.",
        )
    )
    f_ceiling = Fact(
        "reuse.figures.ceiling_hit_rate",
        ceiling,
        "pct",
        ">=" if reuse_ok else "<",
        "options.thresholds.min_reuse",
        th.min_reuse,
    )
    candidates: list[str] = [BASELINE]
    if not reuse_ok:
        why.add(
            f"Prefix reuse is {f_ceiling.shown}, below the {_pct(th.min_reuse)} guideline: too "
            "little repeated prefill for pooling or offload to pay for themselves.",
            f_ceiling,
        )
    else:
        candidates += _bandwidth_step(
            bandwidth, th, checks, why, by if fleets is not None else None
        )

    if fleets is None:
        return _without_replay(
            candidates, bandwidth, why, checks, trace, reuse, proj, th, f_ceiling
        )

    # (3) the SLO
    meeting = [c for c in candidates if c in by and by[c].meets_slo]
    if not meeting:
        _cannot_meet(candidates, by, why, checks, th)
        return _finish(Verdict.CANNOT_MEET_SLO, None, why, checks, trace, reuse, fleets, proj, th)
    if BASELINE not in meeting:
        b = by.get(BASELINE)
        if b is not None:
            why.add(
                f"The baseline, the engines' HBM prefix cache alone, {_status_words(b, th)}; "
                f"{_names(meeting)} {'does' if len(meeting) == 1 else 'do'}.",
                *_status_facts(b),
            )

    # (4) value
    derived: list[tuple[str, float]] = []
    if th.objective == Objective.TTFT:
        chosen = _by_ttft(meeting, by, th, why, checks)
    elif all(by[n].money.total_usd_month is not None for n in meeting):
        chosen = _by_cost(meeting, by, th, why, checks, derived)
    else:
        chosen = _by_gpus(meeting, by, th, why, checks)
    _latency_line(chosen, by, why)
    dram, pooled = by.get(Scenario.LOCAL_DRAM), by.get(Scenario.POOLED)
    if (
        dram is not None
        and pooled is not None
        and Scenario.POOLED in candidates
        and pooled.nodes == 1
        and all(p.capacities.dram_per_instance is None for p in dram.plans)
        and all(p.capacities.dram_per_node is not None for p in dram.plans)
    ):
        why.add(
            "All instances share one node and its host DRAM was modelled as one cache they "
            "share (--dram-scope node, a node-local shared store): a pool cannot add hits "
            "over it. Engines' own DRAM tiers (LMCache local CPU, HiCache L2) are private to "
            "each instance; describe that with --dram-scope instance."
        )
    return _finish(
        VERDICT_OF[chosen], chosen, why, checks, trace, reuse, fleets, proj, th, tuple(derived)
    )


def _bandwidth_step(
    bandwidth: BandwidthFigures | None,
    th: Thresholds,
    checks: list[Check],
    why: _Why,
    planned: dict[str, Fleet] | None,
) -> list[str]:
    """(2) Each tier's link against the break-even bandwidth: the options whose tier
    beats recomputing (and were planned, when a replay ran). A prefix whose prefill
    saves less than placing its loaded KV costs is never worth loading: the break-even
    is infinite, and no tier passes at any bandwidth."""
    out: list[str] = []
    never = bandwidth is not None and not math.isfinite(bandwidth.break_even_gbps)
    for option, role in TIER_OF.items():
        if planned is not None and option not in planned:
            continue
        tier = None if bandwidth is None else bandwidth.tier(role)
        if bandwidth is None or tier is None:
            out.append(option)
            continue
        need = bandwidth.break_even_gbps * th.bandwidth_margin
        ok = tier.bandwidth_gbps >= need
        label = TIER_WORDS[role]
        head = f"{_cap(label)} ({tier.tier}) delivers {tier.bandwidth_gbps:.3g} GB/s; loading a "
        checks.append(
            Check(
                2,
                f"bandwidth: {label}",
                ok,
                tier.bandwidth_gbps,
                None if never else need,
                f"{head}{bandwidth.prefix_tokens:,}-token prefix never beats recomputing it: "
                f"{NEVER_PAYS_WHY}."
                if never
                else f"{head}{bandwidth.prefix_tokens:,}-token prefix beats recomputing it above "
                f"{bandwidth.break_even_gbps:.3g} GB/s ({bandwidth.bytes_per_token:,} B/token x "
                f"{bandwidth.prefill_tokens_per_s:,.0f} prefill tokens/s).",
            )
        )
        if ok:
            out.append(option)
            continue
        if never:
            continue
        f_bw = Fact(
            f"bandwidth.tiers[{role}].bandwidth_gbps",
            tier.bandwidth_gbps,
            "gbps",
            "<",
            "bandwidth.break_even_gbps",
            bandwidth.break_even_gbps,
        )
        f_be = Fact("bandwidth.break_even_gbps", bandwidth.break_even_gbps, "gbps")
        why.add(
            f"{_cap(label)} ({f_bw.shown}) is slower than recomputing: loading a "
            f"{bandwidth.prefix_tokens:,}-token prefix pays only above {f_be.shown}, so "
            f"{option_name(option)} is not a candidate.",
            f_bw,
            f_be,
        )
    if never:
        assert bandwidth is not None
        f_prefix = Fact("bandwidth.prefix_tokens", bandwidth.prefix_tokens, "tokens")
        why.add(
            f"Loading the log's median reusable prefix of {f_prefix.shown} never pays: "
            f"{NEVER_PAYS_WHY}. No offload tier and no pool is a candidate.",
            f_prefix,
        )
    return out


def _names(options: Sequence[str]) -> str:
    names = [option_name(o) for o in options]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _status_words(f: Fleet, th: Thresholds) -> str:
    """What the size search of ``f`` found when it met no SLO, in words."""
    p = f.plans[0] if f.plans else None
    if f.status == PlanStatus.PREFILL_BOUND:
        return (
            "cannot meet it at any size: even alone on an idle instance with every reusable "
            "prefix already cached, too many requests take longer than the SLO to prefill"
        )
    if f.status == PlanStatus.ABOVE_CAP and f.gpus_above_cap is not None:
        return (
            f"would meet it on {gpus(f.gpus_above_cap)}, above the cap of "
            f"{gpus(f.cap_gpus)} (--max-gpus)"
        )
    cap = f.search_gpus if f.search_gpus else (p.cap_instances * p.tp if p else 0)
    return f"meets it at no size up to {gpus(cap)}"


def _status_facts(f: Fleet) -> tuple[Fact, ...]:
    if f.status == PlanStatus.ABOVE_CAP and f.gpus_above_cap is not None:
        return (
            Fact(_fl(f.option, "gpus_above_cap"), float(f.gpus_above_cap), "count"),
            Fact(_fl(f.option, "cap_gpus"), float(f.cap_gpus), "count"),
        )
    return ()


def _cannot_meet(
    candidates: list[str], by: dict[str, Fleet], why: _Why, checks: list[Check], th: Thresholds
) -> None:
    """(3) No candidate meets the SLO: what happened to each, and what would meet it."""
    slo = Fact("options.ttft_slo_s", th_slo(by), "ms")
    floors = [f.floor_p90_s for f in by.values() if f.floor_p90_s is not None]
    if floors and all(f.status == PlanStatus.PREFILL_BOUND for f in by.values()):
        low = max(floors)
        f_floor = Fact("fleet[local].floor_p90_s", low, "ms", ">", "options.ttft_slo_s", slo.value)
        why.add(
            f"No deployment meets the p90 TTFT SLO of {slo.shown} at any size: even alone on an "
            "idle instance with every reusable prefix already cached, a tenth of the requests "
            f"take longer to prefill, so p90 TTFT cannot go below {f_floor.shown} on this model "
            "and GPU. An SLO of at least that can be met; a faster GPU or a smaller model "
            "lowers it (see the other models and GPUs).",
            f_floor,
            slo,
        )
    else:
        for c in candidates:
            f = by.get(c)
            if f is None:
                continue
            why.add(
                f"{_cap(option_name(c))} {_status_words(f, th)} (p90 TTFT SLO {slo.shown}).",
                *_status_facts(f),
                slo,
            )
    why.add(
        "No tier is recommended: none makes the SLO reachable within the GPUs allowed. "
        "Relax the SLO, raise --max-gpus, or plan another GPU or model."
    )
    checks.append(
        Check(3, "an option meets the TTFT SLO", False, None, None, "no option meets the SLO")
    )


def th_slo(by: dict[str, Fleet]) -> float:
    """The SLO the plans were sized for."""
    for f in by.values():
        for p in f.plans:
            return p.ttft_slo_s
    return 0.0


def _without_replay(
    candidates: list[str],
    bandwidth: BandwidthFigures | None,
    why: _Why,
    checks: list[Check],
    trace: TraceFigures,
    reuse: ReuseFigures,
    proj: Projection,
    th: Thresholds,
    f_ceiling: Fact,
) -> Decision:
    """No replay ran: reuse and bandwidth alone, a candidate for a pilot."""
    if Scenario.POOLED in candidates:
        why.add(
            "Reuse and bandwidth favour a pool, but no replay was run to size it and project "
            "its latency; treat this as a candidate for a pilot.",
            f_ceiling,
        )
        return _finish(
            Verdict.DEPLOY_POOLED, Scenario.POOLED, why, checks, trace, reuse, None, proj, th
        )
    local = next(
        (c for c in (Scenario.LOCAL_DRAM, Scenario.LOCAL_DRAM_NVME) if c in candidates), None
    )
    if local is not None:
        why.add(
            "No replay was run, so no gain is projected; the offload tier beats recompute, so "
            "local offload is the candidate for a pilot.",
            f_ceiling,
        )
        return _finish(Verdict.LOCAL_OFFLOAD_ONLY, local, why, checks, trace, reuse, None, proj, th)
    why.add("No tier below HBM is a candidate: keep the HBM prefix cache only.", f_ceiling)
    return _finish(Verdict.NOT_WORTH_IT, BASELINE, why, checks, trace, reuse, None, proj, th)


def _finish(
    verdict: Verdict,
    scenario: str | None,
    why: _Why,
    checks: list[Check],
    trace: TraceFigures,
    reuse: ReuseFigures,
    fleets: Sequence[Fleet] | None,
    proj: Projection,
    th: Thresholds,
    derived: tuple[tuple[str, float], ...] = (),
) -> Decision:
    notes: list[str] = []
    downgrades = 0
    if trace.n_requests < 2000:
        downgrades += 1 if trace.n_requests >= 500 else 2
        notes.append(
            f"Only {count(trace.n_requests, 'request')} ({trace.duration_s:,.0f} s of traffic); "
            "a day of production logs gives a firmer figure."
        )
    close: list[str] = []
    for c in checks:
        if c.value is None or c.threshold is None or c.passed is None:
            continue
        scale = max(abs(c.threshold), 0.05)
        if abs(c.value - c.threshold) / scale < 0.2:
            close.append(c.name)
    if close:
        downgrades += 1
        notes.append("Close to a threshold: " + ", ".join(close) + " (see the sensitivity table).")
    if trace.approx_lengths:
        downgrades += 1
        notes.append("Some prompt lengths were estimated, not counted.")
    if fleets is None and verdict != Verdict.NOT_WORTH_IT:
        downgrades += 1
        notes.append("No replay was run, so nothing is sized or projected.")
    if verdict == Verdict.CANNOT_MEET_SLO:
        downgrades = max(downgrades, 1)
        notes.append("No option met the SLO: the figures say what would, not what to deploy.")
    notes.append(
        "Recompute speed comes from the catalog cost model; calibrate it with "
        "`kvpool cost fit` on your own measurements to firm it up."
    )
    level = ("high", "medium", "low")[min(downgrades, 2)]
    return Decision(
        verdict=verdict,
        reasons=tuple(why.texts),
        checks=tuple(checks),
        confidence=level,
        confidence_notes=tuple(notes),
        projection=proj,
        facts=tuple(why.facts),
        derived=derived,
        scenario=scenario,
    )


# -- the stage: the verdict on the plans, with the cost model's error and the log's hits --

_LOWER = {"high": "medium", "medium": "low", "low": "low"}


@dataclass(frozen=True, slots=True)
class CostUncertainty:
    """Ranges on the deciding figures from the cost model's measured error (``band``),
    and whether a flip of the bandwidth verdict lies inside them; each option's mean
    TTFT at its planned size as a range when the options were sized."""

    band: ErrorBand
    break_even_gbps: Range
    prefill_tokens_per_s: Range
    flip: FlipFinding
    ttft_mean_s_by_scenario: dict[str, Range] | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "band": self.band.to_json(),
            "break_even_gbps": self.break_even_gbps.to_json(),
            "prefill_tokens_per_s": self.prefill_tokens_per_s.to_json(),
            "flip": self.flip.to_json(),
        }
        if self.ttft_mean_s_by_scenario is not None:
            out["ttft_mean_s"] = {n: r.to_json() for n, r in self.ttft_mean_s_by_scenario.items()}
        return out


def with_uncertainty(
    decision: Decision,
    cm: CostModel,
    bw: BandwidthFigures,
    fleets: Sequence[Fleet] | None,
    th: Thresholds,
) -> tuple[Decision, CostUncertainty]:
    """Ranges on the deciding figures from the cost model's measured error, and the
    confidence note saying whether a flip of the verdict lies inside them. The verdict
    itself is the point estimate's; a flip inside the range lowers the confidence one
    level and names the measurement that settles it."""

    band = unc.prefill_band(cm, bw.prefix_tokens)
    tiers = [
        (f"{TIER_WORDS.get(Tier(t.role), t.role)} ({t.tier})", t.bandwidth_gbps) for t in bw.tiers
    ]
    flip = unc.bandwidth_flip(
        bw.break_even_gbps, bw.prefix_tokens, tiers, band, th.bandwidth_margin
    )
    # the compute share of a replayed TTFT carries the band; applying it to the whole
    # TTFT (queueing and loads included) gives a range at least as wide as the truth's
    out = CostUncertainty(
        band=band,
        break_even_gbps=unc.break_even_range(bw.break_even_gbps, band),
        prefill_tokens_per_s=unc.rate_range(bw.prefill_tokens_per_s, band),
        flip=flip,
        ttft_mean_s_by_scenario=None
        if not fleets
        else {
            f.option: unc.time_range(f.ttft.mean_s, band)
            for f in fleets
            if f.ttft is not None and f.ttft.mean_s is not None
        },
    )
    if decision.verdict == Verdict.INSUFFICIENT_DATA:
        return decision, out
    notes = (*decision.confidence_notes, flip.statement)
    level = _LOWER[decision.confidence] if flip.inside else decision.confidence
    return replace(decision, confidence=level, confidence_notes=notes), out


def decide_stage(
    m: Measured,
    priced: Priced,
    sized: Sized | None,
    replayed: Replayed,
    opts: AnalyzeOptions,
) -> tuple[Decision, CostUncertainty | None]:
    """The verdict on every option's plan, its confidence lowered where the cost model's
    error or the log's own measured hits say so."""
    fleets = None if sized is None else sized.fleets
    decision = decide(m.trace_figures, m.reuse, priced.bandwidth, fleets, opts.thresholds)
    uncertainty: CostUncertainty | None = None
    if priced.bandwidth is not None:
        decision, uncertainty = with_uncertainty(
            decision, priced.primary.cost, priced.bandwidth, fleets, opts.thresholds
        )
    measured = replayed.measured
    if measured is not None and measured.comparison is not None:
        decision = with_comparison(decision, measured.comparison)
    return decision, uncertainty
