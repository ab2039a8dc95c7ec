"""What a replay's simulation runs with, keeps and returns: the plan of a scenario
(:class:`Plan`, :class:`TierPlan`), the state of its requests and instances, the
decisions it records for re-pricing (:class:`Recording`) and its figures
(:class:`RunStats`). :mod:`analyzer.replay.engine` runs it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.cache.radix import BlockCache
from analyzer.replay.config import Connector, Tier
from analyzer.replay.links import Link
from analyzer.replay.steps import StepPricing

TIER_NAMES = tuple(Tier)  # nearest first: an index in this tuple is a tier's level


@dataclass(frozen=True, slots=True)
class TierPlan:
    """A tier below HBM, resolved to numbers."""

    capacity_blocks: int | None  # None = unbounded
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float
    # Pool only: the store's aggregate bandwidth (None: unlimited). When it is below
    # the nodes' links summed, it is the bottleneck, and every node's pool transfers
    # share one link of this bandwidth per direction instead of their own.
    aggregate_bytes_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything one simulation needs, resolved from the cluster, scenario and cost
    model (see :func:`analyzer.replay.run.resolve`)."""

    instances: int
    instances_per_node: int
    tp: int
    bytes_per_token: int  # stored KV bytes per token (capacities, duplicates)
    transfer_bytes_per_token: int  # bytes moved per token (all tp ranks, duplicates included)
    prefill_s: Callable[[int, int], float]  # (new tokens, cached tokens) -> compute seconds
    step_overhead_s: float  # fixed cost of one GPU step (scheduling, launch)
    chunk_tokens: int
    local: bool
    local_capacity_blocks: int | None
    dram: TierPlan | None  # one DRAM cache: an instance's (default) or its node's
    dram_shared_by_node: bool
    nvme: TierPlan | None
    pool: TierPlan | None
    router: str
    prefix_aware_lambda: float
    eviction: str
    write_policy: str
    free_loads: bool
    warmup_fraction: float
    link_window_s: float
    # How the instances serve (config.SERVING): "disaggregated" prefills alone (this
    # module's Simulation); "aggregated" runs prefill and decode in one continuous batch
    # (analyzer.replay.serving), with the fields below.
    serving: str = "disaggregated"
    step: StepPricing | None = None  # the step model pricing each forward pass
    max_num_batched_tokens: int = 8192  # tokens one step may take (decodes count one)
    max_num_seqs: int = 1024  # requests running at once per instance
    hbm_capacity_tokens: int | None = None  # the engine's whole KV pool per instance
    # A miniature replay's sampling rate: its prefix cache keeps this share of what the
    # pool has left beside the running requests' KV, which is not scaled (their number
    # per instance is the full replay's).
    cache_scale: float = 1.0
    # Loaded tokens -> seconds the engine spends scattering them into its paged KV after
    # the transfer (CostModel.hit_overhead_s); None: nothing.
    hit_overhead_s: Callable[[int], float] | None = None
    connector: Connector | None = None  # how KV moves below HBM (config.CONNECTORS)
    num_layers: int = 1  # a layer-wise load's prefill waits for its last layer at most


@dataclass(slots=True)
class Req:
    k: int
    arrival: float
    inst: Instance
    blocks: list[int]
    hit: int  # cached prompt tokens
    new: int  # tokens to prefill
    done: int = 0
    pending: int = 0  # loads in flight
    measured: bool = True
    cb: Any = None  # ``blocks`` as the caches take them (Job.cb), None: the list


@dataclass(slots=True)
class _Tier:
    level: int  # index in TIER_NAMES
    cache: BlockCache
    read: Link
    write: Link
    latency_s: float


@dataclass(slots=True)
class Instance:
    idx: int
    node: int
    hbm: BlockCache | None
    lower: list[_Tier]
    queue: deque[Req] = field(default_factory=deque)
    batch: list[tuple[Req, int]] | None = None


@dataclass(slots=True)
class Recording:
    """What one run decided, for re-timing it at other link bandwidths and latencies
    (:mod:`analyzer.replay.reprice`). Flat lists of numbers (no object per request, so
    the recording adds nothing for the garbage collector to walk). Per request, in
    trace order:

    - ``picks``: the instance the router chose; ``cached[cached_at[k]:cached_at[k+1]]``:
      the router's answers to ``cached(i, blocks)`` in call order (prefix-aware: each
      instance's HBM prefix);
    - ``hits``: cached prompt tokens; ``load_level[j], load_bytes[j]`` for ``j`` in
      ``load_at[k]:load_at[k+1]``: its loads, the tier as its position in the
      instance's tiers below HBM.

    Per completion, in the order they ran: ``order_k`` the request, ``order_a`` the
    arrivals processed before it (with the arrivals at fixed times, this is the whole
    order of the cache operations); its writes ``write_level[j], write_bytes[j]`` for
    ``j`` in ``write_at[c]:write_at[c+1]``; ``dup_blocks``: the duplicated HBM blocks
    after it (by request, when tracked). ``complete``: the run went to the end (a
    rate-search run stopped once its SLO was lost records only the requests it
    reached)."""

    picks: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    cached_at: list[int] = field(default_factory=lambda: [0])
    hits: list[int] = field(default_factory=list)
    load_level: list[int] = field(default_factory=list)
    load_bytes: list[float] = field(default_factory=list)
    load_at: list[int] = field(default_factory=lambda: [0])
    order_k: list[int] = field(default_factory=list)
    order_a: list[int] = field(default_factory=list)
    write_level: list[int] = field(default_factory=list)
    write_bytes: list[float] = field(default_factory=list)
    write_at: list[int] = field(default_factory=lambda: [0])
    dup_blocks: dict[int, int] = field(default_factory=dict)
    complete: bool = False


@dataclass(slots=True)
class RunStats:
    """Raw figures of one simulation (the caller turns them into metrics)."""

    ttft_s: np.ndarray  # measured requests, in trace order
    prompt_tokens: int  # measured
    hit_tokens_by_tier: list[int]  # measured, per TIER_NAMES
    loaded_bytes_by_tier: list[float]
    gpu_s: float  # prefill GPU-seconds of measured requests (instance-seconds * tp)
    gpu_s_all: float  # prefill GPU-seconds of every request (aggregated: steps' prefill share)
    links: list[Link]
    duration_s: float
    dup_blocks_end: int
    dup_block_s: float  # integral over time of duplicated blocks
    events: int
    aborted: bool
    slo_violations: int
    hbm_blocks_end: int
    recording: Recording | None = None
    # Measured hit tokens whose block another tenant's request last stored or refreshed
    # (both tenants known): the hits a pool shared across tenants serves from another
    # tenant's prompts. 0 when the log names fewer than two tenants.
    cross_tenant_hit_tokens: int = 0
    # Aggregated serving only (None / 0 otherwise): each measured request's time per
    # output token after the first (NaN for one-token answers), in trace order; the
    # GPU-seconds of every step (prefill and decode); running requests preempted
    # (recomputed) when their KV outgrew the pool; outputs whose length the log did not
    # give (drawn from jobs.DEFAULT_OUTPUT); what priced the steps.
    tpot_s: np.ndarray | None = None
    hit_tokens: np.ndarray | None = None  # each measured request's cached prompt tokens
    step_gpu_s: float = 0.0
    preemptions: int = 0
    outputs_drawn: int = 0
    step_source: str | None = None
