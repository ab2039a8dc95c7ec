"""ArrayRadix, the replay's compiled block cache, against BlockRadix (chained), call for call."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.cache.array_radix import ArrayRadix, CreditBoard
from analyzer.cache.radix import FIFO, LRU, BlockRadix, FarthestRank, weighted_match_of
from tests.cache.test_radix import MostRecent, chained_requests

POLICIES = {"lru": LRU, "fifo": FIFO}


def same(fast: ArrayRadix, slow: BlockRadix) -> None:
    """Equal contents: the same blocks, each with the same parent and leaf status."""
    assert len(fast) == len(slow)
    assert sorted(fast) == sorted(slow)
    for b in slow:
        assert b in fast
        assert fast.parent(b) == slow.parent(b)
        assert fast.is_leaf(b) == slow.is_leaf(b)


@settings(max_examples=300, deadline=None)
@given(
    reqs=chained_requests(max_requests=30),
    capacity=st.one_of(st.none(), st.integers(0, 3), st.integers(4, 20)),
    policy=st.sampled_from(sorted(POLICIES)),
    ops=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 29), st.integers(0, 8), st.integers(0, 2)),
        min_size=1,
        max_size=300,
    ),
)
def test_array_radix_answers_as_block_radix(reqs, capacity, policy, ops):
    """Every call the replay makes (and ``insert``, ``touch``), in random order on chains
    of a random tree, at capacities down to none, with running requests pinning their
    cached prefixes as the aggregated engine does: equal answers, equal contents after
    every call, and the same order when both are evicted at the end."""
    drive(reqs, capacity, policy, ops)


@settings(max_examples=200, deadline=None)
@given(
    reqs=chained_requests(max_requests=30),
    policy=st.sampled_from(sorted(POLICIES)),
    ops=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 29), st.integers(0, 8), st.integers(0, 2)),
        min_size=1,
        max_size=300,
    ),
)
def test_array_radix_holds_as_block_radix(reqs, policy, ops):
    """The engine's holds (an unbounded HBM cache whose running requests hold their
    cached prefixes): the same blocks held, the same unheld counts at admission, and
    the same evictions passing over them, as BlockRadix's and as a set of pins."""
    drive(reqs, None, policy, ops, holds=True)


@settings(max_examples=60, deadline=None)
@given(
    reqs=chained_requests(max_requests=8, max_new=3),
    policy=st.sampled_from(sorted(POLICIES)),
    pinning=st.lists(
        st.tuples(st.sampled_from([3, 6]), st.integers(0, 3), st.integers(0, 8), st.just(0)),
        max_size=12,
    ),
    touches=st.lists(
        st.tuples(
            st.sampled_from([4, 5, 5]), st.integers(4, 7), st.integers(0, 3), st.integers(0, 1)
        ),
        min_size=400,
        max_size=400,
    ),
)
def test_array_radix_rebuilds_its_heap_as_block_radix(reqs, policy, pinning, touches):
    """Leaves passed over as pinned, then hundreds of touches of other requests with no
    eviction between: the heap passes ``4 x cached + 64`` entries and is rebuilt, which brings the
    passed-over leaves back into the order, so the twin must rebuild at the same call
    to evict what BlockRadix does after it."""
    writes = [(0, r, 0, 0) for r in range(len(reqs))]
    drive(reqs, None, policy, [*writes, *pinning, *touches, (6, 0, 8, 0)])


