"""The Replay page's runs: the what-if cluster as `kvpool analyze` builds it from the
sidebar (the same flags, the same defaults), and its replay through the server's
remembered replays, so a scenario one page replayed is not replayed by another."""

from __future__ import annotations

import hashlib

import streamlit as st

from app import workers
from app.calibration import calibrated_model
from app.compute import CALLS, Current, Key, control_defaults, cost_model, progress


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


def count_run(name: str) -> None:
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
            on_run=count_run,
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
    from analyzer.ingest import IngestOptions
    from analyzer.replay import ClusterConfig

    c = concrete or w
    model = c.model or ClusterConfig().model
    bpt = int(cost_model(model, c.gpu, c.tp or 1, c.kv_dtype).bytes_per_token)

    def tokens(gb: float) -> int | None:  # 0: derived, as the flag left out
        return int(gb * 1e9 // bpt) if gb > 0 else None

    # The sidebar's values as the command line's flags name them, built into the cluster
    # by the one function `kvpool analyze` and `kvpool replay` use too.
    cluster = ClusterConfig.from_settings(
        model=w.model or None,
        gpu=w.gpu,
        tp=w.tp or None,
        instances=w.instances,
        gpus_per_node=w.gpus_per_node,
        dram_scope=w.dram_scope,
        kv_dtype=w.kv_dtype,
        router=w.router,
        eviction=w.eviction,
        local_capacity_tokens=tokens(w.local_capacity_gb),
        # Left unset at the replay's default size, as `kvpool analyze` leaves it.
        dram_capacity_tokens=None
        if w.dram_capacity_gb == control_defaults().dram_capacity_gb
        else int(w.dram_capacity_gb * 1e9 // bpt),
        pool_capacity_tokens=tokens(w.pool_capacity_gb),
        warmup=warmup,
        dram_capacity_gb=w.dram_capacity_gb,
        dram=w.dram_link,
        pool=w.pool_link,
    )
    return AnalyzeOptions(
        ingest=IngestOptions(block_size=block_size),
        cluster=cluster,
        ttft_slo_s=w.ttft_slo_s,
        model_given=bool(w.model),
        tp_given=bool(w.tp),
        isolation=w.isolation,
    )
