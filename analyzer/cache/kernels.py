"""numba versions of the per-capacity simulations in :mod:`analyzer.cache.simulate`.

Same semantics, decision for decision (tests replay both on generated traces): the
leaf policies (LRU, FIFO, optimal) follow :class:`~analyzer.cache.radix.BlockRadix`
with its tie-breaks, S3-FIFO follows :class:`~analyzer.cache.s3fifo.S3FIFO`. The
Python versions stay as the readable reference; these run in O(accesses x log
capacity) with arrays sized by distinct blocks and capacity. They release the GIL, so
the capacities of one analysis run on threads at once (``ReuseOptions.jobs``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from analyzer.cache.policies import get_policy
from analyzer.cache.simulate import next_use_requests as reference
from analyzer.cache.simulate import simulate

# The kernels :data:`analyzer.cache.policies.POLICIES` entries name: the leaf policies'
# codes in leaf_sim (its sort key, :func:`_key`), and "s3fifo" for s3fifo_sim.
LEAF_POLICIES = {"lru": 0, "fifo": 1, "optimal": 2}
KERNELS = (*LEAF_POLICIES, "s3fifo")


@njit(cache=True, inline="always")
def _less(hk: np.ndarray, hi: np.ndarray, a: int, b: int) -> bool:
    return bool(hk[a] < hk[b] or (hk[a] == hk[b] and hi[a] < hi[b]))


@njit(cache=True)
def _push(
    hk: np.ndarray, hi: np.ndarray, hv: np.ndarray, n: int, key: int, block: int, ver: int
) -> int:
    hk[n] = key
    hi[n] = block
    hv[n] = ver
    i = n
    while i > 0:
        p = (i - 1) // 2
        if _less(hk, hi, i, p):
            hk[i], hk[p] = hk[p], hk[i]
            hi[i], hi[p] = hi[p], hi[i]
            hv[i], hv[p] = hv[p], hv[i]
            i = p
        else:
            break
    return n + 1


@njit(cache=True)
def _sift_down(hk: np.ndarray, hi: np.ndarray, hv: np.ndarray, n: int, i: int) -> None:
    while True:
        left = 2 * i + 1
        if left >= n:
            return
        m = left
        if left + 1 < n and _less(hk, hi, left + 1, left):
            m = left + 1
        if _less(hk, hi, m, i):
            hk[i], hk[m] = hk[m], hk[i]
            hi[i], hi[m] = hi[m], hi[i]
            hv[i], hv[m] = hv[m], hv[i]
            i = m
        else:
            return


@njit(cache=True)
def _pop(hk: np.ndarray, hi: np.ndarray, hv: np.ndarray, n: int) -> int:
    """Move the minimum to slot n-1 and restore the heap over n-1 entries."""
    last = n - 1
    hk[0], hk[last] = hk[last], hk[0]
    hi[0], hi[last] = hi[last], hi[0]
    hv[0], hv[last] = hv[last], hv[0]
    _sift_down(hk, hi, hv, last, 0)
    return last


@njit(cache=True)
def _key(policy: int, b: int, touch_seq: np.ndarray, ins_seq: np.ndarray, rank: np.ndarray) -> int:
    if policy == 0:
        return int(touch_seq[b])
    if policy == 1:
        return int(ins_seq[b])
    return int(-(rank[b] * 4294967296 + ins_seq[b]))  # farthest next use, then newest


@njit(cache=True, nogil=True)
def leaf_sim(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_size: int,
    first: int,
    capacity: int,
    policy: int,
    next_use: np.ndarray,
    state: np.ndarray,
) -> int:
    """Prefix-hit tokens of counted requests for a leaf-evicting cache of ``capacity`` blocks.

    The per-block state takes ``state``'s dtype (an empty array): int32 when every id,
    request and counter of the run fits (:func:`state_dtype`), 29 bytes a distinct block
    where int64 takes 57."""
    n_ids = int(block_ids.max()) + 1 if block_ids.size else 0
    cached = np.zeros(n_ids, dtype=np.bool_)
    parent = np.full(n_ids, -1, dtype=state.dtype)
    children = np.zeros(n_ids, dtype=state.dtype)
    version = np.zeros(n_ids, dtype=state.dtype)
    ins_seq = np.zeros(n_ids, dtype=state.dtype)
    touch_seq = np.zeros(n_ids, dtype=state.dtype)
    rank = np.zeros(n_ids, dtype=state.dtype)
    protect = np.full(n_ids, -1, dtype=state.dtype)
    max_len = 0
    for r in range(offsets.size - 1):
        max_len = max(max_len, offsets[r + 1] - offsets[r])
    hcap = 2 * (capacity + max_len) + 64
    hk = np.empty(hcap, dtype=np.int64)
    hi = np.empty(hcap, dtype=np.int64)
    hv = np.empty(hcap, dtype=np.int64)
    stash_k = np.empty(max_len + 1, dtype=np.int64)
    stash_i = np.empty(max_len + 1, dtype=np.int64)
    stash_v = np.empty(max_len + 1, dtype=np.int64)
    n_heap = 0
    count = 0
    ver_ctr = 0
    ins_ctr = 0
    touch_ctr = 0
    hit = 0
    if capacity <= 0:
        return 0
    for r in range(offsets.size - 1):
        lo = offsets[r]
        hi_ = offsets[r + 1]
        k = 0
        while lo + k < hi_ and cached[block_ids[lo + k]]:
            k += 1
        if r >= first:
            hit += max(min(k * block_size, prompt_tokens[r] - 1), 0)
        m = min(hi_ - lo, capacity)
        par = -1
        for j in range(lo, lo + m):
            b = block_ids[j]
            if not cached[b]:
                cached[b] = True
                count += 1
                parent[b] = par
                children[b] = 0
                ins_ctr += 1
                ins_seq[b] = ins_ctr
                if par >= 0:
                    children[par] += 1
                    ver_ctr += 1
                    version[par] = ver_ctr
            par = b
            protect[b] = r
            if policy == 2:
                rank[b] = next_use[j]
        for j in range(lo + m - 1, lo - 1, -1):
            b = block_ids[j]
            touch_ctr += 1
            touch_seq[b] = touch_ctr
            ver_ctr += 1
            version[b] = ver_ctr
            if children[b] == 0:
                if n_heap == hcap:
                    n_heap = _compact_heap(hk, hi, hv, n_heap, cached, version, children)
                n_heap = _push(
                    hk, hi, hv, n_heap, _key(policy, b, touch_seq, ins_seq, rank), b, ver_ctr
                )
        n_stash = 0
        while count > capacity and n_heap > 0:
            n_heap = _pop(hk, hi, hv, n_heap)
            b = hi[n_heap]
            ver = hv[n_heap]
            if not cached[b] or version[b] != ver or children[b] != 0:
                continue
            if protect[b] == r and policy != 2:
                # LRU/FIFO keep the arriving request's blocks; the offline optimum may
                # drop them at once (bypass), or it would not bound policies that do.
                stash_k[n_stash] = hk[n_heap]
                stash_i[n_stash] = b
                stash_v[n_stash] = ver
                n_stash += 1
                continue
            # Evict b, then each parent it leaves a leaf while that parent is what the
            # heap would hand back next: pushed and popped at once, it would be evicted by
            # the same checks. FIFO's parent was inserted before the child it outlived
            # and the optimum's is needed no later, so chains go up without the heap
            # (a FIFO or optimal run on a 50k-request log: 0.4-1.0 s -> 0.07-0.08 s).
            while True:
                cached[b] = False
                count -= 1
                p = parent[b]
                if p < 0:
                    break
                children[p] -= 1
                if children[p] != 0:
                    break
                ver_ctr += 1
                version[p] = ver_ctr
                kp = _key(policy, p, touch_seq, ins_seq, rank)
                if (
                    count > capacity
                    and (protect[p] != r or policy == 2)  # else stashed, as from the heap
                    and (n_heap == 0 or kp < hk[0] or (kp == hk[0] and p < hi[0]))
                ):
                    b = p
                    continue
                if n_heap == hcap:
                    n_heap = _compact_heap(hk, hi, hv, n_heap, cached, version, children)
                n_heap = _push(hk, hi, hv, n_heap, kp, p, ver_ctr)
                break
        for s in range(n_stash):
            if n_heap == hcap:
                n_heap = _compact_heap(hk, hi, hv, n_heap, cached, version, children)
            n_heap = _push(hk, hi, hv, n_heap, stash_k[s], stash_i[s], stash_v[s])
    return hit


@njit(cache=True, inline="always")
def _better(ra: int, da: int, ia: int, rb: int, db: int, ib: int) -> bool:
    """Belady's keep order: sooner next use, then shallower, then smaller id."""
    return ra < rb or (ra == rb and (da < db or (da == db and ia < ib)))


