"""Chained block hashes: deterministic, salted, full blocks only.

``h_k = blake2b(h_{k-1} || tokens of block k as little-endian uint32 || extra, digest_size=8,
key=salt)`` read as a little-endian uint64, with ``h_{-1}`` eight zero bytes. Equal ``h_k``
means equal prompts up to the end of block ``k`` (and equal extra keys: model or tenant
when they are made hash keys, so that they never share KV). ``content`` hashes are the
same function without the chain (``h_{-1}`` always zero): equal content hashes mean equal
tokens in that block wherever it sits, which measures reuse that is not a prefix.

With a token ratio ``F = served / counted`` (``--token-ratio``), block ``k`` covers the
counted tokens ``[floor(k*B/F), floor((k+1)*B/F))`` and a prompt of ``n`` counted tokens
has ``floor(n*F) // B`` blocks; ``F = 1`` is the plain ``[k*B, (k+1)*B)``.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from analyzer.blocks import blake2

ZERO = b"\x00" * 8


@dataclass(frozen=True, slots=True)
class ChainState:
    """Where the hashing of a prompt prefix stands, so a longer prompt can continue it."""

    hashes: np.ndarray  # uint64, chained hashes of the full blocks so far
    contents: np.ndarray  # uint64, unchained hashes of the same blocks
    tail: np.ndarray  # uint32 tokens after the last full block
    n_tokens: int  # counted tokens of the prefix
    last: int  # digest of the last full block as a uint64 (0 when none)
    anchor: object = None  # the caller's own place for this prefix (its radix node)

    def at(self, anchor: object) -> ChainState:
        """This state with the caller's ``anchor`` attached (kept in the memo with it)."""
        return ChainState(self.hashes, self.contents, self.tail, self.n_tokens, self.last, anchor)


def _ratio(token_ratio: float | Fraction) -> Fraction:
    r = Fraction(str(token_ratio)) if not isinstance(token_ratio, Fraction) else token_ratio
    r = r.limit_denominator(10_000)
    assert r > 0
    return r