@settings(max_examples=150, deadline=None)
@given(
    reqs=chained_requests(max_requests=20),
    writes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 19)), max_size=60),
    capacity=st.one_of(st.none(), st.integers(1, 12)),
    weights=st.tuples(
        st.sampled_from([1.0, 0.8]), st.sampled_from([0.8, 0.75, 0.25]), st.just(0.5)
    ),
    lower=st.integers(0, 3),
    top=st.booleans(),
)
def test_the_compiled_credit_is_the_routers_credit(reqs, writes, capacity, weights, lower, top):
    """A tier-scoring router's credit of every request over a top cache (or none) and up
    to three below it, filled by random writes: the compiled credit (a CreditBoard of
    one engine) is the same float as the sum over the tiers one match at a time (what
    the routers add, in their order), and as BlockRadix twins give it."""
    fast = [ArrayRadix(capacity if i else None) for i in range(4)]
    slow = [BlockRadix(capacity if i else None, LRU(), chained=True) for i in range(4)]
    for level, r in writes:
        fast[level].write(np.asarray(reqs[r % len(reqs)], dtype=np.int64), 0.0)
        slow[level].write(list(reqs[r % len(reqs)]), 0.0)
    below = tuple((fast[1 + i], weights[i]) for i in range(lower))
    twins = tuple((slow[1 + i], weights[i]) for i in range(lower))
    board = CreditBoard([(fast[0] if top else None, 1.0, below)])
    for chain in reqs:
        ids = np.asarray(chain, dtype=np.int64)
        credit = weighted_match_of(fast[0] if top else None, 1.0, below, ids)
        assert board.credits(np.zeros(1, dtype=np.int64), ids).tolist() == [credit]
        assert weighted_match_of(slow[0] if top else None, 1.0, twins, list(chain)) == credit


@settings(max_examples=150, deadline=None)
@given(
    reqs=chained_requests(max_requests=30),
    writes=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 29)), max_size=80),
    capacity=st.one_of(st.none(), st.integers(1, 12)),
    engines=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(0, 4)),
            st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.8, 0.75, 0.25])), max_size=3),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_a_credit_board_gives_each_engine_its_credit(reqs, writes, capacity, engines):
    """The credit of many engines in one kernel call (CreditBoard), over caches engines
    share (a node's DRAM) and caches whose arrays grow after the board was made: for
    every request and any choice of engines, each engine's credit is the float
    tier-by-tier sum gives it, and BlockRadix twins' weighted_match_of."""
    fast = [ArrayRadix(capacity if i % 2 else None) for i in range(5)]
    slow = [BlockRadix(capacity if i % 2 else None, LRU(), chained=True) for i in range(5)]
    tiers = [
        (None if top is None else fast[top], 1.0, tuple((fast[c], w) for c, w in lower))
        for top, lower in engines
    ]
    twins = [
        (None if top is None else slow[top], 1.0, tuple((slow[c], w) for c, w in lower))
        for top, lower in engines
    ]
    board = CreditBoard(tiers)
    for level, r in writes:  # the unbounded caches grow past their first 64 slots
        fast[level].write(np.asarray(reqs[r % len(reqs)], dtype=np.int64), 0.0)
        slow[level].write(list(reqs[r % len(reqs)]), 0.0)
    everyone = np.arange(len(engines), dtype=np.int64)
    for k, chain in enumerate(reqs):
        ids = np.asarray(chain, dtype=np.int64)
        some = everyone[k % len(engines) :: 2]
        for chosen in (everyone, some):
            got = board.credits(chosen, ids).tolist()
            assert got == [weighted_match_of(*tiers[e], ids) for e in chosen.tolist()]
            assert got == [weighted_match_of(*twins[e], list(chain)) for e in chosen.tolist()]


@settings(max_examples=150, deadline=None)
@given(
    reqs=chained_requests(max_requests=25),
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 24), st.integers(0, 8)),
        max_size=80,
    ),
)
def test_counting_copies_across_caches(reqs, ops):
    """The replay counts each block's copies across the instances' HBM caches in the
    kernels that cache and evict (insert_held_counting, evict_unheld_counting): the
    counts are how many caches hold each block, and each call says how many of the
    blocks it cached were held elsewhere, or of those it evicted still are."""
    caches = [ArrayRadix(None) for _ in range(3)]
    counts = np.zeros(1 + max(max(r, default=0) for r in reqs), dtype=np.int32)
    for insert, c, r, n in ops:
        cache = caches[c]
        chain = np.asarray(reqs[r % len(reqs)], dtype=np.int64)
        if insert and chain.size:
            new = chain[cache.match(chain) :].tolist()
            elsewhere = sum(any(b in o for o in caches if o is not cache) for b in new)
            assert cache.insert_held_counting(chain, 0, 0.0, counts) == elsewhere
            cache.release(chain, len(chain), 1.0)
        elif not insert:
            gone, still = cache.evict_unheld_counting(n, counts)
            gone = gone.tolist()
            assert len(gone) <= n and not any(b in cache for b in gone)
            assert still == sum(any(b in o for o in caches) for b in gone)
        for b in range(counts.size):
            assert counts[b] == sum(b in o for o in caches)


