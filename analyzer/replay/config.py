"""What a replay simulates: the cluster (:class:`ClusterConfig`) and the deployment
options compared on it (:class:`ScenarioSpec`).

Units are in the field names: ``*_tokens`` are KV capacities in tokens, ``*_gbps`` are
GB/s (decimal, 1e9 bytes per second), ``*_s`` are seconds. A capacity left at ``None``
is derived from the cost-model catalogs when the replay starts (see
:func:`analyzer.replay.run.resolve`); :data:`UNBOUNDED` means no limit at all.

Standard scenarios (stable names, used by the advisor and the report):

==============  ================================================================
``none``        no prefix cache: every prompt token is prefilled
``local``       per-instance HBM prefix cache (vLLM / SGLang automatic prefix caching)
``local+dram``  plus a host-DRAM tier over PCIe (LMCache local CPU, HiCache L2): by
                default one private tier per instance, holding its share of the
                node's DRAM (``dram_scope="instance"``)
``pooled``      HBM cache plus one cluster-wide pool over RDMA (Mooncake Store,
                LMCache remote, HiCache L3), shared by every instance, those on
                the same node included
==============  ================================================================

Host DRAM is private to each serving process in the engines this models: LMCache's
local CPU backend (``max_local_cpu_size``, in GB per process) and SGLang HiCache's host
pool (``--hicache-size`` / ``--hicache-ratio``, per server) both live inside the engine,
so eight instances on one node hold eight separate DRAM caches and one instance never
hits what another computed. Only a shared store (Mooncake Store, LMCache's remote or
P2P backend, HiCache's L3) does. ``dram_scope="node"`` models one DRAM cache per node
shared by its instances instead, for deployments that run a node-local shared store.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer import limits
from analyzer.cache.policies import get_policy, replay_policies
from analyzer.cost import CostModel
from analyzer.cost.dtypes import weights_dtype_named
from analyzer.errors import InputError, Location, UsageError
from analyzer.outputs import note_input
from analyzer.replay.link_settings import LinkSettings
from analyzer.replay.routers import ROUTERS as ROUTER_CLASSES

if TYPE_CHECKING:
    from analyzer.cost import CostModel

# A capacity this large (or the word "unbounded" on the command line) means no limit.
UNBOUNDED = 2**62


class Scenario(StrEnum):
    """The standard deployment options, by the names every output uses (a ``--config``
    file may add its own under any other name, so a scenario's name is a ``str``)."""

    NONE = "none"
    LOCAL = "local"
    LOCAL_DRAM = "local+dram"
    LOCAL_DRAM_NVME = "local+dram+nvme"
    POOLED = "pooled"


class Tier(StrEnum):
    """The cache tiers a replayed prompt token can be served from, nearest first (the
    keys of ``hit_rate_by_tier`` and ``bytes_read_by_tier``)."""

    HBM = "hbm"
    DRAM = "dram"
    NVME = "nvme"
    POOL = "pool"


# The built-in routers, the names the CLI offers; a router registered later in
# routers.ROUTERS is accepted too.
ROUTERS = tuple(ROUTER_CLASSES)
# "instance": each instance's own DRAM tier, its share of the node's DRAM (the engines'
# default); "node": one DRAM tier per node shared by its instances (a node-local store).
DRAM_SCOPES = ("instance", "node")
WRITE_POLICIES = ("write-through", "write-through-selective", "on-evict")
# "aggregated": prefill and decode in one continuous batch per instance (vLLM, SGLang);
# "disaggregated": a prefill pool, decode left to instances beside it (Mooncake).
SERVING = ("aggregated", "disaggregated")


@dataclass(frozen=True, slots=True)
class Connector:
    """How a product moves KV between HBM and the tiers below it (aggregated serving).

    ``chunk_tokens``: what a lower tier stores and returns comes in whole chunks of this
    many tokens from the prompt's start (0: the engine's blocks); ``layerwise``: a load
    from host DRAM runs layer by layer beside the prefill that needs it, which waits
    for a layer only until that layer is in (else the request waits for the whole load
    before it is scheduled)."""

    name: str
    chunk_tokens: int
    layerwise: bool
    source: str


CONNECTORS: dict[str, Connector] = {
    # LMCache stores each prompt's full 256-token chunks as they are computed
    # (chunk_size 256; save_unfull_chunk false: no partial chunk) and loads a hit before
    # the request is scheduled (use_layerwise false); lmcache/v1/config.py.
    "lmcache": Connector("lmcache", 256, False, "LMCache (lmcache/v1/config.py defaults)"),
    # vLLM's native CPU offloading (OffloadingConnector) stores each step's newly computed
    # blocks and loads hits asynchronously before scheduling;
    # vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py.
    "vllm": Connector(
        "vllm", 0, False, "vLLM OffloadingConnector (--kv-offloading-backend native)"
    ),
    # SGLang HiCache loads host-DRAM hits into the device pool layer by layer, the forward
    # of a layer waiting for that layer only (cache controller's layer_done_counter);
    # storage (L3) hits are prefetched into host DRAM first;
    # python/sglang/srt/mem_cache/hiradix_cache.py, managers/cache_controller.py.
    "hicache": Connector("hicache", 0, True, "SGLang HiCache (--enable-hierarchical-cache)"),
}
HICACHE_RATIO = 2.0  # SGLang's --hicache-ratio default: host pool = 2 x the device pool


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The cluster the trace is replayed on.

    ``instances`` serving instances of ``tp`` GPUs each; ``gpus_per_node`` GPUs share
    one host (its DRAM, NVMe and network link), so a node holds
    ``max(1, gpus_per_node // tp)`` instances. ``dram_capacity_*`` is the host DRAM a
    node gives to KV; with ``dram_scope="instance"`` each instance on it holds an
    equal, private share (see :attr:`dram_sharers`). ``serving="aggregated"`` (the
    default) runs each instance's prefill and decode in one continuous batch, as vLLM and
    SGLang serve (:mod:`analyzer.replay.serving`); ``"disaggregated"`` replays them as a
    prefill pool, as Mooncake's, TTFT being queueing + loads + prefill, and sizes the
    decode pool beside it (:mod:`analyzer.replay.decode`).
    """

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    instances: int = 4
    gpus_per_node: int = 8
    kv_dtype: str = "bf16"
    mfu: float | None = None  # None: the engine model; a number: the roofline at that MFU
    weights_dtype: str | None = None  # deployment precision of the weights; None: checkpoint's
    router: str = "prefix-aware"
    # prefix-aware score = cached_tokens - lambda * queued_tokens (see routers.py)
    prefix_aware_lambda: float = 1.0
    eviction: str = "lru"
    write_policy: str = "write-through"
    # Capacities (None: derived from the catalogs; UNBOUNDED: no limit).
    local_capacity_tokens: int | None = None  # HBM prefix cache per instance
    hbm_reserve_fraction: float = 0.1  # HBM kept free besides weights (activations)
    dram_capacity_tokens: int | None = None  # host DRAM KV tier per node (all its instances)
    dram_scope: str = "instance"  # see DRAM_SCOPES
    dram_capacity_gb: float = 512.0  # default DRAM given to KV per node, when tokens unset
    nvme_capacity_tokens: int | None = None  # local NVMe KV tier per node
    nvme_capacity_gb: float = 3840.0  # default NVMe given to KV per node
    pool_capacity_tokens: int | None = None  # whole pool; None: the nodes' DRAM, summed
    # Links: catalog tier names, and the bandwidths and latencies that replace the tier's
    # (None: the tier's). Read whole as dram_link, nvme_link and pool_link (LinkSettings);
    # resolve_link gives the figures in force.
    dram_tier: str = "pcie-gen5-dram"  # host DRAM <-> GPU, one link per instance
    nvme_tier: str = "nvme-gen4"  # NVMe <-> GPU, one link per node
    pool_tier: str = "rdma-200"  # node <-> pool, one link per node
    dram_gbps: float | None = None
    nvme_gbps: float | None = None
    pool_gbps: float | None = None  # per node link
    pool_aggregate_gbps: float | None = None  # the store's total bandwidth (None: unlimited)
    dram_latency_s: float | None = None  # first-byte latencies (None: from the tier)
    nvme_latency_s: float | None = None
    pool_latency_s: float | None = None
    # GPU scheduling: chunked prefill with this token budget per step, FIFO queue.
    prefill_chunk_tokens: int = 8192
    # How the instances serve (SERVING) and, when aggregated, the engine's scheduler
    # limits (vLLM's --max-num-batched-tokens / --max-num-seqs; None: vLLM's default
    # for the GPU) and the share of HBM it takes (--gpu-memory-utilization, SGLang's
    # --mem-fraction-static), from which the KV pool per instance follows unless
    # local_capacity_tokens gives it.
    serving: str = "aggregated"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float = 0.9
    # Aggregated: the product moving KV to the tiers below HBM (CONNECTORS). With
    # "hicache", the DRAM tier per instance is --hicache-size GB per GPU, else
    # --hicache-ratio times the engine's KV pool, unless dram_capacity_tokens gives it.
    connector: str = "lmcache"
    hicache_ratio: float = HICACHE_RATIO
    hicache_size_gb: float = 0.0
    # Inter-arrival times are multiplied by this (0.5 = twice the trace's rate).
    time_scale: float = 1.0
    # Requests before this fraction of the trace warm the caches and are not measured
    # (the steady-state convention the reuse analysis uses too; 0 = cold start).
    warmup_fraction: float = 0.5
    # Window over which peak link utilisation is measured, in trace seconds.
    link_window_s: float = 1.0
    # Cross-check mode: every load and write is instantaneous (no bandwidth, no latency).
    free_loads: bool = False

    def __post_init__(self) -> None:
        _check(self.tp >= 1, "--tp must be at least 1")
        _check(self.instances >= 1, "--instances must be at least 1")
        _check(self.gpus_per_node >= 1, "gpus_per_node must be at least 1")
        _check(
            self.router in ROUTER_CLASSES,
            f"unknown router {self.router!r}; choose one of {tuple(ROUTER_CLASSES)}",
        )
        _check(
            self.dram_scope in DRAM_SCOPES,
            f"unknown DRAM scope {self.dram_scope!r}; choose one of {DRAM_SCOPES}",
        )
        get_policy(self.eviction, flag="--eviction", replay=True)  # registered, or an error
        _check(
            self.write_policy in WRITE_POLICIES,
            f"unknown write policy {self.write_policy!r}; use {WRITE_POLICIES}",
        )
        _check(self.prefill_chunk_tokens >= 1, "prefill_chunk_tokens must be at least 1")
        _check(
            self.serving in SERVING,
            f"unknown serving {self.serving!r}; choose one of {', '.join(SERVING)}",
        )
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            _check(v is None or v >= 1, f"--{name.replace('_', '-')} must be at least 1")
            if v is not None:
                limits.check(v, name, f"--{name.replace('_', '-')}")
        _check(
            self.connector in CONNECTORS,
            f"unknown connector {self.connector!r}; choose one of {', '.join(CONNECTORS)}",
        )
        _check(
            self.hicache_ratio > 0 and math.isfinite(self.hicache_ratio),
            f"--hicache-ratio must be a positive number, got {self.hicache_ratio}",
        )
        _check(
            self.hicache_size_gb >= 0 and math.isfinite(self.hicache_size_gb),
            f"--hicache-size must be >= 0 GB, got {self.hicache_size_gb}",
        )
        limits.check(self.hicache_ratio, "hicache_ratio", "--hicache-ratio")
        limits.check(self.hicache_size_gb, "capacity_tokens", "--hicache-size")
        _check(
            0.0 < self.gpu_memory_utilization <= 1.0,
            f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _check(self.time_scale > 0 and math.isfinite(self.time_scale), "--time-scale must be > 0")
        _check(
            0.0 <= self.warmup_fraction < 1.0,
            f"--warmup must be in [0, 1), got {self.warmup_fraction}",
        )
        _check(self.link_window_s > 0, "link_window_s must be > 0")
        _check(0.0 <= self.hbm_reserve_fraction < 1.0, "hbm_reserve_fraction must be in [0, 1)")
        _check(self.prefix_aware_lambda >= 0, "prefix_aware_lambda must be >= 0")
        for name in ("dram_gbps", "nvme_gbps", "pool_gbps", "pool_aggregate_gbps"):
            v = getattr(self, name)
            _check(
                v is None or (v > 0 and math.isfinite(v)),
                f"--{name.replace('_', '-')} must be a positive number, got {v}",
            )
        for name in (
            "local_capacity_tokens",
            "dram_capacity_tokens",
            "nvme_capacity_tokens",
            "pool_capacity_tokens",
        ):
            v = getattr(self, name)
            _check(v is None or v >= 0, f"{name} must be >= 0")
            if v is not None and v != UNBOUNDED:
                limits.check(v, "capacity_tokens", name)
        # Ranges that keep one extreme value from hanging or exhausting the replay.
        limits.check(self.tp, "tp", "--tp")
        limits.check(self.instances, "instances", "--instances")
        limits.check(self.gpus_per_node, "gpus_per_node", "gpus_per_node")
        for name in ("dram_gbps", "nvme_gbps", "pool_gbps", "pool_aggregate_gbps"):
            v = getattr(self, name)
            if v is not None:
                limits.check(v, "bandwidth_gbps", name)
        for name in ("dram_latency_s", "nvme_latency_s", "pool_latency_s"):
            v = getattr(self, name)
            if v is not None:
                limits.check(v, "latency_s", name)
        for name in ("dram_capacity_gb", "nvme_capacity_gb"):
            limits.check(getattr(self, name), "capacity_tokens", name)
        limits.check(self.time_scale, "time_scale", "--time-scale")
        limits.check(self.prefill_chunk_tokens, "prefill_chunk_tokens", "prefill_chunk_tokens")
        limits.check(self.link_window_s, "link_window_s", "link_window_s")
        if self.mfu is not None:
            limits.check(self.mfu, "mfu", "mfu")

    @classmethod
    def from_settings(
        cls,
        *,
        model: str | None = None,
        tp: int | None = None,
        weights_dtype: str | None = None,
        local_capacity_tokens: str | int | None = None,
        dram_capacity_tokens: str | int | None = None,
        pool_capacity_tokens: str | int | None = None,
        warmup: float | None = None,
        hicache_size: float | None = None,
        dram: LinkSettings | None = None,
        nvme: LinkSettings | None = None,
        pool: LinkSettings | None = None,
        **fields: Any,
    ) -> ClusterConfig:
        """The cluster a user's settings describe: the one place a :class:`ClusterConfig`
        is built from them. ``kvpool replay`` and ``kvpool analyze`` call it with their
        flags (``ClusterFlags``), the dashboard with its sidebar's values, so the same
        settings give the same cluster everywhere.

        The settings are the flags' names and forms: ``model`` and ``tp`` None for the
        defaults, capacities as typed (``"2e6"``, ``"unbounded"``) or token counts,
        ``weights_dtype`` as the flag takes it (``fp16`` is ``bf16``), ``warmup`` and
        ``hicache_size`` for ``warmup_fraction`` and ``hicache_size_gb``. ``dram``,
        ``nvme`` and ``pool`` set a link whole (tier, bandwidth, latency; None in it: the
        catalog's figure); ``fields`` are other :class:`ClusterConfig` fields by name
        (``pool_gbps`` from ``--pool-gbps``, ``time_scale``, ...).
        """
        default = cls()
        for name, link in (("dram", dram), ("nvme", nvme), ("pool", pool)):
            if link is None:
                continue
            given = {f"{name}_tier", f"{name}_gbps", f"{name}_latency_s"} & fields.keys()
            if given:
                raise UsageError(f"{name}= sets the link whole; drop {', '.join(sorted(given))}")
            fields |= {
                f"{name}_tier": link.tier,
                f"{name}_gbps": link.gbps,
                f"{name}_latency_s": link.latency_s,
            }
        if warmup is not None:
            fields["warmup_fraction"] = warmup
        if hicache_size is not None:
            fields["hicache_size_gb"] = hicache_size
        return cls(
            model=default.model if model is None else model,
            tp=default.tp if tp is None else tp,
            weights_dtype=weights_dtype_named(weights_dtype),
            local_capacity_tokens=_capacity(local_capacity_tokens, "--local-capacity-tokens"),
            dram_capacity_tokens=_capacity(dram_capacity_tokens, "--dram-capacity-tokens"),
            pool_capacity_tokens=_capacity(pool_capacity_tokens, "--pool-capacity-tokens"),
            **fields,
        )

    @property
    def dram_link(self) -> LinkSettings:
        """Host DRAM <-> GPU, one link per instance (its tier, and the figures set)."""
        return LinkSettings(self.dram_tier, self.dram_gbps, self.dram_latency_s)

    @property
    def nvme_link(self) -> LinkSettings:
        """NVMe <-> GPU, one link per node."""
        return LinkSettings(self.nvme_tier, self.nvme_gbps, self.nvme_latency_s)

    @property
    def pool_link(self) -> LinkSettings:
        """Node <-> pool, one link per node (the store's total: ``pool_aggregate_gbps``)."""
        return LinkSettings(self.pool_tier, self.pool_gbps, self.pool_latency_s)

    @property
    def instances_per_node(self) -> int:
        return max(1, self.gpus_per_node // self.tp)

    @property
    def nodes(self) -> int:
        return -(-self.instances // self.instances_per_node)

    def node_of(self, instance: int) -> int:
        return instance // self.instances_per_node

    def cost_model(self) -> CostModel:
        """The catalog's cost model for this cluster's model, GPU, TP, dtypes and MFU (an
        unknown model or GPU is a :class:`~analyzer.errors.UsageError`)."""

        return CostModel.from_catalog(
            self.model,
            self.gpu,
            tp=self.tp,
            kv_dtype=self.kv_dtype,
            mfu=self.mfu,
            weight_dtype=self.weights_dtype,
        )

    @property
    def dram_sharers(self) -> int:
        """How many DRAM caches a node's DRAM is split into: one per instance on a full
        node (``dram_scope="instance"``; a partly filled last node gives its instances
        the same share), or one for the node (``"node"``)."""
        if self.dram_scope == "node":
            return 1
        return min(self.instances, self.instances_per_node)


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    """One deployment option. Fields left at None inherit the cluster's values."""

    name: str
    local: bool = True  # HBM prefix cache on each instance
    dram: bool = False  # host DRAM tier (per instance or per node: dram_scope)
    nvme: bool = False  # local NVMe tier per node
    pool: bool = False  # cluster-wide pooled store
    description: str = ""
    router: str | None = None
    eviction: str | None = None
    write_policy: str | None = None
    dram_scope: str | None = None
    connector: str | None = None
    local_capacity_tokens: int | None = None
    dram_capacity_tokens: int | None = None
    nvme_capacity_tokens: int | None = None
    pool_capacity_tokens: int | None = None
    dram_gbps: float | None = None
    nvme_gbps: float | None = None
    pool_gbps: float | None = None
    pool_aggregate_gbps: float | None = None
    pool_latency_s: float | None = None

    def __post_init__(self) -> None:
        _check(bool(self.name.strip()), "a scenario needs a non-empty name")

    def applied_to(self, cfg: ClusterConfig) -> ClusterConfig:
        """The cluster as this scenario runs it (overrides applied, validated)."""
        overrides = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in _SCENARIO_ONLY and getattr(self, f.name) is not None
        }
        return replace(cfg, **overrides) if overrides else cfg


_SCENARIO_ONLY = {"name", "local", "dram", "nvme", "pool", "description"}

STANDARD_SCENARIOS: dict[str, ScenarioSpec] = {
    Scenario.NONE: ScenarioSpec(Scenario.NONE, local=False, description="no prefix cache"),
    Scenario.LOCAL: ScenarioSpec(
        Scenario.LOCAL, description="per-instance HBM prefix cache (vLLM, SGLang)"
    ),
    Scenario.LOCAL_DRAM: ScenarioSpec(
        Scenario.LOCAL_DRAM,
        dram=True,
        description="HBM cache plus host DRAM offload, private to each instance (LMCache "
        "local CPU, HiCache L2)",
    ),
    Scenario.LOCAL_DRAM_NVME: ScenarioSpec(
        Scenario.LOCAL_DRAM_NVME,
        dram=True,
        nvme=True,
        description="HBM cache plus a host DRAM tier and a local NVMe tier on each node "
        "(LMCache local CPU + local disk, HiCache L2 + file storage)",
    ),
    Scenario.POOLED: ScenarioSpec(
        Scenario.POOLED,
        pool=True,
        description="HBM cache plus a pool over RDMA shared by every instance (Mooncake "
        "Store, LMCache remote, HiCache L3)",
    ),
}

# What a replay runs when no scenarios are named (`kvpool replay`'s `--scenarios`): the
# reference, the baseline, local DRAM offload and the pool; `local+dram+nvme` is asked for.
DEFAULT_SCENARIOS: tuple[str, ...] = (
    Scenario.NONE,
    Scenario.LOCAL,
    Scenario.LOCAL_DRAM,
    Scenario.POOLED,
)


def parse_capacity(text: str, flag: str) -> int:
    """A capacity flag: an integer token count (``1e6`` and ``1_000_000`` accepted) or
    ``unbounded``."""
    t = text.strip().lower().replace("_", "")
    if t in ("unbounded", "inf", "infinite", "none"):
        return UNBOUNDED
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"{flag}: expected a token count or 'unbounded', got {text!r}") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise UsageError(f"{flag}: expected a whole, non-negative token count, got {text!r}")
    return min(int(value), UNBOUNDED)


def _capacity(value: str | int | None, flag: str) -> int | None:
    """A capacity setting as typed (``parse_capacity``) or a token count; None: derived."""
    return parse_capacity(value, flag) if isinstance(value, str) else value


_BOOL_KEYS = {"local", "dram", "nvme", "pool"}
_INT_KEYS = {
    "local_capacity_tokens",
    "dram_capacity_tokens",
    "nvme_capacity_tokens",
    "pool_capacity_tokens",
}
_FLOAT_KEYS = {"dram_gbps", "nvme_gbps", "pool_gbps", "pool_aggregate_gbps", "pool_latency_s"}
_STR_KEYS = {
    "name",
    "description",
    "router",
    "eviction",
    "write_policy",
    "dram_scope",
    "connector",
}


def _is_json(path: Path, raw: bytes) -> bool:
    """A scenario file is JSON by its suffix; without one (stdin) by its content: an
    object, or a list of objects (TOML's ``[[scenario]]`` also opens with a bracket)."""
    suffix = path.suffix.lower()
    if suffix in (".json", ".toml"):
        return suffix == ".json"
    text = raw.lstrip()
    return text[:1] == b"{" or (text[:1] == b"[" and text[1:].lstrip()[:1] in (b"{", b"]"))


def load_scenarios(path: str | Path) -> list[ScenarioSpec]:
    """User-defined scenarios from a TOML or JSON file.

    TOML::

        [[scenario]]
        name = "big-pool"
        pool = true
        pool_capacity_tokens = 50_000_000
        pool_gbps = 50

    JSON: ``{"scenario": [{"name": "big-pool", "pool": true, ...}]}`` (``scenarios``
    and a bare list are accepted too). Capacities may be the string ``"unbounded"``.
    """
    path = Path(path)
    note_input(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(
            f"cannot read scenario file: {exc.strerror or exc}", Location(str(path))
        ) from None
    try:
        doc = json.loads(raw) if _is_json(path, raw) else tomllib.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", Location(str(path), exc.lineno)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"invalid TOML: {exc}", Location(str(path))) from None
    items = doc
    if isinstance(doc, dict):
        items = doc.get("scenario", doc.get("scenarios"))
    if not isinstance(items, list) or not items:
        raise InputError(
            "no scenarios found: expected [[scenario]] tables (TOML) or a 'scenario' list (JSON)",
            Location(str(path)),
        )
    out: list[ScenarioSpec] = []
    seen: set[str] = set()
    for k, item in enumerate(items):
        where = f"scenario[{k}]"
        if not isinstance(item, dict):
            raise InputError(
                "each scenario must be a table/object", Location(str(path), field=where)
            )
        values: dict[str, object] = {}
        for key, value in item.items():
            loc = Location(str(path), field=f"{where}.{key}")
            if key in _BOOL_KEYS:
                if not isinstance(value, bool):
                    raise InputError("expected true or false", loc)
            elif key in _INT_KEYS:
                if isinstance(value, str):
                    try:
                        value = parse_capacity(value, key)
                    except UsageError as exc:
                        raise InputError(exc.message, loc) from None
                elif isinstance(value, bool) or not isinstance(value, int | float):
                    raise InputError("expected a token count or 'unbounded'", loc)
                elif not math.isfinite(value) or value < 0 or value != int(value):
                    raise InputError("expected a whole, non-negative token count", loc)
                else:
                    value = min(int(value), UNBOUNDED)
            elif key in _FLOAT_KEYS:
                latency = key.endswith("_latency_s")  # 0 s is a valid first-byte latency
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int | float)
                    or not (value >= 0 if latency else value > 0)  # also refuses nan
                ):
                    raise InputError(
                        "expected a number >= 0" if latency else "expected a positive number", loc
                    )
                value = float(value)
            elif key in _STR_KEYS:
                if not isinstance(value, str):
                    raise InputError("expected a string", loc)
            else:
                known = sorted(_BOOL_KEYS | _INT_KEYS | _FLOAT_KEYS | _STR_KEYS)
                raise InputError(f"unknown key; known keys: {', '.join(known)}", loc)
            values[key] = value
        name = values.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InputError("a scenario needs a name", Location(str(path), field=f"{where}.name"))
        if name in seen:
            raise InputError(
                f"scenario {name!r} is defined twice", Location(str(path), field=f"{where}.name")
            )
        seen.add(name)
        for key, allowed in (
            ("router", tuple(ROUTER_CLASSES)),
            ("eviction", replay_policies()),
            ("write_policy", WRITE_POLICIES),
            ("dram_scope", DRAM_SCOPES),
            ("connector", tuple(CONNECTORS)),
        ):
            if key in values and values[key] not in allowed:
                raise InputError(
                    f"unknown value {values[key]!r}; choose one of {allowed}",
                    Location(str(path), field=f"{where}.{key}"),
                )
        out.append(ScenarioSpec(**values))  # type: ignore[arg-type]
    return out


def select_scenarios(
    names: str | list[str | ScenarioSpec] | tuple[str | ScenarioSpec, ...],
    extra: list[ScenarioSpec] | None = None,
) -> list[ScenarioSpec]:
    """Resolve scenarios (comma-separated names, or a list of names and specs) against
    the standard ones and the user-defined ``extra``; ``extra`` ones not named are
    appended."""
    extra = extra or []
    by_name = {**STANDARD_SCENARIOS, **{s.name: s for s in extra}}
    wanted = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    wanted = [n for n in wanted if n]
    out: list[ScenarioSpec] = []
    for n in wanted:
        if isinstance(n, ScenarioSpec):
            if any(s.name == n.name for s in out):
                raise UsageError(f"scenario {n.name!r} is given twice")
            out.append(n)
            continue
        if n not in by_name:
            raise UsageError(
                f"unknown scenario {n!r}; standard ones are {', '.join(STANDARD_SCENARIOS)}"
                + (f", user-defined: {', '.join(s.name for s in extra)}" if extra else "")
            )
        if by_name[n] not in out:
            out.append(by_name[n])
    for s in extra:
        if all(o.name != s.name for o in out):
            out.append(s)
    if not out:
        raise UsageError("no scenarios to run")
    return out
