"""--jobs N: the inputs read by worker processes give exactly the one-process output."""

from __future__ import annotations

import csv
import io as stdio
import itertools
import pickle
import random
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import analyzer.ingest.io as io
from analyzer.errors import InputError, Location
from analyzer.ingest import IngestOptions, open_trace
from analyzer.ingest.io import iter_lines, line_spans
from analyzer.ingest.parallel import PieceFailed, plan, rebuilt_error
from analyzer.ingest.streams import SplitMisaligned, csv_records
from tests.helpers.ingest import FIX, SALT, chat_log, same


def both(paths, **kw):
    one = open_trace([str(p) for p in paths], IngestOptions(salt=SALT, jobs=1, **kw))
    many = open_trace(
        [str(p) for p in paths], IngestOptions(salt=SALT, jobs=3, parallel_min_bytes=0, **kw)
    )
    return one, many


@pytest.mark.slow
def test_a_split_log_and_whole_files_give_the_one_process_output(tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 150, seed=1)
    assert len(plan([str(log)], ["openai"], 3)) == 3
    one, many = both([log, FIX / "chat_gateway.csv", FIX / "chat.jsonl"])
    same(one, many)
    assert one.skipped.total > 0 and one.reordered > 0
    assert one.table.column("token_lcp_prev").null_count == 0


@pytest.mark.slow
def test_an_untimed_log_is_spaced_over_the_whole_file(tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 90, seed=2, timed=False)
    one, many = both([log])
    same(one, many)
    assert one.untimed_files == [str(log)]


@pytest.mark.slow
def test_the_token_tree_bound_falls_back_at_the_same_request(tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 120, seed=3, bad=False)
    from analyzer.ingest.builder import TraceBuilder

    b = TraceBuilder([str(log)], ["openai"], IngestOptions(salt=SALT), None)
    b.read_file(str(log), "openai")
    assert b.lcp is not None
    bound = b.lcp.memory_bytes() * 2 // 3  # passed about two thirds of the way through
    b.rows.close()
    one, many = both([log], exact_max_bytes=bound)
    same(one, many)
    assert len(one.notes) == 1 and "after " in one.notes[0]
    n = int(one.notes[0].split("after ")[1].split(" ")[0].replace(",", ""))
    assert 1 < n < 120


@pytest.mark.slow
def test_the_memos_are_caches_whose_bounds_the_processes_share(tmp_path, monkeypatch):
    """The memos' bounds change the work, never the output; each of N reading processes
    holds an N-th of them, so memory does not grow with --jobs."""
    import analyzer.ingest.builder as builder
    from analyzer.ingest.load import read_inputs

    log = chat_log(tmp_path / "chat.jsonl", 150, seed=4)
    opts = IngestOptions(salt=SALT, jobs=3, parallel_min_bytes=0)
    b = read_inputs([str(log)], opts, None)
    assert isinstance(b, builder.TraceBuilder) and b.renderer is not None
    assert b.hasher.memo_max_hashes == builder.MEMO_HASHES // 3
    assert b.renderer.memo_max_tokens == builder.MEMO_TOKENS // 3
    b.rows.close()

    roomy = open_trace([str(log)], IngestOptions(salt=SALT, jobs=1))
    monkeypatch.setattr(builder, "MEMO_TOKENS", 40)  # a message or two
    monkeypatch.setattr(builder, "MEMO_HASHES", 4)
    tight = open_trace([str(log)], IngestOptions(salt=SALT, jobs=1))
    same(roomy, tight)
    assert tight.stats["parts_tokenized"] > roomy.stats["parts_tokenized"]
    assert tight.stats["blocks_hashed"] > roomy.stats["blocks_hashed"]


def test_stateful_formats_are_read_in_the_parent(tmp_path):
    paths = [FIX / "ragpulse" / "0_trace.jsonl"]
    assert plan([str(p) for p in paths], ["ragpulse"], 2)[0].in_parent
    same(*both(paths))


def test_a_user_error_in_a_worker_reaches_the_parent_whole():
    err = InputError("malformed JSON", Location("f.jsonl", 3, "x"), hint="fix it")
    failed = pickle.loads(pickle.dumps(PieceFailed(type(err), err.message, err.hint)))
    back = rebuilt_error(failed)
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