class BlockHasher:
    """Hashes token sequences into chained block hashes, with a memo of prefix states.

    ``extend(state, tokens)`` continues a prefix; the caller names prefixes by a content
    key (:meth:`remember` / :meth:`recall`), so a conversation that resends its history
    hashes only its new blocks. The memo is an LRU bounded by stored hashes.
    """

    def __init__(
        self,
        block_size: int,
        salt: bytes,
        token_ratio: float | Fraction = 1,
        memo_max_hashes: int = 4_000_000,
        compiled: bool = True,
    ) -> None:
        assert block_size >= 1
        self.block_size = block_size
        self.salt = salt
        self.ratio = _ratio(token_ratio)
        # Plain ints for the hot path (Fraction arithmetic is slow).
        self._num, self._den = self.ratio.numerator, self.ratio.denominator
        self._unit = self._num == self._den
        # One compiled call hashes all new blocks of a prompt (blake2.py says why);
        # hashlib computes the same digests where that path cannot run.
        self._compiled = blake2.available() and compiled
        if self._compiled:
            self._start, self._counted = blake2.keyed_state(salt)
        self._extras: dict[bytes, np.ndarray] = {}
        self._base = hashlib.blake2b(digest_size=8, key=salt)
        # Keys are in-memory content addresses chosen by the caller (never persisted).
        self._memo: OrderedDict[Hashable, ChainState] = OrderedDict()
        self._memo_hashes = 0
        self.memo_max_hashes = memo_max_hashes
        self.blocks_hashed = 0

    # Block k covers counted tokens [bound(k), bound(k + 1)).
    def bound(self, k: int) -> int:
        if self._unit:
            return k * self.block_size
        return (k * self.block_size * self._den) // self._num

    def served_tokens(self, n_counted: int) -> int:
        if self._unit:
            return n_counted
        return (n_counted * self._num) // self._den

    def n_blocks(self, n_counted: int) -> int:
        return self.served_tokens(n_counted) // self.block_size

    def empty(self) -> ChainState:
        e = np.empty(0, dtype=np.uint64)
        return ChainState(e, e, np.empty(0, dtype=np.uint32), 0, 0)

    def extend(self, state: ChainState, tokens: np.ndarray, extra: bytes = b"") -> ChainState:
        n_total = state.n_tokens + int(tokens.size)
        k0 = int(state.hashes.size)
        k1 = self.n_blocks(n_total)
        if k1 == k0:
            tail = np.concatenate((state.tail, tokens)) if tokens.size else state.tail
            return ChainState(state.hashes, state.contents, tail, n_total, state.last)
        buf = np.concatenate((state.tail, tokens)).astype(np.uint32, copy=False)
        if self._compiled:
            x = self._extras.get(extra)
            if x is None:
                x = self._extras[extra] = np.frombuffer(extra, dtype=np.uint8).copy()
            hashes, contents, last = blake2.extend_chain(
                self._start,
                self._counted,
                state.hashes,
                state.contents,
                buf,
                k1,
                self.block_size,
                self._num,
                self._den,
                np.uint64(state.last),
                x,
            )
        else:
            hashes, contents, last_py = self._extend_py(state, buf, k1, extra)
            last = np.uint64(last_py)
        self.blocks_hashed += k1 - k0
        # A copy: a view would keep the whole new buffer alive in the memo.
        tail = buf[self.bound(k1) - self.bound(k0) :].copy()
        return ChainState(hashes, contents, tail, n_total, int(last))

    def _extend_py(
        self, state: ChainState, buf: np.ndarray, k1: int, extra: bytes
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """What the compiled path computes, by ``hashlib`` (any byte order)."""
        data = buf.astype("<u4").tobytes()
        k0 = int(state.hashes.size)
        base = self.bound(k0)
        prev = state.last.to_bytes(8, "little")
        chained, content = [], []
        for k in range(k0, k1):
            block = data[4 * (self.bound(k) - base) : 4 * (self.bound(k + 1) - base)]
            h = self._base.copy()
            h.update(prev + block + extra)
            c = self._base.copy()
            c.update(ZERO + block + extra)
            prev = h.digest()
            chained.append(int.from_bytes(prev, "little"))
            content.append(int.from_bytes(c.digest(), "little"))
        return (
            np.concatenate((state.hashes, np.array(chained, dtype=np.uint64))),
            np.concatenate((state.contents, np.array(content, dtype=np.uint64))),
            int.from_bytes(prev, "little"),
        )

    def extend_split(
        self, state: ChainState, head: np.ndarray, tail: np.ndarray, extra: bytes = b""
    ) -> tuple[ChainState, ChainState]:
        """``(extend(state, head), extend(state, head + tail))``, hashing each block once."""
        end = self.extend(state, np.concatenate([head, tail]) if tail.size else head, extra)
        n_mid = state.n_tokens + int(head.size)
        k_mid = self.n_blocks(n_mid)
        if k_mid == end.hashes.size:  # the tail completed no block
            k_end_start = self.bound(k_mid)
            keep = n_mid - k_end_start
            mid_tail = end.tail[:keep]
            return ChainState(end.hashes, end.contents, mid_tail, n_mid, end.last), end
        buf = np.concatenate((state.tail, head))
        lo = self.bound(k_mid) - self.bound(int(state.hashes.size))
        last = int(end.hashes[k_mid - 1]) if k_mid else 0
        mid_tail = buf[lo:].astype(np.uint32)  # a copy, as in extend
        mid = ChainState(end.hashes[:k_mid], end.contents[:k_mid], mid_tail, n_mid, last)
        return mid, end

    def hash_tokens(self, tokens: np.ndarray, extra: bytes = b"") -> ChainState:
        return self.extend(self.empty(), np.asarray(tokens, dtype=np.uint32), extra)

    def recall(self, key: Hashable) -> ChainState | None:
        st = self._memo.get(key)
        if st is not None:
            self._memo.move_to_end(key)
        return st

    def forget(self) -> None:
        """Empty the memo (its states may hold anchors the caller no longer wants kept)."""
        self._memo.clear()
        self._memo_hashes = 0

    def remember(self, key: Hashable, state: ChainState) -> None:
        if key in self._memo:
            self._memo.move_to_end(key)
            return
        self._memo[key] = state
        self._memo_hashes += int(state.hashes.size) + 1
        while self._memo_hashes > self.memo_max_hashes and len(self._memo) > 1:
            _, old = self._memo.popitem(last=False)
            self._memo_hashes -= int(old.hashes.size) + 1


def id_hash(namespace: bytes, value: int, salt: bytes) -> int:
    """A trace's own block id (Mooncake / Bailian ``hash_ids``) as a salted uint64."""
    h = hashlib.blake2b(digest_size=8, key=salt)
    h.update(namespace)
    h.update(int(value).to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little")


@functools.lru_cache(maxsize=8)
def _keyed_state(salt: bytes) -> tuple[np.ndarray, int]:
    return blake2.keyed_state(salt)


def id_hashes(namespace: bytes, values: np.ndarray, salt: bytes) -> np.ndarray:
    """:func:`id_hash` of every value (int64), in one compiled call where it can run.

    Distinct values are hashed once (pre-hashed traces repeat their shared prefixes'
    ids in every request).
    """
    values = np.asarray(values, dtype=np.int64)
    if not values.size:
        return np.empty(0, dtype=np.uint64)
    uniq, inverse = np.unique(values, return_inverse=True)
    if blake2.available():
        start, counted = _keyed_state(salt)
        prefix = np.frombuffer(namespace, dtype=np.uint8).copy()
        digests = blake2.id_digests(start, counted, prefix, uniq)
    else:
        digests = np.fromiter(
            (id_hash(namespace, int(v), salt) for v in uniq), dtype=np.uint64, count=uniq.size
        )
    return digests[inverse.reshape(-1)]


def chain_hashes_reference(
    tokens: list[int], block_size: int, salt: bytes, extra: bytes = b""
) -> list[int]:
    """The definition, written plainly: the oracle for tests of :class:`BlockHasher`."""
    out = []
    prev = ZERO
    for k in range(len(tokens) // block_size):
        block = tokens[k * block_size : (k + 1) * block_size]
        data = prev + b"".join(t.to_bytes(4, "little") for t in block) + extra
        prev = hashlib.blake2b(data, digest_size=8, key=salt).digest()
        out.append(int.from_bytes(prev, "little"))
    return out
