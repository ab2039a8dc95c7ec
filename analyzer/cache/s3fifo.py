"""S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23)
over block ids: a block cache that ignores prefix structure.

A small FIFO (10 % of the slots) filters one-hit blocks, a main FIFO with
frequency-based reinsertion keeps the rest, and a ghost FIFO of evicted ids sends
returning blocks straight to main. It may keep a child after evicting its parent; such
a block cannot be hit until the parent returns, which is the real cost of a policy blind
to prefixes. :func:`analyzer.cache.kernels.s3fifo_sim` is the compiled twin.
"""

from __future__ import annotations

from collections import OrderedDict, deque


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
