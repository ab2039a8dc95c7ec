"""HTML and Markdown reports, both rendered from the ``kvpool.report/3`` document.

Both follow one outline (:func:`sections`): verdict first, key figures, reuse (curve
and sources), bandwidth (break-even), scenarios, sensitivity, sized recommendation
and settings, gate plan, assumptions with sources, inputs. Tables are built once as
lists of rows and formatted by each renderer, so the two carry the same content;
the HTML adds the charts as inline SVG. Everything here reads the document's typed
view (:class:`analyzer.report.document.Report`), never its JSON keys.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from analyzer.advisor.figures import Undefined, Verdict
from analyzer.advisor.words import count
from analyzer.quoting import md_code, md_prose, md_text, prose_parts, scrub
from analyzer.replay.config import Scenario, Tier
from analyzer.report.document import NotApplicable, PlanView, Report, TopPrefix, TtftSeconds
from analyzer.report.figures import SCENARIO_ORDER, VERDICT_COLOR, VERDICT_TEXT
from analyzer.report.summary import (
    GLOSSARY,
    OPTION_LABEL,
    economics_table,
    glossary_rows,
    isolation_products_table,
    isolation_table,
    known,
    price_table,
    side_by_side_table,
    summary_sentences,
    undefined_notes,
)
from analyzer.reuse.records import models_words, tenants_words


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x: float | NotApplicable | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, NotApplicable):
        return x.short
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def threshold_pct(value: float) -> str:
    """A decision threshold of this report's run (``options.thresholds``) as "25%"."""
    return f"{100 * value:.0f}%"


def gb(n_bytes: float | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / 1e9:,.2f} GB"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:,.0f} ms"


def gbps(x: float | NotApplicable | None) -> str:
    """A bandwidth in GB/s with its Gb/s (bits) beside it."""
    if x is None or isinstance(x, NotApplicable):
        return num(x)
    return f"{num(x)} GB/s ({num(8 * x)} Gb/s)"


def usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"-${-x:,.0f}" if x < 0 else f"${x:,.0f}"


TIER_LABEL = {Tier.DRAM: "Host DRAM", Tier.POOL: "Pool link", Tier.NVME: "Local NVMe"}


def check_value(name: str, x: float | None) -> str:
    """A decision check's value in its unit: money, bandwidth or a percentage."""
    if x is None:
        return "-"
    if "USD" in name:
        return usd(x)
    if name.startswith("bandwidth"):
        return gbps(x)
    return pct(x)


def criterion_value(metric: str, x: float | None) -> str:
    """A gate threshold or projection in its unit."""
    if x is None:
        return "-"
    if metric.endswith("_s"):
        return ms(x)
    if metric.endswith("_h"):
        return f"{x:g} h"
    if metric.endswith("_tokens"):
        return f"{x:,.0f} tokens"
    if metric in ("p99_ttft_ratio", "p99_drift"):
        return f"{x:.2f}x"
    if metric == "throughput_gain":
        return f"{100 * abs(x):.1f}% {'more' if x >= 0 else 'less'}"
    return pct(x)


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    id: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)  # chart names
    code: list[tuple[str, str, str]] = field(default_factory=list)  # (title, lang, text)
    links: list[tuple[str, str]] = field(default_factory=list)  # (relative path, note)


def _ttft(doc: Report, name: Scenario) -> TtftSeconds | None:
    s = doc.scenarios.get(name)
    return None if s is None else s.ttft_s


def key_figures(doc: Report) -> Table:
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


def scenario_table(doc: Report) -> Table | None:
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
                "-" if n is None else num(n),
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


def summary_of(doc: Report) -> list[str]:
    return list(doc.summary or summary_sentences(doc))


def _verdict_section(doc: Report) -> Section:
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


def _reuse_section(doc: Report) -> Section:
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


def top_prefixes_table(prefixes: Sequence[TopPrefix]) -> Table:
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


def _models_section(doc: Report) -> Section | None:
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


def _engine_section(doc: Report) -> Section | None:
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


def _measured_section(doc: Report) -> Section | None:
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


