"""Interactive Altair charts for the dashboard.

The tables they draw, their words, colours and orders come from
:mod:`analyzer.report.figures`, the one place the report's SVG charts read them too;
this module adds what a browser can do on top (tooltips, highlighting the chosen
policy, the SLO line moving with the sidebar). Every function returns an
``alt.Chart``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import altair as alt
import pandas as pd

from analyzer.report.figures import (
    GIB,
    OTHER_COLOR,
    POLICY_COLORS,
    POLICY_LABELS,
    TIER_COLORS,
    TIER_LABELS,
    TIER_ORDER,
    scenario_colors,
    scenario_label,
)

if TYPE_CHECKING:
    from analyzer.cost.breakdown import BreakEvenRow

__all__ = ["GIB"]

# Axis numbers as a reader writes them: "1,000" and "0.5", never "1e+3" or "500m" (a log
# axis labels its powers of ten, and Vega's default for them is SI or exponent form).
NUMBER = ",~r"


def log_axis(title: str) -> dict:
    """The ``scale`` and ``axis`` of a logarithmic axis with readable numbers."""
    return {"title": title, "scale": alt.Scale(type="log"), "axis": alt.Axis(format=NUMBER)}


# --- workload overview -------------------------------------------------------------------


def arrivals_chart(frame: pd.DataFrame, field: str, title: str) -> alt.Chart:
    return (
        alt.Chart(frame, title=title)
        .mark_area(line=True, opacity=0.4, interpolate="step-after")
        .encode(
            x=alt.X("time_s:Q", title="time since first request (s)"),
            y=alt.Y(f"{field}:Q", title=title),
            tooltip=[
                alt.Tooltip("time_s:Q", format=",.0f", title="s since first request"),
                alt.Tooltip(f"{field}:Q", format=",.2f", title=title),
            ],
        )
    )


def histogram_chart(frame: pd.DataFrame, x: str, y: str, title: str) -> alt.Chart:
    return (
        alt.Chart(frame, title=title)
        .mark_bar()
        .encode(
            x=alt.X(f"{x}:N", sort=None, title=x.replace("_", " ")),
            y=alt.Y(f"{y}:Q", title=y.replace("_", " ")),
            tooltip=[
                alt.Tooltip(f"{x}:N", title=x.replace("_", " ")),
                alt.Tooltip(f"{y}:Q", title=y.replace("_", " "), format=","),
            ],
        )
    )


def tenants_chart(frame: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(frame, title="Prompt tokens by tenant")
        .mark_bar()
        .encode(
            y=alt.Y("tenant:N", sort=None, title=None, axis=alt.Axis(labelLimit=220)),
            x=alt.X("prompt_tokens:Q", title="prompt tokens"),
            tooltip=[
                "tenant",
                alt.Tooltip("requests:Q", format=","),
                alt.Tooltip("prompt_tokens:Q", title="prompt tokens", format=","),
            ],
        )
    )


# --- prefix tree -------------------------------------------------------------------------


def prefix_tree_chart(frame: pd.DataFrame, depth_tokens: int) -> alt.LayerChart:
    """The icicle down to ``depth_tokens`` (the axis always reaches the chosen depth, so
    where the rectangles stop is where no prefix is shared by enough requests any more).
    Each leading prefix has its own colour; merged "other" slices are grey."""
    groups = frame.loc[(frame["level"] == 0) & (frame["kind"] == "prefix")]
    groups = groups.sort_values("x0")["group"].tolist()
    x = alt.X(
        "x0:Q", title="share of requests", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])
    )
    y = alt.Y(
        "y0_tokens:Q",
        title="tokens into the prompt",
        scale=alt.Scale(reverse=True, nice=False, domain=[0, max(int(depth_tokens), 1)]),
        axis=alt.Axis(format=","),
    )
    tooltip = [
        alt.Tooltip("label:N", title="prefix starts"),
        alt.Tooltip("tokens:N", title="tokens"),
        alt.Tooltip("requests:Q", format=","),
        alt.Tooltip("share:Q", format=".1%"),
    ]
    base = alt.Chart(frame).encode(x=x, x2="x1:Q", y=y, y2="y1_tokens:Q", tooltip=tooltip)
    prefixes = base.transform_filter(alt.datum.kind == "prefix").mark_rect(
        stroke="white", strokeWidth=0.3
    )
    prefixes = prefixes.encode(color=alt.Color("group:N", sort=groups[:10], legend=None))
    others = base.transform_filter(alt.datum.kind == "other").mark_rect(
        stroke="white", strokeWidth=0.3, color=OTHER_COLOR, opacity=0.8
    )
    return alt.layer(prefixes, others).properties(
        height=420,
        title="Prefix tree (icicle): width = share of requests; grey = small prefixes merged",
    )


# --- reuse -------------------------------------------------------------------------------


def granularity_chart(frame: pd.DataFrame) -> alt.Chart:
    data = frame.dropna(subset=["steady"])
    return (
        alt.Chart(data, title="Ceiling by block size (steady state)")
        .mark_bar()
        .encode(
            x=alt.X("granularity:N", sort=None, title=None),
            y=alt.Y("steady:Q", title="prefix hit rate", axis=alt.Axis(format="%")),
            tooltip=[
                "granularity",
                alt.Tooltip("steady:Q", format=".1%"),
                alt.Tooltip("cold:Q", format=".1%"),
            ],
        )
    )


def sources_chart(frame: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(
            frame, title="Where reuse comes from: prompt tokens reused, by who held them last"
        )
        .mark_bar()
        .encode(
            y=alt.Y("source:N", sort=None, title=None, axis=alt.Axis(labelLimit=220)),
            x=alt.X("share:Q", title="share of prompt tokens", axis=alt.Axis(format="%")),
            tooltip=[
                "source",
                alt.Tooltip("share:Q", format=".1%"),
                alt.Tooltip("tokens:Q", format=","),
            ],
        )
    )


# --- capacity ----------------------------------------------------------------------------


def capacity_chart(
    frame: pd.DataFrame,
    unit: str,
    highlight: str,
    marks: list[tuple[str, float]],
    ceiling: float,
) -> alt.LayerChart:
    """Hit-ratio curves; ``marks`` are labelled vertical rules (knee, HBM size) at x."""
    x_field = "capacity_gib" if unit == "GiB" else "capacity_tokens"
    x_title = "cache capacity (GiB)" if unit == "GiB" else "cache capacity (tokens)"
    data = frame[frame[x_field] > 0]
    x = alt.X(f"{x_field}:Q", **log_axis(x_title))
    y = alt.Y("hit_rate:Q", title="steady-state hit rate", axis=alt.Axis(format="%"))
    data = data.assign(policy_name=[POLICY_LABELS.get(p, p) for p in data.policy])
    lru = data[data.policy == "lru"]
    others = data[data.policy != "lru"]
    policies = [p for p in POLICY_COLORS if p in set(data.policy)]
    color = alt.Color(
        "policy_name:N",
        title="policy",
        scale=alt.Scale(
            domain=[POLICY_LABELS[p] for p in policies], range=[POLICY_COLORS[p] for p in policies]
        ),
        legend=alt.Legend(orient="bottom", labelLimit=0),
    )
    layers = [
        alt.Chart(lru)
        .mark_line(strokeWidth=3 if highlight == "lru" else 1.5)
        .encode(x=x, y=y, color=color, tooltip=_curve_tooltip(x_field)),
    ]
    if not others.empty:
        layers.append(
            alt.Chart(others)
            .mark_line(point=True, strokeDash=[4, 2])
            .encode(
                x=x,
                y=y,
                color=color,
                size=alt.condition(alt.datum.policy == highlight, alt.value(3), alt.value(1.5)),
                tooltip=_curve_tooltip(x_field),
            )
        )
    rule_data = pd.DataFrame(
        [{"label": label, x_field: value} for label, value in marks if value and value > 0]
    )
    if not rule_data.empty:
        layers.append(
            alt.Chart(rule_data).mark_rule(color="#555", strokeDash=[2, 2]).encode(x=f"{x_field}:Q")
        )
        # One text layer per mark, each at its own height (pixels), so labels never
        # overlap and the hit-rate axis keeps its own scale.
        for i, row in enumerate(rule_data.to_dict("records")):
            layers.append(
                alt.Chart(pd.DataFrame([row]))
                .mark_text(align="left", dx=4, color="#333")
                .encode(x=f"{x_field}:Q", y=alt.value(10 + 14 * i), text="label:N")
            )
    layers.append(
        alt.Chart(pd.DataFrame({"hit_rate": [ceiling]}))
        .mark_rule(color="#999")
        .encode(y="hit_rate:Q")
    )
    return alt.layer(*layers).properties(height=380, title="Hit ratio against cache capacity")


def _curve_tooltip(x_field: str) -> list:
    return [
        alt.Tooltip("policy_name:N", title="policy"),
        alt.Tooltip("capacity_tokens:Q", format=",", title="tokens"),
        alt.Tooltip("capacity_gib:Q", format=",.2f", title="GiB"),
        alt.Tooltip("hit_rate:Q", format=".1%"),
    ]


# --- cost --------------------------------------------------------------------------------


def break_even_chart(rows: list[BreakEvenRow]) -> alt.LayerChart:
    """Break-even bandwidth against prefix length, with each link's bandwidth as a rule.

    Above the curve loading beats recomputing; a link whose rule lies above the curve at
    a prefix length wins there.
    """
    curve = pd.DataFrame(
        [
            {"prefix_tokens": r.prefix_tokens, "break_even_gbps": r.break_even_gbps}
            for r in rows
            if r.break_even_gbps
        ]
    ).drop_duplicates("prefix_tokens")
    x = alt.X("prefix_tokens:Q", **log_axis("prefix length (tokens)"))
    line = (
        alt.Chart(curve)
        .mark_line(point=True, strokeWidth=3)
        .encode(
            x=x,
            y=alt.Y("break_even_gbps:Q", **log_axis("break-even bandwidth (GB/s)")),
            tooltip=[
                alt.Tooltip("prefix_tokens:Q", format=","),
                alt.Tooltip("break_even_gbps:Q", format=",.2f", title="GB/s"),
            ],
        )
    )
    rules = pd.DataFrame(
        [{"link": r.tier, "bandwidth_gbps": r.bandwidth_gbps} for r in rows]
    ).drop_duplicates("link")
    rule = (
        alt.Chart(rules)
        .mark_rule(strokeDash=[4, 3])
        .encode(
            y="bandwidth_gbps:Q",
            color=alt.Color("link:N", title="link"),
            tooltip=["link", alt.Tooltip("bandwidth_gbps:Q", format=",.1f", title="GB/s")],
        )
    )
    return alt.layer(line, rule).properties(
        height=360, title="Loading beats recomputing above the curve"
    )


def prefix_time_chart(rows: list[BreakEvenRow]) -> alt.Chart:
    """Seconds to recompute a prefix against seconds to load it over each link."""
    out = []
    seen = set()
    for r in rows:
        if r.prefix_tokens not in seen:
            seen.add(r.prefix_tokens)
            out.append(
                {
                    "prefix_tokens": r.prefix_tokens,
                    "how": "recompute",
                    "seconds": r.recompute_s,
                }
            )
        out.append(
            {
                "prefix_tokens": r.prefix_tokens,
                "how": f"load: {r.tier}",
                "seconds": r.load_s,
            }
        )
    return (
        alt.Chart(
            pd.DataFrame([{**r, "ms": 1000 * r["seconds"]} for r in out if r["seconds"] > 0]),
            title="Time to have a prefix's KV: recompute or load",
        )
        .mark_line(point=True)
        .encode(
            x=alt.X("prefix_tokens:Q", **log_axis("prefix length (tokens)")),
            y=alt.Y("ms:Q", **log_axis("milliseconds")),
            color=alt.Color("how:N", title=None),
            strokeDash=alt.condition(
                alt.datum.how == "recompute", alt.value([1, 0]), alt.value([4, 2])
            ),
            tooltip=[
                "how",
                alt.Tooltip("prefix_tokens:Q", format=",", title="prefix (tokens)"),
                alt.Tooltip("ms:Q", format=",.3~f", title="ms"),
            ],
        )
        .properties(height=360)
    )


# --- replay ------------------------------------------------------------------------------


def ttft_chart(frame: pd.DataFrame, slo_s: float) -> alt.LayerChart:
    """TTFT distributions in ms (the tables' unit), one line per option under its name."""
    positive = frame[frame.ttft_ms > 0].assign(option=lambda f: f.scenario.map(scenario_label))
    lines = (
        alt.Chart(positive)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("ttft_ms:Q", **log_axis("time to first token (ms)")),
            y=alt.Y("quantile:Q", title="share of requests", axis=alt.Axis(format="%")),
            color=_scenario_color(list(dict.fromkeys(positive.scenario))),
            tooltip=[
                "option",
                alt.Tooltip("ttft_ms:Q", format=",.0f", title="TTFT (ms)"),
                alt.Tooltip("quantile:Q", format=".0%", title="share of requests"),
            ],
        )
    )
    slo_ms = 1000 * slo_s
    slo = (
        alt.Chart(pd.DataFrame({"ttft_ms": [slo_ms], "label": [f"SLO {slo_ms:,.0f} ms"]}))
        .mark_rule(color="red", strokeDash=[4, 3])
        .encode(x="ttft_ms:Q", tooltip=["label"])
    )
    return alt.layer(lines, slo).properties(height=320, title="TTFT distribution (CDF)")


