"""One-pass LRU stack distances (Mattson) over prefix-closed block traces, in numba.

Model (Mattson et al., "Evaluation techniques for storage hierarchies", IBM Systems
Journal 1970; tail-first freeing as in vLLM's block pool). Requests are replayed in arrival order. At a request's arrival
each of its blocks is looked up in the cache state left by the earlier requests; then
the request touches its blocks tail-first (last block first, block 0 last), as vLLM
frees them. A block's *stack distance* at arrival is the number of distinct blocks
touched since its own last touch. Under plain LRU a cache of ``C`` blocks holds exactly
the blocks with distance ``< C``. Tail-first touching makes a parent at least as recent
as its child, so distances grow along a request and the hits at every capacity form a
prefix: LRU stays prefix-closed, and a single pass gives the exact hit ratio at every
capacity at once. (We still take the running maximum of distances along a request, so
a malformed trace can never count a block whose parent missed.)

Distances come from a Fenwick tree over touch positions holding a marker at each
block's last touch; positions are compacted whenever they run out, so memory is linear
in distinct blocks (not accesses) and time is O(accesses x log distinct).

Token weighting: block ``k`` of a request with ``P`` prompt tokens is worth
``min((k+1)B, P-1) - min(kB, P-1)`` tokens, so a hit never covers the last prompt
token (it must be recomputed to produce the first logits).
"""

from __future__ import annotations

import numpy as np
from numba import njit

MISS = -1  # distance of a block never touched before (infinite)


@njit(cache=True, inline="always")
def _fw_add(tree: np.ndarray, i: int, v: int) -> None:
    n = tree.size - 1
    while i <= n:
        tree[i] += v
        i += i & -i


@njit(cache=True, inline="always")
def _fw_prefix(tree: np.ndarray, i: int) -> int:
    s = 0
    while i > 0:
        s += tree[i]
        i -= i & -i
    return s


@njit(cache=True)
def _compact(last_pos: np.ndarray, pos_block: np.ndarray, tree: np.ndarray, t: int) -> int:
    """Renumber live markers 1..m in order, rebuild the tree; returns m (the new time)."""
    m = 0
    for p in range(1, t + 1):
        b = pos_block[p]
        if b >= 0 and last_pos[b] == p:
            m += 1
            last_pos[b] = m
            pos_block[m] = b
    pos_block[m + 1 : t + 1] = -1
    tree[:] = 0
    tree[1 : m + 1] = 1
    _fw_build(tree)
    return m


@njit(cache=True)
def _fw_build(tree: np.ndarray) -> None:
    """In-place O(n) Fenwick construction from the raw values in ``tree[1:]``."""
    n = tree.size - 1
    for p in range(1, n + 1):
        q = p + (p & -p)
        if q <= n:
            tree[q] += tree[p]


@njit(cache=True, inline="always")
def _touch(
    b: int,
    tree: np.ndarray,
    last_pos: np.ndarray,
    pos_block: np.ndarray,
    t: int,
    active: int,
    cap: int,
) -> tuple[int, int]:
    """Move block ``b``'s marker to a new last position; returns (time, distinct blocks)."""
    p = last_pos[b]
    if p != 0:
        _fw_add(tree, p, -1)
        pos_block[p] = -1  # dead marker: compaction must not revive it
    else:
        active += 1
    if t == cap:
        t = _compact(last_pos, pos_block, tree, t)
    t += 1
    last_pos[b] = t
    pos_block[t] = b
    _fw_add(tree, t, 1)
    return t, active


@njit(cache=True, inline="always")
def _weight(k: int, prompt: int, block_size: int) -> int:
    last = prompt - 1
    lo = min(k * block_size, last)
    hi = min((k + 1) * block_size, last)
    return max(hi - lo, 0)


