"""Prefix caches over chained block ids, with leaf-only eviction.

:class:`BlockRadix` is the cache paged engines keep (vLLM, SGLang with page size > 1,
LMCache, Mooncake): a tree whose nodes are dense block ids from
:class:`analyzer.trace.BlockTrace`. Block hashes are chained, so a block's parent is
the block before it in any request that holds it, and every path from the root is a
prompt prefix. The tree stays *prefix-closed*: a block is only ever evicted when none
of its children is cached, because a child's KV is useless without its parent's.

Eviction order is the policy's sort key over the current leaves, smallest first. A
policy is a tiny class returning that key (:class:`LRU`, :class:`FIFO`), chosen once at
construction, as SGLang's ``evict_policy.py`` does. Ties are broken by a per-cache
sequence number and then by block id, so replays are deterministic. Leaves sit in a
heap with lazy invalidation (an entry is live while its node's ``version`` is
unchanged), so insert, touch and evict cost O(log n) per block.

A cache built with ``chained=True`` is told that every chain it is given is a path of
the tree (block ``j``'s parent is block ``j - 1``, as chained hashes make it; the replay
checks its trace once, :func:`analyzer.replay.engine.is_chained`). It then answers
the same, with less work per block: :meth:`BlockRadix.match` bisects the chain (a
cached block's prefix is cached, so "cached" is true up to the match and false after),
the blocks after the match are new without looking, and a touch records the chain's
time on its last block alone: a tail-first touch gives each block one more sequence
number than its child, so an inner node's ``last_access`` and ``touch_seq`` are those of
its most recently touched child's, plus one, or of a chain that ended at it, whichever is
later. They are brought up to date from each child as it goes, and are exact whenever
the node is a leaf, the only time its policy key is read.

``now`` is the caller's clock (trace time, or a request index); the cache never reads
the wall clock. ``TokenRadix`` (token-exact, SGLang RadixAttention with page size 1)
lives in :mod:`analyzer.cache.token_radix`; the policies by name are registered in
:mod:`analyzer.cache.policies`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

ROOT = -1  # parent of the first block of every request


@dataclass(slots=True)
class Node:
    """One cached block. ``children`` counts cached children only.

    In a ``chained`` cache an inner node's ``last_access`` and ``touch_seq`` may lag
    (they are brought up to date as its children go); they are exact for a leaf."""

    parent: int
    children: int
    last_access: float
    inserted_at: float
    touch_seq: int  # global sequence of the last touch (tail-first within a request)
    insert_seq: int  # global sequence of creation
    rank: float = 0.0  # caller-given priority, e.g. the next use for Belady (FarthestRank)
    # Set to a fresh sequence number whenever the key or the leaf status changes, so a
    # heap entry is live only while (block, version) still matches, even across re-inserts.
    version: int = 0


class Policy:
    """Eviction order: the cached leaf with the smallest ``key`` goes first."""

    name = "policy"
    # True for a policy that orders leaves by the caller-given ``rank`` (the next use):
    # the simulations then pass next uses in and let it evict the arriving blocks too.
    needs_next_use = False

    def key(self, node: Node) -> tuple[float, ...]:  # pragma: no cover - interface
        raise AssertionError("subclasses define key()")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LRU(Policy):
    """Least recently used leaf first.

    Within one request blocks are touched tail-first (block 0 last, as vLLM frees them),
    so with a monotonic clock this is exactly a plain LRU over blocks: the least
    recently used block never has a cached child.
    """

    name = "lru"

    def key(self, node: Node) -> tuple[float, ...]:
        return (node.last_access, node.touch_seq)


class FIFO(Policy):
    """Oldest inserted leaf first; hits do not refresh a block."""

    name = "fifo"

    def key(self, node: Node) -> tuple[float, ...]:
        return (node.inserted_at, node.insert_seq)


class FarthestRank(Policy):
    """Largest caller-given ``rank`` first (Belady when rank is the next use).

    With ``rank`` = the index of the next request that needs the block, a parent is
    never needed later than its child, so the farthest-next-use block can always be
    found among the leaves: leaf-only eviction loses nothing against plain Belady MIN.
    Ties go to the most recently inserted block.
    """

    name = "optimal"
    needs_next_use = True

    def key(self, node: Node) -> tuple[float, ...]:
        return (-node.rank, -node.insert_seq)


class BlockCache(Protocol):
    """What the replay asks of a tier's block cache: :class:`BlockRadix`, or its compiled
    twin for chained LRU and FIFO caches (:class:`~analyzer.cache.array_radix.ArrayRadix`)."""

    @property
    def capacity_blocks(self) -> int | None: ...

    @property
    def policy(self) -> Policy: ...

    def __len__(self) -> int: ...

    def __contains__(self, block_id: object) -> bool: ...

    def match(self, blocks: Sequence[int]) -> int: ...

    def insert(
        self, blocks: Sequence[int], now: float, ranks: Sequence[float] | None = None
    ) -> list[int]: ...

    def insert_ints(self, chain: list[int], now: float) -> list[int]: ...

    def write(self, chain: list[int], now: float) -> tuple[int, list[int]]: ...

    def touch_prefix(self, chain: list[int], n: int, now: float) -> None: ...

    def write_through(self, chain: list[int], now: float) -> int: ...

    def evict(self, n_blocks: int, pinned: Collection[int] | None = None) -> list[int]: ...

    # what an engine's running requests hold (the aggregated replay's HBM)
    @property
    def n_held(self) -> int: ...

    def hold(self, chain: list[int], lo: int, hi: int) -> None: ...

    def insert_held(self, chain: list[int], lo: int, now: float) -> None: ...

    def unheld(self, chain: list[int], m: int) -> int: ...

    def release(self, chain: list[int], n: int, now: float) -> None: ...

    def evict_unheld(self, n_blocks: int) -> list[int]: ...


def weighted_match_of(
    top: BlockCache | None,
    w0: float,
    lower: Sequence[tuple[BlockCache, float]],
    blocks: Any,
) -> float:
    """Blocks of ``blocks`` found in a row in ``top`` then the ``lower`` caches, each
    weighted by the nearest holding it (``w0`` for ``top``, each lower cache its own): a
    tier-scoring router's credit, one match per cache (the compiled caches' twin, for
    many engines at once, is :class:`analyzer.cache.array_radix.CreditBoard`). ``blocks`` as the caches take
    them: a list of ids, or for the compiled caches an int64 array."""
    m = top.match(blocks) if top is not None else 0
    credit = float(m) * w0
    for cache, w in lower:
        mt = cache.match(blocks)
        if mt > m:
            credit += w * (mt - m)
            m = mt
    return credit


class BlockRadix:
    """A prefix-closed block cache with ``capacity_blocks`` slots (None = unbounded)."""

    def __init__(
        self, capacity_blocks: int | None, policy: Policy | None = None, chained: bool = False
    ) -> None:
        assert capacity_blocks is None or capacity_blocks >= 0
        self._capacity = capacity_blocks
        self._policy = policy if policy is not None else LRU()
        self._key = _key_function(self._policy)
        # Heap entries are (key, block, version), or for a two-field key (_FIELD_KEYS)
        # the same flattened, (field, field, block, version): the same order, each
        # comparison one tuple deep. ``_at`` is the block's index in an entry.
        self._flat = type(self._policy).key in _FIELD_KEYS
        self._at = 2 if self._flat else 1
        self._chained = chained
        self._nodes: dict[int, Node] = {}
        self._heap: list[tuple[Any, ...]] = []
        self._seq = 0
        self._held: dict[int, int] = {}  # block -> holds on it (running requests)

    # -- queries ---------------------------------------------------------------------

    @property
    def capacity_blocks(self) -> int | None:
        return self._capacity

    @property
    def policy(self) -> Policy:
        return self._policy

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._nodes

    def __iter__(self) -> Iterator[int]:
        return iter(self._nodes)

    def parent(self, block_id: int) -> int:
        """The cached parent of ``block_id`` (ROOT for a first block)."""
        return self._nodes[block_id].parent

    def is_leaf(self, block_id: int) -> bool:
        return self._nodes[block_id].children == 0

    def match(self, blocks: Sequence[int]) -> int:
        """Number of leading ``blocks`` present in the cache; changes nothing."""
        nodes = self._nodes
        if self._chained:
            return _bisect_cached(blocks, nodes)
        n = 0
        for b in blocks:  # an integer's hash is its int's (numpy's too): no int() per block
            if b not in nodes:
                break
            n += 1
        return n

    # -- updates ---------------------------------------------------------------------

    def insert(
        self, blocks: Sequence[int], now: float, ranks: Sequence[float] | None = None
    ) -> list[int]:
        """Cache ``blocks`` (one request's chain), touch them all, evict leaves to fit.

        Blocks already present keep the parent they were first inserted with (chained
        hashes make it unique). A chain longer than the capacity is cached up to the
        capacity, which is what a plain LRU over tail-first touches keeps too. The
        request's own blocks are never evicted to make room for each other. Returns the
        evicted ids in eviction order. ``ranks`` (one per block) sets each block's
        ``rank`` before it is touched, for rank-keyed policies such as FarthestRank.
        """
        chain = [int(b) for b in blocks]
        if self._capacity is not None and len(chain) > self._capacity:
            chain = chain[: self._capacity]
        start = _bisect_cached(chain, self._nodes) if self._chained else 0
        return self._insert(chain, start, now, ranks)

    def insert_ints(self, chain: list[int], now: float) -> list[int]:
        """:meth:`insert` of a list of Python ints (a replay's), without converting it."""
        if self._capacity is not None and len(chain) > self._capacity:
            chain = chain[: self._capacity]
        start = _bisect_cached(chain, self._nodes) if self._chained else 0
        return self._insert(chain, start, now, None)

    def write(self, chain: list[int], now: float) -> tuple[int, list[int]]:
        """A write-through of one request's ``chain`` (a list of ints): the number of its
        leading blocks cached before (:meth:`match`), and the blocks evicted. When some
        are missing it is :meth:`insert`; when all are cached nothing changes (a write
        of blocks the cache holds does not refresh them). One walk of the chain where
        ``match`` then ``insert`` take two: this is the replay's hottest call."""
        nodes = self._nodes
        if self._chained:
            m = _bisect_cached(chain, nodes)
        else:
            m = 0
            for b in chain:
                if b not in nodes:
                    break
                m += 1
        if m == len(chain):
            return m, []
        if self._capacity is not None and len(chain) > self._capacity:
            chain = chain[: self._capacity]
        return m, self._insert(chain, m, now, None)

    def _insert(
        self, chain: list[int], start: int, now: float, ranks: Sequence[float] | None
    ) -> list[int]:
        """:meth:`insert` of ``chain`` (ints, within capacity) whose first ``start``
        blocks are known to be cached."""
        nodes = self._nodes
        parent = chain[start - 1] if 0 < start <= len(chain) else ROOT
        seq = self._seq
        if self._chained:  # chain[start] is not cached, so neither is any block after it
            if start < len(chain):
                if parent != ROOT:
                    p = nodes[parent]
                    p.children += 1
                    p.version = seq + 1  # no longer a leaf: its heap entry dies
                for b in chain[start:] if start else chain:
                    seq += 1
                    nodes[b] = Node(parent, 1, now, now, seq, seq)
                    parent = b
                nodes[parent].children = 0
        else:
            for b in chain[start:] if start else chain:
                if b not in nodes:
                    seq += 1
                    nodes[b] = Node(parent, 0, now, now, seq, seq)
                    if parent != ROOT:
                        p = nodes[parent]
                        p.children += 1
                        p.version = seq  # no longer a leaf: its heap entry dies
                parent = b
        self._seq = seq
        if ranks is not None:
            for b, rank in zip(chain, ranks, strict=False):
                nodes[b].rank = float(rank)
        self._touch_chain(chain, now)
        if self._capacity is None or len(nodes) <= self._capacity:
            return []
        # In a chained cache every block of the chain but the last has a cached child,
        # so the last is the only one that eviction could reach.
        protect = {chain[-1]} if self._chained and chain else set(chain)
        return self._evict(len(nodes) - self._capacity, protect=protect)

    def write_through(self, chain: list[int], now: float) -> int:
        """:meth:`write` for a caller that drops what it evicts: the number of
        ``chain``'s leading blocks cached before."""
        return self.write(chain, now)[0]

    def touch(self, blocks: Sequence[int], now: float) -> None:
        """Mark the cached ones among ``blocks`` as used at ``now`` (tail-first)."""
        self._touch_chain([int(b) for b in blocks if int(b) in self._nodes], now)

    def touch_prefix(self, chain: list[int], n: int, now: float) -> None:
        """:meth:`touch` of ``chain[:n]``, a list of ints known to be cached (``n`` is
        at most :meth:`match` of it)."""
        self._touch_chain(chain[:n], now)

    def evict(self, n_blocks: int, pinned: Container[int] | None = None) -> list[int]:
        """Evict up to ``n_blocks`` leaves in policy order; returns them in that order.

        ``pinned``: blocks in use that may not go (an engine's running requests hold
        theirs). A pinned leaf is passed over and leaves the eviction order; the caller
        touches it again (:meth:`touch_prefix`) when it unpins it, which puts it back.
        A pinned block's ancestors are never leaves, so pinning a chain's last block is
        enough to keep the chain."""
        return self._evict(n_blocks, protect=None, pinned=pinned)

    # -- holds: the blocks of running requests ---------------------------------------

    @property
    def n_held(self) -> int:
        """Blocks with a hold on them."""
        return len(self._held)

    def hold(self, chain: Sequence[int], lo: int, hi: int) -> None:
        """One more hold on each of ``chain[lo:hi]``, cached blocks (a running request
        holds its cached prefix: SGLang's lock on in-use radix nodes)."""
        held = self._held
        for b in chain[lo:hi]:
            held[b] = held.get(b, 0) + 1

    def insert_held(self, chain: list[int], lo: int, now: float) -> None:
        """:meth:`insert_ints` of ``chain``, then :meth:`hold` of ``chain[lo:]`` (blocks a
        running request computed: cached, and held by it)."""
        self.insert_ints(chain, now)
        self.hold(chain, lo, len(chain))

    def unheld(self, chain: Sequence[int], m: int) -> int:
        """How many of ``chain[:m]``, cached blocks, no hold is on."""
        held = self._held
        return sum(1 for b in chain[:m] if b not in held)

    def release(self, chain: list[int], n: int, now: float) -> None:
        """One hold fewer on each of ``chain[:n]``, then :meth:`touch_prefix` of them
        (a leaf passed over while held goes back into the order)."""
        held = self._held
        for b in chain[:n]:
            c = held[b] - 1
            if c:
                held[b] = c
            else:
                del held[b]
        self.touch_prefix(chain, n, now)

    def evict_unheld(self, n_blocks: int) -> list[int]:
        """:meth:`evict` passing over the held blocks."""
        return self._evict(n_blocks, protect=None, pinned=self._held)

    def remove(self, block_ids: Iterable[int]) -> None:
        """Drop the given cached blocks (absent ids are ignored).

        Refused (ValueError) when a block would be left cached without its parent:
        remove a subtree together, or evict leaves instead.
        """
        nodes = self._nodes
        gone = {int(b) for b in block_ids if int(b) in nodes}
        inner: dict[int, int] = {}
        for b in gone:
            p = nodes[b].parent
            if p in gone:
                inner[p] = inner.get(p, 0) + 1
        orphans = sorted(b for b in gone if nodes[b].children != inner.get(b, 0))
        if orphans:
            raise ValueError(f"blocks {orphans[:5]} still have cached children")
        left = dict(inner)  # each block's children still to go
        ready = sorted(b for b in gone if not left.get(b))
        while ready:  # children first: in a chained cache each passes its touch on
            nxt = []
            for b in ready:
                node = nodes.pop(b)
                p = node.parent
                if p == ROOT:
                    continue
                if self._chained:
                    self._inherit(nodes[p], node)
                if p in gone:
                    left[p] -= 1
                    if not left[p]:
                        nxt.append(p)
                else:
                    self._lose_child(p)
            ready = sorted(nxt)

    # -- internals -------------------------------------------------------------------

    def _touch_chain(self, chain: list[int], now: float) -> None:
        nodes = self._nodes
        heap = self._heap
        key = self._key
        push = heapq.heappush
        seq = self._seq
        if self._chained:
            # The chain's last block gets the first of its len(chain) sequence numbers,
            # as a tail-first touch gives it; its ancestors' follow from it when they
            # become leaves (_inherit).
            if chain:
                b = chain[-1]
                node = nodes[b]
                node.last_access = now
                node.touch_seq = node.version = seq + 1
                if node.children == 0:
                    push(heap, self._entry(node, b, seq + 1))
            seq += len(chain)
        else:
            flat = self._flat
            for b in reversed(chain):  # tail first: block 0 ends up the most recent
                node = nodes[b]
                seq += 1
                node.last_access = now
                node.touch_seq = seq
                node.version = seq
                if node.children == 0:
                    push(heap, key(node) + (b, seq) if flat else (key(node), b, seq))  # noqa: RUF005 (faster than unpacking)
        self._seq = seq
        if len(heap) > 4 * len(nodes) + 64:
            self._rebuild_heap()

    @staticmethod
    def _inherit(p: Node, child: Node) -> None:
        """Bring ``p``'s touch up to its child's (chained caches): a tail-first touch of
        a chain through the child gave ``p`` the next sequence number."""
        if child.touch_seq >= p.touch_seq:
            p.last_access = child.last_access
            p.touch_seq = child.touch_seq + 1

    def _lose_child(self, parent: int) -> None:
        p = self._nodes[parent]
        p.children -= 1
        assert p.children >= 0
        if p.children == 0:
            self._seq += 1
            p.version = self._seq
            heapq.heappush(self._heap, self._entry(p, parent, p.version))

    def _entry(self, node: Node, block: int, version: int) -> tuple[Any, ...]:
        """The heap entry of leaf ``block``."""
        if self._flat:
            return self._key(node) + (block, version)  # noqa: RUF005 (faster than unpacking)
        return (self._key(node), block, version)

    def _evict(
        self, n_blocks: int, protect: set[int] | None, pinned: Container[int] | None = None
    ) -> list[int]:
        # The replay's hot loop (most of its time): lookups are hoisted, and a parent
        # that becomes a leaf and comes next in the order (the usual case: an evicted
        # chain goes leaf first, up to a block another chain shares) is evicted in the
        # inner loop without going through the heap; when another leaf comes first the
        # parent takes its place in the heap (heapreplace, what heappushpop does then).
        # Under LRU in a chained cache a parent that inherits its child's touch comes
        # next without comparing: its key, the child's plus one sequence number, is the
        # number the child's tail-first touch reserved for it, and every live leaf's key
        # is above the child's, so none lies between (the parent-touched-since test).
        nodes = self._nodes
        heap = self._heap
        pop = heapq.heappop
        push = heapq.heappush
        replace = heapq.heapreplace
        key = self._key
        flat = self._flat
        at = self._at
        seq = self._seq
        chained = self._chained
        walk = chained and type(self._policy).key is LRU.key
        out: list[int] = []
        append = out.append
        held: list[tuple[Any, ...]] = []
        need = n_blocks
        entry: tuple[Any, ...] | None
        while need > 0 and heap:
            entry = pop(heap)
            b = entry[at]
            node = nodes.get(b)
            if node is None or node.version != entry[at + 1] or node.children:
                continue  # stale
            while True:  # ``entry`` is the live leaf ``b``, the next in policy order
                if protect is not None and b in protect:
                    held.append(entry if entry is not None else self._entry(node, b, seq))
                    break
                if pinned is not None and b in pinned:
                    break  # out of the order until unpinned (see evict)
                del nodes[b]
                append(b)
                need -= 1
                parent = node.parent
                if parent == ROOT:
                    break
                p = nodes[parent]
                inherited = False
                if chained and node.touch_seq >= p.touch_seq:  # _inherit, inlined
                    p.last_access = node.last_access
                    p.touch_seq = node.touch_seq + 1
                    inherited = walk
                p.children -= 1
                if p.children:
                    break
                seq += 1  # the parent became a leaf
                p.version = seq
                if inherited and need:  # LRU: it is next (see above)
                    b = parent
                    node = p
                    entry = None
                    continue
                entry = key(p) + (parent, seq) if flat else (key(p), parent, seq)  # noqa: RUF005 (faster than unpacking)
                if not need:
                    push(heap, entry)
                    break
                if heap and heap[0] < entry:  # another leaf comes first
                    entry = replace(heap, entry)
                    b = entry[at]
                    node = nodes.get(b)
                    if node is None or node.version != entry[at + 1] or node.children:
                        break  # stale
                else:
                    b = parent
                    node = p
        self._seq = seq
        for e in held:
            push(heap, e)
        return out

    def _rebuild_heap(self) -> None:
        entry = self._entry
        self._heap = [entry(n, b, n.version) for b, n in self._nodes.items() if n.children == 0]
        heapq.heapify(self._heap)


# Policies whose key is a tuple of two Node fields, by their ``key`` function: the
# cache reads such a key with one C-level ``attrgetter`` (the same tuple, without a
# Python call per heap entry, which was a tenth of an aggregated replay's time). A
# subclass that overrides ``key`` is not in the table and keeps its own.
_FIELD_KEYS: dict[object, tuple[str, str]] = {
    LRU.key: ("last_access", "touch_seq"),
    FIFO.key: ("inserted_at", "insert_seq"),
}


def _key_function(policy: Policy) -> Callable[[Node], tuple[Any, ...]]:
    """``policy.key``, or an attrgetter returning the same tuple (:data:`_FIELD_KEYS`)."""
    fields = _FIELD_KEYS.get(type(policy).key)
    if fields is None:
        return policy.key
    getter: Callable[[Node], tuple[Any, ...]] = attrgetter(*fields)
    return getter


def _bisect_cached(chain: Sequence[int], nodes: dict[int, Node]) -> int:
    """How many leading blocks of ``chain`` (a path of the tree) are in ``nodes``: in a
    prefix-closed cache "cached" holds up to that point and not after, so bisect."""
    lo, hi = 0, len(chain)
    if hi == 0 or chain[0] not in nodes:
        return 0
    if chain[hi - 1] in nodes:
        return hi
    lo, hi = 1, hi - 1  # chain[lo - 1] cached, chain[hi] not
    while lo < hi:
        mid = (lo + hi) // 2
        if chain[mid] in nodes:
            lo = mid + 1
        else:
            hi = mid
    return lo


__all__ = [
    "FIFO",
    "LRU",
    "ROOT",
    "BlockCache",
    "BlockRadix",
    "FarthestRank",
    "Node",
    "Policy",
]
