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
            y=alt.Y("tenant:N", sort=None, title=None),
            x=alt.X("prompt_tokens:Q", title="prompt tokens"),
            tooltip=["tenant", "requests", "prompt_tokens"],
        )
    )


# --- prefix tree -------------------------------------------------------------------------


def prefix_tree_frame(trace: BlockTrace, levels: int = 4, min_share: float = 0.01) -> pd.DataFrame:
    """Icicle rectangles of the first ``levels`` blocks of every request.

    Because block ids are chained, block ``k`` of a request identifies its whole prefix
    up to block ``k``: the node at depth ``k`` is just that id. Widths count requests
    (the whole x axis is all requests); nodes holding less than ``min_share`` of the
    requests are merged into one "other" rectangle under their parent and not expanded.
    Requests shorter than a level leave a gap under their parent.
    """
    n = trace.n_requests
    cols = ["level", "x0", "x1", "requests", "share", "label", "group", "tokens"]
    if n == 0 or trace.n_accesses == 0:
        return pd.DataFrame(columns=cols)
    lengths = np.diff(trace.offsets)
    starts = trace.offsets[:-1]
    min_count = max(1, math.ceil(min_share * n))
    rows: list[dict] = []
    # Per request, the displayed node it sits under: -1 the root, -2 not expanded further.
    parent = np.full(n, -1, dtype=np.int64)
    x0_of: dict[int, float] = {-1: 0.0}
    group_of: dict[int, str] = {-1: ""}
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
                label = _label(trace, nd)
                group_of[nd] = group_of[p] or label
                rows.append(_rect(trace, level, x, c, n, label, group_of[nd]))
                next_x0[nd] = x
                x += c
            if p in merged:
                label = f"other ({merged[p]:,} requests, each prefix < {min_share:.0%})"
                rows.append(_rect(trace, level, x, merged[p], n, label, group_of[p] or "other"))
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


def _rect(trace: BlockTrace, level: int, x: float, c: int, n: int, label: str, group: str) -> dict:
    bs = trace.block_size
    return {
        "level": level,
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
        .mark_rect(stroke="white", strokeWidth=0.5)
        .encode(
            x=alt.X(
                "x0:Q",
                title="share of requests",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            x2="x1:Q",
            y=alt.Y("level:O", title="block level (depth into the prompt)"),
            color=alt.Color("group:N", sort=groups[:10], legend=None),
            tooltip=[
                alt.Tooltip("label:N", title="prefix starts"),
                alt.Tooltip("tokens:N", title="tokens"),
                alt.Tooltip("requests:Q", format=","),
                alt.Tooltip("share:Q", format=".1%"),
            ],
        )
        .properties(height=260)
    )
