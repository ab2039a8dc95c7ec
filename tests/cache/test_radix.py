"""BlockRadix against obviously-right models: a dict scanned for leaves, and a plain LRU."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.cache.radix import FIFO, LRU, ROOT, BlockRadix, Node, Policy


class MostRecent(Policy):
    """Newest leaf first: a policy whose order needs every inner node's touch exact."""

    def key(self, node: Node) -> tuple[float, ...]:
        return (-node.last_access, -node.touch_seq)


@st.composite
def chained_requests(draw, max_requests: int = 25, max_new: int = 6) -> list[list[int]]:
    """Requests as dense block-id chains: each extends a prefix of an earlier one or starts fresh."""
    n = draw(st.integers(1, max_requests))
    reqs: list[list[int]] = []
    next_id = 0
    for _ in range(n):
        prefix: list[int] = []
        if reqs and draw(st.booleans()):
            base = reqs[draw(st.integers(0, len(reqs) - 1))]
            prefix = base[: draw(st.integers(0, len(base)))]
        m = draw(st.integers(0, max_new))
        reqs.append(prefix + list(range(next_id, next_id + m)))
        next_id += m
    return reqs


class DictModel:
    """The slow oracle: every eviction scans all cached blocks for leaves."""

    def __init__(self, capacity: int | None, policy: str) -> None:
        self.capacity = capacity
        self.policy = policy
        self.d: dict[int, list[float]] = {}  # b -> [parent, last, touch_seq, inserted, insert_seq]
        self.seq = 0

    def match(self, chain: list[int]) -> int:
        n = 0
        while n < len(chain) and chain[n] in self.d:
            n += 1
        return n

    def _key(self, b: int) -> tuple:
        _, last, tseq, ins, iseq = self.d[b]
        return ((last, tseq) if self.policy == "lru" else (ins, iseq), b)

    def _evict(self, n: int, protect: set[int]) -> list[int]:
        out = []
        while len(out) < n:
            parents = {v[0] for v in self.d.values()}
            leaves = [b for b in self.d if b not in parents and b not in protect]
            if not leaves:
                break
            victim = min(leaves, key=self._key)
            del self.d[victim]
            out.append(victim)
        return out

    def touch(self, chain: list[int], now: float) -> None:
        for b in reversed(chain):  # tail first
            self.seq += 1
            self.d[b][1] = now
            self.d[b][2] = self.seq

    def insert(self, chain: list[int], now: float) -> list[int]:
        if self.capacity is not None:
            chain = chain[: self.capacity]
        parent = ROOT
        for b in chain:
            if b not in self.d:
                self.seq += 1
                self.d[b] = [parent, now, self.seq, now, self.seq]
            parent = b
        for b in reversed(chain):
            self.seq += 1
            self.d[b][1] = now
            self.d[b][2] = self.seq
        if self.capacity is None or len(self.d) <= self.capacity:
            return []
        return self._evict(len(self.d) - self.capacity, set(chain))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    reqs=chained_requests(),
    capacity=st.one_of(st.none(), st.integers(0, 12)),
    policy=st.sampled_from(["lru", "fifo"]),
    clock=st.lists(st.integers(0, 3), min_size=25, max_size=25),
    evictions=st.lists(st.integers(0, 3), min_size=25, max_size=25),
    chained=st.booleans(),
)
def test_block_radix_matches_dict_model(reqs, capacity, policy, clock, evictions, chained):
    cache = BlockRadix(capacity, LRU() if policy == "lru" else FIFO(), chained=chained)
    model = DictModel(capacity, policy)
    now = 0.0
    for i, chain in enumerate(reqs):
        now += clock[i]  # equal times exercise the sequence tie-break
        assert cache.match(chain) == model.match(chain)
        assert cache.insert(chain, now) == model.insert(chain, now)
        assert set(cache) == set(model.d)
        if evictions[i] == 3:
            assert cache.evict(2) == model._evict(2, set())
        # prefix closure: every cached block's parent is cached
        for b in cache:
            assert cache.parent(b) == ROOT or cache.parent(b) in cache
        if capacity is not None:
            assert len(cache) <= capacity


@settings(max_examples=150, deadline=None)
@given(reqs=chained_requests(), capacity=st.integers(1, 15), chained=st.booleans())
def test_lru_radix_is_plain_lru_over_tail_first_touches(reqs, capacity, chained):
    """Tail-first touches keep a plain block LRU prefix-closed (vLLM's prefix caching design
    frees a sequence's blocks in reverse order, so a prefix's tail is evicted first)."""
    cache = BlockRadix(capacity, LRU(), chained=chained)
    plain: OrderedDict[int, None] = OrderedDict()
    for i, chain in enumerate(reqs):
        hits_plain = 0
        while hits_plain < len(chain) and chain[hits_plain] in plain:
            hits_plain += 1
        assert cache.match(chain) == hits_plain
        for b in reversed(chain):
            plain[b] = None
            plain.move_to_end(b)
            while len(plain) > capacity:
                plain.popitem(last=False)
        cache.insert(chain, float(i))
        assert set(cache) == set(plain)


