"""--jobs N: the inputs read by worker processes give exactly the one-process output."""

from __future__ import annotations

import itertools
import json
import pickle
import random
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import analyzer.ingest.io as io
from analyzer.errors import InputError, Location
from analyzer.ingest import IngestOptions, open_trace
from analyzer.ingest.io import iter_lines, line_spans
from analyzer.ingest.parallel import PieceFailed, _rebuilt, plan

FIX = Path(__file__).parent / "fixtures" / "ingest"
SALT = b"fixed test salt"


def chat_log(path: Path, n: int, seed: int = 0, timed: bool = True, bad: bool = True) -> Path:
    """Multi-turn chat requests, some out of order, with bad lines sprinkled in."""
    rnd = random.Random(seed)
    words = ["cache", "token", "prefix", "model", "block", "hash", "user", "answer", "data"]
    sessions: list[list[dict]] = []
    lines = []
    for i in range(n):
        if not sessions or rnd.random() < 0.3:
            sessions.append([{"role": "system", "content": "You help. " * rnd.randint(1, 40)}])
        msgs = rnd.choice(sessions)
        msgs.append({"role": "user", "content": " ".join(rnd.choices(words, k=rnd.randint(3, 60)))})
        rec: dict = {
            "id": f"r{i}",
            "request": {"messages": list(msgs), "user": f"u{len(sessions)}"},
        }
        if timed:
            rec["timestamp"] = 1_700_000_000 + i + rnd.choice([0, 0, 0, -3])
        lines.append(json.dumps(rec))
        msgs.append({"role": "assistant", "content": " ".join(rnd.choices(words, k=9))})
        if bad and rnd.random() < 0.05:
            lines.append(rnd.choice(["{not json", "", '{"id": "x", "request": {}}', "[1, 2]"]))
    path.write_text("\n".join(lines) + "\n")
    return path


def both(paths, **kw):
    one = open_trace([str(p) for p in paths], IngestOptions(salt=SALT, jobs=1, **kw))
    many = open_trace(
        [str(p) for p in paths], IngestOptions(salt=SALT, jobs=3, parallel_min_bytes=0, **kw)
    )
    return one, many


def same(one, many) -> None:
    assert many.table.equals(one.table)
    assert many.table.schema.metadata == one.table.schema.metadata
    assert str(many.skipped) == str(one.skipped)
    assert (many.reordered, many.untimed_files, many.mixed_unit_files, many.notes) == (
        one.reordered,
        one.untimed_files,
        one.mixed_unit_files,
        one.notes,
    )
    # Previews (a human aid, only written with --keep-previews) name, for a block where
    # two messages start, whichever one the memo let the process read first; both are
    # the text of that block.
    assert set(many.previews) == set(one.previews)


def test_a_split_log_and_whole_files_give_the_one_process_output(tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 150, seed=1)
    assert len(plan([str(log)], ["openai"], 3)) == 3
    one, many = both([log, FIX / "chat_gateway.csv", FIX / "chat.jsonl"])
    same(one, many)
    assert one.skipped.total > 0 and one.reordered > 0
    assert one.table.column("token_lcp_prev").null_count == 0


def test_an_untimed_log_is_spaced_over_the_whole_file(tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 90, seed=2, timed=False)
    one, many = both([log])
    same(one, many)
    assert one.untimed_files == [str(log)]


def test_the_token_tree_bound_falls_back_at_the_same_request(tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 120, seed=3, bad=False)
    from analyzer.ingest.pipeline import _Builder

    b = _Builder([str(log)], ["openai"], IngestOptions(salt=SALT), None)
    b.read_file(str(log), "openai")
    assert b.lcp is not None
    bound = b.lcp.memory_bytes() * 2 // 3  # passed about two thirds of the way through
    b.rows.close()
    one, many = both([log], exact_max_bytes=bound)
    same(one, many)
    assert len(one.notes) == 1 and "after " in one.notes[0]
    n = int(one.notes[0].split("after ")[1].split(" ")[0].replace(",", ""))
    assert 1 < n < 120


def test_stateful_formats_are_read_in_the_parent(tmp_path):
    paths = [FIX / "ragpulse" / "0_trace.jsonl"]
    assert plan([str(p) for p in paths], ["ragpulse"], 2)[0].in_parent
    same(*both(paths))


def test_a_user_error_in_a_worker_reaches_the_parent_whole():
    err = InputError("malformed JSON", Location("f.jsonl", 3, "x"), hint="fix it")
    failed = pickle.loads(pickle.dumps(PieceFailed(type(err), err.message, err.hint)))
    back = _rebuilt(failed)
    assert isinstance(back, InputError) and str(back) == str(err)
    assert back.exit_code == err.exit_code


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=30),
    st.booleans(),
    st.integers(1, 9),
    st.integers(1, 16),
)
def test_line_spans_cover_every_line_once(tmp_path_factory, lines, trailing, parts, chunk):
    data = b"\n".join(lines) + (b"\n" if trailing else b"")
    # Split files are uncompressed ones: random bytes may open with a compressor's magic.
    assume(not data.startswith((io.GZIP_MAGIC, io.ZSTD_MAGIC)))
    path = tmp_path_factory.mktemp("spans") / "f.txt"
    path.write_bytes(data)
    old = io.CHUNK
    io.CHUNK = chunk  # cuts found across chunk boundaries too
    try:
        spans = line_spans(path, parts)
    finally:
        io.CHUNK = old
    whole = list(iter_lines(path))
    assert [x for s in spans for x in iter_lines(path, None, s)] == whole
    assert spans[0].start == 0 and spans[-1].end == path.stat().st_size
    assert all(a.end == b.start for a, b in itertools.pairwise(spans))


def test_jobs_must_be_positive(tmp_path):
    from analyzer.errors import UsageError

    with pytest.raises(UsageError):
        open_trace([str(FIX / "chat.jsonl")], IngestOptions(salt=SALT, jobs=0))


def test_convert_jobs_flag(tmp_path):
    import typer
    from typer.testing import CliRunner

    from analyzer.cli.ingest import register
    from analyzer.errors import UsageError

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps typer in multi-command mode
    log = chat_log(tmp_path / "chat.jsonl", 40)
    outs = []
    for j in ("1", "2"):
        out = tmp_path / f"t{j}.parquet"
        salt = str(tmp_path / "salt")
        res = CliRunner().invoke(
            app, ["convert", str(log), "-o", str(out), "--salt-file", salt, "-j", j]
        )
        assert res.exit_code == 0, res.output
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    res = CliRunner().invoke(app, ["convert", str(log), "-o", str(tmp_path / "x"), "--jobs", "0"])
    assert isinstance(res.exception, UsageError)
