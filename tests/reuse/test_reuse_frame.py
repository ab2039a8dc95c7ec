"""The streamed reuse analysis (polars set operations, SHARDS in the scan) against the
in-memory one (analyzer.reuse.analysis, itself checked against brute force in
test_reuse.py): the same report, figure for figure, on generated traces; golden numbers
on the public traces; datasets split over files; the CLI's flags."""

from __future__ import annotations

import itertools
import json
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.errors import UsageError
from analyzer.reuse import ReuseOptions, analyze_reuse, frame
from analyzer.reuse.analysis import TraceInput
from analyzer.reuse.ceilings import breakdowns
from analyzer.reuse.facts import PrefixCandidates, ScanPlan
from analyzer.reuse.frame import read_requests, scan_trace
from analyzer.reuse.hash_parts import ROWS_PER_PART
from analyzer.reuse.hit_stats import top_prefixes
from analyzer.reuse.streamed import FrameInput, analyze_canonical
from analyzer.trace import CANONICAL_SCHEMA, BlockTrace, trace_metadata

BS = 4
GOLDEN = 0x9E3779B97F4A7C15
_names = itertools.count()


def write(path, table: pa.Table) -> None:
    pq.write_table(table, path)


@st.composite
def traces(draw, max_requests: int = 25, max_new: int = 5):
    """A canonical table: chains extending earlier chains' prefixes (so a block id always
    has the same parent and depth, as chained hashes do), sessions, tenants, content
    hashes that repeat at other positions, times over several hours, one or two models."""
    n = draw(st.integers(1, max_requests))
    chains: list[list[int]] = []
    next_id = 1
    for _ in range(n):
        prefix: list[int] = []
        if chains and draw(st.integers(0, 9)) < 7:
            base = chains[draw(st.integers(0, len(chains) - 1))]
            prefix = base[: draw(st.integers(0, len(base)))]
        m = draw(st.integers(0, max_new))
        chains.append(prefix + list(range(next_id, next_id + m)))
        next_id += m
    extra = draw(st.lists(st.integers(0, BS - 1), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 1.5, 600.0, 2000.0]), min_size=n, max_size=n))
    labels = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))
    sessions = draw(st.lists(labels, min_size=n, max_size=n))
    tenants = draw(st.lists(labels, min_size=n, max_size=n))
    users = draw(st.lists(labels, min_size=n, max_size=n))
    models = draw(st.lists(st.sampled_from(["m", "m", "n"]), min_size=n, max_size=n))
    with_content = draw(st.booleans())
    with_lcp = draw(st.booleans())
    prompts = [len(c) * BS + e for c, e in zip(chains, extra, strict=True)]
    mask = (1 << 64) - 1
    cols = {
        "request_id": [f"r{i}" for i in range(n)],
        "arrival_s": list(np.cumsum(gaps) - gaps[0]),
        "session_id": sessions,
        "tenant": tenants,
        "model": models,
        "prompt_tokens": prompts,
        "output_tokens": [None] * n,
        "block_hashes": [[(b * GOLDEN) & mask for b in c] for c in chains],
        "content_hashes": (
            [[(b % 7 + 1) * 31 for b in c] for c in chains] if with_content else [None] * n
        ),
        "token_lcp_prev": ([draw(st.integers(0, p)) for p in prompts] if with_lcp else [None] * n),
        "parent_request_id": [None] * n,
        "turn": [None] * n,
        "count_only": [False] * n,
        "approx_lengths": [False] * n,
        "cached_tokens": [None] * n,
        "engine_prompt_tokens": [None] * n,
        "user_id": users,
    }
    table = pa.table(cols, schema=CANONICAL_SCHEMA)
    return table.replace_schema_metadata(trace_metadata(block_size=BS))