def test_a_credit_board_reads_a_cache_that_grew_after_it():
    """A cache's arrays are replaced as it grows (past 64 slots, then 128, ...): the
    board made before reads the new ones."""
    top, below = ArrayRadix(None), ArrayRadix(None)
    board = CreditBoard([(top, 1.0, ((below, 0.8),))])
    chain = np.arange(1000, dtype=np.int64)
    top.write(chain[:300], 0.0)
    below.write(chain[:700], 0.0)
    assert top._si.shape[1] > 64 and below._si.shape[1] > 64
    assert board.credits(np.array([0]), chain).tolist() == [300.0 + 0.8 * 400]


def drive(
    reqs: list[list[int]],
    capacity: int | None,
    policy: str,
    ops: list[tuple[int, ...]],
    holds: bool = False,
) -> None:
    """Both caches through ``ops`` (op, request, count, clock tick), compared after each.
    ``holds``: running requests pin their prefixes with the caches' holds (``hold``,
    ``release``, ``evict_unheld``, as the aggregated engine does) rather than with a set
    of pins given to ``evict``."""
    slow = BlockRadix(capacity, POLICIES[policy](), chained=True)
    fast = ArrayRadix(capacity, POLICIES[policy]())
    pins: dict[int, int] = {}
    held: list[tuple[list[int], int]] = []
    now = 0.0
    for op, r, n, tick in ops:
        now += tick
        chain = reqs[r % len(reqs)]
        # the replay passes its read-only slice of the trace's int64 block ids
        ids = np.asarray(chain, dtype=np.int64)
        ids.setflags(write=False)
        m = slow.match(chain)
        assert fast.match(chain) == fast.match(ids) == m
        if op == 0 and tick == 2:  # a writer that drops the evicted blocks
            assert fast.write_through(ids, now) == slow.write(list(chain), now)[0]
        elif op == 0:
            assert fast.write(ids if tick % 2 else list(chain), now) == slow.write(list(chain), now)
        elif op == 1 and holds:  # admitted with its cached prefix, the rest computed
            fast.hold(ids, 0, m)
            slow.hold(chain, 0, m)
            fast.insert_held(ids, m, now)
            slow.insert_held(list(chain), m, now)
            held.append((chain, len(chain)))
            for b in chain:
                pins[b] = pins.get(b, 0) + 1
        elif op == 1:
            assert fast.insert_ints(ids, now) == slow.insert_ints(list(chain), now)
        elif op == 2:
            assert fast.insert(chain, now) == slow.insert(chain, now)
        elif op == 3:  # admitted: its cached prefix pinned
            held.append((chain, m))
            if holds:
                assert fast.unheld(ids, m) == slow.unheld(chain, m)
                assert fast.unheld(ids, m) == sum(1 for b in chain[:m] if b not in pins)
                fast.hold(ids, 0, m)
                slow.hold(chain, 0, m)
            for b in chain[:m]:
                pins[b] = pins.get(b, 0) + 1
        elif op == 4:  # finished: unpinned, its prefix touched
            done, k = held.pop(n % len(held)) if held else (chain, 0)
            for b in done[:k]:
                pins[b] -= 1
                if not pins[b]:
                    del pins[b]
            if holds:
                fast.release(np.asarray(done, dtype=np.int64), k, now)
                slow.release(list(done), k, now)
            else:
                k = min(k, slow.match(done))  # a bounded cache's writes pass over pins
                fast.touch_prefix(np.asarray(done, dtype=np.int64), k, now)
                slow.touch_prefix(list(done), k, now)
        elif op == 6 and holds:
            assert fast.evict_unheld(n) == slow.evict_unheld(n)
        elif op == 5:
            fast.touch(chain, now)
            slow.touch(chain, now)
        else:
            assert fast.evict(n, pinned=pins) == slow.evict(n, pinned=pins)
        same(fast, slow)
        assert fast.n_held == slow.n_held == (len(pins) if holds else 0)
    if holds:
        assert fast.evict_unheld(len(fast)) == slow.evict_unheld(len(slow))
    assert fast.evict(len(fast), pinned=pins) == slow.evict(len(slow), pinned=pins)
    assert fast.evict(len(fast)) == slow.evict(len(slow))  # passed-over pins stay out
    same(fast, slow)