@njit(cache=True)
def lru_histogram(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    weights: np.ndarray,
    block_size: int,
    first_counted: int,
    n_ids: int,
    prefix_max: bool,
) -> np.ndarray:
    """Token weight of counted requests by LRU stack distance at arrival.

    Returns ``hist`` of size ``n_ids + 1``: ``hist[d]`` tokens at distance ``d``,
    ``hist[n_ids]`` tokens never seen before. ``weights`` (per access) overrides the
    last-token rule when non-empty (SHARDS passes sampled accesses that way).
    """
    hist = np.zeros(n_ids + 1, dtype=np.int64)
    cap = 2 * n_ids + 2
    tree = np.zeros(cap + 1, dtype=np.int64)
    last_pos = np.zeros(n_ids, dtype=np.int64)
    pos_block = np.full(cap + 1, -1, dtype=np.int64)
    dist = np.empty(0, dtype=np.int64)
    t = 0
    active = 0
    n_req = offsets.size - 1
    explicit = weights.size > 0
    for r in range(n_req):
        lo = offsets[r]
        hi = offsets[r + 1]
        if hi - lo > dist.size:
            dist = np.empty(2 * (hi - lo), dtype=np.int64)
        # lookups against the state the earlier requests left
        run = 0
        for j in range(lo, hi):
            b = block_ids[j]
            p = last_pos[b]
            d = MISS if p == 0 else active - _fw_prefix(tree, p)
            if prefix_max:
                if run == MISS or d == MISS:
                    run = MISS
                elif d > run:
                    run = d
                d = run
            dist[j - lo] = d
        if r >= first_counted:
            for j in range(lo, hi):
                w = weights[j] if explicit else _weight(j - lo, prompt_tokens[r], block_size)
                d = dist[j - lo]
                hist[n_ids if d == MISS else d] += w
        # tail-first touches
        for j in range(hi - 1, lo - 1, -1):
            t, active = _touch(block_ids[j], tree, last_pos, pos_block, t, active, cap)
    return hist