def csv_log(path: Path, n: int, seed: int = 0, quirks: bool = True) -> Path:
    """A generic CSV of chat prompts whose quoted cells hold newlines, quotes and commas;
    ``quirks``: blank lines, a row with too few columns, a line that is not UTF-8, an
    empty prompt."""
    rnd = random.Random(seed)
    words = ["cache", "token", '"quoted"', "pre,fix", "model", "block\nline", "hash", "user"]
    systems = ["You help.\n" * rnd.randint(1, 30) for _ in range(4)]
    out = stdio.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["time", "session", "prompt", "output_tokens"])
    chunks = [out.getvalue().encode()]
    for i in range(n):
        out.seek(0)
        out.truncate()
        prompt = rnd.choice(systems) + " ".join(rnd.choices(words, k=rnd.randint(2, 40)))
        w.writerow([1_700_000_000 + i, f"s{rnd.randint(0, 9)}", prompt, rnd.randint(1, 50)])
        chunks.append(out.getvalue().encode())
        if quirks and rnd.random() < 0.05:
            chunks.append(rnd.choice([b"\n", b"1700000000,s1\n", b"\xff\xfe,x,y,1\n", b"1,s,,3\n"]))
    path.write_bytes(b"".join(chunks))
    return path


@pytest.mark.slow
def test_a_split_csv_gives_the_one_process_output(tmp_path):
    log = csv_log(tmp_path / "chat.csv", 200, seed=3)
    assert len(plan([str(log)], ["generic-csv"], 3)) == 3
    one, many = both([log, FIX / "chat_gateway.csv"])
    same(one, many)
    assert one.skipped.total > 0
    assert one.table.column("token_lcp_prev").null_count == 0


def _recs(path: Path, span=None) -> list:
    return [
        (line, (r.reason, r.field, r.fatal) if isinstance(r, Exception) else r)
        for line, r in csv_records(str(path), None, span)
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 7), st.integers(1, 64))
@example(seed=157, parts=5, chunk=1)  # a range whose last line is not UTF-8
def test_csv_spans_read_the_records_of_the_whole_file(tmp_path_factory, seed, parts, chunk):
    path = csv_log(tmp_path_factory.mktemp("csv") / "f.csv", 30, seed=seed)
    old = io.CHUNK
    io.CHUNK = chunk  # cuts found across chunk boundaries too
    try:
        spans = line_spans(path, parts, quoted=True)
    finally:
        io.CHUNK = old
    assert [r for s in spans for r in _recs(path, s)] == _recs(path)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 7), st.integers(0, 29))
def test_a_broken_quote_in_a_split_csv_is_never_misread(tmp_path_factory, seed, parts, at):
    """A stray quote moves the cuts off record boundaries: a range either reads what the
    whole file gives or says SplitMisaligned (and the file is then read whole)."""
    path = csv_log(tmp_path_factory.mktemp("csv") / "f.csv", 30, seed=seed)
    lines = path.read_bytes().split(b"\n")
    lines[1 + at] = lines[1 + at].replace(b",", b',"', 1)
    path.write_bytes(b"\n".join(lines))
    whole = _recs(path)
    try:
        got = [r for s in line_spans(path, parts, quoted=True) for r in _recs(path, s)]
    except SplitMisaligned:
        return
    assert got == whole


@pytest.mark.slow
def test_a_split_csv_with_an_unterminated_quote_gives_the_one_process_output(tmp_path):
    log = csv_log(tmp_path / "chat.csv", 200, seed=4)
    lines = log.read_bytes().split(b"\n")
    lines[len(lines) // 3] += b',"never closed'
    log.write_bytes(b"\n".join(lines))
    one, many = both([log])
    same(one, many)
    assert "unterminated quote" in str(one.skipped)


@pytest.mark.slow
def test_duplicate_request_ids_across_pieces_are_counted(tmp_path):
    log = chat_log(tmp_path / "a.jsonl", 60, seed=2, bad=False)
    copy = tmp_path / "b.jsonl"
    copy.write_bytes(log.read_bytes())
    one, many = both([log, copy])
    same(one, many)
    assert any("duplicate request ids: 60 rows" in n for n in one.notes)


def test_jobs_must_be_positive(tmp_path):
    from analyzer.errors import UsageError

    with pytest.raises(UsageError):
        open_trace([str(FIX / "chat.jsonl")], IngestOptions(salt=SALT, jobs=0))


def test_jobs_beyond_the_cores_run_as_many_processes_as_cores(tmp_path, monkeypatch, capsys):
    """`--jobs 16` on a 2-core machine: 2 processes and a note, not 16 readers competing
    for two cores with a tokenizer each (6x the memory, 3x the time); the same output."""
    import analyzer.ingest.parallel as parallel
    from analyzer.cli.options import machine_jobs
    from analyzer.errors import UsageError

    monkeypatch.setattr(parallel, "default_jobs", lambda: 2)
    assert machine_jobs(16) == 2
    assert "note: --jobs 16 is more than the 2 cores" in capsys.readouterr().err
    assert (machine_jobs(None), machine_jobs(1), machine_jobs(2)) == (2, 1, 2)
    assert machine_jobs(16, say=False) == 2
    assert capsys.readouterr().err == ""
    with pytest.raises(UsageError):
        machine_jobs(0)


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({}, None),  # no cgroup files: no quota
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "200000 100000\n"}, 2),
        ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs: two processes share them
        ({"cpu.max": "50000 100000\n"}, 1),
        ({"cpu.max": "garbled\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ],
)
def test_a_containers_cpu_limit_bounds_the_default_jobs(tmp_path, monkeypatch, files, limit):
    import analyzer.ingest.parallel as parallel

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert parallel.cpu_limit(tmp_path) == limit
    monkeypatch.setattr(parallel, "cpu_limit", lambda: limit)
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: set(range(96)))
    assert parallel.default_jobs() == (96 if limit is None else limit)


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


