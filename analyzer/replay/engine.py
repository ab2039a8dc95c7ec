"""The discrete-event replay of one scenario at one arrival rate.

Time comes from the trace (arrival offsets times the time scale), never from the
wall clock. Events are tuples ``(time, kind, seq, a, b)`` in one heap; the ordering key
``(time, kind, seq)`` is defined here and nowhere else:

- ``kind`` breaks ties at equal time: transfers end first (they free links and make
  requests ready), then transfers start, then GPU steps end (a finished request's
  blocks enter the caches), then arrivals (which look the caches up), so a request
  arriving at the instant another finishes sees its blocks;
- ``seq`` is a counter in creation order, so equal-time, equal-kind events run first
  come, first served and the payload is never compared.

Handlers take an event and return the events it causes.

A request's life:

1. **Arrival**: the router picks an instance. The longest cached prefix is found tier
   by tier (the instance's HBM, its host DRAM (its own share, or its node's shared DRAM
   when ``dram_shared_by_node``), its node's NVMe, the pool); each
   tier extends the prefix the tiers above it left, so the blocks each tier supplies
   are loaded over that tier's link. A hit never covers the last prompt token (it is
   recomputed to produce the first logits). Blocks read from a lower tier are touched
   there now; HBM blocks are touched when the request completes (queued requests do
   not pin their blocks: one evicted meanwhile still counts as a hit, and is inserted
   again on completion).
2. **Loads**: one transfer per tier over its link (see :mod:`analyzer.replay.links`),
   after that tier's first-byte latency. The request is ready when all have ended.
3. **Prefill**: ready requests wait in the instance's FIFO queue. The GPU runs
   chunked-prefill steps: each step takes up to ``chunk_tokens`` tokens from the head
   of the queue (whole requests, the last one possibly in part); a step lasts the
   cost model's fixed per-step overhead plus the sum of its compute time for each
   chunk given the context before it (so batching does not share weight reads: an
   overestimate for steps of many small chunks).
4. **Completion** (TTFT = end of its last step - arrival; decode is not modelled):
   the request's blocks are inserted in the instance's HBM cache, and written to the
   lower tiers: *write-through* writes the blocks a tier lacks to every lower tier at
   once (a tier is refreshed by reads and by writes that add blocks, not by a write
   of blocks it already holds); *on-evict* writes only what a tier evicts to the next tier down (cascading),
   together with any ancestors that tier lacks, so every tier stays prefix-closed.
   Written blocks are visible at once; the write occupies the write direction of the
   link. Without an HBM cache, writes are write-through.

A run can keep a :class:`Recording` of what it decided (each request's instance, hits
and loads, each completion's writes, the order of arrivals and completions), from which
:mod:`analyzer.replay.reprice` re-times the run for other link bandwidths or latencies.
"""

from __future__ import annotations

import gc
import heapq
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any

import numpy as np

from analyzer.cache.array_radix import ArrayRadix
from analyzer.cache.policies import get_policy
from analyzer.cache.radix import BlockCache, BlockRadix
from analyzer.progress import Advance
from analyzer.replay.links import Link
from analyzer.replay.routers import RouterContext, make_router
from analyzer.replay.state import (
    TIER_NAMES as TIER_NAMES,
)
from analyzer.replay.state import (
    Instance as Instance,
)
from analyzer.replay.state import (
    Plan as Plan,
)
from analyzer.replay.state import (
    Recording as Recording,
)
from analyzer.replay.state import (
    Req as Req,
)
from analyzer.replay.state import (
    RunStats as RunStats,
)
from analyzer.replay.state import (
    TierPlan as TierPlan,
)
from analyzer.replay.state import (
    _Tier as _Tier,
)
from analyzer.trace import BlockTrace

# Event kinds, in tie-breaking order at equal time (see the module docstring).
XFER_DONE = 0
XFER_START = 1
STEP_DONE = 2
ARRIVAL = 3


