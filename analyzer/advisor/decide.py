"""The verdict, in the order the practice uses, decided last on value.

1. **Prefix reuse.** The steady-state ceiling (unlimited cache, perfect routing) must
   reach ``min_reuse`` (30 %). Below it the prefill a pool saves is too small to pay
   for the pool's memory, network and operations: the verdict is ``not-worth-it``.
2. **Bandwidth.** A tier is only useful if loading a reusable prefix from it is faster
   than recomputing it: its effective bandwidth must reach the break-even bandwidth
   ``bytes_per_token * prefill_tokens_per_s`` at this workload's reusable prefix
   length (the token-weighted median). A tier below break-even is not a candidate.
3. **Value.** The candidates are the baseline (per-instance HBM prefix caching, the
   default of vLLM and SGLang), local DRAM offload and the pool. With the ``cost``
   objective the verdict is the candidate that serves the log's peak load within the
   TTFT SLO at the lowest monthly cost (GPUs needed, from the replay's rate search,
   plus the DRAM, NICs and store servers the option adds;
   :mod:`analyzer.advisor.economics`); a pool must beat the best local candidate by
   ``min_pool_saving`` of the baseline's monthly cost, the margin that pays for
   operating a distributed store. With the ``ttft`` objective the verdict is the
   candidate with the lowest mean TTFT that does not lower the rate served within the
   SLO; the pool must beat local DRAM offload by ``min_pool_advantage`` and local
   offload the baseline by ``min_dram_gain``. Without prices or a rate search the
   ``cost`` objective falls back to ``ttft`` and says so.

Every reason carries the figures it states (:class:`analyzer.advisor.figures.Fact`):
their paths in the report, the values as shown and the comparison drawn, so a test can
check each reason against the report's own numbers.

``insufficient-data`` comes first: count-only logs (lengths, no content), fewer than
``min_requests`` requests, or a reuse analysis that could not run.

Everything here is a pure function of the records in :mod:`analyzer.advisor.figures`
(and :mod:`analyzer.advisor.economics`), so the sensitivity table can call
:func:`decide` on perturbed inputs.
"""

from __future__ import annotations

import math

from analyzer.advisor.economics import EconomicsInputs, OptionCost, option_costs
from analyzer.advisor.figures import (
    VERDICT_SCENARIO,
    BandwidthFigures,
    Check,
    Decision,
    Fact,
    Objective,
    Projection,
    ReplayFigures,
    ReuseFigures,
    ScenarioFigures,
    Thresholds,
    TraceFigures,
    Verdict,
)
from analyzer.replay.config import Scenario, Tier

