"""Chained block hashes and the token radix tree, against plain oracles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.blocks import BlockHasher, chain_hashes_reference, load_salt
from analyzer.cache import ArrivalLCP, TokenRadix, lcp_reference
from analyzer.errors import InputError

SALT = b"test-salt"
tokens_st = st.lists(st.integers(0, 5), min_size=0, max_size=80)


@settings(max_examples=60, deadline=None)
@given(tokens_st, st.sampled_from([1, 3, 4, 16]), st.binary(max_size=6), st.booleans())
def test_hasher_matches_the_definition(tokens, bs, extra, compiled):
    h = BlockHasher(bs, SALT, compiled=compiled)
    got = h.hash_tokens(np.array(tokens, dtype=np.uint32), extra)
    assert got.hashes.tolist() == chain_hashes_reference(tokens, bs, SALT, extra)
    assert got.hashes.size == len(tokens) // bs  # full blocks only
    want_c = [
        chain_hashes_reference(tokens[k * bs : (k + 1) * bs], bs, SALT, extra)[0]
        for k in range(len(tokens) // bs)
    ]
    assert got.contents.tolist() == want_c


@settings(max_examples=150, deadline=None)
@given(
    st.binary(min_size=0, max_size=64),
    st.lists(st.binary(max_size=300), max_size=5),
    st.binary(max_size=150),
    st.integers(0, 2**64 - 1),
)
def test_compiled_blake2b_is_hashlib(salt, blocks, extra, prev):
    """The numba BLAKE2b against hashlib, over every padding case (0 to 3 pieces)."""
    import hashlib

    from analyzer.blocks import blake2

    blocks = [b[: len(b) // 4 * 4] for b in blocks]  # whole uint32 tokens
    tokens = np.frombuffer(b"".join(blocks), dtype="<u4").astype(np.uint32)
    # Each generated block is hashed as one block of its own length, chained to the last.
    start, counted = blake2.keyed_state(salt)
    x = np.frombuffer(extra, dtype=np.uint8).copy()
    chain = prev
    pos = 0
    for b in blocks:
        n = len(b) // 4
        if n == 0:
            continue
        hs, cs, last = blake2.extend_chain(
            start,
            counted,
            np.empty(0, np.uint64),
            np.empty(0, np.uint64),
            tokens[pos : pos + n].copy(),
            1,
            n,
            1,
            1,
            np.uint64(chain),
            x,
        )
        pos += n
        want = hashlib.blake2b(chain.to_bytes(8, "little") + b + extra, digest_size=8, key=salt)
        want_c = hashlib.blake2b(bytes(8) + b + extra, digest_size=8, key=salt)
        assert int(hs[0]) == int.from_bytes(want.digest(), "little") == int(last)
        assert int(cs[0]) == int.from_bytes(want_c.digest(), "little")
        chain = int(last)


@settings(max_examples=60, deadline=None)
@given(
    tokens_st,
    st.lists(st.integers(0, 80), max_size=6),
    st.sampled_from([2, 4]),
    st.sampled_from([1, 0.7, 1.5]),
    st.booleans(),
)
def test_extending_in_pieces_equals_hashing_at_once(tokens, cuts, bs, ratio, compiled):
    h = BlockHasher(bs, SALT, token_ratio=ratio, compiled=compiled)
    state = h.empty()
    pos = 0
    for c in sorted(set(cuts)):
        if c <= len(tokens):
            state = h.extend(state, np.array(tokens[pos:c], dtype=np.uint32))
            pos = c
    state = h.extend(state, np.array(tokens[pos:], dtype=np.uint32))
    whole = h.hash_tokens(np.array(tokens, dtype=np.uint32))
    assert state.hashes.tolist() == whole.hashes.tolist()
    assert state.contents.tolist() == whole.contents.tolist()
    assert state.n_tokens == len(tokens)


@settings(max_examples=80, deadline=None)
@given(tokens_st, tokens_st, st.sampled_from([1, 2, 4, 8]))
def test_k_hashes_shared_iff_k_blocks_of_tokens_shared(a, b, bs):
    h = BlockHasher(bs, SALT)
    ha = h.hash_tokens(np.array(a, dtype=np.uint32)).hashes.tolist()
    hb = h.hash_tokens(np.array(b, dtype=np.uint32)).hashes.tolist()
    for k in range(1, min(len(ha), len(hb)) + 1):
        same_hashes = ha[:k] == hb[:k]
        same_tokens = a[: k * bs] == b[: k * bs]
        assert same_hashes == same_tokens
        # Chaining: equal hash at position k alone already implies the whole prefix.
        assert (ha[k - 1] == hb[k - 1]) == same_tokens


def test_salt_and_extra_keys_separate_hashes():
    t = np.arange(64, dtype=np.uint32)
    a = BlockHasher(16, b"one").hash_tokens(t).hashes
    b = BlockHasher(16, b"two").hash_tokens(t).hashes
    c = BlockHasher(16, b"one").hash_tokens(t, b"model=x").hashes
    assert not set(a.tolist()) & set(b.tolist())
    assert not set(a.tolist()) & set(c.tolist())


def test_content_hashes_find_moved_blocks():
    h = BlockHasher(4, SALT)
    a = h.hash_tokens(np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=np.uint32))
    b = h.hash_tokens(np.array([5, 6, 7, 8, 1, 2, 3, 4], dtype=np.uint32))
    assert set(a.contents.tolist()) == set(b.contents.tolist())
    assert not set(a.hashes.tolist()) & set(b.hashes.tolist())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=120), st.sampled_from([0.5, 1.3, 2.0]))
def test_token_ratio_blocks_cover_scaled_positions(tokens, ratio):
    h = BlockHasher(4, SALT, token_ratio=ratio)
    got = h.hash_tokens(np.array(tokens, dtype=np.uint32))
    served = int(len(tokens) * ratio + 1e-9)
    assert got.hashes.size == served // 4
    assert h.bound(got.hashes.size) <= len(tokens)


def test_memo_is_an_lru_bounded_by_hashes():
    h = BlockHasher(2, SALT, memo_max_hashes=10)
    for i in range(20):
        h.remember(bytes([i]), h.hash_tokens(np.arange(8, dtype=np.uint32)))
    assert h.recall(bytes([0])) is None
    assert h.recall(bytes([19])) is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=12))
def test_radix_match_equals_longest_prefix_of_inserted(seqs):
    tree = TokenRadix()
    inserted: list[list[int]] = []
    for s in seqs:
        expect = (
            max(
                (
                    next(
                        (i for i, (x, y) in enumerate(zip(s, q, strict=False)) if x != y),
                        min(len(s), len(q)),
                    )
                )
                for q in inserted
            )
            if inserted
            else 0
        )
        assert tree.match(s) == expect
        tree.insert(s)
        inserted.append(s)
        assert tree.match(s) == len(s)
    # Stored tokens = nodes of the (uncompressed) trie of all sequences.
    trie = {tuple(s[:i]) for s in inserted for i in range(1, len(s) + 1)}
    assert len(tree) == len(trie)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), max_size=10), min_size=1, max_size=14),
    st.randoms(use_true_random=False),
)
def test_arrival_lcp_in_any_insertion_order(prompts, rnd):
    # Requests are inserted in a shuffled order and ranked by their true arrival.
    order = list(range(len(prompts)))
    rnd.shuffle(order)
    lcp = ArrivalLCP()
    for i in order:
        lcp.add(prompts[i])
    got = lcp.finish(np.array(order, dtype=np.int64))  # insertion j has arrival rank order[j]
    expect = lcp_reference(prompts)
    assert [int(got[j]) for j in range(len(order))] == [expect[i] for i in order]


class _TinyArrivalLCP(ArrivalLCP):
    """From capacities of one token and one node, every insert grows the token array,
    the node arrays or the table (rehashed)."""

    initial_tokens = 1
    initial_nodes = 1


@pytest.mark.parametrize("make", [ArrivalLCP, _TinyArrivalLCP])
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.lists(st.integers(0, 3), max_size=9)),
        min_size=1,
        max_size=30,
    ),
    st.randoms(use_true_random=False),
)
def test_arrival_lcp_continued_from_anchors(make, steps, rnd):
    """Requests built as a known prefix (its anchor) plus new tokens, as ingest does."""
    prompts: list[list[int]] = []
    anchors = []
    lcp = make()
    idx = []
    for base, new in steps:
        b = base % (len(prompts) + 1) - 1  # -1: start from the root
        prefix, at = (prompts[b], anchors[b]) if b >= 0 else ([], None)
        node = lcp.extend(at, np.array(new, dtype=np.uint32))
        prompts.append(prefix + new)
        anchors.append(node)
        idx.append(lcp.end(node))
    assert idx == list(range(len(prompts)))
    order = list(range(len(prompts)))
    rnd.shuffle(order)  # any arrival order of the same requests
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    got = lcp.finish(rank)
    expect = lcp_reference([prompts[i] for i in order])
    assert [int(got[i]) for i in order] == expect
    # One token stored per distinct prefix, however the requests were inserted (the
    # tree's bound reads it, so --jobs N falls back where one process does).
    assert lcp.n_tokens == len({tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)})


def test_radix_evicts_lru_leaves_only():
    tree = TokenRadix()
    tree.insert([1, 2, 3, 4], now=1)
    tree.insert([1, 2, 9, 9], now=2)
    tree.insert([7, 7], now=3)
    freed = tree.evict(2)
    assert freed == 2  # the [3, 4] leaf went first: least recently used
    assert tree.match([1, 2, 3, 4]) == 2 and tree.match([1, 2, 9, 9]) == 4
    bounded = TokenRadix(capacity_tokens=6)
    for i in range(5):
        bounded.insert([i, i, i], now=i)
    assert len(bounded) <= 6 and bounded.match([4, 4, 4]) == 3


def test_salt_file_created_once_then_reused(tmp_path):
    p = tmp_path / "salt"
    a = load_salt(p)
    assert len(a) == 32 and p.exists()
    assert load_salt(p) == a
    p.write_text("not hex")
    with pytest.raises(InputError, match="salt file is not hex"):
        load_salt(p)


def test_parallel_salt_creation_agrees(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    p = tmp_path / "shared-salt"
    with ThreadPoolExecutor(8) as pool:
        salts = list(pool.map(lambda _: load_salt(p), range(16)))
    assert len(set(salts)) == 1 and len(salts[0]) == 32
    assert [x.name for x in tmp_path.iterdir()] == ["shared-salt"]


@settings(max_examples=60, deadline=None)
@given(tokens_st, tokens_st, tokens_st, st.sampled_from([1, 3, 4]), st.sampled_from([1, 1.5]))
def test_extend_split_equals_two_extends(pre, head, tail, bs, ratio):
    h = BlockHasher(bs, SALT, token_ratio=ratio)
    state = h.hash_tokens(np.array(pre, dtype=np.uint32))
    a = np.array(head, dtype=np.uint32)
    b = np.array(tail, dtype=np.uint32)
    mid, end = h.extend_split(state, a, b)
    want_mid = h.extend(state, a)
    want_end = h.extend(want_mid, b)
    for got, want in ((mid, want_mid), (end, want_end)):
        assert got.hashes.tolist() == want.hashes.tolist()
        assert got.contents.tolist() == want.contents.tolist()
        assert got.tail.tolist() == want.tail.tolist()
        assert (got.n_tokens, got.last) == (want.n_tokens, want.last)
    # A state taken at the split continues exactly like one built directly.
    more = np.arange(7, dtype=np.uint32)
    assert h.extend(mid, more).hashes.tolist() == h.extend(want_mid, more).hashes.tolist()
