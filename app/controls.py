"""The what-if controls in the sidebar, gathered into one frozen :class:`WhatIf`.

Defaults come from the analyzer (catalog ids, the replay's cluster defaults, the tier
catalog's bandwidths and latencies), never from constants here. The controls are drawn
by the entrypoint on every page, so their values survive page switches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import streamlit as st

from analyzer.limits import RANGES

if TYPE_CHECKING:
    from analyzer.replay.link_settings import LinkSettings

WHATIF_KEY = "kvpool.whatif"
# The slowest link the replay takes (1 MB/s).
MIN_GBPS = RANGES["bandwidth_gbps"].lo


@dataclass(frozen=True, slots=True)
class WhatIf:
    """Everything a user can vary without re-reading the trace.

    Capacities are in GB (10^9 bytes, the replay's unit for tier sizes); 0 means "derive
    it" (HBM: what is left after weights and the reserve; pool: the nodes' DRAM summed).
    Bandwidths and latencies left empty (None) come from the chosen tier in the catalog,
    as the command line's flags left out and ``ClusterConfig``'s None.
    """

    model: str  # "": each model the log names, as itself (no --model)
    gpu: str
    tp: int  # 0: the smallest that holds the model (no --tp)
    kv_dtype: str
    instances: int
    router: str
    eviction: str
    local_capacity_gb: float  # HBM prefix cache per instance
    dram_tier: str
    dram_capacity_gb: float  # host DRAM given to KV per node, all its instances together
    dram_gbps: float | None
    dram_latency_us: float | None
    pool_tier: str
    pool_capacity_gb: float  # the whole pooled store
    pool_gbps: float | None  # per-node link to the pool
    pool_latency_us: float | None
    ttft_slo_s: float
    warmup: float  # share of requests that only warm the caches (not counted)
    gpus_per_node: int  # the instances on one node share its DRAM and NIC
    dram_scope: str  # "instance": each instance's private share; "node": one per node
    isolation: str = "shared"  # who may share KV blocks (kvpool analyze --isolation)

    @property
    def dram_link(self) -> LinkSettings:
        """The host DRAM link as the sidebar sets it (None: the catalog's figure)."""
        return _link(self.dram_tier, self.dram_gbps, self.dram_latency_us)

    @property
    def pool_link(self) -> LinkSettings:
        """The pool link as the sidebar sets it (None: the catalog's figure)."""
        return _link(self.pool_tier, self.pool_gbps, self.pool_latency_us)


def _link(tier: str, gbps: float | None, latency_us: float | None) -> LinkSettings:
    from analyzer.replay.link_settings import LinkSettings

    return LinkSettings(tier, gbps, None if latency_us is None else latency_us * 1e-6)


ISOLATION_LABEL = {
    "shared": "everyone (no cache salt)",
    "tenant": "each tenant alone (a salt per tenant)",
    "user": "each end user alone (a salt per user)",
}


def current() -> WhatIf:
    """The controls as last drawn (drawn by the entrypoint before every page): the model
    "" and TP 0 when left at "the log's own" and "smallest that fits", as the command
    line's --model and --tp left out."""
    return st.session_state[WHATIF_KEY]


def concrete(cur) -> WhatIf:
    """The controls with the model and TP the analysis plans when they are left to the
    log (its most requested model, the smallest TP that holds it): what the pages that
    price one model and GPU show."""
    from dataclasses import replace

    from app import replays

    w = current()
    if w.model and w.tp:
        return w
    model, tp = replays.log_model(cur, w.model, w.gpu, w.tp, w.kv_dtype)
    return replace(w, model=model, tp=tp)


LOG_MODEL = "the log's own models"
FIT_TP = "the smallest that holds the model"


def _select(label: str, options: list, default, key: str, **kw):
    index = options.index(default) if default in options else 0
    return st.selectbox(label, options, index=index, key=key, **kw)


def in_force(tier: str, gbps: float | None, latency_us: float | None) -> str:
    """The link a replay uses, as the sidebar says it: each figure as set, or the
    tier's catalog figure where the control is left empty (None)."""
    from app import compute

    t = compute.tier(tier)
    bw = (
        f"{gbps:g} GB/s (set; {tier} lists {t.bandwidth_gbps:g})"
        if gbps is not None
        else (f"{t.bandwidth_gbps:g} GB/s ({tier})")
    )
    lat = (
        f"{latency_us:g} µs (set; {tier} lists {t.latency_s * 1e6:g})"
        if latency_us is not None
        else f"{t.latency_s * 1e6:g} µs ({tier})"
    )
    return f"In force: {bw}, first byte {lat}."


def default_whatif() -> WhatIf:
    """The controls as they start: the defaults ``kvpool analyze`` runs with."""
    from app import compute

    d = compute.control_defaults()
    return WhatIf(
        model=d.model,
        gpu=d.gpu,
        tp=d.tp,
        kv_dtype=d.kv_dtype,
        instances=d.instances,
        router=d.router,
        eviction=d.eviction,
        local_capacity_gb=0.0,
        dram_tier=d.dram_tier,
        dram_capacity_gb=d.dram_capacity_gb,
        dram_gbps=None,
        dram_latency_us=None,
        pool_tier=d.pool_tier,
        pool_capacity_gb=0.0,
        pool_gbps=d.pool_gbps,
        pool_latency_us=None,
        ttft_slo_s=d.ttft_slo_s,
        warmup=d.warmup,
        gpus_per_node=d.gpus_per_node,
        dram_scope=d.dram_scope,
        isolation=d.isolation,
    )


def _number(label: str, value: float, step: float, key: str, **kw) -> float:
    return st.number_input(label, min_value=0.0, value=float(value), step=step, key=key, **kw)


def _link_figure(label: str, value: float | None, step: float, key: str, least: float):
    """A link's bandwidth or latency; left empty (None), the tier's catalog figure."""
    got = st.number_input(
        f"{label}; empty = catalog)",
        min_value=least,
        value=value,
        step=step,
        key=key,
        placeholder="the tier's catalog figure",
    )
    return None if got is None else float(got)


def sidebar() -> WhatIf:
    """Draw the controls and remember their values."""
    from app import compute

    d = compute.control_defaults()
    s = default_whatif()
    with st.sidebar:
        st.header("What if")
        with st.expander("Model and GPUs", expanded=True):
            model = _select(
                "Model",
                ["", *d.models],
                s.model,
                "ctl.model",
                format_func=lambda v: v or LOG_MODEL,
            )
            gpu = _select("GPU", d.gpus, s.gpu, "ctl.gpu")
            tp = _select(
                "Tensor parallel (GPUs per instance)",
                [0, 1, 2, 4, 8, 16],
                s.tp,
                "ctl.tp",
                format_func=lambda v: str(v) if v else FIT_TP,
            )
            kv_dtype = _select("KV cache dtype", ["bf16", "fp8"], s.kv_dtype, "ctl.kv_dtype")
            instances = st.number_input(
                "Instances",
                min_value=1,
                max_value=512,
                value=s.instances,
                step=1,
                key="ctl.instances",
            )
            gpus_per_node = _select(
                "GPUs per node", [1, 2, 4, 8, 16], s.gpus_per_node, "ctl.gpus_per_node"
            )
        with st.expander("Routing and eviction", expanded=True):
            router = _select("Router", d.routers, s.router, "ctl.router")
            eviction = _select("Eviction policy", d.evictions, s.eviction, "ctl.eviction")
        with st.expander("Tiers and links"):
            local_gb = _number(
                "HBM prefix cache per instance (GB; 0 = what the HBM leaves)",
                s.local_capacity_gb,
                1.0,
                "ctl.local_gb",
            )
            dram_tier = _select("Host DRAM link", d.dram_tiers, s.dram_tier, "ctl.dram_tier")
            dram_note = st.empty()  # filled below, once the overrides are read
            dram_gb = _number("Host DRAM per node (GB)", s.dram_capacity_gb, 64.0, "ctl.dram_gb")
            dram_scope = _select(
                "Host DRAM cache",
                d.dram_scopes,
                s.dram_scope,
                "ctl.dram_scope",
                format_func=lambda v: {
                    "instance": "private to each instance (LMCache local, HiCache L2)",
                    "node": "one per node, shared by its instances",
                }.get(v, v),
            )
            dram_gbps = _link_figure(
                "DRAM bandwidth (GB/s", s.dram_gbps, 1.0, "ctl.dram_gbps", MIN_GBPS
            )
            dram_lat = _link_figure(
                "DRAM first-byte latency (µs", s.dram_latency_us, 1.0, "ctl.dram_lat", 0.0
            )
            pool_tier = _select("Pool network", d.pool_tiers, s.pool_tier, "ctl.pool_tier")
            pool_note = st.empty()
            pool_gb = _number(
                "Pool capacity, whole cluster (GB; 0 = the nodes' DRAM)",
                s.pool_capacity_gb,
                256.0,
                "ctl.pool_gb",
            )
            pool_gbps = _link_figure(
                "Pool bandwidth per node (GB/s", s.pool_gbps, 1.0, "ctl.pool_gbps", MIN_GBPS
            )
            pool_lat = _link_figure(
                "Pool first-byte latency (µs", s.pool_latency_us, 5.0, "ctl.pool_lat", 0.0
            )
            dram_note.caption(in_force(dram_tier, dram_gbps, dram_lat))
            pool_note.caption(in_force(pool_tier, pool_gbps, pool_lat))
        with st.expander("Service level", expanded=True):
            slo = st.number_input(
                "TTFT SLO, p90 (s)", min_value=0.01, value=s.ttft_slo_s, step=0.25, key="ctl.slo"
            )
            warmup = st.slider(
                "Warm-up (share of requests that fill the caches uncounted)",
                min_value=0.0,
                max_value=0.9,
                value=s.warmup,
                step=0.1,
                key="ctl.warmup",
                help="0.5 is the field's steady-state convention (kvpool analyze's default); "
                "0 counts every request (cold start). Used by Prefix reuse, Capacity, Replay "
                "and Recommendation.",
            )
        with st.expander("Tenants", expanded=True):
            isolation = _select(
                "Who may share KV blocks",
                d.isolations,
                s.isolation,
                "ctl.isolation",
                format_func=lambda v: ISOLATION_LABEL.get(v, v),
                help="shared: one pool for every tenant (no cache salt). tenant: a "
                "cache_salt / extra_key per tenant, as the gateway would set it; user: per "
                "end user (else per session). Every page measures with the blocks keyed so, "
                "and the Recommendation prices the others beside it.",
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
        dram_gbps=dram_gbps,
        dram_latency_us=dram_lat,
        pool_tier=pool_tier,
        pool_capacity_gb=float(pool_gb),
        pool_gbps=pool_gbps,
        pool_latency_us=pool_lat,
        ttft_slo_s=float(slo),
        warmup=float(warmup),
        gpus_per_node=int(gpus_per_node),
        dram_scope=dram_scope,
        isolation=isolation,
    )
    st.session_state[WHATIF_KEY] = whatif
    # Under the folded expanders too: the links a replay uses now, each as set or from
    # the catalog, so a value typed in never hides behind the tier's catalog figure.
    st.sidebar.caption(links_in_force(whatif))
    return whatif


def links_in_force(w: WhatIf) -> str:
    from app import compute

    def one(tier: str, gbps: float | None) -> str:
        shown = gbps if gbps is not None else compute.tier(tier).bandwidth_gbps
        return f"{shown:g} GB/s ({tier if gbps is None else 'as set'})"

    # The catalog lists host DRAM per PCIe link, one per GPU; a figure set is the
    # instance's whole link, as the replay takes it (docs/replay.md).
    dram_per = "per GPU" if w.dram_gbps is None else "per instance"
    return (
        f"In force: pool link {one(w.pool_tier, w.pool_gbps)} per node; host DRAM link "
        f"{one(w.dram_tier, w.dram_gbps)} {dram_per}; p90 TTFT SLO "
        f"{1000 * w.ttft_slo_s:,.0f} ms."
    )


# Decision thresholds: (Thresholds field, label, help). Shares, shown in percent.
THRESHOLD_CONTROLS = (
    ("min_reuse", "Least prefix reuse worth a cache (%)", "below it: not worth it"),
    (
        "min_pool_saving",
        "Pool's least saving over the best local option (% of the baseline's monthly cost)",
        "the margin that pays for running a distributed store (objective cost)",
    ),
    (
        "min_pool_advantage",
        "Pool's least TTFT advantage over host DRAM (%)",
        "below it, local offload is recommended instead of a pool",
    ),
    (
        "min_dram_gain",
        "Host DRAM's least TTFT gain over HBM alone (%)",
        "below it, not even local offload pays",
    ),
)
_KEPT = "kvpool.thresholds"


def thresholds():
    """The decision thresholds (``analyzer.advisor.figures.Thresholds``) under a
    "Decision thresholds" expander on the page that calls it; kept across pages.
    Changing one re-decides from the remembered replays: no replay runs."""
    from dataclasses import replace

    from analyzer.advisor.figures import Thresholds

    base = Thresholds()
    kept = st.session_state.setdefault(_KEPT, {})
    with st.expander("Decision thresholds"):
        objectives = ["cost", "ttft"]
        objective = st.radio(
            "Decide on",
            objectives,
            index=objectives.index(kept.get("objective", base.objective)),
            horizontal=True,
            key="ctl.th.objective",
            help="cost: the option serving the load within the TTFT SLO at the lowest "
            "monthly cost; ttft: the lowest mean TTFT (--objective, docs/advisor.md)",
        )
        kept["objective"] = objective
        values: dict = {"objective": objective}
        cols = st.columns(len(THRESHOLD_CONTROLS))
        for col, (name, label, why) in zip(cols, THRESHOLD_CONTROLS, strict=True):
            pct = col.number_input(
                label,
                min_value=0.0,
                max_value=100.0,
                value=float(kept.get(name, 100 * getattr(base, name))),
                step=1.0,
                key=f"ctl.th.{name}",
                help=f"{why}; default {100 * getattr(base, name):g}% (docs/advisor.md)",
            )
            kept[name] = pct
            values[name] = round(pct / 100, 6)
    return replace(base, **values)


# Prices: (PriceOverrides field, label, the Prices attribute holding the catalog's figure).
PRICE_CONTROLS = (
    ("gpu_hour_usd", "GPU ($ per GPU-hour)", "gpu_hour"),
    ("dram_gb_month_usd", "Host DRAM ($ per GB-month)", "dram_gb_month"),
    ("nvme_tb_month_usd", "NVMe ($ per TB-month)", "nvme_tb_month"),
    ("nic_node_month_usd", "Pool NIC ($ per node-month)", "nic_node_month"),
    ("store_month_usd", "Pool store operation ($ per month)", "store_month"),
)


def prices(gpu: str):
    """The prices (``analyzer.cost.prices.PriceOverrides``) under a "Prices" expander on
    the page that calls it, starting from the catalog's (``models/prices.toml``); only
    a price moved away from the catalog's is set, as a `kvpool analyze --gpu-hour-usd`
    flag would be. A price reaches the money and the decision, never a replay."""
    from analyzer.cost.prices import PriceOverrides, resolve_prices

    catalog = resolve_prices(gpu)
    values: dict = {}
    with st.expander("Prices"):
        cols = st.columns(len(PRICE_CONTROLS))
        for col, (name, label, attr) in zip(cols, PRICE_CONTROLS, strict=True):
            price = getattr(catalog, attr)
            base = float(price.usd) if price is not None else 0.0
            got = col.number_input(
                label,
                min_value=0.0,
                value=base,
                step=max(0.01, round(base / 10, 2)),
                key=f"ctl.price.{name}.{gpu}" if name == "gpu_hour_usd" else f"ctl.price.{name}",
                help=f"catalog: {base:g} ({price.source if price is not None else 'none'})",
            )
            moved = got > 0 if price is None else abs(float(got) - base) > 1e-12
            if moved:
                values[name] = float(got)
    return PriceOverrides(**values)
