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
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from analyzer import limits
from analyzer.cost.model import CostModel
from analyzer.errors import UsageError
from analyzer.progress import Advance
from analyzer.replay.capacity import batch_defaults, kv_pool_tokens
from analyzer.replay.config import (
    CONNECTORS,
    STANDARD_SCENARIOS,
    UNBOUNDED,
    ClusterConfig,
    ScenarioSpec,
    Tier,
    select_scenarios,
)
from analyzer.replay.decode import DecodePool, size_decode_pool
from analyzer.replay.engine import (
    TIER_NAMES,
    Plan,
    Recording,
    RunStats,
    TierPlan,
    TraceTree,
    simulate,
)
from analyzer.replay.link_settings import LinkSettings, resolve_link
from analyzer.replay.miniature import Miniature, sample
from analyzer.replay.miniature import sampling_rate as sampling_rate
from analyzer.replay.serving import output_lengths
from analyzer.replay.steps import step_pricing
from analyzer.spawn import main_not_rerun, start_processes
from analyzer.trace import BlockTrace

if TYPE_CHECKING:
    from concurrent.futures import Executor, ProcessPoolExecutor

STEP = 4.0  # the bracket grows or shrinks by this factor
MAX_UP = 3  # rate multiples searched up to 4**3 = 64
MAX_DOWN = 5  # and down to 4**-5 = 1/1024
BISECTIONS = 5  # final bracket ratio 4**(1/32) = 2**(1/16): about 4.4% precision
GRID: int = 2**BISECTIONS  # grid points per factor STEP: the rates searched are STEP ** (j / GRID)
J_TOP = MAX_UP * GRID  # 64x
J_BOTTOM = -MAX_DOWN * GRID  # 1/1024x
# Most runs one search takes: galloping across the whole grid, then bisecting the last step.
MAX_RUNS = 2 * math.ceil(math.log2(J_TOP - J_BOTTOM)) + 1
SLO_QUANTILE = 0.9
# The prefill share of the GPUs' time at which an aggregated replay's p90 TTFT reaches a
# 2 s SLO: 0.52 to 0.55 for the four standard scenarios on the Mooncake conversation
# trace (8 H100s, Llama-3.1-8B). Only where the rate search starts (first_guess).
AGGREGATED_PREFILL_AT_SLO = 0.53


@dataclass(frozen=True, slots=True)
class Resolved:
    """The numbers a scenario runs with, after catalog defaults and overrides."""

    plan: Plan
    cluster: ClusterConfig
    local_capacity_tokens: int | None
    dram_capacity_tokens: int | None  # the node's DRAM for KV, all its DRAM caches together
    dram_per_cache_tokens: int | None  # one DRAM cache: an instance's share, or the node's
    nvme_capacity_tokens: int | None
    pool_capacity_tokens: int | None
    dram_gbps: float | None
    nvme_gbps: float | None
    pool_gbps: float | None
    pool_latency_s: float | None
    block_size: int


def _blocks(tokens: int | None, block_size: int) -> int | None:
    if tokens is None or tokens >= UNBOUNDED:
        return None
    return tokens // block_size


