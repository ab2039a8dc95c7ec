"""A compiled twin of :class:`~analyzer.cache.radix.BlockRadix` for the replay's caches.

The replay's tiers are chained block caches under LRU or FIFO, and their calls
(``write``, ``insert_ints``, ``touch_prefix``, ``evict``) were half of a probe's CPU
time, most of it creating nodes and popping heap entries in Python. :class:`ArrayRadix`
answers the same calls, decision for decision, with its state in arrays and the work
of each call in one numba kernel:

* :meth:`ArrayRadix.match` a compiled bisection over the id table, on the request's
  slice of the trace's block ids (a numpy array: the replay passes its slice of
  ``trace.block_ids`` to every call, so nothing is converted or mirrored per call);
* per-slot records (parent slot, cached children, touch and insert sequence, version,
  last access, insertion time), slots reused as blocks go, found by id through an
  open-addressing table (linear probing, deletion by backward shift): what a cache
  holds costs in proportion to what it holds, whatever the trace's id range, as
  BlockRadix's nodes do (a replay of 256 instances keeps a thousand caches);
* the leaves' heap as arrays, with :class:`BlockRadix`'s entries ``(key, block,
  version)`` (and the slot, outside the order), its lazy invalidation, its rebuild rule
  (more than ``4 x cached + 64`` entries after a touch) and its eviction loop, step for
  step. Keys are unique, so any correct heap pops the same order, and the heap's
  length, which decides when it is rebuilt (a rebuild brings back a leaf that an
  eviction passed over as pinned), moves as BlockRadix's does;
* the aggregated engine's holds (a running request holds its cached prefix, as SGLang
  locks in-use radix nodes): a count per slot and of held blocks, kept by ``hold``,
  ``insert_held`` and ``release``, which ``evict_unheld`` passes over.

Each call from Python costs more than most kernels' work (0.3 to 1 us to cross into
compiled code with the arrays), so the calls the replay makes together are one kernel:
a write or insert matches and inserts, a computed chunk is inserted and held, and a
router's credit of every engine it scores, tier by tier, is one call
(:class:`CreditBoard`).

It only takes chained caches (:func:`analyzer.replay.engine.is_chained`) of
non-negative block ids under :class:`LRU` or :class:`FIFO` (:meth:`ArrayRadix.supports`);
the replay picks it there and BlockRadix elsewhere. ``remove`` and caller-given ranks
are BlockRadix's alone. A Hypothesis test drives both with the same calls and compares
every answer.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Iterator, Sequence

import numpy as np
from numba import njit
from numba.typed import List

from analyzer.cache.radix import FIFO, LRU, ROOT, Policy
from analyzer.dense import fib_slot

# Rows of the int64 slot records, and of the float64 ones. ``_PARENT`` is the parent's
# slot (ROOT for a first block): a parent stays while it has a cached child.
# ``_PINNED`` marks the pins of one evict call; ``_HELD`` counts the holds on a block.
_PARENT, _CHILDREN, _TOUCH_SEQ, _VERSION, _INSERT_SEQ, _BLOCK, _FREE, _PINNED, _HELD = range(9)
_ROWS = 9
_LAST_ACCESS, _INSERTED_AT = range(2)
# Fields of the int64 ``meta`` array.
_SEQ, _HEAP_N, _NODES, _CAP, _FIFO, _USED, _N_FREE, _BITS, _N_HELD = range(9)
_META = 9
# Kernel answers below zero, having changed nothing: an id that is negative, cached
# already or (touched) not cached, and arrays too small.
_BAD_ID, _NO_SLOTS, _NO_HEAP = -1, -2, -3
_NONE = -2  # no protected block (ids are >= 0)
_FIRST_SLOTS = 64  # doubled as needed
_EMPTY = np.empty(0, dtype=np.int64)


# -- the id -> slot table -----------------------------------------------------------


@njit(cache=True, inline="always")
def _home(b: int, bits: int) -> int:
    return int(fib_slot(np.uint64(b), np.uint64(64 - bits)))


@njit(cache=True, inline="always")
def _find(table: np.ndarray, si: np.ndarray, bits: int, b: int) -> int:
    """The slot of cached block ``b``, or -1."""
    mask = table.size - 1
    i = _home(b, bits)
    while True:
        s = table[i]
        if s < 0:
            return -1
        if si[_BLOCK, s] == b:
            return int(s)
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _add(table: np.ndarray, si: np.ndarray, bits: int, b: int, s: int) -> None:
    mask = table.size - 1
    i = _home(b, bits)
    while table[i] >= 0:
        i = (i + 1) & mask
    table[i] = s


@njit(cache=True, inline="always")
def _drop(table: np.ndarray, si: np.ndarray, bits: int, b: int) -> None:
    """Take cached ``b`` out of the table; the entries after it in its run move back
    into the hole when their home is not between it and them (no tombstones)."""
    mask = table.size - 1
    i = _home(b, bits)
    while si[_BLOCK, table[i]] != b:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        s = table[j]
        if s < 0:
            break
        k = _home(si[_BLOCK, s], bits)
        if (j > i and (k <= i or k > j)) or (j < i and k <= i and k > j):
            table[i] = s
            i = j
    table[i] = -1


@njit(cache=True)
def _rehash(si: np.ndarray, used: int, bits: int) -> np.ndarray:
    table = np.full(1 << bits, -1, dtype=np.int32)
    for s in range(used):
        b = si[_BLOCK, s]
        if b >= 0:
            _add(table, si, bits, b, s)
    return table


@njit(cache=True)
def _slot_of(table: np.ndarray, si: np.ndarray, meta: np.ndarray, b: int) -> int:
    return _find(table, si, meta[_BITS], b)


@njit(cache=True)
def _match(table: np.ndarray, si: np.ndarray, meta: np.ndarray, blocks: np.ndarray) -> int:
    """The number of leading ``blocks`` cached: radix._bisect_cached (a chained cache is
    prefix-closed, so "cached" holds up to the match and not after)."""
    bits = meta[_BITS]
    hi = blocks.size
    if hi == 0 or blocks[0] < 0 or _find(table, si, bits, blocks[0]) < 0:
        return 0
    if blocks[hi - 1] >= 0 and _find(table, si, bits, blocks[hi - 1]) >= 0:
        return hi
    lo = 1
    hi -= 1  # blocks[lo - 1] cached, blocks[hi] not
    while lo < hi:
        mid = (lo + hi) // 2
        if blocks[mid] >= 0 and _find(table, si, bits, blocks[mid]) >= 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _credits(
    arrays: List,
    first: np.ndarray,
    caches: np.ndarray,
    weights: np.ndarray,
    engines: np.ndarray,
    blocks: np.ndarray,
    out: np.ndarray,
) -> None:
    """:func:`~analyzer.cache.radix.weighted_match_of` of each of ``engines`` into ``out``: engine ``e``'s caches
    are ``caches[first[e]:first[e + 1]]`` (indices into ``arrays``, each cache's id
    table, slot records and meta; its HBM cache first, -1 where it has none) weighted
    by ``weights`` alike."""
    for r in range(engines.size):
        lo = first[engines[r]]
        hi = first[engines[r] + 1]
        c = caches[lo]
        m = 0
        if c >= 0:
            table, si, meta = arrays[c]
            m = _match(table, si, meta, blocks)
        credit = float(m) * weights[lo]
        for k in range(lo + 1, hi):
            table, si, meta = arrays[caches[k]]
            mt = _match(table, si, meta, blocks)
            if mt > m:
                credit += weights[k] * (mt - m)
                m = mt
        out[r] = credit


class CreditBoard:
    """A tier-scoring router's credit of many engines' caches in one kernel call: what
    :func:`~analyzer.cache.radix.weighted_match_of` gives each engine, given ``tiers`` as
    ``(HBM cache or None, its weight, ((lower cache, weight), ...))`` per engine.

    The kernel reads the caches' arrays through lists kept here; a cache whose arrays
    grow tells the boards that read it (:meth:`ArrayRadix._grow`)."""

    def __init__(
        self,
        tiers: Sequence[tuple[ArrayRadix | None, float, tuple[tuple[ArrayRadix, float], ...]]],
    ) -> None:
        index: dict[int, int] = {}
        caches: list[ArrayRadix] = []
        first = [0]
        slots: list[int] = []
        weights: list[float] = []
        for top, w0, lower in tiers:
            for cache, w in ((top, w0), *lower):
                if cache is None:
                    slots.append(-1)
                else:
                    k = index.get(id(cache))
                    if k is None:
                        k = index[id(cache)] = len(caches)
                        caches.append(cache)
                    slots.append(k)
                weights.append(w)
            first.append(len(slots))
        self._first = np.array(first, dtype=np.int64)
        self._slots = np.array(slots, dtype=np.int64)
        self._weights = np.array(weights, dtype=np.float64)
        self._out = np.zeros(len(tiers), dtype=np.float64)
        # one list (each list costs about a microsecond a call to pass), made and changed
        # by cached kernels: the typed list's own methods compile in each process
        self._arrays = None
        if caches:
            c0 = caches[0]
            self._arrays = _list_of(c0._table, c0._si, c0._meta)
            for c in caches[1:]:
                _append(self._arrays, c._table, c._si, c._meta)
        me = weakref.ref(self)
        for k, c in enumerate(caches):
            c._boards.append((me, k))

    def _grew(self, k: int, cache: ArrayRadix) -> None:
        assert self._arrays is not None
        _set(self._arrays, k, cache._table, cache._si, cache._meta)

    def credits(self, engines: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Each of ``engines``' credit for ``blocks`` (a view the next call overwrites)."""
        out = self._out[: engines.size]
        if self._arrays is None:  # no engine has a cache
            out[:] = 0.0
            return out
        _credits(
            self._arrays,
            self._first,
            self._slots,
            self._weights,
            engines,
            blocks,
            out,
        )
        return out


