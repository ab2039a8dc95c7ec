"""One deployment per option: the record every output reads.

A :class:`DeploymentPlan` is one option (the HBM prefix cache alone, local DRAM offload,
local DRAM and NVMe offload, a pool) for one model of the log, sized by the size stage
(:mod:`analyzer.advisor.size`): the model as served, the GPU, the tensor parallelism,
the fewest instances that meet the TTFT SLO at the busiest window's load, the nodes they
fill, what each tier holds per instance and per node, the router, the load, the TTFT
percentiles of the replay at that size and load, and the money for exactly those GPUs,
nodes, DRAM, NVMe, NICs and store servers. The summary, every table, the sizing,
``deploy/``, the pilot gates and the dashboard read these records; nothing else counts
GPUs or nodes or takes a TTFT from another operating point.

A log naming several models gets one plan per model and option; engines serve one
model each, so no two models share a GPU, and the whole fleet of an option
(:class:`Fleet`) is the sum of its models' plans: instances, GPUs, nodes and money add
up, and its TTFT percentiles are those of every model's requests together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from analyzer.cost.prices import Prices
from analyzer.replay.config import Scenario, Tier
from analyzer.replay.run import ScenarioResult, TtftSummary

GB = 1e9


class PlanStatus(StrEnum):
    """How an option's size search ended."""

    MEETS = "meets-slo"  # ``instances`` meet the SLO, within the cap
    ABOVE_CAP = "above-cap"  # none within the cap; ``instances_above_cap`` would
    CANNOT_MEET = "cannot-meet"  # none up to the largest count searched
    PREFILL_BOUND = "prefill-bound"  # the requests' own prefill already misses the SLO
    NOT_SEARCHED = "not-searched"  # no replay (a count-only or too-short log)


@dataclass(frozen=True, slots=True)
class PlanLoad:
    """The load a plan serves: a mean request rate and the busiest window's (``window_s``
    long), which the plan is sized and replayed at. ``factor`` is that load as a multiple
    of the log's own (a what-if's x2; 1: the log's), by which both rates are already
    multiplied."""

    mean_rps: float
    peak_rps: float
    window_s: float
    factor: float = 1.0

    @property
    def peak_factor(self) -> float:
        """The busiest window's rate over the mean (the log's shape, whatever ``factor``)."""
        return self.peak_rps / self.mean_rps if self.mean_rps > 0 else 1.0

    @property
    def rate_multiple(self) -> float:
        """The load the plan is replayed at, as a multiple of the log's own mean rate."""
        return self.peak_factor * self.factor

    @property
    def time_scale(self) -> float:
        """The log's inter-arrival times multiplied by this replay the busiest load."""
        return 1.0 / self.rate_multiple

    def to_json(self) -> dict[str, object]:
        return {
            "mean_rps": self.mean_rps,
            "peak_rps": self.peak_rps,
            "peak_window_s": self.window_s,
            "sizing_rate_multiple": self.rate_multiple,
        }


@dataclass(frozen=True, slots=True)
class Capacities:
    """What each tier of a plan holds, in tokens (None: the option has no such tier).
    DRAM per instance is its private share of the node's DRAM (``--dram-scope
    instance``), or the node's whole DRAM shared by its instances (``node``)."""

    bytes_per_token: int
    hbm_per_instance: int
    dram_per_node: int | None = None
    dram_per_instance: int | None = None
    nvme_per_node: int | None = None
    pool: int | None = None

    def gb(self, tokens: int | None) -> float | None:
        return None if tokens is None else tokens * self.bytes_per_token / GB

    def to_json(self) -> dict[str, object]:
        tokens = {
            "hbm_per_instance": self.hbm_per_instance,
            "dram_per_instance": self.dram_per_instance,
            "dram_per_node": self.dram_per_node,
            "nvme_per_node": self.nvme_per_node,
            "pool": self.pool,
        }
        return {
            "bytes_per_token": self.bytes_per_token,
            "tokens": tokens,
            "gb": {k: self.gb(v) for k, v in tokens.items()},
        }