class Simulation:
    """The disaggregated prefill pool (module docstring); subclasses replay other ways
    of serving (:data:`SIMULATIONS`)."""

    # Whether an instance's HBM cache evicts to its own capacity (here); an aggregated
    # engine's pool also holds its running requests' KV, so it evicts by itself.
    hbm_bounded = True

    def __init__(
        self,
        trace: BlockTrace,
        plan: Plan,
        time_scale: float,
        slo_abort: tuple[float, int] | None = None,
        advance: Advance | None = None,
        record: bool = False,
        tree: TraceTree | None = None,
    ) -> None:
        tree = tree if tree is not None else TraceTree(trace)
        self.plan = plan
        self.rec = Recording() if record else None
        self._arrived = 0  # arrivals processed (for the recording's order)
        self._asked = self.rec.cached if self.rec is not None else []
        self.bs = trace.block_size
        self.bpb = plan.transfer_bytes_per_token * trace.block_size  # bytes moved per block
        self.n = trace.n_requests
        arr = trace.arrival_s
        self.times = ((arr - arr[0]) * time_scale).tolist() if self.n else []
        self.prompts = trace.prompt_tokens.tolist()
        self.sessions = trace.session.tolist()
        self.offsets = trace.offsets.tolist()
        self.block_ids = trace.block_ids
        self.warm = int(plan.warmup_fraction * self.n)
        self.slo_abort = slo_abort
        self.advance = advance
        self.seq = 0
        self._cb: Any = None  # the arriving request's blocks as the caches take them
        self.free = plan.free_loads
        self.chained = tree.chained
        self._parent = tree.parents if plan.write_policy == "on-evict" else None

        policy = get_policy(plan.eviction, flag="--eviction", replay=True).reference()

        # The compiled twin where it applies: the same answers, a probe a third cheaper;
        # its calls take each request's slice of the trace's block ids as it is.
        self.arrays = tree.chained and ArrayRadix.supports(policy)

        def cache(capacity_blocks: int | None) -> BlockCache:
            if self.arrays:
                return ArrayRadix(capacity_blocks, policy)
            return BlockRadix(capacity_blocks, policy, chained=tree.chained)

        window = plan.link_window_s
        self.links: list[Link] = []

        def link(name: str, kind: str, bps: float) -> Link:
            lk = Link(name, kind, bps, window, lazy=kind.endswith("-write"))
            self.links.append(lk)
            return lk

        n_nodes = -(-plan.instances // plan.instances_per_node)
        pool_tier = None
        node_tiers: list[list[_Tier]] = []
        node_pool: list[_Tier | None] = []
        shared_pool: tuple[Link, Link] | None = None
        if plan.pool is not None:
            pool_cache = cache(plan.pool.capacity_blocks)
            agg = plan.pool.aggregate_bytes_per_s
            if agg is not None and agg < n_nodes * plan.pool.read_bytes_per_s:
                shared_pool = (
                    link("net-read:pool", "net-read", agg),
                    link("net-write:pool", "net-write", agg),
                )
        for j in range(n_nodes):
            tiers = []
            if plan.nvme is not None:
                p = plan.nvme
                tiers.append(
                    _Tier(
                        2,
                        cache(p.capacity_blocks),
                        link(f"nvme-read:{j}", "nvme-read", p.read_bytes_per_s),
                        link(f"nvme-write:{j}", "nvme-write", p.write_bytes_per_s),
                        p.latency_s,
                    )
                )
            node_tiers.append(tiers)
            if plan.pool is not None:
                p = plan.pool
                read, write = shared_pool or (
                    link(f"net-read:{j}", "net-read", p.read_bytes_per_s),
                    link(f"net-write:{j}", "net-write", p.write_bytes_per_s),
                )
                pool_tier = _Tier(3, pool_cache, read, write, p.latency_s)
            node_pool.append(pool_tier)
        node_dram = [
            cache(plan.dram.capacity_blocks)
            if plan.dram is not None and plan.dram_shared_by_node
            else None
            for _ in range(n_nodes)
        ]
        self.instances: list[Instance] = []
        for i in range(plan.instances):
            j = i // plan.instances_per_node
            local_lower: list[_Tier] = []
            if plan.dram is not None:
                p = plan.dram
                shared = node_dram[j]
                local_lower.append(
                    _Tier(
                        1,
                        shared if shared is not None else cache(p.capacity_blocks),
                        link(f"pcie-read:{i}", "pcie-read", p.read_bytes_per_s),
                        link(f"pcie-write:{i}", "pcie-write", p.write_bytes_per_s),
                        p.latency_s,
                    )
                )
            local_lower.extend(node_tiers[j])
            lower = list(local_lower)
            if node_pool[j] is not None:
                lower.append(node_pool[j])  # type: ignore[arg-type]
            hbm_blocks = plan.local_capacity_blocks if self.hbm_bounded else None
            hbm = cache(hbm_blocks) if plan.local else None
            self.instances.append(Instance(i, j, hbm, lower))
        self.loads = [0] * plan.instances
        self.router = make_router(
            plan.router,
            RouterContext(plan.instances, trace.session_names, plan.prefix_aware_lambda),
        )
        self.track_dup = plan.local and plan.instances > 1
        self.dup_count: dict[int, int] = {}
        self.dup_blocks = 0
        self.dup_area = 0.0
        self.dup_last_t = 0.0
        # measured accumulators
        self.ttft = np.full(self.n - self.warm, np.nan)
        self.prompt_measured = 0
        self.hit_by_tier = [0, 0, 0, 0]
        self.loaded_by_tier = [0.0, 0.0, 0.0, 0.0]
        self.gpu_s = 0.0
        self.gpu_s_all = 0.0
        self.violations = 0
        self.aborted = False
        self.done_count = 0
        # The tenant that last stored or refreshed each block (-1: none yet), beside
        # the block arrays; kept only when the log names two tenants or more.
        tenant = trace.tenant
        many = tenant.size > 0 and np.unique(tenant[tenant >= 0]).size > 1
        self.tenants: list[int] = tenant.tolist() if many else []
        self.holder = np.full(trace.n_blocks if many else 0, -1, dtype=np.int32)
        self.cross_tokens = 0

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> RunStats:
        heap: list[tuple[Any, ...]] = []
        if self.n:
            heap.append((self.times[0], ARRIVAL, 0, 0, None))
        handlers = (self._on_xfer_done, self._on_xfer_start, self._on_step_done, self._on_arrival)
        pop = heapq.heappop
        push = heapq.heappush
        events = 0
        now = 0.0
        while heap:
            ev = pop(heap)
            now = ev[0]
            events += 1
            for e in handlers[ev[1]](ev):
                push(heap, e)
            if self.aborted:
                break
        # The writes, which schedule no events (links.py): those due by a stop, else
        # every one (the run lasts until the last of them ends).
        for lk in self.links:
            if lk.lazy and lk.backlog > 0.0:
                events += lk.settle(now if self.aborted else math.inf)
                if not self.aborted:
                    now = max(now, lk.last_end_t)
        if self.aborted:
            self._drop_in_flight()
        if self.advance is not None and self.done_count % 1024:
            self.advance(self.done_count % 1024)
        if self.track_dup:
            self._dup_tick(now)
        return RunStats(
            ttft_s=self.ttft,
            prompt_tokens=self.prompt_measured,
            hit_tokens_by_tier=self.hit_by_tier,
            loaded_bytes_by_tier=self.loaded_by_tier,
            gpu_s=self.gpu_s * self.plan.tp,
            gpu_s_all=self.gpu_s_all * self.plan.tp,
            links=self.links,
            duration_s=now,
            dup_blocks_end=self.dup_blocks,
            dup_block_s=self.dup_area,
            events=events,
            aborted=self.aborted,
            slo_violations=self.violations,
            hbm_blocks_end=sum(len(i.hbm) for i in self.instances if i.hbm is not None),
            recording=self._finish_recording(),
            cross_tenant_hit_tokens=self.cross_tokens,
        )

    def _finish_recording(self) -> Recording | None:
        rec = self.rec
        if rec is not None:
            rec.complete = not self.aborted
            if len(rec.write_at) == len(rec.order_k):  # the last completion's writes
                rec.write_at.append(len(rec.write_level))
        return rec

    def _drop_in_flight(self) -> None:
        """Forget the requests a stopped run left queued or in transfer: each holds its
        instance, which holds it back, a cycle that reference counting cannot free
        (and the collector is paused while the next run of the search goes on)."""
        for inst in self.instances:
            inst.queue.clear()
            inst.batch = None
        for lk in self.links:
            lk.drop()

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    # -- handlers ---------------------------------------------------------------------

    def _on_arrival(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        t = ev[0]
        k = ev[3]
        out: list[tuple[Any, ...]] = []
        if k + 1 < self.n:
            out.append((self.times[k + 1], ARRIVAL, self._next_seq(), k + 1, None))
        ids = self.block_ids[self.offsets[k] : self.offsets[k + 1]]
        blocks = ids.tolist()
        cb: Any = ids if self.arrays else blocks
        prompt = self.prompts[k]
        loads = self.loads
        rec = self.rec
        self._cb = cb  # what _cached looks up for the router
        if rec is None:
            i = self.router.pick(k, self.sessions[k], blocks, loads, self._cached)
        else:
            self._arrived = k + 1
            i = self.router.pick(k, self.sessions[k], blocks, loads, self._cached_kept)
            rec.picks.append(i)
            rec.cached_at.append(len(rec.cached))
        inst = self.instances[i]
        bs = self.bs
        cap = prompt - 1 if prompt > 0 else 0
        measured = k >= self.warm
        hit_by_tier = self.hit_by_tier
        m = 0
        transfers: list[tuple[_Tier, int]] = []
        if blocks:
            hbm = inst.hbm
            if hbm is not None:
                m = hbm.match(cb)
                if m and measured:
                    hit_by_tier[0] += min(m * bs, cap)
            for tier in inst.lower if m < len(blocks) else ():
                mt = tier.cache.match(cb)
                if mt > m:
                    tier.cache.touch_prefix(cb, mt, t)
                    n_bytes = (mt - m) * self.bpb
                    transfers.append((tier, n_bytes))
                    if measured:
                        hit_by_tier[tier.level] += min(mt * bs, cap) - min(m * bs, cap)
                        self.loaded_by_tier[tier.level] += n_bytes
                    m = mt
        hit = min(m * bs, cap)
        if m and self.tenants:
            self._held(k, m, hit if measured else -1)
        if rec is not None:
            rec.hits.append(hit)
            for tier, b in transfers:
                rec.load_level.append(inst.lower.index(tier))
                rec.load_bytes.append(float(b))
            rec.load_at.append(len(rec.load_level))
        new = prompt - hit if prompt > hit else 1
        r = Req(k, t, inst, blocks, hit, new, measured=measured, cb=cb)
        loads[i] += new
        if measured:
            self.prompt_measured += prompt
        if transfers:
            if self.free:
                for tier, n_bytes in transfers:
                    tier.read.record_instant(n_bytes)
            else:
                r.pending = len(transfers)
                for tier, n_bytes in transfers:
                    if tier.latency_s > 0:
                        out.append(
                            (
                                t + tier.latency_s,
                                XFER_START,
                                self._next_seq(),
                                tier.read,
                                (n_bytes, r),
                            )
                        )
                    else:
                        end = tier.read.add(t, n_bytes, r)
                        out.append((end, XFER_DONE, self._next_seq(), tier.read, tier.read.version))
                return out
        self._ready(r, t, out)
        return out

    def _on_xfer_start(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        lk: Link = ev[3]
        n_bytes, item = ev[4]
        end = lk.add(ev[0], n_bytes, item)
        return [(end, XFER_DONE, self._next_seq(), lk, lk.version)]

    def _on_xfer_done(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        lk: Link = ev[3]
        t = ev[0]
        res = lk.finish(t, ev[4])
        if res is None:
            return []
        done, nxt = res
        out: list[tuple[Any, ...]] = []
        if nxt is not None:
            out.append((nxt, XFER_DONE, self._next_seq(), lk, lk.version))
        for item in done:
            if item is not None:
                r: Req = item  # type: ignore[assignment]
                r.pending -= 1
                if r.pending == 0:
                    self._ready(r, t, out)
        return out

    def _on_step_done(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        t = ev[0]
        inst: Instance = ev[3]
        out: list[tuple[Any, ...]] = []
        loads = self.loads
        for r, take in inst.batch:  # type: ignore[union-attr]
            r.done += take
            loads[inst.idx] -= take
        inst.batch = None
        q = inst.queue
        while q and q[0].done >= q[0].new:
            self._complete(q.popleft(), t, out)
        if q:
            out.append(self._start_step(inst, t))
        return out

    # -- helpers ----------------------------------------------------------------------

    def _held(self, k: int, m: int, hit: int) -> None:
        """Request ``k`` uses its first ``m`` blocks: count the tokens of its ``hit``
        (-1: not measured) whose block another tenant last held, then hold them."""
        start = self.offsets[k]
        ids = self.block_ids[start : start + m]
        held = self.holder[ids]
        tenant = self.tenants[k]
        if hit >= 0 and tenant >= 0:
            other = (held >= 0) & (held != tenant)
            n = int(np.count_nonzero(other))
            if n:
                # the hit stops short of the prompt's last token: the last block's
                # uncounted tokens are not another tenant's hits either
                self.cross_tokens += n * self.bs - (m * self.bs - hit if other[-1] else 0)
        self.holder[ids] = tenant

    def _cached_kept(self, i: int, blocks: Sequence[int]) -> int:
        """:meth:`_cached`, its answer kept for the recording."""
        v = self._cached(i, blocks)
        self._asked.append(v)
        return v

    def _cached(self, i: int, blocks: Sequence[int]) -> int:
        """The prompt tokens instance ``i``'s HBM holds of the arriving request's
        ``blocks`` (looked up as :attr:`_cb`, the same ids as the caches take them)."""
        hbm = self.instances[i].hbm
        return hbm.match(self._cb) * self.bs if hbm is not None else 0

    def _ready(self, r: Req, t: float, out: list[tuple[Any, ...]]) -> None:
        inst = r.inst
        inst.queue.append(r)
        if inst.batch is None:
            out.append(self._start_step(inst, t))

    def _start_step(self, inst: Instance, t: float) -> tuple[Any, ...]:
        budget = self.plan.chunk_tokens
        prefill_s = self.plan.prefill_s
        batch = []
        overhead = self.plan.step_overhead_s
        dt = overhead
        for r in inst.queue:
            take = r.new - r.done
            if take > budget:
                take = budget
            s = prefill_s(take, r.hit + r.done)
            dt += s
            if r.measured:
                self.gpu_s += s
            batch.append((r, take))
            budget -= take
            if budget <= 0:
                break
        if overhead:  # shared equally by the requests of the step
            share = overhead / len(batch)
            self.gpu_s += share * sum(1 for r, _ in batch if r.measured)
        self.gpu_s_all += dt
        inst.batch = batch
        return (t + dt, STEP_DONE, self._next_seq(), inst, None)

    def _complete(self, r: Req, t: float, out: list[tuple[Any, ...]]) -> None:
        self.done_count += 1
        if self.advance is not None and self.done_count % 1024 == 0:
            self.advance(1024)
        if r.measured:
            ttft = t - r.arrival
            self.ttft[r.k - self.warm] = ttft
            if self.slo_abort is not None and ttft > self.slo_abort[0]:
                self.violations += 1
                if self.violations > self.slo_abort[1]:
                    self.aborted = True
        blocks = r.blocks
        cb = r.cb if r.cb is not None else blocks
        rec = self.rec
        if rec is not None:
            if rec.order_k:  # the previous completion's writes end here
                rec.write_at.append(len(rec.write_level))
            rec.order_k.append(r.k)
            rec.order_a.append(self._arrived)
        if not blocks:
            return
        if self.tenants:
            self._held(r.k, len(blocks), -1)
        inst = r.inst
        hbm = inst.hbm
        if hbm is not None:
            if self.track_dup:
                self._dup_tick(t)
                m0 = hbm.match(cb)
                cap = hbm.capacity_blocks
                top = len(blocks) if cap is None or cap > len(blocks) else cap
                cnt = self.dup_count
                for b in blocks[m0:top]:
                    c = cnt.get(b, 0)
                    cnt[b] = c + 1
                    if c:
                        self.dup_blocks += 1
            evicted = hbm.insert_ints(cb, t)
            if evicted and self.track_dup:
                cnt = self.dup_count
                for b in evicted:
                    c = cnt[b] - 1
                    if c:
                        cnt[b] = c
                        self.dup_blocks -= 1
                    else:
                        del cnt[b]
            if rec is not None and self.track_dup:
                rec.dup_blocks[r.k] = self.dup_blocks
            if self.plan.write_policy == "on-evict":
                if evicted:
                    self._spill(inst, 0, evicted, t, out)
                return
        for level, tier in enumerate(inst.lower):  # write-through
            cache = tier.cache
            mt, _ = cache.write(cb, t)
            if mt < len(blocks):
                cap = cache.capacity_blocks
                top = len(blocks) if cap is None or cap > len(blocks) else cap
                if top > mt:
                    self._write(tier.write, (top - mt) * self.bpb, t, out, level)

    def _spill(
        self, inst: Instance, level: int, evicted: list[int], t: float, out: list[Any]
    ) -> None:
        """On-evict: write blocks evicted from one tier into the next one down."""
        if level >= len(inst.lower):
            return
        tier = inst.lower[level]
        cache = tier.cache
        parent = self._parent
        assert parent is not None
        written = 0
        cap = cache.capacity_blocks
        for b in evicted:
            if b in cache:
                continue
            path = [b]
            p = parent[b]
            while p >= 0 and p not in cache:
                path.append(p)
                p = parent[p]
            missing = len(path)
            while p >= 0:  # the rest of the chain is cached: insert needs it from the root
                path.append(p)
                p = parent[p]
            path.reverse()
            if cap is not None and len(path) > cap:
                missing -= len(path) - cap
                if missing <= 0:
                    continue
            written += missing
            more = cache.insert(path, t)
            if more:
                self._spill(inst, level + 1, more, t, out)
        if written:
            self._write(tier.write, written * self.bpb, t, out, level)

    def _write(
        self, lk: Link, n_bytes: float, t: float, out: list[tuple[Any, ...]], level: int = -1
    ) -> None:
        """Write ``n_bytes`` over ``lk``, the write link of the completing request's tier
        at position ``level`` below HBM (kept by a recording)."""
        rec = self.rec
        if rec is not None:
            rec.write_level.append(level)
            rec.write_bytes.append(float(n_bytes))
        if self.free:
            lk.record_instant(n_bytes)
            return
        lk.add(t, n_bytes, None)  # a write link schedules no end events (links.py)

    def _dup_tick(self, t: float) -> None:
        self.dup_area += self.dup_blocks * (t - self.dup_last_t)
        self.dup_last_t = t


# How each ``Plan.serving`` is replayed (analyzer.replay.serving adds "aggregated").
SIMULATIONS: dict[str, type[Simulation]] = {"disaggregated": Simulation}


def _parent_array(trace: BlockTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense block id -> the block before it in a request holding it (-1 for a first
    block; the last request's, should they differ), with each access's position flags:
    (parent, first block of its request, position of each non-first access)."""
    parent = np.full(trace.n_blocks, -1, dtype=np.int64)
    ids = trace.block_ids
    starts = np.zeros(ids.size, dtype=bool)
    starts[trace.offsets[:-1][trace.offsets[:-1] < ids.size]] = True
    child = np.nonzero(~starts)[0]
    child = child[child > 0]
    parent[ids[child]] = ids[child - 1]
    return parent, starts, child


class TraceTree:
    """What a trace's block ids say about its prefix tree, worked out once per trace and
    shared by the simulations of it (a rate search runs ten): whether it is
    :func:`is_chained`, and each block's parent when a run writes on eviction."""

    def __init__(self, trace: BlockTrace) -> None:
        self._trace = trace
        self.chained = is_chained(trace)

    @cached_property
    def parents(self) -> list[int]:
        """Dense block id -> the block before it in any request holding it (-1 for a
        first block). Unique because block hashes are chained."""
        parent: list[int] = _parent_array(self._trace)[0].tolist()
        return parent


def is_chained(trace: BlockTrace) -> bool:
    """Whether every request's blocks are a path of one tree: each block has the same
    block before it wherever it appears, and a first block is never anything else.
    Hashes kvpool chains always are; a public trace's own block ids (Mooncake's
    ``hash_ids``) should be, and are checked, since the replay's caches are faster when
    they may rely on it (:class:`~analyzer.cache.radix.BlockRadix` ``chained``)."""
    ids = trace.block_ids
    if ids.size == 0:
        return True
    parent, starts, child = _parent_array(trace)
    return bool(
        np.array_equal(parent[ids[child]], ids[child - 1]) and (parent[ids[starts]] == -1).all()
    )


def simulate(
    trace: BlockTrace,
    plan: Plan,
    time_scale: float,
    slo_abort: tuple[float, int] | None = None,
    advance: Advance | None = None,
    record: bool = False,
    tree: TraceTree | None = None,
) -> RunStats:
    """Replay ``trace`` under ``plan`` with inter-arrival times scaled by ``time_scale``.

    ``slo_abort = (slo_s, allowed)`` stops the run as soon as more than ``allowed``
    measured requests exceed ``slo_s`` (used by the rate search). ``record``: keep the
    run's :class:`Recording` in ``RunStats.recording``. ``tree``: the trace's
    :class:`TraceTree`, when the caller replays it more than once."""
    with collector_paused():
        sim = SIMULATIONS[plan.serving](trace, plan, time_scale, slo_abort, advance, record, tree)
        return sim.run()


_GC_LOCK = threading.Lock()
_GC_HOLDERS = [0, False]  # simulations running, whether the collector was on before them


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a simulation runs, as it was after.

    A replay allocates a cache node per block it inserts (a hundred thousand per tier
    for the ``mixed`` sample) and keeps them: each generation-2 pass of the collector
    walks all of them again, which made half of a rate search's CPU time. The
    simulation frees what it drops by reference counting (a run stopped early, the rate
    search's, first forgets its queued requests, which hold their instance and are held
    by it: :meth:`Simulation._drop_in_flight`). Threads that simulate at
    once share one pause: the collector is back on when the last of them ends."""
    with _GC_LOCK:
        if _GC_HOLDERS[0] == 0:
            _GC_HOLDERS[1] = gc.isenabled()
            gc.disable()
        _GC_HOLDERS[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_HOLDERS[0] -= 1
            if _GC_HOLDERS[0] == 0 and _GC_HOLDERS[1]:
                gc.enable()
