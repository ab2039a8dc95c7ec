"""Reading the inputs on several cores (``--jobs N``), with the output of one process.

The inputs are cut into pieces in file order: an uncompressed JSON-lines log of a
splittable format (``SPLITTABLE``: one record a line, no state carried between rows) into
``jobs`` byte ranges at line ends, an uncompressed gateway or generic CSV
(``SPLITTABLE_CSV``) likewise at line ends with an even number of quotes before them
(between records when quoted cells hold newlines), every other file whole. The parent
reads the first piece itself, straight into its rows and token tree, while worker
processes (started before the parent sets up its own reader, :func:`start`, so that
both import and load the tokenizer at once) read, render, tokenize and hash the others
(each with its own memos: a conversation's turns sit close together in a log, so nearly
all of a session's requests fall in one piece and its memo hits stay in that worker);
the parent adopts their rows in piece order, so rows, hashes and order are those of a
one-process run. A CSV range must end between records: its reader reads on past the cut as far as
its last record needs and raises ``SplitMisaligned`` when that record crosses the cut
(a stray quote), when a quote is never closed or the CSV is broken in it; the read is
then done again in one process. Bailian and RAGPulse files carry
state from row to row (session roots, component padding) and are read in the parent,
in their place in the order.

What is per file rather than per row is settled where a one-process run settles it:

* whether the file has timestamps is decided by its first kept row; the parent finds
  that row (reading from the top until one is kept) and tells the pieces after it;
* the timestamp unit is resolved over all the file's times once every piece is in, and
  an untimed file is spaced 1 s apart over the whole file;
* the token-exact LCP needs one radix tree over all requests. Workers do not build it:
  each records its tree operations ("continue the sequence at handle h with these new
  tokens", "a request ends at handle h"; handles are the anchors its hash memo keeps),
  so only new tokens cross processes (a few hundred bytes a chat request), and the
  parent replays them in input order into its tree. The tree's memory bound is checked
  on quantities that do not depend on the insertion path (its tokens and requests), so
  it falls back at the same request as in one process.

Nothing but hashes, counts and token ids crosses between processes (through
temporary files under ``$TMPDIR``); no prompt text.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from array import array
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from dataclasses import dataclass, replace
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import TypeAlias

import numpy as np

from analyzer.cache.token_radix import ArrivalLCP
from analyzer.errors import InputError, KvpoolError, UsageError
from analyzer.ingest.builder import TraceBuilder, release_freed_memory
from analyzer.ingest.detect import Format
from analyzer.ingest.fields import FileContext
from analyzer.ingest.io import Span, compression, line_spans
from analyzer.ingest.options import IngestOptions, SkipSummary
from analyzer.ingest.registry import records
from analyzer.ingest.spool import RowSpool, SpoolFile
from analyzer.ingest.streams import SPLITTABLE, SPLITTABLE_CSV
from analyzer.spawn import start_processes
from analyzer.spill import new_dir, remove
from analyzer.tokenize import Previews, load_tokenizer

# Formats read in the parent: they carry state between rows and across files (Langfuse:
# the sessions of traces, given to their observations).
STATEFUL = frozenset({Format.BAILIAN, Format.RAGPULSE, Format.LANGFUSE})

# What a worker builds its reader from: the run's paths, formats and options, whether the
# token tree is wanted, and how many processes read at once.
WorkerSetup: TypeAlias = tuple[list[str], list[str], IngestOptions, bool, int]
Counter: TypeAlias = "Synchronized[float]"  # input bytes read by the workers, shared


def default_jobs() -> int:
    """All the cores this process may run on: those it is pinned to, and no more than a
    container's CPU limit allows (a pod limited to 4 CPUs on a 96-core node sees 96)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = cpu_limit()
    return cores if limit is None else max(1, min(cores, limit))


def cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The CPUs a cgroup CPU quota allows, rounded up (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, as a container sees its own at the
    root), or None: no quota. joblib's ``cpu_count`` reads the same files, but importing
    joblib costs 0.1 s on every command."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else math.ceil(int(quota) / int(period))
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return math.ceil(q / p) if q > 0 and p > 0 else None


def resolve_jobs(jobs: int | None) -> int:
    """``--jobs``: None is every core, and so is more than that (each process loads its
    own reader, so processes beyond the cores only add memory and time: ``convert
    --jobs 16`` of a 137 MB log on 2 cores took 4.6 GB and 13.3 s, against 0.77 GB and
    4.3 s at ``--jobs 2``); fewer than one is a usage error. The output is the same at
    any number."""
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    cores = default_jobs()
    return cores if jobs is None else min(jobs, cores)


@dataclass(frozen=True, slots=True)
class Piece:
    """One unit of work: a file, or a byte range of one, and the file's timing so far."""

    file: int  # index into the run's paths
    path: str
    fmt: str
    span: Span | None = None
    timed: bool | None = None  # decided before this piece (None: decided in it, or later)
    time_name: str | None = None
    in_parent: bool = False
    # Among the last pieces, one for each worker: the worker that reads it lets go of its
    # reader (memos, spool buffers) before handing it back, as it most likely reads
    # nothing more (if it does, its next piece only starts with cold memos).
    release: bool = False