@dataclass(frozen=True, slots=True)
class Money:
    """A plan's monthly cost: its GPUs (None: no GPU price), and what the option adds."""

    gpu_usd_month: float | None
    dram_gb: float = 0.0
    dram_usd_month: float = 0.0
    nvme_tb: float = 0.0
    nvme_usd_month: float = 0.0
    nic_nodes: int = 0
    nic_usd_month: float = 0.0
    store_usd_month: float = 0.0

    @property
    def added_usd_month(self) -> float:
        return self.dram_usd_month + self.nvme_usd_month + self.nic_usd_month + self.store_usd_month

    @property
    def total_usd_month(self) -> float | None:
        return None if self.gpu_usd_month is None else self.gpu_usd_month + self.added_usd_month

    def __add__(self, other: Money) -> Money:
        gpu = (
            None
            if self.gpu_usd_month is None or other.gpu_usd_month is None
            else self.gpu_usd_month + other.gpu_usd_month
        )
        return Money(
            gpu,
            self.dram_gb + other.dram_gb,
            self.dram_usd_month + other.dram_usd_month,
            self.nvme_tb + other.nvme_tb,
            self.nvme_usd_month + other.nvme_usd_month,
            self.nic_nodes + other.nic_nodes,
            self.nic_usd_month + other.nic_usd_month,
            self.store_usd_month + other.store_usd_month,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "gpu_usd_month": self.gpu_usd_month,
            "dram_gb": self.dram_gb,
            "dram_usd_month": self.dram_usd_month,
            "nvme_tb": self.nvme_tb,
            "nvme_usd_month": self.nvme_usd_month,
            "nic_nodes": self.nic_nodes,
            "nic_usd_month": self.nic_usd_month,
            "store_usd_month": self.store_usd_month,
            "added_usd_month": self.added_usd_month,
            "total_usd_month": self.total_usd_month,
        }


@dataclass(frozen=True, slots=True)
class Tried:
    """One instance count the size search replayed."""

    instances: int
    passed: bool
    ttft_p90_s: float | None  # None: the replay stopped once it had lost the SLO

    def to_json(self) -> dict[str, object]:
        return {"instances": self.instances, "passed": self.passed, "ttft_p90_s": self.ttft_p90_s}


