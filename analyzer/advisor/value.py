"""Step 4 of the decide stage: the value ranking of the candidates that met the SLO.

:func:`analyzer.advisor.decide.decide` calls one ranking per objective: by monthly cost
(a pool must beat the best local candidate by ``min_pool_saving``), by GPUs when no GPU
price is known, or by mean TTFT (``min_dram_gain``, ``min_pool_advantage``). Each one
records its reasons with the facts they state (:class:`analyzer.advisor.figures.Fact`);
the wording helpers those reasons share with the decide stage live here too.
"""

from __future__ import annotations

from analyzer.advisor.figures import Check, Fact, Thresholds
from analyzer.advisor.plan import Fleet
from analyzer.advisor.words import gpus, option_name
from analyzer.replay.config import Scenario

BASELINE = Scenario.LOCAL
LOCAL_OPTIONS = (Scenario.LOCAL, Scenario.LOCAL_DRAM, Scenario.LOCAL_DRAM_NVME)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _usd(x: float) -> str:
    return f"-${-x:,.0f}" if x < 0 else f"${x:,.0f}"


def _fl(name: str, key: str) -> str:
    """A fleet figure's path in the report."""
    return f"fleet[{name}].{key}"


def _reduction(new: float | None, base: float | None) -> float | None:
    if new is None or base is None or base <= 0:
        return None
    return 1.0 - new / base


