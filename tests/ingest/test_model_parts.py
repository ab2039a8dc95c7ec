"""A multi-model log's per-model parts taken from its trace, once the table's block
hash columns are dropped, are the parts built from each model's rows (the oracle:
:meth:`BlockTrace.from_table` of the rows)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.ingest.options import LoadedTrace, SkipSummary
from analyzer.trace import BlockTrace, table_from_rows

MODELS = ("m-a", "m-b", "m-c", None)


@st.composite
def logs(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(1, 40))
    lcp = draw(st.sampled_from(["all", "none", "some"]))
    content = draw(st.sampled_from(["all", "none"]))
    cached = draw(st.sampled_from(["all", "none", "some"]))
    users = draw(st.sampled_from(["all", "none", "some"]))
    rows = []
    for i in range(n):
        k = draw(st.integers(0, 6))
        blocks = draw(st.lists(st.integers(0, 12), min_size=k, max_size=k))
        # chained hashes of a small alphabet: requests share prefixes and blocks
        chain = [hash(tuple(blocks[: j + 1])) & ((1 << 63) - 1) for j in range(k)]

        def some(mode: str, value: object) -> object:
            return value if mode == "all" or (mode == "some" and draw(st.booleans())) else None

        rows.append(
            {
                "request_id": f"r{i}",
                # few distinct times: ties keep the log's order
                "arrival_s": float(draw(st.integers(0, 8))),
                "session_id": draw(st.sampled_from(["s1", "s2", "s3", None])),
                "tenant": draw(st.sampled_from(["t1", "t2", None])),
                "model": draw(st.sampled_from(MODELS)),
                "prompt_tokens": 4 * k + 1,
                "output_tokens": draw(st.sampled_from([None, 7])),
                "block_hashes": chain,
                "content_hashes": [b + 100 for b in blocks] if content == "all" else None,
                "token_lcp_prev": some(lcp, 4 * k),
                "count_only": draw(st.booleans()),
                "cached_tokens": some(cached, 4),
                "engine_prompt_tokens": some(cached, 4 * k + 2),
                "user_id": some(users, draw(st.sampled_from(["u1", "u2"]))),
            }
        )
    return rows


FIELDS = [f.name for f in dataclasses.fields(BlockTrace)]


def _same(a: BlockTrace, b: BlockTrace, model: str) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x is not None and y is not None, (model, name, x, y)
            assert x.dtype == y.dtype and np.array_equal(x, y), (model, name, x, y)
        else:
            assert x == y, (model, name, x, y)


@settings(max_examples=150, deadline=None)
@given(logs(), st.sampled_from(["shared", "tenant", "user"]))
def test_parts_from_the_trace_are_the_parts_built_from_the_rows(rows, policy):
    table = table_from_rows(rows, block_size=4, source="test")
    loaded = LoadedTrace(table=table, skipped=SkipSummary(), sources=["x"])
    dropped = LoadedTrace(table=table, skipped=SkipSummary(), sources=["x"])
    assert dropped.parts_without_hashes
    dropped.drop_block_columns()
    assert "block_hashes" not in dropped.table.column_names
    keyed, keyed_dropped = loaded.isolated(policy), dropped.isolated(policy)
    for model in {r["model"] for r in rows} - {None}:
        mask = pa.array([r["model"] == model for r in rows])
        oracle = BlockTrace.from_table(table.filter(mask))
        _same(dropped.read_part(model), oracle, model)
        _same(keyed_dropped.read_part(model), oracle, model)
        # the part the plan replays: the same, keyed, without the content ids
        _same(keyed_dropped.model_part(model), keyed.model_part(model), model)
        _same(dropped.model_part(model), dataclasses.replace(oracle, content_ids=None), model)


def test_partial_content_hashes_keep_the_columns():
    """Rows with content hashes beside rows without: a part could have them all, which
    the whole trace (content ids only when every row has them) cannot tell, so the
    hashes stay."""
    rows = [
        {"request_id": "a", "arrival_s": 1.0, "prompt_tokens": 9, "model": "x",
         "block_hashes": [1, 2], "content_hashes": [5, 6]},
        {"request_id": "b", "arrival_s": 2.0, "prompt_tokens": 9, "model": "y",
         "block_hashes": [1, 3], "content_hashes": None},
    ]  # fmt: skip
    loaded = LoadedTrace(
        table=table_from_rows(rows, block_size=4), skipped=SkipSummary(), sources=["x"]
    )
    assert not loaded.parts_without_hashes
    assert loaded.read_part("x").content_ids is not None