def _bandwidth_section(doc: Report) -> Section | None:
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


def _scenarios_section(doc: Report) -> Section | None:
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
        from analyzer.replay.miniature import describe

        s.paragraphs.append(describe(dict(mini)))
    s.charts += ["ttft", "tier_hits", "network"]
    s.tables.append(st)
    return s


def _economics_section(doc: Report) -> Section | None:
    et = economics_table(doc)
    econ = doc.economics
    if econ is None:
        return None
    load = econ.load
    mean_rps, peak_rps, window_s, factor = (
        (None, None, None, None)
        if load is None
        else (load.mean_rps, load.peak_rps, load.peak_window_s, load.peak_factor)
    )
    s = Section("economics", "GPUs and money")
    if not et:
        # Nothing was sized: say why, and what the load is, without a table of dashes.
        if isinstance(mean_rps, NotApplicable):
            s.paragraphs.append(f"The log has no load to size for: {mean_rps.reason}.")
        elif mean_rps is not None:
            s.paragraphs.append(
                f"The log's load: {num(mean_rps)} requests/s on average, {num(peak_rps)} "
                f"requests/s in its busiest {num(window_s)} s window."
            )
        if not doc.options.size_search:
            s.paragraphs.append(
                f"No option has GPUs, TTFT or money: {Undefined.SIZE_SEARCH_OFF.words}."
            )
        elif not s.paragraphs:
            return None
        pt = price_table(doc)
        if pt:
            s.tables.append(Table(*pt))
        return s
    if isinstance(mean_rps, NotApplicable):
        s.paragraphs.append(
            f"Each option's plan: {mean_rps.reason}, so the log is replayed as it is, every "
            "request at once."
        )
    else:
        s.paragraphs.append(
            f"Each option's plan: the fewest GPUs whose replay keeps p90 TTFT within the SLO "
            f"at the busiest load, {num(peak_rps)} requests/s in the busiest {num(window_s)} s "
            f"window ({num(factor)} x the log's mean of {num(mean_rps)} requests/s): the log "
            "replayed with its gaps shortened to that rate. Money is for exactly those GPUs, "
            "their nodes and what the option adds on them."
        )
    arr = doc.arrivals
    if arr and arr.get("coarse"):
        s.paragraphs.append(arrivals_words(arr))
    aggregated = doc.replay is not None and doc.replay.cluster.rest.get("serving") == "aggregated"
    if aggregated:
        s.paragraphs.append(
            "These are whole serving GPUs: the replay ran each instance's prefill and decode "
            "in one continuous batch (aggregated serving), so the GPUs saved are saved outright."
        )
    else:
        s.paragraphs.append(
            "Decode is not modelled: these are prefill GPUs, as in a disaggregated prefill "
            "pool (Mooncake, vLLM and SGLang prefill/decode disaggregation). In an aggregated "
            "deployment the saving is on prefill GPU time only: about "
            f"{pct(econ.aggregated_prefill_share)} of GPU time for chat workloads "
            "(Splitwise, ISCA'24; DistServe, OSDI'24), so multiply the GPUs saved by that share."
        )
    s.paragraphs.append(
        "Net value is the baseline's monthly cost minus the option's; the payback is the "
        f"pilot's cost (the {num(econ.pilot_hours)}-hour stability gate on the option's GPUs) "
        "over the net value."
    )
    s.tables.append(Table(*et))
    s.paragraphs += undefined_notes(doc, side_by_side=False)
    pt = price_table(doc)
    if pt:
        s.tables.append(Table(*pt))
    return s


