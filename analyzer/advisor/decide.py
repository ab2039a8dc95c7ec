"""The verdict, in the order the practice uses (FIELD.md section 6).

1. **Prefix reuse.** The steady-state ceiling (unlimited cache, perfect routing) must
   reach ``min_reuse`` (30 %). Below it the prefill a pool saves is too small to pay
   for the pool's memory, network and operations: the verdict is ``not-worth-it``.
2. **Bandwidth.** A tier is only useful if loading a reusable prefix from it is faster
   than recomputing it: its effective bandwidth must reach the break-even bandwidth
   ``bytes_per_token * prefill_tokens_per_s`` at this workload's reusable prefix
   length (the token-weighted median). A pool link below break-even makes the verdict
   ``local-offload-only`` when host DRAM still beats recompute (and the replay shows
   local DRAM offload lowering TTFT by at least ``min_dram_gain``), else
   ``not-worth-it``.
3. **Projected gains.** The replay projects the pooled deployment's TTFT and its
   highest rate under the TTFT SLO against the baseline (per-instance HBM prefix
   caching, what vLLM and SGLang do by default). ``deploy-pooled`` needs the pilot's
   main-gate KPIs (TTFT reduction >= 25 %, no throughput loss) and a clear advantage
   over local DRAM offload; otherwise local offload is what pays, if the replay shows
   it lowering TTFT at all (``min_dram_gain``, 2 %): when the HBM prefix cache already
   captures the reuse, nothing is worth adding (``not-worth-it``).

``insufficient-data`` comes first: count-only logs (lengths, no content), fewer than
``min_requests`` requests, or a reuse analysis that could not run.

Everything here is a pure function of the records in :mod:`analyzer.advisor.figures`,
so the sensitivity table can call :func:`decide` on perturbed inputs.
"""

from __future__ import annotations

from analyzer.advisor.figures import (
    BandwidthFigures,
    Check,
    Decision,
    Projection,
    ReplayFigures,
    ReuseFigures,
    ScenarioFigures,
    Thresholds,
    TraceFigures,
)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _reduction(new: float, base: float) -> float | None:
    if base <= 0:
        return None
    return 1.0 - new / base


def _gain(new: ScenarioFigures, base: ScenarioFigures) -> float | None:
    """Rate gain at the SLO; unknown when both searches hit their top multiple (the SLO
    never binds there, so 64x against 64x says nothing about either)."""
    a, b = new.max_rate_scale, base.max_rate_scale
    if a is None or b is None or b <= 0 or (new.max_rate_capped and base.max_rate_capped):
        return None
    return a / b - 1.0


