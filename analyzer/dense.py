"""Dense block ids in order of first appearance, in one compiled pass over the hashes.

:func:`analyzer.trace.first_seen_ids` numbers a trace's chained hashes 0, 1, 2, ... in
the order they first appear. A hash join (polars) does it in about 24 bytes a block
access on top of the input, which at a million chat requests (83 M accesses) is 2 GB
held for a few seconds. This pass holds the output ids (8 bytes an access), the
distinct hashes and an open-addressing table of their ids (8 to 16 bytes a distinct
hash, 24 to 48 while it doubles), so beyond its output the peak follows the distinct
blocks, not the accesses.

The table uses linear probing on Fibonacci-hashed keys (Knuth, TAOCP vol. 3, 6.4) and
doubles when half full. Imported only where it runs: numba's import costs a fraction of
a second that ``kvpool --help`` must not pay.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

_FIB = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, odd
_EMPTY = -1
_FIRST_BITS = 16


@njit(cache=True, inline="always")
def fib_slot(key: np.uint64, shift: np.uint64) -> np.int64:
    """``key``'s home slot in a table of ``2**(64 - shift)`` slots (Fibonacci hashing)."""
    # int64, not uint64: numba types uint64 + int64 as float64, and slots are indices
    return np.int64((key * _FIB) >> shift)


@njit(cache=True, inline="always")
def _probe(table: np.ndarray, order: np.ndarray, h: np.uint64, bits: int) -> np.int64:
    """The slot holding ``h``'s id, or the empty slot where it goes (linear probing)."""
    mask = (1 << bits) - 1
    s = fib_slot(h, np.uint64(64 - bits))
    while table[s] != _EMPTY and order[table[s]] != h:
        s = (s + 1) & mask
    return s


@njit(cache=True)
def _grow(order: np.ndarray, distinct: int, bits: int) -> np.ndarray:
    """A table of ``2**bits`` slots holding the ids of ``order[:distinct]``."""
    table = np.full(1 << bits, _EMPTY, dtype=np.int64)
    for v in range(distinct):
        table[_probe(table, order, order[v], bits)] = v
    return table


@njit(cache=True, nogil=True)
def _number(
    hashes: np.ndarray,
    ids: np.ndarray,
    table: np.ndarray,
    order: np.ndarray,
    distinct: int,
    bits: int,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Write the ids of ``hashes`` to ``ids``, adding new hashes to the table; returns the
    (possibly grown) table, ``order`` (id -> hash), the distinct count and the bits."""
    for i in range(hashes.size):
        h = np.uint64(hashes[i])
        s = _probe(table, order, h, bits)
        if table[s] != _EMPTY:
            ids[i] = table[s]
            continue
        if 2 * (distinct + 1) > (1 << bits):  # keep the table at most half full
            bits += 1
            table = _grow(order, distinct, bits)
            grown = np.empty(1 << (bits - 1), dtype=np.uint64)
            grown[:distinct] = order[:distinct]
            order = grown
            s = _probe(table, order, h, bits)
        table[s] = distinct
        order[distinct] = h
        ids[i] = distinct
        distinct += 1
    return table, order, distinct, bits


class FirstSeen:
    """Numbers hashes by first appearance over several calls, as they arrive (a scan's
    slices): only the ids and the distinct hashes are kept, never the hashes given.

    A slot of the table holds an id; the id's hash is ``order[id]``, so the table costs
    8 bytes a slot.
    """

    def __init__(self) -> None:
        self._bits = _FIRST_BITS
        self._table = np.full(1 << self._bits, _EMPTY, dtype=np.int64)
        self._order = np.empty(1 << (self._bits - 1), dtype=np.uint64)
        self.distinct = 0

    def number(self, hashes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The ids of ``hashes`` (uint64), written to ``out`` if given (int64, same size)."""
        ids = np.empty(hashes.size, dtype=np.int64) if out is None else out
        self._table, self._order, self.distinct, self._bits = _number(
            hashes, ids, self._table, self._order, self.distinct, self._bits
        )
        return ids

    def hashes(self) -> np.ndarray:
        """id -> hash, for the ids given so far."""
        return self._order[: self.distinct].copy()


def first_seen(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, id -> hash) of the uint64 hashes ``parts`` hold one after the other: ids
    number each hash by its first appearance. The parts (a column's Arrow chunks, as
    they were read) are never copied into one array."""
    ids = np.empty(sum(p.size for p in parts), dtype=np.int64)
    numbering = FirstSeen()
    at = 0
    for part in parts:
        numbering.number(part, ids[at : at + part.size])
        at += part.size
    return ids, numbering.hashes()
