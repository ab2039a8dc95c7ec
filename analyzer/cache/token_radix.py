"""Token-exact compressed radix tree, and the arrival-order LCP built on it.

:class:`TokenRadix` holds token sequences; a node's edge is compact ``bytes`` of
little-endian uint32 ids (never a Python list of ints) and its children are keyed by their first token, as
in SGLang's radix cache. Inserting a sequence that diverges inside an edge splits the
edge; the existing node keeps the lower half, so a node handed out by :meth:`insert`
stays the end node of its sequence forever. Eviction removes least recently used leaves
only (a prefix is never dropped before its extensions).

:class:`ArrivalLCP` answers "longest common prefix, in tokens, with any earlier request"
for requests added in any order: every request ends at a node, the requests sharing a
prefix with request ``r`` are exactly those ending under the node where that prefix ends,
so after all insertions one post-order pass gives each node the two smallest arrival
ranks beneath it, and ``r``'s LCP is the depth of its deepest ancestor (or itself) that
holds an earlier request. Rows may therefore be inserted in file order and sorted later.
It holds the same tree in flat arrays, built by compiled code: a conversion keeps it
for hundreds of thousands of requests, where Python objects cost five times the memory
and leave it fragmented once dropped.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence

import numpy as np
from numba import njit

from analyzer.dense import fib_slot

_INF = np.iinfo(np.int64).max
# Measured per node of a chat log's tree on CPython 3.11 (tests/cache/test_radix.py checks the
# estimate against tracemalloc): the Node with its slots, its children dict and the
# edge's ``bytes`` header.
NODE_OVERHEAD_BYTES = 400


class Node:
    __slots__ = ("children", "edge", "index", "last_access", "parent")

    def __init__(self, edge: bytes, parent: Node | None) -> None:
        self.edge = edge  # token ids as little-endian uint32 bytes
        self.parent = parent
        self.children: dict[bytes, Node] = {}  # keyed by the first token's 4 bytes
        self.last_access = 0.0
        self.index = -1  # position in ArrivalLCP.finish's flat arrays

    @property
    def tokens(self) -> np.ndarray:
        return np.frombuffer(self.edge, dtype="<u4")


def _as_bytes(tokens: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(tokens, dtype="<u4").tobytes()


def _common(edge: bytes, buf: bytes, pos: int) -> int:
    """Bytes of ``edge`` that match ``buf`` from ``pos``, in whole tokens."""
    if buf.startswith(edge, pos):  # the usual case: the whole edge matches (a memcmp)
        return len(edge)
    m = min(len(edge), len(buf) - pos) // 4
    a = np.frombuffer(edge, dtype="<u4", count=m)
    b = np.frombuffer(buf, dtype="<u4", count=m, offset=pos)
    neq = np.flatnonzero(a != b)
    return 4 * (int(neq[0]) if neq.size else m)


class TokenRadix:
    """Compressed radix tree over token ids; ``len()`` is the number of tokens stored.

    Edges are immutable ``bytes`` of little-endian uint32 ids (4 bytes a token, no
    per-token objects); a whole-edge match is one ``startswith`` on the query's bytes.
    """

    def __init__(self, capacity_tokens: int | None = None) -> None:
        self.root = Node(b"", None)
        self.capacity_tokens = capacity_tokens
        self._bytes = 0
        self.n_nodes = 1

    def memory_bytes(self) -> int:
        """About what the tree holds in memory: its edges' bytes plus a node's overhead
        (the object, its children dict and edge ``bytes`` header) per node."""
        return self._bytes + NODE_OVERHEAD_BYTES * self.n_nodes

    def __len__(self) -> int:
        return self._bytes // 4

    def match(self, tokens: Sequence[int] | np.ndarray) -> int:
        """Number of leading tokens of ``tokens`` present in the tree; no side effects."""
        buf = _as_bytes(tokens)
        node, pos = self.root, 0
        while pos < len(buf):
            child = node.children.get(buf[pos : pos + 4])
            if child is None:
                break
            ln = _common(child.edge, buf, pos)
            pos += ln
            if ln < len(child.edge):
                break
            node = child
        return pos // 4

    def insert(
        self, tokens: Sequence[int] | np.ndarray, now: float = 0.0, at: Node | None = None
    ) -> Node:
        """Add ``tokens``; returns the node where the sequence ends (its own node).

        With ``at`` (a node this tree handed out), ``tokens`` continue the sequence that
        ends there, so a resent prefix is not walked again; the nodes above ``at`` keep
        their ``last_access``.
        """
        buf = _as_bytes(tokens)
        node, pos = at or self.root, 0
        node.last_access = now
        while pos < len(buf):
            first = buf[pos : pos + 4]
            child = node.children.get(first)
            if child is None:
                leaf = Node(buf[pos:], node)
                leaf.last_access = now
                node.children[first] = leaf
                self._bytes += len(leaf.edge)
                self.n_nodes += 1
                node = leaf
                break
            ln = _common(child.edge, buf, pos)
            if ln < len(child.edge):  # split: `mid` takes the shared head
                mid = Node(child.edge[:ln], node)
                self.n_nodes += 1
                mid.last_access = now
                node.children[first] = mid
                child.edge = child.edge[ln:]
                child.parent = mid
                mid.children[child.edge[:4]] = child
                child = mid
            child.last_access = now
            node = child
            pos += ln
        if self.capacity_tokens is not None and len(self) > self.capacity_tokens:
            self.evict(len(self) - self.capacity_tokens, protect=node)
        return node

    def evict(self, n_tokens: int, protect: Node | None = None) -> int:
        """Remove least recently used leaves until ``n_tokens`` are freed; returns freed."""
        guarded = set()
        p = protect
        while p is not None:
            guarded.add(id(p))
            p = p.parent
        heap: list[tuple[float, int, Node]] = []
        stack = [self.root]
        seq = 0
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root and id(n) not in guarded:
                heap.append((n.last_access, seq, n))
                seq += 1
            stack.extend(n.children.values())
        heapq.heapify(heap)
        freed = 0
        while heap and freed < n_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.edge[:4]]
            freed += len(leaf.edge) // 4
            self._bytes -= len(leaf.edge)
            self.n_nodes -= 1
            if parent is not self.root and not parent.children and id(parent) not in guarded:
                heapq.heappush(heap, (parent.last_access, seq, parent))
                seq += 1
        return freed


class ArrivalLCP:
    """Token LCP of each request with any earlier one, for requests added in any order.

    The same compressed radix tree as :class:`TokenRadix` (an edge per node, children by
    their first token, a diverging insert splits an edge and the existing node keeps the
    lower half), held in flat arrays and walked compiled (:func:`_insert`): the tokens
    of all edges one after the other (an edge is a range of them; a split shares it),
    per node its edge's start and length, its parent and its depth, and an
    open-addressing table from (parent, first token) to child that stores only node ids
    (the key is read back from the child). A node costs about :data:`NODE_BYTES` instead
    of a Python object, a dict and a ``bytes`` (about 400 bytes), and dropping the tree
    returns whole arrays to the system rather than leaving a heap full of holes. Nodes
    are ints, the root 0.
    """

    root = 0
    initial_tokens = 1 << 16  # first capacities; each doubles when full
    initial_nodes = 1 << 10

    def __init__(self, reserve_tokens: int = 0) -> None:
        """``reserve_tokens``: room for that many tokens from the start (a conversion
        reserves its bound's worth). Only the pages written are held (the array is
        mapped, not filled), and the token array then never grows by a copy, which for a
        moment holds it twice (256 MiB more at the last doubling under a 320 MiB bound)."""
        n = self.initial_nodes
        reserve = min(max(reserve_tokens, self.initial_tokens), MAX_RESERVED_TOKENS)
        self._tok = np.empty(reserve, dtype=np.uint32)
        self._start = np.zeros(n, dtype=np.int64)
        self._len = np.zeros(n, dtype=np.int32)
        self._parent = np.full(n, -1, dtype=np.int32)
        self._depth = np.zeros(n, dtype=np.int32)
        self._table = np.full(2 * n, _NO_NODE, dtype=np.int32)
        self._count = np.array([1, 0, 0], dtype=np.int64)  # nodes (the root), tokens, keys
        self._ends = array("q")

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def n_tokens(self) -> int:
        """Tokens stored: the distinct prefixes of the requests added (one per token)."""
        return int(self._count[1])

    @property
    def n_nodes(self) -> int:
        return int(self._count[0])

    def memory_bytes(self) -> int:
        """About what the tree holds, from quantities that do not depend on how the
        requests were inserted (whole or continuing a recalled prefix, which can leave
        a node more or less): its tokens (4 bytes each), two nodes a request (a chat
        turn makes about that: where its new messages start and its leaf) and the end
        list. A conversion compares it to ``--exact-max-mib``, so the choice is the same
        in one process and over parallel workers."""
        return 4 * self.n_tokens + (2 * NODE_BYTES + 8) * len(self._ends)

    def held_bytes(self) -> int:
        """What the arrays hold in memory now: the tokens and nodes in use (pages of an
        array grown by doubling are touched only as they fill), the whole table."""
        nodes, tokens, _ = self._count
        per_node = sum(a.itemsize for a in (self._start, self._len, self._parent, self._depth))
        return int(4 * tokens + per_node * nodes + self._table.nbytes + 8 * len(self._ends))

    def _room(self, n: int) -> None:
        """Capacity for one insert of ``n`` tokens: it adds at most two nodes (a split
        and a leaf) and two table entries."""
        nodes, tokens, keys = (int(x) for x in self._count)
        if tokens + n > self._tok.size:
            grown = np.empty(max(2 * self._tok.size, tokens + n), dtype=np.uint32)
            grown[:tokens] = self._tok[:tokens]
            self._tok = grown
        if nodes + 2 > self._start.size:
            for name in ("_start", "_len", "_parent", "_depth"):
                old = getattr(self, name)
                grown = np.empty(2 * old.size, dtype=old.dtype)
                grown[:nodes] = old[:nodes]
                setattr(self, name, grown)
        if 2 * (keys + 2) > self._table.size:  # at most half full
            bits = self._table.size.bit_length()  # twice the slots
            self._table = _rehash(self._tok, self._start, self._parent, nodes, bits)

    def extend(self, at: int | None, tokens: np.ndarray) -> int:
        """The node where ``at``'s sequence (the root's when None) followed by ``tokens`` ends.

        A request built from a known prefix inserts only its new tokens, then
        :meth:`end` records it.
        """
        at = at or 0
        if not tokens.size:
            return at
        tokens = np.ascontiguousarray(tokens, dtype=np.uint32)
        self._room(tokens.size)
        return int(
            _insert(
                self._tok,
                self._start,
                self._len,
                self._parent,
                self._depth,
                self._table,
                self._table.size.bit_length() - 1,
                self._count,
                at,
                tokens,
            )
        )

    def add(self, tokens: Sequence[int] | np.ndarray) -> int:
        """Insert one request's prompt tokens; returns its index (0, 1, ...)."""
        return self.end(self.extend(None, np.asarray(tokens, dtype=np.uint32)))

    def end(self, node: int) -> int:
        """Record a request whose prompt ends at ``node``; returns its index (0, 1, ...)."""
        self._ends.append(node)
        return len(self._ends) - 1

    def finish(self, rank: np.ndarray) -> np.ndarray:
        """LCP per request (index order); ``rank[i]`` is request ``i``'s arrival rank.

        Nodes are renumbered by depth (a child is deeper than its parent, so parents come
        first) for the compiled rank bookkeeping and walks up (:func:`_lcp`).
        """
        rank = np.asarray(rank, dtype=np.int64)
        assert rank.size == len(self._ends)
        n = self.n_nodes
        depth = self._depth[:n].astype(np.int64)
        order = np.argsort(depth, kind="stable")  # the root (depth 0) first
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        parent = self._parent[:n].astype(np.int64)[order]
        parent[1:] = pos[parent[1:]]
        ends = pos[np.frombuffer(self._ends, dtype=np.int64)]
        return _lcp(parent, depth[order], ends, rank)