def _isolation_section(doc: Report) -> Section | None:
    iso = doc.isolation
    if iso is None:
        return None
    s = Section("isolation", "Tenant isolation")
    said = iso.sentence[:1].upper() + iso.sentence[1:] + "."
    tenants = count(iso.tenants, "tenant")
    if iso.policy == "shared":
        s.paragraphs.append(
            f"Every figure above is for a pool shared across the log's {tenants}: no "
            "request carries a cache salt, so any tenant's request can hit, and time, "
            f"another tenant's cached prompts (docs/security.md). {said} To keep tenants "
            "apart, the gateway sets cache_salt (vLLM, SGLang) or extra_key (older SGLang) "
            "per tenant on every request; kvpool analyze --isolation tenant measures "
            "everything so and writes the salted bundle."
        )
    else:
        unit = "tenant" if iso.policy == "tenant" else "end user within its tenant"
        s.paragraphs.append(
            f"Every figure above is measured with each block keyed by {unit}, as a cache "
            f"salt per {unit} keys it. {said} deploy/isolation/README.md says how the "
            "gateway sets the salt, which stacks key every tier by it at their versions (the "
            "others are left out of deploy/), and the pilot's isolation gate tests it."
        )
    ceilings = ", ".join(f"{p} {pct(iso.ceiling.get(p))}" for p in iso.policies)
    s.paragraphs.append(
        f"Prefix-hit ceiling (unlimited capacity), by policy: {ceilings}. Of the shared "
        f"log's hit tokens, {pct(iso.cross_tenant_hit_share)} were last held by another "
        "tenant's request (the share above); isolating takes away only the hits a tenant "
        "could not find in its own earlier requests (Hit rate lost, per option)."
    )
    who = []
    if iso.requests_without_tenant:
        who.append(
            f"{count(iso.requests_without_tenant, 'request')} name no tenant: the model "
            "stands in for it"
        )
    if iso.keyed_by:
        k = iso.keyed_by
        who.append(
            f"keyed by user: {count(k.get('user', 0), 'request')} by its user, "
            f"{num(k.get('session', 0))} by its session (standing in for its owner), "
            f"{num(k.get('tenant', 0))} by its tenant alone"
        )
    if who:
        s.paragraphs.append("; ".join(who)[:1].upper() + "; ".join(who)[1:] + ".")
    table = isolation_table(doc)
    if table:
        s.tables.append(Table(*table))
    products = isolation_products_table(doc)
    if products and iso.products:
        refused = [p for p in iso.products if not p.holds]
        where = (
            "under --isolation tenant or user, the bundle writes the stacks that hold and a "
            "refusal in place of the others"
            if iso.policy == "shared"
            else "deploy/ writes the stacks that hold and an ISOLATION.md refusal in place "
            "of the others"
        )
        s.paragraphs.append(
            "A salt keeps tenants apart only where every tier keys its blocks by it: the "
            "last table says so for each stack of the bundle at the versions it targets "
            f"({where}; analyzer/advisor/salting.py keeps the sources)."
            + "".join(f" {p.refusal}" for p in refused if p.refusal)
        )
        s.tables.append(Table(*products))
    return s


def arrivals_words(arr: Mapping[str, Any]) -> str:
    """What the log's coarse or bursty arrivals are, and what they do to the plan."""
    text = (
        f"The log's {num(arr['requests'])} requests arrive at {num(arr['distinct_times'])} "
        f"distinct times (about {num(arr['mean_group'])} at each, at most "
        f"{num(arr['largest_group'])}), about {num(arr['step_s'])} s apart: its timestamps are "
        "coarse, or its requests come in bursts. The plans replay them as logged, each "
        "group arriving at once."
    )
    eff = arr.get("effect")
    if eff and eff.get("gpus") is not None and eff.get("gpus_spread") is not None:
        text += (
            f" Spread evenly over the time to the next timestamp, {OPTION_LABEL.get(eff['option'], eff['option'])} "
            f"would need {count(eff['gpus_spread'], 'GPU')} instead of {count(eff['gpus'], 'GPU')}: "
            "log finer timestamps to tell which it is."
        )
    return text


def _side_by_side_section(doc: Report) -> Section | None:
    sb = side_by_side_table(doc)
    if not sb:
        return None
    s = Section("side-by-side", "Other GPUs and models on this log")
    s.paragraphs.append(
        "The verdict's option on your model and GPU and on catalog alternatives, each "
        "planned as yours is: the fewest GPUs (at the smallest tensor parallelism that "
        "holds the model) whose replay meets the SLO at the busiest load, its TTFT that "
        "replay's. Another GPU or model is a purchase, not a setting, so it is listed here "
        "and not among the flips."
    )
    s.tables.append(Table(*sb))
    s.paragraphs += undefined_notes(doc, money=False)
    return s


