"""Aggregated serving: prefill and decode in one continuous batch per instance.

This is how vLLM and SGLang serve when prefill is not disaggregated. Each instance runs
one *step* (a forward pass) after another. A step takes one decode token from every
running request that has its first token, plus prefill chunks of the others, up to
``max_num_batched_tokens`` tokens and ``max_num_seqs`` running requests (vLLM's
``--max-num-batched-tokens`` / ``--max-num-seqs``, its scheduler's token budget; the
defaults are vLLM's own for an OpenAI server, ``EngineArgs.get_batch_defaults`` in
vllm/engine/arg_utils.py: 8,192 / 1,024 on GPUs of 70 GiB or more other than the A100,
2,048 / 256 below). A step lasts what the step model says for its counts
(:mod:`analyzer.replay.steps`).

**The scheduler**, at each step's end, as vLLM v1's (vllm/v1/core/sched/scheduler.py):
running requests first, in the order they were admitted (one decode token each, then
the rest of partial prefills while the budget lasts); then waiting requests, first come
first served, while the budget, ``max_num_seqs`` and the KV pool allow. Admitting a
request looks its prefix up: the HBM prefix cache first, then each lower tier (host
DRAM, NVMe, the pool), each extending what the tiers above left; a hit never covers the
last prompt token. Blocks found below HBM are loaded over their tier's link
(:mod:`analyzer.replay.links`) before the request is prefilled, as vLLM's KV connectors
load them asynchronously (the request waits, holding its blocks, while others run). The
step that finishes a request's prefill gives its first token: TTFT is that step's end
minus the arrival, plus the step model's fixed per-request overhead. It then decodes
one token per step until its output length; TPOT is the time from its first token to
its last over the tokens after the first.

**HBM, as the engines keep it.** The pool holds ``hbm_capacity_tokens`` of KV per
instance (what vLLM logs as its GPU KV cache size). Running requests hold their blocks:
the prompt's full blocks, once computed or loaded, are cached and *pinned* (shared by
every running request that matched them), and the rest (the prompt's tail, the tokens
not yet computed, every generated token) is private to the request. The prefix cache is
whatever is cached and not pinned: vLLM's free-block queue, SGLang's radix tree with
in-use nodes locked. Allocation evicts from it, least recently freed first (a block is
touched when the last request holding it finishes; blocks of one request are freed
tail first, as vLLM's ``free_blocks`` orders them), leaves only
(:class:`~analyzer.cache.radix.BlockRadix`). A request is admitted when the pinned and
private KV with its whole prompt fits the pool (SGLang's admission reserves the whole
input too); a step whose decode tokens no longer fit preempts the most recently admitted
running request, which frees its blocks (they stay cached, unpinned) and goes back to
the head of the queue to be recomputed, prompt and generated tokens together (vLLM's
recompute preemption). Generated tokens are not matched by later requests (a trace's
blocks are prompts only), but vLLM keeps a finished request's generated blocks cached,
evicted before its prompt's, where they take room (``_cache_generated``); SGLang behind
HiCache (``hicache``) keeps the prompt only, as the measured bench_multiturn rounds show
(docs/validation.md).

**Offload.** Blocks are written to the lower tiers as the plan's write policy says:
``write-through``: every block a tier lacks, when it is computed or loaded, at the end of
the step that computed it (vLLM's native offloading connector stores each step's newly
computed blocks, vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py;
LMCache stores on compute; SGLang HiCache ``write_through``); ``write-through-selective``:
a block is written when it is hit in HBM, its second use (HiCache's
``write_through_selective`` backs a node up once its hit count reaches 2,
python/sglang/srt/mem_cache/hiradix_cache.py); ``on-evict``: a block is written when
HBM evicts it (HiCache ``write_back``).

**Routing.** ``prefix-aware`` is llm-d's default scheduling profile (its inference
scheduler's prefix-cache scorer at weight 3 and queue scorer at weight 2, the highest
sum wins): the prefix score is the share of the prompt's blocks found in a row in the
instance's tiers, a block in HBM counting 1 and one in host DRAM 0.8 (llm-d's KV-cache
manager tags GPU blocks 1.0 and CPU blocks 0.8; NVMe, which it does not index, counts as
DRAM here); the queue score is the instance's waiting requests, min-max normalised (1
for the shortest queue). ``kv-router`` is NVIDIA Dynamo's KV router cost
(lib/kv-router/src/scheduling/selector.rs): the least
``max(queued prefill + prompt - credit, 0) * lambda + active decode KV`` wins, the
credit counting cached prompt tokens at 1 in HBM, 0.75 in host DRAM and 0.25 on disk
(Dynamo's ``overlap_score_credit``, ``host_cache_hit_weight``, ``disk_cache_hit_weight``
defaults). Neither credits the pool, which every instance reaches alike. Equal scores
go to the least loaded instance, then in turn. ``least-loaded`` counts queued prefill
and active decode tokens; the others are as in :mod:`analyzer.replay.routers`.

Between events an instance that only decodes advances by a compiled loop (the burst
kernel of :func:`analyzer.replay.steps.compiled`) up to the next request's last token; an
arrival or a finished load ends the run of decode steps at the step in progress.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

import numpy as np

from analyzer.cache.array_radix import ArrayRadix, CreditBoard
from analyzer.cache.radix import weighted_match_of
from analyzer.progress import Advance
from analyzer.replay.engine import (
    ARRIVAL,
    SIMULATIONS,
    STEP_DONE,
    XFER_DONE,
    XFER_START,
    Instance,
    Plan,
    RunStats,
    Simulation,
    TraceTree,
    _Tier,
)
from analyzer.replay.jobs import (
    DECODE,
    DONE,
    LOADING,
    PREFILL,
    WAITING,
    Engine,
    Job,
    output_lengths,
)
from analyzer.replay.links import Link
from analyzer.replay.steps import StepPricing, compiled
from analyzer.trace import BlockTrace

# What a block found in each tier (HBM, DRAM, NVMe, pool) is worth to the routers that
# score tiers (see the module docstring). The pool is every instance's alike.
LLMD_TIER_WEIGHTS = (1.0, 0.8, 0.8, 0.0)  # HBM, DRAM, NVMe, pool
LLMD_PREFIX_WEIGHT = 3.0
LLMD_QUEUE_WEIGHT = 2.0
DYNAMO_TIER_WEIGHTS = (1.0, 0.75, 0.25, 0.0)

# An engine's tiers as a router credits them: HBM and its weight, then the lower tiers
# a nonzero weight credits, with theirs (AggregatedSimulation._credit_tiers).
_Credit = tuple[Any, float, tuple[tuple[Any, float], ...]]

BURST_MAX = 4096  # decode steps computed at once (a longer run is continued after)


def _no_scatter(tokens: int) -> float:
    return 0.0


class AggregatedSimulation(Simulation):
    """The replay of ``plan`` with ``plan.serving == "aggregated"`` (module docstring)."""

    hbm_bounded = False

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
        # A recording (analyzer.replay.reprice) re-times a prefill pool's decisions; an
        # aggregated run's depend on every step's timing, so none is kept.
        super().__init__(trace, plan, time_scale, slo_abort, advance, False, tree)
        assert plan.step is not None and plan.hbm_capacity_tokens is not None
        self.pricing: StepPricing = plan.step
        self.c = plan.step.coefficients
        self.step_fn, self.burst_fn, self.mixed_fn = compiled(plan.step.step_seconds)
        self.overhead = plan.step.request_overhead_s
        self.capacity = plan.hbm_capacity_tokens
        self.scale = plan.cache_scale
        self.unscaled = self.scale == 1.0  # int(free * 1.0) is free: skip the float
        self.mnbt = plan.max_num_batched_tokens
        self.scatter_s = plan.hit_overhead_s or _no_scatter
        self.max_seqs = plan.max_num_seqs
        outs, self.drawn = output_lengths(trace)
        self.outs = outs.tolist()
        self.engines = [Engine(inst) for inst in self.instances]
        # The engines that may hold a block in a tier the tier-scoring routers credit,
        # by the first block of the prompts routed to their node: in a chained trace a
        # first block is never another's, and a credited tier (HBM, DRAM, NVMe: not the
        # pool) holds only the blocks of its own node's requests. Any other engine
        # credits a prompt nothing, with no lookup (_credited). None: every engine may.
        self.first_holders: dict[int, set[int]] | None = None
        if plan.router in ("prefix-aware", "kv-router") and self.chained:
            self.first_holders = {}
            node_engines: dict[int, list[int]] = {}
            for inst in self.instances:
                node_engines.setdefault(inst.node, []).append(inst.idx)
            self.node_engines = [node_engines[inst.node] for inst in self.instances]
        weights = DYNAMO_TIER_WEIGHTS if plan.router == "kv-router" else LLMD_TIER_WEIGHTS
        self.credit_tiers = self._credit_tiers(weights)
        # the compiled caches' credit, every engine a prompt's first block names in one
        # kernel call (the engines as arrays, by first block, beside first_holders)
        self.board = CreditBoard(self.credit_tiers) if self.arrays else None
        # the copies of each block across the instances' HBM (duplicated KV), by block id,
        # counted by the compiled caches' kernels (the other caches count in dup_count)
        self.dup_counts = (
            np.zeros(trace.n_blocks, dtype=np.int32) if self.arrays and self.track_dup else None
        )
        self.every_engine = np.arange(len(self.engines), dtype=np.int64)
        self.holder_ids: dict[int, np.ndarray] = {}
        conn = plan.connector
        # lower tiers store and return whole chunks of this many blocks
        self.chunk = max(1, conn.chunk_tokens // self.bs) if conn is not None else 1
        self.layerwise = conn is not None and conn.layerwise
        self.layer_share = 1.0 / max(1, plan.num_layers)
        # vLLM keeps a finished request's generated blocks cached (_cache_generated);
        # SGLang, behind HiCache, does not. Their ids follow the trace's blocks'.
        self.keeps_generated = conn is None or conn.name != "hicache"
        self.generated_from = self.next_generated = trace.n_blocks
        self.selective = plan.write_policy == "write-through-selective"
        self.on_evict = plan.write_policy == "on-evict"
        # a tier below HBM that several instances write (the pool, a node's DRAM)
        self.shared_lower = (
            plan.pool is not None
            or (plan.dram is not None and plan.dram_shared_by_node)
            or plan.nvme is not None
        )
        self.tpot = np.full(self.n - self.warm, np.nan)
        self.hits = np.zeros(self.n - self.warm, dtype=np.int64)
        self.step_gpu_s = 0.0
        self.preemptions = 0
        self.job_seq = 0

    def run(self) -> RunStats:
        st = super().run()
        st.tpot_s = self.tpot
        st.hit_tokens = self.hits
        st.step_gpu_s = self.step_gpu_s * self.plan.tp
        st.preemptions = self.preemptions
        st.outputs_drawn = self.drawn
        st.step_source = self.pricing.source
        return st

    def _drop_in_flight(self) -> None:
        for e in self.engines:
            e.waiting.clear()
            e.running.clear()
            e.prefill.clear()
            e.dec.clear()
            e.batch = None
        for lk in self.links:
            lk.drop()

    # -- handlers ---------------------------------------------------------------------

    def _on_arrival(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        t = ev[0]
        k = ev[3]
        out: list[tuple[Any, ...]] = []
        if k + 1 < self.n:
            out.append((self.times[k + 1], ARRIVAL, self._next_seq(), k + 1, None))
        self._arrive(k, t, out)
        return out

    def _arrive(self, k: int, t: float, out: list[tuple[Any, ...]]) -> None:
        """Request ``k`` reaches the router at ``t``: routed, and queued at its engine."""
        ids = self.block_ids[self.offsets[k] : self.offsets[k + 1]]
        blocks = ids.tolist()
        cb: Any = ids if self.arrays else blocks
        self._cb = cb
        prompt = self.prompts[k]
        self._sync_all(t, out)
        i = self._route(k, blocks, prompt)
        e = self.engines[i]
        j = Job(k, t, blocks, prompt, self.outs[k], k >= self.warm, e, cb=cb)
        if j.measured:
            self.prompt_measured += prompt
        e.prefill_load += prompt
        e.waiting.append(j)
        self._kick(e, t, out)

    def _on_xfer_start(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if ev[3] is None:  # a load's scatter into the paged KV has ended
            out: list[tuple[Any, ...]] = []
            self._load_ended(ev[4], ev[0], out)
            return out
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
                j: Job = item  # type: ignore[assignment]
                j.pending -= 1
                if j.pending == 0 and j.state == LOADING:
                    scatter = self.scatter_s((j.matched - j.pinned) * self.bs)
                    if scatter > 0:  # the engine writes the blocks into its paged KV
                        out.append((t + scatter, XFER_START, self._next_seq(), None, j))
                    else:
                        self._load_ended(j, t, out)
                elif j.pending == 0 and j.layerwise and j.state != WAITING:
                    self._layers_loaded(j, t, out)
        return out

    def _layers_loaded(self, j: Job, t: float, out: list[tuple[Any, ...]]) -> None:
        """A layer-wise load of ``j`` has ended at ``t``: its blocks are in HBM, and a
        step held for it ends once its last layer is computed."""
        e = j.eng
        assert e is not None
        j.layerwise = False
        self._sync(e, t, out)
        if j.matched > j.pinned:
            self._cache(j, e, j.matched, t)
        batch = e.batch
        if e.held and batch is not None and not any(x.layerwise for x, _ in batch):
            e.held = False
            end = t + e.step_dt * self.layer_share
            out.append((end, STEP_DONE, self._next_seq(), e, e.version))

    def _load_ended(self, j: Job, t: float, out: list[tuple[Any, ...]]) -> None:
        """``j``'s loads and their scatter have ended at ``t``."""
        e = j.eng
        assert e is not None
        self._sync(e, t, out)  # its cache as of t, then what was loaded
        self._loaded(j, t)
        self._kick(e, t, out)

    def _on_step_done(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        t = ev[0]
        e: Engine = ev[3]
        if ev[4] != e.version:
            return []  # a decode run cut short: its end moved
        out: list[tuple[Any, ...]] = []
        n = e.n_dec
        if e.batch is not None:
            batch = e.batch
            if any(j.layerwise for j, _ in batch):
                e.held = True  # a layer-wise load is still arriving (_layers_loaded)
                return out
            e.batch = None
            if n:
                e.steps += 1
                e.kv_dec += n
                e.priv += n
            for j, take in batch:
                self._chunk_done(j, take, t, out)
        else:
            s = e.burst_steps - e.burst_done
            e.burst = None
            if s > 1:  # each step before the last ended with the pool fitted, as events
                e.steps += s - 1
                e.kv_dec += n * (s - 1)
                e.priv += n * (s - 1)
                self._fit(e, t, out)
                s = 1
            e.steps += s
            e.kv_dec += n * s
            e.priv += n * s
        dec = e.dec
        while dec and dec[0][0] <= e.steps:
            fin, _, j = heapq.heappop(dec)
            if j.state == DECODE and j.fin == fin:
                self._finish(j, t)
        e.busy = False
        self._fit(e, t, out)
        self._next_step(e, t, out, fitted=True)
        return out

    # -- the scheduler ----------------------------------------------------------------

    def _kick(self, e: Engine, t: float, out: list[tuple[Any, ...]]) -> None:
        """Something new for ``e`` at ``t`` (an arrival, a finished load): an idle
        engine schedules now; a run of decode steps ends at the step in progress."""
        if not e.busy:
            self._next_step(e, t, out)
            return
        ends = e.burst
        if ends is None:
            return  # a mixed step: its end schedules the next
        # the step in progress (one ending exactly at t has ended: t joins the next, as
        # at a step's end event, which runs before arrivals at the same time)
        j = int(ends.searchsorted(t, side="right"))
        if j + 1 < e.burst_steps:
            self.step_gpu_s -= float(ends[e.burst_steps - 1] - ends[j])
            e.burst_steps = j + 1
            e.version += 1
            out.append((float(ends[j]), STEP_DONE, self._next_seq(), e, e.version))

    def _sync(self, e: Engine, t: float, out: list[tuple[Any, ...]]) -> None:
        """Bring a decode run's counts up to the steps ended by ``t`` (its schedule is
        unchanged): what a reader of ``e`` at ``t`` (the router, a shared tier's lookup)
        would have seen had each step been an event, evictions included."""
        ends = e.burst
        if ends is None:
            return
        k = e.burst_done
        if k >= e.burst_steps or ends[k] > t:
            return  # no step ended since the last sync (the usual case: an arrival)
        j = min(int(ends.searchsorted(t, side="right")), e.burst_steps)
        d = j - k
        if d > 0:
            n = e.n_dec
            e.burst_done = j
            e.steps += d
            e.kv_dec += n * d
            e.priv += n * d
            self._fit(e, t, out)

    def _sync_all(self, t: float, out: list[tuple[Any, ...]]) -> None:
        for e in self.engines:
            if e.burst is not None:
                self._sync(e, t, out)

    def _next_step(
        self, e: Engine, t: float, out: list[tuple[Any, ...]], fitted: bool = False
    ) -> None:
        """Schedule ``e``'s next step at ``t`` (it is free); ``fitted``: its cache was
        fitted at ``t`` and nothing changed since (a second fit would do nothing)."""
        # Every decoding request adds a token of KV this step: preempt until that fits
        # (vLLM admits nobody in a step that preempted).
        preempted = False
        while e.n_dec and self._held_blocks(e) * self.bs + e.priv + e.n_dec > self.capacity:
            if not self._preempt(e, t):
                break
            preempted = True
        budget = self.mnbt - e.n_dec
        chunks: list[tuple[Job, int]] = []
        for j in e.prefill:
            if budget <= 0:
                break
            take = min(j.tokens - j.hit - j.done, budget)
            chunks.append((j, take))
            budget -= take
        while not preempted and budget > 0 and e.waiting and len(e.running) < self.max_seqs:
            j = e.waiting[0]
            if not self._admit(j, e, t, out):
                break
            fitted = False
            e.waiting.popleft()
            if j.state == PREFILL:
                take = min(j.tokens - j.hit - j.done, budget)
                chunks.append((j, take))
                budget -= take
        if preempted and not chunks and not e.n_dec:
            # the step would be empty: the pool has room again, schedule as if anew
            self._next_step(e, t, out)
            return
        if not fitted or preempted:
            self._fit(e, t, out)
        if chunks:
            pt = 0
            pa = 0.0
            for j, take in chunks:
                pt += take
                pa += take * (j.hit + j.done + take / 2.0)
            dt, prefill = self.mixed_fn(self.c, float(pt), pa, float(e.n_dec), float(e.kv_dec))
            self._account(chunks, pt, prefill, dt)
            e.step_dt = dt
            e.batch = chunks
            e.busy = True
            e.version += 1
            out.append((t + dt, STEP_DONE, self._next_seq(), e, e.version))
            return
        if e.n_dec:
            dec = e.dec
            while dec and (dec[0][2].state != DECODE or dec[0][2].fin != dec[0][0]):
                heapq.heappop(dec)  # preempted since
            left = e.dec[0][0] - e.steps
            room = (self.capacity - self._held_blocks(e) * self.bs - e.priv) // e.n_dec
            steps = max(1, min(left, room, BURST_MAX))
            ends = self.burst_fn(self.c, float(e.n_dec), float(e.kv_dec), steps, t)
            self.step_gpu_s += float(ends[-1]) - t
            e.burst = ends
            e.burst_steps = steps
            e.burst_done = 0
            e.busy = True
            e.version += 1
            out.append((float(ends[-1]), STEP_DONE, self._next_seq(), e, e.version))

    @staticmethod
    def _held_blocks(e: Engine) -> int:
        """Blocks ``e``'s running requests hold in its HBM cache."""
        hbm = e.inst.hbm
        return hbm.n_held if hbm is not None else 0

    def _account(self, chunks: list[tuple[Job, int]], pt: int, prefill: float, dt: float) -> None:
        """GPU time of a mixed step of ``dt``: the prefill share (the step model's time
        for the chunks alone against the decode tokens alone: ``prefill``, from
        ``compiled``'s mixed kernel) goes to the chunks by tokens; it is the prefill work
        (``gpu_s_all``) that more instances share out, where decode steps batch more
        requests instead."""
        self.step_gpu_s += dt
        self.gpu_s_all += prefill
        share = prefill / pt
        for j, take in chunks:
            if j.measured:
                self.gpu_s += share * take

    # -- a request's life ---------------------------------------------------------------

    def _admit(self, j: Job, e: Engine, t: float, out: list[tuple[Any, ...]]) -> bool:
        """Look ``j``'s prefix up and reserve its KV; False (nothing changed) when the
        pool cannot hold it beside the running requests."""
        inst = e.inst
        bs = self.bs
        blocks = j.blocks
        cb = j.cb
        tokens = j.prompt + j.gen
        hbm = inst.hbm
        m = hbm.match(cb) if hbm is not None and blocks else 0
        held = hbm.n_held if hbm is not None else 0
        if m:
            assert hbm is not None
            held += hbm.unheld(cb, m)
        need = tokens - m * bs
        used = held * bs + e.priv + e.n_dec  # this step's decode tokens
        if e.running and used + need > self.capacity:
            return False
        cap = tokens - 1 if tokens > 0 else 0
        count = j.measured and not j.counted
        j.counted = True
        hit_by_tier = self.hit_by_tier
        if m:
            assert hbm is not None
            hbm.hold(cb, 0, m)
            if count:
                hit_by_tier[0] += min(m * bs, cap)
            if self.selective:  # a hit is a block's second use: HiCache backs it up now
                self._store(j, inst, m, t, out)
        matched = m
        transfers: list[tuple[_Tier, int]] = []
        if self.on_evict and self.shared_lower and m < len(blocks):
            self._sync_all(t, out)  # other instances' evictions written down so far
        if m < len(blocks):
            g = self.chunk
            for tier in inst.lower:
                mt = tier.cache.match(cb)
                mt -= mt % g  # whole chunks only
                if mt > matched:
                    tier.cache.touch_prefix(cb, mt, t)
                    n_bytes = (mt - matched) * self.bpb
                    transfers.append((tier, n_bytes))
                    if count:
                        hit_by_tier[tier.level] += min(mt * bs, cap) - min(matched * bs, cap)
                        self.loaded_by_tier[tier.level] += n_bytes
                    matched = mt
        j.tokens = tokens
        j.hit = min(matched * bs, cap)
        if count:
            self.hits[j.k - self.warm] = j.hit
        if matched and self.tenants:
            self._held(j.k, matched, j.hit if count else -1)
        j.done = 0
        j.matched = matched
        j.pinned = m
        j.priv = need
        e.priv += need
        e.prefill_load -= j.hit
        e.running[j] = None
        if transfers and not self.free:
            # host-DRAM hits of a layer-wise connector load beside the prefill
            beside = self.layerwise and all(tier.level == 1 for tier, _ in transfers)
            j.state = PREFILL if beside else LOADING
            j.layerwise = beside
            j.pending = len(transfers)
            if beside:
                e.prefill.append(j)
            for tier, n_bytes in transfers:
                if tier.latency_s > 0:
                    out.append(
                        (t + tier.latency_s, XFER_START, self._next_seq(), tier.read, (n_bytes, j))
                    )
                else:
                    end = tier.read.add(t, n_bytes, j)
                    out.append((end, XFER_DONE, self._next_seq(), tier.read, tier.read.version))
            return True
        for tier, n_bytes in transfers:
            tier.read.record_instant(n_bytes)
        self._loaded(j, t)
        return True

    def _loaded(self, j: Job, t: float) -> None:
        """``j``'s prefix is in HBM (found there or loaded): cache what was loaded, and
        let it be prefilled."""
        e = j.eng
        assert e is not None
        if j.matched > j.pinned:
            self._cache(j, e, j.matched, t)
        j.state = PREFILL
        e.prefill.append(j)

    def _cache(self, j: Job, e: Engine, nb: int, t: float) -> None:
        """``j``'s first ``nb`` blocks are computed (or loaded): they enter the HBM cache,
        held by ``j`` (their KV moves from its private share to the cache)."""
        hbm = e.inst.hbm
        if hbm is None:
            return
        chain = j.cb[:nb]
        counts = self.dup_counts
        if counts is not None:  # the compiled caches: inserted, held and counted in one call
            self._dup_tick(t)
            self.dup_blocks += hbm.insert_held_counting(chain, j.pinned, t, counts)  # type: ignore[attr-defined]
        else:
            if self.track_dup:
                self._dup_tick(t)
                m0 = hbm.match(chain)
                cnt = self.dup_count
                for b in j.blocks[m0:nb]:
                    c = cnt.get(b, 0)
                    cnt[b] = c + 1
                    if c:
                        self.dup_blocks += 1
            hbm.insert_held(chain, j.pinned, t)
        moved = (nb - j.pinned) * self.bs
        j.priv -= moved
        e.priv -= moved
        j.pinned = nb

    def _chunk_done(self, j: Job, take: int, t: float, out: list[tuple[Any, ...]]) -> None:
        e = j.eng
        assert e is not None
        j.done += take
        e.prefill_load -= take
        computed = j.hit + j.done
        nb = min(len(j.blocks), computed // self.bs)
        if nb and self.tenants:  # computed: its blocks are stored
            self._held(j.k, nb, -1)
        if nb > j.pinned:
            self._cache(j, e, nb, t)
        if not self.selective and not self.on_evict and e.inst.lower:
            self._store(j, e.inst, nb, t, out)
        if computed < j.tokens:
            return
        e.prefill.remove(j)
        j.gen += 1
        if j.first_t < 0:
            j.first_t = t
            self.done_count += 1
            if self.advance is not None and self.done_count % 1024 == 0:
                self.advance(1024)
            if j.measured:
                ttft = t - j.arrival + self.overhead
                self.ttft[j.k - self.warm] = ttft
                if self.slo_abort is not None and ttft > self.slo_abort[0]:
                    self.violations += 1
                    if self.violations > self.slo_abort[1]:
                        self.aborted = True
        if j.gen >= j.out:
            self._finish(j, t)
            return
        j.state = DECODE
        j.dec_step = e.steps
        j.fin = e.steps + (j.out - j.gen)
        e.n_dec += 1
        e.kv_dec += j.prompt + j.gen
        self.job_seq += 1
        heapq.heappush(e.dec, (j.fin, self.job_seq, j))

    def _release(self, j: Job, e: Engine, t: float) -> None:
        """``j`` gives back its KV: its cached blocks stay cached, now unpinned unless
        another running request holds them, and count as used at ``t``."""
        del e.running[j]
        if j.state == DECODE:
            grown = e.steps - j.dec_step
            e.n_dec -= 1
            e.kv_dec -= j.prompt + j.gen + grown
            e.priv -= j.priv + grown
            j.gen += grown
        else:
            e.priv -= j.priv
        j.priv = 0
        if j.pinned:
            hbm = e.inst.hbm
            assert hbm is not None
            hbm.release(j.cb, j.pinned, t)
            j.pinned = 0

    def _finish(self, j: Job, t: float) -> None:
        e = j.eng
        assert e is not None
        self._release(j, e, t)
        if self.keeps_generated:
            self._cache_generated(j, e, t)
        j.state = DONE
        if j.measured and j.out > 1:
            self.tpot[j.k - self.warm] = (t - j.first_t) / (j.out - 1)
        j.eng = None

    def _cache_generated(self, j: Job, e: Engine, t: float) -> None:
        """The full blocks of ``j``'s generated tokens (with its prompt's partial tail)
        stay in the prefix cache after it, as vLLM keeps them: it caches every full block
        up to the request's token count, generated ones too (``allocate_slots`` in
        vllm/v1/core/kv_cache_manager.py), and frees a request's blocks tail first, so
        they are evicted before its prompt's (``free``, same file). A trace's blocks are
        prompts, so no later request matches them: they take room. Cached only after a
        whole cached prompt (its blocks are their parents)."""
        hbm = e.inst.hbm
        nb = len(j.cb)
        n = (j.prompt + j.gen) // self.bs - nb
        if hbm is None or n <= 0 or hbm.match(j.cb) < nb:
            return
        first = self.next_generated
        self.next_generated = first + n
        if self.arrays:  # the compiled caches take the int64 array as it is
            chain = np.concatenate((j.cb, np.arange(first, first + n)))
            hbm.insert_ints(chain, t)  # type: ignore[arg-type]
        else:
            hbm.insert_ints([*j.cb, *range(first, first + n)], t)

    def _preempt(self, e: Engine, t: float) -> bool:
        """Preempt the most recently admitted running request that is not loading (it
        recomputes later); False when there is none."""
        for j in reversed(e.running):
            if j.state != LOADING and not j.pending:
                break
        else:
            return False
        left = 0
        if j.state == PREFILL:
            e.prefill.remove(j)
            left = j.tokens - j.hit - j.done
        self._release(j, e, t)
        # its prompt and generated tokens are prefilled again
        e.prefill_load += j.prompt + j.gen - left
        j.state = WAITING
        j.done = j.hit = j.matched = 0
        e.waiting.appendleft(j)
        self.preemptions += 1
        return True

    def _fit(self, e: Engine, t: float, out: list[tuple[Any, ...]]) -> None:
        """Evict unpinned cached blocks down to what the pool has left beside the
        running requests (a miniature's cache keeps ``cache_scale`` of it)."""
        hbm = e.inst.hbm
        if hbm is None:
            return
        pinned = hbm.n_held
        free = self.capacity - pinned * self.bs - e.priv
        if free < 0:
            free = 0
        allowed = (free if self.unscaled else int(free * self.scale)) // self.bs
        over = len(hbm) - pinned - allowed
        if over <= 0:
            return
        counts = self.dup_counts
        if counts is not None:  # the compiled caches: evicted and uncounted in one call
            gone, still = hbm.evict_unheld_counting(over, counts)  # type: ignore[attr-defined]
            if gone.size:
                self._dup_tick(t)
                self.dup_blocks -= still
                if self.on_evict:
                    self._spill(e.inst, 0, gone[gone < self.generated_from].tolist(), t, out)
            return
        evicted = [b for b in hbm.evict_unheld(over) if b < self.generated_from]
        if evicted and self.track_dup:
            self._dup_tick(t)
            cnt = self.dup_count
            for b in evicted:
                c = cnt[b] - 1
                if c:
                    cnt[b] = c
                    self.dup_blocks -= 1
                else:
                    del cnt[b]
        if evicted and self.on_evict:
            self._spill(e.inst, 0, evicted, t, out)

    def _store(self, j: Job, inst: Instance, nb: int, t: float, out: list[tuple[Any, ...]]) -> None:
        """Write ``j``'s first ``nb`` blocks, in whole chunks, to every lower tier that
        lacks some."""
        nb -= nb % self.chunk
        if nb <= j.stored:
            return
        chain = j.cb[:nb]
        lower = inst.lower
        first = lower[0].cache if lower else None
        if len(lower) == 2 and isinstance(first, ArrayRadix):  # DRAM and NVMe: one call
            matched: tuple[int, ...] = first.write_through_with(lower[1].cache, chain, t)  # type: ignore[arg-type]
        else:
            matched = tuple(tier.cache.write_through(chain, t) for tier in lower)
        for level, tier in enumerate(lower):
            cache = tier.cache
            mt = matched[level]
            if mt < nb:
                cap = cache.capacity_blocks
                top = nb if cap is None or cap > nb else cap
                if top > mt:
                    self._write(tier.write, (top - mt) * self.bpb, t, out, level)
        j.stored = nb

    # -- routing ----------------------------------------------------------------------

    def _route(self, k: int, blocks: list[int], prompt: int) -> int:
        """The engine request ``k`` goes to (and, for the tier-scoring routers, its
        node's engines noted as holders of its first block: _credited)."""
        i = self._pick(k, blocks, prompt)
        if self.first_holders is not None and blocks:
            b0 = blocks[0]
            held = self.first_holders.get(b0)
            if held is None:
                held = self.first_holders[b0] = set(self.node_engines[i])
            elif i not in held:
                held.update(self.node_engines[i])
            else:
                return i
            self.holder_ids[b0] = np.array(sorted(held), dtype=np.int64)
        return i

    def _pick(self, k: int, blocks: list[int], prompt: int) -> int:
        plan = self.plan
        engines = self.engines
        if plan.router == "prefix-aware" and blocks:
            return self._llmd(k, blocks)
        if plan.router == "kv-router" and blocks:
            return self._dynamo(blocks, prompt)
        loads = self.loads
        for i, e in enumerate(engines):
            loads[i] = e.prefill_load + e.kv_dec
        return self.router.pick(k, self.sessions[k], blocks, loads, self._cached)

    def _credit_tiers(self, weights: tuple[float, ...]) -> list[_Credit]:
        """Each engine's tiers as a router's credit reads them with ``weights``: its
        HBM cache and that weight, and the lower tiers' caches a nonzero weight credits,
        in order, with theirs."""
        return [
            (
                e.inst.hbm,
                weights[0],
                tuple((t.cache, weights[t.level]) for t in e.inst.lower if weights[t.level]),
            )
            for e in self.engines
        ]

    def _credited(self, b0: int) -> Iterable[int]:
        """The engines whose tiers may hold ``b0``, a prompt's first block (the others
        credit the prompt nothing)."""
        if self.first_holders is None:
            return range(len(self.engines))
        return self.first_holders.get(b0, ())

    def _credits(self, b0: int) -> Iterable[tuple[int, float]]:
        """Each engine of :meth:`_credited` and its tier credit for the prompt being
        routed (``self._cb``), as the router's weights score them."""
        board = self.board
        if board is None:
            tiers = self.credit_tiers
            cb = self._cb
            return ((i, weighted_match_of(*tiers[i], cb)) for i in self._credited(b0))
        if self.first_holders is None:
            ids = self.every_engine
        else:
            got = self.holder_ids.get(b0)
            if got is None:
                return ()
            ids = got
        return zip(ids.tolist(), board.credits(ids, self._cb).tolist(), strict=True)

    def _llmd(self, k: int, blocks: list[int]) -> int:
        """llm-d's default scheduling profile: 3 x prefix score + 2 x queue score, the
        highest wins; llm-d draws among equal scores at random, here the least loaded
        of them wins, then the next after ``k mod N`` (deterministic, and spread).

        Scored whole lists at a time: every engine's queue score, then the prefix score
        of the engines that may hold the prompt's first block (a replay of hundreds of
        instances routes each arrival among them)."""
        engines = self.engines
        n = len(engines)
        n_blocks = len(blocks)
        queues = [len(e.waiting) for e in engines]
        q_lo, q_hi = min(queues), max(queues)
        span = q_hi - q_lo
        qw = LLMD_QUEUE_WEIGHT
        scores = [qw * ((q_hi - q) / span) for q in queues] if span else [qw * 1.0] * n
        for i, credit in self._credits(blocks[0]):
            prefix = credit / n_blocks
            if prefix:
                scores[i] = LLMD_PREFIX_WEIGHT * prefix + scores[i]
        top = max(scores)
        ties = [i for i, s in enumerate(scores) if s == top]
        if len(ties) == 1:
            return ties[0]
        loads = [engines[i].prefill_load + engines[i].kv_dec for i in ties]
        least = min(loads)
        near = [i for i, x in zip(ties, loads, strict=True) if x == least]
        if len(near) == 1:
            return near[0]
        return min(near, key=lambda i: (i - k) % n)

    def _dynamo(self, blocks: list[int], prompt: int) -> int:
        """Dynamo's KV router cost (module docstring): the least wins (the first
        engine among equal costs)."""
        lam = self.plan.prefix_aware_lambda
        bs = self.bs
        engines = self.engines
        costs = [lam * max(e.prefill_load + prompt - 0.0, 0.0) + e.kv_dec for e in engines]
        for i, got in self._credits(blocks[0]):
            e = engines[i]
            credit = min(got * bs, float(prompt))
            if credit:
                costs[i] = lam * max(e.prefill_load + prompt - credit, 0.0) + e.kv_dec
        return costs.index(min(costs))


SIMULATIONS["aggregated"] = AggregatedSimulation
