"""Every chart's data, labels, colours and orders, in one place.

The dashboard (``app/charts.py``, interactive Altair) and the report
(``analyzer/report/charts.py``, SVG through vl-convert) draw the same figures; both read
their tables, the words on their axes and legends, the colour of each scenario, tier
and policy and the order things are listed in from here, so a scenario is the same
colour and a column the same name on screen and on paper.

Functions named ``*_frame`` turn a stage's output (a ``BlockTrace``, a reuse or replay
report) into the tidy table a chart draws: they bin, sort and name columns; the one
analysis here, :func:`prefix_tree_frame`, is a pure function of the trace, tested on a
hand-built trace. ``*_table`` functions give the same figures as the words and units a
reader sees in a table (percentages, seconds, GB), never raw key names.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analyzer.advisor.figures import Verdict
from analyzer.advisor.words import OPTION_DESCRIPTION, OPTION_NAME, count
from analyzer.replay.config import Scenario, Tier
from analyzer.reuse.records import models_words, tenants_words
from analyzer.trace import BlockTrace

if TYPE_CHECKING:
    from analyzer.replay.run import ScenarioResult
    from analyzer.report.views import SizingView
    from analyzer.reuse.records import (
        CapacityRow,
        CurvePoint,
        Granularity,
        ReuseSources,
        SharedPrefix,
    )

# --- orders, colours and words -------------------------------------------------------------

SCENARIO_ORDER = (
    Scenario.NONE,
    Scenario.LOCAL,
    Scenario.LOCAL_DRAM,
    Scenario.LOCAL_DRAM_NVME,
    Scenario.POOLED,
)
# The standard scenarios keep their colours on every chart; user-defined ones get the rest.
SCENARIO_COLORS: dict[str, str] = {
    Scenario.NONE: "#8c8c8c",
    Scenario.LOCAL: "#1f4e79",
    Scenario.LOCAL_DRAM: "#5b9bd5",
    Scenario.LOCAL_DRAM_NVME: "#2e8b57",
    Scenario.POOLED: "#e07b00",
}
_EXTRA_COLORS = ("#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
# Each option's one name (analyzer.advisor.words, shared with the CLI and the dashboard).
SCENARIO_LABELS: dict[str, str] = dict(OPTION_NAME)
TIER_ORDER = (Tier.HBM, Tier.DRAM, Tier.NVME, Tier.POOL)
TIER_LABELS: dict[str, str] = {
    Tier.HBM: "GPU HBM",
    Tier.DRAM: "host DRAM",
    Tier.NVME: "NVMe",
    Tier.POOL: "pool (network)",
}
TIER_COLORS: dict[str, str] = {
    Tier.HBM: "#1f4e79",
    Tier.DRAM: "#5b9bd5",
    Tier.NVME: "#a9d18e",
    Tier.POOL: "#e07b00",
}
# Fixed colours so a policy looks the same on every chart (LRU, the engines' default, dark).
POLICY_COLORS = {"lru": "#1f4e79", "fifo": "#e07b00", "s3fifo": "#2e8b57", "optimal": "#8c8c8c"}
POLICY_ORDER = ("lru", "fifo", "s3fifo", "optimal")
POLICY_LABELS = {"lru": "LRU", "fifo": "FIFO", "s3fifo": "S3-FIFO", "optimal": "Belady (optimal)"}
SOURCE_LABELS = {
    "same_session": "same session",
    "same_tenant": "same tenant, other session",
    "cross_tenant": "another tenant",
    "unattributed": "unattributed",
}
# Merged "other" slices of the icicle: grey, so they never read as one shared prefix.
OTHER_COLOR = "#d0d0d0"
# The verdict's headline and banner colour, the same in the report and on the dashboard.
VERDICT_TEXT: dict[str, str] = {
    Verdict.DEPLOY_POOLED: "Deploy a pooled KV cache",
    Verdict.LOCAL_OFFLOAD_ONLY: "Offload locally, do not pool",
    Verdict.NOT_WORTH_IT: "Pooling is not worth it",
    Verdict.CANNOT_MEET_SLO: "No deployment meets the SLO",
    Verdict.INSUFFICIENT_DATA: "Not enough data to decide",
}
VERDICT_COLOR: dict[str, str] = {
    Verdict.DEPLOY_POOLED: "#1d7a3a",
    Verdict.LOCAL_OFFLOAD_ONLY: "#1f5fa8",
    Verdict.NOT_WORTH_IT: "#8a5a00",
    Verdict.CANNOT_MEET_SLO: "#a11d1d",
    Verdict.INSUFFICIENT_DATA: "#777777",
}


def scenario_label(name: str) -> str:
    return SCENARIO_LABELS.get(name, name)


def option_description(name: str) -> str:
    """What an option deploys, in the report's words (a user-defined scenario: its own)."""
    return OPTION_DESCRIPTION.get(name) or name