def _sensitivity_section(doc: Report) -> Section | None:
    sens = doc.sensitivity
    if not sens.rows:
        return None
    s = Section("sensitivity", "Sensitivity: what would change the verdict")
    s.paragraphs += list(sens.summary)
    s.tables.append(
        Table(
            ["Input", "Value", "Verdict", "Flips?", "Note"],
            [
                [r.dimension, r.value, r.verdict, "yes" if r.flips else "no", r.note or ""]
                for r in sens.rows
            ],
        )
    )
    return s


def _sizing_section(doc: Report) -> Section | None:
    sz = doc.sizing
    if sz is None:
        return None
    s = Section("sizing", "Sized recommendation")
    if doc.verdict.verdict == Verdict.NOT_WORTH_IT:
        s.paragraphs.append(
            "No pool or offload tier is recommended. The figures below are what one would "
            "need if the workload changed enough to flip the verdict (see the sensitivity "
            "table)."
        )
    plan = next(
        (
            p
            for p in doc.plans
            if p.option == doc.verdict.scenario and known(p.instances) is not None
        ),
        None,
    )
    if plan is not None:
        pt = known(plan.ttft_s)
        models = len({(p.model, p.served_as) for p in doc.plans})
        of = (
            ""
            if models < 2
            else f" of {plan.model}, the most requested of the log's "
            f"{models} models (each model's plan is in the models section and its folder "
            "of deploy/)"
        )
        s.paragraphs.append(
            f"The plan behind every figure{of}: {count(sz.instances, 'instance')} of {plan.tp} x "
            f"{plan.gpu} ({count(known(plan.gpus) or 0, 'GPU')}) on {count(sz.nodes, 'node')}, "
            f"{sz.instances_per_node} per node, replayed at the busiest load at "
            f"{ms(pt.mean if pt else None)} mean and {ms(pt.p90 if pt else None)} p90 TTFT."
        )
    rows = [
        [
            "Pool capacity",
            f"{num(sz.pool_capacity_tokens)} tokens" if sz.pool else "no pool",
            f"{num(sz.pool_capacity_gb)} GB ({num(sz.pool_capacity_gib)} GiB), knee at "
            f"{100 * sz.knee_fraction:.0f}% of the ceiling"
            if sz.pool
            else "",
        ],
        [
            "Host DRAM per node",
            f"{num(sz.dram_per_node_tokens)} tokens",
            f"{num(sz.dram_per_node_gb)} GB ({num(sz.dram_per_node_gib)} GiB): {sz.dram_reason}",
        ],
        *(
            [
                [
                    "Local NVMe per node",
                    f"{num(sz.nvme_per_node_tokens)} tokens",
                    f"{num(sz.nvme_per_node_tokens * sz.bytes_per_token / 1e9)} GB: the knee of "
                    "the hit-ratio curve, capped at the node's NVMe for KV",
                ]
            ]
            if sz.nvme_per_node_tokens
            else []
        ),
        [
            "HBM prefix cache per instance",
            f"{num(sz.hbm_cache_per_instance_tokens)} tokens",
            f"{num(sz.hbm_cache_per_instance_gb)} GB",
        ],
        ["Network per node", gbps(sz.network_per_node_gbps), f"e.g. {sz.nic}"],
        [
            "Block size / chunk",
            f"{sz.block_size_tokens} / {sz.chunk_size_tokens} tokens",
            sz.block_size_reason,
        ],
        ["Router", sz.router, sz.router_reason],
        ["Eviction", sz.eviction, sz.eviction_reason],
        [
            "Cluster",
            count(sz.instances, "instance"),
            f"{count(sz.nodes, 'node')}, {sz.instances_per_node} per node",
        ],
    ]
    s.tables.append(Table(["What", "Recommended", "Why"], rows))
    return s