@njit(cache=True)
def reuse_scan(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    arrival_s: np.ndarray,
    session: np.ndarray,
    tenant: np.ndarray,
    block_size: int,
    first_counted: int,
    n_ids: int,
    window_s: float,
    n_windows: int,
    time_edges: np.ndarray,
    distances: bool = True,
) -> tuple[np.ndarray, ...]:  # the ten arrays the docstring lists
    """Everything the reuse report needs, in one pass; memory linear in distinct blocks.

    With ``distances=False`` (a SHARDS run, where the curve comes from the sample) the
    Fenwick tree is skipped: every block seen before counts at distance 0, which keeps
    the ceilings, sources and counts exact and drops the distance histogram.

    Returns (hist_all, hist_counted, dist_count, time_count, source_tokens, hits,
    parent, depth, working_set, request_hits): token weight by LRU distance for all and for counted
    requests; the number of counted hit accesses per raw distance and per reuse-time
    bin (``time_edges``, seconds); hit tokens of counted requests by the request that
    last held the block (0 same session, 1 same tenant, 2 other tenant, 3 unknown);
    per block, counted requests that hit it, its parent and depth at first sight;
    distinct blocks per time window; and per request, its prefix-hit tokens with
    unlimited capacity.
    """
    hist_all = np.zeros(n_ids + 1, dtype=np.int64)
    hist_cnt = np.zeros(n_ids + 1, dtype=np.int64)
    dist_count = np.zeros(n_ids + 1, dtype=np.int64)
    time_count = np.zeros(time_edges.size + 1, dtype=np.int64)
    source_tokens = np.zeros(4, dtype=np.int64)
    hits = np.zeros(n_ids, dtype=np.int64)
    parent = np.full(n_ids, -1, dtype=np.int64)
    depth = np.zeros(n_ids, dtype=np.int64)
    working_set = np.zeros(max(n_windows, 1), dtype=np.int64)
    last_win = np.full(n_ids, -1, dtype=np.int64)
    last_req = np.full(n_ids, -1, dtype=np.int64)
    cap = 2 * n_ids + 2 if distances else 0
    tree = np.zeros(cap + 1, dtype=np.int64)
    last_pos = np.zeros(n_ids if distances else 0, dtype=np.int64)
    pos_block = np.full(cap + 1, -1, dtype=np.int64)
    t = 0
    active = 0
    n_req = offsets.size - 1
    request_hits = np.zeros(n_req, dtype=np.int64)
    t0 = arrival_s[0] if n_req > 0 else 0.0
    for r in range(n_req):
        lo = offsets[r]
        hi = offsets[r + 1]
        counted = r >= first_counted
        w_idx = int((arrival_s[r] - t0) / window_s) if window_s > 0 else 0
        w_idx = min(max(w_idx, 0), n_windows - 1)
        run = 0
        for j in range(lo, hi):
            k = j - lo
            b = block_ids[j]
            if not distances:
                p = 0
                raw = MISS if last_req[b] == -1 else 0
            else:
                p = last_pos[b]
                raw = MISS if p == 0 else active - _fw_prefix(tree, p)
            if p == 0 and last_req[b] == -1:
                parent[b] = block_ids[j - 1] if k > 0 else -1
                depth[b] = k
            if run == MISS or raw == MISS:
                run = MISS
            elif raw > run:
                run = raw
            w = _weight(k, prompt_tokens[r], block_size)
            hist_all[n_ids if run == MISS else run] += w
            if run != MISS:
                request_hits[r] += w
            if counted:
                hist_cnt[n_ids if run == MISS else run] += w
                if run != MISS:
                    dist_count[raw] += 1
                    hits[b] += 1
                    prev = last_req[b]
                    dt = arrival_s[r] - arrival_s[prev]
                    time_count[np.searchsorted(time_edges, dt, side="right")] += 1
                    if session[r] >= 0 and session[r] == session[prev]:
                        source_tokens[0] += w
                    elif tenant[r] >= 0 and tenant[r] == tenant[prev]:
                        source_tokens[1] += w
                    elif tenant[r] >= 0 and tenant[prev] >= 0:
                        source_tokens[2] += w
                    else:
                        source_tokens[3] += w
            if last_win[b] != w_idx:
                last_win[b] = w_idx
                working_set[w_idx] += 1
        for j in range(hi - 1, lo - 1, -1):
            b = block_ids[j]
            last_req[b] = r
            if distances:
                t, active = _touch(b, tree, last_pos, pos_block, t, active, cap)
    return (
        hist_all,
        hist_cnt,
        dist_count,
        time_count,
        source_tokens,
        hits,
        parent,
        depth,
        working_set,
        request_hits,
    )


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A fixed 64-bit mix (deterministic across runs and machines, unlike hash())."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def access_weights(offsets: np.ndarray, prompt_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Tokens each access is worth under the last-token rule (vectorised ``_weight``)."""
    counts = np.diff(offsets)
    req = np.repeat(np.arange(counts.size), counts)
    k = np.arange(offsets[-1]) - offsets[req]
    last = prompt_tokens[req] - 1
    weights: np.ndarray = np.maximum(
        np.minimum((k + 1) * block_size, last) - np.minimum(k * block_size, last), 0
    ).astype(np.int64)
    return weights