def test_match_has_no_side_effects_and_touch_refreshes():
    cache = BlockRadix(3, LRU())
    cache.insert([0, 1], now=0)
    cache.insert([2], now=1)
    assert cache.match([0, 1, 5]) == 2
    cache.touch([0, 1], now=2)  # refresh the chain: block 2 is now the oldest leaf
    assert cache.insert([3], now=3) == [2]
    assert sorted(cache) == [0, 1, 3]


def test_fifo_ignores_hits():
    cache = BlockRadix(2, FIFO())
    cache.insert([0], now=0)
    cache.insert([1], now=1)
    cache.insert([0], now=2)  # a hit does not make block 0 younger under FIFO
    assert cache.insert([2], now=3) == [0]


def test_evict_takes_only_leaves_and_never_orphans():
    cache = BlockRadix(None)
    cache.insert([0, 1, 2], now=0)
    cache.insert([0, 3], now=1)
    assert cache.evict(1) == [2]  # leaves are 2 (older) and 3; 0 and 1 are internal
    assert cache.evict(2) == [1, 3]
    assert sorted(cache) == [0]


def test_long_chain_is_cached_up_to_capacity():
    cache = BlockRadix(2, LRU())
    cache.insert([9, 8], now=0)
    assert cache.insert([0, 1, 2, 3], now=1) == [8, 9]
    assert sorted(cache) == [0, 1]


def test_remove_refuses_orphans_and_accepts_subtrees():
    cache = BlockRadix(None)
    cache.insert([0, 1, 2], now=0)
    with pytest.raises(ValueError):
        cache.remove([1])
    cache.remove([1, 2])
    assert sorted(cache) == [0] and cache.is_leaf(0)
    assert cache.evict(5) == [0]
    cache.insert([0, 1], now=1)  # re-insert after removal: no stale heap entry survives
    assert cache.evict(1) == [1]


def test_zero_capacity_caches_nothing():
    cache = BlockRadix(0)
    assert cache.insert([0, 1], now=0) == []
    assert len(cache) == 0 and cache.match([0]) == 0


def test_token_radix_is_exported_by_the_cache_package():
    from analyzer.cache import TokenRadix
    from analyzer.cache.token_radix import TokenRadix as Owned

    assert TokenRadix is Owned
    tree = TokenRadix()
    tree.insert([1, 2, 3, 4])
    assert tree.match([1, 2, 3, 9]) == 3 and tree.match([7]) == 0