def scenario_colors(names: list[str]) -> list[str]:
    """One colour per scenario name, the standard ones fixed, others from a spare list."""
    extra = iter(_EXTRA_COLORS * 4)
    return [SCENARIO_COLORS.get(n) or next(extra) for n in names]


def percent(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}%"


def seconds(x: float | None) -> str:
    """A time in seconds as the report's tables print a TTFT: whole milliseconds."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x * 1000:,.0f} ms"


def tokens(n: float | None) -> str:
    return "-" if n is None or not math.isfinite(n) else f"{n:,.0f}"


def rate_multiple(x: float | None, capped: bool = False) -> str:
    """A rate search's result: x16, or >= x32 when the search's top scale still passed."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{'>= ' if capped else ''}x{x:.3g}"


GIB = 2**30


# Round bin widths for arrival charts, in seconds.
_NICE_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


def _nice_step(span_s: float, max_bins: int = 120) -> float:
    for step in _NICE_STEPS_S:
        if span_s / step <= max_bins:
            return float(step)
    return float(math.ceil(span_s / max_bins / 86400) * 86400)


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
        "kind",
    ]
    if n == 0 or trace.n_accesses == 0:
        return pd.DataFrame(columns=cols)
    bs = trace.block_size
    lengths = np.diff(trace.offsets)
    starts = trace.offsets[:-1]
    min_count = max(1, math.ceil(min_share * n))
    rows: list[dict[str, object]] = []
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
                rows.append(
                    _rect(level, bs, x, merged[p], n, label, group_of[p] or "other", "other")
                )
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


def _rect(
    level: int, bs: int, x: float, c: int, n: int, label: str, group: str, kind: str = "prefix"
) -> dict[str, Any]:
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
        "kind": kind,  # "prefix": one distinct prefix; "other": small ones merged
    }


def granularity_frame(granularity: Granularity | None) -> pd.DataFrame:
    """Ceiling per block size (and token-exact when the trace had it), steady and cold."""
    rows = []
    if granularity is not None and granularity.token_exact.available:
        exact = granularity.token_exact
        rows.append(
            {
                "granularity": "token-exact",
                "steady": exact.hit_rate,
                "cold": exact.cold_hit_rate,
                "note": "",
            }
        )
    for row in granularity.blocks if granularity is not None else ():
        rows.append(
            {
                "granularity": f"{row.block_size_tokens} tokens",
                "steady": row.hit_rate if row.available else None,
                "cold": row.cold_hit_rate if row.available else None,
                "note": "" if row.available else (row.reason or ""),
            }
        )
    return pd.DataFrame(rows, columns=["granularity", "steady", "cold", "note"])