# The most tokens an ArrivalLCP reserves up front (4 GiB of address space); past it the
# array grows by doubling.
MAX_RESERVED_TOKENS = 1 << 30
# Bytes a node of :class:`ArrivalLCP` holds: its start, length, parent and depth (20)
# and its table slot, 4 bytes at a table between a quarter and half full (8 to 16).
NODE_BYTES = 36
_NO_NODE = -1


@njit(cache=True, inline="always")
def _find(
    table: np.ndarray,
    bits: int,
    tok: np.ndarray,
    start: np.ndarray,
    parent: np.ndarray,
    node: int,
    token: np.uint32,
) -> np.int64:
    """The slot holding ``node``'s child that starts with ``token``, or the empty slot
    where it goes (``2**bits`` slots, linear probing on the key (node, token) hashed as
    :mod:`analyzer.dense` hashes; a child's key is read back from its parent and first
    token)."""
    mask = table.size - 1
    s = fib_slot((np.uint64(node) << np.uint64(32)) | np.uint64(token), np.uint64(64 - bits))
    while True:
        c = table[s]
        if c == _NO_NODE or (parent[c] == node and tok[start[c]] == token):
            return s
        s = (s + 1) & mask


@njit(cache=True)
def _rehash(
    tok: np.ndarray, start: np.ndarray, parent: np.ndarray, nodes: int, bits: int
) -> np.ndarray:
    """A table of ``2**bits`` slots holding every node but the root."""
    table = np.full(1 << bits, _NO_NODE, dtype=np.int32)
    for c in range(1, nodes):
        table[_find(table, bits, tok, start, parent, parent[c], tok[start[c]])] = c
    return table


