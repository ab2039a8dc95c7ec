"""Test helpers for the replay tests: tiny traces, an analytic cost model, and oracles
written the obvious, slow way."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pyarrow as pa

from analyzer.trace import CANONICAL_SCHEMA, BlockTrace, trace_metadata


class AnalyticCost:
    """Stands in for CostModel where a test needs timing it can recompute by hand.

    ``prefill_time_s`` is linear plus a causal-attention term, so splitting a prefill
    into chunks does not change its total (sum over chunks of ``c + s/2`` times ``s``
    equals that of the whole).
    """

    def __init__(self, bytes_per_token: int = 1000, hbm_tokens: int = 10**6) -> None:
        self.bytes_per_token = bytes_per_token
        self._hbm = hbm_tokens

    overhead_s = 0.0

    def compute_time_s(self, new_tokens: int, cached_tokens: int) -> float:
        return 1e-4 * new_tokens + 1e-9 * new_tokens * (cached_tokens + new_tokens / 2)

    def prefill_time_s(self, new_tokens: int, cached_tokens: int) -> float:
        return self.compute_time_s(new_tokens, cached_tokens) + self.overhead_s

    def hbm_kv_capacity_tokens(self, reserve_fraction: float = 0.1) -> int:
        return self._hbm


def build_trace(
    blocks: list[list[int]],
    block_size: int = 4,
    arrivals: list[float] | None = None,
    prompts: list[int] | None = None,
    sessions: list[str | None] | None = None,
    outputs: list[int | None] | None = None,
    tenants: list[str | None] | None = None,
) -> BlockTrace:
    """A BlockTrace from per-request block hash lists (chained by construction)."""
    n = len(blocks)
    outputs = outputs if outputs is not None else [10] * n
    arrivals = arrivals if arrivals is not None else [1000.0 * i for i in range(n)]
    prompts = prompts if prompts is not None else [len(b) * block_size + 1 for b in blocks]
    sessions = sessions if sessions is not None else [None] * n
    cols = {
        "request_id": [f"r{i}" for i in range(n)],
        "arrival_s": [float(a) for a in arrivals],
        "session_id": sessions,
        "tenant": tenants if tenants is not None else [None] * n,
        "model": [None] * n,
        "prompt_tokens": prompts,
        "output_tokens": outputs,
        "block_hashes": [[int(x) for x in b] for b in blocks],
        "content_hashes": [None] * n,
        "token_lcp_prev": [None] * n,
        "parent_request_id": [None] * n,
        "turn": [None] * n,
        "count_only": [False] * n,
        "approx_lengths": [False] * n,
        "cached_tokens": [None] * n,
        "engine_prompt_tokens": [None] * n,
        "user_id": [None] * n,
    }
    table = pa.table(cols, schema=CANONICAL_SCHEMA).replace_schema_metadata(
        trace_metadata(block_size=block_size)
    )
    return BlockTrace.from_table(table)


def chained_requests(spec: list[tuple[int, int, int]]) -> list[list[int]]:
    """Requests from ``(parent, keep, new)``: keep the first ``keep`` blocks of request
    ``parent % len(so_far)`` (when there is one) and add ``new`` fresh blocks."""
    out: list[list[int]] = []
    fresh = 0
    for parent, keep, new in spec:
        base = out[parent % len(out)][:keep] if out else []
        chain = list(base)
        for _ in range(new):
            chain.append(fresh)
            fresh += 1
        out.append(chain)
    return out


def load_mooncake(path: Path, limit: int | None = None, spaced: bool = False) -> BlockTrace:
    """The Mooncake JSONL, full 512-token blocks only (the canonical rule)."""
    rows = []
    with path.open() as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
            if limit is not None and len(rows) >= limit:
                break
    blocks = [r["hash_ids"][: r["input_length"] // 512] for r in rows]
    arrivals = (
        [1000.0 * i for i in range(len(rows))] if spaced else [r["timestamp"] / 1000 for r in rows]
    )
    return build_trace(
        blocks, block_size=512, arrivals=arrivals, prompts=[r["input_length"] for r in rows]
    )


# -- oracles ------------------------------------------------------------------------


def ceiling_oracle(trace: BlockTrace) -> float:
    """Unbounded cache, every earlier request visible: leading blocks seen before."""
    seen: set[int] = set()
    hit = total = 0
    for i in range(trace.n_requests):
        b = trace.blocks_of(i).tolist()
        p = int(trace.prompt_tokens[i])
        m = 0
        while m < len(b) and b[m] in seen:
            m += 1
        hit += min(m * trace.block_size, max(p - 1, 0))
        total += p
        seen.update(b)
    return hit / total


def lru_oracle(trace: BlockTrace, capacity_blocks: int) -> float:
    """A plain LRU over blocks, each request touched tail-first (block 0 last)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for i in range(trace.n_requests):
        b = trace.blocks_of(i).tolist()
        p = int(trace.prompt_tokens[i])
        m = 0
        while m < len(b) and b[m] in cache:
            m += 1
        hit += min(m * trace.block_size, max(p - 1, 0))
        total += p
        for x in reversed(b):
            cache[x] = None
            cache.move_to_end(x)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hit / total


