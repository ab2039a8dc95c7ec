"""Conversion in bounded memory: rows spooled to disk, the token tree's bound, distinct counts."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analyzer.ingest.spool as spool
from analyzer.cache import ArrivalLCP, lcp_reference
from analyzer.ingest import IngestOptions, open_trace
from analyzer.ingest.convert import convert_trace, table_figures
from analyzer.ingest.spool import DistinctCounter

FIX = Path(__file__).parents[1] / "fixtures" / "ingest"
SALT = b"fixed test salt"


def chat_log(path: Path, n: int, seed: int = 0, shuffle: bool = False) -> Path:
    """Multi-turn chat requests (history resent every turn), optionally out of time order."""
    rnd = random.Random(seed)
    words = [
        "cache",
        "token",
        "prefix",
        "model",
        "block",
        "hash",
        "user",
        "answer",
        "data",
        "kernel",
    ]
    sessions: list[list[dict]] = []
    rows = []
    for i in range(n):
        if not sessions or rnd.random() < 0.3:
            sessions.append([{"role": "system", "content": "You help. " * rnd.randint(1, 40)}])
        msgs = rnd.choice(sessions)
        msgs.append({"role": "user", "content": " ".join(rnd.choices(words, k=rnd.randint(3, 60)))})
        rows.append(
            {"id": f"r{i}", "timestamp": 1_700_000_000 + i, "request": {"messages": list(msgs)}}
        )
        msgs.append({"role": "assistant", "content": " ".join(rnd.choices(words, k=9))})
    if shuffle:
        rnd.shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("bound", ["rows", "bytes"])
def test_spooled_rows_come_back_in_arrival_order_whatever_the_batch_size(
    tmp_path, monkeypatch, shuffle, bound
):
    log = chat_log(tmp_path / "chat.jsonl", 120, seed=3, shuffle=shuffle)
    whole = open_trace([str(log)], IngestOptions(salt=SALT, keep_names=True)).table
    monkeypatch.setattr(spool, "BATCH_ROWS", 7)  # 18 spooled batches, read back out of order
    if bound == "bytes":  # spooled a few rows at a time, by their hashes' bytes
        monkeypatch.setattr(spool, "BATCH_BYTES", 8 * 40)
    small = open_trace([str(log)], IngestOptions(salt=SALT, keep_names=True)).table
    assert small.equals(whole)
    assert small.schema.metadata == whole.schema.metadata
    arrival = whole.column("arrival_s").to_numpy()
    assert np.all(np.diff(arrival) >= 0)
    # The rows are those of the log, once each; the LCP is that of the brute-force oracle.
    ids = whole.column("request_id").to_pylist()
    assert ids == [f"r{i}" for i in range(120)]


def test_the_spool_holds_a_bounded_number_of_hash_bytes(monkeypatch):
    # Rows of 30 block and 30 content hashes under a bound of 100 hashes: spooled two
    # at a time, and read back in any order in output batches of BATCH_ROWS rows.
    monkeypatch.setattr(spool, "BATCH_BYTES", 8 * 100)
    monkeypatch.setattr(spool, "BATCH_ROWS", 4)
    rows = spool.RowSpool()
    for i in range(10):
        h = np.arange(30, dtype=np.uint64) + np.uint64(1000 * i)
        rows.append(
            request_id=f"r{i}", time=float(i), session=None, tenant=None, model=None,
            prompt_tokens=480, output_tokens=None, hashes=h, contents=h + np.uint64(1),
            lcp_index=-1, parent=None, turn=None, count_only=False, approx=False,
        )  # fmt: skip
        assert len(rows._pending) == (i + 1) % 2
    order = np.array([9, 0, 1, 2, 3, 5, 4, 6, 7, 8])
    out = list(rows.batches(order))
    assert [b.num_rows for b in out] == [4, 4, 2]
    got = pa.Table.from_batches(out)
    assert got.column("request_id").to_pylist() == [f"r{i}" for i in order]
    assert [h[0] for h in got.column("block_hashes").to_pylist()] == [1000 * i for i in order]
    assert [h[-1] for h in got.column("content_hashes").to_pylist()] == [
        1000 * i + 30 for i in order
    ]
    rows.close()


def test_token_lcp_matches_the_oracle_through_the_spool(tmp_path, monkeypatch):
    from analyzer.tokenize import PromptRenderer, load_tokenizer

    log = chat_log(tmp_path / "chat.jsonl", 40, seed=5, shuffle=True)
    monkeypatch.setattr(spool, "BATCH_ROWS", 3)
    table = open_trace([str(log)], IngestOptions(salt=SALT, keep_names=True)).table
    renderer = PromptRenderer(load_tokenizer("cl100k"), "chatml", memo=False)
    by_id = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        parts, gen = renderer.render(rec["request"])
        by_id[rec["id"]] = [int(t) for p in (*parts, *gen) for t in p.tokens]
    prompts = [by_id[i] for i in table.column("request_id").to_pylist()]
    assert table.column("token_lcp_prev").to_pylist() == lcp_reference(prompts)


def test_convert_streams_the_same_file_open_trace_builds(tmp_path, monkeypatch):
    log = chat_log(tmp_path / "chat.jsonl", 90, seed=1, shuffle=True)
    monkeypatch.setattr(spool, "BATCH_ROWS", 16)
    opts = IngestOptions(salt=SALT)
    _, written = convert_trace([str(log)], tmp_path / "t.parquet", opts)
    in_memory = open_trace([str(log)], opts).table
    on_disk = pq.read_table(tmp_path / "t.parquet")
    assert on_disk.equals(in_memory)
    assert on_disk.schema.metadata == in_memory.schema.metadata
    assert written == table_figures(in_memory)
    assert written.requests == 90 and written.distinct_sample_rate == 1


def test_spool_leaves_no_temporary_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(spool.tempfile, "tempdir", None)  # re-read TMPDIR
    monkeypatch.setattr(spool, "BATCH_ROWS", 5)
    log = chat_log(tmp_path / "chat.jsonl", 30)
    convert_trace([str(log)], tmp_path / "t.parquet", IngestOptions(salt=SALT))
    open_trace([str(log)], IngestOptions(salt=SALT))
    assert list((tmp_path / "tmp").iterdir()) == []


def test_token_tree_bound_falls_back_with_a_note(tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 50, seed=2)
    loaded = open_trace([str(log)], IngestOptions(salt=SALT, exact_max_bytes=2_000))
    assert loaded.table.column("token_lcp_prev").null_count == 50
    assert len(loaded.notes) == 1 and "token-exact prefix lengths not computed" in loaded.notes[0]
    # Hashes do not depend on the tree (the memo was emptied with it, not changed).
    full = open_trace([str(log)], IngestOptions(salt=SALT))
    assert loaded.table.column("block_hashes").equals(full.table.column("block_hashes"))
    assert full.notes == [] and full.table.column("token_lcp_prev").null_count == 0


def test_convert_command_prints_the_fallback(tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from analyzer.cli.ingest import register
    from analyzer.errors import UsageError

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps typer in multi-command mode
    log = chat_log(tmp_path / "chat.jsonl", 50, seed=2)
    out = str(tmp_path / "t.parquet")
    res = CliRunner().invoke(
        app, ["convert", str(log), "-o", out, "--salt-file", str(tmp_path / "s")]
    )
    assert res.exit_code == 0, res.output
    assert "token-exact prefix lengths not computed" not in res.output
    assert "blocks: " in res.output and " distinct) of 16 tokens" in res.output
    monkeypatch.setattr("analyzer.cache.token_radix.NODE_BYTES", 1 << 20)  # 1 MiB a node
    res = CliRunner().invoke(
        app,
        [
            "convert",
            str(log),
            "-o",
            out,
            "--salt-file",
            str(tmp_path / "s"),
            "--exact-max-mib",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "token-exact prefix lengths not computed: the token tree passed 1 MiB" in res.output
    res = CliRunner().invoke(app, ["convert", str(log), "-o", out, "--exact-max-mib", "0"])
    assert isinstance(res.exception, UsageError)


def test_tree_memory_estimate_is_within_a_quarter_of_what_it_holds():
    """A chat-like log (a shared system prompt, 500 sessions growing turn by turn): the
    path-independent estimate the bound reads is within a quarter of what the tree's
    arrays hold, and that is what Python allocated for them (numpy's allocations are
    traced), less the capacity of arrays grown by doubling (never more than twice)."""
    rng = np.random.default_rng(0)
    # Kernels loaded first (numba's compile or cache load allocates tens of MB the tree
    # does not hold), whichever test ran before this one.
    warm = ArrivalLCP()
    warm.end(warm.extend(warm.extend(None, np.arange(3, dtype=np.uint32)), np.ones(2, np.uint32)))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lcp = ArrivalLCP()
        systems = [lcp.extend(None, rng.integers(0, 50_000, 400).astype(np.uint32))]
        ends = {}
        for _ in range(5_000):
            s = int(rng.integers(0, 500))
            node = ends.get(s, systems[0])
            tokens = rng.integers(0, 50_000, int(rng.integers(20, 200))).astype(np.uint32)
            ends[s] = lcp.extend(node, tokens)
            lcp.end(ends[s])
        allocated = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    held = lcp.held_bytes()
    assert 0.75 * held <= lcp.memory_bytes() <= 1.25 * held, (lcp.memory_bytes(), held)
    assert held <= allocated <= 2.2 * held, (held, allocated)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=400), st.integers(1, 64))
def test_distinct_counter_is_exact_below_its_bound(values, chunk):
    d = DistinctCounter(max_kept=1_000)
    arr = np.array(values, dtype=np.uint64)
    for i in range(0, arr.size, chunk):
        d.add(arr[i : i + chunk])
    assert d.sample_rate == 1 and d.estimate() == np.unique(arr).size


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 2**64 - 1), max_size=600),
    st.integers(1, 97),
    st.integers(1, 80),
    st.integers(0, 3),
)
def test_distinct_counter_matches_its_definition(values, chunk, max_kept, top_bits):
    """Oracle: the sample's threshold is the largest power of two under which at most
    ``max_kept`` distinct values were seen, whatever the chunks and merge points; values
    crowded under a low threshold (``top_bits`` cleared) make it fall several times."""
    arr = np.array(values, dtype=np.uint64) >> np.uint64(top_bits * 8)
    d = DistinctCounter(max_kept=max_kept)
    for i in range(0, arr.size, chunk):
        d.add(arr[i : i + chunk])
    distinct = np.unique(arr)
    shift = 0
    while (distinct < np.uint64(1 << (64 - shift)) if shift else distinct >= 0).sum() > max_kept:
        shift += 1
    below = distinct[distinct < np.uint64(1 << (64 - shift))] if shift else distinct
    assert d.sample_rate == 1 / (1 << shift)
    assert d.estimate() == below.size << shift


def test_distinct_counter_samples_above_its_bound():
    rng = np.random.default_rng(7)
    arr = rng.integers(0, 2**63, 200_000, dtype=np.uint64) * np.uint64(2)
    arr = np.concatenate([arr, arr[:50_000]])  # repeats are not new values
    d = DistinctCounter(max_kept=8_000)
    for i in range(0, arr.size, 10_000):
        d.add(arr[i : i + 10_000])
    assert d.sample_rate < 1
    # A 1/32 or 1/64 sample of 200,000 uniform values: within 10 % (about 4 sigma).
    assert abs(d.estimate() - 200_000) < 20_000


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50),
    st.binary(max_size=300),
    st.binary(max_size=64),
)
def test_compiled_id_hashes_are_hashlibs(values, namespace, salt):
    from analyzer.blocks import id_hash, id_hashes

    got = id_hashes(namespace, np.array(values, dtype=np.int64), salt)
    assert got.tolist() == [id_hash(namespace, v, salt) for v in values]


# -- the bulk reader of pre-hashed traces ------------------------------------------------


def _line_reader_only(monkeypatch):
    import analyzer.ingest.builder as builder

    monkeypatch.setattr(builder, "BULK", {})


@pytest.mark.parametrize("block_size", [None, 1024])
def test_bulk_mooncake_reader_matches_the_line_reader(monkeypatch, block_size):
    from analyzer.ingest.vector import read_bulk

    path = str(FIX / "mooncake_small.jsonl")
    assert read_bulk(path, "mooncake", block_size or 512, SALT, b"mooncake") is not None
    bulk = open_trace([path], IngestOptions(salt=SALT, block_size=block_size))
    _line_reader_only(monkeypatch)
    lines = open_trace([path], IngestOptions(salt=SALT, block_size=block_size))
    assert bulk.table.equals(lines.table)
    assert bulk.table.schema.metadata == lines.table.schema.metadata


@pytest.mark.parametrize(
    "bad",
    [
        "",  # a blank line: line numbers would shift
        "{not json",
        '{"timestamp": 5, "input_length": 600, "hash_ids": [1.5]}',
        '{"timestamp": -1, "input_length": 600, "hash_ids": [1, 2]}',
        '{"timestamp": 5, "input_length": 2000, "hash_ids": [1]}',
        '{"timestamp": 5, "input_length": 600, "hash_ids": [1, 2], "session_id": "a"}',
        '{"timestamp": 5, "hash_ids": [1, 2]}',
    ],
)
def test_bulk_reader_leaves_unusual_files_to_the_line_reader(tmp_path, monkeypatch, bad):
    from analyzer.ingest.vector import read_bulk

    good = [
        json.dumps(
            {"timestamp": i, "input_length": 700 + i, "output_length": 3, "hash_ids": [0, i]}
        )
        for i in range(5)
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join([*good[:2], bad, *good[2:]]) + "\n")
    assert read_bulk(str(path), "mooncake", 512, SALT, b"mooncake") is None
    got = open_trace([str(path)], IngestOptions(salt=SALT, fmt="mooncake"))
    _line_reader_only(monkeypatch)
    want = open_trace([str(path)], IngestOptions(salt=SALT, fmt="mooncake"))
    assert got.table.equals(want.table) and str(got.skipped) == str(want.skipped)


@pytest.mark.parametrize(
    "name",
    [
        "mooncake/conversation_trace.jsonl",
        "mooncake/synthetic_trace.jsonl",
        "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
        "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    ],
)
def test_bulk_readers_match_the_line_reader_on_the_public_traces(shared_traces, monkeypatch, name):
    """The oracle is the per-line reader, on the real traces: same rows, same metadata
    (the ids hashed a thousand blocks at a time, so that a row's blocks span steps)."""
    import analyzer.ingest.vector as vector
    from analyzer.ingest.detect import detect_format
    from analyzer.ingest.vector import read_bulk

    monkeypatch.setattr(vector, "HASH_BLOCKS", 1000)

    path = str(shared_traces / name)
    fmt = detect_format(path)
    assert read_bulk(path, fmt, 512, SALT, fmt.encode()) is not None  # the fast path ran
    bulk = open_trace([path], IngestOptions(salt=SALT, jobs=1))
    _line_reader_only(monkeypatch)
    lines = open_trace([path], IngestOptions(salt=SALT, jobs=1))
    assert bulk.table.equals(lines.table)
    assert bulk.table.schema.metadata == lines.table.schema.metadata
    assert str(bulk.skipped) == str(lines.skipped)
    assert bulk.table.num_rows > 3000


def _bailian_row(chat, parent, i, n_in=40, **extra):
    row = {"chat_id": chat, "parent_chat_id": parent, "timestamp": 1.5 * i}
    row |= {"input_length": n_in, "output_length": 3, "type": "text", "turn": 1}
    return row | {"hash_ids": [chat % 7 + k for k in range(n_in // 16 + 1)]} | extra


def _bailian_file(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _same_by_both_readers(monkeypatch, paths: list[str], **opts) -> None:
    got = open_trace(paths, IngestOptions(salt=SALT, **opts))
    with monkeypatch.context() as m:
        _line_reader_only(m)
        want = open_trace(paths, IngestOptions(salt=SALT, **opts))
    assert got.table.equals(want.table)
    assert got.table.schema.metadata == want.table.schema.metadata
    assert str(got.skipped) == str(want.skipped) and got.notes == want.notes


_chats = st.integers(0, 40)
_bailian_rows = st.lists(
    st.tuples(
        _chats,  # chat ids repeat: a later row takes the id over
        st.one_of(st.just(-1), _chats),  # parents seen before, after, or never
        st.integers(0, 100),  # input tokens
        st.sampled_from(["text", "image", "", None]),  # the tenant; "" is none
        st.one_of(st.none(), st.integers(0, 5)),  # turn
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(_bailian_rows, _bailian_rows, st.booleans(), st.sampled_from([None, 32]))
def test_bulk_bailian_reader_matches_the_line_reader(first, second, keep_names, block_size):
    """Sessions through parents in file order and across files, pseudonyms, duplicate
    chat ids, tenants and turns: the same table as the line reader's."""
    import tempfile

    import analyzer.ingest.vector as vector
    from analyzer.ingest.vector import read_bulk

    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setattr(vector, "HASH_BLOCKS", 2)  # rows' blocks hashed across several steps
        paths = [
            _bailian_file(
                Path(d) / f"{k}.jsonl",
                [
                    _bailian_row(c, p, i, n, type=ty, turn=tu)
                    for i, (c, p, n, ty, tu) in enumerate(rows)
                ],
            )
            for k, rows in enumerate((first, second))
        ]
        assert read_bulk(paths[0], "bailian", block_size or 16, SALT, b"bailian") is not None
        _same_by_both_readers(mp, paths, keep_names=keep_names, block_size=block_size)


@pytest.mark.parametrize("tail", ["\n", "\n\n", "\n  \n\t\n", "", "\n \n"])
def test_bulk_readers_take_files_ending_in_blank_lines(tmp_path, monkeypatch, tail):
    """The line reader skips blank lines; at the end they shift no row's line."""
    from analyzer.ingest.vector import read_bulk

    rows = [json.dumps(_bailian_row(i, -1, i)) for i in range(4)]
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(rows) + tail)
    assert read_bulk(str(path), "bailian", 16, SALT, b"bailian") is not None
    _same_by_both_readers(monkeypatch, [str(path)])
    path.write_text("\n".join(rows[:2]) + "\n\n" + "\n".join(rows[2:]) + tail)
    assert read_bulk(str(path), "bailian", 16, SALT, b"bailian") is None  # lines shift
    _same_by_both_readers(monkeypatch, [str(path)])


def test_bulk_bailian_reader_runs_in_the_parent_of_a_parallel_read(tmp_path, monkeypatch):
    from analyzer.ingest.builder import TraceBuilder

    rows = [_bailian_row(i, -1 if i % 3 == 0 else i - 1, i, 20 + i) for i in range(300)]
    path = _bailian_file(tmp_path / "b.jsonl", rows)
    calls = []
    real = TraceBuilder._read_bulk
    monkeypatch.setattr(
        TraceBuilder, "_read_bulk", lambda b, p, f: calls.append(p) or real(b, p, f)
    )
    _same_by_both_readers(monkeypatch, [path], jobs=2, parallel_min_bytes=1)
    assert calls == [path]  # the columns were read, not the lines


@pytest.mark.parametrize(
    "bad",
    [
        "",  # a blank line
        json.dumps(_bailian_row(5, -1, 9, turn=-2)),  # the line reader skips a negative turn
        json.dumps(_bailian_row(5, -1, 9, turn=1.5)),
        json.dumps(_bailian_row(5, -1, 9, chat_id="c5")),  # an id that is a string
        json.dumps(_bailian_row(5, -1, 9, type=3)),
        json.dumps(_bailian_row(5, -1, 9, hash_ids=[1])),  # fewer ids than blocks
        json.dumps({k: v for k, v in _bailian_row(5, -1, 9).items() if k != "chat_id"}),
    ],
)
def test_bulk_bailian_reader_leaves_unusual_files_to_the_line_reader(tmp_path, monkeypatch, bad):
    from analyzer.ingest.vector import read_bulk

    good = [json.dumps(_bailian_row(i, -1 if i < 2 else 0, i)) for i in range(5)]
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join([*good[:2], bad, *good[2:]]) + "\n")
    assert read_bulk(str(path), "bailian", 16, SALT, b"bailian") is None
    _same_by_both_readers(monkeypatch, [str(path)], fmt="bailian")


def test_bulk_bailian_reader_leaves_tenant_keyed_hashes_to_the_line_reader(tmp_path, monkeypatch):
    from analyzer.ingest.builder import TraceBuilder

    rows = [_bailian_row(i, -1, i, type="image" if i % 2 else "text") for i in range(6)]
    path = _bailian_file(tmp_path / "b.jsonl", rows)
    opts = IngestOptions(salt=SALT, hash_keys=("model", "tenant"))
    b = TraceBuilder([path], ["bailian"], opts, None)
    assert b.bulk_rows(path, "bailian") is None and not len(b.rows)
    _same_by_both_readers(monkeypatch, [path], hash_keys=("model", "tenant"))


_AZURE_GOOD = [
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51,10,",  # no fraction; no output length
    "2023-11-16 18:15:52.5,2048,7",
]


@pytest.mark.parametrize(
    ("bad", "bulk"),
    [
        ("2023-11-16 18:15:53.25,12,3", True),  # a short fraction reads the same
        ("", False),  # a blank line: line numbers would shift
        ('"2023-11-16 18:15:53",12,3', False),  # quoted
        ("2023-11-16 18:15:53,12.0,3", False),  # a float where an integer belongs
        ("2023-11-16 18:15:53,-4,3", False),
        ("2023-11-16 18:15:53,12", False),  # a column short
        ("2023-11-16 18:15:60,12,3", False),  # a leap second Python refuses
        ("2023-02-30 18:15:53,12,3", False),
        ("2023-11-16T18:15:53Z,12,3", False),  # ISO, but not the trace's own layout
        ("1960-01-01 00:00:00,12,3", False),  # before 1970: negative
        ("2023-11-16 18:15:53,99999999999,3", False),  # beyond the per-row limit
        ("2023-11-16 18:15:53, 12,3", False),
        ("2023-11-16 18:15:53,12,3\r", True),  # this one line ends in CRLF
        ("2023-11-16 18:15:53,12\r,3", False),  # a CR alone
    ],
)
def test_azure_bulk_reader_takes_only_what_the_line_reader_reads_alike(
    tmp_path, monkeypatch, bad, bulk
):
    from analyzer.ingest.vector import read_bulk

    path = tmp_path / "azure.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens", *_AZURE_GOOD[:2], bad, *_AZURE_GOOD[2:]]
    path.write_text("\n".join(rows) + "\n")
    assert (read_bulk(str(path), "azure", 16, SALT, b"azure") is not None) == bulk
    crlf = tmp_path / "crlf.csv"  # as the public files are written
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    for p in (path, crlf):
        got = open_trace([str(p)], IngestOptions(salt=SALT, fmt="azure", jobs=1))
        with monkeypatch.context() as m:
            _line_reader_only(m)
            want = open_trace([str(p)], IngestOptions(salt=SALT, fmt="azure", jobs=1))
        assert got.table.equals(want.table) and str(got.skipped) == str(want.skipped)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 2**64 - 1), max_size=300),
    st.sampled_from([np.uint64, np.int64]),
)
def test_sorted_unique_is_numpys_unique(values, dtype):
    """The sort-based distinct values equal ``np.unique``'s (which numpy 2.3+ computes from
    a hash table, ten times slower on millions of hashes)."""
    arr = np.array(values, dtype=np.uint64).astype(dtype)
    got = spool.sorted_unique(arr)
    want = np.unique(arr)
    assert got.dtype == want.dtype
    assert np.array_equal(got, want)