def _scenario_color(names: list[str]) -> alt.Color:
    """Each option's colour, its legend under the option's name."""
    labels = [scenario_label(n) for n in names]
    return alt.Color(
        "option:N",
        title=None,
        sort=labels,
        scale=alt.Scale(domain=labels, range=scenario_colors(names)),
        legend=alt.Legend(orient="bottom", labelLimit=0, columns=2),
    )


def tier_hits_chart(frame: pd.DataFrame, order: list[str]) -> alt.Chart:
    labels = [scenario_label(n) for n in order]
    tiers = [t for t in TIER_ORDER if t in set(frame.tier)] or list(TIER_ORDER)
    data = frame.assign(
        label=[scenario_label(n) for n in frame.scenario],
        where=[TIER_LABELS.get(t, t) for t in frame.tier],
        rank=[TIER_ORDER.index(t) if t in TIER_ORDER else len(TIER_ORDER) for t in frame.tier],
    )
    return (
        alt.Chart(data, title="Prompt tokens served from cache, by tier")
        .mark_bar()
        .encode(
            y=alt.Y("label:N", sort=labels, title=None, axis=alt.Axis(labelLimit=0)),
            x=alt.X("hit_rate:Q", title="share of prompt tokens", axis=alt.Axis(format="%")),
            color=alt.Color(
                "where:N",
                title=None,
                sort=[TIER_LABELS[t] for t in tiers],
                scale=alt.Scale(
                    domain=[TIER_LABELS[t] for t in tiers], range=[TIER_COLORS[t] for t in tiers]
                ),
                legend=alt.Legend(orient="bottom", labelLimit=0),
            ),
            order=alt.Order("rank:Q"),
            tooltip=[
                alt.Tooltip("label:N", title="option"),
                alt.Tooltip("where:N", title="tier"),
                alt.Tooltip("hit_rate:Q", format=".1%", title="share"),
            ],
        )
        .properties(height=240)
    )