def _cap_json(tokens: int | None) -> int | str | None:
    return "unbounded" if tokens is not None and tokens >= UNBOUNDED else tokens


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


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One run of the rate search: the rate multiple, whether p90 TTFT met the SLO, and
    the TTFT percentiles of its measured requests (None when the run stopped early,
    once more requests than the SLO allows had missed it)."""

    rate: float
    passed: bool
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    # Kept so that another SLO can re-read the run (not reported): a run that went to
    # the end knows the TTFT that decides the p90 test at any SLO (nearest rank, as
    # :func:`_passes` reads it); one stopped once its SLO was lost only knows that its
    # p90 is above that SLO, which decides the SLOs up to it (they fail too).
    rank_s: float | None = None
    above_s: float | None = None
    # The run's decisions, when the replay kept them (``run_replay(..., record=True)``),
    # for re-pricing it at other link speeds (:mod:`analyzer.replay.reprice`).
    recording: Recording | None = field(default=None, compare=False, repr=False)

    def passes(self, slo_s: float) -> bool | None:
        """Whether this run meets ``slo_s``; None when it cannot say."""
        if self.rank_s is not None:
            return self.rank_s <= slo_s
        if self.above_s is not None and slo_s <= self.above_s:
            return False
        return None

    def at(self, slo_s: float) -> RatePoint:
        """This run as a search for ``slo_s`` would have recorded it (a run that fails
        stops early, so its percentiles are unknown); None-free only when decided."""
        passed = self.passes(slo_s)
        assert passed is not None
        if passed:
            return replace(self, passed=True)
        # As the fresh search records it: stopped early at ``slo_s``. What this run
        # knows beyond that stays with this run (the memo keeps both).
        return RatePoint(self.rate, False, None, None, None, above_s=slo_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "passed": self.passed,
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p90_s": self.ttft_p90_s,
            "ttft_p99_s": self.ttft_p99_s,
        }


@dataclass(frozen=True, slots=True)
class RateSearch:
    """Outcome of the SLO search: ``value`` passed, ``fail_at`` (when known) did not.
    ``points`` are its runs by rate (the rate-1 run, which is the scenario's own replay,
    not among them)."""

    value: float | None
    fail_at: float | None
    runs: int
    capped: bool  # every multiple up to STEP**MAX_UP passed
    points: tuple[RatePoint, ...] = ()


@dataclass(frozen=True, slots=True)
class TtftSummary:
    """Time to first token over the measured requests, in seconds (None: no request)."""

    mean_s: float | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None

    @classmethod
    def of(cls, ttft_s: np.ndarray) -> TtftSummary:
        if not ttft_s.size:
            return cls()
        q = np.percentile(ttft_s, [50, 90, 99])
        return cls(float(ttft_s.mean()), float(q[0]), float(q[1]), float(q[2]), float(ttft_s.max()))

    def to_json(self) -> dict[str, float | None]:
        return {
            "mean": self.mean_s,
            "p50": self.p50_s,
            "p90": self.p90_s,
            "p99": self.p99_s,
            "max": self.max_s,
        }


@dataclass(frozen=True, slots=True)
class ScenarioCapacity:
    """What a scenario's tiers held, in tokens (None: the scenario has no such tier or
    it was unbounded; see :meth:`ScenarioResult.to_json` for the JSON's "unbounded")."""

    local_per_instance: int | None
    dram_per_node: int | None
    dram_per_instance: int | None
    nvme_per_node: int | None
    pool: int | None


def _bounded(tokens: int | None) -> int | None:
    return None if tokens is None or tokens >= UNBOUNDED else tokens