def _settings_section(doc: Report) -> Section | None:
    if not doc.settings:
        return None
    s = Section("settings", "Recommended settings")
    for p in doc.settings:
        s.tables.append(
            Table(
                [f"{p.product} ({p.mode})", "Value", "Why"],
                [[x.option, x.value, x.why] for x in p.settings],
            )
        )
        if p.snippet.strip():  # a product the verdict does not deploy has nothing to paste
            s.code.append((p.product, p.snippet_lang, p.snippet))
    s.tables.append(
        Table(
            ["Product", "Checked against", "Pages", "Options"],
            [[d.product, d.version, d.pages, d.options] for d in doc.products_checked],
        )
    )
    return s


def _deploy_section(doc: Report) -> Section | None:
    files = doc.deploy.files
    if not files:
        return None
    s = Section("deploy", "Deployment bundle")
    s.paragraphs.append(
        "Written next to this report in deploy/: launch commands, config files and a "
        "Kubernetes form, per product, for the recommended option and the runner-up. "
        "Every size derives from the sizing above (deploy/README.md lists each "
        "product's size per process); every file names the versions it was checked against."
    )
    per_process = doc.deploy.per_process
    if per_process:
        s.tables.append(
            Table(
                ["Option", "Stack", "Setting", "Per", "Each", "Units (per node)", "Adds up to"],
                [
                    [
                        r.option,
                        r.stack,
                        r.setting,
                        r.per,
                        f"{gb(r.bytes_each)} ({r.bytes_each:,} B)",
                        f"{r.units} ({r.units_per_node})",
                        f"{r.total} {gb(r.total_bytes)}",
                    ]
                    for r in per_process
                ],
            )
        )
    s.links = [(f.path, f"{f.role}, {f.option}: {f.stack}") for f in files]
    return s


def _gates_section(doc: Report) -> Section | None:
    plan = doc.gates.plan
    if not plan:
        return None
    s = Section("gates", "Pilot gates")
    s.paragraphs.append(
        "Run the gates in order and stop at the first one missed. Check measured results "
        "with `kvpool validate RESULTS... --report report.json` (exit code 5 when a gate fails)."
    )
    if doc.verdict.verdict == Verdict.INSUFFICIENT_DATA:
        s.paragraphs.append(
            "Before any pilot: collect the data named in the verdict and run "
            "`kvpool analyze` again; the gates below have no projection yet."
        )
    if doc.verdict.verdict == Verdict.CANNOT_MEET_SLO:
        s.paragraphs.append(
            "No option meets the SLO, so there is no candidate deployment to pilot yet: the "
            "arrival and single-node baseline gates check the measurements this answer rests "
            "on (the load, the prefill speed); the main and stability gates apply once "
            "`kvpool analyze` is run again with an SLO or a GPU budget that can be met."
        )
    rows = []
    for g in plan:
        for k, c in enumerate(g.criteria):
            rows.append(
                [
                    g.name if k == 0 else "",
                    c.text,
                    f"{c.op} {criterion_value(c.metric, c.threshold)}",
                    criterion_value(c.metric, g.projected.get(c.metric)),
                    g.run if k == 0 else "",
                ]
            )
    s.tables.append(Table(["Gate", "Criterion", "Passes when", "Projected", "How to run"], rows))
    return s


def _pilot_section(doc: Report) -> Section | None:
    cmds = doc.pilot.commands
    if not cmds:
        return None
    s = Section("pilot", "Pilot commands")
    s.paragraphs.append(
        "The log replayed against the pilot: export it once, then run the replayer "
        "that fits the stack; the file, rate and duration are filled in."
    )
    for c in cmds:
        s.code.append((f"{c.tool}: {c.purpose}", "bash", f"# {c.note}\n{c.command}"))
    return s