def test_workers_started_before_a_reader_that_fails_are_stopped(tmp_path):
    """The workers start before the parent's reader is set up (they load the tokenizer
    meanwhile); a setting the reader refuses stops them too, with its one-line error."""
    import multiprocessing

    from analyzer.errors import KvpoolError

    log = chat_log(tmp_path / "chat.jsonl", 60, seed=2)
    before = set(multiprocessing.active_children())
    with pytest.raises(KvpoolError):
        open_trace(
            [str(log)],
            IngestOptions(
                salt=SALT, jobs=2, parallel_min_bytes=0, tokenizer=str(tmp_path / "none.json")
            ),
        )
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.slow
def test_a_worker_reads_several_pieces_with_one_reader(tmp_path, monkeypatch):
    """More pieces than workers (several files): each worker builds its reader once and
    keeps its memos across the pieces it reads; the output is the one-process one.

    The worker's side runs here, in this process, as a worker runs it: every piece of
    the run's setup is read by the one reader built at the first, and a piece read
    again tokenizes no part (its parts are in the memo the earlier pieces filled)."""
    import analyzer.ingest.parallel as parallel
    from analyzer.spill import remove

    logs = [chat_log(tmp_path / f"chat{i}.jsonl", 40, seed=10 + i) for i in range(4)]
    one, many = both(logs)
    same(one, many)

    monkeypatch.setattr(parallel, "_worker", None)  # this process's reader, restored after
    monkeypatch.setattr(parallel, "_worker_setup", None)
    paths = [str(p) for p in logs]
    setup = (paths, ["openai"] * 4, IngestOptions(salt=SALT, block_size=16), False, 3)
    pieces = plan(paths, ["openai"] * 4, 3)
    assert len(pieces) > 3  # more pieces than the run's processes
    readers, results = set(), []
    for piece in [*pieces, pieces[0]]:
        res = parallel.run_piece(piece, setup)
        assert isinstance(res, parallel.PieceResult)
        readers.add(id(parallel._worker))
        results.append(res)
        if res.spool.directory:
            remove(res.spool.directory)
    assert len(readers) == 1  # one reader for every piece
    parts_tokenized = [r.stats[1] for r in results]
    assert parts_tokenized[0] > 0
    assert parts_tokenized[-1] == 0  # piece 0 again: every part from the memo
    again, first = results[-1], results[0]  # and the same rows
    assert (again.spool.prompt_tokens, again.lines) == (first.spool.prompt_tokens, first.lines)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP"])
def test_a_parallel_convert_stopped_by_a_signal_leaves_no_worker_and_no_spool(tmp_path, how):
    """`kill` (or a closed terminal) in the middle of `convert --jobs 2`: exit 130 as after
    Ctrl-C, no output, no spooled rows or token-tree files left in the temp folder, and no
    worker still running. Before, the parent died where it stood: its spool folders
    stayed and a worker went on reading, holding the terminal's pipes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "KVPOOL_NO_PROGRESS": "1"}
    kvpool = [sys.executable, "-m", "analyzer.cli"]
    log = tmp_path / "chat.jsonl"  # above the 32 MB that --jobs needs to split a log
    made = subprocess.run(
        [*kvpool, "synth", "--profile", "chat", "-n", "6000", "--seed", "3", "-o", str(log)],
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    assert log.stat().st_size > 32 << 20
    out = tmp_path / "t.parquet"
    proc = subprocess.Popen(
        [*kvpool, "convert", str(log), "-o", str(out), "-j", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(tmp.glob("kvpool-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(tmp.glob("kvpool-*")), "the read never started"
        time.sleep(0.5)
        proc.send_signal(getattr(signal, how))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    assert not out.exists()

    def ours() -> list[str]:  # processes still running with this test's temp folder
        alive = []
        for d in Path("/proc").iterdir():
            try:
                if f"TMPDIR={tmp}".encode() in (d / "environ").read_bytes().split(b"\0"):
                    alive.append(d.name)
            except OSError:
                continue
        return alive

    deadline = time.monotonic() + 20
    while (ours() or any(tmp.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ours() == []
    assert sorted(p.name for p in tmp.iterdir()) == []
