"""Run the scenarios, search the highest rate under the TTFT SLO, and report.

``run_replay`` replays the trace once per scenario at the configured time scale, then
(unless ``search_rate=False``) finds ``max_rate_scale_at_slo``: the highest multiple of
the trace's arrival rate at which at least 90% of the measured requests get their
first token within ``ttft_slo_s`` (p90 TTFT <= SLO, nearest rank). The rates searched
are the grid ``STEP ** (j / GRID)`` (about 4.4% apart) from 1/1024x to 64x; the answer
is the grid rate that passes while the next one up fails. The search starts where the
rate-1 run says the GPUs would saturate (:func:`first_guess`), gallops away from it
until the answer flips, then bisects; it is deterministic, runs at most ``MAX_RUNS``
simulations besides the main one, and keeps each run's TTFT percentiles
(``RateSearch.points``). Runs stop early once the SLO is lost.

Definitions of the reported figures:

- ``hit_rate``: cached prompt tokens / prompt tokens of the measured requests
  (after ``warmup_fraction``); ``hit_rate_by_tier`` splits it by the tier that served
  the tokens (``hbm``, ``dram``, ``nvme``, ``pool``).
- ``ttft_s``: time to first token = queueing + loads + prefill (decode not modelled).
- ``prefill_gpu_s``: GPU-seconds spent prefilling measured requests (instance time x tp).
- ``links``: per link kind, bytes moved over the whole replay, peak utilisation (busiest
  ``link_window_s`` window of any one link of that kind) and mean utilisation.
  ``network_bytes`` = pool reads + pool writes over the nodes' NICs.
- ``duplicated_kv_bytes``: KV bytes held in more than one instance's HBM beyond the
  first copy, at the end of the replay (``end``) and averaged over its duration
  (``time_avg``).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, suppress
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from analyzer import limits
from analyzer.cost.model import CostModel
from analyzer.errors import UsageError
from analyzer.progress import Advance
from analyzer.replay.capacity import batch_defaults, kv_pool_tokens
from analyzer.replay.config import (
    CONNECTORS,
    DEFAULT_SCENARIOS,
    UNBOUNDED,
    ClusterConfig,
    ScenarioSpec,
    select_scenarios,
)
from analyzer.replay.decode import DecodePool, size_decode_pool
from analyzer.replay.engine import (
    Plan,
    TierPlan,
    TraceTree,
    simulate,
)
from analyzer.replay.jobs import output_lengths
from analyzer.replay.link_settings import LinkSettings, resolve_link
from analyzer.replay.miniature import sample
from analyzer.replay.miniature import sampling_rate as sampling_rate
from analyzer.replay.rate_grid import (
    BISECTIONS as BISECTIONS,
)
from analyzer.replay.rate_grid import (
    GRID as GRID,
)
from analyzer.replay.rate_grid import (
    J_BOTTOM as J_BOTTOM,
)
from analyzer.replay.rate_grid import (
    J_TOP as J_TOP,
)
from analyzer.replay.rate_grid import (
    MAX_DOWN as MAX_DOWN,
)
from analyzer.replay.rate_grid import (
    MAX_RUNS as MAX_RUNS,
)
from analyzer.replay.rate_grid import (
    MAX_UP as MAX_UP,
)
from analyzer.replay.rate_grid import (
    SLO_QUANTILE as SLO_QUANTILE,
)
from analyzer.replay.rate_grid import (
    STEP as STEP,
)
from analyzer.replay.rate_grid import (
    UnknownPoint as UnknownPoint,
)
from analyzer.replay.rate_grid import (
    _allowed,
    _passes,
)
from analyzer.replay.rate_grid import (
    first_guess as first_guess,
)
from analyzer.replay.rate_grid import (
    grid_rate as grid_rate,
)
from analyzer.replay.rate_grid import (
    search_grid as search_grid,
)
from analyzer.replay.results import (
    RatePoint as RatePoint,
)
from analyzer.replay.results import (
    RateSearch as RateSearch,
)
from analyzer.replay.results import (
    ReplayResult as ReplayResult,
)
from analyzer.replay.results import (
    Resolved as Resolved,
)
from analyzer.replay.results import (
    ScenarioCapacity as ScenarioCapacity,
)
from analyzer.replay.results import (
    ScenarioResult as ScenarioResult,
)
from analyzer.replay.results import (
    TtftSummary as TtftSummary,
)
from analyzer.replay.results import (
    _point,
    _says_more,
)
from analyzer.replay.steps import step_pricing
from analyzer.spawn import main_not_rerun, start_processes
from analyzer.trace import BlockTrace

if TYPE_CHECKING:
    from concurrent.futures import Executor, ProcessPoolExecutor


def _blocks(tokens: int | None, block_size: int) -> int | None:
    if tokens is None or tokens >= UNBOUNDED:
        return None
    return tokens // block_size


class _Memo:
    """Memoized ``compute_time_s(new, cached)``: the same chunks recur in every scenario
    and every run of the rate search. Bounded: cleared when it grows past ``limit``."""

    __slots__ = ("_d", "_f", "limit")

    def __init__(self, f: Callable[[int, int], float], limit: int = 2_000_000) -> None:
        self._f = f
        self._d: dict[tuple[int, int], float] = {}
        self.limit = limit

    def __call__(self, new: int, cached: int) -> float:
        key = (new, cached)
        v = self._d.get(key)
        if v is None:
            if len(self._d) >= self.limit:
                self._d.clear()
            v = self._d[key] = float(self._f(new, cached))
        return v


def resolve(
    cfg: ClusterConfig,
    scenario: ScenarioSpec,
    block_size: int,
    cost: Any = None,
    prefill_s: Callable[[int, int], float] | None = None,
    sampling_rate: float = 1.0,
) -> Resolved:
    """Apply the scenario's overrides and fill every default from the cost catalogs.

    ``sampling_rate`` below 1 (a miniature replay, :mod:`analyzer.replay.miniature`)
    scales every cache's capacity in the plan by it; the reported capacities stay the
    cluster's own."""

    def blocks(tokens: int | None) -> int | None:
        n = _blocks(tokens, block_size)
        return n if n is None or sampling_rate >= 1 else max(1, int(n * sampling_rate))

    c = scenario.applied_to(cfg)
    if cost is None:
        cost = c.cost_model()
    bpt = int(cost.bytes_per_token)
    if bpt <= 0:
        raise UsageError(f"model {c.model!r} has no KV bytes per token")
    aggregated = c.serving == "aggregated"
    mnbt = mns = 0
    if aggregated:
        mnbt, mns = batch_defaults(cost.gpu)
        mnbt = c.max_num_batched_tokens or mnbt
        mns = c.max_num_seqs or mns
    local_tokens = c.local_capacity_tokens
    if local_tokens is None:
        if aggregated:  # the engine's whole KV pool, running requests' KV included
            local_tokens = kv_pool_tokens(cost, c.gpu_memory_utilization, mnbt)
        else:
            local_tokens = int(cost.hbm_kv_capacity_tokens(c.hbm_reserve_fraction))
        if local_tokens <= 0:
            raise UsageError(
                f"{c.model} does not fit on {c.tp} x {c.gpu} with room for KV cache; "
                "raise --tp or give --local-capacity-tokens"
            )
    dram_tokens = c.dram_capacity_tokens
    if dram_tokens is None and aggregated and c.connector == "hicache":
        # HiCache sizes its host pool per server: --hicache-size GB per GPU, else
        # --hicache-ratio times the device pool (SGLang's server_args)
        if c.hicache_size_gb > 0:
            per_instance = int(c.hicache_size_gb * 1e9 * c.tp // bpt)
        else:
            per_instance = int(c.hicache_ratio * min(local_tokens, UNBOUNDED))
        dram_tokens = min(per_instance * c.dram_sharers, UNBOUNDED)
    if dram_tokens is None:
        dram_tokens = int(c.dram_capacity_gb * 1e9 // bpt)
    # The engines' DRAM tier lives in each serving process: a node's DRAM is split into
    # one private cache per instance unless the scope is the node (config.DRAM_SCOPES).
    dram_cache_tokens = dram_tokens if dram_tokens >= UNBOUNDED else dram_tokens // c.dram_sharers
    nvme_tokens = c.nvme_capacity_tokens
    if nvme_tokens is None:
        nvme_tokens = int(c.nvme_capacity_gb * 1e9 // bpt)
    pool_tokens = c.pool_capacity_tokens
    if pool_tokens is None:
        pool_tokens = min(UNBOUNDED, dram_tokens * c.nodes)

    # The tier as the instance sees it (host DRAM: tp links) where the cost model says.
    seen_by = cost if hasattr(cost, "tier_link") else None

    def tier(link: LinkSettings, tokens: int) -> tuple[TierPlan, float | None, float]:
        if c.free_loads:  # cross-check mode: the link figures are unused
            return TierPlan(blocks(tokens), math.inf, math.inf, 0.0), None, 0.0
        spec = resolve_link(link, seen_by)
        bw, lat = float(spec.bandwidth_gbps), float(spec.latency_s)
        return TierPlan(blocks(tokens), bw * 1e9, bw * 1e9, lat), bw, lat

    dram = nvme = pool = None
    dram_gbps = nvme_gbps = pool_gbps = pool_lat = None
    if scenario.dram:
        dram, dram_gbps, _ = tier(c.dram_link, dram_cache_tokens)
    if scenario.nvme:
        nvme, nvme_gbps, _ = tier(c.nvme_link, nvme_tokens)
    if scenario.pool:
        pool, pool_gbps, pool_lat = tier(c.pool_link, pool_tokens)
        if c.pool_aggregate_gbps is not None and not c.free_loads:
            pool = replace(pool, aggregate_bytes_per_s=c.pool_aggregate_gbps * 1e9)
    plan = Plan(
        instances=c.instances,
        instances_per_node=c.instances_per_node,
        tp=c.tp,
        bytes_per_token=bpt,
        transfer_bytes_per_token=int(getattr(cost, "transfer_bytes_per_token", bpt)),
        prefill_s=prefill_s if prefill_s is not None else _Memo(cost.compute_time_s),
        step_overhead_s=float(cost.overhead_s),
        chunk_tokens=c.prefill_chunk_tokens,
        local=scenario.local,
        local_capacity_blocks=blocks(local_tokens),
        dram=dram,
        dram_shared_by_node=c.dram_scope == "node",
        nvme=nvme,
        pool=pool,
        router=c.router,
        prefix_aware_lambda=c.prefix_aware_lambda,
        eviction=c.eviction,
        write_policy=c.write_policy,
        free_loads=c.free_loads,
        warmup_fraction=c.warmup_fraction,
        link_window_s=c.link_window_s,
    )
    if aggregated:
        plan = replace(
            plan,
            serving="aggregated",
            step=step_pricing(cost),
            max_num_batched_tokens=mnbt,
            max_num_seqs=mns,
            hbm_capacity_tokens=min(local_tokens, UNBOUNDED),
            cache_scale=min(sampling_rate, 1.0),
            hit_overhead_s=None if c.free_loads else getattr(cost, "hit_overhead_s", None),
            connector=CONNECTORS[c.connector],
            num_layers=int(getattr(getattr(cost, "model", None), "num_layers", 1)),
        )
    return Resolved(
        plan=plan,
        cluster=c,
        local_capacity_tokens=local_tokens if scenario.local else None,
        dram_capacity_tokens=dram_tokens if scenario.dram else None,
        dram_per_cache_tokens=dram_cache_tokens if scenario.dram else None,
        nvme_capacity_tokens=nvme_tokens if scenario.nvme else None,
        pool_capacity_tokens=pool_tokens if scenario.pool else None,
        dram_gbps=dram_gbps,
        nvme_gbps=nvme_gbps,
        pool_gbps=pool_gbps,
        pool_latency_s=pool_lat,
        block_size=block_size,
    )


def find_max_rate(
    trace: BlockTrace,
    plan: Plan,
    time_scale: float,
    slo_s: float,
    passed_at_1: bool,
    advance: Advance | None = None,
    guess: int | None = None,
    known: tuple[RatePoint, ...] = (),
    simulate_missing: bool = True,
    record: bool = False,
    tree: TraceTree | None = None,
) -> RateSearch:
    """Highest arrival-rate multiple with p90 TTFT <= ``slo_s`` (see module docstring).

    The candidates are the grid ``STEP ** (j / GRID)`` for integer ``j`` from
    ``J_BOTTOM`` to ``J_TOP``; the answer is the grid rate that passes while the next
    one up fails. The search starts at ``guess`` (a grid index; by default
    :func:`first_guess` of the rate-1 run is passed by the caller, else the middle of
    the known side), gallops away from it in steps of 2, 4, 8... grid points until the
    answer flips, then bisects the bracket down to neighbouring grid points. When
    meeting the SLO is monotone in the rate (the premise of any bisection) every start
    gives the same answer; the start only changes how many runs it takes.

    ``known``: runs of earlier searches of the same scenario (another SLO, see
    :func:`search_again`); a step one of them decides is not simulated again but
    recorded as the fresh search would have recorded it, so the result is the fresh
    search's. Without ``simulate_missing`` a step they do not decide raises
    :class:`UnknownPoint`. ``record``: each run simulated keeps its recording in its
    point. ``tree``: the trace's :class:`~analyzer.replay.engine.TraceTree`, when the
    caller has it."""
    n_measured = trace.n_requests - int(plan.warmup_fraction * trace.n_requests)
    if n_measured <= 0:
        return RateSearch(None, None, 0, False)
    allowed = _allowed(n_measured)
    tree = tree if tree is not None else TraceTree(trace)
    points: list[RatePoint] = []
    before: dict[float, RatePoint] = {}
    for p in known:
        if p.rate not in before or _says_more(p, before[p.rate]):
            before[p.rate] = p

    def ok(j: int) -> bool:
        rate = grid_rate(j)
        seen = before.get(rate)
        if seen is not None and seen.passes(slo_s) is not None:
            points.append(seen.at(slo_s))
            return points[-1].passed
        if not simulate_missing:
            raise UnknownPoint(rate)
        st = simulate(
            trace,
            plan,
            time_scale / rate,
            slo_abort=(slo_s, allowed),
            advance=advance,
            record=record,
            tree=tree,
        )
        points.append(replace(_point(rate, st, slo_s), recording=st.recording))
        return points[-1].passed

    lo, hi = search_grid(ok, passed_at_1, guess)
    pts = tuple(sorted(points, key=lambda p: p.rate))
    if lo is None:  # even the lowest rate searched missed the SLO
        return RateSearch(0.0, grid_rate(J_BOTTOM), len(points), False, pts)
    if hi is None:  # even the highest passed
        return RateSearch(grid_rate(J_TOP), None, len(points), True, pts)
    return RateSearch(grid_rate(lo), grid_rate(hi), len(points), False, pts)


def _run_scenario(
    trace: BlockTrace,
    cfg: ClusterConfig,
    spec: ScenarioSpec,
    cost: Any,
    ttft_slo_s: float,
    search_rate: bool,
    memo: _Memo | None = None,
    advance: Advance | None = None,
    rate: float = 1.0,
    record: bool = False,
) -> ScenarioResult:
    """One scenario: the replay at the configured rate, then the rate search. ``rate``
    below 1: ``trace`` is a miniature sampled at that rate (its caches are scaled by
    it, and its requests arrive ``1 / rate`` times faster, at the full trace's load).
    ``record``: every run keeps its recording (:mod:`analyzer.replay.reprice`)."""

    limits.check(ttft_slo_s, "ttft_slo_s", "--ttft-slo")
    memo = memo if memo is not None else _Memo(cost.compute_time_s)
    res = resolve(cfg, spec, trace.block_size, cost=cost, prefill_s=memo, sampling_rate=rate)
    time_scale = res.cluster.time_scale * rate
    tree = TraceTree(trace)
    stats = simulate(trace, res.plan, time_scale, advance=advance, record=record, tree=tree)
    search = None
    if search_rate:
        passed = _passes(stats, ttft_slo_s)
        search = find_max_rate(
            trace,
            res.plan,
            time_scale,
            ttft_slo_s,
            passed,
            advance,
            guess=first_guess(stats, res.plan),
            record=record,
            tree=tree,
        )
    pool = _decode_pool(trace, res, cost, time_scale)
    return ScenarioResult(spec, res, stats, search, 1.0 / rate, decode_pool=pool)


def _decode_pool(
    trace: BlockTrace, res: Resolved, cost: Any, time_scale: float
) -> DecodePool | None:
    """The decode pool beside a disaggregated replay's prefill instances (same GPUs,
    model and TP, the engine's KV pool and limits) at the replayed arrival rate, for a
    catalog cost model. The outputs are spread over the arrivals' span, not the run's
    makespan, so a prefill pool that fell behind does not make decode look lighter."""
    if res.plan.serving != "disaggregated" or not isinstance(cost, CostModel):
        return None
    if trace.n_requests < 2:
        return None
    span = float(trace.arrival_s[-1] - trace.arrival_s[0]) * time_scale
    c = res.cluster
    mnbt, mns = batch_defaults(cost.gpu)
    mnbt = c.max_num_batched_tokens or mnbt
    mns = c.max_num_seqs or mns
    outputs, _ = output_lengths(trace)
    return size_decode_pool(
        trace.prompt_tokens.astype(np.float64),
        outputs.astype(np.float64),
        span,
        step_pricing(cost),
        kv_pool_tokens(cost, c.gpu_memory_utilization, mnbt),
        mns,
        c.tp,
    )


def search_again(
    trace: BlockTrace,
    old: ScenarioResult,
    ttft_slo_s: float,
    known: tuple[RatePoint, ...] = (),
    advance: Advance | None = None,
    simulate_missing: bool = True,
    record: bool = False,
) -> ScenarioResult:
    """``old``'s scenario with the rate search for another SLO, equal to a fresh
    :func:`_run_scenario`: the run at the trace's rate is ``old``'s (the SLO only enters
    the search, and its start :func:`first_guess` reads that run alone), and ``known``
    (the points of ``old``'s and other earlier searches) answer every step they decide;
    only the others are simulated (with their recordings when ``record``)."""

    limits.check(ttft_slo_s, "ttft_slo_s", "--ttft-slo")
    res = old.resolved
    rate = 1.0 / old.scale
    if rate < 1.0:  # ``old`` ran in miniature: search on the same sample
        trace = sample(trace, rate)[0]
    search = find_max_rate(
        trace,
        res.plan,
        res.cluster.time_scale * rate,
        ttft_slo_s,
        _passes(old.stats, ttft_slo_s),
        advance,
        guess=first_guess(old.stats, res.plan),
        known=known,
        simulate_missing=simulate_missing,
        record=record,
    )
    return ScenarioResult(old.spec, res, old.stats, search, old.scale, decode_pool=old.decode_pool)


def _init_worker(nice: int) -> None:
    """A worker process's initializer: lower its scheduling priority by ``nice``, and
    leave Ctrl-C to the parent (which shares the terminal's process group): the parent
    stops its workers itself, so none prints an interrupted traceback."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice:
        with suppress(OSError):  # not permitted or not supported: run at the same priority
            os.nice(nice)


def worker_pool(workers: int, nice: int = 0) -> ProcessPoolExecutor:
    """Worker processes for :func:`run_replay`'s scenarios. They are spawned, not forked
    (safe when the caller has threads, as the dashboard has), and do not re-run the
    caller's main script (:func:`analyzer.spawn.main_not_rerun`). ``nice``: lower their priority by
    that much, for work that must not slow the caller's own (the dashboard's prefetch).
    Use as a context manager for one replay, or keep it across replays (the dashboard)
    and call ``start_workers`` to pay for their start before the first replay needs
    them."""

    ctx = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(nice,)
    )


def start_workers(pool: ProcessPoolExecutor, workers: int) -> None:
    """Start ``pool``'s ``workers`` processes now (each imports this module), rather
    than at the first replay, and wait until they are ready."""
    for f in start_processes(pool, workers):
        f.result()


def run_replay(
    trace: BlockTrace,
    cfg: ClusterConfig,
    scenarios: tuple[Any, ...] | list[Any] | str = DEFAULT_SCENARIOS,
    ttft_slo_s: float = 2.0,
    search_rate: bool = True,
    advance: Advance | None = None,
    extra_scenarios: list[ScenarioSpec] | None = None,
    cost: Any = None,
    workers: int = 1,
    full_replay: bool = False,
    pool: Executor | None = None,
    record: bool = False,
) -> ReplayResult:
    """Replay ``trace`` on ``cfg`` once per scenario (names or :class:`ScenarioSpec`).

    A trace above :data:`analyzer.replay.miniature.MIN_ACCESSES` block accesses is
    replayed in miniature (a spatial sample on caches scaled to match; the result says
    so in ``miniature``) unless ``full_replay``.

    ``cost`` is an :class:`analyzer.cost.CostModel` (for example a calibrated one);
    by default it is built from the catalogs for ``cfg.model``, ``cfg.gpu``, ``cfg.tp``.
    ``workers > 1`` runs scenarios in that many processes at once; the results are the
    same (each scenario is simulated alone), only the progress is coarser. ``pool``: an
    executor already running (a long-lived server keeps its worker processes warm
    across replays instead of starting new ones each time, see :func:`worker_pool`);
    every scenario is then submitted to it, whatever ``workers`` says. ``record``:
    every run keeps what it decided, so that :mod:`analyzer.replay.reprice` can re-price
    it for other link bandwidths and latencies (the figures are the same).
    """
    if not (ttft_slo_s > 0 and math.isfinite(ttft_slo_s)):
        raise UsageError("--ttft-slo must be a positive number of seconds")
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    specs = select_scenarios(scenarios, extra_scenarios)
    if cost is None:
        cost = cfg.cost_model()
    result = ReplayResult(
        cluster=cfg,
        ttft_slo_s=ttft_slo_s,
        block_size=trace.block_size,
        n_requests=trace.n_requests,
        bytes_per_token=int(cost.bytes_per_token),
    )
    rate = None if full_replay or trace.count_only else sampling_rate(trace.n_accesses)
    if rate is not None:
        trace, result.miniature = sample(trace, rate)
    else:
        rate = 1.0
    n = trace.n_requests
    budget = n * (1 + (MAX_RUNS if search_rate else 0))
    for spec in specs:  # fail on a bad override before any work
        resolve(cfg, spec, trace.block_size, cost=cost)
    workers = min(workers, len(specs))
    if pool is not None or workers > 1:
        with ExitStack() as stack:
            if pool is None:
                pool = stack.enter_context(worker_pool(workers))
            # The costliest first (each cache tier adds lookups and inserts), so that the
            # cheap ones fill the gaps at the end instead of leaving a worker idle.
            order = sorted(specs, key=lambda s: -(s.local + s.dram + s.nvme + s.pool))
            with main_not_rerun():  # new workers start at these submits
                futures = {
                    spec.name: pool.submit(
                        _run_scenario,
                        trace,
                        cfg,
                        spec,
                        cost,
                        ttft_slo_s,
                        search_rate,
                        None,
                        None,
                        rate,
                        record,
                    )
                    for spec in order
                }
            try:
                for spec in specs:
                    result.scenarios[spec.name] = futures[spec.name].result()
                    if advance is not None:
                        advance(budget)
            finally:  # a failure: the others are not waited for (a shared pool runs on)
                for f in futures.values():
                    f.cancel()
        return result
    memo = _Memo(cost.compute_time_s)
    for spec in specs:
        used = 0

        def step(k: float) -> None:
            nonlocal used
            used += int(k)
            if advance is not None:
                advance(k)

        result.scenarios[spec.name] = _run_scenario(
            trace, cfg, spec, cost, ttft_slo_s, search_rate, memo, step, rate, record
        )
        if advance is not None and budget > used:
            advance(budget - used)
    return result