class _Why:
    """Reasons and the facts each one states, built together."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.facts: list[tuple[Fact, ...]] = []

    def add(self, text: str, *facts: Fact) -> None:
        self.texts.append(text)
        self.facts.append(tuple(facts))


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _total(f: Fleet) -> float:
    t = f.money.total_usd_month
    assert t is not None
    return t


def _gpus_fact(name: str, f: Fleet) -> Fact:
    assert f.gpus is not None
    return Fact(_fl(name, "gpus"), float(f.gpus), "count")


def _n_gpus(fact: Fact) -> str:
    return gpus(round(fact.value))


def _by_cost(
    meeting: list[str],
    by: dict[str, Fleet],
    th: Thresholds,
    why: _Why,
    checks: list[Check],
    derived: list[tuple[str, float]],
) -> str:
    """The cheapest candidate; a pool only when cheaper by the margin."""
    local = [n for n in LOCAL_OPTIONS if n in meeting]
    order = [*LOCAL_OPTIONS, Scenario.POOLED]
    base = by.get(BASELINE)
    ref = BASELINE if BASELINE in meeting else (local[0] if local else meeting[0])
    margin = th.min_pool_saving * _total(by[ref])
    derived.append(("pool_margin_usd_month", margin))
    chosen = min(local, key=lambda n: (_total(by[n]), order.index(n))) if local else Scenario.POOLED
    best_local = chosen if local else None
    if Scenario.POOLED in meeting and best_local is not None:
        saving = _total(by[best_local]) - _total(by[Scenario.POOLED])
        derived.append(("pool_saving_vs_best_local_usd_month", saving))
        ok = saving >= margin and saving > 0
        checks.append(
            Check(
                4,
                "pool saving over the best local option (USD/month)",
                ok,
                saving,
                margin,
                f"The pooled KV store costs {_usd(_total(by[Scenario.POOLED]))} per month against "
                f"{_usd(_total(by[best_local]))} for {option_name(best_local)}; it must be "
                f"cheaper by {_usd(margin)} ({100 * th.min_pool_saving:.0f}% of the "
                f"{option_name(ref)}'s {_usd(_total(by[ref]))}).",
            )
        )
        if ok:
            chosen = Scenario.POOLED
    c = by[chosen]
    f_gpus = _gpus_fact(chosen, c)
    f_total = Fact(_fl(chosen, "money.total_usd_month"), _total(c), "usd")
    others = [n for n in meeting if n != chosen]
    if chosen == BASELINE:
        facts = [f_gpus, f_total]
        parts = []
        for n in others:
            f_o = Fact(
                _fl(n, "money.total_usd_month"),
                _total(by[n]),
                "usd",
                ">=",
                _fl(BASELINE, "money.total_usd_month"),
                _total(c),
            )
            f_og = _gpus_fact(n, by[n])
            facts += [f_o, f_og]
            parts.append(f"{option_name(n)} {_n_gpus(f_og)} and {f_o.shown} per month")
        if Scenario.POOLED in others and _total(by[Scenario.POOLED]) < _total(c):
            f_m = Fact("verdict.figures.pool_margin_usd_month", margin, "usd")
            f_s = Fact(
                "verdict.figures.pool_saving_vs_best_local_usd_month",
                _total(c) - _total(by[Scenario.POOLED]),
                "usd",
                "<",
                "verdict.figures.pool_margin_usd_month",
                margin,
            )
            why.add(
                f"The pooled KV store would save only {f_s.shown} per month, less than the "
                f"{f_m.shown} margin ({100 * th.min_pool_saving:.0f}% of the baseline's cost) "
                "that pays for running a distributed store.",
                f_s,
                f_m,
            )
        why.add(
            "No option lowers the monthly cost of serving the log's busiest load within the "
            f"TTFT SLO: the baseline needs {_n_gpus(f_gpus)} ({f_total.shown} per month); "
            + ("; ".join(parts) if parts else "no other option is a candidate")
            + ". Keep the engines' HBM prefix cache.",
            *facts,
        )
        return chosen
    added = {
        Scenario.POOLED: "memory, NICs and store servers",
        Scenario.LOCAL_DRAM: "host DRAM",
        Scenario.LOCAL_DRAM_NVME: "host DRAM and NVMe",
    }[chosen]
    f_added = Fact(_fl(chosen, "money.added_usd_month"), c.money.added_usd_month, "usd")
    if base is not None and base.meets_slo and base.gpus is not None:
        f_base = _gpus_fact(BASELINE, base)
        f_bt = Fact(
            _fl(BASELINE, "money.total_usd_month"),
            _total(base),
            "usd",
            ">",
            _fl(chosen, "money.total_usd_month"),
            _total(c),
        )
        why.add(
            f"{_cap(option_name(chosen))} serves the log's busiest load within the p90 TTFT SLO "
            f"on {_n_gpus(f_gpus)} where the baseline needs {_n_gpus(f_base)}: "
            f"{f_total.shown} per month, {f_added.shown} of it {added}, against {f_bt.shown} "
            "for the baseline.",
            f_gpus,
            f_base,
            f_total,
            f_added,
            f_bt,
        )
    else:
        why.add(
            f"{_cap(option_name(chosen))} serves the log's busiest load within the p90 TTFT SLO "
            f"on {_n_gpus(f_gpus)} for {f_total.shown} per month, {f_added.shown} of it {added}.",
            f_gpus,
            f_total,
            f_added,
        )
    if chosen == Scenario.POOLED and best_local is not None:
        f_l = Fact(
            _fl(best_local, "money.total_usd_month"),
            _total(by[best_local]),
            "usd",
            ">",
            _fl(Scenario.POOLED, "money.total_usd_month"),
            _total(c),
        )
        f_m = Fact("verdict.figures.pool_margin_usd_month", margin, "usd")
        why.add(
            f"It costs {f_total.shown} per month against {f_l.shown} for "
            f"{option_name(best_local)}: cheaper by more than the {f_m.shown} margin for "
            "operating a distributed store.",
            f_total,
            f_l,
            f_m,
        )
    if chosen in LOCAL_OPTIONS and Scenario.POOLED in meeting:
        threshold = _total(c) - margin
        derived.append(("pool_threshold_usd_month", threshold))
        f_p = Fact(
            _fl(Scenario.POOLED, "money.total_usd_month"),
            _total(by[Scenario.POOLED]),
            "usd",
            ">",
            "verdict.figures.pool_threshold_usd_month",
            threshold,
        )
        f_m = Fact("verdict.figures.pool_margin_usd_month", margin, "usd")
        why.add(
            f"The pooled KV store would cost {f_p.shown} per month against {f_total.shown} for "
            f"{option_name(chosen)}: not cheaper by the {f_m.shown} margin that pays for "
            "running a distributed store, so do not pool.",
            f_p,
            f_total,
            f_m,
        )
    if chosen == Scenario.LOCAL_DRAM_NVME and Scenario.LOCAL_DRAM in meeting:
        f_d = Fact(
            _fl(Scenario.LOCAL_DRAM, "money.total_usd_month"),
            _total(by[Scenario.LOCAL_DRAM]),
            "usd",
            ">",
            _fl(chosen, "money.total_usd_month"),
            _total(c),
        )
        why.add(
            f"The NVMe tier holds the working set for less than host DRAM would: "
            f"{f_total.shown} per month against {f_d.shown} for {option_name(Scenario.LOCAL_DRAM)}.",
            f_total,
            f_d,
        )
    return chosen


def _by_gpus(
    meeting: list[str], by: dict[str, Fleet], th: Thresholds, why: _Why, checks: list[Check]
) -> str:
    """Without a GPU price: the fewest GPUs (ties to the simpler option); a pool only
    with at least one GPU fewer than the best local option."""
    gpu = next((p.gpu for f in by.values() for p in f.plans), "this GPU")
    why.add(
        f"No GPU price for {gpu}, so the options are compared on the GPUs each needs, not on "
        "money (give --gpu-hour-usd to decide on cost)."
    )
    order = [*LOCAL_OPTIONS, Scenario.POOLED]

    def n(o: str) -> int:
        g = by[o].gpus
        assert g is not None
        return g

    local = [o for o in LOCAL_OPTIONS if o in meeting]
    chosen = min(local, key=lambda o: (n(o), order.index(o))) if local else Scenario.POOLED
    if Scenario.POOLED in meeting and local and n(Scenario.POOLED) < n(chosen):
        chosen = Scenario.POOLED
    f = _gpus_fact(chosen, by[chosen])
    why.add(
        f"{_cap(option_name(chosen))} needs the fewest GPUs for the busiest load within the "
        f"SLO: {_n_gpus(f)}.",
        f,
    )
    checks.append(
        Check(4, "fewest GPUs", True, f.value, None, f"{option_name(chosen)}: {_n_gpus(f)}")
    )
    return chosen


def _by_ttft(
    meeting: list[str], by: dict[str, Fleet], th: Thresholds, why: _Why, checks: list[Check]
) -> str:
    """The lowest mean TTFT, every option on at least the baseline's GPUs."""

    def mean(o: str) -> float:
        t = by[o].ttft
        assert t is not None and t.mean_s is not None
        return t.mean_s

    chosen = BASELINE if BASELINE in meeting else meeting[0]
    for o in (Scenario.LOCAL_DRAM, Scenario.LOCAL_DRAM_NVME):
        if o not in meeting or chosen == o:
            continue
        red = _reduction(mean(o), mean(chosen)) or 0.0
        ok = red >= th.min_dram_gain
        checks.append(
            Check(
                4,
                f"{option_name(o)} TTFT gain",
                ok,
                red,
                th.min_dram_gain,
                f"{_cap(option_name(o))}: mean TTFT {_pct(red)} below {option_name(chosen)} "
                f"(worth configuring from {_pct(th.min_dram_gain)}).",
            )
        )
        if ok:
            chosen = o
    if Scenario.POOLED in meeting and chosen != Scenario.POOLED:
        red = _reduction(mean(Scenario.POOLED), mean(chosen)) or 0.0
        need = th.min_pool_advantage if chosen != BASELINE else th.min_dram_gain
        ok = red >= need
        checks.append(
            Check(
                4,
                f"pool TTFT advantage over {option_name(chosen)}",
                ok,
                red,
                need,
                f"Pooled mean TTFT {_pct(red)} below {option_name(chosen)} (needed: {_pct(need)}).",
            )
        )
        if ok:
            chosen = Scenario.POOLED
        else:
            f_p = Fact(_fl(Scenario.POOLED, "ttft_s.mean"), mean(Scenario.POOLED), "ms")
            f_r = Fact(_fl(chosen, "ttft_s.mean"), mean(chosen), "ms")
            why.add(
                f"The pooled KV store's mean TTFT ({f_p.shown}) is not at least {_pct(need)} "
                f"below {option_name(chosen)}'s ({f_r.shown}): its extra infrastructure is not "
                "justified.",
                f_p,
                f_r,
            )
    f_c = Fact(_fl(chosen, "ttft_s.mean"), mean(chosen), "ms")
    if chosen == BASELINE:
        why.add(
            f"No option lowers mean TTFT enough to configure: the baseline's is {f_c.shown}. "
            "Keep the engines' HBM prefix cache.",
            f_c,
        )
    elif BASELINE in meeting:
        f_b = Fact(_fl(BASELINE, "ttft_s.mean"), mean(BASELINE), "ms")
        why.add(
            f"Objective TTFT: {option_name(chosen)} gives the lowest mean TTFT, {f_c.shown} "
            f"against {f_b.shown} for the baseline on as many GPUs.",
            Fact(f_c.figure, f_c.value, "ms", "<", f_b.figure, f_b.value),
            f_b,
        )
    return chosen