@njit(cache=True)
def _insert(
    tok: np.ndarray,
    start: np.ndarray,
    length: np.ndarray,
    parent: np.ndarray,
    depth: np.ndarray,
    table: np.ndarray,
    bits: int,
    count: np.ndarray,
    at: int,
    q: np.ndarray,
) -> int:
    """Insert ``q`` below node ``at``; returns the node where it ends. ``count`` holds
    (nodes, tokens, keys) and is updated; the caller made room (:meth:`ArrivalLCP._room`)."""
    node = at
    pos = 0
    n = q.size
    while pos < n:
        s = _find(table, bits, tok, start, parent, node, q[pos])
        child = table[s]
        if child == _NO_NODE:  # a new leaf holding the rest of q
            leaf = count[0]
            t = count[1]
            tok[t : t + n - pos] = q[pos:]
            start[leaf], length[leaf] = t, n - pos
            parent[leaf], depth[leaf] = node, depth[node] + n - pos
            table[s] = leaf
            count[0] += 1
            count[1] += n - pos
            count[2] += 1
            return int(leaf)
        a, e = start[child], length[child]
        lim = min(e, n - pos)
        m = 1  # the first token matched through the table
        while m < lim and tok[a + m] == q[pos + m]:
            m += 1
        if m < e:  # split: ``mid`` takes the shared head and the child's slot
            mid = count[0]
            start[mid], length[mid] = a, m
            parent[mid], depth[mid] = node, depth[node] + m
            table[s] = mid
            start[child], length[child], parent[child] = a + m, e - m, mid
            table[_find(table, bits, tok, start, parent, mid, tok[a + m])] = child
            count[0] += 1
            count[2] += 1
            child = mid
        node = child
        pos += m
    return node