@pytest.mark.parametrize(
    "make",
    [lambda: BlockRadix(None, LRU(), chained=True), lambda: ArrayRadix(None, LRU())],
)
def test_a_rebuilt_heap_brings_a_passed_over_pinned_leaf_back(make):
    """Block 1 is passed over as pinned and leaves the order; 100 touches of block 2
    grow the heap past ``4 x 2 + 64`` entries and rebuild it, with block 1 in it again
    (without the rebuild the last eviction would find block 2 alone)."""
    cache = make()
    cache.write([0, 1], 0.0)
    cache.write([2, 3], 1.0)
    assert cache.evict(1, pinned={0: 1, 1: 1}) == [3]
    for i in range(100):
        cache.touch_prefix([2], 1, 2.0 + i)
    assert cache.evict(3) == [1, 0, 2]


def test_array_radix_grows_past_its_first_arrays():
    """An unbounded cache holding more blocks than its first slots, table and heap, and
    evicting them back in LRU order (the oldest request's chain, leaf first)."""
    n = 5000
    fast = ArrayRadix(None, LRU())
    slow = BlockRadix(None, LRU(), chained=True)
    for i in range(0, n, 10):
        chain = list(range(i, i + 10))
        assert fast.write(chain, float(i)) == slow.write(chain, float(i)) == (0, [])
    assert len(fast) == n
    assert (
        fast.evict(25)
        == slow.evict(25)
        == [b for i in (0, 10, 20) for b in range(i + 9, i - 1, -1)][:25]
    )


def test_array_radix_finds_every_block_through_its_table():
    """Thousands of chains of ids scattered over 2**40, written to a 100-block cache:
    the id -> slot table fills, empties by backward shifts and grows, and every cached
    block is still found (its parent read through it) with the evictions BlockRadix makes."""
    rng = random.Random(7)
    fast = ArrayRadix(100, LRU())
    slow = BlockRadix(100, LRU(), chained=True)
    chains: list[list[int]] = []
    for t in range(3000):
        base = rng.choice(chains)[: rng.randint(0, 3)] if chains and rng.random() < 0.5 else []
        chain = base + [rng.randrange(2**40) for _ in range(rng.randint(1, 4))]
        chains.append(chain)
        assert fast.write(chain, float(t)) == slow.write(chain, float(t))
        if t % 500 == 0:
            same(fast, slow)
    same(fast, slow)


def test_array_radix_takes_only_what_it_computes_as_block_radix():
    """Other leaf orders stay on BlockRadix; a negative id is refused, leaving the
    cache as it was, and ids far apart cost no more than ids close by."""
    assert not ArrayRadix.supports(MostRecent()) and not ArrayRadix.supports(FarthestRank())
    with pytest.raises(ValueError):
        ArrayRadix(4, MostRecent())
    cache = ArrayRadix(4, LRU())
    with pytest.raises(KeyError):
        cache.insert_ints([1, -9], 0.0)
    assert len(cache) == 0 and cache.match([1, -9]) == 0 and 1 not in cache
    cache.insert_ints([1, 2**40, 3], 0.0)
    assert cache.match([1, 2**40, 9]) == 2 and cache.parent(2**40) == 1
    assert cache.evict(3) == [3, 2**40, 1]
