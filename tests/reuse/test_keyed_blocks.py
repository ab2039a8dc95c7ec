"""The number of blocks a keying gives, counted a slice of requests at a time, is the
keyed trace's (the oracle: :func:`isolate`, which builds it)."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

import analyzer.reuse.isolation as iso
from analyzer.reuse.isolation import POLICIES, groups, isolate, keyed_blocks
from analyzer.trace import BlockTrace, table_from_rows


@st.composite
def traces(draw: st.DrawFn) -> BlockTrace:
    rows = []
    for i in range(draw(st.integers(1, 30))):
        k = draw(st.integers(0, 5))
        rows.append(
            {
                "request_id": f"r{i}",
                "arrival_s": float(i),
                "prompt_tokens": 4 * k + 1,
                "block_hashes": draw(st.lists(st.integers(1, 9), min_size=k, max_size=k)),
                "tenant": draw(st.sampled_from(["t1", "t2", "t3", None])),
                "session_id": draw(st.sampled_from(["s1", "s2", None])),
                "user_id": draw(st.sampled_from(["u1", "u2", None])),
            }
        )
    return BlockTrace.from_table(table_from_rows(rows, block_size=4))


@settings(max_examples=200, deadline=None)
@given(traces(), st.sampled_from(POLICIES), st.sampled_from([1, 3, 7, 1 << 20]))
def test_keyed_blocks_are_the_keyed_traces(trace, policy, slice_):
    with mock.patch.object(iso, "COUNT_SLICE", slice_):
        got = keyed_blocks(trace, policy)
        assert got == keyed_blocks(trace, policy, groups(trace, policy))
    assert got == isolate(trace, policy).n_blocks


def test_pairs_too_many_to_pack_are_counted_as_isolate_numbers_them():
    rows = [
        {"request_id": "a", "arrival_s": 0.0, "prompt_tokens": 9, "tenant": "x",
         "block_hashes": [1, 2]},
        {"request_id": "b", "arrival_s": 1.0, "prompt_tokens": 9, "tenant": "y",
         "block_hashes": [1, 3]},
    ]  # fmt: skip
    trace = BlockTrace.from_table(table_from_rows(rows, block_size=4))
    real = iso._pairs

    def mixed(ids, per_access, n_ids, n_groups):  # the 64-bit mix, whatever the sizes
        return real(ids, per_access, 2**40, 2**40)

    with mock.patch.object(iso, "_pairs", mixed):
        assert keyed_blocks(trace, "tenant") == isolate(trace, "tenant").n_blocks == 4
