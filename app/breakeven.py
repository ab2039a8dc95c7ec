"""The Cost page's links: the what-if's DRAM, NVMe and pool links (catalog tiers with the
sidebar's figures in force) and where loading a prefix over each beats recomputing it, cached
per model, GPU and link settings."""

from __future__ import annotations

import streamlit as st

from app.compute import cost_model

# Prefix lengths the cost page plots (tokens): powers of two from 128 to 128k.
PREFIX_GRID = [2**k for k in range(7, 18)]


def _links_key(w) -> tuple:
    """The what-if's DRAM, NVMe and pool links as set (tier, GB/s, first-byte seconds;
    None: the catalog's figure): the cache key the cost model resolves them from."""
    from analyzer.replay import ClusterConfig

    links = (w.dram_link, ClusterConfig().nvme_link, w.pool_link)
    return tuple((link.tier, link.gbps, link.latency_s) for link in links)


def _resolved(cm, links_key: tuple) -> list:
    """Each link as one instance of ``cm`` sees it, with the sidebar's figures in force:
    ``resolve_link``, as the replay and `kvpool analyze` read it (a set figure renames
    the link so charts say so; a set host DRAM bandwidth is the instance's, not scaled
    by the TP degree again)."""
    from analyzer.replay import LinkSettings, resolve_link

    return [resolve_link(LinkSettings(*key), cm) for key in links_key]


@st.cache_data(show_spinner=False, max_entries=64)
def _break_even_rows(model: str, gpu: str, tp: int, kv_dtype: str, links_key: tuple) -> list:
    cm = cost_model(model, gpu, tp, kv_dtype)
    return cm.break_even_table(PREFIX_GRID, tiers=_resolved(cm, links_key), as_seen=True)


def break_even_rows(w) -> list:
    """``CostModel.break_even_table`` over :data:`PREFIX_GRID` for the what-if links."""
    return _break_even_rows(w.model, w.gpu, w.tp, w.kv_dtype, _links_key(w))


@st.cache_data(show_spinner=False, max_entries=64)
def _tier_break_even(model: str, gpu: str, tp: int, kv_dtype: str, links_key: tuple) -> list[dict]:
    from analyzer.cost import list_tiers

    cm = cost_model(model, gpu, tp, kv_dtype)
    names = [t.name for t in list_tiers() if t.kind != "gpu"]
    custom = [link for link in _resolved(cm, links_key) if link.name not in names]
    return cm.tier_break_even(tiers=[*names, *custom], as_seen=True)


def tier_break_even(w) -> list[dict]:
    """Per catalog tier (and the sidebar's own links): the shortest prefix worth loading."""
    return _tier_break_even(w.model, w.gpu, w.tp, w.kv_dtype, _links_key(w))
