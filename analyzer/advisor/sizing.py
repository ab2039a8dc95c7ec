"""Sized recommendation: how much pool, host DRAM and network, which block size,
router and eviction policy.

* **Pool capacity** is the knee of the LRU hit-ratio curve: the smallest capacity
  reaching ``knee_fraction`` (90 %) of the ceiling. Capacity past the knee buys little
  hit rate per GB.
* **Host DRAM per node**: with a pool, each node contributes its ranks' share of the
  pool (``pool / nodes`` when every node is full). Without a pool, the node's
  DRAM is written through (it holds every block its instances produce, HBM's
  included), so it is sized at the knee itself, an upper bound (the knee is the whole
  cluster's working set; routing by session or prefix lets a node hold less), or at
  the DRAM the replay simulated when that is smaller.
* **Network per node**: enough to beat recompute for the shorter reusable prefixes
  (break-even at the 25th percentile of reusable prefix length, twice over for
  headroom), and at least the replay's measured pool read rate.
* **Block size**: the coarsest size losing at most ``max_block_loss`` of hit rate
  against the finest measured (coarse blocks mean fewer, larger transfers).
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.advisor.figures import DeployOption
from analyzer.advisor.words import count

GB = 10**9
GIB = 2**30

# Transfer staging each GPU rank keeps beside the pool (Mooncake ``local_buffer_size``,
# LMCache's CPU buffer when the pool is the only DRAM tier, HiCache's host pool in front
# of L3). vLLM's Mooncake Store page writes "4GB" per GPU, which Mooncake reads as GiB.
STAGING_PER_RANK_BYTES = 4 * GIB


@dataclass(frozen=True, slots=True)
class ClusterFigures:
    instances: int
    tp: int
    gpus_per_node: int
    hbm_cache_tokens_per_instance: int
    bytes_per_token: int
    router: str = "prefix-aware"

    @property
    def instances_per_node(self) -> int:
        return max(1, min(self.instances, self.gpus_per_node // self.tp))

    @property
    def nodes(self) -> int:
        return -(-self.instances // max(1, self.gpus_per_node // self.tp))


@dataclass(frozen=True, slots=True)
class Sizing:
    pool: bool  # whether a pool is part of the recommendation
    pool_capacity_tokens: int
    dram_per_node_tokens: int
    dram_reason: str
    hbm_cache_per_instance_tokens: int
    bytes_per_token: int
    network_per_node_gbps: float
    nic: str  # suggested link, e.g. "rdma-200"
    block_size_tokens: int  # engine block / page size
    chunk_size_tokens: int  # offload transfer unit (LMCache chunk)
    block_size_reason: str
    router: str
    router_reason: str
    eviction: str
    eviction_reason: str
    nodes: int
    instances: int
    instances_per_node: int
    tp: int = 1  # GPU ranks (processes) per instance
    nvme_per_node_tokens: int = 0  # local NVMe tier per node (0: none)

    def gb(self, tokens: int) -> float:
        return tokens * self.bytes_per_token / GB

    def gib(self, tokens: int) -> float:
        return tokens * self.bytes_per_token / GIB

    @property
    def pool_capacity_gb(self) -> float:
        return self.gb(self.pool_capacity_tokens)

    @property
    def dram_per_node_gb(self) -> float:
        return self.gb(self.dram_per_node_tokens)

    @property
    def nvme_per_node_gb(self) -> float:
        return self.gb(self.nvme_per_node_tokens)

    @property
    def nvme_per_node_bytes(self) -> int:
        return self.nvme_per_node_tokens * self.bytes_per_token

    @property
    def pool_bytes(self) -> int:
        return self.pool_capacity_tokens * self.bytes_per_token

    @property
    def dram_per_node_bytes(self) -> int:
        return self.dram_per_node_tokens * self.bytes_per_token

    @property
    def ranks(self) -> int:
        """GPU ranks in the cluster: one engine worker process each."""
        return self.instances * max(1, self.tp)

    @property
    def ranks_per_node(self) -> int:
        return self.instances_per_node * max(1, self.tp)

    @property
    def dram_per_instance_bytes(self) -> float:
        """Each instance's share of its node's host DRAM (engines size it per instance)."""
        return self.dram_per_node_bytes / max(1, self.instances_per_node)

    @property
    def dram_per_rank_bytes(self) -> float:
        """Each GPU rank's share: LMCache and HiCache allocate their CPU pool per rank."""
        return self.dram_per_instance_bytes / max(1, self.tp)

    @property
    def pool_segment_per_node_gb(self) -> float:
        """What a full node contributes to the pool (its ranks' share)."""
        return self.pool_bytes * self.ranks_per_node / max(1, self.ranks) / GB