@njit(cache=True)
def sampled_histogram(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_size: int,
    sample_index: np.ndarray,
    id_weight: np.ndarray,
    unit: int,
    first_counted: int,
    n_bins: int,
) -> tuple[np.ndarray, int]:
    """Stack distances over a spatially sampled stream, streaming (no per-access arrays).

    ``sample_index[b]`` is block ``b``'s slot among the sampled blocks (-1: not sampled).
    A sampled block stands for ``id_weight / unit`` blocks: for SHARDS at rate
    ``R = unit / 2**32`` an ordinary block has ``id_weight = 2**32`` (it stands for
    ``1 / R`` blocks) and a block kept at rate 1 has ``id_weight = unit``. Marker weights
    are integers, so estimated distances are exact and independent of summation order.
    Returns (estimated tokens by estimated distance in blocks, with ``hist[n_bins]`` for
    first uses; the exact token weight of all counted accesses).
    """
    n_ids = id_weight.size
    hist = np.zeros(n_bins + 1, dtype=np.float64)
    cap = 2 * n_ids + 2
    tree = np.zeros(cap + 1, dtype=np.int64)
    last_pos = np.zeros(n_ids, dtype=np.int64)
    pos_block = np.full(cap + 1, -1, dtype=np.int64)
    t = 0
    total = 0
    counted_tokens = 0
    n_req = offsets.size - 1
    for r in range(n_req):
        lo = offsets[r]
        hi = offsets[r + 1]
        if r >= first_counted:
            for j in range(lo, hi):
                w = _weight(j - lo, prompt_tokens[r], block_size)
                counted_tokens += w
                b = sample_index[block_ids[j]]
                if b < 0:
                    continue
                p = last_pos[b]
                wt = w * (id_weight[b] / unit)
                if p == 0:
                    hist[n_bins] += wt
                else:
                    est = (total - _fw_prefix(tree, p)) // unit
                    hist[min(est, n_bins - 1)] += wt
        for j in range(hi - 1, lo - 1, -1):
            b = sample_index[block_ids[j]]
            if b < 0:
                continue
            p = last_pos[b]
            if p != 0:
                _fw_add(tree, p, -id_weight[b])
                pos_block[p] = -1
                total -= id_weight[b]
            if t == cap:
                t = _compact_weighted(last_pos, pos_block, tree, t, id_weight)
            t += 1
            last_pos[b] = t
            pos_block[t] = b
            _fw_add(tree, t, id_weight[b])
            total += id_weight[b]
    return hist, counted_tokens


@njit(cache=True)
def _compact_weighted(
    last_pos: np.ndarray, pos_block: np.ndarray, tree: np.ndarray, t: int, id_weight: np.ndarray
) -> int:
    m = 0
    for p in range(1, t + 1):
        b = pos_block[p]
        if b >= 0 and last_pos[b] == p:
            m += 1
            last_pos[b] = m
            pos_block[m] = b
    pos_block[m + 1 : t + 1] = -1
    tree[:] = 0
    for p in range(1, m + 1):
        tree[p] = id_weight[pos_block[p]]
    _fw_build(tree)
    return m


@njit(cache=True)
def sampled_histogram_sparse(
    sample_ids: np.ndarray,
    offsets: np.ndarray,
    weights: np.ndarray,
    id_weight: np.ndarray,
    unit: int,
    first_counted: int,
    n_bins: int,
) -> np.ndarray:
    """:func:`sampled_histogram` over the sampled accesses alone (taken in the scan).

    ``sample_ids`` are the kept accesses' slots (dense in first-seen order),
    ``offsets`` their requests' slices and ``weights`` their tokens under the last-token
    rule. Same arithmetic in the same order, so the same histogram; the counted tokens of
    the whole trace come from the request lengths instead.
    """
    n_ids = id_weight.size
    hist = np.zeros(n_bins + 1, dtype=np.float64)
    cap = 2 * n_ids + 2
    tree = np.zeros(cap + 1, dtype=np.int64)
    last_pos = np.zeros(n_ids, dtype=np.int64)
    pos_block = np.full(cap + 1, -1, dtype=np.int64)
    t = 0
    total = 0
    n_req = offsets.size - 1
    for r in range(n_req):
        lo = offsets[r]
        hi = offsets[r + 1]
        if r >= first_counted:
            for j in range(lo, hi):
                b = sample_ids[j]
                p = last_pos[b]
                wt = weights[j] * (id_weight[b] / unit)
                if p == 0:
                    hist[n_bins] += wt
                else:
                    est = (total - _fw_prefix(tree, p)) // unit
                    hist[min(est, n_bins - 1)] += wt
        for j in range(hi - 1, lo - 1, -1):
            b = sample_ids[j]
            p = last_pos[b]
            if p != 0:
                _fw_add(tree, p, -id_weight[b])
                pos_block[p] = -1
                total -= id_weight[b]
            if t == cap:
                t = _compact_weighted(last_pos, pos_block, tree, t, id_weight)
            t += 1
            last_pos[b] = t
            pos_block[t] = b
            _fw_add(tree, t, id_weight[b])
            total += id_weight[b]
    return hist