@njit(cache=True)
def _list_of(table: np.ndarray, si: np.ndarray, meta: np.ndarray) -> List:
    out = List()
    out.append((table, si, meta))
    return out


@njit(cache=True)
def _append(arrays: List, table: np.ndarray, si: np.ndarray, meta: np.ndarray) -> None:
    arrays.append((table, si, meta))


@njit(cache=True)
def _set(arrays: List, k: int, table: np.ndarray, si: np.ndarray, meta: np.ndarray) -> None:
    arrays[k] = (table, si, meta)


# -- the leaves' heap ---------------------------------------------------------------


@njit(cache=True, inline="always")
def _lt(ak: float, a2: int, ab: int, av: int, bk: float, b2: int, bb: int, bv: int) -> bool:
    """``(ak, a2, ab, av) < (bk, b2, bb, bv)`` as Python compares the tuples."""
    if ak != bk:
        return ak < bk
    if a2 != b2:
        return a2 < b2
    if ab != bb:
        return ab < bb
    return av < bv


@njit(cache=True, inline="always")
def _below(hk: np.ndarray, hi: np.ndarray, i: int, k: float, k2: int, b: int, v: int) -> bool:
    """Entry ``i`` comes before ``(k, k2, b, v)``."""
    return _lt(hk[i], hi[i, 0], hi[i, 1], hi[i, 2], k, k2, b, v)