def choose_block_size(
    granularity: dict[int, float], engine_block: int, max_loss: float = 0.02
) -> tuple[int, str]:
    """Coarsest block size (of those measured) within ``max_loss`` of the finest."""
    if not granularity:
        return (
            engine_block,
            f"{engine_block} tokens (the trace's block size; no coarser sizes measured)",
        )
    finest = min(granularity)
    best = finest
    for size in sorted(granularity):
        if granularity[finest] - granularity[size] <= max_loss:
            best = size
    loss = granularity[finest] - granularity[best]
    return best, (
        f"{best}-token chunks lose {100 * loss:.1f} points of hit rate against {finest}-token "
        f"blocks ({100 * granularity[finest]:.1f}% -> {100 * granularity[best]:.1f}%); "
        f"coarser ones lose more than {100 * max_loss:.0f} points"
    )


# What each router the replay offers does, in the sizing row's words.
ROUTER_WORDS = {
    "prefix-aware": "routes by longest cached prefix balanced against load (SGLang router, "
    "Dynamo KV router, llm-d)",
    "kv-router": "routes by the KV blocks each instance reports cached (Dynamo KV router)",
    "session": "session affinity: sticky routing on the conversation id",
    "round-robin": "sends each request to the next instance in turn",
    "least-loaded": "sends each request to the instance with the least queued work",
}


def choose_router(
    same_session_share: float, sessions_known: bool, replay_router: str
) -> tuple[str, str]:
    """The router to deploy: the one the plan was replayed with (its size and TTFT hold
    for that router only), and, where the log suggests another would serve as well, that
    one named as a suggestion the replay did not test."""
    what = ROUTER_WORDS.get(replay_router, f"the {replay_router} router")
    reason = f"the router the plan was replayed with ({what})"
    session_reuse = sessions_known and same_session_share >= 0.7
    if session_reuse and replay_router != "session":
        reason += (
            f"; {100 * same_session_share:.0f}% of reused tokens come from the same session, "
            "so session affinity may keep them local as well: a suggestion not replayed "
            "(--router session sizes it)"
        )
    elif not session_reuse and replay_router not in ("prefix-aware", "kv-router"):
        reason += (
            "; reuse is shared across sessions (system prompts, tools, documents), so a "
            "prefix-aware router may keep more of it local: a suggestion not replayed "
            "(--router prefix-aware sizes it)"
        )
    return replay_router, reason


def choose_eviction(policy_at_knee: dict[str, float]) -> tuple[str, str]:
    lru = policy_at_knee.get("lru")
    if lru is None:
        return "lru", "LRU, the default of vLLM, SGLang, LMCache and Mooncake Store"
    others = {k: v for k, v in policy_at_knee.items() if k not in ("lru", "optimal")}
    best = max(others.items(), key=lambda kv: (kv[1], kv[0]), default=None)
    text = f"LRU (the products' default) reaches {100 * lru:.1f}% at the pool capacity"
    if "optimal" in policy_at_knee:
        text += f"; Belady's optimal bound is {100 * policy_at_knee['optimal']:.1f}%"
    if best is not None and best[1] > lru + 0.02:
        text += (
            f"; {best[0]} would gain {100 * (best[1] - lru):.1f} points, worth it only where "
            "the product offers it"
        )
    return "lru", text


def pick_nic(required_gbps: float, tiers: list[tuple[str, float]]) -> str:
    """Smallest network tier (name, effective GB/s) reaching ``required_gbps``."""
    fitting = sorted((bw, name) for name, bw in tiers if bw >= required_gbps)
    if fitting:
        return fitting[0][1]
    return max(tiers, key=lambda t: t[1])[0] if tiers else "rdma-400"