options = st.builds(
    ReuseOptions,
    warmup=st.sampled_from([0.0, 0.3, 0.5]),
    policies=st.sampled_from([("lru",), ("lru", "fifo", "optimal")]),
    granularities=st.sampled_from([(4, 8, 12), (8, 16)]),
    top_n=st.sampled_from([0, 3]),
    shards_rate=st.sampled_from([None, None, 0.5, 0.9]),
    shards_error_accesses=st.sampled_from([5, 1000]),
    n_windows=st.sampled_from([1, 5]),
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    table=traces(),
    opts=options,
    rows_per_part=st.sampled_from([ROWS_PER_PART, 9, 25]),
    slice_rows=st.sampled_from([frame.SLICE_ROWS, 1, 7]),
)
def test_streamed_report_equals_the_in_memory_report(
    tmp_path_factory, table, opts, rows_per_part, slice_rows
):
    """Whole, and split into hash parts of a few rows (spilled, as a large trace is),
    the accesses scanned a few requests at a time."""
    path = tmp_path_factory.getbasetemp() / f"t{next(_names)}.parquet"
    write(path, table)
    want = analyze_reuse(BlockTrace.from_parquet(path), opts).to_json()
    with mock.patch.object(frame, "SLICE_ROWS", slice_rows):
        got = analyze_canonical(path, opts, rows_per_part=rows_per_part).to_json()
    assert got == want


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(
    table=traces(),
    opts=options,
    policy=st.sampled_from(["tenant", "user"]),
    rows_per_part=st.sampled_from([ROWS_PER_PART, 9]),
)
def test_streamed_isolation_equals_the_in_memory_isolation(
    tmp_path_factory, table, opts, policy, rows_per_part
):
    """The frame keyed by salt group (isolate_frame) gives the report of the re-keyed
    trace (isolate), hashes and all."""
    from analyzer.reuse.isolation import isolate

    path = tmp_path_factory.getbasetemp() / f"t{next(_names)}.parquet"
    write(path, table)
    want = analyze_reuse(isolate(BlockTrace.from_parquet(path), policy), opts).to_json()
    got = analyze_canonical(path, opts, rows_per_part=rows_per_part, isolation=policy)
    assert got.to_json() == want


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(table=traces(), opts=options, rows_per_part=st.sampled_from([ROWS_PER_PART, 9, 25]))
def test_both_ways_of_reading_answer_every_question_alike(
    tmp_path_factory, table, opts, rows_per_part
):
    """The seam the figures are computed behind: the in-memory trace and the lazy frame
    give the same arrays for every question of the one plan, so every figure, computed
    once from them, is the same."""
    path = tmp_path_factory.getbasetemp() / f"t{next(_names)}.parquet"
    write(path, table)
    mem = TraceInput(BlockTrace.from_parquet(path))
    lf, meta = scan_trace(path)
    tmp = tmp_path_factory.mktemp("parts")
    lazy = FrameInput(lf, meta, read_requests(lf), tmp, rows_per_part)
    assert lazy.shape == mem.shape and lazy.count_only == mem.count_only
    for name in ("arrival_s", "prompt_tokens", "session", "tenant", "token_lcp_prev"):
        a, b = getattr(mem.requests, name), getattr(lazy.requests, name)
        assert (a is None and b is None) or np.array_equal(a, b), name
    plan = ScanPlan.of(opts, mem.shape, mem.requests.arrival_s)
    got, want = lazy.counted_hits(plan), mem.counted_hits(plan)
    assert got.n_distinct == want.n_distinct == mem.distinct_blocks() == lazy.distinct_blocks()
    for name in ("source_tokens", "time_count", "working_set"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.prefixes.any_hit == want.prefixes.any_hit
    bs = mem.shape.block_size
    assert top_prefixes(got.prefixes, bs, opts.top_n) == top_prefixes(want.prefixes, bs, opts.top_n)
    for f in plan.factors:
        assert np.array_equal(lazy.prefix_hits(plan, f), mem.prefix_hits(plan, f)), f
    seen_lazy, seen_mem = lazy.content_seen(), mem.content_seen()
    assert (seen_lazy is None) == (seen_mem is None)
    if seen_mem is not None:
        assert np.array_equal(seen_lazy, seen_mem)
    assert np.array_equal(lazy.dense_trace(plan).block_ids, mem.dense_trace(plan).block_ids)
    if plan.exact:
        a, b = lazy.lru_histograms(plan), mem.lru_histograms(plan)
        for name in ("counted", "every", "distances"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
    else:
        a, b = lazy.sampled_histogram(plan), mem.sampled_histogram(plan)
        assert np.array_equal(a.counted, b.counted) and a.counted_tokens == b.counted_tokens
        n = opts.shards_error_accesses
        assert lazy.shards_check(plan, opts.warmup, n) == mem.shards_check(plan, opts.warmup, n)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 9), st.integers(1, 20)), max_size=40),
    any_hit=st.booleans(),
    top_n=st.integers(0, 5),
)
def test_shared_prefixes_are_ranked_as_a_sort_would(rows, any_hit, top_n):
    """Both readings hand candidates to one ranking: by reused tokens, then requests,
    then the block seen first; and by requests, then length, then the block seen first."""
    ids = np.arange(len(rows), dtype=np.int64)[::-1].copy()  # not in candidate order
    cands = PrefixCandidates(
        block_id=ids,
        hash=ids.astype(np.uint64) * np.uint64(GOLDEN),
        blocks=np.array([r[1] for r in rows], dtype=np.int64),
        requests=np.array([r[2] for r in rows], dtype=np.int64),
        any_hit=any_hit or bool(rows),
    )
    got = top_prefixes(cands, BS, top_n)
    if not rows and not any_hit:
        assert got.note is None and got.by_volume == () and got.by_count == ()
        return
    entries = [
        (int(ids[i]), r[1] * BS, r[2], r[2] * r[1] * BS) for i, r in enumerate(rows)
    ]  # (block, prefix tokens, requests, reused tokens)
    by_volume = sorted(entries, key=lambda e: (-e[3], -e[2], e[0]))[:top_n]
    by_count = sorted(entries, key=lambda e: (-e[2], -e[1], e[0]))[:top_n]
    assert [(e.block_id, e.prefix_tokens, e.requests, e.reused_tokens) for e in got.by_volume] == (
        by_volume
    )
    assert [(e.block_id, e.prefix_tokens, e.requests, e.reused_tokens) for e in got.by_count] == (
        by_count
    )
    assert got.note is not None


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(-1, 3), st.floats(0, 10_000), st.integers(0, 99)),
        min_size=1,
        max_size=40,
    ),
    warmup=st.sampled_from([0.0, 0.3, 0.5]),
)
def test_breakdowns_equal_a_loop_over_the_requests(rows, warmup):
    """The one breakdown both readings use (the lazy one was a polars group-by)."""
    rows = sorted(rows, key=lambda r: r[1])  # in arrival order
    tenant = np.array([r[0] for r in rows], dtype=np.int32)
    arrival = np.array([r[1] for r in rows])
    prompt = np.array([r[2] for r in rows], dtype=np.int64)
    hit = prompt // 3
    first = int(warmup * len(rows))
    got = breakdowns(hit, prompt, tenant, arrival, first)
    assert got is not None
    by_tenant: dict[int, list[int]] = {}
    by_hour: dict[int, list[int]] = {}
    for i in range(first, len(rows)):
        hour = int((arrival[i] - arrival[0]) // 3600)
        for table, key in ((by_tenant, int(tenant[i])), (by_hour, hour)):
            acc = table.setdefault(key, [0, 0, 0])
            acc[0] += 1
            acc[1] += int(prompt[i])
            acc[2] += int(hit[i])

    def rows_of(table):
        return [(k, n, p, h, h / p if p else 0.0) for k, (n, p, h) in sorted(table.items())]

    want_tenant = [(k + 1 if k >= 0 else None, *rest) for k, *rest in rows_of(by_tenant)]
    assert [tuple(r.values()) for r in got["by_tenant"]] == want_tenant
    assert [tuple(r.values()) for r in got["by_hour"]] == rows_of(by_hour)


@settings(max_examples=15, deadline=None)
@given(table=traces(max_requests=30), cuts=st.lists(st.integers(0, 30), max_size=3))
def test_a_dataset_split_over_files_reads_as_the_one_file(tmp_path_factory, table, cuts):
    d = tmp_path_factory.mktemp("dataset")
    edges = sorted({0, table.num_rows, *(min(c, table.num_rows) for c in cuts)})
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        write(d / f"part-{i:03d}.parquet", table.slice(lo, hi - lo))
    one = d.parent / f"{d.name}.parquet"
    write(one, table)
    opts = ReuseOptions(policies=("lru",))
    assert analyze_canonical(d, opts).to_json() == analyze_canonical(one, opts).to_json()


def test_rows_out_of_order_are_sorted_as_the_in_memory_reader_does(tmp_path):
    rows = {f.name: [None] * 3 for f in CANONICAL_SCHEMA}
    rows |= {
        "request_id": ["a", "b", "c"],
        "arrival_s": [5.0, 1.0, 3.0],
        "prompt_tokens": [9, 9, 13],
        "block_hashes": [[1, 2], [1, 2], [1, 2, 3]],
        "count_only": [False] * 3,
        "approx_lengths": [False] * 3,
    }
    table = pa.table(rows, schema=CANONICAL_SCHEMA).replace_schema_metadata(
        trace_metadata(block_size=4)
    )
    write(tmp_path / "t.parquet", table)
    opts = ReuseOptions(warmup=0.0)
    got = analyze_canonical(tmp_path / "t.parquet", opts)
    assert got.to_json() == analyze_reuse(BlockTrace.from_table(table), opts).to_json()
    assert got.hit_tokens == 8 + 8  # b: nothing before it; a and c reuse [1, 2]


def test_breakdowns_per_tenant_and_hour_by_brute_force(tmp_path):
    # tenant 1: requests 0, 2 ; tenant 2: 1 ; hour 0: 0, 1 ; hour 1: 2
    rows = {f.name: [None] * 3 for f in CANONICAL_SCHEMA}
    rows |= {
        "request_id": ["a", "b", "c"],
        "arrival_s": [0.0, 10.0, 3700.0],
        "tenant": ["acme-secret", "zeta-secret", "acme-secret"],
        "prompt_tokens": [9, 13, 13],
        "block_hashes": [[1, 2], [1, 2, 3], [1, 2, 3]],
        "count_only": [False] * 3,
        "approx_lengths": [False] * 3,
    }
    table = pa.table(rows, schema=CANONICAL_SCHEMA).replace_schema_metadata(
        trace_metadata(block_size=4)
    )
    write(tmp_path / "t.parquet", table)
    rep = analyze_canonical(tmp_path / "t.parquet", ReuseOptions(warmup=0.0)).to_json()
    # hits: a 0, b 8 (blocks 1, 2), c 12 (all three blocks, last token recomputed)
    b = rep["breakdowns"]
    assert b["by_tenant"] == [
        {"tenant": 1, "requests": 2, "prompt_tokens": 22, "hit_tokens": 12,
         "hit_rate": round(12 / 22, 6)},
        {"tenant": 2, "requests": 1, "prompt_tokens": 13, "hit_tokens": 8,
         "hit_rate": round(8 / 13, 6)},
    ]  # fmt: skip
    assert [(h["hour"], h["hit_tokens"], h["prompt_tokens"]) for h in b["by_hour"]] == [
        (0, 8, 22),
        (1, 12, 13),
    ]
    assert "secret" not in json.dumps(rep)  # tenants by number, never by name


def test_golden_mooncake_ceiling_through_the_streamed_path(shared_traces, tmp_path):
    from tests.helpers.traces import mooncake_table

    path = tmp_path / "mooncake.parquet"
    write(path, mooncake_table(shared_traces / "mooncake" / "conversation_trace.jsonl"))
    rep = analyze_canonical(path, ReuseOptions(policies=("lru",)))
    assert round(rep.ceiling_hit_rate, 4) == 0.3978  # 39.8 %
    assert round(rep.cold_ceiling_hit_rate, 4) == 0.3734
    assert scan_trace(path)[1]["block_size"] == "512"


def test_shards_above_a_threshold_and_exact_on_demand(tmp_path):
    rng = np.random.default_rng(3)
    n = 400
    chains = []
    for i in range(n):
        base = chains[rng.integers(0, len(chains))][: rng.integers(0, 20)] if chains else []
        chains.append(list(base) + list(range(1000 * (i + 1), 1000 * (i + 1) + 6)))
    rows = {f.name: [None] * n for f in CANONICAL_SCHEMA}
    rows |= {
        "request_id": [str(i) for i in range(n)],
        "arrival_s": [float(i) for i in range(n)],
        "prompt_tokens": [len(c) * 4 + 1 for c in chains],
        "block_hashes": [[(b * GOLDEN) & ((1 << 64) - 1) for b in c] for c in chains],
        "count_only": [False] * n,
        "approx_lengths": [False] * n,
    }
    table = pa.table(rows, schema=CANONICAL_SCHEMA).replace_schema_metadata(
        trace_metadata(block_size=4)
    )
    path = tmp_path / "t.parquet"
    write(path, table)
    runner = CliRunner()
    out = tmp_path / "s.json"
    res = runner.invoke(app, ["reuse", str(path), "--shards-above", "100", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["curve_method"] == "shards" and doc["shards"]["rate"] == 0.01
    assert doc["shards"]["checked_accesses"] == sum(len(c) for c in chains)
    assert "sampled at rate 0.01" in res.output and "measured error" in res.output
    want = analyze_reuse(
        BlockTrace.from_table(table), ReuseOptions(shards_threshold_accesses=100)
    ).to_json()
    assert doc["isolation"] == "shared"
    assert {k: v for k, v in doc.items() if k not in ("models", "isolation")} == want
    res = runner.invoke(
        app, ["reuse", str(path), "--shards-above", "100", "--exact-curve", "--json", str(out),
              "--force"]
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["curve_method"] == "exact"
    res = runner.invoke(app, ["reuse", str(path), "--exact-curve", "--shards-rate", "0.1"])
    assert isinstance(res.exception, UsageError) and "contradict" in str(res.exception)
