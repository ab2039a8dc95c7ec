"""The dashboard's caching layer: every analyzer call the pages make goes through here.

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
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import streamlit as st

from analyzer.errors import InputError, Location
from app import workers

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
    pool_gbps: float  # 0: the pool tier's catalog figure
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
        pool_gbps=float(cluster.pool_gbps or 0.0),
        ttft_slo_s=float(analyze.ttft_slo_s),
        warmup=float(cluster.warmup_fraction),
        gpus_per_node=int(cluster.gpus_per_node),
        dram_scope=str(cluster.dram_scope),
        dram_scopes=list(DRAM_SCOPES),
        isolation=analyze.isolation,
        isolations=list(POLICIES),
    )


# Prefix lengths the cost page plots (tokens): powers of two from 128 to 128k.
PREFIX_GRID = [2**k for k in range(7, 18)]


def whatif_links(w) -> list:
    """The DRAM, NVMe and pool links of the what-if cluster: catalog ``TierSpec``s with
    the sidebar's bandwidth and latency overrides applied (renamed so charts say so)."""

    from analyzer.replay import ClusterConfig

    nvme_tier = next(f.default for f in fields(ClusterConfig) if f.name == "nvme_tier")
    dram = _override(tier(w.dram_tier), w.dram_gbps, w.dram_latency_us, "host DRAM")
    pool = _override(tier(w.pool_tier), w.pool_gbps, w.pool_latency_us, "pool")
    return [dram, tier(nvme_tier), pool]


def _override(t, gbps: float, latency_us: float, what: str):
    from dataclasses import replace

    if gbps <= 0 and latency_us <= 0:
        return t
    return replace(
        t,
        name=f"{what} ({t.name}, as set)",
        bandwidth_gbps=gbps if gbps > 0 else t.bandwidth_gbps,
        latency_s=latency_us * 1e-6 if latency_us > 0 else t.latency_s,
    )


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


# --- replay ------------------------------------------------------------------------------


def cluster_config(w):
    """The cluster the Replay page replays: exactly the one the Recommendation and
    `kvpool analyze` replay for the same settings (``analyze_options(w).cluster``: the
    same warm-up, pool bandwidth, node shape)."""
    return analyze_options(w, w.warmup).cluster


def replay_work(n_requests: int, n_scenarios: int, search_rate: bool) -> float | None:
    """The total ``run_replay`` reports through ``advance``: per scenario, the requests
    times one run plus the rate search's most runs (``analyzer.replay.run.MAX_RUNS``).
    None when this replay does not say, and the bar then counts without a total."""
    from analyzer.replay import run as replay_run

    runs = getattr(replay_run, "MAX_RUNS", None)
    if runs is None:
        return None
    return float(n_requests * (1 + (runs if search_rate else 0)) * n_scenarios)


@st.cache_resource(show_spinner=False)
def replay_memo():
    """The server's remembered replays, one per scenario and the settings it reads
    (``analyzer.replay.memo.ReplayMemo``): the Replay page, the Recommendation and the
    background prefetch all fill and read it, so a scenario is replayed once."""
    from analyzer.replay.memo import ReplayMemo

    # With recordings, so that a link-bandwidth what-if is re-priced at once (below).
    return ReplayMemo(max_entries=128, record=True)


def _count_run(name: str) -> None:
    CALLS["replay"] += 1
    CALLS[f"replay:{name}"] += 1


def replay(
    cur: Current,
    w,
    scenarios: tuple[str, ...],
    search_rate: bool = True,
    calibration: tuple[str, bytes] | None = None,
):
    """``analyzer.replay.ReplayResult`` for the what-if cluster, cached per settings.

    ``calibration`` (file name, CSV bytes) replays with the TTFT model fitted to it
    instead of the catalog's."""
    cfg = cluster_config(w)
    cost, sha = None, None
    if calibration is not None:
        cost, _ = calibrated_model(w, *calibration)
        sha = hashlib.sha256(calibration[1]).hexdigest()
    total = replay_work(cur.trace.n_requests, len(scenarios), search_rate)
    from app.prefetch import prefetcher

    with (
        prefetcher().foreground(),
        progress("Replaying the trace", total, "requests simulated") as advance,
    ):
        return replay_memo().run(
            cur.trace,
            cfg,
            scenarios=tuple(scenarios),
            ttft_slo_s=w.ttft_slo_s,
            search_rate=search_rate,
            advance=advance,
            cost=cost,
            pool=workers.pool("page", cur.trace.n_requests),
            trace_key=(cur.content, cur.ingest_key),
            cost_key=sha,
            on_run=_count_run,
        )