def project(replay: ReplayFigures | None) -> Projection:
    """Gains of local+dram and pooled over the baseline scenario."""
    if replay is None:
        return Projection()
    base = replay.get(replay.baseline)
    pooled = replay.get("pooled")
    dram = replay.get("local+dram")
    if base is None:
        return Projection()
    out: dict[str, float | None] = {}
    if pooled is not None:
        out["pooled_ttft_reduction"] = _reduction(pooled.ttft_mean_s, base.ttft_mean_s)
        out["pooled_throughput_gain"] = _gain(pooled, base)
    if dram is not None:
        out["dram_ttft_reduction"] = _reduction(dram.ttft_mean_s, base.ttft_mean_s)
        out["dram_throughput_gain"] = _gain(dram, base)
    if pooled is not None and dram is not None:
        out["pool_vs_dram_ttft"] = _reduction(pooled.ttft_mean_s, dram.ttft_mean_s)
    return Projection(**out)


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
    replay: ReplayFigures | None,
    th: Thresholds | None = None,
) -> Decision:
    th = th or Thresholds()
    missing = missing_data(trace, reuse, th)
    if missing:
        few = trace.n_requests < th.min_requests
        return Decision(
            verdict="insufficient-data",
            reasons=tuple(f"Missing: {m}." for m in missing),
            checks=(
                Check(
                    0,
                    "data",
                    False,
                    float(trace.n_requests) if few else None,
                    float(th.min_requests) if few else None,
                    "; ".join(missing),
                ),
            ),
            confidence="high",
            confidence_notes=(
                "The log itself cannot answer the question; no projection was made.",
            ),
            missing=missing,
        )

    checks: list[Check] = []
    reasons: list[str] = []
    proj = project(replay)

    # (1) prefix reuse
    ceiling = reuse.ceiling_hit_rate
    reuse_ok = ceiling >= th.min_reuse
    src = (
        f"same session {_pct(reuse.same_session_share)}, same tenant "
        f"{_pct(reuse.same_tenant_share)}, other tenants {_pct(reuse.cross_tenant_share)}"
    )
    text1 = (
        f"Steady-state prefix reuse ceiling is {_pct(ceiling)} (cold start "
        f"{_pct(reuse.cold_ceiling_hit_rate)}, warm-up {reuse.warmup:g}); of the reused tokens: "
        f"{src}. Guideline: at least {_pct(th.min_reuse)}, because below it the prefill a "
        "pool saves cannot pay for the pool's memory, network and operations."
    )
    checks.append(Check(1, "prefix reuse", reuse_ok, ceiling, th.min_reuse, text1))
    if not reuse_ok:
        reasons.append(
            f"Prefix reuse is {_pct(ceiling)}, below the {_pct(th.min_reuse)} guideline: too "
            "little repeated prefill for pooling or offload to pay for themselves. Keep the "
            "engine's default HBM prefix cache."
        )
        return _finish("not-worth-it", reasons, checks, trace, reuse, bandwidth, replay, proj, th)

    # (2) bandwidth against break-even
    pool_ok: bool | None = None
    dram_ok: bool | None = None
    if bandwidth is not None:
        need = bandwidth.break_even_gbps * th.bandwidth_margin
        for role in ("dram", "pool", "nvme"):
            tier = bandwidth.tier(role)
            if tier is None:
                continue
            ok = tier.bandwidth_gbps >= need
            label = {"dram": "host DRAM", "pool": "pool link", "nvme": "local NVMe"}[role]
            checks.append(
                Check(
                    2,
                    f"bandwidth: {label}",
                    ok,
                    tier.bandwidth_gbps,
                    need,
                    f"{label} ({tier.tier}) delivers {tier.bandwidth_gbps:.3g} GB/s; loading a "
                    f"{bandwidth.prefix_tokens:,}-token prefix beats recomputing it above "
                    f"{bandwidth.break_even_gbps:.3g} GB/s "
                    f"({bandwidth.bytes_per_token:,} B/token x "
                    f"{bandwidth.prefill_tokens_per_s:,.0f} prefill tokens/s).",
                )
            )
            if role == "pool":
                pool_ok = ok
            elif role == "dram":
                dram_ok = ok
    if pool_ok is False:
        tier = bandwidth.tier("pool") if bandwidth else None
        assert tier is not None and bandwidth is not None
        reasons.append(
            f"Prefix reuse is high ({_pct(ceiling)}), but the pool link ({tier.bandwidth_gbps:.3g} "
            f"GB/s per node) is slower than recomputing: break-even is "
            f"{bandwidth.break_even_gbps:.3g} GB/s for a {bandwidth.prefix_tokens:,}-token prefix."
        )
        if dram_ok is False:
            reasons.append(
                "Host DRAM is below break-even too, so no tier beneath HBM pays; keep the HBM "
                "prefix cache only."
            )
            return _finish(
                "not-worth-it", reasons, checks, trace, reuse, bandwidth, replay, proj, th
            )
        reasons.append("Host DRAM over PCIe beats recompute: offload locally, do not pool.")
        _step3(checks, proj, th)
        return _local(reasons, checks, trace, reuse, bandwidth, replay, proj, th)

    # (3) projected gains against the pilot gates
    gates_ok, vs_dram_ok = _step3(checks, proj, th)
    if gates_ok and vs_dram_ok is not False:
        red = proj.pooled_ttft_reduction or 0.0
        reasons.append(
            f"Prefix reuse {_pct(ceiling)} is above the guideline, the pool link beats "
            f"recompute, and the replay projects {_pct(red)} lower mean TTFT than the baseline "
            f"(gate: {_pct(th.min_ttft_reduction)})"
            + (
                f" and {proj.pooled_throughput_gain:+.0%} rate at the TTFT SLO."
                if proj.pooled_throughput_gain is not None
                else "."
            )
        )
        return _finish("deploy-pooled", reasons, checks, trace, reuse, bandwidth, replay, proj, th)
    if gates_ok is None and replay is None and pool_ok:
        reasons.append(
            "Reuse and bandwidth favour a pool, but no replay was run to project the gains; "
            "treat this as a candidate for a pilot."
        )
        return _finish("deploy-pooled", reasons, checks, trace, reuse, bandwidth, replay, proj, th)
    if gates_ok and vs_dram_ok is False:
        reasons.append(
            f"The pool passes the TTFT gate, but local DRAM offload projects nearly the same "
            f"TTFT (pool only {_pct(proj.pool_vs_dram_ttft or 0.0)} lower; needs "
            f"{_pct(th.min_pool_advantage)}): the pool's infrastructure is not justified."
        )
    else:
        red_or_none = proj.pooled_ttft_reduction
        reasons.append(
            "The replay projects the pool below the main gate: "
            + (
                f"{_pct(red_or_none)} lower mean TTFT"
                if red_or_none is not None
                else "no TTFT figure"
            )
            + f" (needs {_pct(th.min_ttft_reduction)})"
            + (
                f", {proj.pooled_throughput_gain:+.0%} rate at the SLO"
                if proj.pooled_throughput_gain is not None
                else ""
            )
            + "; local caches already capture most of the reuse."
        )
    if replay is not None and replay.nodes == 1 and replay.dram_scope == "node":
        reasons.append(
            "All instances share one node and its host DRAM was modelled as one cache they "
            "share (--dram-scope node, a node-local shared store): a pool cannot add hits "
            "over it. Engines' own DRAM tiers (LMCache local CPU, HiCache L2) are private to "
            "each instance; describe that with --dram-scope instance."
        )
    if dram_ok is False:
        reasons.append("Host DRAM is below break-even, so only the HBM prefix cache pays.")
        return _finish("not-worth-it", reasons, checks, trace, reuse, bandwidth, replay, proj, th)
    return _local(reasons, checks, trace, reuse, bandwidth, replay, proj, th)


