"""The aggregated replay against published measurements (docs/validation.md, "The
replay"): each row's predicted figure within 1.5x of the measured one."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from analyzer.cache.radix import weighted_match_of
from analyzer.cost.catalog import get_gpu
from analyzer.replay import ClusterConfig, resolve
from analyzer.replay import engine as replay_engine
from analyzer.replay.capacity import batch_defaults, kv_pool_bytes_per_gpu
from analyzer.replay.config import select_scenarios
from analyzer.replay.engine import ARRIVAL, STEP_DONE, simulate
from analyzer.replay.jobs import DECODE, PREFILL, Engine, Job
from analyzer.replay.routers import ROUTERS, Router, RouterContext
from analyzer.replay.serving import (
    LLMD_PREFIX_WEIGHT,
    LLMD_QUEUE_WEIGHT,
    AggregatedSimulation,
)
from tests.helpers.replay import (
    inference_perf_shared_prefix,
    inference_perf_shared_prefix_stages,
    multiturn_trace,
)

# sgl-project/sglang pull request 27010 ("[HiCache] Fix PP inconsistency with HiCache
# L3"), bench_multiturn with 128 clients, 10 rounds, per-round cache hit rates: L1 (HBM
# only) and L2 (HiCache's host DRAM tier). Rounds 0 to 2 fit HBM; from round 3 on the
# clients' histories outgrow the 256K-token KV pool.
SGLANG_L1 = {3: 0.630580, 4: 0.363459, 5: 0.239976, 6: 0.146925, 7: 0.143266}
SGLANG_L2 = {3: 0.742857, 4: 0.795455}
# Rounds 8 and 9 of L1, where the measured run was queueing (mean TTFT 2.0 and 8.9 s):
# outside 1.5x, shown in docs/validation.md with these ratios and not claimed.
SGLANG_L1_MISSED = {8: (0.055469, 1.66), 9: (0.035112, 2.80)}
MAX_TOTAL_TOKENS = 256 * 1024  # --max-total-tokens of the PR's HiCache runs
HICACHE_RATIO = 2.0  # SGLang's default host pool: twice the device pool


class _PrefillFirst(AggregatedSimulation):
    """The aggregated engine under SGLang's order instead of vLLM's: a step is a prefill
    batch, without decode tokens, whenever a partial prefill is left or a waiting
    request fits; decode runs only when none does (SGLang's scheduler,
    ``get_next_batch_to_run`` in python/sglang/srt/managers/scheduler.py: "Run prefill
    first if possible", mixed chunked prefill off by default). The budget per prefill
    batch is the same token budget; admission is the engine's own (``_admit``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefill_only: set[int] = set()  # engines whose step in progress is a prefill batch

    def _next_step(
        self, e: Engine, t: float, out: list[tuple[Any, ...]], fitted: bool = False
    ) -> None:
        budget = self.mnbt
        chunks: list[tuple[Job, int]] = []
        for j in e.prefill:  # the chunked request goes first
            if budget <= 0:
                break
            take = min(j.tokens - j.hit - j.done, budget)
            chunks.append((j, take))
            budget -= take
        while budget > 0 and e.waiting and len(e.running) < self.max_seqs:
            j = e.waiting[0]
            if not self._admit(j, e, t, out):
                break
            e.waiting.popleft()
            if j.state == PREFILL:
                take = min(j.tokens - j.hit - j.done, budget)
                chunks.append((j, take))
                budget -= take
        if not chunks:  # nothing to prefill: decode (or preempt) as the engine does
            super()._next_step(e, t, out)
            return
        self._fit(e, t, out)
        pt = sum(take for _, take in chunks)
        pa = sum(take * (j.hit + j.done + take / 2.0) for j, take in chunks)
        dt = self.step_fn(self.c, float(pt), pa, 0.0, 0.0)
        self.step_gpu_s += dt
        self.gpu_s_all += dt
        e.step_dt = dt
        e.batch = chunks
        e.busy = True
        e.version += 1
        self.prefill_only.add(id(e))
        out.append((t + dt, STEP_DONE, self._next_seq(), e, e.version))

    def _on_step_done(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        e: Engine = ev[3]
        if ev[4] != e.version or e.batch is None or id(e) not in self.prefill_only:
            return super()._on_step_done(ev)
        t = ev[0]
        out: list[tuple[Any, ...]] = []
        batch, e.batch = e.batch, None
        self.prefill_only.discard(id(e))
        for j, take in batch:  # no decode token ran: the decoding requests stand still
            self._chunk_done(j, take, t, out)
        while e.dec and e.dec[0][0] <= e.steps:
            fin, _, j = heapq.heappop(e.dec)
            if j.state == DECODE and j.fin == fin:
                self._finish(j, t)
        e.busy = False
        self._fit(e, t, out)
        self._next_step(e, t, out)
        return out


def _per_round(
    dram: bool,
    seed: int = 1,
    gpu: str = "h100",
    prefill_first: bool = False,
    rate: float = 1.0,
    barrier: bool = False,
) -> tuple[dict[int, float], dict[int, float]]:
    """Each round's hit rate and mean TTFT (s) of the bench_multiturn replay at ``rate``
    requests/s, under vLLM's order or (``prefill_first``) SGLang's; ``barrier``: each
    round sent once the one before is answered (:func:`_round_barrier`)."""
    trace, rounds = multiturn_trace(seed=seed, rate=rate)
    cfg = ClusterConfig(
        model="qwen3-32b",
        gpu=gpu,
        tp=2,
        instances=1,
        warmup_fraction=0.0,
        serving="aggregated",
        local_capacity_tokens=MAX_TOTAL_TOKENS,
        dram_capacity_tokens=int(HICACHE_RATIO * MAX_TOTAL_TOKENS),
        connector="hicache",  # SGLang: a finished request's answer is not kept
    )
    spec = select_scenarios("local+dram" if dram else "local")[0]
    plan = resolve(cfg, spec, trace.block_size).plan
    engine: type[AggregatedSimulation] = _PrefillFirst if prefill_first else AggregatedSimulation
    if barrier:
        engine = _round_barrier(trace, rounds, engine)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(replay_engine.SIMULATIONS, "aggregated", engine)
        st = simulate(trace, plan, 1.0)
    assert st.hit_tokens is not None
    prompts = trace.prompt_tokens
    each = range(int(rounds.max()) + 1)
    hits = {r: float(st.hit_tokens[rounds == r].sum() / prompts[rounds == r].sum()) for r in each}
    return hits, {r: float(np.nanmean(st.ttft_s[rounds == r])) for r in each}


def _round_barrier(
    trace: Any, rounds: np.ndarray, base: type[AggregatedSimulation]
) -> type[AggregatedSimulation]:
    """``base`` behind bench_multiturn's ``--enable-round-barrier`` as the benchmark runs
    it: a round's requests are released once every request of the round before has been
    answered, then sent one per Poisson gap (benchmark/hicache/bench_multiturn.py,
    ``response_handler`` and ``request_sender``), where the trace sends them at fixed
    times whether the round before is done or not."""
    arrivals = np.asarray(trace.arrival_s, dtype=float)
    offset = np.empty_like(arrivals)
    for r in range(int(rounds.max()) + 1):
        each = np.flatnonzero(rounds == r)
        offset[each] = arrivals[each] - (arrivals[each[0] - 1] if each[0] else 0.0)
    return type(
        "_RoundBarrier",
        (_StagedLoadGenerator, base),
        {
            "stage": rounds.astype(np.int64),
            "offset_s": offset,
            "slots": 128,  # --max-parallel
            "interval_s": 0.0,
            "lead_s": 0.0,
        },
    )


def _per_round_hits(dram: bool) -> dict[int, float]:
    return _per_round(dram)[0]


@pytest.mark.parametrize(("dram", "measured"), [(False, SGLANG_L1), (True, SGLANG_L2)])
def test_sglang_multiturn_hit_rates_per_round(dram, measured):
    got = _per_round_hits(dram)
    for r, want in measured.items():
        assert 1 / 1.5 <= got[r] / want <= 1.5, (r, got[r], want)
    if not dram:  # the rounds docs/validation.md shows outside the band stay as shown
        for r, (want, ratio) in SGLANG_L1_MISSED.items():
            assert got[r] / want == pytest.approx(ratio, abs=0.05), (r, got[r], want)
    # the rounds that fit HBM are the whole previous prompt, as measured
    assert got[1] == pytest.approx(512 / 1088) and got[2] == pytest.approx(1088 / 1664)
    assert np.isclose(got[0], 0.0)


def _lru_oracle_hits(seed: int = 1, answer: int = 0, clients: int = 128) -> dict[int, float]:
    """bench_multiturn against an LRU cache of MAX_TOTAL_TOKENS, the obvious way: one
    request after another in the order multiturn_trace draws, each client's cached
    history a run of 64-token blocks from its start. A request hits what is left of its
    previous prompt and writes its prompt's misses and ``answer`` tokens of its answer,
    which stay cached after its prompt, never matched, until the client's next request
    (0: the answer is not kept, as the replay of SGLang behind HiCache does,
    analyzer/replay/serving.py). Room is made by taking whole blocks off the end of the
    least recently used other client's history."""
    rng = np.random.default_rng(seed)
    held = [0] * clients  # tokens of the client's last prompt and answer still cached
    last_use = [0] * clients
    used, now, out = 0, 0, {}
    for r in range(10):
        order = rng.permutation(clients)
        rng.exponential(1.0, clients)  # the trace's arrival gaps, drawn after the order
        prompt, previous = (r + 1) * 512 + r * 64, r * 512 + max(r - 1, 0) * 64
        hits = total = 0
        for c in order:
            now += 1
            hit = min(held[c], previous if r else 0)
            hits, total = hits + hit, total + prompt
            used -= held[c] - hit  # the old answer, which the new prompt does not match
            short = used + prompt - hit + answer - MAX_TOTAL_TOKENS  # tokens to evict
            while short > 0:
                k = min((last_use[k], k) for k in range(clients) if k != c and held[k])[1]
                gone = min(held[k], -(-short // 64) * 64)
                used, held[k], short = used - gone, held[k] - gone, short - gone
            used += prompt - hit + answer
            held[c], last_use[c] = prompt + answer, now
        out[r] = hits / total
    return out


@pytest.mark.slow
def test_the_replay_is_an_lru_oracle_in_every_round():
    """Round by round, the replay's hits are what a plain LRU cache of the same size
    keeps for the same requests in the same order, in three orders: the gap to the
    measurement in rounds 8 and 9 is not eviction."""
    for seed in (1, 2, 3):
        want = _lru_oracle_hits(seed)
        got = _per_round(dram=False, seed=seed)[0]
        for r in range(10):
            assert got[r] == pytest.approx(want[r], abs=0.005), (seed, r, got[r], want[r])


@pytest.mark.slow
def test_rounds_8_and_9_are_not_a_draw_of_the_benchmarks_orders():
    """The benchmark draws its clients' order at random each round. Over 1,000 orders
    (the oracle above, the replay's hits) the measured rounds 3 to 7 are typical draws,
    each between the 10th and 90th percentile, the median order 0.86-1.14x them; rounds 8 and 9
    lie below the 5th and the 1st, and no order has both as low. With each answer kept
    cached (the oracle's ``answer=64``) round 3 would be above 99% of orders instead,
    the measured run's cache holding only prompts, as the replay's of SGLang does
    (docs/validation.md)."""
    measured = {**SGLANG_L1, **{r: want for r, (want, _) in SGLANG_L1_MISSED.items()}}
    draws = np.array([[h[r] for r in measured] for h in map(_lru_oracle_hits, range(1, 1001))])
    below = {r: float(np.mean(draws[:, i] <= want)) for i, (r, want) in enumerate(measured.items())}
    median = dict(zip(measured, np.median(draws, axis=0), strict=True))
    for r, want in SGLANG_L1.items():
        assert 0.1 < below[r] < 0.9, (r, below[r])
        assert 0.85 < median[r] / want < 1.15, (r, median[r], want)
    assert below[8] < 0.05 and below[9] < 0.01, below
    assert not np.any((draws[:, -2] <= measured[8]) & (draws[:, -1] <= measured[9]))
    kept = np.array([_lru_oracle_hits(seed, answer=64)[3] for seed in range(1, 301)])
    assert np.mean(kept <= SGLANG_L1[3]) > 0.99


@pytest.mark.slow
def test_rounds_8_and_9_are_outside_the_band_in_every_arrival_order():
    """Rounds 8 and 9 count the few clients whose previous request is among the last
    ~45 the KV pool still holds, so they move with the clients' random order; in none
    of five orders do they come within 1.5x of the measurement, while rounds 3 to 7
    stay within it in all five (docs/validation.md)."""
    ratios: dict[int, list[float]] = {8: [], 9: []}
    for seed in range(1, 6):
        got = _per_round(dram=False, seed=seed)[0]
        for r, want in SGLANG_L1.items():
            assert 1 / 1.5 <= got[r] / want <= 1.5, (seed, r, got[r], want)
        for r, (want, _) in SGLANG_L1_MISSED.items():
            ratios[r].append(got[r] / want)
    assert min(ratios[8]) == pytest.approx(1.50, abs=0.01)
    assert max(ratios[8]) == pytest.approx(2.22, abs=0.01)
    assert min(ratios[9]) == pytest.approx(1.80, abs=0.01)
    assert max(ratios[9]) == pytest.approx(2.80, abs=0.01)
    assert min(ratios[9]) > 1.5


@pytest.mark.slow
def test_queueing_leaves_the_replayed_hit_rates_as_they_are():
    """The measured run was queueing in rounds 8 and 9 (mean TTFT 2.0 and 8.9 s). On
    A100s the replay queues too (seconds, not the H100's 0.4 s) and keeps the same hit
    rates: the engine decodes the running requests before admitting waiting ones (vLLM
    v1's order), so a queue holds no KV and the prefix cache keeps its size."""
    hits_h100, ttft_h100 = _per_round(dram=False)
    hits_a100, ttft_a100 = _per_round(dram=False, gpu="a100")
    assert ttft_h100[9] < 0.5 and ttft_a100[8] > 2.0 and ttft_a100[9] > 3.0
    for r in (8, 9):
        assert hits_a100[r] == pytest.approx(hits_h100[r], abs=0.002)


def test_sglang_prefill_first_order_leaves_the_hit_rates_as_they_are():
    """Run as SGLang orders its steps (a prefill batch whenever waiting requests fit,
    decode after), the replay keeps the same hits in every round, on A100s where it
    queues (seconds of TTFT by round 8) as on H100s: the requests a queue admits early
    pin their own prompts' blocks, the most recently used, which LRU would keep anyway.
    So SGLang's order does not explain rounds 8 and 9 (docs/validation.md)."""
    for gpu in ("h100", "a100"):
        vllm_hits, vllm_ttft = _per_round(dram=False, gpu=gpu)
        sglang_hits, sglang_ttft = _per_round(dram=False, gpu=gpu, prefill_first=True)
        for r in range(10):
            assert sglang_hits[r] == pytest.approx(vllm_hits[r], abs=0.002), (gpu, r)
        if gpu == "a100":  # it queues: the order had a queue to act on, and did
            assert sglang_ttft[8] > 2.0 and sglang_ttft[9] > 3.0
            assert sglang_ttft[9] > 1.05 * vllm_ttft[9]


@pytest.mark.slow
def test_the_round_barrier_leaves_the_hit_rates_as_they_are():
    """Each round sent only once the one before is done, as the benchmark's barrier
    does, keeps the replay's hits: at 1 req/s exactly, and at 16 req/s (the first rate
    of the benchmark's own sweep), where the H100 server queues for seconds by round 5,
    within a point in vLLM's order and SGLang's alike. Rounds 8 and 9 stay near 10%
    where 5.5% and 3.5% were measured (docs/validation.md)."""
    base = _per_round_hits(dram=False)
    hits, ttft = _per_round(dram=False, barrier=True)
    assert hits == pytest.approx(base, abs=0.002)
    for prefill_first in (False, True):
        hits, ttft = _per_round(dram=False, prefill_first=prefill_first, rate=16.0, barrier=True)
        assert ttft[5] > 3.0 and ttft[9] > 10.0, prefill_first  # it queues
        for r in (8, 9):
            assert hits[r] == pytest.approx(base[r], abs=0.01), (prefill_first, r)
            assert hits[r] / SGLANG_L1_MISSED[r][0] > 1.5


# llm-d/llm-d guides/precise-prefix-cache-routing/README.md, "Benchmarking Report" (commit
# 0aa9f337f3eaa2d415fbd1fa377f58558d767f74): Qwen3-32B on 8 vLLM servers of 2 H100s
# (TP2), inference-perf's shared-prefix workload from the guide's
# benchmark-templates/guide.yaml (150 groups of 5 prompts, a 6,000-token system prompt
# and a 1,200-token question, 1,000 output tokens, ignore_eos; Poisson stages with 30 s
# between them, a warm-up stage at 15 req/s for 50 s first). Mean TTFT (s) per rate,
# through llm-d's precise prefix-cache routing and through a Kubernetes Service that
# round-robins the same servers.
LLMD_STAGES = [(15, 50), (3, 20), (10, 20), (15, 20), (20, 38), (22, 34), (25, 30), (30, 25)]
LLMD_STAGES += [(35, 21), (40, 38), (43, 36), (46, 33), (49, 30), (52, 29), (55, 27), (57, 26)]
LLMD_STAGES += [(60, 25)]
LLMD_PRECISE = [0.155, 0.150, 0.155, 0.206, 0.152, 0.158, 0.155, 0.157]
LLMD_PRECISE += [0.494, 0.422, 0.257, 0.200, 0.208, 0.199, 0.211, 0.214]
LLMD_SERVICE = [0.415, 0.630, 0.881, 18.103, 20.171, 21.842, 24.597, 24.162]
LLMD_SERVICE += [68.673, 72.429, 70.084, 70.659, 74.326, 72.564, 72.329, 75.586]
# What the measured TTFT holds outside the servers (the client, the gateway, llm-d's
# router tokenizing the prompt): fitted on the precise curve's rate-3 row as the harness
# sends the ladder (0.155 s measured, 0.049 s replayed), the one row where the replayed
# servers are all but idle; every other row is held out.
LLMD_PATH_S = 0.11
# predicted / measured per rate (docs/validation.md); in band: precise 3-35, service
# 10 and 20
LLMD_PRECISE_RATIO = [1.14, 1.17, 1.10, 0.84, 1.14, 1.10, 1.14, 1.13]
LLMD_PRECISE_RATIO += [0.41, 14.6, 36.0, 101, 155, 128, 338, 334]
LLMD_SERVICE_RATIO = [17.8, 0.76, 0.59, 0.78, 1.98, 3.13, 4.20, 6.01]
LLMD_SERVICE_RATIO += [3.44, 5.09, 7.08, 8.83, 10.2, 12.2, 14.1, 15.3]


# ITL mean over the ladder (ms), the report's summary: precise 47.0, Service 44.0 (the
# Service replayed as round-robin or as kube-proxy's draw)
LLMD_ITL_MS = {"prefix-aware": 47.0, "precise": 47.0, "round-robin": 44.0, "kube-proxy": 44.0}
# output tokens/s per rate, the same table's: what the servers generate once saturated
LLMD_PRECISE_OUT = [1707, 4904, 6887, 11224, 11980, 12548, 13507, 13803]
LLMD_PRECISE_OUT += [15593, 15612, 15462, 15607, 15728, 15612, 15667, 15733]
LLMD_SERVICE_OUT = [1797, 4215, 5381, 6205, 5517, 5965, 5702, 5890]
LLMD_SERVICE_OUT += [6336, 6588, 6459, 6265, 6303, 6290, 6089, 6551]


# The harness's load settings (the guide's guide.yaml sets none, so inference-perf's
# defaults hold; kubernetes-sigs/inference-perf v0.4.0, the version the guide's harness
# image, llm-d/llm-d-benchmark v0.5.2, builds): ``num_workers`` is ``os.cpu_count()``,
# at least the 16 CPUs llm-d-benchmark's existing_stack/run_only.sh gives the harness
# pod (``HARNESS_CPU_NR=16``; the count is the node's, 112 in llm-d-benchmark's
# benchmark_report/br_v0_2_example.yaml), each holding ``worker_max_concurrency`` = 100
# requests (inference_perf/config.py): at least 1,600, more than any stage sends (1,548
# at 43 req/s). A stage starts once every request of the one before has finished, the
# load's ``interval`` (30 s) later (inference_perf/loadgen/load_generator.py).
LLMD_HARNESS_SLOTS = 16 * 100
LLMD_INTERVAL_S = 30.0
# the guide's kv-cache-utilization scorer weight (its router values file)
LLMD_KV_UTILIZATION_WEIGHT = 2.0


class _StagedLoadGenerator(AggregatedSimulation):
    """The aggregated engine behind inference-perf's multi-process load generator
    (v0.4.0, inference_perf/loadgen/load_generator.py): a stage's requests are due at
    their times from its start and sent by workers that hold at most ``slots``
    requests (one due while all are held waits, in order, for one to finish); TTFT
    counts from the send, as the client times it. A stage starts once every request of
    the stage before has finished, ``interval_s`` later and 1 s more (what the
    generator gives its workers to take up a stage's queue). ``stage`` and ``offset_s``
    (each request's stage, and its time from its stage's start) are set on a subclass;
    the last run stays in ``last``, with each request's send and finish times."""

    slots = LLMD_HARNESS_SLOTS
    interval_s = LLMD_INTERVAL_S
    lead_s = 1.0
    stage: np.ndarray = np.zeros(0, dtype=np.int64)
    offset_s: np.ndarray = np.zeros(0)
    last: _StagedLoadGenerator | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.of = self.stage.tolist()
        self.left = np.bincount(self.stage).tolist()  # each stage's requests not finished
        self.first = np.searchsorted(self.stage, np.arange(len(self.left))).tolist()
        # the first stage's times; a later stage's are set when it starts
        self.times = [self.lead_s + t for t in self.offset_s.tolist()]
        self.in_flight = 0
        self.held: deque[int] = deque()
        self.most_held = 0
        self.freed = 0
        self.starting: tuple[float, int] | None = None
        self.sent = np.full(self.n, np.nan)
        self.ended = np.full(self.n, np.nan)
        type(self).last = self

    def _on_arrival(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        t, k = ev[0], ev[3]
        out: list[tuple[Any, ...]] = []
        if k + 1 < self.n and self.of[k + 1] == self.of[k]:
            out.append((self.times[k + 1], ARRIVAL, self._next_seq(), k + 1, None))
        if self.in_flight >= self.slots:
            self.held.append(k)
            self.most_held = max(self.most_held, len(self.held))
        else:
            self._send(k, t, out)
        return out

    def _send(self, k: int, t: float, out: list[tuple[Any, ...]]) -> None:
        """What the engine does with an arrival (``_on_arrival``), at the send."""
        self.in_flight += 1
        self.sent[k] = t
        self._arrive(k, t, out)

    def _finish(self, j: Job, t: float) -> None:
        super()._finish(j, t)
        self.in_flight -= 1
        self.freed += 1
        self.ended[j.k] = t
        s = self.of[j.k]
        self.left[s] -= 1
        if self.left[s] == 0 and s + 1 < len(self.left):
            self.starting = (t + self.interval_s + self.lead_s, s + 1)

    def _on_step_done(self, ev: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        out = super()._on_step_done(ev)
        while self.freed and self.held:  # the workers answered send the next ones
            self.freed -= 1
            self._send(self.held.popleft(), ev[0], out)
        self.freed = 0
        if self.starting is not None:  # the stage before has finished: this one starts
            start, s = self.starting
            self.starting = None
            k0 = self.first[s]
            for k in range(k0, k0 + self.left[s]):
                self.times[k] = start + float(self.offset_s[k])
            out.append((self.times[k0], ARRIVAL, self._next_seq(), k0, None))
        return out


class _PreciseGuideProfile(_StagedLoadGenerator):
    """llm-d's router as the precise-prefix-cache-routing guide configures it
    (llm-d/llm-d guides/precise-prefix-cache-routing/router/
    precise-prefix-cache-routing.values.yaml; the report's README names the
    kv-cache-utilization and queue scorers beside the precise prefix scorer): kvpool's
    llm-d profile (3 x prefix + 2 x queue, analyzer/replay/serving.py ``_llmd``) plus
    the kv-cache-utilization scorer at weight 2, a server scored by the share of its KV
    pool its running requests leave free (vLLM's ``kv_cache_usage``: cached blocks no
    request holds count as free). The guide's no-hit-lru scorer, which spreads the
    requests no server holds a prefix of, is left out."""

    def _llmd(self, k: int, blocks: list[int]) -> int:
        engines = self.engines
        n = len(engines)
        queues = [len(e.waiting) for e in engines]
        q_lo, q_hi = min(queues), max(queues)
        span = q_hi - q_lo
        best = 0
        best_key: tuple[float, float, int] | None = None
        for i, e in enumerate(engines):
            prefix = weighted_match_of(*self.credit_tiers[i], blocks) / len(blocks)
            queue = (q_hi - queues[i]) / span if span else 1.0
            used = min(1.0, (self._held_blocks(e) * self.bs + e.priv) / self.capacity)
            score = LLMD_PREFIX_WEIGHT * prefix + LLMD_QUEUE_WEIGHT * queue
            score += LLMD_KV_UTILIZATION_WEIGHT * (1.0 - used)
            key = (-score, float(e.prefill_load + e.kv_dec), (i - k) % n)
            if best_key is None or key < best_key:
                best_key = key
                best = i
        return best


class _KubeProxy(Router):
    """A Kubernetes Service's choice of server: kube-proxy's default (iptables) mode
    picks one at random (kubernetes.io, "Virtual IPs and Service Proxies"). kube-proxy
    picks per connection and inference-perf keeps its connections open, so drawing
    per request, from a fixed seed, stands in for it."""

    def __init__(self, ctx: RouterContext) -> None:
        super().__init__(ctx)
        self.rng = np.random.default_rng(0)

    def pick(
        self,
        k: int,
        session: int,
        blocks: Sequence[int],
        loads: list[int],
        cached: Callable[[int, Sequence[int]], int],
    ) -> int:
        return int(self.rng.integers(self.ctx.instances))


def _llmd_plan(block_size: int, **kw: Any) -> Any:
    """The guide's deployment, resolved: Qwen3-32B on 8 vLLM servers of 2 H100s (TP2),
    prefill and decode in one batch, each with its HBM prefix cache; ``kw`` sets the
    rest of its ClusterConfig (the router, the KV pool, the memory setting)."""
    cfg = ClusterConfig(
        model="qwen3-32b",
        gpu="h100",
        tp=2,
        instances=8,
        warmup_fraction=0.0,
        serving="aggregated",
        **kw,
    )
    return resolve(cfg, select_scenarios("local")[0], block_size).plan


def _llmd_staged_replay(
    seed: int = 0, pool_tokens: int | None = None, only: tuple[str, ...] = ()
) -> dict[str, list[float]]:
    """The llm-d ladder as the harness sends it (:class:`_StagedLoadGenerator`),
    behind llm-d's router as the guide configures it (``precise``,
    :class:`_PreciseGuideProfile`) and as kvpool's ``prefix-aware`` router scores, and
    behind a Service (``kube-proxy``, :class:`_KubeProxy`) and strict ``round-robin``.
    Under each name: each ladder rate's mean TTFT (s, server side); under
    ``name + " p90"`` its p90 TTFT (numpy's percentile, server side); under
    ``name + " out"`` its output tokens/s as inference-perf counts a stage's (its
    requests' output over the time from its first send to its last finish); under
    ``" tpot"`` the mean TPOT over the ladder (ms), ``" held"`` the most requests the
    workers held back at once, ``" preemptions"`` the run's. ``pool_tokens``: each
    server's KV pool (default: the engine's, from the GPU memory it is given);
    ``only``: the names to run (default: all four)."""
    trace, stage, offset = inference_perf_shared_prefix_stages(
        LLMD_STAGES, 150, 5, 6000, 1200, 1000, seed=seed
    )
    ladder = range(1, len(LLMD_STAGES))
    out: dict[str, list[float]] = {}
    runs = (
        ("precise", "prefix-aware", _PreciseGuideProfile),
        ("prefix-aware", "prefix-aware", _StagedLoadGenerator),
        ("kube-proxy", "kube-proxy", _StagedLoadGenerator),
        ("round-robin", "round-robin", _StagedLoadGenerator),
    )
    for name, router, engine in runs:
        if only and name not in only:
            continue
        run = type("_Ladder", (engine,), {"stage": stage, "offset_s": offset})
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(replay_engine.SIMULATIONS, "aggregated", run)
            mp.setitem(ROUTERS, "kube-proxy", _KubeProxy)
            plan = _llmd_plan(trace.block_size, router=router, local_capacity_tokens=pool_tokens)
            st = simulate(trace, plan, 1.0)
        sim = run.last
        assert sim is not None and not np.isnan(sim.ended).any()  # every stage ran
        outs = np.asarray(sim.outs, dtype=float)
        out[name] = [float(np.nanmean(st.ttft_s[stage == k])) for k in ladder]
        out[name + " p90"] = [float(np.nanpercentile(st.ttft_s[stage == k], 90)) for k in ladder]
        out[name + " out"] = [
            float(outs[m].sum() / (sim.ended[m].max() - sim.sent[m].min()))
            for m in (stage == k for k in ladder)
        ]
        out[name + " tpot"] = [1000 * float(np.nanmean(st.tpot_s[stage > 0]))]
        out[name + " held"] = [float(sim.most_held)]
        out[name + " preemptions"] = [float(st.preemptions)]
    return out


def _llmd_replay() -> dict[str, list[float]]:
    """Each ladder rate's mean TTFT (s), server side, replayed behind llm-d's
    prefix-aware router and behind round-robin; under ``router + " tpot"`` the mean
    TPOT over the ladder (ms), under ``router + " out"`` the output tokens/s generated
    within each rate's stage (each request's tokens spread evenly from its first token
    to its last), under ``router + " preemptions"`` the run's preemptions."""
    trace, stage = inference_perf_shared_prefix(
        LLMD_STAGES, 150, 5, 6000, 1200, 1000, gap_s=30.0, seed=0
    )
    out = {}
    for router in ("prefix-aware", "round-robin"):
        plan = _llmd_plan(trace.block_size, router=router)
        assert plan.step is not None
        st = simulate(trace, plan, 1.0)
        # the ladder's rates, the warm-up stage left out as the report leaves it out
        out[router] = [float(np.nanmean(st.ttft_s[stage == k])) for k in range(1, len(LLMD_STAGES))]
        out[router + " tpot"] = [1000 * float(np.nanmean(st.tpot_s[stage > 0]))]
        out[router + " preemptions"] = [float(st.preemptions)]
        first = np.asarray(trace.arrival_s) + st.ttft_s - plan.step.request_overhead_s
        last = first + st.tpot_s * 999
        t0, rates_out = 0.0, []
        for _, duration in LLMD_STAGES:
            inside = np.minimum(last, t0 + duration) - np.maximum(first, t0)
            rates_out.append(
                float(np.clip(inside / (last - first), 0, None).sum()) * 1000 / duration
            )
            t0 += duration + 30.0
        out[router + " out"] = rates_out[1:]
    return out


@pytest.fixture(scope="module")
def llmd_replays() -> dict[str, list[float]]:
    """The llm-d ladder as kvpool replays a log: every request at the server when due."""
    return _llmd_replay()


@pytest.mark.slow
def test_llmd_ttft_by_rate_behind_precise_prefix_routing(llmd_replays):
    """The ladder replayed as a log, each stage at a fixed time: flat TTFT while the
    prefixes stay on their servers, within 1.5x up to 35 req/s; from 40 req/s the
    servers saturate and the replayed ones carry their queue from stage to stage, where
    the harness starts a stage only once the one before has drained and the measured
    TTFT holds 0.2-0.5 s to 60 req/s (the staged replay below; docs/validation.md)."""
    got = [t + LLMD_PATH_S for t in llmd_replays["prefix-aware"]]
    for k, (rate, _) in enumerate(LLMD_STAGES[1:]):
        ratio = got[k] / LLMD_PRECISE[k]
        assert ratio == pytest.approx(LLMD_PRECISE_RATIO[k], rel=0.1), (rate, ratio)
        assert (1 / 1.5 <= ratio <= 1.5) == (rate <= 35), (rate, ratio)


@pytest.mark.slow
def test_llmd_ttft_by_rate_behind_a_round_robin_service(llmd_replays):
    """The ladder replayed as a log: round-robin re-prefills the system prompts
    everywhere, and the replay collapses at 20 req/s as measured, but its queue then
    grows from stage to stage, where the harness lets each stage drain and the
    measured TTFT levels off near 20 s, then 70 s (docs/validation.md)."""
    got = [t + LLMD_PATH_S for t in llmd_replays["round-robin"]]
    rates = [rate for rate, _ in LLMD_STAGES[1:]]
    for k, rate in enumerate(rates):
        ratio = got[k] / LLMD_SERVICE[k]
        assert ratio == pytest.approx(LLMD_SERVICE_RATIO[k], rel=0.1), (rate, ratio)
        assert (1 / 1.5 <= ratio <= 1.5) == (rate in (10, 20)), (rate, ratio)

    # where each curve collapses (the rate from which every mean TTFT is over 1 s; the
    # replay's rate-3 stage still drains the warm-up): round-robin at 20 req/s in the
    # replay as measured; precise routing at 43 in the replay, not by 60 measured
    def collapse(ttft: list[float]) -> int | None:
        over = [r for k, r in enumerate(rates) if all(t > 1.0 for t in ttft[k:])]
        return over[0] if over else None

    assert collapse(LLMD_SERVICE) == 20 and collapse(LLMD_PRECISE) is None
    assert collapse(llmd_replays["round-robin"]) == 20
    assert collapse(llmd_replays["prefix-aware"]) == 43
    # the decode side: round-robin's TPOT as measured (1.03x); precise routing's 2.5x,
    # its replayed servers running all the KV pool holds past saturation, and preempting
    for router, ratio in (("round-robin", 1.03), ("prefix-aware", 2.44)):
        got_ms = llmd_replays[router + " tpot"][0]
        assert got_ms / LLMD_ITL_MS[router] == pytest.approx(ratio, rel=0.1), router
    assert llmd_replays["prefix-aware preemptions"][0] == pytest.approx(33_772, rel=0.1)


@pytest.mark.slow
def test_llmd_output_by_rate_behind_both_routers(llmd_replays):
    """What the servers generate per rate is within 1.5x of the measurement on every row
    but one (the Service's rate 3, where the replay still drains the warm-up's queue):
    the replayed servers saturate where the measured ones do, precise routing near
    15.6K tokens/s and round-robin near 6K, the replay 1.2-1.4x above them."""
    for router, measured in (("prefix-aware", LLMD_PRECISE_OUT), ("round-robin", LLMD_SERVICE_OUT)):
        ratios = [g / m for g, m in zip(llmd_replays[router + " out"], measured, strict=True)]
        first = 0 if router == "prefix-aware" else 1
        assert all(1 / 1.5 <= r <= 1.5 for r in ratios[first:]), (router, ratios)
        assert min(ratios[first:]) == pytest.approx(0.79, abs=0.03), router
        assert max(ratios[first:]) == pytest.approx(1.29 if first == 0 else 1.44, abs=0.03)
    service = llmd_replays["round-robin out"][0] / LLMD_SERVICE_OUT[0]
    assert service == pytest.approx(5.18, rel=0.1)


# predicted / measured per rate, the ladder sent as the harness sends it (seed 0;
# docs/validation.md): llm-d's router as the guide configures it, in band but for 40 and
# 43 req/s; kvpool's llm-d profile without the kv-cache-utilization scorer, outside at
# 40; the Service, in band on every row
LLMD_STAGED_PRECISE_RATIO = [1.03, 1.08, 1.10, 1.00, 1.11, 1.07, 1.10, 1.08]
LLMD_STAGED_PRECISE_RATIO += [0.39, 0.46, 0.75, 0.96, 0.93, 0.97, 0.92, 0.91]
LLMD_STAGED_PREFIX_AWARE_RATIO = [1.12, 1.16, 1.05, 0.97, 1.22, 1.16, 1.18, 1.16]
LLMD_STAGED_PREFIX_AWARE_RATIO += [1.54, 1.31, 0.89, 1.00, 0.96, 1.01, 0.95, 0.93]
LLMD_STAGED_SERVICE_RATIO = [1.13, 0.96, 0.94, 0.89, 0.84, 0.82, 0.87, 0.82]
LLMD_STAGED_SERVICE_RATIO += [0.91, 0.89, 0.91, 0.88, 0.89, 0.90, 0.89, 0.88]


def _collapse(ttft: list[float]) -> int | None:
    """The ladder rate from which every mean TTFT is over 1 s, None if there is none."""
    rates = [rate for rate, _ in LLMD_STAGES[1:]]
    over = [r for k, r in enumerate(rates) if all(t > 1.0 for t in ttft[k:])]
    return over[0] if over else None


@pytest.fixture(scope="module")
def llmd_staged() -> dict[str, list[float]]:
    """The llm-d ladder as the report's harness sends it."""
    return _llmd_staged_replay()


@pytest.mark.slow
def test_llmd_ttft_by_rate_as_the_harness_sends_the_ladder(llmd_staged):
    """Each stage starting once the one before has drained, the Service's TTFT levels
    off near 20 s for the stages of ~750 requests and near 65 s for those of ~1,500,
    as measured (16 of 16 rows within 1.5x), and behind llm-d's router as the guide
    configures it TTFT stays near 0.2 s to 60 req/s (14 of 16: at 40 and 43 req/s the
    measured mean is 0.4-0.5 s); the harness's workers never hold a request back."""
    rates = [rate for rate, _ in LLMD_STAGES[1:]]
    for name, measured, pinned, in_band in (
        ("precise", LLMD_PRECISE, LLMD_STAGED_PRECISE_RATIO, 14),
        ("prefix-aware", LLMD_PRECISE, LLMD_STAGED_PREFIX_AWARE_RATIO, 15),
        ("kube-proxy", LLMD_SERVICE, LLMD_STAGED_SERVICE_RATIO, 16),
    ):
        got = [t + LLMD_PATH_S for t in llmd_staged[name]]
        ratios = [g / m for g, m in zip(got, measured, strict=True)]
        for rate, ratio, want in zip(rates, ratios, pinned, strict=True):
            assert ratio == pytest.approx(want, rel=0.1), (name, rate, ratio)
        assert sum(1 / 1.5 <= r <= 1.5 for r in ratios) == in_band, name
        # at least 1,600 requests in hand, never all taken: no request waits to be sent
        assert llmd_staged[name + " held"] == [0.0]
    assert _collapse([t + LLMD_PATH_S for t in llmd_staged["kube-proxy"]]) == 20
    assert _collapse(LLMD_SERVICE) == 20
    assert _collapse(llmd_staged["precise"]) is None and _collapse(LLMD_PRECISE) is None
    # the decode side: the Service's TPOT as measured (0.97x); behind llm-d's router
    # 1.20x, its replayed servers preempting through the stages of 1,500 requests
    for name, ratio in (("kube-proxy", 0.97), ("precise", 1.20)):
        got_ms = llmd_staged[name + " tpot"][0]
        assert got_ms / LLMD_ITL_MS[name] == pytest.approx(ratio, rel=0.1), name
    assert llmd_staged["precise preemptions"][0] == pytest.approx(6_874, rel=0.2)
    # strict round-robin instead of kube-proxy's draw: the same but for 15 req/s (0.31),
    # where every request hits its whole prompt: each stage starts the prompts' order
    # again, and the stage before sent 200 requests, a multiple of the 8 servers, so
    # each prompt comes back to the server that answered it 30 s before
    got = [t + LLMD_PATH_S for t in llmd_staged["round-robin"]]
    ratios = [g / m for g, m in zip(got, LLMD_SERVICE, strict=True)]
    assert [r for r, x in zip(rates, ratios, strict=True) if not 1 / 1.5 <= x <= 1.5] == [15]
    assert ratios[rates.index(15)] == pytest.approx(0.31, rel=0.1)


# p90 TTFT (s) per rate, the same report's table (its last two columns): the statistic
# kvpool's SLO test decides on
LLMD_PRECISE_P90 = [0.187, 0.199, 0.225, 0.320, 0.191, 0.200, 0.193, 0.202]
LLMD_PRECISE_P90 += [0.272, 0.265, 0.273, 0.267, 0.279, 0.272, 0.293, 0.300]
LLMD_SERVICE_P90 = [0.522, 1.014, 1.593, 35.344, 39.436, 42.813, 46.036, 45.190]
LLMD_SERVICE_P90 += [126.238, 130.275, 129.810, 133.718, 134.981, 134.034, 135.023, 138.663]
# predicted / measured (seed 0; docs/validation.md), every row held out
LLMD_STAGED_PRECISE_P90_RATIO = [1.13, 1.06, 0.97, 0.83, 1.01, 0.98, 1.01, 0.97]
LLMD_STAGED_PRECISE_P90_RATIO += [0.89, 0.90, 0.87, 0.88, 0.86, 0.87, 0.82, 0.80]
LLMD_STAGED_SERVICE_P90_RATIO = [1.05, 0.86, 0.96, 0.95, 0.91, 0.88, 0.91, 0.88]
LLMD_STAGED_SERVICE_P90_RATIO += [0.94, 0.94, 0.95, 0.93, 0.94, 0.94, 0.94, 0.93]


@pytest.mark.slow
def test_llmd_p90_ttft_by_rate_as_the_harness_sends_the_ladder(llmd_staged):
    """The p90 TTFT per stage, the statistic kvpool sizes against: behind llm-d's router
    within 1.5x on all 16 rows, 40 and 43 req/s among them (the few requests that
    waited seconds there raise the measured mean over its own p90, not the p90), and
    20 req/s (0.32 s measured, its neighbours 0.19-0.23): the first stage to send the
    prompts the stages before it did not, whose KV the finished requests' generated
    blocks had pushed out of the servers' caches; behind the Service on all 16, through
    its collapse at 20 req/s."""
    rates = [rate for rate, _ in LLMD_STAGES[1:]]
    for name, measured, pinned, outside in (
        ("precise", LLMD_PRECISE_P90, LLMD_STAGED_PRECISE_P90_RATIO, []),
        ("kube-proxy", LLMD_SERVICE_P90, LLMD_STAGED_SERVICE_P90_RATIO, []),
    ):
        got = [t + LLMD_PATH_S for t in llmd_staged[name + " p90"]]
        ratios = [g / m for g, m in zip(got, measured, strict=True)]
        for rate, ratio, want in zip(rates, ratios, pinned, strict=True):
            assert ratio == pytest.approx(want, rel=0.1), (name, rate, ratio)
        assert [r for r, x in zip(rates, ratios, strict=True) if not 1 / 1.5 <= x <= 1.5] == outside
    # the rates where the mean misses (40, 43 req/s): the measured mean above its p90
    assert all(LLMD_PRECISE[rates.index(r)] > LLMD_PRECISE_P90[rates.index(r)] for r in (40, 43))


@pytest.mark.slow
def test_llmd_output_by_rate_as_the_harness_sends_the_ladder(llmd_staged):
    """Output tokens/s per stage, counted as inference-perf counts it (from the stage's
    first send to its last answer, so a saturated stage's drain counts), within 1.5x
    on all 32 rows: behind llm-d's router 0.88-1.06x, levelling off near 14.3K
    tokens/s where 15.6K were measured; the Service 0.95-1.15x."""
    for name, measured, lo, hi in (
        ("precise", LLMD_PRECISE_OUT, 0.88, 1.06),
        ("kube-proxy", LLMD_SERVICE_OUT, 0.95, 1.15),
    ):
        ratios = [g / m for g, m in zip(llmd_staged[name + " out"], measured, strict=True)]
        assert all(1 / 1.5 <= r <= 1.5 for r in ratios), (name, ratios)
        assert min(ratios) == pytest.approx(lo, abs=0.03), name
        assert max(ratios) == pytest.approx(hi, abs=0.03), name


# Each server's KV pool as the inference-perf report of this same ladder on the same
# deployment states it (its workload profile: "X-70R-6kSys - 8x307,328 KV", "KV/pod:
# 307,328"). kvpool's pool for Qwen3-32B on 2 H100s is 328,072 tokens at vLLM's default
# --gpu-memory-utilization (0.9) and 360,840 at the guide's manifests' 0.95.
LLMD_REPORTED_POOL_TOKENS = 307_328


@pytest.mark.slow
def test_llmd_tail_at_40_and_43_req_s_is_the_kv_pool_at_its_edge():
    """The measured mean TTFT at 40 and 43 req/s (0.494, 0.422 s) stands over its own
    p90 (0.272, 0.265 s): a few requests waited seconds in the first stages of ~1,500
    requests, and the tail is gone by 49 req/s. The replay shows that tail only where
    the servers' KV pool is within a few percent of what running requests need: with
    the pool the report gives (307,328 tokens) both stages have it (mean 0.94x and 0.85x,
    the p90 0.89x and 0.92x, the mean over the p90 as measured, seed 0) and every one of
    the 32 mean and p90 rows is within 1.5x; 2% more pool (313,000 tokens, or the
    engine's 328,072) and no request waits (0.44x and 0.47x; 0.39x and 0.46x); 1.4%
    less (303,000) and the tail is 2.5x and 2.1x. Where the pool is that close, the arrival draw moves the rows: seed 1
    gives 1.47x and 0.69x, seed 2 no tail (0.40x, 0.47x)."""
    rates = [rate for rate, _ in LLMD_STAGES[1:]]
    k40, k43, k49 = (rates.index(r) for r in (40, 43, 49))

    def ratios(pool: int | None, seed: int = 0) -> tuple[list[float], list[float]]:
        got = _llmd_staged_replay(seed, pool, only=("precise",))
        mean = [(t + LLMD_PATH_S) / m for t, m in zip(got["precise"], LLMD_PRECISE, strict=True)]
        p90 = [
            (t + LLMD_PATH_S) / m for t, m in zip(got["precise p90"], LLMD_PRECISE_P90, strict=True)
        ]
        return mean, p90

    mean, p90 = ratios(LLMD_REPORTED_POOL_TOKENS)
    assert [mean[k] for k in (k40, k43)] == pytest.approx([0.94, 0.85], rel=0.1)
    assert [p90[k] for k in (k40, k43)] == pytest.approx([0.89, 0.92], rel=0.1)
    # as measured: the mean over its p90 at 40 req/s, and gone by 49 req/s
    assert mean[k40] * LLMD_PRECISE[k40] > 1.5 * p90[k40] * LLMD_PRECISE_P90[k40]
    assert 1 / 1.5 <= mean[k49] <= 1.5
    assert all(1 / 1.5 <= x <= 1.5 for x in mean + p90)
    for pool, want in ((313_000, [0.44, 0.47]), (None, [0.39, 0.46]), (303_000, [2.51, 2.10])):
        mean, _ = ratios(pool)
        assert [mean[k] for k in (k40, k43)] == pytest.approx(want, rel=0.1), pool
    for seed, want in ((1, [1.47, 0.69]), (2, [0.40, 0.47])):
        mean, _ = ratios(LLMD_REPORTED_POOL_TOKENS, seed)
        assert [mean[k] for k in (k40, k43)] == pytest.approx(want, rel=0.1), seed


GIB = 2**30


@pytest.mark.parametrize(
    ("total_gib", "utilization", "weights_gib", "hidden", "profiled", "kv_gib", "fit"),
    [
        # vllm-project/vllm issue 10517: Llama-3.1-8B on an RTX 3090 (23.58 GiB), 0.90,
        # max_model_len 20,000 and 29,000 profiled at once: kv_cache_size 3.81 / 2.89 GiB
        (23.58, 0.90, 14.9888, 4096, 20_000, 3.81, "fitted"),
        (23.58, 0.90, 14.9888, 4096, 29_000, 2.89, "fitted"),
        # gpt-oss-20b on an A100 80GB (vLLM 0.19, the A100's 2,048-token default budget),
        # 0.65: model loading took 13.72 GiB, available KV cache memory 36.56 GiB
        # (myoceane.fr, "vLLM 部署地端模型系統訊息記錄 A100")
        (80.0, 0.65, 13.72, 2880, 2048, 36.56, "held out"),
    ],
)
def test_kv_pool_matches_published_capacity_lines(
    total_gib, utilization, weights_gib, hidden, profiled, kv_gib, fit
):
    got = kv_pool_bytes_per_gpu(total_gib * GIB, utilization, weights_gib * GIB, hidden, profiled)
    assert 1 / 1.5 <= got / (kv_gib * GIB) <= 1.5
    if fit == "fitted":  # what the constants were read off, within 5%
        assert got / (kv_gib * GIB) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize(("utilization", "ratio"), [(0.90, 1.07), (0.95, 1.17)])
def test_kv_pool_of_the_llmd_deployment_at_either_memory_setting(utilization, ratio):
    """A tensor-parallel line, held out: the inference-perf report of llm-d's ladder gives
    each Qwen3-32B server on 2 H100s 307,328 tokens of KV and not its memory setting;
    kvpool's pool is 1.07x that at vLLM's default 0.90 and 1.17x at the 0.95 the guide's
    manifests set (docs/validation.md)."""
    got = _llmd_plan(64, gpu_memory_utilization=utilization).hbm_capacity_tokens
    assert got / LLMD_REPORTED_POOL_TOKENS == pytest.approx(ratio, abs=0.005)


def test_kv_pool_in_tokens_is_what_vllm_logs():
    """vLLM logs the pool in tokens: 1,952 blocks of 16 (31,232 tokens) on the 3090 at
    20,000 profiled tokens; Llama-3.1-8B holds 131,072 bytes of KV a token."""
    got = kv_pool_bytes_per_gpu(23.58 * GIB, 0.90, 14.9888 * GIB, 4096, 20_000)
    assert 1 / 1.5 <= (got / 131_072) / 31_232 <= 1.5
    assert batch_defaults(get_gpu("h100")) == (8192, 1024)
    assert batch_defaults(get_gpu("a100")) == (2048, 256)
    assert batch_defaults(get_gpu("l40s")) == (2048, 256)
