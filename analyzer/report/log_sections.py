"""The report's sections on what the log shows: key figures, the verdict, prefix reuse
(with the shared prefixes described by what is known of them), the models, the
engine's events, measured against projected, bandwidth against break-even, and each
option's replay. Each builds a :class:`~analyzer.report.cells.Section` from the
document's typed view, never its keys.
"""

from __future__ import annotations

from collections.abc import Sequence

from analyzer.advisor.words import count
from analyzer.replay.config import Scenario
from analyzer.replay.miniature import describe
from analyzer.report.cells import (
    TIER_LABEL,
    Section,
    Table,
    check_value,
    gb,
    gbps,
    ms,
    num,
    pct,
    threshold_pct,
    usd,
)
from analyzer.report.figures import SCENARIO_ORDER
from analyzer.report.plan_views import PlanView, ReportView
from analyzer.report.schema import NotApplicable
from analyzer.report.summary import (
    OPTION_LABEL,
    known,
    summary_sentences,
)
from analyzer.report.views import TopPrefixView, TtftSecondsView
from analyzer.reuse.records import models_words, tenants_words


def _ttft(doc: ReportView, name: Scenario) -> TtftSecondsView | None:
    s = doc.scenarios.get(name)
    return None if s is None else s.ttft_s


def key_figures(doc: ReportView) -> Table:
    t = doc.trace
    rf = doc.reuse.figures
    bw = doc.bandwidth
    rows = [
        ["Requests", num(t.n_requests), f"{num(t.duration_s)} s of traffic"],
        [
            "Prompt tokens",
            num(t.prompt_tokens_total),
            f"mean {num(t.mean_prompt_tokens)} per request",
        ],
    ]
    tk = t.tokenization
    if tk.tokenizer:
        rows.append(
            [
                "Tokens counted with",
                tk.tokenizer,
                f"template {tk.template or 'none'} (--tokenizer DIR: the served "
                "model's own tokenizer and chat template)",
            ]
        )
    if rf.measurable:
        rows += [
            [
                "Prefix reuse ceiling (steady state)",
                pct(rf.ceiling_hit_rate),
                f"cold start {pct(rf.cold_ceiling_hit_rate)}; warm-up {pct(rf.warmup)}",
            ],
            [
                "Median reusable prefix",
                rf.median_prefix_tokens.short
                if isinstance(rf.median_prefix_tokens, NotApplicable)
                else f"{num(rf.median_prefix_tokens)} tokens",
                rf.median_prefix_tokens.reason
                if isinstance(rf.median_prefix_tokens, NotApplicable)
                else "token-weighted",
            ],
        ]
    if bw is not None:
        rng = None if doc.uncertainty is None else doc.uncertainty.break_even_gbps
        be = bw.break_even_gbps
        rows.append(
            [
                "Break-even bandwidth",
                gbps(be)
                + (
                    f" (range {num(rng.low)}-{num(rng.high)} GB/s)"
                    if rng is not None and not isinstance(rng, NotApplicable)
                    else ""
                ),
                f"at a {num(bw.prefix_tokens)}-token prefix"
                + (f": {be.reason}" if isinstance(be, NotApplicable) else ""),
            ]
        )
        for tier in bw.tiers:
            rows.append(
                [
                    TIER_LABEL.get(tier.role, tier.role) + " bandwidth",
                    gbps(tier.bandwidth_gbps),
                    tier.tier,
                ]
            )
    for name in (Scenario.LOCAL, Scenario.LOCAL_DRAM, Scenario.LOCAL_DRAM_NVME, Scenario.POOLED):
        f = doc.fleet.get(name)
        ft, fg = (None, None) if f is None else (known(f.ttft_s), known(f.gpus))
        if f is None or ft is None or fg is None:
            continue
        total = f.money.total_usd_month
        rows.append(
            [
                f"{OPTION_LABEL[name]}, as planned",
                f"{count(fg, 'GPU')}, {ms(ft.mean)} mean, {ms(ft.p90)} p90",
                "replayed at that size and the busiest load; "
                + (total.short if isinstance(total, NotApplicable) else f"{usd(total)} per month"),
            ]
        )
    if rf.knee_tokens:
        bpt = (doc.cost.bytes_per_token if doc.cost is not None else 0) or 0
        knee = rf.knee_tokens
        rows.append(
            [
                f"Knee of the hit-ratio curve ({100 * (rf.knee_fraction or 0.9):.0f}% of ceiling)",
                f"{num(knee)} tokens",
                f"{num(knee * bpt / 1e9)} GB / {num(knee * bpt / 2**30)} GiB",
            ]
        )
    return Table(["Figure", "Value", "Note"], rows)