def scenario_bar_chart(
    frame: pd.DataFrame, field: str, title: str, axis_title: str, fmt: str, order: list[str]
) -> alt.LayerChart:
    """One horizontal bar per scenario (labels never collide), its value written at the
    bar's end. Rows without a value (None) are left out, never drawn as zero."""
    data = frame[frame[field].notna()].assign(label=lambda f: f.scenario.map(scenario_label))
    labels = [scenario_label(n) for n in order]
    base = alt.Chart(data, title=title).encode(
        y=alt.Y("label:N", sort=labels, title=None, axis=alt.Axis(labelLimit=0)),
        x=alt.X(f"{field}:Q", title=axis_title),
        tooltip=[alt.Tooltip("label:N", title="option"), alt.Tooltip(f"{field}:Q", format=fmt)],
    )
    bars = base.mark_bar().encode(
        color=alt.Color(
            "scenario:N",
            legend=None,
            scale=alt.Scale(domain=order, range=scenario_colors(order)),
        )
    )
    text = base.mark_text(align="left", dx=4).encode(text=alt.Text(f"{field}:Q", format=fmt))
    return alt.layer(bars, text).properties(height=240)


def fitted_chart(points: pd.DataFrame) -> alt.LayerChart:
    """Predicted against measured TTFT, catalog and fitted, with the line of equality."""
    top = float(max(points.measured_s.max(), points.predicted_s.max())) * 1.05
    dots = (
        alt.Chart(points)
        .mark_point(filled=True, size=70)
        .encode(
            x=alt.X("measured_s:Q", title="measured TTFT (s)", scale=alt.Scale(domain=[0, top])),
            y=alt.Y("predicted_s:Q", title="predicted TTFT (s)", scale=alt.Scale(domain=[0, top])),
            color=alt.Color("model:N", title=None, sort=["catalog", "fitted"]),
            shape=alt.Shape("model:N", sort=["catalog", "fitted"]),
            tooltip=[
                "model",
                alt.Tooltip("prompt_tokens:Q", title="prompt tokens", format=","),
                alt.Tooltip("cached_tokens:Q", title="cached tokens", format=","),
                "concurrency",
                alt.Tooltip("load_gbps:Q", title="load (GB/s)"),
                alt.Tooltip("measured_s:Q", format=".4f", title="measured TTFT (s)"),
                alt.Tooltip("predicted_s:Q", format=".4f", title="predicted TTFT (s)"),
            ],
        )
    )
    diagonal = (
        alt.Chart(pd.DataFrame({"measured_s": [0.0, top], "predicted_s": [0.0, top]}))
        .mark_line(color="#999", strokeDash=[3, 3])
        .encode(x="measured_s:Q", y="predicted_s:Q")
    )
    return alt.layer(diagonal, dots).properties(
        height=360, title="Fitted versus measured TTFT (on the line = exact)"
    )