@dataclass(slots=True)
class ScenarioResult:
    """One scenario's replay. The summary figures (TTFT percentiles, hit rates, sizes)
    are computed once, here, and read as attributes by the advisor and the dashboard;
    :meth:`to_json` only lays them out."""

    spec: ScenarioSpec
    resolved: Resolved
    stats: RunStats
    search: RateSearch | None
    # 1 / sampling rate of a miniature replay: totals over requests are scaled back by it
    scale: float = 1.0
    # Disaggregated serving: the decode pool beside the prefill instances replayed
    decode_pool: DecodePool | None = None
    ttft: TtftSummary = field(init=False)
    # Aggregated serving: time per output token after the first, over the measured
    # requests that generated more than one (None when decode is not modelled).
    tpot: TtftSummary | None = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = TtftSummary.of(self.stats.ttft_s)
        tpot = self.stats.tpot_s
        self.tpot = None if tpot is None else TtftSummary.of(tpot[~np.isnan(tpot)])

    @property
    def requests(self) -> int:
        return int(self.stats.ttft_s.size)

    @property
    def hit_rate(self) -> float:
        prompt = self.stats.prompt_tokens
        return sum(self.stats.hit_tokens_by_tier) / prompt if prompt else 0.0

    @property
    def cross_tenant_hit_share(self) -> float:
        """Of the measured hit tokens, the share whose block another tenant's request
        last stored or refreshed (0 with no hits, or fewer than two tenants)."""
        hits = sum(self.stats.hit_tokens_by_tier)
        return self.stats.cross_tenant_hit_tokens / hits if hits else 0.0

    @property
    def hit_rate_by_tier(self) -> dict[Tier, float]:
        prompt = self.stats.prompt_tokens
        return {
            name: (h / prompt if prompt else 0.0)
            for name, h in zip(TIER_NAMES, self.stats.hit_tokens_by_tier, strict=True)
        }

    @property
    def bytes_read_by_tier(self) -> dict[Tier, float]:
        k = self.scale
        return {t: b * k for t, b in zip(TIER_NAMES, self.stats.loaded_bytes_by_tier, strict=True)}

    @property
    def makespan_s(self) -> float:
        return float(self.stats.duration_s) * self.scale

    @property
    def max_rate_scale_at_slo(self) -> float | None:
        return None if self.search is None else self.search.value

    @property
    def prefill_gpu_s(self) -> float:
        """GPU-seconds spent prefilling the measured requests (instance time x tp)."""
        return float(self.stats.gpu_s) * self.scale

    @property
    def peak_link_utilisation(self) -> float:
        """The busiest link's peak utilisation over a window (0 when there is no link)."""
        st = self.stats
        return max((lk.stats(st.duration_s)["peak_utilisation"] for lk in st.links), default=0.0)

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def network_bytes(self) -> float:
        """Pool reads and writes over the nodes' NICs (links of kind ``net-*``)."""
        st = self.stats
        by_kind: dict[str, float] = {}
        for lk in st.links:
            by_kind[lk.kind] = by_kind.get(lk.kind, 0.0) + lk.bytes_total
        return sum(v for k, v in by_kind.items() if k.startswith("net-")) * self.scale

    @property
    def capacity(self) -> ScenarioCapacity:
        """The capacities the scenario ran with, unbounded ones as None."""
        r = self.resolved
        return ScenarioCapacity(
            local_per_instance=_bounded(r.local_capacity_tokens),
            dram_per_node=_bounded(r.dram_capacity_tokens),
            dram_per_instance=_bounded(
                r.dram_per_cache_tokens if r.cluster.dram_scope == "instance" else None
            ),
            nvme_per_node=_bounded(r.nvme_capacity_tokens),
            pool=_bounded(r.pool_capacity_tokens),
        )

    def serving_json(self) -> dict[str, Any]:
        """What an aggregated engine adds: decode speed, the engine's limits and pool,
        preemptions, and what priced its steps and output lengths."""
        st = self.stats
        plan = self.resolved.plan
        assert self.tpot is not None and plan.step is not None
        return {
            "mode": plan.serving,
            "tpot_s": self.tpot.to_json(),
            "step_gpu_s": st.step_gpu_s,
            "preemptions": st.preemptions,
            "kv_pool_tokens_per_instance": _cap_json(plan.hbm_capacity_tokens),
            "max_num_batched_tokens": plan.max_num_batched_tokens,
            "max_num_seqs": plan.max_num_seqs,
            "request_overhead_s": plan.step.request_overhead_s,
            "step_model": st.step_source,
            "outputs_drawn": st.outputs_drawn,
            "connector": plan.connector.name if plan.connector is not None else None,
        }

    def to_json(self) -> dict[str, Any]:
        out = self._json()
        if self.scale != 1.0:
            _scale_totals(out, self.scale)
        return out

    def _json(self) -> dict[str, Any]:
        st = self.stats
        r = self.resolved
        c = r.cluster
        prompt = st.prompt_tokens
        hits = st.hit_tokens_by_tier
        n = self.requests
        ttft_json = self.ttft.to_json()
        links: dict[str, dict[str, Any]] = {}
        for lk in st.links:
            s = lk.stats(st.duration_s)
            agg = links.setdefault(
                lk.kind,
                {
                    "links": 0,
                    "bytes": 0.0,
                    "gbps_per_link": (
                        lk.bytes_per_s / 1e9 if math.isfinite(lk.bytes_per_s) else None
                    ),
                    "peak_utilisation": 0.0,
                    "mean_utilisation": 0.0,
                },
            )
            agg["links"] += 1
            agg["bytes"] += s["bytes"]
            agg["peak_utilisation"] = max(agg["peak_utilisation"], s["peak_utilisation"])
            agg["mean_utilisation"] += s["mean_utilisation"]
        for agg in links.values():
            agg["mean_utilisation"] /= agg["links"]
        net = sum(v["bytes"] for k, v in links.items() if k.startswith("net-"))
        bpb = r.plan.bytes_per_token
        out = {
            "description": self.spec.description,
            "tiers": ["hbm"] * self.spec.local
            + [
                t
                for t, on in zip(
                    TIER_NAMES[1:], (self.spec.dram, self.spec.nvme, self.spec.pool), strict=True
                )
                if on
            ],
            "router": c.router,
            "eviction": c.eviction,
            "write_policy": c.write_policy,
            "dram_scope": c.dram_scope if self.spec.dram else None,
            "capacity_tokens": {
                "local_per_instance": _cap_json(r.local_capacity_tokens),
                "dram_per_node": _cap_json(r.dram_capacity_tokens),
                "dram_per_instance": _cap_json(
                    r.dram_per_cache_tokens if c.dram_scope == "instance" else None
                ),
                "nvme_per_node": _cap_json(r.nvme_capacity_tokens),
                "pool": _cap_json(r.pool_capacity_tokens),
            },
            "link_gbps": {
                "dram": r.dram_gbps,
                "nvme": r.nvme_gbps,
                "pool": r.pool_gbps,
                "pool_aggregate": c.pool_aggregate_gbps if self.spec.pool else None,
            },
            "requests": n,
            "prompt_tokens": prompt,
            "hit_rate": self.hit_rate,
            "hit_rate_by_tier": self.hit_rate_by_tier,
            "hit_tokens_by_tier": dict(zip(TIER_NAMES, hits, strict=True)),
            "cross_tenant_hit_tokens": st.cross_tenant_hit_tokens,
            "cross_tenant_hit_share": self.cross_tenant_hit_share,
            "ttft_s": ttft_json,
            "prefill_gpu_s": st.gpu_s,
            "network_bytes": net,
            "bytes_read_by_tier": self.bytes_read_by_tier,
            "links": dict(sorted(links.items())),
            "peak_link_utilisation": max(
                (v["peak_utilisation"] for v in links.values()), default=0.0
            ),
            "duplicated_kv_bytes": {
                "end": st.dup_blocks_end * bpb * r.block_size,
                "time_avg": (
                    st.dup_block_s / st.duration_s * bpb * r.block_size
                    if st.duration_s > 0
                    else float(st.dup_blocks_end * bpb * r.block_size)
                ),
            },
            "makespan_s": st.duration_s,
            "max_rate_scale_at_slo": self.max_rate_scale_at_slo,
        }
        if r.plan.serving == "aggregated":
            out["serving"] = self.serving_json()
        if self.decode_pool is not None:
            out["decode_pool"] = self.decode_pool.to_json()
        if self.search is not None:
            out["rate_search"] = {
                "passed_at": self.search.value,
                "failed_at": self.search.fail_at,
                "capped": self.search.capped,
                "runs": self.search.runs,
                "points": [p.to_json() for p in self.search.points],
            }
        return out