def _scenario_key(name: str) -> tuple[int, str]:
    return (SCENARIO_ORDER.index(name) if name in SCENARIO_ORDER else len(SCENARIO_ORDER), name)


def scenario_table(doc: ReportView) -> Table | None:
    """Each option's replay at its planned size and the busiest load (the primary
    model's, for a log of several)."""
    sc = doc.scenarios
    if not sc:
        return None
    rows = []
    for name, s in sorted(sc.items(), key=lambda kv: _scenario_key(kv[0])):
        t = s.ttft_s
        n = s.rest.get("instances")
        rows.append(
            [
                OPTION_LABEL.get(name, name),
                num(n) if isinstance(n, int | float) else "-",
                pct(s.hit_rate),
                " / ".join(
                    f"{k.upper() if k in ('hbm', 'dram') else k} {pct(v)}"
                    for k, v in s.hit_rate_by_tier.items()
                    if v
                ),
                ms(t.mean),
                ms(t.p50),
                ms(t.p90),
                ms(t.p99),
                num(s.prefill_gpu_s),
                gb(s.network_bytes),
            ]
        )
    return Table(
        [
            "Option",
            "Instances",
            "Hit rate",
            "By tier",
            "Mean TTFT",
            "p50 TTFT",
            "p90 TTFT",
            "p99 TTFT",
            "Prefill GPU-seconds",
            "Network traffic",
        ],
        rows,
    )


def summary_of(doc: ReportView) -> list[str]:
    return list(doc.summary or summary_sentences(doc))


def verdict_section(doc: ReportView) -> Section:
    v = doc.verdict
    verdict = Section("verdict", "Verdict")
    verdict.paragraphs += list(v.reasons)
    verdict.paragraphs.append(v.confidence_statement)
    if v.checks:
        verdict.tables.append(
            Table(
                ["Step", "Check", "Result", "Value", "Threshold"],
                [
                    [
                        str(c.step),
                        c.name,
                        {True: "pass", False: "fail", None: "n/a"}[c.passed],
                        check_value(c.name, c.value),
                        check_value(c.name, c.threshold),
                    ]
                    for c in v.checks
                ],
            )
        )
        verdict.paragraphs += [c.text for c in v.checks if c.text not in " ".join(v.reasons)]
    return verdict


