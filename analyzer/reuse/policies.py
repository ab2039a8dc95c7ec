"""Per-capacity cache simulations: FIFO, Belady's optimal, S3-FIFO (and LRU as a check).

This module is the readable reference; :mod:`analyzer.reuse.fastsim` runs the same
decisions in numba and the analysis uses that (tests replay both).

Each request is looked up at arrival (hit = the leading blocks present), then cached.
LRU, FIFO and optimal run on :class:`~analyzer.reuse.radix.BlockRadix`, so they are
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

from collections import OrderedDict, deque

import numpy as np

from analyzer.reuse.radix import FIFO, LRU, BlockRadix, FarthestRank
from analyzer.reuse.stack import access_weights

POLICY_NAMES = ("lru", "fifo", "s3fifo", "optimal")


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


class S3FIFO:
    """S3-FIFO over block ids; ``access`` returns nothing, ``__contains__`` answers lookups."""

    def __init__(self, capacity_blocks: int, small_fraction: float = 0.1) -> None:
        assert capacity_blocks >= 1
        self.capacity = capacity_blocks
        self.small_cap = max(1, int(capacity_blocks * small_fraction))
        self.small: deque[int] = deque()
        self.main: deque[int] = deque()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}
        self.in_small: dict[int, bool] = {}

    def __contains__(self, b: int) -> bool:
        return b in self.freq

    def __len__(self) -> int:
        return len(self.freq)

    def access(self, b: int) -> None:
        if b in self.freq:
            self.freq[b] = min(self.freq[b] + 1, 3)
            return
        while len(self.freq) >= self.capacity:
            self._evict()
        self.freq[b] = 0
        if b in self.ghost:
            del self.ghost[b]
            self.main.append(b)
            self.in_small[b] = False
        else:
            self.small.append(b)
            self.in_small[b] = True

    def _evict(self) -> None:
        if len(self.small) >= self.small_cap or not self.main:
            while self.small:
                b = self.small.popleft()
                if self.freq[b] > 0:  # hit while probationary: promote
                    self.freq[b] = 0
                    self.in_small[b] = False
                    self.main.append(b)
                    continue
                del self.freq[b], self.in_small[b]
                self.ghost[b] = None
                if len(self.ghost) > self.capacity - self.small_cap:
                    self.ghost.popitem(last=False)
                return
        while self.main:
            b = self.main.popleft()
            if self.freq[b] > 0:
                self.freq[b] -= 1
                self.main.append(b)
                continue
            del self.freq[b], self.in_small[b]
            return


def simulate(
    block_ids: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_size: int,
    first_counted: int,
    capacity_blocks: int,
    policy: str,
) -> int:
    """Prefix-hit tokens of the counted requests (index >= first_counted) at one capacity."""
    assert policy in POLICY_NAMES, policy
    block_ids = block_ids[: offsets[-1]]
    weights = access_weights(offsets, prompt_tokens, block_size)
    ids = block_ids.tolist()
    offs = offsets.tolist()
    hit_tokens = 0
    if capacity_blocks <= 0:
        return 0
    if policy == "s3fifo":
        cache = S3FIFO(capacity_blocks)
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
    ranks = next_use_requests(block_ids, offsets).tolist() if policy == "optimal" else None
    pol = {"lru": LRU, "fifo": FIFO, "optimal": FarthestRank}[policy]()
    # The offline optimum may evict the arriving request's own blocks (bypass): insert
    # without a bound, then evict leaves by next use, the new ones included.
    bypass = policy == "optimal"
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