def fluid_oracle(transfers: list[tuple[float, float]], bytes_per_s: float) -> list[float]:
    """End times of ``(start, bytes)`` transfers sharing one link equally, by stepping
    from one event to the next."""
    remaining = {k: b for k, (_, b) in enumerate(transfers)}
    started: set[int] = set()
    end = [0.0] * len(transfers)
    t = 0.0
    pending = sorted(range(len(transfers)), key=lambda k: (transfers[k][0], k))
    while len(started) < len(transfers) or remaining:
        active = [k for k in started if k in remaining]
        next_start = min((transfers[k][0] for k in pending), default=np.inf)
        if not active:
            t = next_start
        else:
            rate = bytes_per_s / len(active)
            first_end = t + min(remaining[k] for k in active) / rate
            step_to = min(first_end, next_start)
            for k in active:
                remaining[k] -= rate * (step_to - t)
            t = step_to
            for k in active:
                if remaining[k] <= 1e-9 * max(1.0, transfers[k][1]):
                    del remaining[k]
                    end[k] = t
        while pending and transfers[pending[0]][0] <= t:
            started.add(pending.pop(0))
        if not pending and not [k for k in started if k in remaining]:
            break
    return end


def single_instance_oracle(trace: BlockTrace, cost, chunk: int, cache: bool) -> list[float]:
    """TTFT of every request on one instance with free loads and an unbounded cache,
    by a plain loop over GPU steps (no event queue).

    Rules it restates: an idle GPU starts a step the moment a request arrives (with
    that request alone); a step takes up to ``chunk`` tokens from the head of the FIFO
    queue; requests arriving while a step runs, or exactly when it ends, wait for the
    next one; a request's hit is the prefix cached by requests completed at or before
    its arrival; its blocks are cached when its last chunk ends.
    """
    n = trace.n_requests
    arr = (trace.arrival_s - trace.arrival_s[0]).tolist()
    bs = trace.block_size
    completions: list[tuple[float, list[int]]] = []  # (time, blocks), in time order

    def hit_at(k: int) -> int:
        if not cache:
            return 0
        seen: set[int] = set()
        for t_done, blocks in completions:
            if t_done <= arr[k]:
                seen.update(blocks)
        b = trace.blocks_of(k).tolist()
        m = 0
        while m < len(b) and b[m] in seen:
            m += 1
        p = int(trace.prompt_tokens[k])
        return min(m * bs, max(p - 1, 0))

    ttft = [0.0] * n
    queue: list[list[int]] = []  # [k, hit, new, done]
    t = 0.0
    i = 0

    def admit(k: int) -> None:
        h = hit_at(k)
        p = int(trace.prompt_tokens[k])
        queue.append([k, h, max(p - h, 1), 0])

    while i < n or queue:
        if not queue:
            t = max(t, arr[i])
            admit(i)
            i += 1
        budget = chunk
        dt = cost.overhead_s
        batch = []
        for item in queue:
            take = min(item[2] - item[3], budget)
            dt += cost.compute_time_s(take, item[1] + item[3])
            batch.append((item, take))
            budget -= take
            if budget <= 0:
                break
        t += dt
        for item, take in batch:
            item[3] += take
        while queue and queue[0][3] >= queue[0][2]:
            k = queue.pop(0)[0]
            ttft[k] = t - arr[k]
            completions.append((t, trace.blocks_of(k).tolist()))
        while i < n and arr[i] < t:
            admit(i)
            i += 1
    return ttft


