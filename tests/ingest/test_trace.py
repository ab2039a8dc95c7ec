"""The canonical schema round trip and the compact form's invariants."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.errors import InputError
from analyzer.trace import (
    CANONICAL_SCHEMA,
    BlockTrace,
    read_canonical,
    table_from_rows,
    write_canonical,
)


def _table(rows: list[dict], block_size: int = 4) -> pa.Table:
    return table_from_rows(rows, block_size=block_size, source="test")


ROWS = [
    {"request_id": "b", "arrival_s": 2.0, "prompt_tokens": 12, "block_hashes": [10, 11, 12]},
    {"request_id": "a", "arrival_s": 1.0, "prompt_tokens": 9, "block_hashes": [10, 20]},
    {"request_id": "c", "arrival_s": 3.0, "prompt_tokens": 17, "block_hashes": [10, 11, 12, 13]},
]


def test_round_trip_and_sorting(tmp_path):
    path = tmp_path / "t.parquet"
    write_canonical(_table(ROWS), path)
    table = read_canonical(path)
    assert table.schema.remove_metadata() == CANONICAL_SCHEMA.remove_metadata()
    bt = BlockTrace.from_table(table)
    assert bt.request_ids == ["a", "b", "c"]
    assert bt.block_size == 4
    # dense ids in order of first appearance: 10->0, 20->1, 11->2, 12->3, 13->4
    assert bt.block_ids.tolist() == [0, 1, 0, 2, 3, 0, 2, 3, 4]
    assert bt.block_hashes.tolist() == [10, 20, 11, 12, 13]
    assert bt.offsets.tolist() == [0, 2, 5, 9]
    assert bt.blocks_of(1).tolist() == [0, 2, 3]
    assert bt.output_tokens.tolist() == [-1, -1, -1]


def test_coarsen_takes_every_factor_th_chained_hash():
    bt = BlockTrace.from_table(_table(ROWS))
    c = bt.coarsen(2)
    assert c.block_size == 8
    # a: [10,20] -> [20]; b: [10,11,12] -> [11]; c: [10,11,12,13] -> [11, 13]
    assert [c.block_hashes[i] for i in c.block_ids] == [20, 11, 11, 13]
    assert np.diff(c.offsets).tolist() == [1, 1, 2]


def test_not_canonical_is_a_clear_error(tmp_path):
    path = tmp_path / "plain.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), path)
    with pytest.raises(InputError, match="not a canonical trace"):
        read_canonical(path)
    with pytest.raises(InputError, match=r"plain\.parquet"):
        read_canonical(path)


def test_coarsen_rekeys_previews_of_kept_blocks():
    table = _table(ROWS)
    # previews keyed by chained hash: 20 ends a coarse block of "a", 12 is dropped at factor 2
    bt = BlockTrace.from_table(table, previews={20: "doc A", 12: "mid block", 11: "sys"})
    c = bt.coarsen(2)
    by_hash = {int(c.block_hashes[k]): v for k, v in c.previews.items()}
    assert by_hash == {20: "doc A", 11: "sys"}


def test_read_canonical_checks_types_and_block_size(tmp_path):
    import pyarrow.parquet as pq

    table = _table(ROWS)
    meta = table.schema.metadata
    i = table.column_names.index("prompt_tokens")
    narrow = tmp_path / "narrow.parquet"  # a compatible type is cast, not refused
    pq.write_table(table.set_column(i, "prompt_tokens", table.column(i).cast(pa.int32())), narrow)
    got = read_canonical(narrow)
    assert got.schema.field("prompt_tokens").type == pa.int64()
    # sorted by arrival on read (the hand-made table had b before a)
    assert got.column("prompt_tokens").to_pylist() == [9, 12, 17]
    j = table.column_names.index("arrival_s")
    text = tmp_path / "text.parquet"
    pq.write_table(table.set_column(j, "arrival_s", pa.array(["x", "y", "z"])), text)
    with pytest.raises(InputError) as e:
        read_canonical(text)
    assert str(e.value).startswith(f"{text} (field 'arrival_s'): column is string")
    bad_bs = tmp_path / "bs.parquet"
    pq.write_table(table.replace_schema_metadata({**meta, b"kvpool.block_size": b"abc"}), bad_bs)
    with pytest.raises(InputError, match=r"kvpool\.block_size 'abc' is not a positive integer"):
        read_canonical(bad_bs)
    bad_t0 = tmp_path / "t0.parquet"
    pq.write_table(table.replace_schema_metadata({**meta, b"kvpool.t0_epoch_s": b"noon"}), bad_t0)
    with pytest.raises(InputError, match=r"kvpool\.t0_epoch_s 'noon' is not a finite number"):
        read_canonical(bad_t0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=400),
    st.sampled_from([np.uint64, np.int64]),
    st.integers(0, 2**62),
)
def test_compiled_dense_ids_equal_numpys(picks, dtype, offset):
    """The dense ids a large trace gets from the compiled pass are those np.unique gives:
    numbered by first appearance, with each id's hash (values near 2**64 included)."""
    from analyzer.trace import _dense_compiled, first_seen_ids

    values = np.array([offset + 7919 * p for p in picks], dtype=np.uint64)
    if dtype is np.uint64:
        values = values + np.uint64(2**63)  # the top half, where int64 would wrap
    arr = values.astype(dtype)
    ids, hashes = _dense_compiled(arr)
    want_ids, want_hashes = first_seen_ids(arr)  # small: np.unique
    assert ids.dtype == want_ids.dtype and hashes.dtype == want_hashes.dtype
    assert np.array_equal(ids, want_ids) and np.array_equal(hashes, want_hashes)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 200_000), st.integers(1, 9))