def size(
    *,
    pool: bool,
    knee_tokens: int,
    cluster: ClusterFigures,
    dram_simulated_tokens: int | None = None,
    break_even_short_gbps: float,
    replay_pool_read_gbps_per_node: float,
    network_tiers: list[tuple[str, float]],
    granularity: dict[int, float],
    engine_block: int,
    same_session_share: float,
    sessions_known: bool,
    policy_at_knee: dict[str, float],
) -> Sizing:
    nodes = cluster.nodes
    hbm_node = cluster.hbm_cache_tokens_per_instance * cluster.instances_per_node
    if pool:
        pool_tokens = knee_tokens
        # Every GPU rank contributes an equal segment, so a full node holds its ranks'
        # share (pool / nodes when the instances fill the nodes evenly).
        ranks = cluster.instances * max(1, cluster.tp)
        dram_node = -(-pool_tokens * cluster.instances_per_node * max(1, cluster.tp) // ranks)
        dram_reason = f"each node's share of the pool ({count(nodes, 'node')})"
    else:
        pool_tokens = 0
        # Written through, a node's DRAM holds every block its instances produce: it is
        # the node's whole cache, so it needs the knee of the traffic the node sees. That
        # is the knee itself on one node; with affinity routing over N nodes a node sees
        # part of the working set (between knee / N and knee), so the knee is an upper bound.
        dram_node = knee_tokens
        dram_reason = (
            f"the knee of the hit-ratio curve ({knee_tokens:,} tokens): the node's DRAM is "
            "its full cache under write-through"
            + (
                f"; an upper bound over {nodes} nodes (at least knee / {nodes})"
                if nodes > 1
                else ""
            )
        )
        if knee_tokens <= hbm_node:
            dram_reason += f" (HBM alone, {hbm_node:,} tokens per node, is split across instances)"
        if dram_simulated_tokens and knee_tokens > dram_simulated_tokens:
            # Recommend what the replay projected; say what more would buy.
            dram_node = dram_simulated_tokens
            dram_reason = (
                f"the DRAM the replay simulated ({dram_simulated_tokens:,} tokens per node); the "
                f"knee is {knee_tokens:,} tokens, so more DRAM would still add hits up to it"
            )
    need = max(2.0 * break_even_short_gbps, replay_pool_read_gbps_per_node)
    nic = pick_nic(need, network_tiers)
    chunk, chunk_reason = choose_block_size(granularity, engine_block)
    router, router_reason = choose_router(same_session_share, sessions_known, cluster.router)
    eviction, eviction_reason = choose_eviction(policy_at_knee)
    return Sizing(
        pool=pool,
        pool_capacity_tokens=int(pool_tokens),
        dram_per_node_tokens=int(dram_node),
        dram_reason=dram_reason,
        hbm_cache_per_instance_tokens=int(cluster.hbm_cache_tokens_per_instance),
        bytes_per_token=int(cluster.bytes_per_token),
        network_per_node_gbps=float(need),
        nic=nic,
        block_size_tokens=engine_block,
        chunk_size_tokens=max(chunk, engine_block),
        block_size_reason=chunk_reason,
        router=router,
        router_reason=router_reason,
        eviction=eviction,
        eviction_reason=eviction_reason,
        nodes=nodes,
        instances=cluster.instances,
        instances_per_node=cluster.instances_per_node,
        tp=max(1, cluster.tp),
    )


# -- per-unit sizes: what each product's setting holds, and how many hold it --------------


@dataclass(frozen=True, slots=True)
class UnitSize:
    """A sized total (the pool, or a node's DRAM tier) split among the processes that
    each allocate a part of it: ``bytes_per_unit * units`` gives the total back.

    ``granularity_bytes`` is the step the product's setting takes (1 for settings in
    bytes; 10^9 for SGLang's whole-GB ``--hicache-size``); ``written_bytes`` is the
    share rounded up to that step, the value the deployment files carry.
    """

    key: str
    product: str
    setting: str
    unit: str  # what allocates one share: "GPU rank", "vLLM instance", "SGLang server"
    units: int  # in the whole cluster
    units_per_node: int  # on a full node
    total: str  # "pool" | "node DRAM"
    total_bytes: int  # the whole cluster's total (node DRAM: per node x nodes)
    granularity_bytes: int = 1

    @property
    def bytes_per_unit(self) -> int:
        """The exact share, rounded up to a byte."""
        return -(-self.total_bytes // max(1, self.units))

    @property
    def written_bytes(self) -> int:
        g = max(1, self.granularity_bytes)
        return max(g, -(-self.bytes_per_unit // g) * g)

    @property
    def per_node_bytes(self) -> int:
        return self.written_bytes * self.units_per_node


def unit_sizes(sz: Sizing, mode: DeployOption) -> tuple[UnitSize, ...]:
    """Every product's per-process size for ``mode`` (pooled or local offload), each
    derived from the one sizing record so that the products cannot disagree.

    Who allocates what (checked against each product's source, see docs/products.md):

    * Mooncake Store under vLLM's MooncakeStoreConnector, embedded mode: each GPU rank
      contributes ``global_segment_size`` (vLLM docs: "per GPU"); in standalone-store
      mode one ``mooncake_client`` per node owns the segment and ranks contribute 0.
    * LMCache runs one engine per vLLM worker (GPU rank): ``max_local_cpu_size`` and
      the Mooncake ``global_segment_size`` in its ``extra_config`` are per rank.
    * SGLang HiCache: ``--hicache-size`` is each rank's host pool (GB of 10^9 bytes, an
      integer); the Mooncake L3 ``global_segment_size`` is per server, divided by
      ``tp * pp`` among its ranks.
    * vLLM's OffloadingConnector: ``cpu_bytes_to_use`` is the instance's total over its
      workers.
    * LMCache's local disk backend: ``max_local_disk_size`` (GiB) per engine, one per GPU
      rank (``lmcache/v1/storage_backend/local_disk_backend.py``: ``max_local_disk_size *
      1024**3`` bytes), beside its ``max_local_cpu_size``.
    * SGLang HiCache's file storage backend: each rank caps the files it owns at
      ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE`` bytes
      (``srt/mem_cache/storage/file/lru_file_evictor.py``).
    """
    nodes = max(1, sz.nodes)
    rpn, ipn = sz.ranks_per_node, sz.instances_per_node
    if mode == DeployOption.POOLED:
        pool = sz.pool_bytes
        return (
            UnitSize(
                "vllm-mooncake-embedded",
                "vLLM + Mooncake Store (embedded)",
                "global_segment_size",
                "GPU rank",
                sz.ranks,
                rpn,
                "pool",
                pool,
            ),
            UnitSize(
                "mooncake-standalone",
                "Mooncake Store (standalone-store owner)",
                "mooncake_client --global_segment_size",
                "node",
                nodes,
                1,
                "pool",
                pool,
            ),
            UnitSize(
                "lmcache-mooncake",
                "vLLM + LMCache (Mooncake remote)",
                "extra_config.global_segment_size",
                "GPU rank",
                sz.ranks,
                rpn,
                "pool",
                pool,
            ),
            UnitSize(
                "sglang-mooncake",
                "SGLang HiCache (Mooncake L3)",
                "global_segment_size",
                "SGLang server",
                sz.instances,
                ipn,
                "pool",
                pool,
            ),
        )
    if mode == DeployOption.LOCAL_OFFLOAD:
        dram = sz.dram_per_node_bytes
        return (
            UnitSize(
                "vllm-offloading",
                "vLLM OffloadingConnector",
                "cpu_bytes_to_use",
                "vLLM instance",
                ipn * nodes,
                ipn,
                "node DRAM",
                dram * nodes,
            ),
            UnitSize(
                "lmcache-cpu",
                "vLLM + LMCache (local CPU)",
                "max_local_cpu_size",
                "GPU rank",
                rpn * nodes,
                rpn,
                "node DRAM",
                dram * nodes,
            ),
            UnitSize(
                "sglang-hicache",
                "SGLang HiCache (host L2)",
                "--hicache-size",
                "GPU rank",
                rpn * nodes,
                rpn,
                "node DRAM",
                dram * nodes,
                granularity_bytes=GB,
            ),
        )
    if mode == DeployOption.LOCAL_OFFLOAD_NVME:
        dram = sz.dram_per_node_bytes
        nvme = sz.nvme_per_node_bytes
        return (
            UnitSize(
                "lmcache-cpu",
                "vLLM + LMCache (local CPU)",
                "max_local_cpu_size",
                "GPU rank",
                rpn * nodes,
                rpn,
                "node DRAM",
                dram * nodes,
            ),
            UnitSize(
                "lmcache-disk",
                "vLLM + LMCache (local disk)",
                "max_local_disk_size",
                "GPU rank",
                rpn * nodes,
                rpn,
                "node NVMe",
                nvme * nodes,
            ),
            UnitSize(
                "sglang-hicache",
                "SGLang HiCache (host L2)",
                "--hicache-size",
                "GPU rank",
                rpn * nodes,
                rpn,
                "node DRAM",
                dram * nodes,
                granularity_bytes=GB,
            ),
            UnitSize(
                "sglang-file",
                "SGLang HiCache (file storage)",
                "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE",
                "GPU rank",
                rpn * nodes,
                rpn,
                "node NVMe",
                nvme * nodes,
            ),
        )
    return ()
