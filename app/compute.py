"""The dashboard's caching layer: the trace's ingestion, reuse and prefix tree, the cost
model and the sidebar's catalog defaults, each cached once per input and options. The
calls built on them live beside it, one job a module: ``breakeven`` (the Cost page's
links), ``calibration`` (an uploaded measurements CSV), ``replays`` (the what-if
cluster and its replays) and ``answers`` (the Recommendation's analysis and reports).

Each stage result is cached with ``st.cache_resource`` (results are shared, read-only
objects: no copy per rerun) under a key made of the input's content hash and only the
options that stage depends on. So moving a what-if control re-runs the replay, never the
ingestion; changing the model re-prices, never re-measures reuse.

``CALLS`` counts how often each stage really ran (cache misses); tests read it to check
that a control change did not redo ingestion.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from analyzer.errors import InputError, Location
from app.command import start_isolation

CALLS: Counter[str] = Counter()

Advance = Callable[[float], None]
Key = tuple[tuple[str, Any], ...]


def as_key(values: dict[str, Any]) -> Key:
    """A hashable, order-independent cache key from plain option values."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in values.items()))


# --- progress ----------------------------------------------------------------------------


def _outside_cache_recording(fn: Callable[[], None]) -> None:
    """Run a UI update without it being recorded as part of a cached function's output.

    The progress bar lives outside the cached call; if Streamlit recorded its updates it
    would try to replay them on the next cache hit into a container that no longer
    exists. The updates are transient, so they are excluded from the recording.
    """
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import (
            in_cached_function,
        )
    except ImportError:  # a Streamlit without this hook: no live progress, results intact
        return
    token = in_cached_function.set(False)
    try:
        fn()
    finally:
        in_cached_function.reset(token)