@njit(cache=True, inline="always")
def _put(hk: np.ndarray, hi: np.ndarray, i: int, k: float, k2: int, b: int, v: int, s: int) -> None:
    hk[i] = k
    hi[i, 0] = k2
    hi[i, 1] = b
    hi[i, 2] = v
    hi[i, 3] = s


@njit(cache=True, inline="always")
def _move(hk: np.ndarray, hi: np.ndarray, to: int, frm: int) -> None:
    hk[to] = hk[frm]
    hi[to, 0] = hi[frm, 0]
    hi[to, 1] = hi[frm, 1]
    hi[to, 2] = hi[frm, 2]
    hi[to, 3] = hi[frm, 3]


@njit(cache=True, inline="always")
def _push(hk: np.ndarray, hi: np.ndarray, n: int, k: float, k2: int, b: int, v: int, s: int) -> int:
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if _below(hk, hi, p, k, k2, b, v):
            break
        _move(hk, hi, i, p)
        i = p
    _put(hk, hi, i, k, k2, b, v, s)
    return n + 1


@njit(cache=True, inline="always")
def _sift(
    hk: np.ndarray, hi: np.ndarray, n: int, k: float, k2: int, b: int, v: int, s: int
) -> None:
    """Put the entry at the root of the ``n`` entries (the root's own is dropped)."""
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        d = c + 1
        if d < n and _below(hk, hi, d, hk[c], hi[c, 0], hi[c, 1], hi[c, 2]):
            c = d
        if not _below(hk, hi, c, k, k2, b, v):
            break
        _move(hk, hi, i, c)
        i = c
    _put(hk, hi, i, k, k2, b, v, s)


@njit(cache=True, inline="always")
def _pop(hk: np.ndarray, hi: np.ndarray, n: int) -> int:
    n -= 1
    if n > 0:
        _sift(hk, hi, n, hk[n], hi[n, 0], hi[n, 1], hi[n, 2], hi[n, 3])
    return n


@njit(cache=True, inline="always")
def _key(si: np.ndarray, sf: np.ndarray, s: int, fifo: bool) -> tuple[float, int]:
    if fifo:
        return sf[_INSERTED_AT, s], si[_INSERT_SEQ, s]
    return sf[_LAST_ACCESS, s], si[_TOUCH_SEQ, s]


@njit(cache=True)
def _rebuild(
    si: np.ndarray, sf: np.ndarray, hk: np.ndarray, hi: np.ndarray, meta: np.ndarray
) -> None:
    """BlockRadix._rebuild_heap: one entry per cached leaf, at its current key."""
    fifo = meta[_FIFO] != 0
    n = 0
    for s in range(meta[_USED]):
        b = si[_BLOCK, s]
        if b >= 0 and si[_CHILDREN, s] == 0:
            k, k2 = _key(si, sf, s, fifo)
            n = _push(hk, hi, n, k, k2, b, si[_VERSION, s], s)
    meta[_HEAP_N] = n


# -- the cache's calls ----------------------------------------------------------------


@njit(cache=True, inline="always")
def _touch(
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    b: int,
    s: int,
    length: int,
    now: float,
) -> None:
    """BlockRadix._touch_chain of a chained cache: ``length`` blocks ending at ``b``
    (slot ``s``)."""
    seq = meta[_SEQ]
    if length > 0:
        sf[_LAST_ACCESS, s] = now
        si[_TOUCH_SEQ, s] = seq + 1
        si[_VERSION, s] = seq + 1
        if si[_CHILDREN, s] == 0:
            k, k2 = _key(si, sf, s, meta[_FIFO] != 0)
            meta[_HEAP_N] = _push(hk, hi, meta[_HEAP_N], k, k2, b, seq + 1, s)
        seq += length
    meta[_SEQ] = seq
    if meta[_HEAP_N] > 4 * meta[_NODES] + 64:
        _rebuild(si, sf, hk, hi, meta)


