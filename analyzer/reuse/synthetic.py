"""Generated chained block traces, straight to BlockTrace arrays (for benchmarks and tests).

Tenants own a system prompt; each session starts with its tenant's system prompt and
every turn extends the previous turn's prompt with fresh blocks (a chat that resends
its history). One-turn sessions stand for one-off calls that share only the system
prompt. Everything comes from one seeded numpy Generator, so a seed fixes the trace.
This is a structural workload for speed and sampling checks, not a model of any real
service (analyzer/synth writes realistic request logs).
"""

from __future__ import annotations

import numpy as np

from analyzer.cache.stack import splitmix64
from analyzer.trace import BlockTrace


def chained_trace(
    n_sessions: int,
    *,
    seed: int = 0,
    block_size: int = 16,
    tenants: int = 8,
    system_blocks: int = 40,
    mean_turns: float = 6.0,
    mean_new_blocks: float = 8.0,
    mean_gap_s: float = 1.0,
    mean_think_s: float = 30.0,
) -> BlockTrace:
    """A trace of ``n_sessions`` chat sessions; accesses ~ sessions x turns^2 x new blocks."""
    rng = np.random.default_rng(seed)
    tenant_of = rng.integers(0, tenants, n_sessions)
    turns = 1 + rng.geometric(1.0 / mean_turns, n_sessions) - 1
    turns = np.maximum(turns, 1)
    n_req = int(turns.sum())
    sess_of_req = np.repeat(np.arange(n_sessions), turns)
    first_req = np.zeros(n_sessions + 1, dtype=np.int64)
    np.cumsum(turns, out=first_req[1:])
    new_blocks = rng.poisson(mean_new_blocks, n_req) + 1
    # prefix length (in session-own blocks) of each turn: cumulative new blocks
    own_len = np.cumsum(new_blocks)
    own_len -= np.repeat(own_len[first_req[:-1]] - new_blocks[first_req[:-1]], turns)
    sys_len = rng.integers(system_blocks // 2, system_blocks + 1, tenants)
    # global raw ids: tenant system prompts first, then each session's own blocks
    sys_start = np.zeros(tenants + 1, dtype=np.int64)
    np.cumsum(sys_len, out=sys_start[1:])
    own_total = own_len[first_req[1:] - 1]
    own_start = sys_start[-1] + np.concatenate([[0], np.cumsum(own_total)[:-1]])
    # arrivals: sessions start as a Poisson process; turns follow after think times
    start = np.cumsum(rng.exponential(mean_gap_s, n_sessions))
    think = rng.exponential(mean_think_s, n_req)
    think[first_req[:-1]] = 0.0
    arrival = start[sess_of_req] + _segment_cumsum(think, first_req)
    order = np.argsort(arrival, kind="stable")
    sess = sess_of_req[order]
    ten = tenant_of[sess]
    s_len = sys_len[ten]
    o_len = own_len[order]
    counts = s_len + o_len
    offsets = np.zeros(n_req + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    req = np.repeat(np.arange(n_req), counts)
    k = np.arange(offsets[-1]) - offsets[req]
    raw = np.where(k < s_len[req], sys_start[ten][req] + k, own_start[sess][req] + (k - s_len[req]))
    ids, id_raw = _first_seen(raw)
    prompt = counts * block_size + rng.integers(0, block_size, n_req)
    return BlockTrace(
        block_size=block_size,
        arrival_s=arrival[order] - arrival[order][0],
        prompt_tokens=prompt.astype(np.int64),
        output_tokens=np.full(n_req, -1, dtype=np.int64),
        session=sess.astype(np.int32),
        tenant=ten.astype(np.int32),
        offsets=offsets,
        block_ids=ids,
        block_hashes=splitmix64(id_raw.astype(np.uint64)),
        request_ids=[f"g{i}" for i in range(n_req)],
        session_names=[f"s{i}" for i in range(n_sessions)],
        tenant_names=[f"t{i}" for i in range(tenants)],
        meta={"block_size": str(block_size), "source": f"chained_trace(seed={seed})"},
    )


def _segment_cumsum(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    c = np.cumsum(x)
    base = np.repeat(c[starts[:-1]] - x[starts[:-1]], np.diff(starts))
    out: np.ndarray = c - base
    return out


def _first_seen(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse].astype(np.int64), uniq[order]
