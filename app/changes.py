"""What a what-if changed: the settings moved, and each figure that moved with them.

A page hands :func:`show` its settings and its headline figures, both as the words it
shows them in. The page remembers the last two sets it showed: when the settings differ
from the previous ones, it says which settings moved (before -> after) and which
figures moved with them, and keeps saying it on reruns that change nothing (a chart's
unit, a tab) until the settings move again. A figure that did not move is not listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import streamlit as st

from analyzer.quoting import st_text
from app.controls import WhatIf

_KEY = "kvpool.changes"

# The sidebar's words for each what-if setting, and how its value reads.
SETTING_WORDS = {
    "model": "model",
    "gpu": "GPU",
    "tp": "tensor parallel",
    "kv_dtype": "KV dtype",
    "instances": "instances",
    "router": "router",
    "eviction": "eviction",
    "local_capacity_gb": "HBM prefix cache per instance (GB)",
    "dram_tier": "host DRAM link",
    "dram_capacity_gb": "host DRAM per node (GB)",
    "dram_gbps": "host DRAM bandwidth (GB/s)",
    "dram_latency_us": "host DRAM first byte (µs)",
    "pool_tier": "pool network",
    "pool_capacity_gb": "pool capacity (GB)",
    "pool_gbps": "pool bandwidth per node (GB/s)",
    "pool_latency_us": "pool first byte (µs)",
    "ttft_slo_s": "p90 TTFT SLO (s)",
    "warmup": "warm-up",
    "gpus_per_node": "GPUs per node",
    "dram_scope": "host DRAM cache",
    "isolation": "who may share KV blocks",
}
_DERIVED_AT_ZERO = {"local_capacity_gb", "pool_capacity_gb"}
_CATALOG_WHEN_EMPTY = {"dram_gbps", "dram_latency_us", "pool_gbps", "pool_latency_us"}


def setting_words(w: WhatIf) -> dict[str, str]:
    """The what-if settings as the sidebar words them (a capacity at 0 reads "derived",
    a link figure left empty "catalog")."""
    out = {}
    for f in fields(w):
        v = getattr(w, f.name)
        if f.name in _DERIVED_AT_ZERO and not v:
            text = "derived"
        elif f.name in _CATALOG_WHEN_EMPTY and v is None:
            text = "catalog"
        elif f.name == "model":
            text = v or "the log's own"
        elif f.name == "tp":
            text = str(v) if v else "smallest that fits"
        elif f.name == "warmup":
            text = f"{v:.0%}"
        else:
            text = f"{v:g}" if isinstance(v, float) else str(v)
        out[SETTING_WORDS.get(f.name, f.name)] = text
    return out


@dataclass
class _Seen:
    settings: dict[str, str]
    figures: dict[str, str]
    before: tuple[dict[str, str], dict[str, str]] | None = None


def moves(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """``name: before -> after`` for each entry whose words changed (new entries too)."""
    return [f"{k}: {before.get(k, '-')} → {v}" for k, v in after.items() if before.get(k, "-") != v]


def show(page: str, settings: Mapping[str, str], figures: Mapping[str, str]) -> None:
    """Say what the last change of ``settings`` moved on ``page`` (nothing on a first
    visit, or when nothing changed since the page was opened)."""
    seen: dict[str, _Seen] = st.session_state.setdefault(_KEY, {})
    now = seen.get(page)
    settings, figures = dict(settings), dict(figures)
    if now is None:
        seen[page] = _Seen(settings, figures)
        return
    if settings != now.settings:
        now.before = (now.settings, now.figures)
        now.settings = settings
    now.figures = figures
    if now.before is None:
        return
    was_settings, was_figures = now.before
    changed = moves(was_settings, settings)
    if not changed:
        return
    moved = moves(was_figures, figures)
    # settings and figures may hold a model name from the log: text, never markup
    lines = ["**What changed**: " + st_text("; ".join(changed)) + "."]
    lines.append(
        ("**What moved**: " + st_text("; ".join(moved)) + ".")
        if moved
        else "No figure on this page moved."
    )
    st.info("\n\n".join(lines), icon=":material/compare_arrows:")