def reuse_section(doc: ReportView) -> Section:
    reuse = doc.reuse.analysis
    rf = doc.reuse.figures
    rs = Section("reuse", "Prefix reuse")
    if not rf.measurable:
        rs.paragraphs.append(f"Reuse cannot be measured: {rf.reason or 'no data'}.")
        return rs
    rs.paragraphs.append(
        f"The guideline is at least {threshold_pct(doc.options.thresholds.min_reuse)} "
        "steady-state prefix reuse: below it, the prefill a pool saves cannot pay for the "
        "pool's memory, network and operations."
    )
    rs.charts += ["hit_ratio", "sources"]
    curve = (reuse.curves or {}).get("lru") or ()
    knees = reuse.knees or {}
    if knees:
        rs.tables.append(
            Table(
                ["Share of ceiling", "Capacity (tokens)", "GB", "GiB"],
                [
                    [
                        f"{100 * float(k):.0f}%",
                        num(x.capacity_tokens),
                        num(x.capacity_gb),
                        num(x.capacity_gib),
                    ]
                    for k, x in knees.items()
                ],
            )
        )
    elif curve:
        rs.tables.append(
            Table(
                ["Capacity (tokens)", "Hit rate"],
                [
                    [num(p.capacity_tokens), pct(p.hit_rate)]
                    for p in curve[:: max(1, len(curve) // 8)]
                ],
            )
        )
    shares = (reuse.sources.share_of_prompt if reuse.sources is not None else None) or {}
    if shares:
        rs.tables.append(
            Table(
                ["Source", "Share of prompt tokens"],
                [[k.replace("_", " "), pct(x)] for k, x in shares.items()],
            )
        )
    by_tokens = reuse.top_prefixes.by_volume if reuse.top_prefixes is not None else None
    if by_tokens:
        rs.tables.append(top_prefixes_table(by_tokens[:5]))
        if not any(p.preview for p in by_tokens):
            rs.paragraphs.append(
                "The most reused prefixes, by the prompt tokens their reuse saves. Their text "
                "is not kept (--show-previews keeps a preview); what is known is their "
                "length, how many requests reused them, and how many tenants and which "
                "models sent them."
            )
    return rs


def top_prefixes_table(prefixes: Sequence[TopPrefixView]) -> Table:
    """Shared prefixes as what is known of them: length, requests, tenants (a count),
    models, and the text only where the log kept a preview."""
    previews = any(p.preview for p in prefixes)
    return Table(
        ["Shared prefix", "Tokens", "Requests", "Tenants", "Models", "Reused tokens"],
        [
            [
                str(p.preview)[:80] if previews and p.preview else f"#{k}",
                num(p.prefix_tokens),
                num(p.requests),
                tenants_words(p.tenants),
                models_words(p.models or ()),
                num(p.reused_tokens),
            ]
            for k, p in enumerate(prefixes, 1)
        ],
    )


def models_section(doc: ReportView) -> Section | None:
    md = doc.models
    per = [m for m in md.per_model or () if m.ceiling_hit_rate is not None]
    if not (per or doc.warnings):
        return None
    s = Section("models", "Models in the log")
    s.paragraphs += list(doc.warnings)
    if per:
        option = doc.verdict.scenario or Scenario.LOCAL
        plans = {p.served_as: p for p in doc.plans if p.option == option}
        s.paragraphs.append(
            "Each model is planned as itself, on GPUs of its own (engines serve one model "
            f"each); the {OPTION_LABEL.get(option, option)} plan of each is below, and the "
            "fleet's counts and money are their sums."
        )
        rows = []
        for m in per:
            p = plans.get(m.model)
            rows.append(
                [
                    m.model,
                    m.catalog_id or "-",
                    num(m.requests),
                    pct(m.ceiling_hit_rate),
                    num(m.footprint_gb),
                    "-" if p is None else f"{p.tp} x {p.gpu}",
                    _plan_gpus(p),
                    _plan_ttft(p),
                ]
            )
        s.tables.append(
            Table(
                [
                    "Model",
                    "Catalog",
                    "Requests",
                    "Reuse ceiling",
                    "Working set GB",
                    "TP x GPU",
                    "GPUs (instances)",
                    "Mean / p90 TTFT",
                ],
                rows,
            )
        )
        s.paragraphs.append(md.shared_pool_note or "")
    return s


def _plan_gpus(p: PlanView | None) -> str:
    if p is None:
        return "-"
    if isinstance(p.gpus, NotApplicable):
        return p.gpus.short
    return f"{count(p.gpus, 'GPU')} ({count(known(p.instances) or 0, 'instance')})"


def _plan_ttft(p: PlanView | None) -> str:
    if p is None:
        return "-"
    if isinstance(p.ttft_s, NotApplicable):
        return p.ttft_s.short
    return "-" if p.ttft_s is None else f"{ms(p.ttft_s.mean)} / {ms(p.ttft_s.p90)}"


def engine_section(doc: ReportView) -> Section | None:
    ev = doc.engine_events
    if ev is None:
        return None
    s = Section("engine-events", "What the engine's KV events show")
    s.paragraphs.append(
        f"The input is a KV-event recording of {num(ev.engines)} engine(s): "
        f"{num(ev.batches)} event batches over {num(ev.span_s)} s. Requests are rebuilt from "
        f"the blocks each stored ({num(ev.requests)} requests, blocks of "
        f"{num(ev.block_size)} tokens): the engine found {pct(ev.hit_rate)} of their "
        f"{num(ev.prompt_tokens)} tokens already cached, its own measured prefix-cache hit "
        "rate. Below, the cache's measured occupancy per medium (GPU: the HBM prefix cache)."
    )
    s.tables.append(
        Table(
            [
                "Medium",
                "Block",
                "Peak blocks",
                "Peak tokens",
                "Peak GB",
                "Mean blocks",
                "Stored",
                "Evicted",
                "Evictions/s",
                "Median lifetime (s)",
            ],
            [
                [
                    m.medium,
                    num(m.block_size),
                    num(m.peak_blocks),
                    num(m.peak_tokens),
                    "-" if m.peak_gb is None else num(m.peak_gb),
                    num(m.mean_blocks),
                    num(m.stored_blocks),
                    num(m.removed_blocks),
                    num(m.evictions_per_s),
                    "-" if m.median_lifetime_s is None else num(m.median_lifetime_s),
                ]
                for m in ev.media
            ],
        )
    )
    s.charts.append("engine_occupancy")
    if ev.clears:
        s.paragraphs.append(f"The engine cleared its cache {num(ev.clears)} time(s).")
    if ev.gaps or not ev.complete:
        s.paragraphs.append(
            f"The stream had {num(ev.gaps)} sequence gap(s); {num(ev.lost_batches)} batches "
            "were lost (not replayed)"
            + ("" if ev.complete else ", and a recording ends without its trailer")
            + ": the figures miss what they held."
        )
    return s


def measured_section(doc: ReportView) -> Section | None:
    mp = doc.measured_vs_projected
    if mp is None:
        return None
    me = mp.measured
    s = Section("measured", "Measured against projected")
    excluded = me.excluded_requests or 0
    if me.requests:
        s.paragraphs.append(
            f"The log's responses carry cached_tokens for {num(me.requests)} of the "
            f"{num(me.steady_requests)} steady-state requests: today's deployment served "
            f"{pct(me.hit_rate)} of their prompt tokens from its prefix cache "
            "(sum of cached_tokens / sum of prompt_tokens)."
        )
    if excluded:
        s.paragraphs.append(
            f"{num(excluded)} responses claim more cached tokens than their prompt holds "
            "and are left out of the measured rate."
            + ("" if me.requests else " No response's cached_tokens could be used.")
        )
    pr = mp.projected
    if pr is not None:
        s.tables.append(
            Table(
                ["", "Hit rate", "Instances", "Router", "HBM cache / instance (tokens)"],
                [
                    ["measured (log)", pct(me.hit_rate), "", "", ""],
                    [
                        "projected (replay of today's deployment)",
                        pct(pr.hit_rate),
                        num(pr.instances),
                        pr.router,
                        num(pr.local_capacity_tokens_per_instance),
                    ],
                ],
            )
        )
        if mp.within_tolerance:
            s.paragraphs.append(
                f"They agree within {pct(mp.tolerance or 0)}: the replay describes today's engines."
            )
        elif mp.fitted_local_capacity_tokens_per_instance is not None:
            s.paragraphs.append(
                f"They differ by more than {pct(mp.tolerance or 0)}; an effective HBM cache of "
                f"{num(mp.fitted_local_capacity_tokens_per_instance)} tokens per instance "
                f"reproduces the measured rate ({pct(mp.fitted_hit_rate)} replayed)."
            )
        else:
            s.paragraphs.append(mp.fit_note or "")
    by_model = me.by_model or {}
    if len(by_model) > 1:
        s.tables.append(
            Table(
                ["Model", "Requests", "Measured hit rate"],
                [[k, num(v.requests), pct(v.hit_rate)] for k, v in by_model.items()],
            )
        )
    return s


def bandwidth_section(doc: ReportView) -> Section | None:
    bw = doc.bandwidth
    if bw is None:
        return None
    b = Section("bandwidth", "Bandwidth against break-even")
    if isinstance(bw.break_even_gbps, NotApplicable):
        b.paragraphs.append(
            f"At the {num(bw.prefix_tokens)}-token reusable prefix, "
            f"{bw.break_even_gbps.reason}: no tier's bandwidth makes loading it pay. The "
            "break-even falls as prefixes grow because attention is quadratic; the table "
            "below shows the prefix length from which loading pays."
        )
    else:
        b.paragraphs.append(
            f"Loading a {num(bw.prefix_tokens)}-token prefix beats recomputing it above "
            f"{num(bw.break_even_gbps)} GB/s ({num(bw.bytes_per_token)} bytes per token "
            f"moved x {num(bw.prefill_tokens_per_s)} prefill tokens/s). The break-even falls "
            "as prefixes grow because attention is quadratic."
        )
    u = doc.uncertainty
    if (
        u is not None
        and not isinstance(u.break_even_gbps, NotApplicable)
        and not isinstance(u.prefill_tokens_per_s, NotApplicable)
    ):
        be, rate, band = u.break_even_gbps, u.prefill_tokens_per_s, u.band
        b.paragraphs.append(
            f"By the cost model's measured error ({band.basis}; {band.kind}), the "
            f"break-even lies between {num(be.low)} and {num(be.high)} GB/s and the "
            f"prefill rate between {num(rate.low)} and {num(rate.high)} tokens/s"
            + (
                "; this deployment is outside what the reference table measured, so the "
                "range may be too narrow."
                if band.extrapolated
                else "."
            )
            + " `kvpool cost check` prints the table behind it."
        )
    b.charts.append("break_even")
    b.tables.append(
        Table(
            ["Prefix (tokens)", "Break-even (GB/s)"],
            [
                [
                    num(p.prefix_tokens),
                    "never (loading cannot win)"
                    if isinstance(p.break_even_gbps, NotApplicable)
                    else num(p.break_even_gbps),
                ]
                for p in bw.curve[::3]
            ],
        )
    )
    return b


def scenarios_section(doc: ReportView) -> Section | None:
    st = scenario_table(doc)
    if st is None or doc.replay is None:
        return None
    s = Section("scenarios", "Each option replayed at its planned size")
    cl = doc.replay.cluster
    aggregated = cl.rest.get("serving") == "aggregated"
    s.paragraphs.append(
        f"Every option sized by replaying it: the fewest instances of {cl.tp} x {cl.gpu} "
        f"whose replay keeps p90 TTFT within {ms(cl.ttft_slo_s)} at the busiest load, "
        f"router {cl.router}. These are those replays. "
        + (
            "Each instance runs prefill and decode in one continuous batch, as vLLM and "
            "SGLang serve: TTFT is queueing + loads + prefill chunks between decode steps."
            if aggregated
            else "Prefill instances only, decode not modelled: TTFT is queueing + loads + prefill."
        )
    )
    mini = doc.replay.miniature
    if mini:
        s.paragraphs.append(describe(dict(mini)))
    s.charts += ["ttft", "tier_hits", "network"]
    s.tables.append(st)
    return s