@njit(cache=True)
def _evict_loop(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    out: np.ndarray,
    need: int,
    protect: int,
    use_pins: bool,
    use_held: bool = False,
) -> int:
    """BlockRadix._evict, step for step (its comments say why each step is so); the
    evicted ids go to ``out``, their count is returned. ``use_pins``: the blocks marked
    for the call are passed over; ``use_held``: the held ones."""
    fifo = meta[_FIFO] != 0
    walk = not fifo  # chained and LRU: a parent that inherits its child's touch is next
    bits = meta[_BITS]
    seq = meta[_SEQ]
    hn = meta[_HEAP_N]
    nodes = meta[_NODES]
    n_free = meta[_N_FREE]
    n_out = 0
    held = False
    h_k, h_k2, h_b, h_v, h_s = 0.0, 0, 0, 0, 0
    while need > 0 and hn > 0:
        k = hk[0]
        k2 = hi[0, 0]
        b = hi[0, 1]
        v = hi[0, 2]
        s = hi[0, 3]
        hn = _pop(hk, hi, hn)
        if si[_BLOCK, s] != b or si[_VERSION, s] != v or si[_CHILDREN, s] != 0:
            continue  # stale
        while True:  # (k, k2, b, v) is the entry of the live leaf b (slot s), next in order
            if b == protect:
                held = True
                h_k, h_k2, h_b, h_v, h_s = k, k2, b, v, s
                break
            if (use_pins and si[_PINNED, s] != 0) or (use_held and si[_HELD, s] != 0):
                break  # out of the order until touched again
            _drop(table, si, bits, b)
            si[_BLOCK, s] = -1
            si[_FREE, n_free] = s
            n_free += 1
            nodes -= 1
            out[n_out] = b
            n_out += 1
            need -= 1
            ps = si[_PARENT, s]
            if ps == ROOT:
                break
            parent = si[_BLOCK, ps]
            inherited = False
            if si[_TOUCH_SEQ, s] >= si[_TOUCH_SEQ, ps]:
                sf[_LAST_ACCESS, ps] = sf[_LAST_ACCESS, s]
                si[_TOUCH_SEQ, ps] = si[_TOUCH_SEQ, s] + 1
                inherited = walk
            si[_CHILDREN, ps] -= 1
            if si[_CHILDREN, ps] != 0:
                break
            seq += 1  # the parent became a leaf
            si[_VERSION, ps] = seq
            k, k2 = _key(si, sf, ps, fifo)
            b, v, s = parent, seq, ps
            if inherited and need > 0:
                continue
            if need == 0:
                hn = _push(hk, hi, hn, k, k2, b, v, s)
                break
            if hn > 0 and _below(hk, hi, 0, k, k2, b, v):
                # another leaf comes first: it leaves the heap, the parent takes its place
                nk, nk2, nb, nv, ns = hk[0], hi[0, 0], hi[0, 1], hi[0, 2], hi[0, 3]
                _sift(hk, hi, hn, k, k2, b, v, s)
                k, k2, b, v, s = nk, nk2, nb, nv, ns
                if si[_BLOCK, s] != b or si[_VERSION, s] != v or si[_CHILDREN, s] != 0:
                    break  # stale
    if held:
        hn = _push(hk, hi, hn, h_k, h_k2, h_b, h_v, h_s)
    meta[_SEQ] = seq
    meta[_HEAP_N] = hn
    meta[_NODES] = nodes
    meta[_N_FREE] = n_free
    return n_out


@njit(cache=True)
def _insert(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    out: np.ndarray,
    new: np.ndarray,
    parent: int,
    last: int,
    top: int,
    now: float,
) -> int:
    """BlockRadix._insert of a chained cache: ``new`` (none cached) hang below cached
    ``parent``, the chain of ``top`` blocks ending at ``last`` is touched, and leaves
    go (``last`` kept) down to the capacity. Returns the number evicted into ``out``,
    or below zero (nothing changed) for a bad id or arrays too small."""
    nn = new.size
    nodes = meta[_NODES]
    if nodes + nn > si.shape[1]:
        return _NO_SLOTS
    if meta[_HEAP_N] + nodes + nn + 2 > hk.size:
        return _NO_HEAP
    bits = meta[_BITS]
    for i in range(nn):
        if new[i] < 0 or _find(table, si, bits, new[i]) >= 0:
            return _BAD_ID
    ps = ROOT
    if nn > 0 and parent != ROOT:
        ps = _find(table, si, bits, parent)
        if ps < 0:
            return _BAD_ID
    ls = -1
    if top > 0 and nn == 0:
        ls = _find(table, si, bits, last)
        if ls < 0:
            return _BAD_ID
    fifo = meta[_FIFO] != 0
    seq = meta[_SEQ]
    if nn > 0:
        if ps != ROOT:
            si[_CHILDREN, ps] += 1
            si[_VERSION, ps] = seq + 1  # no longer a leaf: its heap entry dies
        used = meta[_USED]
        n_free = meta[_N_FREE]
        for i in range(nn):
            b = new[i]
            seq += 1
            if n_free > 0:
                n_free -= 1
                s = si[_FREE, n_free]
            else:
                s = used
                used += 1
            si[_PARENT, s] = ps
            si[_CHILDREN, s] = 1
            si[_TOUCH_SEQ, s] = seq
            si[_VERSION, s] = 0
            si[_BLOCK, s] = b
            si[_PINNED, s] = 0
            si[_HELD, s] = 0
            sf[_LAST_ACCESS, s] = now
            if fifo:
                si[_INSERT_SEQ, s] = seq
                sf[_INSERTED_AT, s] = now
            _add(table, si, bits, b, s)
            ps = s
        si[_CHILDREN, ps] = 0
        ls = ps
        meta[_USED] = used
        meta[_N_FREE] = n_free
        meta[_NODES] = nodes + nn
    meta[_SEQ] = seq
    _touch(si, sf, hk, hi, meta, last, ls, top, now)
    cap = meta[_CAP]
    if cap < 0 or meta[_NODES] <= cap:
        return 0
    protect = last if top > 0 else _NONE
    return _evict_loop(table, si, sf, hk, hi, meta, out, meta[_NODES] - cap, protect, False)