def test_compiled_dense_ids_equal_numpys_as_the_table_grows(seed, distinct, n_parts):
    """Past the compiled pass's first table (2**15 distinct hashes before it doubles),
    through several doublings, and with the hashes in several parts (a column's chunks),
    the ids and hashes are still np.unique's."""
    from analyzer.trace import _first_seen, first_seen_ids

    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 2**64 - 1, distinct, dtype=np.uint64, endpoint=True)
    arr = pool[rng.integers(0, distinct, 300_000)]
    uniq, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
    want_ids, order = _first_seen(first, inverse)
    cuts = np.sort(rng.integers(0, arr.size, n_parts - 1))
    ids, hashes = first_seen_ids(np.split(arr, cuts))  # 300k: the compiled pass
    assert np.array_equal(ids, want_ids) and np.array_equal(hashes, uniq[order])


def test_a_trace_read_in_chunks_is_the_trace_read_whole():
    """from_table reads the hash columns chunk by chunk (as Parquet hands them over):
    the trace is the one a single-chunk table gives, above and below the compiled size."""
    from unittest import mock

    import analyzer.trace as trace_mod

    rows = []
    for i in range(300):
        n = i % 7
        rows.append(
            {
                "request_id": f"r{i}",
                "arrival_s": float(i),
                "prompt_tokens": 4 * n + 1,
                "block_hashes": [(i * 31 + k) % 97 for k in range(n)],
                "content_hashes": [(i + k) % 13 for k in range(n)],
            }
        )
    table = _table(rows)
    chunked = pa.concat_tables([table.slice(a, 37) for a in range(0, 300, 37)])
    assert chunked.column("block_hashes").num_chunks > 1
    hash_cols = ["block_hashes", "content_hashes"]
    shuffled = chunked.take(pa.array(np.random.default_rng(1).permutation(300)))
    for limit in (10, 10**9):  # compiled, np.unique
        with mock.patch.object(trace_mod, "DENSE_COMPILED", limit):
            whole = BlockTrace.from_table(table.combine_chunks())
            parts = BlockTrace.from_table(chunked)
            # the hash columns handed over apart (emptied as they are numbered), rows in
            # or out of order
            given = {c: chunked.column(c) for c in hash_cols}
            apart = BlockTrace.from_table(chunked.drop_columns(hash_cols), hashes=given)
            assert given == {}
            unsorted = BlockTrace.from_table(
                shuffled.drop_columns(hash_cols), hashes={c: shuffled.column(c) for c in hash_cols}
            )
        for t in (parts, apart, unsorted):
            for name in ("offsets", "block_ids", "block_hashes", "content_ids", "arrival_s"):
                assert np.array_equal(getattr(t, name), getattr(whole, name)), name