def _local(
    reasons: list[str],
    checks: list[Check],
    trace: TraceFigures,
    reuse: ReuseFigures,
    bandwidth: BandwidthFigures | None,
    replay: ReplayFigures | None,
    proj: Projection,
    th: Thresholds,
) -> Decision:
    """No pool: local DRAM offload when the replay shows it helps, else nothing to add."""
    red = proj.dram_ttft_reduction
    if red is None:
        return _finish(
            "local-offload-only", reasons, checks, trace, reuse, bandwidth, replay, proj, th
        )
    ok = red >= th.min_dram_gain
    checks.append(
        Check(
            3,
            "local DRAM offload gain",
            ok,
            red,
            th.min_dram_gain,
            f"Local DRAM offload: mean TTFT {_pct(red)} below the baseline (worth configuring "
            f"from {_pct(th.min_dram_gain)}).",
        )
    )
    if ok:
        reasons.append(
            f"The replay projects local DRAM offload {_pct(red)} below the baseline's mean TTFT."
        )
        return _finish(
            "local-offload-only", reasons, checks, trace, reuse, bandwidth, replay, proj, th
        )
    reasons.append(
        f"Local DRAM offload projects only {_pct(red)} lower TTFT: the HBM prefix cache already "
        "captures the reuse, so neither a pool nor an offload tier pays."
    )
    return _finish("not-worth-it", reasons, checks, trace, reuse, bandwidth, replay, proj, th)


def _step3(
    checks: list[Check], proj: Projection, th: Thresholds
) -> tuple[bool | None, bool | None]:
    red = proj.pooled_ttft_reduction
    thr = proj.pooled_throughput_gain
    if red is None:
        checks.append(
            Check(
                3,
                "projected TTFT reduction",
                None,
                None,
                th.min_ttft_reduction,
                "No replay figures: the gain was not projected.",
            )
        )
        return None, None
    ttft_ok = red >= th.min_ttft_reduction
    checks.append(
        Check(
            3,
            "projected TTFT reduction",
            ttft_ok,
            red,
            th.min_ttft_reduction,
            f"Pooled mean TTFT {_pct(red)} below the baseline (gate: at least "
            f"{_pct(th.min_ttft_reduction)}).",
        )
    )
    thr_ok = True
    if thr is not None:
        thr_ok = thr >= th.min_throughput_gain
        checks.append(
            Check(
                3,
                "projected throughput gain",
                thr_ok,
                thr,
                th.min_throughput_gain,
                f"Highest request rate under the TTFT SLO {thr:+.1%} against the baseline "
                f"(gate: at least {th.min_throughput_gain:+.0%}).",
            )
        )
    vs = proj.pool_vs_dram_ttft
    vs_ok: bool | None = None
    if vs is not None:
        vs_ok = vs >= th.min_pool_advantage
        checks.append(
            Check(
                3,
                "pool advantage over local DRAM",
                vs_ok,
                vs,
                th.min_pool_advantage,
                f"Pooled mean TTFT {_pct(vs)} below local+DRAM offload (needed: "
                f"{_pct(th.min_pool_advantage)} to justify a pool).",
            )
        )
    return ttft_ok and thr_ok, vs_ok


def _finish(
    verdict: str,
    reasons: list[str],
    checks: list[Check],
    trace: TraceFigures,
    reuse: ReuseFigures,
    bandwidth: BandwidthFigures | None,
    replay: ReplayFigures | None,
    proj: Projection,
    th: Thresholds,
) -> Decision:
    notes: list[str] = []
    downgrades = 0
    if trace.n_requests < 2000:
        downgrades += 1 if trace.n_requests >= 500 else 2
        notes.append(
            f"Only {trace.n_requests:,} requests ({trace.duration_s:,.0f} s of traffic); "
            "a day of production logs gives a firmer figure."
        )
    # How close the deciding figures sit to their thresholds (relative margin).
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
    if replay is None and verdict != "not-worth-it":
        downgrades += 1
        notes.append("No replay was run, so the gains are not projected.")
    if bandwidth is not None:
        notes.append(
            "Recompute speed comes from the catalog cost model (peak FLOP/s x utilisation); "
            "calibrate it with `kvpool cost fit` on your own measurements to firm it up."
        )
    level = ("high", "medium", "low")[min(downgrades, 2)]
    return Decision(
        verdict=verdict,
        reasons=tuple(reasons),
        checks=tuple(checks),
        confidence=level,
        confidence_notes=tuple(notes),
        projection=proj,
    )
