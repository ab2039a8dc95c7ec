"""Per-capacity cache simulations: FIFO, Belady's optimal, S3-FIFO (and LRU as a check).

This module is the readable reference; :mod:`analyzer.cache.kernels` runs the same
decisions in numba and the analysis uses that (tests replay both). Policies are looked
up by name in :mod:`analyzer.cache.policies`; one without a compiled kernel runs here.

Each request is looked up at arrival (hit = the leading blocks present), then cached.
LRU, FIFO and optimal run on :class:`~analyzer.cache.radix.BlockRadix`, so they are
prefix-closed by construction (only leaves are evicted):

* ``lru``: least recently used leaf; equals the one-pass curve (tested).
* ``fifo``: oldest inserted leaf; hits do not refresh.
* ``optimal``: Belady's MIN restricted to leaves, with bypass: evict the leaf whose next
  use (the index of the next request holding it) is farthest, the arriving request's
  own new blocks included. A parent is never needed later than its child, so the
  farthest block overall is always a leaf's ancestor-or-self with the same next use.
  Without bypass it would not bound S3-FIFO, whose small queue drops one-hit blocks.
* ``s3fifo``: S3-FIFO (Yang et al., SOSP'23) over the tail-first block stream, as a
  general-purpose block cache that ignores prefix structure: a small FIFO (10 % of
  the slots) filters one-hit blocks, a main FIFO with frequency-based reinsertion keeps
  the rest, and a ghost FIFO of evicted ids sends returning blocks straight to main.
  It may keep a child after evicting its parent; such a block cannot be hit until the
  parent returns, which is the real cost of a policy blind to prefixes.
"""

from __future__ import annotations

import numpy as np

from analyzer.cache.policies import get_policy
from analyzer.cache.radix import BlockRadix
from analyzer.cache.stack import access_weights


def next_use_requests(block_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """For each access, the index of the next request touching the same block (n if none)."""
    n_req = offsets.size - 1
    block_ids = block_ids[: offsets[-1]]
    req = np.repeat(np.arange(n_req, dtype=np.int64), np.diff(offsets))
    order = np.lexsort((np.arange(block_ids.size), block_ids))
    out = np.full(block_ids.size, n_req, dtype=np.int64)
    same = block_ids[order[1:]] == block_ids[order[:-1]]
    out[order[:-1][same]] = req[order[1:][same]]
    return out


def simulate(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_size: int,
    first_counted: int,
    capacity_blocks: int,
    policy: str,
) -> int:
    """Prefix-hit tokens of the counted requests (index >= first_counted) at one capacity,
    with the registered policy's readable reference (:mod:`analyzer.cache.policies`)."""
    entry = get_policy(policy)
    block_ids = block_ids[: offsets[-1]]
    weights = access_weights(offsets, prompt_tokens, block_size)
    ids = block_ids.tolist()
    offs = offsets.tolist()
    hit_tokens = 0
    if capacity_blocks <= 0:
        return 0
    if not entry.leaf:  # a block cache blind to prefixes (S3-FIFO)
        cache = entry.reference(capacity_blocks)
        for r in range(len(offs) - 1):
            lo, hi = offs[r], offs[r + 1]
            k = lo
            while k < hi and ids[k] in cache:
                k += 1
            if r >= first_counted:
                hit_tokens += int(weights[lo:k].sum())
            for j in range(hi - 1, lo - 1, -1):
                cache.access(ids[j])
        return hit_tokens
    pol = entry.reference()
    ranks = next_use_requests(block_ids, offsets).tolist() if pol.needs_next_use else None
    # The offline optimum may evict the arriving request's own blocks (bypass): insert
    # without a bound, then evict leaves by next use, the new ones included.
    bypass = pol.needs_next_use
    radix = BlockRadix(None if bypass else capacity_blocks, pol)
    for r in range(len(offs) - 1):
        lo, hi = offs[r], offs[r + 1]
        chain = ids[lo:hi]
        k = radix.match(chain)
        if r >= first_counted:
            hit_tokens += int(weights[lo : lo + k].sum())
        if bypass:
            chain = chain[:capacity_blocks]
        radix.insert(chain, float(r), ranks[lo : lo + len(chain)] if ranks is not None else None)
        if bypass and len(radix) > capacity_blocks:
            radix.evict(len(radix) - capacity_blocks)
    return hit_tokens
