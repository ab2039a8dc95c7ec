"""What a replay reports: each scenario's resolved figures, its runs and rate search,
its TTFT summary, and the JSON laid out from them (``kvpool.replay/1``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from analyzer.replay.config import UNBOUNDED, ClusterConfig, ScenarioSpec, Tier
from analyzer.replay.decode import DecodePool
from analyzer.replay.engine import TIER_NAMES, Plan, Recording, RunStats
from analyzer.replay.miniature import Miniature
from analyzer.replay.rate_grid import SLO_QUANTILE, _allowed, _passes


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


def _cap_json(tokens: int | None) -> int | str | None:
    return "unbounded" if tokens is not None and tokens >= UNBOUNDED else tokens


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


def _says_more(p: RatePoint, q: RatePoint) -> bool:
    """A run that went to the end says more than one that stopped; of two that stopped,
    the one stopped at the higher SLO."""
    if q.rank_s is not None:
        return False
    return p.rank_s is not None or (p.above_s or 0.0) > (q.above_s or 0.0)
