"""Report charts: Altair specs rendered to SVG offline with vl-convert.

The SVG is embedded inline in the HTML report, so the report needs no script, font
or network access to display. Each function takes the report document's typed view
(:class:`analyzer.report.plan_views.ReportView`) and returns an SVG string, or None when the
document holds no data for that chart.
"""

from __future__ import annotations

import resource
from typing import Any

import altair as alt

from analyzer.report.figures import (
    SCENARIO_ORDER,
    SOURCE_LABELS,
    TIER_COLORS,
    TIER_LABELS,
    TIER_ORDER,
    scenario_colors,
    scenario_label,
)
from analyzer.report.plan_views import ReportView
from analyzer.report.schema import NotApplicable

WIDTH = 520
HEIGHT = 260


# vl-convert runs the Vega renderer in V8, whose heap cage reserves tens of GiB of address
# space up front; under a lower `ulimit -v` V8 aborts the whole process (SIGTRAP, no
# report at all). There the charts are left out instead (docs/security.md).
V8_ADDRESS_SPACE_BYTES = 64 << 30


def charts_possible() -> bool:
    """False under an address-space limit V8 cannot start in."""

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return soft == resource.RLIM_INFINITY or soft >= V8_ADDRESS_SPACE_BYTES


def to_svg(chart: alt.TopLevelMixin) -> str | None:
    if not charts_possible():
        return None
    import vl_convert as vlc

    svg = vlc.vegalite_to_svg(chart.to_json())
    # The XML prolog is not allowed inside HTML; keep only the <svg> element.
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _base(values: list[dict[str, Any]]) -> alt.Chart:
    return alt.Chart(alt.Data(values=values)).properties(width=WIDTH, height=HEIGHT)


def hit_ratio_curve(doc: ReportView) -> str | None:
    curve = (doc.reuse.analysis.curves or {}).get("lru") or ()
    pts = [
        {"capacity_tokens": max(int(p.capacity_tokens), 1), "hit_rate": p.hit_rate}
        for p in curve
        if p.hit_rate is not None
    ]
    if len(pts) < 2:
        return None
    line = (
        _base(pts)
        .mark_line(interpolate="step-after", color="#1f5fa8")
        .encode(
            x=alt.X(
                "capacity_tokens:Q", scale=alt.Scale(type="log"), title="cache capacity (tokens)"
            ),
            y=alt.Y("hit_rate:Q", axis=alt.Axis(format="%"), title="steady-state hit rate (LRU)"),
        )
    )
    marks: list[dict[str, Any]] = []
    sz = doc.sizing
    knee = doc.reuse.figures.knee_tokens
    if knee:
        marks.append({"capacity_tokens": knee, "what": "knee (pool capacity)"})
    if sz is not None and sz.hbm_cache_per_instance_tokens:
        marks.append(
            {"capacity_tokens": sz.hbm_cache_per_instance_tokens, "what": "HBM cache / instance"}
        )
    if sz is not None and sz.dram_per_node_tokens:
        marks.append({"capacity_tokens": sz.dram_per_node_tokens, "what": "host DRAM / node"})
    layers = [line]
    if marks:
        rules = (
            alt.Chart(alt.Data(values=marks))
            .mark_rule(strokeDash=[4, 3])
            .encode(
                x="capacity_tokens:Q",
                color=alt.Color("what:N", title="recommended", legend=alt.Legend(orient="bottom")),
            )
        )
        layers.append(rules)
    return to_svg(alt.layer(*layers).properties(title="Hit ratio against capacity"))


def sources_chart(doc: ReportView) -> str | None:
    src = doc.reuse.analysis.sources
    shares = (src.share_of_prompt if src is not None else None) or {}
    if not shares:
        return None
    labels = SOURCE_LABELS
    vals = [{"source": labels.get(k, k), "share": v} for k, v in shares.items()]
    chart = (
        _base(vals)
        .mark_bar(color="#2a7f62")
        .encode(
            y=alt.Y("source:N", sort=list(labels.values()), title=None),
            x=alt.X("share:Q", axis=alt.Axis(format="%"), title="share of prompt tokens reused"),
        )
        .properties(height=140, title="Where reuse comes from")
    )
    return to_svg(chart)


def break_even_chart(doc: ReportView) -> str | None:
    bw = doc.bandwidth
    if bw is None:
        return None
    pts = [p.to_json() for p in bw.curve if not isinstance(p.break_even_gbps, NotApplicable)]
    if len(pts) < 2:
        return None
    line = (
        _base(pts)
        .mark_line(color="#b23b3b", point=True)
        .encode(
            x=alt.X(
                "prefix_tokens:Q", scale=alt.Scale(type="log"), title="reusable prefix (tokens)"
            ),
            y=alt.Y("break_even_gbps:Q", scale=alt.Scale(type="log"), title="GB/s"),
        )
    )
    tiers = [
        {"tier": f"{t.role}: {t.tier}", "gbps": t.bandwidth_gbps}
        for t in bw.tiers
        if t.bandwidth_gbps
    ]
    layers = [line]
    if tiers:
        layers.append(
            alt.Chart(alt.Data(values=tiers))
            .mark_rule(strokeDash=[4, 3])
            .encode(
                y="gbps:Q",
                color=alt.Color(
                    "tier:N", title="tier bandwidth", legend=alt.Legend(orient="bottom")
                ),
            )
        )
    median = [{"prefix_tokens": bw.prefix_tokens}] if bw.prefix_tokens else []
    if median:
        layers.append(
            alt.Chart(alt.Data(values=median)).mark_rule(color="#555").encode(x="prefix_tokens:Q")
        )
    return to_svg(
        alt.layer(*layers).properties(
            title="Break-even bandwidth (load beats recompute above the line)"
        )
    )