def plan(
    paths: list[str], fmts: list[str], jobs: int, piece_bytes: int | None = None
) -> list[Piece]:
    """The pieces of the inputs, in input order: a splittable file in ``jobs`` ranges, or
    more when ``piece_bytes`` caps a range's size."""
    out = []
    for i, (p, f) in enumerate(zip(paths, fmts, strict=True)):
        parts = jobs
        if piece_bytes:
            parts = max(jobs, -(-os.path.getsize(p) // piece_bytes))
        if f in STATEFUL:
            out.append(Piece(i, p, f, in_parent=True))
        elif f in SPLITTABLE and compression(p) == "none" and parts > 1:
            out.extend(Piece(i, p, f, span=s) for s in line_spans(p, parts))
        elif f in SPLITTABLE_CSV and compression(p) == "none" and parts > 1:
            out.extend(Piece(i, p, f, span=s) for s in line_spans(p, parts, quoted=True))
        else:
            out.append(Piece(i, p, f))
    return out


# -- the token tree's operations, recorded in a worker and replayed in the parent --------


class LcpRecorder:
    """Stands in for :class:`~analyzer.blocks.ArrivalLCP` in a worker: same calls, but
    nodes are integer handles and every call is written down (``ops``: one int64 triple
    per call; ``tokens``: the new tokens, flat)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._ops = open(os.path.join(directory, "ops.bin"), "wb")  # noqa: SIM115
        self._tokens = open(os.path.join(directory, "tokens.bin"), "wb")  # noqa: SIM115
        self._next = 1  # handle 0 is the root
        self._ends = 0
        self._buf = array("q")

    def __len__(self) -> int:
        return self._ends

    def memory_bytes(self) -> int:
        return 0  # the parent's tree is the one bounded

    def extend(self, at: int | None, tokens: np.ndarray) -> int:
        if not tokens.size:
            return at or 0
        h = self._next
        self._next += 1
        self._buf.extend((h, at or 0, int(tokens.size)))
        self._tokens.write(tokens.astype("<u4", copy=False).tobytes())
        if len(self._buf) >= 3 << 14:
            self._flush()
        return h

    def end(self, node: int) -> int:
        self._buf.extend((-1, node, 0))
        self._ends += 1
        return self._ends - 1

    def add(self, tokens: np.ndarray) -> int:
        return self.end(self.extend(None, tokens))

    def _flush(self) -> None:
        self._ops.write(self._buf.tobytes())
        self._buf = array("q")

    def close(self) -> None:
        self._flush()
        self._ops.close()
        self._tokens.close()


def replay(b: TraceBuilder, directory: str, rows_before: int, row_of_end: np.ndarray) -> None:
    """Apply a worker's recorded tree operations to the parent's tree, in order.

    ``row_of_end[k]`` is the piece's row (0-based) whose request the ``k``-th end
    records; the tree's bound is checked after each, as :meth:`TraceBuilder.read_rows` does.
    """
    nodes: dict[int, int] = {}
    with (
        open(os.path.join(directory, "ops.bin"), "rb") as fo,
        open(os.path.join(directory, "tokens.bin"), "rb") as ft,
    ):
        k = 0
        while b.lcp is not None:
            ops = np.fromfile(fo, dtype=np.int64, count=3 << 14).reshape(-1, 3)
            if not ops.size:
                break
            # The chunk's new tokens in one read, each extension a view into them.
            chunk = np.fromfile(ft, dtype="<u4", count=int(ops[ops[:, 0] >= 0, 2].sum()))
            pos = 0
            for h, at, n in ops.tolist():
                lcp = b.lcp
                if lcp is None:
                    break
                if h >= 0:
                    tokens = chunk[pos : pos + n]
                    pos += n
                    nodes[h] = lcp.extend(nodes.get(at) if at else None, tokens)
                else:
                    lcp.end(nodes[at] if at else ArrivalLCP.root)
                    if lcp.memory_bytes() > b.opts.exact_max_bytes:
                        nodes.clear()  # so that the drop's collection frees the tree
                        b.drop_exact(rows_before + int(row_of_end[k]) + 1)
                    k += 1


# -- the worker side ---------------------------------------------------------------------

_worker: TraceBuilder | None = None
_worker_setup: WorkerSetup | None = None
_counter: Counter | None = None  # the parent's progress counter (a shared double)


@dataclass(frozen=True, slots=True)
class PieceResult:
    spool: SpoolFile
    iso: bytes  # one bool per kept row
    lines: bytes  # int64 per kept row: its line in the file
    id_hashes: bytes  # uint64 per row with a request id (duplicates are counted)
    lcp_dir: str  # recorded tree operations ("" when the tree is not computed)
    skipped: SkipSummary
    previews: dict[int, tuple[str, str]]  # hash -> (role, text head), as Previews keeps them
    stats: tuple[int, int, int, int]  # parts seen, parts tokenized, tokens encoded, blocks
    timed: bool | None  # the file's timing as the piece ended


@dataclass(frozen=True, slots=True)
class PieceFailed:
    """A user-facing error raised in a worker, in a form that survives pickling."""

    kind: type[KvpoolError]
    message: str
    hint: str | None


def init_worker(counter: Counter | None, tokenizer: str | None) -> None:
    """A worker's start, before the run's settings are known (:func:`start`): the ingest
    modules imported and the tokenizer loaded while the parent sets itself up."""
    global _counter
    _counter = counter
    if tokenizer is not None:
        with suppress(KvpoolError):  # the parent's own load reports it
            load_tokenizer(tokenizer)  # kept by tiktoken for the builder


def _builder(setup: WorkerSetup) -> TraceBuilder:
    """This worker's reader for the run's ``setup`` (paths, formats, options, whether the
    token tree is wanted, processes), built at its first piece; its memos stay across
    the pieces it reads."""
    global _worker, _worker_setup
    if _worker is None or _worker_setup != setup:
        paths, fmts, opts, exact, processes = setup
        counter = _counter

        def advance(n: float) -> None:
            assert counter is not None
            with counter.get_lock():
                counter.value += n

        _worker = TraceBuilder(
            paths, fmts, opts, advance if counter is not None else None, processes
        )
        _worker.exact_wanted = exact
        _worker_setup = setup
    return _worker


def run_piece(piece: Piece, setup: WorkerSetup) -> PieceResult | PieceFailed:
    """Read ``piece`` with this worker's builder for ``setup``; a user-facing error comes
    back as a :class:`PieceFailed`."""
    global _worker, _worker_setup
    try:
        return _read_piece(_builder(setup), piece)
    except KvpoolError as exc:
        return PieceFailed(type(exc), str(exc.message), exc.hint)
    finally:
        if piece.release:
            # Its memos were 190 MB of the worker's 354 MiB at the 50k long-prompt log,
            # held beside the parent's peak as the parent adopts the rows.
            _worker = _worker_setup = None
            release_freed_memory()


def _read_piece(b: TraceBuilder, piece: Piece) -> PieceResult:
    r = b.renderer
    before = (r.parts_seen, r.parts_tokenized, r.tokens_encoded) if r is not None else (0, 0, 0)
    blocks_before = b.hasher.blocks_hashed
    b.rows = RowSpool()
    b.skipped = SkipSummary(max_examples=b.opts.max_examples)
    b.previews = Previews()
    b.request_id_hashes = array("Q")
    b.hasher.forget()  # handles of the last piece's recorder must not be recalled
    lcp_dir = ""
    if b.exact_wanted:
        lcp_dir = str(new_dir("lcp"))  # token spill: the prompts, decodable
        b.lcp = LcpRecorder(lcp_dir)
    ctx = FileContext(piece.path, piece.fmt, b.opts, shared=b.shared)
    ctx.timed, ctx.time_name = piece.timed, piece.time_name
    try:
        iso, lines = b.read_rows(ctx, records(piece.path, piece.fmt, b.advance, piece.span))
    finally:
        if isinstance(b.lcp, LcpRecorder):
            b.lcp.close()
    after = (r.parts_seen, r.parts_tokenized, r.tokens_encoded) if r is not None else (0, 0, 0)
    return PieceResult(
        spool=b.rows.detach(),
        iso=np.asarray(iso, dtype=bool).tobytes(),
        lines=np.asarray(lines, dtype=np.int64).tobytes(),
        id_hashes=b.request_id_hashes.tobytes(),
        lcp_dir=lcp_dir,
        skipped=b.skipped,
        previews=dict(b.previews._raw),
        stats=(
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2],
            b.hasher.blocks_hashed - blocks_before,
        ),
        timed=ctx.timed,
    )


# -- the parent side ---------------------------------------------------------------------


@dataclass(slots=True)
class Started:
    """A ``--jobs`` read's pieces (the first one read in the parent) and the worker
    processes started for the others before the parent set up its reader (:func:`start`;
    None when every piece is the parent's)."""

    pieces: list[Piece]
    pool: ProcessPoolExecutor | None
    counter: Counter | None  # a shared progress counter
    workers: int = 0  # processes in ``pool``

    def stop(self, wait: bool = True) -> None:
        """Stop the workers: the read is not going to happen, or is over. ``wait=False``
        (every piece adopted): they exit in the background while the parent writes,
        rather than before (a worker's exit took 0.36 s), and the interpreter joins them
        as it exits."""
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)


def start(
    paths: list[str], fmts: list[str], tokenizer: str | None, jobs: int, progress: bool
) -> Started:
    """The pieces of a ``--jobs`` read, and its worker processes started now, so that
    they import and load the ``tokenizer`` (the bundled one's name, or None) while the
    parent does the same (a worker started when the parent began reading began its own
    piece 1.5 s later). :func:`read_parallel` then uses them; call :meth:`Started.stop`
    if it is never called."""
    pieces = plan(paths, fmts, jobs)
    if pieces and not pieces[0].in_parent:
        # The parent reads the first piece itself, straight into its rows and token tree,
        # while the workers read the others.
        pieces[0] = replace(pieces[0], in_parent=True)
    n_work = sum(not p.in_parent for p in pieces)
    if not n_work:
        return Started(pieces, None, None)
    n_pool = max(1, min(n_work, jobs - 1 if n_work < jobs else jobs))
    ctx = mp.get_context("spawn")
    counter = ctx.Value("d", 0.0) if progress else None
    # concurrent.futures, not multiprocessing.Pool: a worker that dies (killed, out of
    # memory) fails the run with BrokenProcessPool instead of leaving it waiting forever.
    pool = ProcessPoolExecutor(
        n_pool, mp_context=ctx, initializer=init_worker, initargs=(counter, tokenizer)
    )
    start_processes(pool, n_pool)  # not waited for: the parent sets itself up meanwhile
    return Started(pieces, pool, counter, n_pool)


def read_parallel(b: TraceBuilder, jobs: int, started: Started) -> None:
    """Read ``b``'s inputs into ``b`` (rows, skips, previews, tree, times) over the
    processes of ``started`` (:func:`start`, for the same inputs and ``jobs``), as ``for
    each file: b.read_file(...)`` would."""
    pool, counter = started.pool, started.counter
    pending: list[Future[PieceResult | PieceFailed] | None] = []
    taken = 0.0

    def fetch(i: int, piece: Piece) -> PieceResult | PieceFailed:
        nonlocal taken
        job = pending[i]
        assert job is not None
        while True:
            try:
                res: PieceResult | PieceFailed = job.result(timeout=0.2)
                break
            except FutureTimeout:
                taken = _progress(b, counter, taken)
            except BrokenProcessPool as exc:
                raise InputError(
                    f"a worker reading {piece.path} stopped ({exc})",
                    hint="retry with --jobs 1 (it may have run out of memory)",
                ) from exc
        pending[i] = None
        return res

    try:  # the workers are stopped whatever fails, from here on
        pieces, split_timing = with_timing(b, started.pieces)
        work = [i for i, p in enumerate(pieces) if not p.in_parent]
        for i in work[max(0, len(work) - started.workers) :]:
            pieces[i] = replace(pieces[i], release=True)
        wopts = replace(b.opts, block_size=b.block_size, salt=b.salt, exact=False)
        setup: WorkerSetup = (b.paths, b.fmts, wopts, b.lcp is not None, jobs)
        pending.extend(
            None if p.in_parent or pool is None else pool.submit(run_piece, p, setup)
            for p in pieces
        )
        if pool is not None:
            # Every piece is submitted: each worker exits once no piece is left for it,
            # handing back its tokenizer and memos (354 MiB at the 50k long-prompt log)
            # while the parent still reads its own piece and adopts the others, rather
            # than idling beside the parent's peak until the read is over.
            pool.shutdown(wait=False)
        assemble(b, pieces, split_timing, fetch)
        _progress(b, counter, taken)
    finally:
        live = [job for job in pending if job is not None]  # not adopted: an error stopped it
        for job in live:
            job.cancel()
        # The pieces still being read finish (their spool folders are then removed);
        # nothing is left to wait for once every piece was adopted.
        wait_futures(live)
        started.stop(wait=bool(live))
        for job in live:
            if job.done() and not job.cancelled() and not job.exception():
                res = job.result()
                if isinstance(res, PieceResult):
                    _discard(res)


def assemble(
    b: TraceBuilder,
    pieces: list[Piece],
    split_timing: dict[int, bool | None],
    fetch: Callable[[int, Piece], PieceResult | PieceFailed],
) -> None:
    """The pieces' rows adopted into ``b`` in input order (``fetch(i, piece)`` waits for
    a worker's result; pieces ``in_parent`` are read here), each file's times settled
    once its last piece is in. Shared by the process pool and the Ray cluster."""
    first, timed = 0, None
    isos: list[np.ndarray] = []
    lines: list[np.ndarray] = []
    for i, piece in enumerate(pieces):
        if i == 0 or pieces[i - 1].file != piece.file:
            first, isos, lines, timed = len(b.rows), [], [], None
        bulk = b.bulk_rows(piece.path, piece.fmt) if piece.in_parent and not piece.span else None
        if bulk is not None:  # a stateful public trace (Bailian), read in columns
            isos.append(bulk[0])
            lines.append(bulk[1])
            timed = True
        elif piece.in_parent:
            fctx = FileContext(piece.path, piece.fmt, b.opts, shared=b.shared)
            fctx.timed, fctx.time_name = piece.timed, piece.time_name
            recs = records(piece.path, piece.fmt, b.advance, piece.span)
            iso, ln = b.read_rows(fctx, recs)
            isos.append(np.asarray(iso, dtype=bool))
            lines.append(np.asarray(ln, dtype=np.int64))
            timed = split_timing.get(piece.file, fctx.timed) if piece.span else fctx.timed
        else:
            res = fetch(i, piece)
            if isinstance(res, PieceFailed):
                raise rebuilt_error(res)
            _adopt(b, res, isos)
            lines.append(np.frombuffer(res.lines, dtype=np.int64))
            timed = split_timing.get(piece.file, res.timed)
        if i + 1 == len(pieces) or pieces[i + 1].file != piece.file:
            iso_all = np.concatenate(isos) if isos else np.empty(0, dtype=bool)
            line_all = np.concatenate(lines) if lines else np.empty(0, dtype=np.int64)
            b.settle_times(piece.path, piece.fmt, timed, first, iso_all, line_all)


def _progress(b: TraceBuilder, counter: Counter | None, taken: float) -> float:
    if counter is None or b.advance is None:
        return taken
    now = float(counter.value)
    if now > taken:
        b.advance(now - taken)
    return now


def rebuilt_error(f: PieceFailed) -> KvpoolError:
    """The error a worker raised, raised again in the parent (its kind, message, hint)."""
    exc: KvpoolError = f.kind.__new__(f.kind)
    KvpoolError.__init__(exc, f.message, hint=f.hint)
    return exc


def _discard(res: PieceResult) -> None:
    if res.spool.directory:
        remove(res.spool.directory)
    if res.lcp_dir:
        remove(res.lcp_dir)


def _adopt(b: TraceBuilder, res: PieceResult, isos: list[np.ndarray]) -> None:
    """A worker's piece appended to ``b`` in input order."""
    rows_before = len(b.rows)
    lcp_base = len(b.lcp) if b.lcp is not None else 0
    b.rows.adopt(res.spool, lcp_base)
    b.request_id_hashes.frombytes(res.id_hashes)
    isos.append(np.frombuffer(res.iso, dtype=bool))
    for reason, n in res.skipped.by_reason.items():
        b.skipped.by_reason[reason] = b.skipped.by_reason.get(reason, 0) + n
    b.skipped.total += res.skipped.total
    room = b.skipped.max_examples - len(b.skipped.examples)
    b.skipped.examples.extend(res.skipped.examples[: max(0, room)])
    for h, v in res.previews.items():
        if len(b.previews) >= b.opts.max_previews:
            break
        if h not in b.previews:
            b.previews._raw[h] = v
    w, s = b.piece_stats, res.stats
    b.piece_stats = (w[0] + s[0], w[1] + s[1], w[2] + s[2], w[3] + s[3])
    if res.lcp_dir:
        try:
            if b.lcp is not None:
                idx = np.frombuffer(res.spool.lcp_index, dtype=np.int64)
                replay(b, res.lcp_dir, rows_before, np.flatnonzero(idx >= 0))
        finally:
            remove(res.lcp_dir)


def with_timing(b: TraceBuilder, pieces: list[Piece]) -> tuple[list[Piece], dict[int, bool | None]]:
    """Each range of a split file told the file's timing when the row that decided it
    (its first kept row, found by reading from the top) lies before the range."""
    timing: dict[int, tuple[int | None, bool | None, str | None]] = {}
    out = []
    for p in pieces:
        if p.span is not None:
            if p.file not in timing:
                timing[p.file] = b.first_timing(p.path, p.fmt)
            line, timed, name = timing[p.file]
            if line is not None and p.span.first_line > line:
                p = replace(p, timed=timed, time_name=name)
        out.append(p)
    return out, {f: t[1] for f, t in timing.items()}