@njit(cache=True, inline="always")
def _keep_two_smallest(m1: np.ndarray, m2: np.ndarray, v: int, r: int) -> None:
    """Node ``v``'s two smallest ranks (``m1 <= m2``) with rank ``r`` added."""
    if r < m1[v]:
        m1[v], m2[v] = r, m1[v]
    elif r < m2[v]:
        m2[v] = r


@njit(cache=True)
def _lcp(parent: np.ndarray, depth: np.ndarray, ends: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Each node's two smallest arrival ranks at or below it; then for request ``i`` the
    depth of its deepest ancestor (itself included) holding a rank smaller than its own.
    """
    m1 = np.full(parent.size, _INF, dtype=np.int64)
    m2 = np.full(parent.size, _INF, dtype=np.int64)
    for i in range(ends.size):
        _keep_two_smallest(m1, m2, ends[i], rank[i])
    for v in range(parent.size - 1, 0, -1):  # children come after their parent
        _keep_two_smallest(m1, m2, parent[v], m1[v])
        _keep_two_smallest(m1, m2, parent[v], m2[v])
    out = np.zeros(ends.size, dtype=np.int64)
    for i in range(ends.size):
        r, p = rank[i], ends[i]
        while p >= 0:
            other = m2[p] if m1[p] == r else m1[p]
            if other < r:
                out[i] = depth[p]
                break
            p = parent[p]
    return out


def lcp_reference(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Oracle: LCP of each prompt with any earlier one, by brute force."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            n = 0
            while n < min(len(p), len(q)) and p[n] == q[n]:
                n += 1
            best = max(best, n)
        out.append(best)
    return out