@njit(cache=True)
def _put_chain(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    out: np.ndarray,
    chain: np.ndarray,
    now: float,
    write: bool,
) -> tuple[int, int]:
    """BlockRadix.insert_ints of ``chain`` (its first ``capacity`` blocks), or with
    ``write`` BlockRadix.write (nothing changes when the whole chain is cached): the
    number of ``chain``'s leading blocks cached before, and :func:`_insert`'s answer."""
    m = _match(table, si, meta, chain)
    top = chain.size
    if write and m == top:
        return m, 0
    cap = meta[_CAP]
    if 0 <= cap < top:
        top = cap
    start = min(m, top)
    parent = chain[start - 1] if 0 < start < top else ROOT
    last = chain[top - 1] if top else ROOT
    return m, _insert(table, si, sf, hk, hi, meta, out, chain[start:top], parent, last, top, now)


@njit(cache=True)
def _write_two(
    t1: np.ndarray,
    si1: np.ndarray,
    sf1: np.ndarray,
    hk1: np.ndarray,
    hi1: np.ndarray,
    meta1: np.ndarray,
    out1: np.ndarray,
    t2: np.ndarray,
    si2: np.ndarray,
    sf2: np.ndarray,
    hk2: np.ndarray,
    hi2: np.ndarray,
    meta2: np.ndarray,
    out2: np.ndarray,
    chain: np.ndarray,
    now: float,
) -> tuple[int, int, int, int]:
    """:func:`_put_chain` writes of ``chain`` to two caches, the second only once the
    first has taken it: ``(m1, k1, m2, k2)``."""
    m1, k1 = _put_chain(t1, si1, sf1, hk1, hi1, meta1, out1, chain, now, True)
    if k1 < 0:
        return m1, k1, 0, 0
    m2, k2 = _put_chain(t2, si2, sf2, hk2, hi2, meta2, out2, chain, now, True)
    return m1, k1, m2, k2


@njit(cache=True)
def _touch_last(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    b: int,
    length: int,
    now: float,
) -> int:
    """A touch of ``length`` cached blocks ending at ``b`` (none when ``length`` is 0,
    which still rebuilds the heap when it is due)."""
    if meta[_HEAP_N] + 1 > hk.size:
        return _NO_HEAP
    s = -1
    if length > 0:
        s = _find(table, si, meta[_BITS], b)
        if s < 0:
            return _BAD_ID
    _touch(si, sf, hk, hi, meta, b, s, length, now)
    return 0


@njit(cache=True)
def _evict(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    out: np.ndarray,
    need: int,
    pins: np.ndarray,
) -> int:
    """Evict up to ``need`` leaves, passing over the ``pins`` (marked for the call)."""
    if meta[_HEAP_N] + meta[_NODES] + 2 > hk.size:
        return _NO_HEAP
    bits = meta[_BITS]
    for b in pins:
        s = _find(table, si, bits, b)
        if s >= 0:
            si[_PINNED, s] = 1
    n = _evict_loop(table, si, sf, hk, hi, meta, out, need, _NONE, pins.size > 0)
    for b in pins:
        s = _find(table, si, bits, b)
        if s >= 0:
            si[_PINNED, s] = 0
    return n


@njit(cache=True)
def _hold(
    table: np.ndarray, si: np.ndarray, meta: np.ndarray, chain: np.ndarray, lo: int, hi: int
) -> int:
    """One more hold on each of ``chain[lo:hi]`` (cached); the blocks held after."""
    bits = meta[_BITS]
    n = meta[_N_HELD]
    for i in range(lo, hi):
        s = _find(table, si, bits, chain[i])
        if s < 0:
            return _BAD_ID
    for i in range(lo, hi):
        s = _find(table, si, bits, chain[i])
        if si[_HELD, s] == 0:
            n += 1
        si[_HELD, s] += 1
    meta[_N_HELD] = n
    return int(n)


@njit(cache=True)
def _insert_held(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    out: np.ndarray,
    chain: np.ndarray,
    lo: int,
    now: float,
) -> int:
    """:func:`_put_chain` of ``chain`` (an insert), then one more hold on ``chain[lo:]``:
    the blocks held after, or the insert's answer below zero (nothing changed)."""
    _, k = _put_chain(table, si, sf, hk, hi, meta, out, chain, now, False)
    if k < 0:
        return k
    return _hold(table, si, meta, chain, lo, chain.size)


@njit(cache=True)
def _unheld(table: np.ndarray, si: np.ndarray, meta: np.ndarray, chain: np.ndarray, m: int) -> int:
    """How many of ``chain[:m]`` (cached) no hold is on."""
    bits = meta[_BITS]
    n = 0
    for i in range(m):
        s = _find(table, si, bits, chain[i])
        if s < 0 or si[_HELD, s] == 0:
            n += 1
    return n


@njit(cache=True)
def _release(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    chain: np.ndarray,
    n: int,
    now: float,
) -> int:
    """One hold fewer on each of ``chain[:n]`` (held), then their touch at ``now``; the
    blocks held after."""
    if meta[_HEAP_N] + 1 > hk.size:
        return _NO_HEAP
    bits = meta[_BITS]
    for i in range(n):
        s = _find(table, si, bits, chain[i])
        if s < 0 or si[_HELD, s] == 0:
            return _BAD_ID
    held = meta[_N_HELD]
    s = -1
    for i in range(n):
        s = _find(table, si, bits, chain[i])
        si[_HELD, s] -= 1
        if si[_HELD, s] == 0:
            held -= 1
    meta[_N_HELD] = held
    _touch(si, sf, hk, hi, meta, chain[n - 1] if n > 0 else ROOT, s, n, now)
    return int(held)