def _scale_totals(out: dict[str, Any], k: float) -> None:
    """A miniature's totals over requests scaled back to the whole trace (its rates,
    percentiles and utilisations are kept; ``bytes_read_by_tier`` is scaled by its
    property already)."""
    out["requests"] = round(out["requests"] * k)
    out["prompt_tokens"] = round(out["prompt_tokens"] * k)
    out["hit_tokens_by_tier"] = {t: round(v * k) for t, v in out["hit_tokens_by_tier"].items()}
    out["cross_tenant_hit_tokens"] = round(out["cross_tenant_hit_tokens"] * k)
    for key in ("prefill_gpu_s", "network_bytes", "makespan_s"):
        out[key] *= k
    for link in out["links"].values():
        link["bytes"] *= k
    out["duplicated_kv_bytes"] = {t: v * k for t, v in out["duplicated_kv_bytes"].items()}
    if "serving" in out:
        out["serving"]["step_gpu_s"] *= k
        out["serving"]["preemptions"] = round(out["serving"]["preemptions"] * k)


@dataclass(slots=True)
class ReplayResult:
    cluster: ClusterConfig
    ttft_slo_s: float
    block_size: int
    n_requests: int
    bytes_per_token: int
    scenarios: dict[str, ScenarioResult] = field(default_factory=dict)
    miniature: Miniature | None = None  # set when the replay ran on a sample

    def to_json(self) -> dict[str, Any]:
        cluster = asdict(self.cluster)
        cluster.update(
            {
                "nodes": self.cluster.nodes,
                "instances_per_node": self.cluster.instances_per_node,
                "dram_caches_per_node": self.cluster.dram_sharers,
                "bytes_per_token": self.bytes_per_token,
                "block_size": self.block_size,
                "requests": self.n_requests,
                "ttft_slo_s": self.ttft_slo_s,
                "slo_quantile": SLO_QUANTILE,
                "decode_modelled": self.cluster.serving == "aggregated",
            }
        )
        for k in (
            "local_capacity_tokens",
            "dram_capacity_tokens",
            "nvme_capacity_tokens",
            "pool_capacity_tokens",
        ):
            cluster[k] = _cap_json(cluster[k])
        out: dict[str, Any] = {
            "schema": "kvpool.replay/1",
            "cluster": cluster,
            "scenarios": {name: s.to_json() for name, s in self.scenarios.items()},
        }
        if self.miniature is not None:
            out["miniature"] = self.miniature.to_json()
        return out


def _allowed(n_measured: int) -> int:
    """Measured requests that may miss the SLO while p90 still meets it."""
    return n_measured - math.ceil(SLO_QUANTILE * n_measured)


def _passes(stats: RunStats, slo_s: float) -> bool:
    ttft = stats.ttft_s
    return not stats.aborted and int(np.count_nonzero(ttft > slo_s)) <= _allowed(int(ttft.size))