@settings(max_examples=150, deadline=None)
@given(
    reqs=st.one_of(
        chained_requests(),
        # Not chained (a block id after different parents): the fast calls must not rely on it.
        st.lists(st.lists(st.integers(0, 12), max_size=6), min_size=1, max_size=25),
    ),
    capacity=st.one_of(st.none(), st.integers(0, 12)),
    policy=st.sampled_from(["lru", "fifo"]),
    ops=st.lists(st.integers(0, 2), min_size=25, max_size=25),
)
def test_replay_fast_calls_equal_match_insert_touch(reqs, capacity, policy, ops):
    """The replay's one-walk calls do exactly what the calls they replace do: ``write`` is
    ``match`` then ``insert`` when a block is missing (nothing when none is),
    ``insert_ints`` is ``insert``, ``touch_prefix`` is ``touch`` of the cached prefix;
    checked by evicting both caches empty at the end, in the same order."""
    slow = BlockRadix(capacity, LRU() if policy == "lru" else FIFO())
    fast = BlockRadix(capacity, LRU() if policy == "lru" else FIFO())
    for i, chain in enumerate(reqs):
        now = float(i // 2)
        if ops[i] == 0:
            m = slow.match(chain)
            evicted = slow.insert(chain, now) if m < len(chain) else []
            assert fast.write(list(chain), now) == (m, evicted)
        elif ops[i] == 1:
            assert fast.insert_ints(list(chain), now) == slow.insert(chain, now)
        else:
            m = slow.match(chain)
            slow.touch(chain[:m], now)
            fast.touch_prefix(list(chain), m, now)
        assert set(fast) == set(slow)
    assert fast.evict(len(fast)) == slow.evict(len(slow))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    reqs=chained_requests(max_requests=40),
    capacity=st.one_of(st.none(), st.integers(0, 12)),
    policy=st.sampled_from(["lru", "fifo", "mru"]),
    ops=st.lists(st.integers(0, 5), min_size=40, max_size=40),
    clock=st.lists(st.integers(0, 2), min_size=40, max_size=40),
)
def test_chained_cache_equals_the_plain_one(reqs, capacity, policy, ops, clock):
    """A cache told its chains are tree paths (bisected match, blocks after the match new
    without looking, a touch kept on the chain's last block and passed up as children
    go) answers every call as the plain cache does, evictions in the same order, through
    touches of a prefix, removals of subtrees and evictions between inserts. Under LRU a
    parent's own touch is the next key after its last child's anyway; the newest-first
    policy sees the difference."""
    policies = {"lru": LRU, "fifo": FIFO, "mru": MostRecent}
    plain = BlockRadix(capacity, policies[policy]())
    fast = BlockRadix(capacity, policies[policy](), chained=True)
    now = 0.0
    for i, chain in enumerate(reqs):
        now += clock[i]
        op = ops[i]
        assert fast.match(chain) == plain.match(chain)
        if op == 0:
            assert fast.write(list(chain), now) == plain.write(list(chain), now)
        elif op == 1:
            assert fast.insert_ints(list(chain), now) == plain.insert_ints(list(chain), now)
        elif op == 2:
            m = plain.match(chain)
            plain.touch_prefix(list(chain), m // 2 + (m % 2), now)
            fast.touch_prefix(list(chain), m // 2 + (m % 2), now)
        elif op == 3:
            assert fast.insert(chain, now) == plain.insert(chain, now)
            assert fast.evict(2) == plain.evict(2)
        elif op == 4:  # remove the subtree under the chain's deepest cached block
            m = plain.match(chain)
            if m:
                top = chain[m - 1]
                below = {top}
                grew = True
                while grew:
                    more = {b for b in plain if plain.parent(b) in below} - below
                    grew = bool(more)
                    below |= more
                plain.remove(below)
                fast.remove(below)
        else:
            plain.touch(chain, now)
            fast.touch(chain, now)
        assert set(fast) == set(plain)
        for b in fast:
            assert fast.is_leaf(b) == plain.is_leaf(b)
    assert fast.evict(len(fast)) == plain.evict(len(plain))


class NestedLRU(LRU):
    """LRU's order through a ``key`` of its own: the cache keeps this policy's heap
    entries nested, ``(key, block, version)``, where LRU's are flattened."""

    def key(self, node: Node) -> tuple[float, ...]:
        return (node.last_access, node.touch_seq)


@settings(max_examples=200, deadline=None)
@given(
    reqs=chained_requests(max_requests=30),
    policy=st.sampled_from(["lru", "fifo"]),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 29), st.integers(1, 6)), max_size=60),
    clock=st.lists(st.integers(0, 2), min_size=60, max_size=60),
    chained=st.booleans(),
)
def test_evictions_beside_pinned_blocks_match_the_dict_model(reqs, policy, ops, clock, chained):
    """The aggregated engine's protocol: a running request pins its cached prefix, the
    engine evicts down to a size passing over pinned blocks (``evict(n, pinned=...)``),
    and a finished request unpins its prefix and touches it (``touch_prefix``). The
    cache evicts what the dict model does, scanning every unpinned leaf each time, and
    a policy with its own ``key`` (nested heap entries) evicts as LRU's flattened ones."""
    pol = LRU() if policy == "lru" else FIFO()
    cache = BlockRadix(None, pol, chained=chained)
    nested = BlockRadix(None, NestedLRU() if policy == "lru" else pol, chained=chained)
    model = DictModel(None, policy)
    pins: dict[int, int] = {}
    held: list[tuple[int, int]] = []  # (request, blocks pinned)
    now = 0.0
    for step, (op, r, n) in enumerate(ops):
        now += clock[step]
        chain = reqs[r % len(reqs)]
        if op == 0:  # computed: cached
            assert cache.insert_ints(list(chain), now) == model.insert(chain, now)
            nested.insert_ints(list(chain), now)
        elif op == 1:  # admitted: its cached prefix pinned
            m = cache.match(chain)
            held.append((r % len(reqs), m))
            for b in chain[:m]:
                pins[b] = pins.get(b, 0) + 1
        elif op == 2 and held:  # finished: unpinned and touched
            k, m = held.pop(n % len(held))
            done = reqs[k]
            for b in done[:m]:
                pins[b] -= 1
                if not pins[b]:
                    del pins[b]
            cache.touch_prefix(list(done), m, now)
            nested.touch_prefix(list(done), m, now)
            model.touch(done[:m], now)
        else:  # the engine fits its pool
            got = cache.evict(n, pinned=pins)
            assert got == model._evict(n, set(pins))
            assert nested.evict(n, pinned=pins) == got
        assert set(cache) == set(model.d) == set(nested)
    assert cache.evict(len(cache), pinned=pins) == model._evict(len(model.d), set(pins))


@pytest.mark.parametrize("chained", [False, True])
@pytest.mark.parametrize("policy", [LRU(), NestedLRU()])
def test_a_parent_touched_since_its_child_waits_its_turn(chained, policy):
    """Evicting a chain leaf-up stops where the parent's own touch is newer than another
    leaf's: block 1, touched at t=2, goes after block 3 (t=1)."""
    cache = BlockRadix(None, policy, chained=chained)
    cache.insert_ints([1, 2], 0.0)
    cache.insert_ints([3], 1.0)
    cache.touch_prefix([1, 2], 1, 2.0)
    assert cache.evict(3) == [2, 3, 1]