@dataclass(frozen=True, slots=True)
class DeploymentPlan:
    """One option for one model, sized by replaying at size (module docstring).

    ``instances`` is None when no count up to the cap met the SLO (``status`` says how
    the search ended; ``instances_above_cap`` is the count found above the cap, when
    one was). ``ttft`` and the hit rates are the replay's at ``instances`` (or at
    ``instances_above_cap``) and the busiest window's load; None when there is none."""

    option: str
    model: str  # the catalog model it is priced as (or a config's name)
    served_as: str  # the log's name for it ("" when the log names none)
    gpu: str
    tp: int
    gpus_per_node: int
    router: str
    status: PlanStatus
    instances: int | None
    capacities: Capacities
    load: PlanLoad
    ttft_slo_s: float
    money: Money
    ttft: TtftSummary | None = None
    hit_rate: float | None = None
    hit_rate_by_tier: tuple[tuple[str, float], ...] = ()
    instances_above_cap: int | None = None
    cap_instances: int = 0
    tried: tuple[Tried, ...] = ()
    # Kept out of the JSON: the measured TTFTs at size (a fleet's percentiles pool them)
    ttft_s: np.ndarray | None = field(default=None, compare=False, repr=False)
    pool_read_bytes_per_s_per_node: float = 0.0
    network_bytes: float = 0.0
    prompt_tokens: int = 0  # measured prompt tokens of the replay at size (weights a fleet's rates)
    # of the replay's hit tokens at size, the share whose block another tenant's request
    # last held (RunStats.cross_tenant_hit_tokens); None: not replayed
    cross_tenant_hit_share: float | None = None
    # the lowest p90 TTFT any size reaches (analyzer.advisor.replay.Floor); None: not replayed
    floor_p90_s: float | None = None
    # its share of the KV store's servers (one store serves every model of the log)
    store_share: float = 1.0
    # the replay at the plan's size (kept out of the plan's JSON; the report's ``replay``)
    run: ScenarioResult | None = field(default=None, compare=False, repr=False)

    @property
    def instances_per_node(self) -> int:
        """Instances on a full node (all of them when they fill less than one)."""
        per = max(1, self.gpus_per_node // self.tp)
        return per if self.instances is None else max(1, min(self.instances, per))

    @property
    def gpus(self) -> int | None:
        return None if self.instances is None else self.instances * self.tp

    @property
    def nodes(self) -> int | None:
        return (
            None
            if self.instances is None
            else nodes_for(self.instances, self.tp, self.gpus_per_node)
        )

    @property
    def meets_slo(self) -> bool:
        return self.status == PlanStatus.MEETS

    def tier_hit_rate(self, tier: str) -> float:
        return dict(self.hit_rate_by_tier).get(tier, 0.0)

    def to_json(self) -> dict[str, object]:
        return {
            "option": self.option,
            "model": self.model,
            "served_as": self.served_as,
            "gpu": self.gpu,
            "tp": self.tp,
            "status": self.status,
            "instances": self.instances,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "instances_per_node": self.instances_per_node,
            "gpus_per_node": self.gpus_per_node,
            "instances_above_cap": self.instances_above_cap,
            "gpus_above_cap": None
            if self.instances_above_cap is None
            else self.instances_above_cap * self.tp,
            "cap_gpus": self.cap_instances * self.tp,
            "router": self.router,
            "capacity": self.capacities.to_json(),
            "load": self.load.to_json(),
            "ttft_slo_s": self.ttft_slo_s,
            "ttft_s": None if self.ttft is None else self.ttft.to_json(),
            "hit_rate": self.hit_rate,
            "hit_rate_by_tier": dict(self.hit_rate_by_tier),
            "cross_tenant_hit_share": self.cross_tenant_hit_share,
            "network_bytes": self.network_bytes,
            "money": self.money.to_json(),
            "floor_p90_s": self.floor_p90_s,
            "search": {"runs": len(self.tried), "tried": [t.to_json() for t in self.tried]},
        }


def nodes_for(instances: int, tp: int, gpus_per_node: int) -> int:
    """Hosts ``instances`` of ``tp`` GPUs fill: a node holds ``gpus_per_node // tp`` of
    them, or an instance wider than a node spans ``ceil(tp / gpus_per_node)`` nodes."""
    if tp > gpus_per_node:
        return instances * -(-tp // gpus_per_node)
    return -(-instances // (gpus_per_node // tp))


def price(
    option: str,
    *,
    instances: int | None,
    tp: int,
    gpus_per_node: int,
    capacities: Capacities,
    prices: Prices,
    gpu: str,
    store_share: float = 1.0,
) -> Money:
    """The money for a plan's own GPUs and nodes (none without instances): GPUs x the
    GPU's price; DRAM per node x nodes for local offload, the pool's DRAM for a pool;
    NVMe per node x nodes; a pool NIC per node and the store's servers for a pool."""
    p = prices
    gpu_month = p.gpu_month_usd(gpu)
    if instances is None:
        return Money(None)
    nodes = nodes_for(instances, tp, gpus_per_node)
    gpus = instances * tp
    dram_gb = nvme_tb = 0.0
    nic_nodes = 0
    store = False
    if option in (Scenario.LOCAL_DRAM, Scenario.LOCAL_DRAM_NVME):
        dram_gb = nodes * (capacities.gb(capacities.dram_per_node) or 0.0)
    if option == Scenario.LOCAL_DRAM_NVME:
        nvme_tb = nodes * (capacities.gb(capacities.nvme_per_node) or 0.0) / 1000
    if option == Scenario.POOLED:
        dram_gb = capacities.gb(capacities.pool) or 0.0
        nic_nodes = nodes
        store = True
    return Money(
        gpu_usd_month=None if gpu_month is None else gpus * gpu_month,
        dram_gb=dram_gb,
        dram_usd_month=dram_gb * p.dram_gb_month.usd,
        nvme_tb=nvme_tb,
        nvme_usd_month=nvme_tb * p.nvme_tb_month.usd,
        nic_nodes=nic_nodes,
        nic_usd_month=nic_nodes * p.nic_node_month.usd,
        store_usd_month=p.store_month.usd * store_share if store else 0.0,
    )


def repriced(plan: DeploymentPlan, prices: Prices) -> DeploymentPlan:
    """The same plan at other prices (the sensitivity table's price rows)."""
    money = price(
        plan.option,
        instances=plan.instances,
        tp=plan.tp,
        gpus_per_node=plan.gpus_per_node,
        capacities=plan.capacities,
        prices=prices,
        gpu=plan.gpu,
        store_share=plan.store_share,
    )
    return replace(plan, money=money)


@dataclass(frozen=True, slots=True)
class Fleet:
    """One option for the whole log: every model's plan of it (one model each, on GPUs
    of its own). Counts and money are the sums of the plans; TTFT percentiles are
    those of every model's measured requests together, each at its own plan's size."""

    option: str
    plans: tuple[DeploymentPlan, ...]
    ttft: TtftSummary | None

    @classmethod
    def of(cls, option: str, plans: tuple[DeploymentPlan, ...]) -> Fleet:
        ttft: TtftSummary | None = None
        if len(plans) == 1:
            ttft = plans[0].ttft
        elif plans and all(p.ttft_s is not None for p in plans):
            ttft = TtftSummary.of(np.concatenate([p.ttft_s for p in plans if p.ttft_s is not None]))
        return cls(option, plans, ttft)

    @property
    def status(self) -> PlanStatus:
        """The worst of its models' (a fleet meets the SLO when every model does)."""
        order = list(PlanStatus)
        return max((p.status for p in self.plans), key=order.index, default=PlanStatus.NOT_SEARCHED)

    @property
    def meets_slo(self) -> bool:
        return bool(self.plans) and all(p.meets_slo for p in self.plans)

    def _sum(self, what: str) -> int | None:
        values = [getattr(p, what) for p in self.plans]
        return None if not values or any(v is None for v in values) else sum(values)

    @property
    def instances(self) -> int | None:
        return self._sum("instances")

    @property
    def gpus(self) -> int | None:
        return self._sum("gpus")

    @property
    def nodes(self) -> int | None:
        return self._sum("nodes")

    @property
    def gpus_above_cap(self) -> int | None:
        """The GPUs that would meet the SLO when some model's need more than the cap."""
        total = 0
        for p in self.plans:
            n = p.instances if p.instances is not None else p.instances_above_cap
            if n is None:
                return None
            total += n * p.tp
        return total

    @property
    def cap_gpus(self) -> int:
        return max((p.cap_instances * p.tp for p in self.plans), default=0)

    @property
    def search_gpus(self) -> int:
        """The most GPUs any model's search replayed."""
        return max((t.instances * p.tp for p in self.plans for t in p.tried), default=0)

    @property
    def floor_p90_s(self) -> float | None:
        floors = [p.floor_p90_s for p in self.plans if p.floor_p90_s is not None]
        return max(floors) if floors else None

    @property
    def money(self) -> Money:
        out: Money | None = None
        for p in self.plans:
            out = p.money if out is None else out + p.money
        return out if out is not None else Money(None)

    def _weighted(self, rate: list[float | None]) -> float | None:
        """A rate over every model's measured prompt tokens (each plan's own rate)."""
        if not rate or any(r is None for r in rate):
            return None
        weights = [p.prompt_tokens for p in self.plans]
        total = sum(weights)
        if total <= 0:
            return float(np.mean([r for r in rate if r is not None]))
        return sum((r or 0.0) * w for r, w in zip(rate, weights, strict=True)) / total

    @property
    def hit_rate(self) -> float | None:
        return self._weighted([p.hit_rate for p in self.plans])

    def tier_hit_rate(self, tier: Tier | str) -> float:
        return self._weighted([p.tier_hit_rate(tier) for p in self.plans]) or 0.0

    @property
    def cross_tenant_hit_share(self) -> float | None:
        """Of every model's hit tokens at size, the share another tenant last held."""
        shares = [p.cross_tenant_hit_share for p in self.plans]
        if not shares or any(s is None for s in shares):
            return None
        weights = [(p.hit_rate or 0.0) * p.prompt_tokens for p in self.plans]
        total = sum(weights)
        if total <= 0:
            return 0.0
        return sum((s or 0.0) * w for s, w in zip(shares, weights, strict=True)) / total

    @property
    def network_bytes(self) -> float:
        return float(sum(p.network_bytes for p in self.plans))

    def to_json(self) -> dict[str, object]:
        return {
            "option": self.option,
            "status": self.status,
            "models": len(self.plans),
            "instances": self.instances,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "gpus_above_cap": self.gpus_above_cap,
            "cap_gpus": self.cap_gpus,
            "floor_p90_s": self.floor_p90_s,
            "ttft_s": None if self.ttft is None else self.ttft.to_json(),
            "hit_rate": self.hit_rate,
            "cross_tenant_hit_share": self.cross_tenant_hit_share,
            "money": self.money.to_json(),
        }


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