@njit(cache=True, nogil=True)
def optimal_stack(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_size: int,
    first: int,
    capacities: np.ndarray,
    next_use: np.ndarray,
) -> np.ndarray:
    """Prefix-hit tokens of counted requests under ``leaf_sim``'s optimal policy at every
    capacity in ``capacities`` (blocks), in one pass; empty when the ids are not a prefix
    tree (a block seen after two different parents or at two depths): it does not apply.

    Belady's MIN is a stack algorithm (Mattson et al. 1970): at any moment it ranks the
    blocks by next use alone, whatever the capacity, so the cache of ``C`` blocks is the
    first ``C`` of one priority stack. With bypass, a request's arrival makes the cache
    of every size ``C`` the best ``C`` of (that cache and the request's blocks); walking
    the stack from the top with a heap of candidates gives every size's new contents
    at once. In a prefix tree a parent's next use is never later than its child's, so
    ranking equal next uses shallower first makes every size prefix-closed, and the
    least wanted block is a leaf: the order ``leaf_sim`` evicts in. Ties it breaks by
    insertion are only among blocks never used again, which are never hit and go
    before any other, so the hit tokens are the same.
    """
    n_caps = capacities.size
    hits = np.zeros(n_caps, dtype=np.int64)
    top = 0
    for c in range(n_caps):
        top = max(top, int(capacities[c]))
    n_ids = int(block_ids.max()) + 1 if block_ids.size else 0
    parent = np.full(n_ids, -2, dtype=np.int64)  # -2: not seen yet
    rank = np.zeros(n_ids, dtype=np.int64)
    depth = np.zeros(n_ids, dtype=np.int64)
    level = np.full(n_ids, -1, dtype=np.int64)  # place in the stack, -1: below ``top``
    arrival = np.full(n_ids, -1, dtype=np.int64)  # last request holding the block
    st_r = np.empty(top, dtype=np.int64)  # the stack: rank, depth, id by level
    st_d = np.empty(top, dtype=np.int64)
    st_i = np.full(top, -1, dtype=np.int64)
    max_len = 0
    for r in range(offsets.size - 1):
        max_len = max(max_len, offsets[r + 1] - offsets[r])
    q_r = np.empty(max_len + 1, dtype=np.int64)  # candidates: a heap, best first
    q_d = np.empty(max_len + 1, dtype=np.int64)
    q_i = np.empty(max_len + 1, dtype=np.int64)
    for r in range(offsets.size - 1):
        lo = offsets[r]
        hi_ = offsets[r + 1]
        # lookups at arrival: a block is cached at capacity C when its level is below C
        for c in range(n_caps):
            k = 0
            while lo + k < hi_:
                lv = level[block_ids[lo + k]]
                if lv < 0 or lv >= capacities[c]:
                    break
                k += 1
            if r >= first:
                hits[c] += max(min(k * block_size, prompt_tokens[r] - 1), 0)
        par = -1
        n_q = 0
        for j in range(lo, hi_):
            b = block_ids[j]
            if parent[b] == -2:
                parent[b] = par
                depth[b] = j - lo
            elif parent[b] != par or depth[b] != j - lo:
                return np.empty(0, dtype=np.int64)
            par = b
            rank[b] = next_use[j]
            arrival[b] = r
            if j - lo < top:  # deeper blocks cannot be within the first ``top``
                # push onto the candidate heap
                i = n_q
                q_r[i], q_d[i], q_i[i] = rank[b], depth[b], b
                n_q += 1
                while i > 0:
                    p = (i - 1) // 2
                    if _better(q_r[i], q_d[i], q_i[i], q_r[p], q_d[p], q_i[p]):
                        q_r[i], q_r[p] = q_r[p], q_r[i]
                        q_d[i], q_d[p] = q_d[p], q_d[i]
                        q_i[i], q_i[p] = q_i[p], q_i[i]
                        i = p
                    else:
                        break
        lv = 0
        while n_q > 0 and lv < top:
            old = st_i[lv]
            if old >= 0 and arrival[old] == r:
                old = -1  # the request's own block: already a candidate
            if old >= 0 and not _better(q_r[0], q_d[0], q_i[0], st_r[lv], st_d[lv], old):
                lv += 1
                continue
            # the best candidate takes this level; the block there becomes a candidate
            b = q_i[0]
            br, bd = q_r[0], q_d[0]
            if old >= 0:
                q_r[0], q_d[0], q_i[0] = st_r[lv], st_d[lv], old
            else:
                n_q -= 1
                q_r[0], q_d[0], q_i[0] = q_r[n_q], q_d[n_q], q_i[n_q]
            i = 0
            while True:
                left = 2 * i + 1
                if left >= n_q:
                    break
                m = left
                if left + 1 < n_q and _better(
                    q_r[left + 1], q_d[left + 1], q_i[left + 1], q_r[left], q_d[left], q_i[left]
                ):
                    m = left + 1
                if _better(q_r[m], q_d[m], q_i[m], q_r[i], q_d[i], q_i[i]):
                    q_r[i], q_r[m] = q_r[m], q_r[i]
                    q_d[i], q_d[m] = q_d[m], q_d[i]
                    q_i[i], q_i[m] = q_i[m], q_i[i]
                    i = m
                else:
                    break
            st_r[lv], st_d[lv], st_i[lv] = br, bd, b
            level[b] = lv
            lv += 1
        for i in range(n_q):  # below the deepest capacity asked for
            level[q_i[i]] = -1
    return hits