@contextmanager
def progress(label: str, total: float | None, unit: str = "") -> Iterator[Advance]:
    """A progress bar fed by an analyzer ``advance(n)`` callback; removed when done.

    ``total`` is the amount of work the stage reports in all (bytes, percentage points,
    simulated requests); updates are sent only when the shown percentage changes, so a
    per-request callback stays cheap. With ``total=None`` the bar shows the work done.
    """
    box = st.empty()
    done = 0.0
    shown = -1

    def advance(n: float) -> None:
        nonlocal done, shown
        done += n
        if total is None:
            step = int(math.log10(done)) if done >= 1 else 0
            mark = int(done // 10 ** max(step - 1, 0))  # two significant figures
            if mark != shown:
                shown = mark
                text = f"{label}: {done:,.0f} {unit}".rstrip()
                _outside_cache_recording(lambda: box.progress(0.5, text=text))
            return
        pct = 100 if total <= 0 else min(100, math.floor(100 * done / total))
        if pct != shown:
            shown = pct
            _outside_cache_recording(lambda: box.progress(pct / 100, text=f"{label}: {pct}%"))

    try:
        yield advance
    finally:
        box.empty()


# --- content hash ------------------------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=64)
def _digest_file(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest(paths: tuple[str, ...]) -> str:
    """Content hash of the inputs (re-hashed only when a file's size or mtime changes)."""
    parts = []
    for p in paths:
        try:
            info = Path(p).stat()
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", Location(p)) from exc
        parts.append(_digest_file(p, info.st_size, info.st_mtime_ns))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# --- ingest ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Current:
    """The trace on screen: its content hash, the ingest options, and what ingest gave,
    with its blocks keyed as the sidebar's isolation says (``loaded``; ``shared``: the
    log as read, which an analysis keys itself). ``content`` names the keying too, so
    that every remembered figure is of the trace as keyed."""

    content: str
    ingest_key: Key
    loaded: Any  # analyzer.ingest.LoadedTrace
    isolation: str = "shared"
    shared: Any = None  # the LoadedTrace as read (None: ``loaded`` is)

    @property
    def trace(self):
        return self.loaded.trace

    @property
    def as_read(self) -> Any:
        return self.loaded if self.shared is None else self.shared


@st.cache_resource(show_spinner=False, max_entries=4)
def _ingest(content: str, ingest_key: Key, _paths: tuple[str, ...], _advance: Advance | None):
    CALLS["ingest"] += 1
    from analyzer.ingest import IngestOptions, open_trace

    return open_trace(list(_paths), IngestOptions(**dict(ingest_key)), advance=_advance)


def ingest(paths: tuple[str, ...], ingest_key: Key, isolation: str = "shared") -> Current:
    """The loaded trace, ingested once per file content and ingest options, with its
    blocks keyed by ``isolation`` (once per policy: analyzer/reuse/isolation.py)."""
    content = digest(paths)
    total = sum(Path(p).stat().st_size for p in paths)
    with progress("Reading the trace", total) as advance:
        loaded = _ingest(content, ingest_key, paths, advance)
    if isolation == "shared":
        return Current(content=content, ingest_key=ingest_key, loaded=loaded)
    with progress(f"Keying the blocks by {isolation}", None):
        keyed = _keyed(content, ingest_key, isolation, loaded)
    return Current(
        content=f"{content}#isolation={isolation}",
        ingest_key=ingest_key,
        loaded=keyed,
        isolation=isolation,
        shared=loaded,
    )


@st.cache_resource(show_spinner=False, max_entries=4)
def _keyed(content: str, ingest_key: Key, isolation: str, _loaded):
    """The loaded trace keyed by ``isolation``, once per trace and policy."""
    keyed = _loaded.isolated(isolation)
    keyed.trace  # noqa: B018 - built here, once, not by the first page that reads it
    return keyed


# --- reuse -------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=8)
def _reuse(content: str, ingest_key: Key, reuse_key: Key, _trace, _advance: Advance | None):
    CALLS["reuse"] += 1
    from analyzer.reuse import ReuseOptions, analyze_reuse

    return analyze_reuse(_trace, ReuseOptions(**dict(reuse_key)), advance=_advance)


def reuse(cur: Current, warmup: float | None = None):
    """The reuse report (``analyzer.reuse.ReuseReport``); independent of model and GPU.
    ``warmup`` None: the default every command uses (``ClusterConfig.warmup_fraction``)."""
    if warmup is None:
        warmup = control_defaults().warmup
    with progress("Measuring prefix reuse", 100) as advance:
        return _reuse(cur.content, cur.ingest_key, as_key({"warmup": warmup}), cur.trace, advance)


@st.cache_data(show_spinner=False, max_entries=32)
def _prefix_tree(content: str, ingest_key: Key, factor: int, levels: int, min_share: float, _trace):
    from analyzer.report.figures import prefix_tree_frame

    return prefix_tree_frame(_trace.coarsen(factor), levels=levels, min_share=min_share)


def prefix_tree(cur: Current, factor: int, levels: int, min_share: float):
    """The icicle's rectangles (``app.figures.prefix_tree_frame``) at ``factor`` x the
    trace's block size, cached per trace and setting."""
    return _prefix_tree(cur.content, cur.ingest_key, factor, levels, min_share, cur.trace)


# --- cost --------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=32)
def cost_model(model: str, gpu: str, tp: int, kv_dtype: str):
    """``analyzer.cost.CostModel`` from the catalogs."""
    CALLS["cost"] += 1
    from analyzer.cost import CostModel

    return CostModel.from_catalog(model, gpu, tp=tp, kv_dtype=kv_dtype)


# --- what-if defaults --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControlDefaults:
    """Choices and starting values for the sidebar, all read from the analyzer."""

    models: list[str]
    gpus: list[str]
    routers: list[str]
    evictions: list[str]
    dram_tiers: list[str]
    pool_tiers: list[str]
    model: str
    gpu: str
    tp: int
    kv_dtype: str
    instances: int
    router: str
    eviction: str
    dram_tier: str
    dram_capacity_gb: float
    pool_tier: str
    pool_gbps: float | None  # None: the pool tier's catalog figure
    ttft_slo_s: float
    warmup: float  # fraction of requests that only warm the caches
    gpus_per_node: int
    dram_scope: str
    dram_scopes: list[str]
    isolation: str  # who may share KV blocks, as `kvpool analyze --isolation`
    isolations: list[str]


def _catalog_ids(items) -> list[str]:
    return [i if isinstance(i, str) else getattr(i, "id", None) or i.name for i in items]


@st.cache_resource(show_spinner=False)
def tier(name: str):
    """A tier or link from the hardware catalog (``analyzer.cost.TierSpec``)."""
    from analyzer.cost import get_tier

    return get_tier(name)


@st.cache_resource(show_spinner=False)
def control_defaults() -> ControlDefaults:
    from analyzer.advisor import AnalyzeOptions
    from analyzer.cache import replay_policies
    from analyzer.cost import get_tier, list_gpus, list_models, list_tiers
    from analyzer.replay import ROUTERS, ClusterConfig
    from analyzer.replay.config import DRAM_SCOPES
    from analyzer.reuse.isolation import POLICIES

    analyze = AnalyzeOptions()  # the defaults `kvpool analyze` runs with
    cluster = ClusterConfig()  # the same defaults every command's flags start from
    tiers = list(list_tiers())
    kind = {
        (getattr(t, "name", t)): getattr(get_tier(getattr(t, "name", t)), "kind", "") for t in tiers
    }
    return ControlDefaults(
        models=_catalog_ids(list_models()),
        gpus=_catalog_ids(list_gpus()),
        routers=list(ROUTERS),
        evictions=list(replay_policies()),
        dram_tiers=[t for t, k in kind.items() if k == "host-dram"],
        pool_tiers=[t for t, k in kind.items() if k == "network"],
        model="",  # the log's own models, as `kvpool analyze` without --model
        gpu=cluster.gpu,
        tp=0,  # the smallest TP that holds each model, as without --tp
        kv_dtype=cluster.kv_dtype,
        instances=cluster.instances,
        router=cluster.router,
        eviction=cluster.eviction,
        dram_tier=cluster.dram_tier,
        dram_capacity_gb=float(cluster.dram_capacity_gb),
        pool_tier=cluster.pool_tier,
        pool_gbps=cluster.pool_gbps,
        ttft_slo_s=float(analyze.ttft_slo_s),
        warmup=float(cluster.warmup_fraction),
        gpus_per_node=int(cluster.gpus_per_node),
        dram_scope=str(cluster.dram_scope),
        dram_scopes=list(DRAM_SCOPES),
        isolation=start_isolation(analyze.isolation),
        isolations=list(POLICIES),
    )