def ttft_chart(doc: ReportView) -> str | None:
    """TTFT by option in milliseconds, the tables' unit, under the tables' option names."""
    vals = []
    for name, s in doc.scenarios.items():
        t = s.ttft_s
        for q, x in (("mean", t.mean), ("p50", t.p50), ("p90", t.p90), ("p99", t.p99)):
            if x is not None:
                vals.append({"option": scenario_label(name), "statistic": q, "ttft_ms": 1000 * x})
    if not vals:
        return None
    order = [scenario_label(n) for n in SCENARIO_ORDER]
    chart = (
        _base(vals)
        .mark_bar()
        .encode(
            x=alt.X("option:N", sort=order, title=None, axis=alt.Axis(labelAngle=0)),
            xOffset=alt.XOffset("statistic:N", sort=["mean", "p50", "p90", "p99"]),
            y=alt.Y("ttft_ms:Q", title="TTFT (ms)", axis=alt.Axis(format=",.0f")),
            color=alt.Color("statistic:N", sort=["mean", "p50", "p90", "p99"], title="TTFT"),
        )
        .properties(title="Time to first token by option")
    )
    return to_svg(chart)


def tier_hits_chart(doc: ReportView) -> str | None:
    vals = []
    for name, s in doc.scenarios.items():
        for tier, v in s.hit_rate_by_tier.items():
            rank = TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)
            vals.append(
                {
                    "scenario": str(name),
                    "tier": str(tier),
                    "tier_label": TIER_LABELS.get(tier, tier),
                    "rank": rank,
                    "hit_rate": v,
                }
            )
    if not vals:
        return None
    chart = (
        _base(vals)
        .mark_bar()
        .encode(
            x=alt.X("scenario:N", sort=list(SCENARIO_ORDER), title=None),
            y=alt.Y(
                "hit_rate:Q", axis=alt.Axis(format="%"), title="prompt tokens served from cache"
            ),
            color=alt.Color(
                "tier_label:N",
                sort=[TIER_LABELS[t] for t in TIER_ORDER],
                title="tier",
                scale=alt.Scale(
                    domain=[TIER_LABELS[t] for t in TIER_ORDER],
                    range=[TIER_COLORS[t] for t in TIER_ORDER],
                ),
                legend=alt.Legend(orient="bottom", labelLimit=0),
            ),
            order=alt.Order("rank:Q"),
        )
        .properties(title="Hit rate by tier")
    )
    return to_svg(chart)


def network_chart(doc: ReportView) -> str | None:
    vals = [
        {"scenario": str(n), "network_gb": (s.network_bytes or 0.0) / 1e9}
        for n, s in doc.scenarios.items()
    ]
    if not vals:
        return None
    chart = (
        _base(vals)
        .mark_bar()
        .encode(
            x=alt.X("scenario:N", sort=list(SCENARIO_ORDER), title=None),
            color=alt.Color(
                "scenario:N",
                legend=None,
                scale=alt.Scale(
                    domain=list(SCENARIO_ORDER), range=scenario_colors(list(SCENARIO_ORDER))
                ),
            ),
            y=alt.Y("network_gb:Q", title="network bytes (GB, pool reads + writes)"),
        )
        .properties(height=180, title="Network use")
    )
    return to_svg(chart)


def engine_occupancy_chart(doc: ReportView) -> str | None:
    """Blocks the engine held per medium over the recording (KV-event inputs only)."""
    ev = doc.engine_events
    if ev is None or len(ev.timeline) < 2:
        return None
    vals = [
        {"t_s": p.t_s, "medium": medium, "blocks": n}
        for p in ev.timeline
        for medium, n in p.blocks.items()
    ]
    chart = (
        _base(vals)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("t_s:Q", title="seconds into the recording"),
            y=alt.Y("blocks:Q", title="blocks held (peak in each slice)"),
            color=alt.Color("medium:N", title="medium"),
        )
        .properties(title="The engine's KV cache occupancy, from its events")
    )
    return to_svg(chart)


def all_charts(doc: ReportView) -> dict[str, str]:
    out = {}
    for name, fn in (
        ("hit_ratio", hit_ratio_curve),
        ("sources", sources_chart),
        ("break_even", break_even_chart),
        ("ttft", ttft_chart),
        ("tier_hits", tier_hits_chart),
        ("network", network_chart),
        ("engine_occupancy", engine_occupancy_chart),
    ):
        svg = fn(doc)
        if svg:
            out[name] = svg
    return out