def granularity_table(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`granularity_frame` as a reader sees it (percentages, no key names)."""
    return pd.DataFrame(
        {
            "cached in": frame["granularity"],
            "ceiling, steady state": [percent(x) for x in frame["steady"]],
            "ceiling, cold start": [percent(x) for x in frame["cold"]],
            "note": frame["note"],
        }
    )


def sources_frame(sources: ReuseSources | None) -> pd.DataFrame:
    """Where reuse comes from, as the report defines it: each source's reused tokens as
    a share of the counted prompt tokens (``share_of_prompt``; they add up to the
    steady-state ceiling, not to 100%)."""
    rows = (
        [
            {
                "source": SOURCE_LABELS.get(k, k),
                "share": v,
                "tokens": sources.hit_tokens_by_source.get(k, 0),
            }
            for k, v in sources.share_of_prompt.items()
        ]
        if sources is not None
        else []
    )
    return pd.DataFrame(rows, columns=["source", "share", "tokens"])


def sources_table(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`sources_frame` in the report's words: source and share of prompt tokens."""
    return pd.DataFrame(
        {
            "source": frame["source"],
            "share of prompt tokens": [percent(x) for x in frame["share"]],
            "reused tokens": [tokens(x) for x in frame["tokens"]],
        }
    )


LINK_KIND = {"host-dram": "host DRAM", "local-disk": "local NVMe", "network": "network"}


def link_break_even_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``CostModel.tier_break_even``'s rows as a reader sees them: each link, its kind,
    bandwidth in GB/s and first-byte latency in µs, and the shortest prefix worth
    loading over it rather than recomputing."""
    return pd.DataFrame(
        [
            {
                "link": r["tier"],
                "kind": LINK_KIND.get(r["kind"], r["kind"]),
                "bandwidth": f"{r['bandwidth_gbps']:,.4g} GB/s",
                "first byte": f"{1e6 * r['latency_s']:,.4g} µs",
                "shortest prefix worth loading": "never"
                if r["break_even_prefix_tokens"] is None
                else f"{r['break_even_prefix_tokens']:,} tokens",
            }
            for r in rows
        ],
        columns=["link", "kind", "bandwidth", "first byte", "shortest prefix worth loading"],
    )


def top_prefixes_frame(entries: Sequence[SharedPrefix]) -> pd.DataFrame:
    """The top shared prefixes as the report's table says what they are (length,
    requests, tenants, models); the text column only when the log kept previews."""
    previews = any(e.preview for e in entries)
    rows = [
        {
            "tokens": tokens(e.prefix_tokens),
            "requests": tokens(e.requests),
            "tenants": tenants_words(e.tenants),
            "models": models_words(e.models),
            "reused tokens": tokens(e.reused_tokens),
            **({"text": e.preview or "-"} if previews else {}),
        }
        for e in entries
    ]
    cols = ["tokens", "requests", "tenants", "models", "reused tokens"]
    return pd.DataFrame(rows, columns=cols + (["text"] if previews else []))


def curves_frame(
    curves: Mapping[str, Sequence[CurvePoint]], bytes_per_token: int | None
) -> pd.DataFrame:
    """Hit rate against capacity per policy, with capacities in tokens and GiB."""
    rows = []
    for policy, points in curves.items():
        for p in points:
            cap = int(p.capacity_tokens)
            rows.append(
                {
                    "policy": policy,
                    "capacity_tokens": cap,
                    "capacity_gib": cap * bytes_per_token / GIB if bytes_per_token else None,
                    "hit_rate": _round6(p.hit_rate),
                }
            )
    return pd.DataFrame(rows, columns=["policy", "capacity_tokens", "capacity_gib", "hit_rate"])


def capacities_frame(rows: Sequence[CapacityRow], bytes_per_token: int) -> pd.DataFrame:
    """The capacities compared, in tokens and GiB of the model's KV, one column per
    policy's steady-state hit rate in percent, under the policies' names."""
    out = []
    for r in rows:
        rates = {"lru": r.lru_hit_rate, **r.hit_rate_by_policy}
        out.append(
            {
                "capacity (tokens)": tokens(r.capacity_tokens),
                "GiB of KV": f"{r.capacity_tokens * bytes_per_token / GIB:,.2f}",
                **{f"{POLICY_LABELS.get(k, k)} hit rate": percent(v) for k, v in rates.items()},
            }
        )
    return pd.DataFrame(out)


def _round6(x: float) -> float:
    return round(float(x), 6)


def ttft_quantiles_frame(
    ttft_by_scenario: dict[str, np.ndarray], points: int = 200
) -> pd.DataFrame:
    """The TTFT distribution of each scenario as quantiles (an ECDF small enough to draw),
    in milliseconds, the tables' unit."""
    rows = []
    q = np.linspace(0.0, 1.0, points + 1)
    for name, ttft in ttft_by_scenario.items():
        if ttft.size == 0:
            continue
        values = np.quantile(ttft, q)
        rows += [
            {"scenario": name, "ttft_ms": 1000 * float(v), "quantile": float(p)}
            for v, p in zip(values, q, strict=True)
        ]
    return pd.DataFrame(rows, columns=["scenario", "ttft_ms", "quantile"])


def tier_hits_frame(scenarios: Mapping[str, ScenarioResult]) -> pd.DataFrame:
    rows = [
        {"scenario": name, "tier": tier, "hit_rate": rate}
        for name, s in scenarios.items()
        for tier, rate in s.hit_rate_by_tier.items()
        if rate
    ]
    return pd.DataFrame(rows, columns=["scenario", "tier", "hit_rate"])