# --- recommendation ----------------------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=64)
def _log_model(
    content: str, ingest_key: Key, model: str, gpu: str, tp: int, kv_dtype: str, _loaded
):
    from analyzer.advisor.price import log_cluster
    from analyzer.replay import ClusterConfig

    cfg = ClusterConfig(
        model=model or ClusterConfig().model, gpu=gpu, tp=tp or 1, kv_dtype=kv_dtype
    )
    cfg, _ = log_cluster(cfg, _loaded, model_given=bool(model), tp_given=bool(tp))
    return cfg.model, cfg.tp


def log_model(cur: Current, model: str, gpu: str, tp: int, kv_dtype: str) -> tuple[str, int]:
    """The model and TP `kvpool replay` takes when ``model`` is "" (the log's own) or
    ``tp`` 0 (the smallest that holds it)."""
    return _log_model(cur.content, cur.ingest_key, model, gpu, tp, kv_dtype, cur.loaded)


def analyze_options(w, warmup: float, block_size: int | None = None, concrete=None):
    """``analyzer.advisor.AnalyzeOptions`` for the what-if controls and the block size
    the trace was ingested with (so the report's options say what `kvpool analyze
    --block-size` would). A model left to the log is planned as the log names it, at the
    smallest TP that holds it, as `kvpool analyze` does without --model and --tp;
    ``concrete``: the controls with that model and TP, for capacities given in GB."""
    from analyzer.advisor import AnalyzeOptions
    from analyzer.cli.options import ClusterFlags
    from analyzer.ingest import IngestOptions

    c = concrete or w
    model = c.model or ClusterFlags().config().model
    bpt = int(cost_model(model, c.gpu, c.tp or 1, c.kv_dtype).bytes_per_token)

    def tokens(gb: float) -> str | None:  # 0: derived, as the flag left out
        return str(int(gb * 1e9 // bpt)) if gb > 0 else None

    # The sidebar's values in the command line's flags, built into the cluster by the
    # same function `kvpool analyze` and `kvpool replay` use.
    flags = ClusterFlags(
        model=w.model or None,
        gpu=w.gpu,
        tp=w.tp or None,
        instances=w.instances,
        gpus_per_node=w.gpus_per_node,
        dram_scope=w.dram_scope,
        kv_dtype=w.kv_dtype,
        router=w.router,
        eviction=w.eviction,
        pool_gbps=w.pool_gbps or None,
        local_capacity_tokens=tokens(w.local_capacity_gb),
        # Left unset at the replay's default size, as `kvpool analyze` leaves it.
        dram_capacity_tokens=None
        if w.dram_capacity_gb == control_defaults().dram_capacity_gb
        else str(int(w.dram_capacity_gb * 1e9 // bpt)),
        pool_capacity_tokens=tokens(w.pool_capacity_gb),
        warmup=warmup,
    )
    cluster = flags.config(
        dram_tier=w.dram_tier,
        dram_capacity_gb=w.dram_capacity_gb,
        dram_gbps=w.dram_gbps or None,
        dram_latency_s=w.dram_latency_us * 1e-6 if w.dram_latency_us > 0 else None,
        pool_tier=w.pool_tier,
        pool_latency_s=w.pool_latency_us * 1e-6 if w.pool_latency_us > 0 else None,
    )
    return AnalyzeOptions(
        ingest=IngestOptions(block_size=block_size),
        cluster=cluster,
        ttft_slo_s=w.ttft_slo_s,
        model_given=bool(w.model),
        tp_given=bool(w.tp),
        isolation=w.isolation,
    )


_LAYER_LOCK = threading.Lock()
_LAYERS: dict[tuple, Any] = {}  # small analysis layers, most recent last
_LAYERS_MAX = 24


def _remember(key: tuple, make: Callable[[], Any]) -> Any:
    """``make()`` once per ``key``: a plain, locked dict rather than ``st.cache_*``,
    because the background prefetch and the download buttons call it from other threads,
    where Streamlit's caches log a warning for every call."""
    with _LAYER_LOCK:
        if key in _LAYERS:
            return _LAYERS[key]
    value = make()
    with _LAYER_LOCK:
        _LAYERS[key] = value
        while len(_LAYERS) > _LAYERS_MAX:
            _LAYERS.pop(next(iter(_LAYERS)))
    return value


def _analysis_reuse(content: str, ingest_key: Key, warmup: float, bytes_per_token: int, trace):
    """The reuse report as `kvpool analyze` makes it (warm-up and the model's bytes per
    token): one per trace, warm-up and model, however many analyses read it."""

    def make():
        from analyzer.reuse import ReuseOptions, analyze_reuse

        CALLS["analysis_reuse"] += 1
        return analyze_reuse(trace, ReuseOptions(warmup=warmup, bytes_per_token=bytes_per_token))

    return _remember(("reuse", content, ingest_key, warmup, bytes_per_token), make)


def _models_document(loaded, warmup: float, kv_dtype: str):  # ModelsFigures
    from analyzer.advisor.models import models_document
    from analyzer.reuse import ReuseOptions

    return models_document(loaded, ReuseOptions(warmup=warmup), kv_dtype)


@st.cache_resource(show_spinner=False)
def probe_store():
    """The server's remembered probes (``analyzer.advisor.replay.ProbeStore``): every
    replay the plans asked for, by the trace on screen and what the replay reads, so a
    what-if that moves only a price, a threshold or the SLO re-decides from the probes
    it has, and one that moves a tier's setting replays only the options with that tier."""
    from analyzer.advisor.replay import ProbeStore

    return ProbeStore(max_keys=2048)


def run_whatif(
    cur: Current,
    opts,
    advance: Advance | None = None,
    on_run=None,
    gate=None,
    memo=None,
    only_known: bool = False,
    parallel: bool = True,
    repriced: list | None = None,
):
    """``run_analysis`` on the loaded trace with every layer remembered: the reuse report
    per warm-up and model, every probe of every plan (:func:`probe_store`). Safe to call
    from a background thread (it touches no page element); ``gate`` is then called
    before each batch of replays (the prefetch waits there while a page computes).
    ``only_known``: replay nothing; a probe not remembered raises
    ``analyzer.replay.memo.NotRemembered``. ``parallel``: replay in the page's warm
    worker processes (:mod:`app.workers`), for the answer the user waits for; the
    prefetch passes False: its replays go to the one low-priority prefetch process.
    ``memo`` and ``repriced`` are kept for the callers that pass them: plans are made of
    probes, which are not re-priced from other link speeds (a link what-if replays the
    options that use that link)."""
    from analyzer.advisor import run_analysis
    from analyzer.advisor.measure import choices_of, primary_bytes_per_token
    from analyzer.advisor.replay import LocalReplayer, Services

    bpt = primary_bytes_per_token(choices_of(cur.loaded, opts), opts.kv_dtype)
    rep = _analysis_reuse(cur.content, cur.ingest_key, opts.warmup, bpt, cur.trace)
    models = _remember(
        ("models", cur.content, cur.ingest_key, opts.warmup, opts.kv_dtype),
        lambda: _models_document(cur.loaded, opts.warmup, opts.kv_dtype),
    )
    replayer = LocalReplayer(
        store=probe_store(),
        trace_key=(cur.content, cur.ingest_key),
        # Decided by the whole log's size: its per-model parts go where it goes.
        pool=workers.pool("page" if parallel else "prefetch", cur.trace.n_requests),
        only_known=only_known,
        gate=gate,
        on_run=on_run,
    )
    # The analysis keys the log as read by opts.isolation itself (and plans the other
    # policies beside it); the remembered reuse and models are those of the keyed trace.
    assert opts.isolation == cur.isolation, (opts.isolation, cur.isolation)
    return run_analysis(
        cur.loaded.sources,
        opts,
        advance=advance,
        loaded=cur.as_read,
        services=Services(replayer, rep, models),
    )


def analysis_options(cur: Current, w, warmup: float, thresholds=None, prices=None):
    """The ``AnalyzeOptions`` of the what-if controls for the trace on screen, with the
    decision thresholds and the prices (``PriceOverrides``) when given."""
    from dataclasses import replace
    from dataclasses import replace as _replace

    concrete = w
    if not (w.model and w.tp):
        model, tp = log_model(cur, w.model, w.gpu, w.tp, w.kv_dtype)
        concrete = _replace(w, model=model, tp=tp)
    opts = analyze_options(w, warmup, dict(cur.ingest_key).get("block_size"), concrete)
    if thresholds is not None:
        opts = replace(opts, thresholds=thresholds)
    return opts if prices is None else replace(opts, prices=prices)


def analysis(cur: Current, w, warmup: float, thresholds=None):
    """``analyzer.advisor.AnalysisResult`` (verdict, sizing, settings, gates) of the
    trace on screen, from its ingestion (never re-read); ``thresholds`` are the decision
    thresholds (``analyzer.advisor.figures.Thresholds``; None: the defaults)."""
    return analysis_of(cur, analysis_options(cur, w, warmup, thresholds))


def _decided_now(cur: Current, opts):
    """The analysis for ``opts`` if it needs no replay (every one it reads is remembered),
    else None: deciding, sizing and pricing from remembered replays takes a fraction of
    a second, so a threshold, the objective, a price or the SLO of a replay without the
    rate search answers at once. A layer it computes on the way (the reuse report of a
    new model) is remembered for the replay that follows."""
    from analyzer.replay.memo import NotRemembered

    try:
        result = run_whatif(cur, opts, only_known=True)
    except NotRemembered:
        return None
    CALLS["analysis"] += 1
    CALLS["decided_now"] += 1
    return result


def _repriced_now(cur: Current, opts):
    """The analysis for ``opts`` from the remembered replays, those it lacks re-priced
    from a remembered replay at other link bandwidths or latencies
    (``analyzer.replay.reprice``), and what was re-priced (nothing: the analysis is
    decided, as :func:`_decided_now`); (None, ()) when a replay it needs can be
    neither remembered nor re-priced."""
    from analyzer.replay.memo import NotRemembered

    notes: list = []
    try:
        result = run_whatif(cur, opts, only_known=True, repriced=notes)
    except NotRemembered:
        return None, ()
    if notes:
        CALLS["repriced"] += 1
    return result, tuple(notes)


def reprice_words(notes) -> list[str]:
    """What a re-priced answer is, in the page's words: from which replay, exact or how
    approximate (see docs/replay.md, "Re-pricing for another link bandwidth")."""
    tiers = {"dram": "host DRAM link", "nvme": "NVMe", "pool": "pool link"}
    moved = sorted(
        {f"{tiers[t]} {a:g} GB/s" for n in notes for t, a, _ in n.link_gbps if a is not None}
    )
    source = ", ".join(moved) or "the same link bandwidths (other latencies)"
    names = ", ".join(sorted({str(n.scenario) for n in notes}))
    head = (
        f"Re-priced from the replay at {source} (scenario {names}), not replayed: the "
        "loads re-timed for the new link, the queues and prefill run again, the cache "
        "hits kept."
    )
    if all(n.exact for n in notes):
        return [
            head,
            "Exact: every request finished in the same order among the arrivals and was "
            "routed as in that replay, so these figures equal a replay at these settings.",
        ]
    moved_n = sum(n.reordered for n in notes)
    rerouted = sum(n.rerouted for n in notes)
    runs = sum(n.runs for n in notes)
    main = all(n.main_exact for n in notes)
    return [
        head,
        f"Approximate: over the {runs} runs re-timed (the trace's rate and the rate "
        f"search's), {moved_n:,} request completions moved among the arrivals and "
        f"{rerouted:,} routes would have changed, so some cache hits may differ from a "
        "replay's"
        + (" (the run at the trace's rate is exact)" if main else "")
        + ". The replay at these settings runs in the background and replaces this "
        "answer; the page then says how far off it was.",
    ]


def reprice_error(before, after) -> str:
    """How far a re-priced answer was from the replay that replaced it, in words."""
    a, b = before.replay, after.replay
    verdict = (
        f"the same verdict ({after.verdict})"
        if before.verdict == after.verdict
        else f"the verdict {before.verdict} where the replay gives {after.verdict}"
    )
    ttft = rate = 0.0
    if a is not None and b is not None:
        for s in b.scenarios:
            r = a.get(s.name)
            if r is None:
                continue
            for x, y in ((r.ttft_mean_s, s.ttft_mean_s), (r.ttft_p90_s, s.ttft_p90_s)):
                if y:
                    ttft = max(ttft, abs(x - y) / y)
            if r.max_rate_scale and s.max_rate_scale:
                rate = max(rate, abs(r.max_rate_scale - s.max_rate_scale) / s.max_rate_scale)
    return (
        f"Replayed: the re-priced answer shown before had {verdict}; its mean and p90 TTFTs "
        f"were within {ttft:.2%} and its highest rates under the SLO within {rate:.1%} of "
        "the replay's."
    )


def analysis_of(cur: Current, opts):
    """The analysis of the trace on screen for ``opts`` (``AnalyzeOptions``): from the
    prefetch or an earlier page when it got there first, from the remembered replays
    when it needs none, else run here with a progress bar (every layer remembered)."""
    from app.prefetch import analysis_key, prefetcher

    pf = prefetcher()
    key = analysis_key(cur, opts)
    ahead = pf.get(key)
    if ahead is not None:
        CALLS["prefetched"] += 1
        return ahead
    with pf.foreground():
        result = _decided_now(cur, opts)
        if result is None:
            with progress("Running the analysis", 100) as advance:
                CALLS["analysis"] += 1
                result = run_whatif(cur, opts, advance, on_run=_count_run)
    pf.put(key, result)
    return result


@dataclass(frozen=True, slots=True)
class Answer:
    """What the Recommendation page shows for the settings asked.

    ``result`` is the analysis for them, or, while their replays run in the background
    (``pending``), the last one shown (``stale``: drawn greyed with a progress bar). A
    latency-first analysis whose sensitivity replays (other instance counts) are not
    ready yet is shown at once without those rows (``partial``); the verdict, sizing
    and money do not depend on them."""

    result: Any  # analyzer.advisor.AnalysisResult
    stale: bool = False
    pending: Any = None  # the background job's key, polled by the page
    partial: str = ""  # what the result leaves out until ``pending`` is done
    # The scenarios re-priced from a replay at other link speeds rather than replayed
    # (``analyzer.replay.memo.Repriced``): ``result`` is then that re-priced analysis,
    # shown until ``pending`` (the replay at these settings) replaces it.
    repriced: tuple = ()
    # Set by the page once it has drawn: the background replay of a re-priced answer
    # starts then, leaving the cores to the drawing until then.
    drawn: threading.Event | None = None


def answer(cur: Current, opts, shown=None) -> Answer:
    """The Recommendation's answer for ``opts`` without waiting for a replay when there
    is something to show meanwhile: ``shown`` is the last result the page showed for
    this trace (None on the first visit: then the analysis runs here, with progress)."""
    from dataclasses import replace

    from app.prefetch import analysis_key, prefetcher

    pf = prefetcher()
    key = analysis_key(cur, opts)
    ahead = pf.get(key)
    if ahead is not None:
        CALLS["prefetched"] += 1
        return Answer(ahead)
    with pf.foreground():
        # Decided from the remembered replays, or, where only a link's bandwidth or
        # latency moved, with those replays re-priced at once (``notes`` says which).
        now, notes = _repriced_now(cur, opts)
    if now is not None and not notes:
        CALLS["analysis"] += 1
        CALLS["decided_now"] += 1
        pf.put(key, now)
        return Answer(now)
    if shown is None or pf.failed(key):
        # Nothing to show meanwhile, or the background run failed: run here, with the
        # progress bar, where an error shows as the page's message.
        return Answer(analysis_of(cur, opts))
    memo = replay_memo()
    # The replay at these settings, in the background; behind a re-priced answer it
    # starts once the page has drawn that answer.
    drawn = threading.Event() if now is not None else None
    pf.run_now(
        key, lambda gate: run_whatif(cur, opts, gate=gate, memo=memo, on_run=_count_run), drawn
    )
    if now is not None:
        return Answer(now, pending=key, repriced=notes, drawn=drawn)
    if opts.thresholds.objective == "ttft" and opts.sensitivity_replays:
        # The rows for other instance counts are replays of their own; the rest of the
        # analysis may be all remembered.
        with pf.foreground():
            quick = _decided_now(cur, replace(opts, sensitivity_replays=False))
        if quick is not None:
            return Answer(quick, pending=key, partial="the rows for other instance counts")
    return Answer(shown, stale=True, pending=key)


def reports(cur: Current, result) -> Callable[[str], str]:
    """The HTML, Markdown or JSON report of :func:`analysis`'s result, as ``kvpool
    analyze`` writes them (``analyzer.report``): ``reports(cur, result)("html")``,
    rendered once per analysis and format, when first asked (the HTML's charts take
    about a second, so they are drawn when a download button is clicked, not on every
    what-if)."""

    def render(kind: str) -> str:
        def make() -> str:
            from analyzer.report import ReportDocument, render_html, render_json, render_markdown

            fn = {"html": render_html, "md": render_markdown, "json": render_json}[kind]
            return fn(ReportDocument.of(result))

        return _remember(("report", kind, cur.content, cur.ingest_key, repr(result.options)), make)

    return render


@dataclass(frozen=True, slots=True)
class CalibrationView:
    """What the cost page shows for an uploaded calibration CSV."""

    points: Any  # pandas.DataFrame: measured_s, predicted_s, model ("catalog" | "fitted")
    summary: list[str]
    warnings: list[str]


@st.cache_resource(show_spinner=False, max_entries=16)
def _calibrated(model: str, gpu: str, tp: int, kv_dtype: str, name: str, sha: str, _data: bytes):
    from analyzer.cost.calibrate import calibrate_ttft, read_ttft_csv
    from app.state import scratch_dir

    CALLS["calibrate"] += 1
    folder = scratch_dir() / "calibration" / sha[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (Path(name).name or "calibration.csv")
    path.write_bytes(_data)
    rows = read_ttft_csv(path)
    return calibrate_ttft(cost_model(model, gpu, tp, kv_dtype), path), rows


def calibrated_model(w, name: str, data: bytes):
    """The what-if cost model with its TTFT coefficients fitted to a calibration CSV
    (``analyzer.cost.calibrate.calibrate_ttft``), and the CSV's usable rows."""
    sha = hashlib.sha256(data).hexdigest()
    return _calibrated(w.model, w.gpu, w.tp, w.kv_dtype, name, sha, data)


@st.cache_data(show_spinner=False, max_entries=16)
def _calibrate(model: str, gpu: str, tp: int, kv_dtype: str, name: str, data: bytes):
    import pandas as pd

    from analyzer.cost.calibrate import ttft_measurements

    sha = hashlib.sha256(data).hexdigest()
    fitted, rows = _calibrated(model, gpu, tp, kv_dtype, name, sha, data)
    catalog = cost_model(model, gpu, tp, kv_dtype)
    fit = fitted.ttft_fit
    points = []
    for m in ttft_measurements(rows):
        for label, cm in (("catalog", catalog), ("fitted", fitted)):
            predicted = cm.ttft(m.prompt_tokens, m.cached_tokens, m.concurrency, m.load_gbps)
            points.append(
                {
                    "model": label,
                    "measured_s": m.ttft_s,
                    "predicted_s": predicted.ttft_s,
                    "prompt_tokens": m.prompt_tokens,
                    "cached_tokens": m.cached_tokens,
                    "concurrency": m.concurrency,
                    "load_gbps": m.load_gbps,
                }
            )
    coeffs = ", ".join(
        f"{k} = {getattr(fit, k):.4g}"
        for k in ("compute_scale", "overhead_s", "load_scale", "latency_s")
    )
    kept = [
        k for k in ("compute_scale", "overhead_s", "load_scale", "latency_s") if k not in fit.fitted
    ]
    summary = [
        rows.summary(name) + ".",
        f"Fitted {', '.join(fit.fitted) or 'nothing'}"
        + (f"; kept from the catalog: {', '.join(kept)}" if kept else "")
        + f". Coefficients: {coeffs}.",
    ]
    if fit.cv_mape is not None:
        summary.append(
            f"Cross-validated error (MAPE): {fit.cv_mape:.1%} over {fit.n_points} points."
        )
    ranges = "; ".join(f"{n} {lo:g} to {hi:g}" for n, lo, hi in fit.ranges)
    warnings = (
        [f"Predictions outside the measured range ({ranges}) are extrapolated."] if ranges else []
    )
    return CalibrationView(points=pd.DataFrame(points), summary=summary, warnings=warnings)


def calibrate(w, name: str, data: bytes) -> CalibrationView:
    """Fit the TTFT model of the what-if model and GPUs to an uploaded CSV
    (``analyzer.cost.calibrate``) and compare catalog and fitted predictions."""
    return _calibrate(w.model, w.gpu, w.tp, w.kv_dtype, name, data)
