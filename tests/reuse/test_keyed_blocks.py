"""The number of blocks a keying gives, counted a slice of requests at a time, is the
keyed trace's (the oracle: :func:`isolate`, which builds it)."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

import analyzer.reuse.isolation as iso
from analyzer.reuse.isolation import POLICIES, groups, isolate, keyed_blocks, keyings
from analyzer.trace import BlockTrace, table_from_rows, write_canonical


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


@settings(max_examples=200, deadline=None)
@given(traces(), st.sampled_from(POLICIES))
def test_the_policies_measured_again_are_those_the_isolation_stage_plans(trace, policy):
    """The isolation stage's loop (analyzer/advisor/isolation.py), as written there: a
    policy is planned unless one handled before it keys as many blocks."""
    k = keyings(trace, policy)
    handled = {policy: k.blocks[policy]}
    planned = []
    for p in k.wanted:
        if p in handled:
            continue
        if not any(b == k.blocks[p] for b in handled.values()):
            planned.append(p)
        handled[p] = k.blocks[p]
    assert k.measured_again(policy) == planned
    assert set(k.wanted) >= set(planned) and policy not in planned


def _log(tmp_path, shared_across_tenants: bool) -> str:
    rows = [
        {
            "request_id": f"r{i}",
            "arrival_s": float(i),
            "prompt_tokens": 13,
            "tenant": f"t{i % 2}",
            # the same prompt for both tenants, or each tenant's own
            "block_hashes": [1, 2, 3]
            if shared_across_tenants
            else [10 + i % 2, 20 + i % 2, 30 + i % 2],
            "content_hashes": [7, 8, 9],
        }
        for i in range(40)
    ]
    tmp_path.mkdir()
    path = tmp_path / "log.parquet"
    write_canonical(table_from_rows(rows, block_size=4, source="test"), path)
    return str(path)


def test_measure_keeps_content_ids_only_for_a_keying_measured_again(tmp_path):
    """The content ids are let go once reuse is measured, unless the isolation stage
    will measure it again under a keying with other blocks (tenants sharing blocks)."""
    from analyzer.advisor.measure import measure
    from analyzer.advisor.options import AnalyzeOptions

    opts = AnalyzeOptions()
    for shared_blocks in (True, False):
        path = _log(tmp_path / str(shared_blocks), shared_blocks)
        m = measure([path], opts)
        assert m.shared is not None
        kept = m.shared.trace.content_ids is not None
        assert kept == shared_blocks
        assert (m.trace.content_ids is not None) == shared_blocks
        assert keyings(m.shared.trace, "shared").measured_again("shared") == (
            ["tenant"] if shared_blocks else []
        )
