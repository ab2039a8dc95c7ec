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
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence

import numpy as np
from numba import njit

_INF = np.iinfo(np.int64).max
# Measured per node of a chat log's tree on CPython 3.11 (tests/test_radix.py checks the
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
    """Token LCP of each request with any earlier one, for requests added in any order."""

    def __init__(self) -> None:
        self.tree = TokenRadix()
        self._ends: list[Node] = []

    def __len__(self) -> int:
        return len(self._ends)

    def memory_bytes(self) -> int:
        """About what the tree holds, from quantities that do not depend on how the
        requests were inserted (whole or continuing a recalled prefix, which can leave
        a node more or less): its tokens (4 bytes each), two nodes a request (a chat
        turn makes about that: where its new messages start and its leaf) and the end
        list. A conversion compares it to ``--exact-max-mib``, so the choice is the same
        in one process and over parallel workers."""
        return self.tree._bytes + (2 * NODE_OVERHEAD_BYTES + 8) * len(self._ends)

    def add(self, tokens: Sequence[int] | np.ndarray) -> int:
        """Insert one request's prompt tokens; returns its index (0, 1, ...)."""
        return self.end(self.tree.insert(tokens))

    def extend(self, at: Node | None, tokens: np.ndarray) -> Node:
        """The node where ``at``'s sequence (the root's when None) followed by ``tokens`` ends.

        A request built from a known prefix inserts only its new tokens, then
        :meth:`end` records it.
        """
        return self.tree.insert(tokens, at=at) if tokens.size else (at or self.tree.root)

    def end(self, node: Node) -> int:
        """Record a request whose prompt ends at ``node``; returns its index (0, 1, ...)."""
        self._ends.append(node)
        return len(self._ends) - 1

    def finish(self, rank: np.ndarray) -> np.ndarray:
        """LCP per request (index order); ``rank[i]`` is request ``i``'s arrival rank.

        The tree is flattened breadth-first (a parent before its children) into parent and
        depth arrays; the rank bookkeeping and the walks up run compiled (:func:`_lcp`).
        """
        rank = np.asarray(rank, dtype=np.int64)
        assert rank.size == len(self._ends)
        root = self.tree.root
        root.index = 0
        nodes, parent, depth = [root], array("q", [-1]), array("q", [0])
        i = 0
        while i < len(nodes):
            n, d = nodes[i], depth[i]
            for c in n.children.values():
                c.index = len(nodes)
                nodes.append(c)
                parent.append(i)
                depth.append(d + len(c.edge) // 4)
            i += 1
        ends = np.fromiter((n.index for n in self._ends), dtype=np.int64, count=len(self._ends))
        return _lcp(
            np.frombuffer(parent, dtype=np.int64), np.frombuffer(depth, dtype=np.int64), ends, rank
        )


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