def scenarios_frame(scenarios: Mapping[str, ScenarioResult]) -> pd.DataFrame:
    """One row per scenario with the figures the comparison charts draw, as numbers
    (shares as fractions, times in seconds, traffic in GB; None where not measured)."""
    rows = []
    for name, s in scenarios.items():
        t = s.ttft
        rows.append(
            {
                "scenario": name,
                "label": scenario_label(name),
                "hit_rate": s.hit_rate,
                "ttft_mean_s": t.mean_s,
                "ttft_p50_s": t.p50_s,
                "ttft_p90_s": t.p90_s,
                "ttft_p99_s": t.p99_s,
                "prefill_gpu_s": s.prefill_gpu_s,
                "network_gb": s.network_bytes / 1e9,
                "peak_link_use": s.peak_link_utilisation,
                "max_rate_scale": s.max_rate_scale_at_slo,
                "max_rate_capped": s.search is not None and s.search.capped,
                "description": OPTION_DESCRIPTION.get(name, s.description),
            }
        )
    return pd.DataFrame(rows)


def scenarios_table(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`scenarios_frame` as a reader sees it: words, percentages and units."""
    return pd.DataFrame(
        [
            {
                "option": r["label"],
                "prompt tokens from cache": percent(r["hit_rate"]),
                "TTFT mean": seconds(r["ttft_mean_s"]),
                "TTFT p50": seconds(r["ttft_p50_s"]),
                "TTFT p90": seconds(r["ttft_p90_s"]),
                "TTFT p99": seconds(r["ttft_p99_s"]),
                "prefill GPU time": f"{r['prefill_gpu_s']:,.2f} GPU-s",
                "network traffic": f"{r['network_gb']:,.2f} GB",
                "busiest link, peak": percent(r["peak_link_use"], 0),
                "highest rate under the SLO": rate_multiple(
                    r["max_rate_scale"], r["max_rate_capped"]
                ),
            }
            for r in frame.to_dict("records")
        ],
    )


# --- recommendation ------------------------------------------------------------------------


def sizing_table(sizing: SizingView) -> list[dict[str, str]]:
    """The sized recommendation (the report's ``sizing`` object) as rows a manager reads:
    what, how much (in GB and tokens, GB/s, yes/no), and why."""

    def gb_tok(gb: float, tokens: int) -> str:
        return f"{gb:,.1f} GB ({tokens:,} tokens)"

    rows = [
        {
            "what": "Pooled KV store",
            "value": "yes" if sizing.pool else "no",
            "why": "",
        }
    ]
    if sizing.pool:
        rows.append(
            {
                "what": "Pool capacity, whole cluster",
                "value": gb_tok(sizing.pool_capacity_gb, sizing.pool_capacity_tokens),
                "why": "the knee of the hit-ratio curve",
            }
        )
    rows += [
        {
            "what": "Host DRAM for KV, per node",
            "value": gb_tok(sizing.dram_per_node_gb, sizing.dram_per_node_tokens),
            "why": sizing.dram_reason,
        },
        {
            "what": "HBM prefix cache, per instance",
            "value": gb_tok(sizing.hbm_cache_per_instance_gb, sizing.hbm_cache_per_instance_tokens),
            "why": "what the GPU's memory leaves after the weights and a reserve",
        },
        {
            "what": "Network per node",
            "value": f"{sizing.network_per_node_gbps:,.1f} GB/s ({sizing.nic})",
            "why": "beats recomputing the shorter reused prefixes, with headroom",
        },
        {
            "what": "Engine block size",
            "value": f"{sizing.block_size_tokens:,} tokens",
            "why": sizing.block_size_reason,
        },
        {
            "what": "Offload chunk",
            "value": f"{sizing.chunk_size_tokens:,} tokens",
            "why": "",
        },
        {"what": "Router", "value": sizing.router, "why": sizing.router_reason},
        {"what": "Eviction", "value": sizing.eviction, "why": sizing.eviction_reason},
        {
            "what": "Cluster",
            "value": f"{count(sizing.instances, 'instance')} on {count(sizing.nodes, 'node')} "
            f"({sizing.instances_per_node} per node)",
            "why": "",
        },
    ]
    return rows


# --- comparing pinned configurations ---------------------------------------------------------

# The deployment option each verdict recommends: its TTFT is the one a team compares.
RECOMMENDED_SCENARIO = {
    Verdict.DEPLOY_POOLED: Scenario.POOLED,
    Verdict.LOCAL_OFFLOAD_ONLY: Scenario.LOCAL_DRAM,
    Verdict.NOT_WORTH_IT: Scenario.LOCAL,
    Verdict.INSUFFICIENT_DATA: Scenario.LOCAL,
}
COMPARED_SETTINGS = (
    ("model", "model"),
    ("gpu", "GPU"),
    ("tp", "TP"),
    ("instances", "instances"),
    ("gpus_per_node", "GPUs per node"),
    ("router", "router"),
    ("dram_scope", "DRAM scope"),
    ("pool_tier", "pool network"),
    ("pool_gbps", "pool GB/s"),
    ("warmup", "warm-up"),
    ("ttft_slo_s", "SLO s"),
)


def _setting(opts: Any, name: str) -> Any:
    return getattr(opts, name, None)


def configuration_label(opts: Any, reference: Any) -> str:
    """How ``opts`` differs from ``reference`` (the first pinned), in a few words."""
    diffs = [
        f"{label} {_setting(opts, name)}"
        for name, label in COMPARED_SETTINGS
        if _setting(opts, name) != _setting(reference, name)
    ]
    if opts.thresholds != reference.thresholds:
        diffs.append("other thresholds")
    return ", ".join(diffs) or "as pinned first"


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One compared configuration: what differs from the reference, its verdict and
    GPUs, the p90 TTFT of the recommended option and of the local cache alone, the share
    of prompt tokens served from cache and the highest rate under the SLO (``None``
    where the analysis has no replay)."""

    option: str
    verdict: Verdict
    gpus: int
    recommended: str
    p90_ttft_recommended_s: float | None
    p90_ttft_local_s: float | None
    hit_rate: float | None
    max_rate_scale: float | None


def comparison_rows(results: list[Any]) -> list[ComparisonRow]:
    """One row per analysis (``AnalysisResult``, the first is the reference)."""
    rows: list[ComparisonRow] = []
    for i, r in enumerate(results):
        o = r.options
        rec = RECOMMENDED_SCENARIO.get(r.verdict, Scenario.LOCAL)
        s = r.replay.get(rec) if r.replay else None
        local = r.replay.get(Scenario.LOCAL) if r.replay else None
        rows.append(
            ComparisonRow(
                option=f"{chr(ord('A') + i)}: "
                + (configuration_label(o, results[0].options) if i else "reference"),
                verdict=Verdict(r.verdict),
                gpus=o.instances * o.tp,
                recommended=scenario_label(rec),
                p90_ttft_recommended_s=s.ttft_p90_s if s else None,
                p90_ttft_local_s=local.ttft_p90_s if local else None,
                hit_rate=s.hit_rate if s else None,
                max_rate_scale=s.max_rate_scale if s else None,
            )
        )
    return rows


def comparison_table(rows: list[ComparisonRow]) -> list[dict[str, object]]:
    """:func:`comparison_rows` in words and units."""
    return [
        {
            "option": r.option,
            "verdict": VERDICT_TEXT.get(r.verdict, r.verdict),
            "GPUs": r.gpus,
            "recommended": r.recommended,
            "p90 TTFT, recommended": seconds(r.p90_ttft_recommended_s),
            "p90 TTFT, local cache": seconds(r.p90_ttft_local_s),
            "prompt tokens from cache": percent(r.hit_rate),
            "highest rate under the SLO": rate_multiple(r.max_rate_scale),
        }
        for r in rows
    ]


def comparison_markdown(rows: list[ComparisonRow]) -> str:
    """The comparison as a Markdown section (appended to the downloaded report)."""
    table = comparison_table(rows)
    if not table:
        return ""
    cols = list(table[0])
    lines = [
        "## Configurations compared",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in table]
    return "\n".join(lines) + "\n"


def comparison_html(rows: list[ComparisonRow]) -> str:
    """The comparison as an HTML section (inserted into the downloaded report)."""

    table = comparison_table(rows)
    if not table:
        return ""
    cols = list(table[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in cols) + "</tr>"
        for r in table
    )
    return (
        "<section id='comparison'><h2>Configurations compared</h2>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>"
    )