@njit(cache=True)
def _compact_heap(
    hk: np.ndarray,
    hi: np.ndarray,
    hv: np.ndarray,
    n: int,
    cached: np.ndarray,
    version: np.ndarray,
    children: np.ndarray,
) -> int:
    """Drop stale entries (order is kept by re-heapifying)."""
    m = 0
    for i in range(n):
        b = hi[i]
        if cached[b] and version[b] == hv[i] and children[b] == 0:
            hk[m] = hk[i]
            hi[m] = b
            hv[m] = hv[i]
            m += 1
    for i in range(m // 2 - 1, -1, -1):
        _sift_down(hk, hi, hv, m, i)
    return m


@njit(cache=True, nogil=True)
def s3fifo_sim(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_size: int,
    first: int,
    capacity: int,
    small_cap: int,
    state: np.ndarray,
) -> int:
    """Prefix-hit tokens of counted requests for S3-FIFO over the tail-first block stream
    (the ghosts' stamps in ``state``'s dtype, as :func:`leaf_sim`'s state: 5 bytes a
    distinct block at int32, with the frequency, where int64 took 16)."""
    n_ids = int(block_ids.max()) + 1 if block_ids.size else 0
    freq = np.full(n_ids, -1, dtype=np.int8)  # -1: not cached, else 0 to 3
    ghost_stamp = np.full(n_ids, -1, dtype=state.dtype)
    ring = capacity + 1
    small = np.empty(ring, dtype=np.int64)
    main = np.empty(ring, dtype=np.int64)
    s_head = 0
    s_len = 0
    m_head = 0
    m_len = 0
    ghost_cap = capacity - small_cap
    g_ring = 2 * (ghost_cap + 1) + 8
    g_id = np.empty(g_ring, dtype=np.int64)
    g_st = np.empty(g_ring, dtype=np.int64)
    g_head = 0
    g_len = 0  # entries in the ring, live or dead
    g_live = 0
    stamp = 0
    count = 0
    hit = 0
    if capacity <= 0:
        return 0
    for r in range(offsets.size - 1):
        lo = offsets[r]
        hi_ = offsets[r + 1]
        k = 0
        while lo + k < hi_ and freq[block_ids[lo + k]] >= 0:
            k += 1
        if r >= first:
            hit += max(min(k * block_size, prompt_tokens[r] - 1), 0)
        for j in range(hi_ - 1, lo - 1, -1):
            b = block_ids[j]
            if freq[b] >= 0:
                freq[b] = min(freq[b] + 1, 3)
                continue
            while count >= capacity:
                evicted = False
                if s_len >= small_cap or m_len == 0:
                    while s_len > 0:
                        t = small[s_head]
                        s_head = (s_head + 1) % ring
                        s_len -= 1
                        if freq[t] > 0:
                            freq[t] = 0
                            main[(m_head + m_len) % ring] = t
                            m_len += 1
                            continue
                        freq[t] = -1
                        count -= 1
                        if g_len == g_ring:  # compact: keep live entries in order
                            idx = (g_head + np.arange(g_len)) % g_ring
                            ids_old = g_id[idx]
                            st_old = g_st[idx]
                            live = ghost_stamp[ids_old] == st_old
                            w = int(live.sum())
                            g_id[:w] = ids_old[live]
                            g_st[:w] = st_old[live]
                            g_head = 0
                            g_len = w
                        stamp += 1
                        ghost_stamp[t] = stamp
                        g_id[(g_head + g_len) % g_ring] = t
                        g_st[(g_head + g_len) % g_ring] = stamp
                        g_len += 1
                        g_live += 1
                        while g_live > ghost_cap:  # drop the oldest live ghost
                            x = g_id[g_head]
                            st = g_st[g_head]
                            g_head = (g_head + 1) % g_ring
                            g_len -= 1
                            if ghost_stamp[x] == st:
                                ghost_stamp[x] = -1
                                g_live -= 1
                        evicted = True
                        break
                if evicted:
                    continue
                while m_len > 0:
                    t = main[m_head]
                    m_head = (m_head + 1) % ring
                    m_len -= 1
                    if freq[t] > 0:
                        freq[t] -= 1
                        main[(m_head + m_len) % ring] = t
                        m_len += 1
                        continue
                    freq[t] = -1
                    count -= 1
                    break
            freq[b] = 0
            count += 1
            if ghost_stamp[b] >= 0:
                ghost_stamp[b] = -1
                g_live -= 1
                main[(m_head + m_len) % ring] = b
                m_len += 1
            else:
                small[(s_head + s_len) % ring] = b
                s_len += 1
    return hit


def state_dtype(n_accesses: int, n_requests: int) -> type[np.signedinteger]:
    """The integer type a simulation's per-block state and per-access next uses take:
    int32 when every block id, request index and counter of the run fits (a counter
    steps at most three times an access: a touch, an insertion under a parent, an
    eviction), else int64. Half the bytes: 11.9 M accesses and 1.7 M distinct blocks at
    the 50k long-prompt log, two runs at once beside their next uses, 290 MB as int64."""
    fits = max(3 * n_accesses, n_requests) + 3 < np.iinfo(np.int32).max
    return np.int32 if fits else np.int64


@njit(cache=True, nogil=True)
def _next_use(
    block_ids: np.ndarray, offsets: np.ndarray, n_ids: int, state: np.ndarray
) -> np.ndarray:
    n_req = offsets.size - 1
    out = np.empty(offsets[-1], dtype=state.dtype)
    last = np.full(n_ids, n_req, dtype=state.dtype)  # the next request holding each block
    for r in range(n_req - 1, -1, -1):
        for k in range(offsets[r + 1] - 1, offsets[r] - 1, -1):
            b = block_ids[k]
            out[k] = last[b]
            last[b] = r
    return out


def next_use_requests(block_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """:func:`analyzer.cache.simulate.next_use_requests` (for each access, the index of
    the next request holding the same block; the number of requests if none) in one
    backward pass over dense ids: 4 bytes an access and 4 a distinct block (int32 where
    :func:`state_dtype` allows, else 8 and 8), where the reference's sort held about 40
    bytes an access (450 MB at a 50,000-request log of 11.9 M accesses). Ids that are
    not dense (negative, or a largest id beyond twice the accesses, which would size the
    table by the id) go to the reference."""
    block_ids = block_ids[: offsets[-1]]
    n_ids = int(block_ids.max()) + 1 if block_ids.size else 0
    if block_ids.size and (int(block_ids.min()) < 0 or n_ids > 2 * block_ids.size + 1024):
        return reference(block_ids, offsets)
    state = np.empty(0, dtype=state_dtype(block_ids.size, offsets.size - 1))
    return _next_use(block_ids, np.asarray(offsets, dtype=np.int64), n_ids, state)


def simulate_fast(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_size: int,
    first_counted: int,
    capacity_blocks: int,
    policy: str,
    next_use: np.ndarray | None = None,
) -> int:
    """Same contract as :func:`analyzer.cache.simulate.simulate`: the registered policy's
    compiled kernel, or its reference simulation when it has none."""

    entry = get_policy(policy)
    block_ids = block_ids[: offsets[-1]]
    state = np.empty(0, dtype=state_dtype(block_ids.size, offsets.size - 1))
    if entry.kernel is None:
        return simulate(
            block_ids, offsets, prompt_tokens, block_size, first_counted, capacity_blocks, policy
        )
    if entry.kernel == "s3fifo":
        small_cap = max(1, int(capacity_blocks * 0.1))
        return int(
            s3fifo_sim(
                block_ids,
                offsets,
                prompt_tokens,
                block_size,
                first_counted,
                capacity_blocks,
                small_cap,
                state,
            )
        )
    if next_use is None:
        next_use = np.zeros(0, dtype=state.dtype)
        if entry.kernel == "optimal":
            next_use = next_use_requests(block_ids, offsets)
    return int(
        leaf_sim(
            block_ids,
            offsets,
            prompt_tokens,
            block_size,
            first_counted,
            capacity_blocks,
            LEAF_POLICIES[entry.kernel],
            next_use,
            state,
        )
    )


# One stack pass costs about (requests x the largest capacity) steps, each a few ns times
# the depth of its heap of candidates (log2 of a request's blocks); one per-capacity run
# about (accesses) steps of some 10 to 40 ns. Two traces fix the constant (CPU seconds,
# both ways in one process):
# * Mooncake's conversation trace, 7 capacities up to 1,024 blocks on 12,031 requests of
#   23 blocks (276k accesses): the pass 0.041 s, the runs 0.068 s; the model takes the
#   pass for any constant above 29.
# * A long-prompt gateway log (bench/longlog.py -n 12000), 4 capacities up to 14,488
#   blocks on 12,000 requests of 238 blocks (2.85 M accesses): the pass 1.08 s, the
#   runs 0.14 s; the model takes the runs for any constant below 120.
# 60 sits between the two, a factor of two from either.
STACK_STEPS_PER_ACCESS = 60


def optimal_all(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_size: int,
    first_counted: int,
    capacities_blocks: list[int],
    next_use: np.ndarray,
) -> list[int] | None:
    """Belady's hit tokens at every capacity from one stack pass (:func:`optimal_stack`),
    or None when per-capacity runs are cheaper or the ids are not a prefix tree."""
    if not capacities_blocks:
        return []
    n_req = offsets.size - 1
    accesses = int(offsets[-1])
    depth = math.log2(accesses / max(n_req, 1) + 1)  # the candidate heap's, per request
    steps = n_req * max(max(capacities_blocks), 0) * depth
    per_capacity = STACK_STEPS_PER_ACCESS * accesses * len(capacities_blocks)
    if steps > max(per_capacity, 1 << 16):  # small traces: either is instant
        return None
    got = optimal_stack(
        block_ids[: offsets[-1]],
        offsets,
        prompt_tokens,
        block_size,
        first_counted,
        np.asarray(capacities_blocks, dtype=np.int64),
        next_use,
    )
    if got.size != len(capacities_blocks):
        return None  # not a prefix tree: the per-capacity runs decide
    return [int(h) for h in got]