def grid_rate(j: int) -> float:
    """The ``j``-th rate of the search's grid: ``STEP ** (j / GRID)`` (1 at ``j = 0``)."""
    return float(STEP ** (j / GRID))


def _point(rate: float, stats: RunStats, slo_s: float) -> RatePoint:
    if stats.aborted:
        return RatePoint(rate, False, None, None, None, above_s=slo_s)
    if stats.ttft_s.size == 0:
        return RatePoint(rate, _passes(stats, slo_s), None, None, None, rank_s=0.0)
    ttft = stats.ttft_s
    k = int(ttft.size) - _allowed(int(ttft.size))  # the k-th smallest decides _passes
    rank = float(np.partition(ttft, k - 1)[k - 1])
    q = np.percentile(ttft, [50, 90, 99])
    return RatePoint(
        rate, _passes(stats, slo_s), float(q[0]), float(q[1]), float(q[2]), rank_s=rank
    )


class UnknownPoint(LookupError):
    """:func:`find_max_rate` with ``simulate_missing=False`` met a rate its known points
    do not decide."""


def _says_more(p: RatePoint, q: RatePoint) -> bool:
    """A run that went to the end says more than one that stopped; of two that stopped,
    the one stopped at the higher SLO."""
    if q.rank_s is not None:
        return False
    return p.rank_s is not None or (p.above_s or 0.0) > (q.above_s or 0.0)


def first_guess(stats: RunStats, plan: Plan) -> int:
    """Grid index of the rate at which the busiest-on-average GPU would be saturated
    (1 / mean busy fraction at rate 1): where the search looks first. Only a starting
    point: the search's answer does not depend on it (see :func:`find_max_rate`).

    An aggregated engine's steps also decode: its p90 TTFT leaves the SLO when prefill
    fills about half of the GPUs' time (:data:`AGGREGATED_PREFILL_AT_SLO`), so that is
    where its search starts."""
    busy = (
        stats.gpu_s_all / plan.tp / (plan.instances * stats.duration_s) if stats.duration_s else 0
    )
    if plan.serving == "aggregated":
        busy /= AGGREGATED_PREFILL_AT_SLO
    if not busy > 0:
        return J_TOP
    j: int = round(GRID * math.log(1 / busy) / math.log(STEP))
    return max(J_BOTTOM, min(J_TOP, j))


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


def search_grid(
    ok: Callable[[int], bool], passed_at_1: bool, guess: int | None = None
) -> tuple[int | None, int | None]:
    """The grid indices ``(lo, hi)`` with ``ok(lo)`` and not ``ok(hi = lo + 1)``, found
    from the start ``guess`` by galloping away from it (steps of 2, 4, 8... grid points,
    up while it passes, down while it fails) until the answer flips, then bisecting. ``lo`` is None when ``ok(J_BOTTOM)`` fails, ``hi`` None when
    ``ok(J_TOP)`` passes. ``ok(0)`` is ``passed_at_1`` and is not asked again; no
    index is asked twice, and at most ``MAX_RUNS`` are asked."""
    lo: int | None = 0 if passed_at_1 else None  # highest grid index known to pass
    hi: int | None = None if passed_at_1 else 0  # lowest grid index known to fail
    j = guess if guess is not None else (J_TOP if passed_at_1 else J_BOTTOM) // 2
    j = max(j, lo + 1) if lo is not None else min(j, hi - 1)  # type: ignore[operator]
    j = min(max(j, J_BOTTOM), J_TOP)
    asked = 1
    up = ok(j)  # then gallop that way until the answer flips
    if up:
        lo = j
    else:
        hi = j
    step = 2
    while True:
        if up:
            if lo == J_TOP or (hi is not None and lo + step >= hi):  # type: ignore[operator]
                break
            j = min(lo + step, J_TOP)  # type: ignore[operator]
        else:
            if hi == J_BOTTOM or (lo is not None and hi - step <= lo):  # type: ignore[operator]
                break
            j = max(hi - step, J_BOTTOM)  # type: ignore[operator]
        step *= 2
        asked += 1
        if ok(j):
            lo = j
            if not up:
                break
        else:
            hi = j
            if up:
                break
    if lo is None or hi is None:
        return lo, hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        asked += 1
        if ok(mid):
            lo = mid
        else:
            hi = mid
    assert asked <= MAX_RUNS
    return lo, hi


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
    scenarios: tuple[Any, ...] | list[Any] | str = tuple(STANDARD_SCENARIOS),
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