def _assumptions_section(doc: Report) -> Section:
    s = Section("assumptions", "Assumptions and sources")
    s.tables.append(
        Table(["What", "Value", "Source"], [[a.what, a.value, a.source] for a in doc.assumptions])
    )
    s.tables.append(
        Table(
            ["Input", "Bytes", "sha256"],
            [[i.name, num(i.bytes), i.sha256] for i in doc.inputs],
        )
    )
    sk = doc.trace.skipped
    if sk.total:
        s.paragraphs.append(
            f"{sk.total} input rows were skipped: "
            + ", ".join(f"{n} {r}" for r, n in (sk.by_reason or {}).items())
            + ". Examples: "
            + "; ".join(sk.examples or ())
        )
    s.paragraphs.append(f"Report schema {doc.schema}, kvpool {doc.kvpool_version}.")
    return s


def sections(doc: Report) -> list[Section]:
    out: list[Section] = [
        Section("summary", "Summary", paragraphs=[" ".join(summary_of(doc))]),
        _verdict_section(doc),
        Section("figures", "Key figures", tables=[key_figures(doc)]),
        _reuse_section(doc),
    ]
    for part in (
        _models_section,
        _engine_section,
        _measured_section,
        _bandwidth_section,
        _scenarios_section,
        _economics_section,
        _isolation_section,
        _side_by_side_section,
        _sensitivity_section,
        _sizing_section,
        _settings_section,
        _deploy_section,
        _gates_section,
        _pilot_section,
    ):
        section = part(doc)
        if section is not None:
            out.append(section)
    out.append(_assumptions_section(doc))
    out.append(
        Section("glossary", "Glossary", tables=[Table(["Term", "Meaning"], glossary_rows())])
    )
    return out


# -- glossary links -----------------------------------------------------------------------

_CASED = {"TTFT", "MFU", "SLO", "p90"}


def term_anchor(term: str) -> str:
    return "g-" + re.sub(r"[^a-z0-9]+", "-", term.lower()).strip("-")


def _term_pattern(term: str) -> re.Pattern[str]:
    flags = 0 if term in _CASED else re.IGNORECASE
    return re.compile(r"(?<![\w#-])(" + re.escape(term) + r")(?![\w-])", flags)


_TERM_RE = [(t, _term_pattern(t)) for t in sorted(GLOSSARY, key=len, reverse=True)]


def link_terms(text: str, link: Any, keep: tuple[tuple[int, int], ...] = ()) -> str:
    """``text`` with the first occurrence of each glossary term passed through
    ``link(term, matched)`` (links are not nested: a matched span is not searched again;
    nor is a ``keep`` span, such as inline code)."""
    spans: list[tuple[int, int, str]] = [(a, b, text[a:b]) for a, b in keep]
    for term, rx in _TERM_RE:
        for m in rx.finditer(text):
            if any(a < m.end() and m.start() < b for a, b, _ in spans):
                continue
            spans.append((m.start(), m.end(), link(term, m.group(1))))
            break
    out, at = [], 0
    for a, b, rep in sorted(spans):
        out += [text[at:a], rep]
        at = b
    return "".join(out) + text[at:]


# -- Markdown -----------------------------------------------------------------------------


def _md_cell(x: str) -> str:
    return md_prose(x).replace("|", "\\|")


def _md_table(t: Table) -> str:
    lines = [
        "| " + " | ".join(_md_cell(h) for h in t.header) + " |",
        "|" + "|".join("---" for _ in t.header) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in t.rows]
    return "\n".join(lines)


def render_markdown_doc(doc: Report) -> str:
    v = doc.verdict.verdict
    parts = [f"# kvpool report: **{v}**", ""]
    for s in sections(doc):
        parts += [f"## {md_text(s.title)}", ""]
        for p in s.paragraphs:
            if p:
                parts += [md_prose(p), ""]
        for t in s.tables:
            parts += [_md_table(t), ""]
        for title, lang, text in s.code:
            parts += [f"**{md_text(title)}**", "", md_code(text, lang), ""]
        if s.links:
            parts += [f"- [{path}]({path}) ({md_text(note)})" for path, note in s.links] + [""]
    return "\n".join(parts).rstrip() + "\n"


