"""Altair figures for the dashboard, and the small reshaping each one needs.

Functions named ``*_frame`` turn analyzer output (a ``BlockTrace`` or a report's JSON)
into the tidy table a chart draws; they bin and sort, they do not analyse, and they are
tested without Streamlit. Functions named ``*_chart`` return an ``alt.Chart``.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from analyzer.report.render import rate_at_slo
from analyzer.trace import BlockTrace

GIB = 2**30
# Round bin widths for arrival charts, in seconds.
_NICE_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


def _nice_step(span_s: float, max_bins: int = 120) -> float:
    for step in _NICE_STEPS_S:
        if span_s / step <= max_bins:
            return float(step)
    return float(math.ceil(span_s / max_bins / 86400) * 86400)


# --- workload overview -------------------------------------------------------------------


def arrivals_frame(trace: BlockTrace, max_bins: int = 120) -> pd.DataFrame:
    """Requests and prompt tokens per second, in round time bins."""
    t = trace.arrival_s
    if t.size == 0:
        return pd.DataFrame({"time_s": [], "requests_per_s": [], "prompt_tokens_per_s": []})
    span = float(t[-1] - t[0])
    step = _nice_step(span, max_bins)
    idx = np.floor((t - t[0]) / step).astype(np.int64)
    nbins = int(idx.max()) + 1
    reqs = np.bincount(idx, minlength=nbins)
    toks = np.bincount(idx, weights=trace.prompt_tokens.astype(np.float64), minlength=nbins)
    return pd.DataFrame(
        {
            "time_s": t[0] + step * np.arange(nbins),
            "requests_per_s": reqs / step,
            "prompt_tokens_per_s": toks / step,
        }
    )


def log2_histogram_frame(values: np.ndarray, what: str) -> pd.DataFrame:
    """Counts in power-of-two bins ``[2^k, 2^(k+1))`` (lengths span orders of magnitude)."""
    v = values[values >= 0]
    if v.size == 0:
        return pd.DataFrame({what: [], "lo": [], "hi": [], "requests": []})
    k = np.floor(np.log2(np.maximum(v, 1))).astype(np.int64)
    k[v == 0] = -1
    lo_k, hi_k = int(k.min()), int(k.max())
    counts = np.bincount(k - lo_k, minlength=hi_k - lo_k + 1)
    ks = np.arange(lo_k, hi_k + 1)
    lo = np.where(ks < 0, 0, 2.0**ks).astype(np.int64)
    hi = (2.0 ** (ks + 1)).astype(np.int64) - 1
    hi[ks < 0] = 0
    labels = [f"{a:,}" if a == b else f"{a:,}-{b:,}" for a, b in zip(lo, hi, strict=True)]
    return pd.DataFrame({what: labels, "lo": lo, "hi": hi, "requests": counts})


def sessions_frame(trace: BlockTrace) -> pd.DataFrame:
    """How many sessions have 1, 2, 3-4, 5-8, ... requests."""
    s = trace.session[trace.session >= 0]
    if s.size == 0:
        return pd.DataFrame({"requests_in_session": [], "lo": [], "hi": [], "requests": []})
    per_session = np.bincount(s)
    per_session = per_session[per_session > 0]
    frame = log2_histogram_frame(per_session, "requests_in_session")
    return frame.rename(columns={"requests": "sessions"})


def requests_in_multi_request_sessions(trace: BlockTrace) -> int:
    s = trace.session[trace.session >= 0]
    if s.size == 0:
        return 0
    per_session = np.bincount(s)
    return int((per_session[s] > 1).sum())


def tenants_frame(trace: BlockTrace, top: int = 20) -> pd.DataFrame:
    """Requests and prompt tokens of the largest tenants (the rest summed as 'other')."""
    t = trace.tenant
    names = [*trace.tenant_names, "(none)"]
    codes = np.where(t >= 0, t, len(trace.tenant_names))
    reqs = np.bincount(codes, minlength=len(names))
    toks = np.bincount(codes, weights=trace.prompt_tokens.astype(np.float64), minlength=len(names))
    order = [i for i in np.argsort(-toks, kind="stable") if reqs[i] > 0]
    rows = [
        {"tenant": names[i], "requests": int(reqs[i]), "prompt_tokens": int(toks[i])}
        for i in order[:top]
    ]
    rest = order[top:]
    if rest:
        rows.append(
            {
                "tenant": f"other ({len(rest)})",
                "requests": int(reqs[rest].sum()),
                "prompt_tokens": int(toks[rest].sum()),
            }
        )
    return pd.DataFrame(rows, columns=["tenant", "requests", "prompt_tokens"])


def arrivals_chart(frame: pd.DataFrame, field: str, title: str) -> alt.Chart:
    return (
        alt.Chart(frame, title=title)
        .mark_area(line=True, opacity=0.4, interpolate="step-after")
        .encode(
            x=alt.X("time_s:Q", title="time since first request (s)"),
            y=alt.Y(f"{field}:Q", title=title),
            tooltip=[
                alt.Tooltip("time_s:Q", format=",.0f"),
                alt.Tooltip(f"{field}:Q", format=",.2f"),
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
            tooltip=[x, y],
        )
    )


def tenants_chart(frame: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(frame, title="Prompt tokens by tenant")
        .mark_bar()
        .encode(
            y=alt.Y("tenant:N", sort=None, title=None, axis=alt.Axis(labelLimit=220)),
            x=alt.X("prompt_tokens:Q", title="prompt tokens"),
            tooltip=["tenant", "requests", "prompt_tokens"],
        )
    )


# --- prefix tree -------------------------------------------------------------------------


def prefix_tree_frame(trace: BlockTrace, levels: int = 4, min_share: float = 0.01) -> pd.DataFrame:
    """Icicle rectangles of the prefix tree over the first ``levels`` blocks of requests.

    Because block ids are chained, block ``k`` of a request identifies its whole prefix
    up to block ``k``: the node at depth ``k`` is just that id. Widths count requests
    (the whole x axis is all requests); nodes holding less than ``min_share`` of the
    requests are merged into one "other" rectangle under their parent and not expanded.
    Requests shorter than a level leave a gap under their parent. As in a radix tree, a
    node whose requests all continue into one child is drawn as one taller rectangle
    (``y0_tokens`` to ``y1_tokens``), so a shared system prompt is one bar.
    """
    n = trace.n_requests
    cols = [
        "level",
        "y0_tokens",
        "y1_tokens",
        "x0",
        "x1",
        "requests",
        "share",
        "label",
        "group",
        "tokens",
    ]
    if n == 0 or trace.n_accesses == 0:
        return pd.DataFrame(columns=cols)
    bs = trace.block_size
    lengths = np.diff(trace.offsets)
    starts = trace.offsets[:-1]
    min_count = max(1, math.ceil(min_share * n))
    rows: list[dict] = []
    # Per request, the displayed node it sits under: -1 the root, -2 not expanded further.
    parent = np.full(n, -1, dtype=np.int64)
    x0_of: dict[int, float] = {-1: 0.0}
    group_of: dict[int, str] = {-1: ""}
    row_of: dict[int, int] = {}  # displayed node -> its rectangle
    count_of: dict[int, int] = {-1: n}
    for level in range(levels):
        active = np.flatnonzero((lengths > level) & (parent != -2))
        if active.size == 0:
            break
        node = trace.block_ids[starts[active] + level]
        uniq, first, counts = np.unique(node, return_index=True, return_counts=True)
        # Chained ids: every request through a node has the same parent.
        parent_of = dict(zip(uniq.tolist(), parent[active[first]].tolist(), strict=True))
        children: dict[int, list[tuple[int, int]]] = {}
        merged: dict[int, int] = {}
        for nd, c in zip(uniq.tolist(), counts.tolist(), strict=True):
            p = parent_of[nd]
            if c >= min_count:
                children.setdefault(p, []).append((nd, c))
            else:
                merged[p] = merged.get(p, 0) + c
        next_x0: dict[int, float] = {}
        for p in sorted(set(children) | set(merged), key=lambda q: x0_of[q]):
            x = x0_of[p]
            for nd, c in sorted(children.get(p, []), key=lambda t: (-t[1], t[0])):
                group_of[nd] = group_of[p] or _label(trace, nd)
                count_of[nd] = c
                next_x0[nd] = x
                if p != -1 and c == count_of[p]:
                    # Every request of the parent continues here: extend its rectangle.
                    row_of[nd] = row_of[p]
                    rect = rows[row_of[nd]]
                    rect["y1_tokens"] = (level + 1) * bs
                    rect["tokens"] = f"{rect['y0_tokens']:,}-{rect['y1_tokens']:,}"
                else:
                    row_of[nd] = len(rows)
                    rows.append(_rect(level, bs, x, c, n, _label(trace, nd), group_of[nd]))
                x += c
            if p in merged:
                label = f"other ({merged[p]:,} requests, each prefix < {min_share:.0%})"
                rows.append(_rect(level, bs, x, merged[p], n, label, group_of[p] or "other"))
        x0_of = {-1: 0.0, **next_x0}
        expanded = np.isin(node, np.fromiter(next_x0, dtype=np.int64, count=len(next_x0)))
        parent = np.full(n, -2, dtype=np.int64)
        parent[active[expanded]] = node[expanded]
    return pd.DataFrame(rows, columns=cols)


def _label(trace: BlockTrace, node: int) -> str:
    text = trace.previews.get(int(node))
    if text:
        text = " ".join(text.split())
        return text if len(text) <= 60 else text[:57] + "..."
    return f"block #{int(node)}"


def _rect(level: int, bs: int, x: float, c: int, n: int, label: str, group: str) -> dict:
    return {
        "level": level,
        "y0_tokens": level * bs,
        "y1_tokens": (level + 1) * bs,
        "x0": x / n,
        "x1": (x + c) / n,
        "requests": c,
        "share": c / n,
        "label": label,
        "group": group,
        "tokens": f"{level * bs:,}-{(level + 1) * bs:,}",
    }


def prefix_tree_chart(frame: pd.DataFrame) -> alt.Chart:
    groups = frame.loc[frame["level"] == 0].sort_values("x0")["group"].tolist()
    return (
        alt.Chart(frame, title="Prefix tree (icicle): width = share of requests")
        .mark_rect(stroke="white", strokeWidth=0.3)
        .encode(
            x=alt.X(
                "x0:Q",
                title="share of requests",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            x2="x1:Q",
            y=alt.Y(
                "y0_tokens:Q",
                title="tokens into the prompt",
                scale=alt.Scale(reverse=True, nice=False),
            ),
            y2="y1_tokens:Q",
            color=alt.Color("group:N", sort=groups[:10], legend=None),
            tooltip=[
                alt.Tooltip("label:N", title="prefix starts"),
                alt.Tooltip("tokens:N", title="tokens"),
                alt.Tooltip("requests:Q", format=","),
                alt.Tooltip("share:Q", format=".1%"),
            ],
        )
        .properties(height=420)
    )


# --- reuse -------------------------------------------------------------------------------


def granularity_frame(granularity: dict) -> pd.DataFrame:
    """Ceiling per block size (and token-exact when the trace had it), steady and cold."""
    rows = []
    exact = granularity.get("token_exact", {})
    if exact.get("available"):
        rows.append(
            {
                "granularity": "token-exact",
                "steady": exact["hit_rate"],
                "cold": exact["cold_hit_rate"],
                "note": "",
            }
        )
    for row in granularity.get("blocks", []):
        rows.append(
            {
                "granularity": f"{row['block_size']} tokens",
                "steady": row.get("hit_rate") if row.get("available") else None,
                "cold": row.get("cold_hit_rate") if row.get("available") else None,
                "note": "" if row.get("available") else row.get("reason", ""),
            }
        )
    return pd.DataFrame(rows, columns=["granularity", "steady", "cold", "note"])


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


SOURCE_LABELS = {
    "same_session": "same session",
    "same_tenant": "same tenant, other session",
    "cross_tenant": "another tenant",
    "unattributed": "unattributed",
}


def sources_frame(sources: dict) -> pd.DataFrame:
    shares = sources.get("share_of_hits", {})
    tokens = sources.get("tokens", {})
    rows = [
        {"source": SOURCE_LABELS.get(k, k), "share": v, "tokens": tokens.get(k, 0)}
        for k, v in shares.items()
    ]
    return pd.DataFrame(rows, columns=["source", "share", "tokens"])


def sources_chart(frame: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(frame, title="Share of reused tokens by who held them last")
        .mark_bar()
        .encode(
            y=alt.Y("source:N", sort=None, title=None, axis=alt.Axis(labelLimit=220)),
            x=alt.X("share:Q", title="share of hits", axis=alt.Axis(format="%")),
            tooltip=[
                "source",
                alt.Tooltip("share:Q", format=".1%"),
                alt.Tooltip("tokens:Q", format=","),
            ],
        )
    )


def top_prefixes_frame(entries: list[dict]) -> pd.DataFrame:
    """The top shared prefixes; the preview column only when the log had text."""
    cols = ["prefix_tokens", "requests", "reused_tokens", "preview", "hash"]
    if not any(e.get("preview") for e in entries):
        cols.remove("preview")
    return pd.DataFrame([{k: e.get(k) for k in cols} for e in entries], columns=cols)


# --- capacity ----------------------------------------------------------------------------


# Fixed colours so a policy looks the same on every chart (LRU, the engines' default, dark).
POLICY_COLORS = {"lru": "#1f4e79", "fifo": "#e07b00", "s3fifo": "#2e8b57", "optimal": "#8c8c8c"}


def curves_frame(curves: dict, bytes_per_token: int | None) -> pd.DataFrame:
    """Hit rate against capacity per policy, with capacities in tokens and GiB."""
    rows = []
    for policy, points in curves.items():
        for p in points:
            cap = int(p["capacity_tokens"])
            rows.append(
                {
                    "policy": policy,
                    "capacity_tokens": cap,
                    "capacity_gib": cap * bytes_per_token / GIB if bytes_per_token else None,
                    "hit_rate": p["hit_rate"],
                }
            )
    return pd.DataFrame(rows, columns=["policy", "capacity_tokens", "capacity_gib", "hit_rate"])


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
    x = alt.X(f"{x_field}:Q", title=x_title, scale=alt.Scale(type="log"))
    y = alt.Y("hit_rate:Q", title="steady-state hit rate", axis=alt.Axis(format="%"))
    lru = data[data.policy == "lru"]
    others = data[data.policy != "lru"]
    policies = [p for p in POLICY_COLORS if p in set(data.policy)]
    color = alt.Color(
        "policy:N",
        title="policy",
        scale=alt.Scale(domain=policies, range=[POLICY_COLORS[p] for p in policies]),
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
        "policy",
        alt.Tooltip("capacity_tokens:Q", format=",", title="tokens"),
        alt.Tooltip("capacity_gib:Q", format=",.2f", title="GiB"),
        alt.Tooltip("hit_rate:Q", format=".1%"),
    ]


# --- cost --------------------------------------------------------------------------------


def break_even_chart(rows: list[dict]) -> alt.LayerChart:
    """Break-even bandwidth against prefix length, with each link's bandwidth as a rule.

    Above the curve loading beats recomputing; a link whose rule lies above the curve at
    a prefix length wins there.
    """
    curve = pd.DataFrame(
        [
            {"prefix_tokens": r["prefix_tokens"], "break_even_gbps": r["break_even_gbps"]}
            for r in rows
            if r.get("break_even_gbps")
        ]
    ).drop_duplicates("prefix_tokens")
    x = alt.X("prefix_tokens:Q", title="prefix length (tokens)", scale=alt.Scale(type="log"))
    line = (
        alt.Chart(curve)
        .mark_line(point=True, strokeWidth=3)
        .encode(
            x=x,
            y=alt.Y(
                "break_even_gbps:Q",
                title="break-even bandwidth (GB/s)",
                scale=alt.Scale(type="log"),
            ),
            tooltip=[
                alt.Tooltip("prefix_tokens:Q", format=","),
                alt.Tooltip("break_even_gbps:Q", format=",.2f", title="GB/s"),
            ],
        )
    )
    rules = pd.DataFrame(
        [{"link": r["tier"], "bandwidth_gbps": r["bandwidth_gbps"]} for r in rows]
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


def prefix_time_chart(rows: list[dict]) -> alt.Chart:
    """Seconds to recompute a prefix against seconds to load it over each link."""
    out = []
    seen = set()
    for r in rows:
        if r["prefix_tokens"] not in seen:
            seen.add(r["prefix_tokens"])
            out.append(
                {
                    "prefix_tokens": r["prefix_tokens"],
                    "how": "recompute",
                    "seconds": r["recompute_s"],
                }
            )
        out.append(
            {
                "prefix_tokens": r["prefix_tokens"],
                "how": f"load: {r['tier']}",
                "seconds": r["load_s"],
            }
        )
    return (
        alt.Chart(
            pd.DataFrame([r for r in out if r["seconds"] > 0]),
            title="Time to have a prefix's KV: recompute or load",
        )
        .mark_line(point=True)
        .encode(
            x=alt.X("prefix_tokens:Q", title="prefix length (tokens)", scale=alt.Scale(type="log")),
            y=alt.Y("seconds:Q", title="seconds", scale=alt.Scale(type="log")),
            color=alt.Color("how:N", title=None),
            strokeDash=alt.condition(
                alt.datum.how == "recompute", alt.value([1, 0]), alt.value([4, 2])
            ),
            tooltip=[
                "how",
                alt.Tooltip("prefix_tokens:Q", format=","),
                alt.Tooltip("seconds:Q", format=".4f"),
            ],
        )
        .properties(height=360)
    )


# --- replay ------------------------------------------------------------------------------


def ttft_quantiles_frame(
    ttft_by_scenario: dict[str, np.ndarray], points: int = 200
) -> pd.DataFrame:
    """The TTFT distribution of each scenario as quantiles (an ECDF small enough to draw)."""
    rows = []
    q = np.linspace(0.0, 1.0, points + 1)
    for name, ttft in ttft_by_scenario.items():
        if ttft.size == 0:
            continue
        values = np.quantile(ttft, q)
        rows += [
            {"scenario": name, "ttft_s": float(v), "quantile": float(p)}
            for v, p in zip(values, q, strict=True)
        ]
    return pd.DataFrame(rows, columns=["scenario", "ttft_s", "quantile"])


def ttft_chart(frame: pd.DataFrame, slo_s: float) -> alt.LayerChart:
    positive = frame[frame.ttft_s > 0]
    lines = (
        alt.Chart(positive)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("ttft_s:Q", title="time to first token (s)", scale=alt.Scale(type="log")),
            y=alt.Y("quantile:Q", title="share of requests", axis=alt.Axis(format="%")),
            color=_scenario_color(list(dict.fromkeys(positive.scenario))),
            tooltip=[
                "scenario",
                alt.Tooltip("ttft_s:Q", format=".3f"),
                alt.Tooltip("quantile:Q", format=".0%"),
            ],
        )
    )
    slo = (
        alt.Chart(pd.DataFrame({"ttft_s": [slo_s], "label": [f"SLO {slo_s:g} s"]}))
        .mark_rule(color="red", strokeDash=[4, 3])
        .encode(x="ttft_s:Q", tooltip=["label"])
    )
    return alt.layer(lines, slo).properties(height=320, title="TTFT distribution (CDF)")


# The standard scenarios keep their colours on every chart; user-defined ones get the rest.
SCENARIO_COLORS = {
    "none": "#8c8c8c",
    "local": "#1f4e79",
    "local+dram": "#5b9bd5",
    "pooled": "#e07b00",
}
_EXTRA_COLORS = ("#2e8b57", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf")


def _scenario_color(names: list[str]) -> alt.Color:
    extra = iter(_EXTRA_COLORS * 4)
    colors = [SCENARIO_COLORS.get(n) or next(extra) for n in names]
    return alt.Color("scenario:N", sort=names, scale=alt.Scale(domain=names, range=colors))


def tier_hits_frame(scenarios: dict[str, dict]) -> pd.DataFrame:
    rows = [
        {"scenario": name, "tier": tier, "hit_rate": rate}
        for name, s in scenarios.items()
        for tier, rate in s["hit_rate_by_tier"].items()
        if rate
    ]
    return pd.DataFrame(rows, columns=["scenario", "tier", "hit_rate"])


def tier_hits_chart(frame: pd.DataFrame, order: list[str]) -> alt.Chart:
    return (
        alt.Chart(frame, title="Prompt tokens served from cache, by tier")
        .mark_bar()
        .encode(
            x=alt.X("scenario:N", sort=order, title=None, axis=alt.Axis(labelAngle=0)),
            y=alt.Y("hit_rate:Q", title="share of prompt tokens", axis=alt.Axis(format="%")),
            color=alt.Color(
                "tier:N",
                scale=alt.Scale(
                    domain=["hbm", "dram", "nvme", "pool"],
                    range=["#1f4e79", "#5b9bd5", "#a9d18e", "#e07b00"],
                ),
            ),
            order=alt.Order("tier:N"),
            tooltip=["scenario", "tier", alt.Tooltip("hit_rate:Q", format=".1%")],
        )
        .properties(height=300)
    )


def scenario_bar_chart(
    frame: pd.DataFrame, field: str, title: str, axis_title: str, fmt: str, order: list[str]
) -> alt.Chart:
    return (
        alt.Chart(frame, title=title)
        .mark_bar()
        .encode(
            x=alt.X("scenario:N", sort=order, title=None, axis=alt.Axis(labelAngle=0)),
            y=alt.Y(f"{field}:Q", title=axis_title),
            tooltip=["scenario", alt.Tooltip(f"{field}:Q", format=fmt)],
        )
        .properties(height=300)
    )


def scenarios_frame(scenarios: dict[str, dict]) -> pd.DataFrame:
    """One row per scenario with the figures the comparison table shows."""
    rows = []
    for name, s in scenarios.items():
        t = s["ttft_s"]
        rows.append(
            {
                "scenario": name,
                "hit rate": s["hit_rate"],
                "TTFT mean (s)": t["mean"],
                "p50 (s)": t["p50"],
                "p90 (s)": t["p90"],
                "p99 (s)": t["p99"],
                "prefill GPU-s": s["prefill_gpu_s"],
                "network GB": s["network_bytes"] / 1e9,
                "peak link use": s.get("peak_link_utilisation"),
                "max rate x at SLO": rate_at_slo(s),
                "description": s.get("description", ""),
            }
        )
    return pd.DataFrame(rows)


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
                "prompt_tokens",
                "cached_tokens",
                "concurrency",
                "load_gbps",
                alt.Tooltip("measured_s:Q", format=".4f"),
                alt.Tooltip("predicted_s:Q", format=".4f"),
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