def _latency_line(chosen: str, by: dict[str, Fleet], why: _Why) -> None:
    """What the chosen option does to latency at its size, in ms (nothing for the
    baseline itself)."""
    if chosen == BASELINE:
        return
    s, b = by[chosen], by.get(BASELINE)
    if s.ttft is None or b is None or b.ttft is None or not b.meets_slo:
        return
    if None in (s.ttft.mean_s, s.ttft.p90_s, b.ttft.mean_s, b.ttft.p90_s):
        return
    f_bm = Fact(_fl(BASELINE, "ttft_s.mean"), b.ttft.mean_s or 0.0, "ms")
    f_m = Fact(_fl(chosen, "ttft_s.mean"), s.ttft.mean_s or 0.0, "ms")
    f_bp = Fact(_fl(BASELINE, "ttft_s.p90"), b.ttft.p90_s or 0.0, "ms")
    f_p = Fact(_fl(chosen, "ttft_s.p90"), s.ttft.p90_s or 0.0, "ms")
    why.add(
        f"Latency at the busiest load, each option on its planned GPUs: mean TTFT "
        f"{f_bm.shown} for the baseline, {f_m.shown} for {option_name(chosen)}; p90 "
        f"{f_bp.shown} and {f_p.shown}.",
        f_bm,
        f_m,
        f_bp,
        f_p,
    )