def shared_prefix_log(
    path: Path,
    n: int = 6000,
    groups: int = 450,
    prefix_blocks: int = 40,
    question_blocks: int = 1,
    output_tokens: int = 200,
    rate: float = 10.0,
    seed: int = 3,
) -> Path:
    """A shared-prefix workload as a Mooncake-format log (512-token blocks): ``groups``
    long shared prefixes (a system prompt or document of ``prefix_blocks`` blocks each),
    every request one of them, uniformly, plus a question of its own, Poisson arrivals at
    ``rate`` per second."""
    rng = np.random.default_rng(seed)
    fresh = groups * prefix_blocks
    t = 0.0
    with path.open("w") as fh:
        for _ in range(n):
            g = int(rng.integers(groups))
            ids = list(range(g * prefix_blocks, (g + 1) * prefix_blocks))
            ids += range(fresh, fresh + question_blocks)
            fresh += question_blocks
            t += float(rng.exponential(1 / rate))
            row = {
                "timestamp": int(t * 1000),
                "input_length": len(ids) * 512,
                "output_length": output_tokens,
                "hash_ids": ids,
            }
            fh.write(json.dumps(row) + "\n")
    return path


def multiturn_trace(
    clients: int = 128,
    rounds: int = 10,
    request_tokens: int = 512,
    output_tokens: int = 64,
    rate: float = 1.0,
    block_size: int = 64,
    seed: int = 1,
) -> tuple[BlockTrace, np.ndarray]:
    """SGLang's ``benchmark/hicache/bench_multiturn.py`` with ``--enable-round-barrier``
    as a trace, and each request's round: every client sends ``rounds`` requests, a round
    in random client order, Poisson arrivals at ``rate`` (at fixed times: the barrier's
    wait for the round before to be answered is the replay's to add, as
    tests/replay/test_replay_validation.py does); a client's prompt is its history
    (every earlier question and answer) plus a new ``request_tokens`` question. The answer
    is re-tokenized into the next prompt, so it is not matched (as the benchmark's hit
    rates show: each round's hits are the previous prompt)."""
    rng = np.random.default_rng(seed)
    history: list[list[int]] = [[] for _ in range(clients)]
    fresh = 0
    blocks, arrivals, prompts, rounds_of = [], [], [], []
    t = 0.0
    per_question = request_tokens // block_size
    for r in range(rounds):
        for c in rng.permutation(clients):
            h = history[c]
            if r:  # the previous answer
                h.extend(range(fresh, fresh + output_tokens // block_size))
                fresh += output_tokens // block_size
            h.extend(range(fresh, fresh + per_question))
            fresh += per_question
            t += float(rng.exponential(1 / rate))
            blocks.append(list(h))
            arrivals.append(t)
            prompts.append((r + 1) * request_tokens + r * output_tokens)
            rounds_of.append(r)
    trace = build_trace(
        blocks,
        block_size,
        arrivals=arrivals,
        prompts=prompts,
        outputs=[output_tokens] * len(blocks),
    )
    return trace, np.array(rounds_of)


def inference_perf_shared_prefix(
    stages: list[tuple[float, float]],
    groups: int,
    prompts_per_group: int,
    system_tokens: int,
    question_tokens: int,
    output_tokens: int,
    gap_s: float = 0.0,
    block_size: int = 64,
    seed: int = 0,
) -> tuple[BlockTrace, np.ndarray]:
    """kubernetes-sigs/inference-perf's ``shared_prefix`` workload under a ``poisson``
    load ladder as a trace, and each request's stage. The data generator
    (inference_perf/datagen/shared_prefix_datagen.py) makes ``groups`` system prompts
    of ``system_tokens`` and ``prompts_per_group`` questions of ``question_tokens`` for
    each, shuffles the prompts once and sends them in that order, over and over; every
    request asks for ``output_tokens`` (``ignore_eos``). The load generator runs the
    ``(rate, duration)`` stages in turn, Poisson arrivals at each rate, with ``gap_s``
    seconds between stages (its ``interval``). A system prompt is a run of blocks its
    group's prompts share; the block holding its end and the question is the
    prompt's own."""
    rng = np.random.default_rng(seed)
    prompts = _shared_prefix_prompts(
        groups, prompts_per_group, system_tokens, question_tokens, block_size
    )
    order = rng.permutation(len(prompts))
    blocks: list[list[int]] = []
    arrivals: list[float] = []
    stage_of: list[int] = []
    t = 0.0
    for s, (rate, duration) in enumerate(stages):
        end = t + duration
        t += float(rng.exponential(1 / rate))
        while t < end:
            blocks.append(prompts[order[len(blocks) % len(order)]])
            arrivals.append(t)
            stage_of.append(s)
            t += float(rng.exponential(1 / rate))
        t = end + gap_s
    n = len(blocks)
    prompt = system_tokens + question_tokens
    trace = build_trace(
        blocks, block_size, arrivals=arrivals, prompts=[prompt] * n, outputs=[output_tokens] * n
    )
    return trace, np.array(stage_of)


def _shared_prefix_prompts(
    groups: int, prompts_per_group: int, system_tokens: int, question_tokens: int, block_size: int
) -> list[list[int]]:
    """The ``shared_prefix`` prompts as block lists, group by group: a system prompt is
    a run of blocks its group's prompts share; the block holding its end and the
    question is the prompt's own."""
    shared = system_tokens // block_size
    own = (system_tokens + question_tokens) // block_size - shared
    prompts: list[list[int]] = []
    for g in range(groups):
        prefix = list(range(g * shared, (g + 1) * shared))
        for _ in range(prompts_per_group):
            start = groups * shared + len(prompts) * own
            prompts.append(prefix + list(range(start, start + own)))
    return prompts


def inference_perf_poisson_times(
    rate: float, duration: float, rng: np.random.Generator
) -> np.ndarray:
    """The send times, from the start of a stage, of inference-perf's ``poisson`` load
    (kubernetes-sigs/inference-perf v0.4.0, inference_perf/loadgen/load_timer.py,
    ``PoissonLoadTimer``): ``int(rate * duration)`` requests; each second holds a
    Poisson count of them (a second with none is skipped), spread over it by
    exponential gaps scaled to fill the second."""
    n = int(rate * duration)
    times: list[float] = []
    t = 0.0
    while len(times) < n:
        count = int(rng.poisson(rate))
        if count < 1:
            t += 1.0
            continue
        gaps = rng.exponential(1 / count, count)
        for gap in gaps * (1.0 / gaps.sum()):
            t += float(gap)
            times.append(t)
    return np.array(times[:n])


def inference_perf_shared_prefix_stages(
    stages: list[tuple[float, float]],
    groups: int,
    prompts_per_group: int,
    system_tokens: int,
    question_tokens: int,
    output_tokens: int,
    block_size: int = 64,
    seed: int = 0,
) -> tuple[BlockTrace, np.ndarray, np.ndarray]:
    """inference-perf's ``shared_prefix`` workload under a ``poisson`` load ladder,
    stage by stage as its multi-process load generator sends it (v0.4.0,
    inference_perf/loadgen/load_generator.py ``run_stage``): a trace, each request's
    stage, and its send time from its stage's start. Each stage sends
    ``int(rate * duration)`` requests on :func:`inference_perf_poisson_times` and
    starts its data generator again, so every stage begins with the first of the
    prompts as shuffled once (inference_perf/datagen/shared_prefix_datagen.py). The
    harness starts a stage only once the one before has finished every request (then
    waits its ``interval``), which depends on the servers: the trace lays the stages
    end to end, and a replay that times stages as the harness does moves them."""
    rng = np.random.default_rng(seed)
    prompts = _shared_prefix_prompts(
        groups, prompts_per_group, system_tokens, question_tokens, block_size
    )
    order = rng.permutation(len(prompts))
    blocks: list[list[int]] = []
    arrivals: list[float] = []
    stage_of: list[int] = []
    offsets: list[float] = []
    t0 = 0.0
    for s, (rate, duration) in enumerate(stages):
        times = inference_perf_poisson_times(rate, duration, rng)
        for i, t in enumerate(times.tolist()):
            blocks.append(prompts[order[i % len(order)]])
            arrivals.append(t0 + t)
            stage_of.append(s)
            offsets.append(t)
        t0 += float(times[-1]) if len(times) else 0.0
    n = len(blocks)
    prompt = system_tokens + question_tokens
    trace = build_trace(
        blocks, block_size, arrivals=arrivals, prompts=[prompt] * n, outputs=[output_tokens] * n
    )
    return trace, np.array(stage_of), np.array(offsets)