@njit(cache=True)
def _evict_unheld(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    out: np.ndarray,
    need: int,
) -> int:
    """Evict up to ``need`` leaves, passing over the held ones."""
    if meta[_HEAP_N] + meta[_NODES] + 2 > hk.size:
        return _NO_HEAP
    return _evict_loop(table, si, sf, hk, hi, meta, out, need, _NONE, False, True)


@njit(cache=True)
def _insert_held_counting(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    out: np.ndarray,
    chain: np.ndarray,
    lo: int,
    now: float,
    counts: np.ndarray,
) -> tuple[int, int]:
    """:func:`_insert_held`, and one more count in ``counts`` of each block of ``chain``
    it found uncached: ``(its answer, how many of those another count was on)``."""
    m, k = _put_chain(table, si, sf, hk, hi, meta, out, chain, now, False)
    if k < 0:
        return k, 0
    again = 0
    for i in range(m, chain.size):
        b = chain[i]
        c = counts[b]
        counts[b] = c + 1
        if c:
            again += 1
    return _hold(table, si, meta, chain, lo, chain.size), again


@njit(cache=True)
def _evict_unheld_counting(
    table: np.ndarray,
    si: np.ndarray,
    sf: np.ndarray,
    hk: np.ndarray,
    hi: np.ndarray,
    meta: np.ndarray,
    out: np.ndarray,
    need: int,
    counts: np.ndarray,
) -> tuple[int, int]:
    """:func:`_evict_unheld`, and one count fewer in ``counts`` of each block evicted
    that it counts: ``(its answer, how many of those still have a count)``."""
    k = _evict_unheld(table, si, sf, hk, hi, meta, out, need)
    still = 0
    for i in range(max(k, 0)):
        b = out[i]
        if b >= counts.size:  # not one of the counted blocks (a replay's generated ones)
            continue
        c = counts[b] - 1
        counts[b] = c
        if c:
            still += 1
    return k, still


def _ids(chain: Sequence[int] | np.ndarray) -> np.ndarray:
    """``chain`` as the kernels take it (the replay passes int64 arrays already)."""
    if type(chain) is np.ndarray:
        return chain
    return np.asarray(chain, dtype=np.int64) if len(chain) else _EMPTY