# Why a break-even bandwidth is infinite (analyzer.cost.model.break_even_bandwidth_gbps).
NEVER_PAYS_WHY = "its prefill saves less time than placing loaded KV in HBM takes, at any bandwidth"


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
    pooled = replay.get(Scenario.POOLED)
    dram = replay.get(Scenario.LOCAL_DRAM)
    if base is None:
        return Projection()
    return Projection(
        pooled_ttft_reduction=(
            None if pooled is None else _reduction(pooled.ttft_mean_s, base.ttft_mean_s)
        ),
        pooled_throughput_gain=None if pooled is None else _gain(pooled, base),
        dram_ttft_reduction=(
            None if dram is None else _reduction(dram.ttft_mean_s, base.ttft_mean_s)
        ),
        dram_throughput_gain=None if dram is None else _gain(dram, base),
        pool_vs_dram_ttft=(
            None
            if pooled is None or dram is None
            else _reduction(pooled.ttft_mean_s, dram.ttft_mean_s)
        ),
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


def _sc(name: str, key: str) -> str:
    return f"replay.scenarios[{name}].{key}"


def _ec(name: str, key: str) -> str:
    return f"economics.options[{name}].{key}"


LABEL: dict[str, str] = {
    Scenario.LOCAL: "the baseline (HBM prefix cache only)",
    Scenario.LOCAL_DRAM: "local DRAM offload",
    Scenario.POOLED: "the pool",
}
VERDICT_OF: dict[str, str] = {v: k for k, v in VERDICT_SCENARIO.items()}


class _Why:
    """Reasons and the facts each one states, built together."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.facts: list[tuple[Fact, ...]] = []

    def add(self, text: str, *facts: Fact) -> None:
        self.texts.append(text)
        self.facts.append(tuple(facts))


def decide(
    trace: TraceFigures,
    reuse: ReuseFigures,
    bandwidth: BandwidthFigures | None,
    replay: ReplayFigures | None,
    th: Thresholds | None = None,
    economics: EconomicsInputs | None = None,
) -> Decision:
    th = th or Thresholds()
    missing = missing_data(trace, reuse, th)
    if missing:
        few = trace.n_requests < th.min_requests
        return Decision(
            verdict=Verdict.INSUFFICIENT_DATA,
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
            facts=tuple(() for _ in missing),
        )

    checks: list[Check] = []
    why = _Why()
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
    f_ceiling = Fact(
        "reuse.figures.ceiling_hit_rate",
        ceiling,
        "pct",
        ">=" if reuse_ok else "<",
        "options.thresholds.min_reuse",
        th.min_reuse,
    )
    if not reuse_ok:
        why.add(
            f"Prefix reuse is {f_ceiling.shown}, below the {_pct(th.min_reuse)} guideline: too "
            "little repeated prefill for pooling or offload to pay for themselves. Keep the "
            "engine's default HBM prefix cache.",
            f_ceiling,
        )
        return _finish(Verdict.NOT_WORTH_IT, why, checks, trace, reuse, bandwidth, replay, proj, th)

    # (2) bandwidth against break-even
    ok_by_role: dict[str, bool] = {}
    # A prefix whose prefill saves less than placing its loaded KV costs is never worth
    # loading: the break-even is infinite, and no tier passes at any bandwidth.
    never = bandwidth is not None and not math.isfinite(bandwidth.break_even_gbps)
    if bandwidth is not None:
        need = bandwidth.break_even_gbps * th.bandwidth_margin
        for role in (Tier.DRAM, Tier.POOL, Tier.NVME):
            tier = bandwidth.tier(role)
            if tier is None:
                continue
            ok = tier.bandwidth_gbps >= need
            label = {Tier.DRAM: "host DRAM", Tier.POOL: "pool link", Tier.NVME: "local NVMe"}[role]
            prefix = f"{label} ({tier.tier}) delivers {tier.bandwidth_gbps:.3g} GB/s; loading a "
            checks.append(
                Check(
                    2,
                    f"bandwidth: {label}",
                    ok,
                    tier.bandwidth_gbps,
                    None if never else need,
                    f"{prefix}{bandwidth.prefix_tokens:,}-token prefix never beats "
                    f"recomputing it: {NEVER_PAYS_WHY}."
                    if never
                    else f"{prefix}{bandwidth.prefix_tokens:,}-token prefix beats recomputing "
                    f"it above {bandwidth.break_even_gbps:.3g} GB/s "
                    f"({bandwidth.bytes_per_token:,} B/token x "
                    f"{bandwidth.prefill_tokens_per_s:,.0f} prefill tokens/s).",
                )
            )
            ok_by_role[role] = ok
    candidates: list[str] = [Scenario.LOCAL]
    if never:
        assert bandwidth is not None
        f_prefix = Fact("bandwidth.prefix_tokens", bandwidth.prefix_tokens, "tokens")
        why.add(
            f"Loading the log's median reusable prefix of {f_prefix.shown} never pays: "
            f"{NEVER_PAYS_WHY}. Neither local DRAM offload nor the pool is a candidate.",
            f_prefix,
        )
    for role, name in ((Tier.DRAM, Scenario.LOCAL_DRAM), (Tier.POOL, Scenario.POOLED)):
        if ok_by_role.get(role) is False and never:
            continue
        if ok_by_role.get(role) is False:
            assert bandwidth is not None
            tier = bandwidth.tier(role)
            assert tier is not None
            f_bw = Fact(
                f"bandwidth.tiers[{role}].bandwidth_gbps",
                tier.bandwidth_gbps,
                "gbps",
                "<",
                "bandwidth.break_even_gbps",
                bandwidth.break_even_gbps,
            )
            f_be = Fact("bandwidth.break_even_gbps", bandwidth.break_even_gbps, "gbps")
            what = "The pool link" if role == Tier.POOL else "Host DRAM"
            why.add(
                f"{what} ({f_bw.shown} per node) is slower than recomputing: loading a "
                f"{bandwidth.prefix_tokens:,}-token prefix pays only above {f_be.shown}, so "
                f"{LABEL[name]} is not a candidate.",
                f_bw,
                f_be,
            )
        elif replay is None or replay.get(name) is not None:
            candidates.append(name)

    if replay is None:
        if Scenario.POOLED in candidates and ok_by_role.get(Tier.POOL):
            why.add(
                "Reuse and bandwidth favour a pool, but no replay was run to project its "
                "latency and GPUs; treat this as a candidate for a pilot.",
                f_ceiling,
            )
            return _finish(
                Verdict.DEPLOY_POOLED, why, checks, trace, reuse, bandwidth, replay, proj, th
            )
        verdict = (
            Verdict.LOCAL_OFFLOAD_ONLY
            if Scenario.LOCAL_DRAM in candidates
            else Verdict.NOT_WORTH_IT
        )
        why.add(
            "No replay was run, so no gain is projected; host DRAM beats recompute, so local "
            "offload is the candidate for a pilot."
            if verdict == Verdict.LOCAL_OFFLOAD_ONLY
            else "No tier below HBM beats recompute: keep the HBM prefix cache only.",
            f_ceiling,
        )
        return _finish(verdict, why, checks, trace, reuse, bandwidth, replay, proj, th)

    # (3) value
    costs = option_costs(replay, economics) if economics is not None else {}
    priced = (
        th.objective == Objective.COST
        and economics is not None
        and economics.prices.gpu_hour is not None
        and all(
            costs.get(n) is not None and costs[n].total_usd_month is not None for n in candidates
        )
    )
    derived: list[tuple[str, float]] = []
    if th.objective == Objective.COST and not priced:
        if economics is None or economics.prices.gpu_hour is None:
            gpu = economics.gpu if economics is not None else "this GPU"
            why.add(
                f"No GPU price for {gpu}, so the GPUs an option saves cannot be priced: decided "
                "on mean TTFT instead (give --gpu-hour-usd to decide on cost)."
            )
        else:
            why.add(
                "The rate search did not give the GPUs every option needs (it was skipped, or "
                "an option cannot serve the load within the TTFT SLO): decided on mean TTFT "
                "instead."
            )
    if priced:
        chosen = _by_cost(candidates, costs, replay, th, why, checks, derived)
    else:
        chosen = _by_ttft(candidates, replay, th, why, checks)
    _latency_line(chosen, replay, why)
    if replay.nodes == 1 and replay.dram_scope == "node" and Scenario.POOLED in candidates:
        why.add(
            "All instances share one node and its host DRAM was modelled as one cache they "
            "share (--dram-scope node, a node-local shared store): a pool cannot add hits "
            "over it. Engines' own DRAM tiers (LMCache local CPU, HiCache L2) are private to "
            "each instance; describe that with --dram-scope instance."
        )
    return _finish(
        VERDICT_OF[chosen], why, checks, trace, reuse, bandwidth, replay, proj, th, tuple(derived)
    )


def _cost_fact(name: str, o: OptionCost) -> Fact:
    assert o.total_usd_month is not None
    return Fact(_ec(name, "total_usd_month"), o.total_usd_month, "usd")


def _gpus_fact(name: str, o: OptionCost) -> Fact:
    assert o.capacity.gpus_peak is not None
    return Fact(_ec(name, "gpus_at_peak_load"), float(o.capacity.gpus_peak), "count")


def _n_gpus(f: Fact, o: OptionCost) -> str:
    """``6 GPUs``, ``1 GPU``, ``at most 2 GPUs`` (the rate search's top multiple passed)."""
    bound = "at most " if o.capacity.bound == "at most" else ""
    return f"{bound}{f.shown} GPU{'' if f.value == 1 else 's'}"


def _by_cost(
    candidates: list[str],
    costs: dict[str, OptionCost],
    replay: ReplayFigures,
    th: Thresholds,
    why: _Why,
    checks: list[Check],
    derived: list[tuple[str, float]],
) -> str:
    """The cheapest candidate; a pool only when it is cheaper by the margin."""

    def total(n: str) -> float:
        t = costs[n].total_usd_month
        assert t is not None
        return t

    local = [n for n in (Scenario.LOCAL, Scenario.LOCAL_DRAM) if n in candidates]
    best_local = min(local, key=lambda n: (total(n), local.index(n)))
    base = costs[Scenario.LOCAL]
    margin = th.min_pool_saving * total(Scenario.LOCAL)
    derived.append(("pool_margin_usd_month", margin))
    chosen: str = best_local
    if Scenario.POOLED in candidates:
        saving = total(best_local) - total(Scenario.POOLED)
        derived.append(("pool_saving_vs_best_local_usd_month", saving))
        ok = saving >= margin and saving > 0
        checks.append(
            Check(
                3,
                "pool saving over the best local option (USD/month)",
                ok,
                saving,
                margin,
                f"The pool costs {_usd(total('pooled'))}/month against {_usd(total(best_local))} "
                f"for {LABEL[best_local]}; it must be cheaper by {_usd(margin)} "
                f"({100 * th.min_pool_saving:.0f}% of the baseline's {_usd(total('local'))}).",
            )
        )
        if ok:
            chosen = Scenario.POOLED
    if Scenario.LOCAL_DRAM in candidates:
        checks.append(
            Check(
                3,
                "local DRAM offload net value (USD/month)",
                (costs[Scenario.LOCAL_DRAM].net_usd_month or 0.0) > 0,
                costs[Scenario.LOCAL_DRAM].net_usd_month,
                0.0,
                f"Local DRAM offload: {costs['local+dram'].capacity.gpus_peak} GPUs at the peak "
                f"load against {base.capacity.gpus_peak} for the baseline, net "
                f"{_usd(costs['local+dram'].net_usd_month or 0.0)}/month.",
            )
        )
    c = costs[chosen]
    f_gpus = _gpus_fact(chosen, c)
    f_base_gpus = _gpus_fact(Scenario.LOCAL, base)
    f_total = _cost_fact(chosen, c)
    if chosen == Scenario.LOCAL:
        others = [n for n in candidates if n != Scenario.LOCAL]
        facts = [f_gpus, f_total]
        parts = []
        for n in others:
            o = costs[n]
            f_o = Fact(
                _ec(n, "total_usd_month"),
                total(n),
                "usd",
                ">=",
                _ec(Scenario.LOCAL, "total_usd_month"),
                total(Scenario.LOCAL),
            )
            f_og = _gpus_fact(n, o)
            facts += [f_o, f_og]
            parts.append(f"{LABEL[n]} {_n_gpus(f_og, o)} and {f_o.shown}/month")
        if Scenario.POOLED in others and total(Scenario.POOLED) < total(Scenario.LOCAL):
            # cheaper than the baseline, but not by the margin
            f_m = Fact("verdict.figures.pool_margin_usd_month", margin, "usd")
            f_s = Fact(
                "verdict.figures.pool_saving_vs_best_local_usd_month",
                total(best_local) - total(Scenario.POOLED),
                "usd",
                "<",
                "verdict.figures.pool_margin_usd_month",
                margin,
            )
            why.add(
                f"The pool would save only {f_s.shown}/month, less than the {f_m.shown} margin "
                f"({100 * th.min_pool_saving:.0f}% of the baseline's cost) that pays for "
                "running a distributed store.",
                f_s,
                f_m,
            )
        why.add(
            "No option lowers the monthly cost of serving the log's peak load within the TTFT "
            f"SLO: the baseline needs {_n_gpus(f_gpus, c)} ({f_total.shown}/month); "
            + ("; ".join(parts) if parts else "no other option is a candidate")
            + ". Keep the engine's HBM prefix cache.",
            *facts,
        )
        return chosen
    f_net = Fact(_ec(chosen, "net_usd_month"), c.net_usd_month or 0.0, "usd", ">", "", 0.0)
    f_added = Fact(_ec(chosen, "added_usd_month"), c.added_usd_month, "usd")
    f_saving = Fact(_ec(chosen, "gpu_saving_usd_month"), c.gpu_saving_usd_month or 0.0, "usd")
    added: dict[str, str] = {
        Scenario.POOLED: "memory, NICs and store servers",
        Scenario.LOCAL_DRAM: "host DRAM",
    }
    what = added[chosen]
    why.add(
        f"{LABEL[chosen][0].upper()}{LABEL[chosen][1:]} serves the log's peak load within the "
        f"p90 TTFT SLO on {_n_gpus(f_gpus, c)} instead of {_n_gpus(f_base_gpus, base)}: "
        f"{f_saving.shown}/month of GPUs saved against {f_added.shown}/month of {what}, "
        f"net {f_net.shown}/month.",
        f_gpus,
        f_base_gpus,
        f_saving,
        f_added,
        f_net,
    )
    if chosen == Scenario.POOLED and best_local != Scenario.LOCAL:
        f_l = Fact(
            _ec(best_local, "total_usd_month"),
            total(best_local),
            "usd",
            ">",
            _ec(Scenario.POOLED, "total_usd_month"),
            total(Scenario.POOLED),
        )
        why.add(
            f"It costs {f_total.shown}/month against {f_l.shown} for {LABEL[best_local]}, "
            f"cheaper by more than the {_usd(margin)} margin for operating a distributed store.",
            f_total,
            f_l,
        )
    if chosen == Scenario.LOCAL_DRAM and Scenario.POOLED in candidates:
        f_p = Fact(
            _ec(Scenario.POOLED, "total_usd_month"),
            total(Scenario.POOLED),
            "usd",
            ">",
            "verdict.figures.pool_threshold_usd_month",
            total(Scenario.LOCAL_DRAM) - margin,
        )
        derived.append(("pool_threshold_usd_month", total(Scenario.LOCAL_DRAM) - margin))
        why.add(
            f"The pool would cost {f_p.shown}/month against {f_total.shown} for local DRAM "
            f"offload: not cheaper by the {_usd(margin)} margin that pays for running a "
            "distributed store, so do not pool.",
            f_p,
            f_total,
        )
    return chosen


def _by_ttft(
    candidates: list[str],
    replay: ReplayFigures,
    th: Thresholds,
    why: _Why,
    checks: list[Check],
) -> str:
    """The lowest mean TTFT that keeps the rate served within the SLO."""
    base = replay.get(Scenario.LOCAL)
    assert base is not None

    def no_regression(s: ScenarioFigures) -> bool:
        g = _gain(s, base)
        return g is None or g >= 0.0

    chosen = Scenario.LOCAL
    dram = replay.get(Scenario.LOCAL_DRAM) if Scenario.LOCAL_DRAM in candidates else None
    pooled = replay.get(Scenario.POOLED) if Scenario.POOLED in candidates else None
    if dram is not None:
        red = _reduction(dram.ttft_mean_s, base.ttft_mean_s) or 0.0
        ok = red >= th.min_dram_gain and no_regression(dram)
        checks.append(
            Check(
                3,
                "local DRAM offload TTFT gain",
                ok,
                red,
                th.min_dram_gain,
                f"Local DRAM offload: mean TTFT {_pct(red)} below the baseline (worth configuring "
                f"from {_pct(th.min_dram_gain)}).",
            )
        )
        if ok:
            chosen = Scenario.LOCAL_DRAM
    if pooled is not None:
        ref = replay.get(chosen)
        assert ref is not None
        red = _reduction(pooled.ttft_mean_s, ref.ttft_mean_s) or 0.0
        need = th.min_pool_advantage if chosen == Scenario.LOCAL_DRAM else th.min_dram_gain
        ok = red >= need and no_regression(pooled)
        checks.append(
            Check(
                3,
                f"pool TTFT advantage over {LABEL[chosen]}",
                ok,
                red,
                need,
                f"Pooled mean TTFT {_pct(red)} below {LABEL[chosen]} (needed: {_pct(need)}).",
            )
        )
        if ok:
            chosen = Scenario.POOLED
        else:
            f_p = Fact(_sc(Scenario.POOLED, "ttft_s.mean"), pooled.ttft_mean_s, "ms")
            f_r = Fact(_sc(chosen, "ttft_s.mean"), ref.ttft_mean_s, "ms")
            why.add(
                f"The pool's mean TTFT ({f_p.shown}) is not at least {_pct(need)} below "
                f"{LABEL[chosen]}'s ({f_r.shown}), or it lowers the rate served within the "
                "SLO: its extra infrastructure is not justified.",
                f_p,
                f_r,
            )
    s = replay.get(chosen)
    assert s is not None
    f_c = Fact(_sc(chosen, "ttft_s.mean"), s.ttft_mean_s, "ms")
    f_b = Fact(_sc(Scenario.LOCAL, "ttft_s.mean"), base.ttft_mean_s, "ms")
    if chosen == Scenario.LOCAL:
        why.add(
            f"No option lowers mean TTFT enough to configure: the baseline's is {f_b.shown}. "
            "Keep the engine's HBM prefix cache.",
            f_b,
        )
    else:
        why.add(
            f"Objective TTFT: {LABEL[chosen]} gives the lowest mean TTFT, {f_c.shown} against "
            f"{f_b.shown} for the baseline, without lowering the rate served within the SLO.",
            Fact(
                _sc(chosen, "ttft_s.mean"),
                s.ttft_mean_s,
                "ms",
                "<",
                _sc(Scenario.LOCAL, "ttft_s.mean"),
                base.ttft_mean_s,
            ),
            f_b,
        )
    return chosen


def _latency_line(chosen: str, replay: ReplayFigures, why: _Why) -> None:
    """What the chosen option does to latency, in ms (also for the baseline: nothing)."""
    if chosen == Scenario.LOCAL:
        return
    s, b = replay.get(chosen), replay.get(Scenario.LOCAL)
    assert s is not None and b is not None
    f_m = Fact(_sc(chosen, "ttft_s.mean"), s.ttft_mean_s, "ms")
    f_bm = Fact(_sc(Scenario.LOCAL, "ttft_s.mean"), b.ttft_mean_s, "ms")
    f_p = Fact(_sc(chosen, "ttft_s.p90"), s.ttft_p90_s, "ms")
    f_bp = Fact(_sc(Scenario.LOCAL, "ttft_s.p90"), b.ttft_p90_s, "ms")
    why.add(
        f"Latency: mean TTFT {f_bm.shown} -> {f_m.shown}, p90 {f_bp.shown} -> {f_p.shown} "
        "(replay at the log's rate).",
        f_bm,
        f_m,
        f_bp,
        f_p,
    )


def _usd(x: float) -> str:
    return f"-${-x:,.0f}" if x < 0 else f"${x:,.0f}"


def _finish(
    verdict: str,
    why: _Why,
    checks: list[Check],
    trace: TraceFigures,
    reuse: ReuseFigures,
    bandwidth: BandwidthFigures | None,
    replay: ReplayFigures | None,
    proj: Projection,
    th: Thresholds,
    derived: tuple[tuple[str, float], ...] = (),
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
    if replay is None and verdict != Verdict.NOT_WORTH_IT:
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
        reasons=tuple(why.texts),
        checks=tuple(checks),
        confidence=level,
        confidence_notes=tuple(notes),
        projection=proj,
        facts=tuple(why.facts),
        derived=derived,
    )
