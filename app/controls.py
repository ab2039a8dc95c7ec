"""The what-if controls in the sidebar, gathered into one frozen :class:`WhatIf`.

Defaults come from the analyzer (catalog ids, the replay's cluster defaults, the tier
catalog's bandwidths and latencies), never from constants here. The controls are drawn
by the entrypoint on every page, so their values survive page switches.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

WHATIF_KEY = "kvpool.whatif"


@dataclass(frozen=True, slots=True)
class WhatIf:
    """Everything a user can vary without re-reading the trace.

    Capacities are in GB (10^9 bytes, the replay's unit for tier sizes); 0 means "derive
    it" (HBM: what is left after weights and the reserve; pool: the nodes' DRAM summed).
    Bandwidths and latencies at 0 come from the chosen tier in the catalog.
    """

    model: str
    gpu: str
    tp: int
    kv_dtype: str
    instances: int
    router: str
    eviction: str
    local_capacity_gb: float  # HBM prefix cache per instance
    dram_tier: str
    dram_capacity_gb: float  # host DRAM tier per node
    dram_gbps: float
    dram_latency_us: float
    pool_tier: str
    pool_capacity_gb: float  # the whole pooled store
    pool_gbps: float  # per-node link to the pool
    pool_latency_us: float
    ttft_slo_s: float


def current() -> WhatIf:
    """The controls as last drawn (drawn by the entrypoint before every page)."""
    return st.session_state[WHATIF_KEY]


def _select(label: str, options: list, default, key: str, **kw):
    index = options.index(default) if default in options else 0
    return st.selectbox(label, options, index=index, key=key, **kw)


def _tier_caption(tier: str) -> None:
    from app import compute

    t = compute.tier(tier)
    st.caption(f"{tier}: {t.bandwidth_gbps:g} GB/s, first byte {t.latency_s * 1e6:g} µs (catalog)")


def sidebar() -> WhatIf:
    """Draw the controls and remember their values."""
    from app import compute

    d = compute.control_defaults()
    with st.sidebar:
        st.header("What if")
        with st.expander("Model and GPUs", expanded=True):
            model = _select("Model", d.models, d.model, "ctl.model")
            gpu = _select("GPU", d.gpus, d.gpu, "ctl.gpu")
            tp = _select("Tensor parallel (GPUs per instance)", [1, 2, 4, 8], d.tp, "ctl.tp")
            kv_dtype = _select("KV cache dtype", ["bf16", "fp8"], d.kv_dtype, "ctl.kv_dtype")
            instances = st.number_input(
                "Instances",
                min_value=1,
                max_value=512,
                value=d.instances,
                step=1,
                key="ctl.instances",
            )
        with st.expander("Routing and eviction", expanded=True):
            router = _select("Router", d.routers, d.router, "ctl.router")
            eviction = _select("Eviction policy", d.evictions, d.eviction, "ctl.eviction")
        with st.expander("Tiers and links"):
            local_gb = st.number_input(
                "HBM prefix cache per instance (GB; 0 = what the HBM leaves)",
                min_value=0.0,
                value=0.0,
                step=1.0,
                key="ctl.local_gb",
            )
            dram_tier = _select("Host DRAM link", d.dram_tiers, d.dram_tier, "ctl.dram_tier")
            _tier_caption(dram_tier)
            dram_gb = st.number_input(
                "Host DRAM per node (GB)",
                min_value=0.0,
                value=d.dram_capacity_gb,
                step=64.0,
                key="ctl.dram_gb",
            )
            dram_gbps = st.number_input(
                "DRAM bandwidth (GB/s; 0 = catalog)",
                min_value=0.0,
                value=0.0,
                step=1.0,
                key="ctl.dram_gbps",
            )
            dram_lat = st.number_input(
                "DRAM first-byte latency (µs; 0 = catalog)",
                min_value=0.0,
                value=0.0,
                step=1.0,
                key="ctl.dram_lat",
            )
            pool_tier = _select("Pool network", d.pool_tiers, d.pool_tier, "ctl.pool_tier")
            _tier_caption(pool_tier)
            pool_gb = st.number_input(
                "Pool capacity, whole cluster (GB; 0 = the nodes' DRAM)",
                min_value=0.0,
                value=0.0,
                step=256.0,
                key="ctl.pool_gb",
            )
            pool_gbps = st.number_input(
                "Pool bandwidth per node (GB/s; 0 = catalog)",
                min_value=0.0,
                value=0.0,
                step=1.0,
                key="ctl.pool_gbps",
            )
            pool_lat = st.number_input(
                "Pool first-byte latency (µs; 0 = catalog)",
                min_value=0.0,
                value=0.0,
                step=5.0,
                key="ctl.pool_lat",
            )
        with st.expander("Service level", expanded=True):
            slo = st.number_input(
                "TTFT SLO, p90 (s)", min_value=0.01, value=d.ttft_slo_s, step=0.25, key="ctl.slo"
            )
    whatif = WhatIf(
        model=model,
        gpu=gpu,
        tp=int(tp),
        kv_dtype=kv_dtype,
        instances=int(instances),
        router=router,
        eviction=eviction,
        local_capacity_gb=float(local_gb),
        dram_tier=dram_tier,
        dram_capacity_gb=float(dram_gb),
        dram_gbps=float(dram_gbps),
        dram_latency_us=float(dram_lat),
        pool_tier=pool_tier,
        pool_capacity_gb=float(pool_gb),
        pool_gbps=float(pool_gbps),
        pool_latency_us=float(pool_lat),
        ttft_slo_s=float(slo),
    )
    st.session_state[WHATIF_KEY] = whatif
    return whatif