class ArrayRadix:
    """:class:`~analyzer.cache.radix.BlockRadix` with ``chained=True``, in arrays
    (module docstring): ``capacity_blocks`` slots (None = unbounded)."""

    def __init__(self, capacity_blocks: int | None, policy: Policy | None = None) -> None:
        assert capacity_blocks is None or capacity_blocks >= 0
        policy = policy if policy is not None else LRU()
        if not self.supports(policy):
            raise ValueError(f"ArrayRadix orders leaves by LRU or FIFO, not {policy!r}")
        self._capacity = capacity_blocks
        self._policy = policy
        self._meta = np.zeros(_META, dtype=np.int64)
        self._n = 0  # blocks cached (meta[_NODES], read after each kernel that changes it)
        self.n_held = 0  # blocks held (meta[_N_HELD], likewise)
        self._meta[_CAP] = -1 if capacity_blocks is None else capacity_blocks
        self._meta[_FIFO] = type(policy).key is FIFO.key
        self._meta[_BITS] = (2 * _FIRST_SLOTS).bit_length() - 1
        self._si = np.zeros((_ROWS, _FIRST_SLOTS), dtype=np.int64)
        self._sf = np.zeros((2, _FIRST_SLOTS), dtype=np.float64)
        self._out = np.zeros(_FIRST_SLOTS, dtype=np.int64)
        self._table = np.full(2 * _FIRST_SLOTS, -1, dtype=np.int32)
        self._hk = np.zeros(4 * _FIRST_SLOTS + 128, dtype=np.float64)
        self._hi = np.zeros((self._hk.size, 4), dtype=np.int64)
        # the credit boards that read this cache's arrays, and where (CreditBoard)
        self._boards: list[tuple[weakref.ref[CreditBoard], int]] = []

    @staticmethod
    def supports(policy: Policy) -> bool:
        """Whether ``policy`` orders leaves as :class:`LRU` or :class:`FIFO` do."""
        return type(policy).key is LRU.key or type(policy).key is FIFO.key

    # -- queries ---------------------------------------------------------------------

    @property
    def capacity_blocks(self) -> int | None:
        return self._capacity

    @property
    def policy(self) -> Policy:
        return self._policy

    def __len__(self) -> int:
        return self._n

    def __contains__(self, block_id: object) -> bool:
        if not isinstance(block_id, int | np.integer) or block_id < 0:
            return False
        return bool(_slot_of(self._table, self._si, self._meta, int(block_id)) >= 0)

    def __iter__(self) -> Iterator[int]:
        ids = self._si[_BLOCK, : int(self._meta[_USED])]
        return iter(ids[ids >= 0].tolist())

    def parent(self, block_id: int) -> int:
        """The cached parent of ``block_id`` (ROOT for a first block)."""
        p = int(self._si[_PARENT, self._slot(block_id)])
        return p if p == ROOT else int(self._si[_BLOCK, p])

    def is_leaf(self, block_id: int) -> bool:
        return bool(self._si[_CHILDREN, self._slot(block_id)] == 0)

    def match(self, blocks: Sequence[int] | np.ndarray) -> int:
        """Number of leading ``blocks`` present in the cache; changes nothing. The
        replay's hottest call: give it an int64 array (a list is converted)."""
        if type(blocks) is not np.ndarray:
            blocks = _ids(blocks)
        m: int = _match(self._table, self._si, self._meta, blocks)
        return m

    # -- updates ---------------------------------------------------------------------

    def insert(
        self, blocks: Sequence[int], now: float, ranks: Sequence[float] | None = None
    ) -> list[int]:
        """:meth:`BlockRadix.insert` (``ranks`` are for rank-keyed policies, not these)."""
        if ranks is not None:
            raise ValueError("ArrayRadix keeps no ranks: rank-keyed policies use BlockRadix")
        return self.insert_ints([int(b) for b in blocks], now)

    def insert_ints(self, chain: list[int] | np.ndarray, now: float) -> list[int]:
        """:meth:`BlockRadix.insert_ints` (``chain`` ints, or an int64 array)."""
        return self._put(chain, now, False)[1]

    def write(self, chain: list[int] | np.ndarray, now: float) -> tuple[int, list[int]]:
        """:meth:`BlockRadix.write`: the number of ``chain``'s leading blocks cached
        before, and the blocks evicted (nothing changes when all are cached)."""
        return self._put(chain, now, True)

    def write_through(self, chain: list[int] | np.ndarray, now: float) -> int:
        """:meth:`write` for a caller that drops what it evicts: the number of
        ``chain``'s leading blocks cached before."""
        return self._put(chain, now, True, False)[0]

    def write_through_with(
        self, other: ArrayRadix, chain: np.ndarray, now: float
    ) -> tuple[int, int]:
        """:meth:`write_through` of ``chain`` here, then in ``other``, in one kernel
        call (a request's chunk written to DRAM and NVMe): each one's number of
        ``chain``'s leading blocks cached before."""
        m1, k1, m2, k2 = _write_two(
            self._table,
            self._si,
            self._sf,
            self._hk,
            self._hi,
            self._meta,
            self._out,
            other._table,
            other._si,
            other._sf,
            other._hk,
            other._hi,
            other._meta,
            other._out,
            chain,
            float(now),
        )
        if k1 < 0:  # neither changed: one at a time, each growing as it needs
            self._grow(k1)
            return self.write_through(chain, now), other.write_through(chain, now)
        self._n = int(self._meta[_NODES])
        if k2 < 0:
            other._grow(k2)
            return m1, other.write_through(chain, now)
        other._n = int(other._meta[_NODES])
        return m1, m2

    def touch(self, blocks: Sequence[int], now: float) -> None:
        """Mark the cached ones among ``blocks`` as used at ``now`` (tail-first)."""
        cached = [int(b) for b in blocks if b in self]
        self._touch(cached[-1] if cached else ROOT, len(cached), now)

    def touch_prefix(self, chain: list[int] | np.ndarray, n: int, now: float) -> None:
        """:meth:`touch` of ``chain[:n]``, ids known to be cached."""
        n = min(n, len(chain))
        self._touch(int(chain[n - 1]) if n > 0 else ROOT, n, now)

    def evict(self, n_blocks: int, pinned: Collection[int] | None = None) -> list[int]:
        """:meth:`BlockRadix.evict`; ``pinned`` is a collection (a dict or set of ids)."""
        pins = np.fromiter(pinned, dtype=np.int64, count=len(pinned)) if pinned else _EMPTY
        while True:
            k = _evict(
                self._table,
                self._si,
                self._sf,
                self._hk,
                self._hi,
                self._meta,
                self._out,
                n_blocks,
                pins,
            )
            if k >= 0:
                self._n = int(self._meta[_NODES])
                return self._evicted(k)
            self._grow(k)

    # -- holds: the blocks of running requests ---------------------------------------

    def hold(self, chain: list[int] | np.ndarray, lo: int, hi: int) -> None:
        """One more hold on each of ``chain[lo:hi]``, cached blocks (a running request
        holds its cached prefix: SGLang's lock on in-use radix nodes)."""
        k = _hold(self._table, self._si, self._meta, _ids(chain), lo, hi)
        if k < 0:
            self._grow(k)
        self.n_held = k

    def insert_held(self, chain: list[int] | np.ndarray, lo: int, now: float) -> None:
        """:meth:`insert_ints` of ``chain``, then :meth:`hold` of ``chain[lo:]`` (blocks a
        running request computed: cached, and held by it), in one kernel call."""
        chain = _ids(chain)
        while True:
            k = _insert_held(
                self._table,
                self._si,
                self._sf,
                self._hk,
                self._hi,
                self._meta,
                self._out,
                chain,
                lo,
                float(now),
            )
            if k >= 0:
                self._n = int(self._meta[_NODES])
                self.n_held = k
                return
            if k == _BAD_ID:  # inserted, but not all held: a bounded cache dropped some
                self._n = int(self._meta[_NODES])
            self._grow(k)

    def insert_held_counting(
        self, chain: np.ndarray, lo: int, now: float, counts: np.ndarray
    ) -> int:
        """:meth:`insert_held`, counting each block it caches anew in ``counts`` (indexed
        by block id; the replay's copies of a block across instances): how many of
        those were counted already."""
        while True:
            k, again = _insert_held_counting(
                self._table,
                self._si,
                self._sf,
                self._hk,
                self._hi,
                self._meta,
                self._out,
                chain,
                lo,
                float(now),
                counts,
            )
            if k >= 0:
                self._n = int(self._meta[_NODES])
                self.n_held = k
                return again
            if k == _BAD_ID:  # inserted (and counted), but not all held
                self._n = int(self._meta[_NODES])
            self._grow(k)

    def evict_unheld_counting(self, n_blocks: int, counts: np.ndarray) -> tuple[np.ndarray, int]:
        """:meth:`evict_unheld`, one count fewer in ``counts`` of each block evicted: the
        blocks evicted (a view the next call overwrites) and how many of them are still
        counted."""
        while True:
            k, still = _evict_unheld_counting(
                self._table,
                self._si,
                self._sf,
                self._hk,
                self._hi,
                self._meta,
                self._out,
                n_blocks,
                counts,
            )
            if k >= 0:
                self._n = int(self._meta[_NODES])
                return self._out[:k], still
            self._grow(k)

    def unheld(self, chain: list[int] | np.ndarray, m: int) -> int:
        """How many of ``chain[:m]``, cached blocks, no hold is on."""
        n: int = _unheld(self._table, self._si, self._meta, _ids(chain), m)
        return n

    def release(self, chain: list[int] | np.ndarray, n: int, now: float) -> None:
        """One hold fewer on each of ``chain[:n]``, then :meth:`touch_prefix` of them
        (a leaf passed over while held goes back into the order)."""
        chain = _ids(chain)
        while True:
            k = _release(
                self._table, self._si, self._sf, self._hk, self._hi, self._meta, chain, n, now
            )
            if k >= 0:
                self.n_held = k
                return
            self._grow(k)

    def evict_unheld(self, n_blocks: int) -> list[int]:
        """:meth:`evict` passing over the held blocks."""
        while True:
            k = _evict_unheld(
                self._table, self._si, self._sf, self._hk, self._hi, self._meta, self._out, n_blocks
            )
            if k >= 0:
                self._n = int(self._meta[_NODES])
                return self._evicted(k)
            self._grow(k)

    # -- internals -------------------------------------------------------------------

    def _insert(self, chain: list[int] | np.ndarray, start: int, now: float) -> list[int]:
        """BlockRadix._insert of ``chain`` (within capacity) whose first ``start``
        blocks are cached (the rest, in a chained cache, are not)."""
        top = len(chain)
        if start >= top:
            new = _EMPTY
        elif isinstance(chain, np.ndarray):
            new = chain[start:]
        else:
            new = np.array(chain[start:], dtype=np.int64)
        parent = int(chain[start - 1]) if 0 < start < top else ROOT
        last = int(chain[top - 1]) if top else ROOT
        while True:
            k = _insert(
                self._table,
                self._si,
                self._sf,
                self._hk,
                self._hi,
                self._meta,
                self._out,
                new,
                parent,
                last,
                top,
                float(now),
            )
            if k >= 0:
                self._n = int(self._meta[_NODES])
                return self._evicted(k)
            self._grow(k)

    def _put(
        self, chain: list[int] | np.ndarray, now: float, write: bool, evicted: bool = True
    ) -> tuple[int, list[int]]:
        """:meth:`write` (``write``) or :meth:`insert_ints` in one kernel call; the
        blocks evicted are listed when ``evicted`` says so."""
        if type(chain) is not np.ndarray:
            chain = _ids(chain)
        while True:
            m, k = _put_chain(
                self._table,
                self._si,
                self._sf,
                self._hk,
                self._hi,
                self._meta,
                self._out,
                chain,
                float(now),
                write,
            )
            if k >= 0:
                self._n = int(self._meta[_NODES])
                return m, self._evicted(k) if evicted else []
            self._grow(k)

    def _evicted(self, k: int) -> list[int]:
        if not k:
            return []
        out: list[int] = self._out[:k].tolist()
        return out

    def _touch(self, last: int, length: int, now: float) -> None:
        while True:
            k = _touch_last(
                self._table,
                self._si,
                self._sf,
                self._hk,
                self._hi,
                self._meta,
                last,
                length,
                float(now),
            )
            if k >= 0:
                return
            self._grow(k)

    def _slot(self, block_id: int) -> int:
        s = (
            int(_slot_of(self._table, self._si, self._meta, int(block_id)))
            if block_id in self
            else -1
        )
        if s < 0:
            raise KeyError(block_id)
        return s

    def _grow(self, why: int) -> None:
        """Double what a kernel found too small (it changed nothing)."""
        if why == _BAD_ID:
            raise KeyError(
                "a negative block id, a new one cached already, a touch or hold of one not "
                "cached, or a release of one not held"
            )
        if why == _NO_SLOTS:
            n = self._si.shape[1]
            si = np.zeros((_ROWS, 2 * n), dtype=np.int64)
            si[:, :n] = self._si
            sf = np.zeros((2, 2 * n), dtype=np.float64)
            sf[:, :n] = self._sf
            self._si, self._sf = si, sf
            self._out = np.zeros(2 * n, dtype=np.int64)
            self._meta[_BITS] += 1
            self._table = _rehash(si, int(self._meta[_USED]), int(self._meta[_BITS]))
            for ref, k in self._boards:
                board = ref()
                if board is not None:
                    board._grew(k, self)
        else:
            n = self._hk.size
            hk = np.zeros(2 * n, dtype=np.float64)
            hk[:n] = self._hk
            hi = np.zeros((2 * n, 4), dtype=np.int64)
            hi[:n] = self._hi
            self._hk, self._hi = hk, hi


__all__ = ["ArrayRadix", "CreditBoard"]