# -- HTML ---------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
max-width:1100px;margin:0 auto;padding:24px;color:#1c1c1c;line-height:1.45}
h1{font-size:1.6em;margin-bottom:0}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}
.verdict{border-radius:8px;padding:16px 20px;color:#fff;margin:16px 0}
.verdict .v{font-size:1.8em;font-weight:700}.verdict .t{font-size:1.1em}
table{border-collapse:collapse;margin:12px 0;font-size:.92em;width:100%}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f8}td{overflow-wrap:anywhere}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.92em;
background:#f0f2f5;padding:0 3px;border-radius:3px}pre code{background:none;padding:0}
pre{background:#f6f8fa;padding:10px;border-radius:6px;overflow-x:auto;font-size:.88em}
.chart{margin:12px 0}.chart svg{max-width:100%;height:auto}
nav a{margin-right:12px}.muted{color:#666;font-size:.9em}
.verdict .summary{margin:.6em 0 0;font-size:1em}.verdict a{color:#fff}
.verdict code{background:rgba(255,255,255,.22);color:#fff}
a.term{color:inherit;text-decoration:underline dotted}
"""


def _e(text: str) -> str:
    """Text as HTML shows it: escaped, control characters made '?'."""
    return html.escape(scrub(text))


def _coded(text: str) -> str:
    """Escaped HTML with backtick spans as ``<code>``."""
    return "".join(
        f"<code>{_e(part)}</code>" if code else _e(part) for code, part in prose_parts(text)
    )


def _linked(text: str) -> str:
    """:func:`_coded`'s HTML with glossary terms (outside code) linked to their
    definitions."""
    out = _coded(text)
    keep = tuple((m.start(), m.end()) for m in re.finditer(r"<code>.*?</code>", out))
    return link_terms(
        out,
        lambda term, m: f'<a class="term" href="#{term_anchor(term)}">{m}</a>',
        keep,
    )


def render_html_doc(doc: Report, charts: dict[str, str]) -> str:
    e = _e
    v = doc.verdict.verdict
    secs = sections(doc)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>kvpool report: {e(v)}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>kvpool: KV-cache pooling readiness</h1>",
        f'<div class="verdict" style="background:{VERDICT_COLOR.get(v, "#444")}">'
        f'<div class="v">{e(v)}</div><div class="t">{e(VERDICT_TEXT.get(v, ""))}</div>'
        f'<p class="summary">{_linked(" ".join(summary_of(doc)))}</p></div>',
        "<nav>" + "".join(f'<a href="#{s.id}">{e(s.title)}</a>' for s in secs[1:]) + "</nav>",
    ]
    for s in secs[1:]:
        out.append(f'<section id="{s.id}"><h2>{e(s.title)}</h2>')
        for p in s.paragraphs:
            if p:
                out.append(f"<p>{_linked(p)}</p>")
        for name in s.charts:
            if name in charts:
                out.append(f'<div class="chart">{charts[name]}</div>')
        for t in s.tables:
            out.append(
                "<table><thead><tr>"
                + "".join(f"<th>{e(h)}</th>" for h in t.header)
                + "</tr></thead><tbody>"
            )
            if s.id == "glossary":
                out += [
                    f'<tr id="{term_anchor(r[0])}"><td>{e(r[0])}</td><td>{_coded(r[1])}</td></tr>'
                    for r in t.rows
                ]
            else:
                out += [
                    "<tr>" + "".join(f"<td>{_linked(str(c))}</td>" for c in r) + "</tr>"
                    for r in t.rows
                ]
            out.append("</tbody></table>")
        for title, _lang, text in s.code:
            out.append(
                f"<h3>{e(title)}</h3><pre><code>{html.escape(scrub(text, lines=True))}</code></pre>"
            )
        if s.links:
            out.append(
                "<ul>"
                + "".join(
                    f'<li><a href="{e(path)}">{e(path)}</a> ({e(note)})</li>'
                    for path, note in s.links
                )
                + "</ul>"
            )
        out.append("</section>")
    out.append(
        '<p class="muted">Generated by kvpool from the report document '
        f"({e(doc.schema)}). Self-contained: no scripts, fonts or network.</p>"
    )
    out.append("</body></html>")
    return "\n".join(out) + "\n"
