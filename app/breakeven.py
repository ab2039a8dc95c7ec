"""The Cost page's links: the what-if's DRAM, NVMe and pool links (catalog tiers with the
sidebar's figures in force) and where loading a prefix over each beats recomputing it, cached
per model, GPU and link settings."""

from __future__ import annotations

import streamlit as st

from app.compute import cost_model

# Prefix lengths the cost page plots (tokens): powers of two from 128 to 128k.
PREFIX_GRID = [2**k for k in range(7, 18)]


def whatif_links(w) -> list:
    """The DRAM, NVMe and pool links of the what-if cluster: catalog ``TierSpec``s with
    the sidebar's bandwidth and latency in force (``resolve_link``, as the replay and
    `kvpool analyze` read them; a set figure renames the link so charts say so)."""
    from analyzer.replay import ClusterConfig, resolve_link

    return [resolve_link(link) for link in (w.dram_link, ClusterConfig().nvme_link, w.pool_link)]


def _links_key(links) -> tuple:
    return tuple((t.name, t.bandwidth_gbps, t.latency_s, t.kind) for t in links)


@st.cache_data(show_spinner=False, max_entries=64)
def _break_even_rows(model: str, gpu: str, tp: int, kv_dtype: str, links_key: tuple) -> list:
    from analyzer.cost import TierSpec

    cm = cost_model(model, gpu, tp, kv_dtype)
    links = [
        TierSpec(name=n, bandwidth_gbps=b, latency_s=lat, kind=k) for n, b, lat, k in links_key
    ]
    return cm.break_even_table(PREFIX_GRID, tiers=links)


def break_even_rows(w) -> list:
    """``CostModel.break_even_table`` over :data:`PREFIX_GRID` for the what-if links."""
    return _break_even_rows(w.model, w.gpu, w.tp, w.kv_dtype, _links_key(whatif_links(w)))


@st.cache_data(show_spinner=False, max_entries=64)
def _tier_break_even(model: str, gpu: str, tp: int, kv_dtype: str, links_key: tuple) -> list[dict]:
    from analyzer.cost import TierSpec, list_tiers

    cm = cost_model(model, gpu, tp, kv_dtype)
    names = [t.name for t in list_tiers() if t.kind != "gpu"]
    custom = [
        TierSpec(name=n, bandwidth_gbps=b, latency_s=lat, kind=k)
        for n, b, lat, k in links_key
        if n not in names
    ]
    return cm.tier_break_even(tiers=[*names, *custom])


def tier_break_even(w) -> list[dict]:
    """Per catalog tier (and the sidebar's own links): the shortest prefix worth loading."""
    return _tier_break_even(w.model, w.gpu, w.tp, w.kv_dtype, _links_key(whatif_links(w)))
