"""The rows of a conversion, held on disk until they can be written in arrival order.

A conversion reads requests in file order, but the canonical trace is sorted by
arrival and its ``token_lcp_prev`` column is only known once every request has been
seen. Holding every row in memory until then made peak memory grow with the log (the
block hashes alone are 16 bytes a block, several GB for a million chat requests).

:class:`RowSpool` keeps in memory only what the sort and the LCP need (arrival time,
prompt length and radix-tree index: 24 bytes a row); every ``batch_rows`` rows, or
sooner once their hashes take ``BATCH_BYTES`` (a long-prompt log's 8,192 rows hold 30 MB
of them), the rest is written as one record batch of a temporary Arrow IPC file (under
``$TMPDIR``), uncompressed (block hashes do not compress). :meth:`RowSpool.batches` then gives the
canonical rows in any order, a batch of output at a time: the input batches an output
batch needs are read back one by one (the last two stay cached, so a log that is in
time order, or nearly, reads each once), so memory holds about two input batches and
one output batch whatever the log's size. A log in random order is still read in
bounded memory, at the cost of reading batches again.

:class:`DistinctCounter` counts distinct block hashes in bounded memory: exactly up to
``max_kept`` distinct values, then on a spatial sample (values below a threshold, the
threshold halved whenever the sample outgrows the bound, as in K-minimum-values
sketches), which is unbiased because salted BLAKE2b hashes are uniform.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from analyzer.errors import OutputError
from analyzer.spill import new_dir, remove

# Columns of the canonical schema that are spooled as read (arrival_s and
# token_lcp_prev are computed at the end).
SPOOLED = pa.schema(
    [
        pa.field("request_id", pa.string()),
        pa.field("session_id", pa.string()),
        pa.field("tenant", pa.string()),
        pa.field("model", pa.string()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("block_hashes", pa.list_(pa.uint64())),
        pa.field("content_hashes", pa.list_(pa.uint64())),
        pa.field("parent_request_id", pa.string()),
        pa.field("turn", pa.int64()),
        pa.field("count_only", pa.bool_()),
        pa.field("approx_lengths", pa.bool_()),
        pa.field("cached_tokens", pa.int64()),
        pa.field("engine_prompt_tokens", pa.int64()),
        pa.field("user_id", pa.string()),
    ]
)
BATCH_ROWS = 8_192
# Rows are spooled once their block and content hashes reach this many bytes, if that
# comes before BATCH_ROWS rows: what a spool holds in memory is bounded by bytes. (The
# rows come back in batches of BATCH_ROWS whatever the spooled batches' sizes: the
# canonical file's row groups.)
BATCH_BYTES = 8 << 20


@dataclass
class _Pending:
    """Rows not yet spooled, column by column (hashes flat, 8 bytes a block)."""

    request_id: list[str] = field(default_factory=list)
    session: list[str | None] = field(default_factory=list)
    tenant: list[str | None] = field(default_factory=list)
    model: list[str | None] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int | None] = field(default_factory=list)
    hashes: array[int] = field(default_factory=lambda: array("Q"))
    n_blocks: array[int] = field(default_factory=lambda: array("q"))
    contents: array[int] = field(default_factory=lambda: array("Q"))
    has_contents: list[bool] = field(default_factory=list)
    parent: list[str | None] = field(default_factory=list)
    turn: list[int | None] = field(default_factory=list)
    count_only: list[bool] = field(default_factory=list)
    approx: list[bool] = field(default_factory=list)
    cached: list[int | None] = field(default_factory=list)
    engine_prompt: list[int | None] = field(default_factory=list)
    user: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.request_id)

    def batch(self) -> pa.RecordBatch:
        counts = np.frombuffer(self.n_blocks, dtype=np.int64)
        has = np.asarray(self.has_contents, dtype=bool)
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        coffsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(np.where(has, counts, 0), out=coffsets[1:])

        # Lists go in as numpy object arrays: given a plain list, pyarrow imports pandas
        # (a third of a second) to ask whether it is a pandas object.
        def obj(values: Sequence[object], t: pa.DataType) -> pa.Array:
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            return pa.array(arr, t)

        cols = [
            obj(self.request_id, pa.string()),
            obj(self.session, pa.string()),
            obj(self.tenant, pa.string()),
            obj(self.model, pa.string()),
            pa.array(np.asarray(self.prompt_tokens, dtype=np.int64)),
            obj(self.output_tokens, pa.int64()),
            list_array(offsets, np.frombuffer(self.hashes, dtype=np.uint64)),
            list_array(coffsets, np.frombuffer(self.contents, dtype=np.uint64), mask=~has),
            obj(self.parent, pa.string()),
            obj(self.turn, pa.int64()),
            pa.array(np.asarray(self.count_only, dtype=bool)),
            pa.array(np.asarray(self.approx, dtype=bool)),
            obj(self.cached, pa.int64()),
            obj(self.engine_prompt, pa.int64()),
            obj(self.user, pa.string()),
        ]
        return pa.RecordBatch.from_arrays(cols, schema=SPOOLED)


def list_array(offsets: np.ndarray, flat: np.ndarray, mask=None) -> pa.Array:  # type: ignore[no-untyped-def]
    """A ``list<uint64>`` array from offsets (per batch: the 2**31 limit is per batch)."""
    assert offsets[-1] < 2**31
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)),
        pa.array(flat, type=pa.uint64()),
        mask=None if mask is None else pa.array(np.asarray(mask, dtype=bool)),
    )


@dataclass(frozen=True, slots=True)
class SpoolFile:
    """A spool's rows handed to another process: its IPC file, batch sizes and sort keys."""

    directory: str
    batch_rows: tuple[int, ...]
    time: bytes  # float64 per row
    prompt_tokens: bytes  # int64 per row
    lcp_index: bytes  # int64 per row


class RowSpool:
    """Canonical rows in input order: the sort keys in memory, the rest on disk.

    The rows may come from several spool files (one per parallel worker, adopted in input
    order, see :meth:`adopt`); batches are addressed by the global row they start at.
    """

    def __init__(self, batch_rows: int | None = None) -> None:
        self.batch_rows = batch_rows or BATCH_ROWS
        assert self.batch_rows >= 1
        self.batch_hashes = max(1, BATCH_BYTES // 8)  # block and content hashes, 8 bytes each
        self.time = array("d")
        self.prompt_tokens = array("q")
        self.lcp_index = array("q")
        self._pending = _Pending()
        self._dirs: list[str] = []  # owned: removed by close()
        self._files: list[str] = []  # IPC files, in order
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._sink: pa.NativeFile | None = None
        self._starts = array("q")  # global first row of each spooled batch
        self._where: list[tuple[int, int]] = []  # (file, batch in file) of each batch
        self._n_spooled = 0

    def __len__(self) -> int:
        return len(self.time)

    def append(
        self,
        *,
        request_id: str,
        time: float,
        session: str | None,
        tenant: str | None,
        model: str | None,
        prompt_tokens: int,
        output_tokens: int | None,
        hashes: np.ndarray,
        contents: np.ndarray | None,
        lcp_index: int,
        parent: str | None,
        turn: int | None,
        count_only: bool,
        approx: bool,
        cached_tokens: int | None = None,
        engine_prompt_tokens: int | None = None,
        user: str | None = None,
    ) -> None:
        p = self._pending
        self.time.append(time)
        self.prompt_tokens.append(prompt_tokens)
        self.lcp_index.append(lcp_index)
        p.request_id.append(request_id)
        p.session.append(session)
        p.tenant.append(tenant)
        p.model.append(model)
        p.prompt_tokens.append(prompt_tokens)
        p.output_tokens.append(output_tokens)
        # A uint8 view is a bytes-like object: one copy, straight into the array.
        p.hashes.frombytes(hashes.astype(np.uint64, copy=False).view(np.uint8).data)
        p.n_blocks.append(int(hashes.size))
        p.has_contents.append(contents is not None)
        if contents is not None:
            p.contents.frombytes(contents.astype(np.uint64, copy=False).view(np.uint8).data)
        p.parent.append(parent)
        p.turn.append(turn)
        p.count_only.append(count_only)
        p.approx.append(approx)
        p.cached.append(cached_tokens)
        p.engine_prompt.append(engine_prompt_tokens)
        p.user.append(user)
        if len(p) >= self.batch_rows or len(p.hashes) + len(p.contents) >= self.batch_hashes:
            self._spool()

    def _open(self) -> None:
        d = str(new_dir("rows"))
        self._dirs.append(d)
        self._files.append(os.path.join(d, "rows.arrow"))
        self._sink = pa.OSFile(self._files[-1], "wb")
        self._writer = pa.ipc.new_file(self._sink, SPOOLED)
        self._in_file = 0

    def _spool(self) -> None:
        n = len(self._pending)
        if not n:
            return
        self._write(self._pending.batch())
        self._starts.append(self._n_spooled)
        self._where.append((len(self._files) - 1, self._in_file))
        self._in_file += 1
        self._n_spooled += n
        self._pending = _Pending()

    def _write(self, batch: pa.RecordBatch) -> None:
        try:
            if self._writer is None:
                self._open()
            assert self._writer is not None
            self._writer.write_batch(batch)
        except OSError as exc:  # a full temporary disk is an output error, in one line
            self.close()
            raise OutputError(
                f"cannot write the temporary row spool in {tempfile.gettempdir()}: "
                f"{exc.strerror or exc}",
                hint="free space there, or point TMPDIR at a larger disk",
            ) from exc

    def append_table(self, table: pa.Table, time: np.ndarray) -> None:
        """Rows already columnar (``SPOOLED`` schema; a bulk reader's), with their times;
        they have no tree index."""
        self._spool()
        n = table.num_rows
        self.time.frombytes(np.asarray(time, dtype=np.float64).tobytes())
        self.prompt_tokens.frombytes(
            np.asarray(table.column("prompt_tokens"), dtype=np.int64).tobytes()
        )
        self.lcp_index.frombytes(np.full(n, -1, dtype=np.int64).tobytes())
        for batch in table.cast(SPOOLED).to_batches(max_chunksize=self.batch_rows):
            self._write(batch)
            self._starts.append(self._n_spooled)
            self._where.append((len(self._files) - 1, self._in_file))
            self._in_file += 1
            self._n_spooled += batch.num_rows

    def _seal(self) -> None:
        """Spool what is pending and close the file being written."""
        self._spool()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    def detach(self) -> SpoolFile:
        """Everything as one spool file for :meth:`adopt` elsewhere; this spool lets go of it."""
        self._seal()
        assert len(self._files) <= 1
        sizes = np.diff(np.append(np.frombuffer(self._starts, np.int64), self._n_spooled))
        out = SpoolFile(
            self._dirs[0] if self._dirs else "",
            tuple(int(x) for x in sizes),
            self.time.tobytes(),
            self.prompt_tokens.tobytes(),
            self.lcp_index.tobytes(),
        )
        self._dirs, self._files = [], []
        return out

    def adopt(self, f: SpoolFile, lcp_base: int = 0) -> None:
        """Append the rows of ``f`` (made by :meth:`detach`); their tree indices are
        shifted by ``lcp_base`` (-1, no index, stays -1). This spool removes the file."""
        self._seal()
        if f.directory:
            self._dirs.append(f.directory)
            self._files.append(os.path.join(f.directory, "rows.arrow"))
        for k, n in enumerate(f.batch_rows):
            self._starts.append(self._n_spooled)
            self._where.append((len(self._files) - 1, k))
            self._n_spooled += n
        self.time.frombytes(f.time)
        self.prompt_tokens.frombytes(f.prompt_tokens)
        idx = np.frombuffer(f.lcp_index, dtype=np.int64)
        self.lcp_index.frombytes(np.where(idx >= 0, idx + lcp_base, -1).tobytes())

    def close(self) -> None:
        """Remove the temporary files (also done when the spool is garbage-collected)."""
        # Each step on its own: after a failed write (a full disk) the others still run,
        # so the temporary folders are removed whatever happened.
        writer, sink, self._writer, self._sink = self._writer, self._sink, None, None
        for part in (writer, sink):
            if part is not None:
                with contextlib.suppress(OSError):
                    part.close()
        for d in self._dirs:
            remove(d)
        self._dirs = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at exit, after a failed write: stay quiet
            self.close()

    def batches(self, order: np.ndarray, out_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """The spooled columns of rows ``order[0], order[1], ...``, a batch at a time."""
        self._seal()
        n = order.size  # all rows, or fewer (rows dropped as timestamp outliers)
        assert n <= len(self) == self._n_spooled
        readers: dict[int, pa.ipc.RecordBatchFileReader] = {}
        starts = np.frombuffer(self._starts, dtype=np.int64)
        step = out_rows or self.batch_rows
        cache: dict[int, pa.RecordBatch] = {}
        for a in range(0, n, step):
            rows = order[a : a + step]
            which = np.searchsorted(starts, rows, side="right") - 1
            pieces, where = [], []
            for k in np.unique(which):
                batch = cache.get(int(k))
                if batch is None:
                    fi, bi = self._where[int(k)]
                    if fi not in readers:
                        readers[fi] = pa.ipc.open_file(pa.OSFile(self._files[fi]))
                    batch = readers[fi].get_batch(bi)
                    cache[int(k)] = batch
                    while len(cache) > 2:
                        cache.pop(next(iter(cache)))
                sel = np.flatnonzero(which == k)
                idx = rows[sel] - starts[k]
                if idx[-1] - idx[0] == idx.size - 1 and np.all(idx[1:] > idx[:-1]):
                    # consecutive rows (a log in time order): a view, copied once below
                    pieces.append(batch.slice(int(idx[0]), idx.size))
                else:
                    pieces.append(batch.take(pa.array(idx)))
                where.append(sel)
            merged = pa.Table.from_batches(pieces, schema=SPOOLED).combine_chunks()
            pos = np.concatenate(where)
            if not np.array_equal(pos, np.arange(pos.size)):
                inv = np.empty_like(pos)
                inv[pos] = np.arange(pos.size)
                merged = merged.take(pa.array(inv))
            yield from merged.to_batches()


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D array, by sorting. NumPy 2.3 and later answer a
    plain ``np.unique`` from a hash table, which on millions of 64-bit hashes is about
    ten times slower than a sort (6M uint64 on this project's 2-core machine: 4.3 s
    against 0.39 s; numpy 2.4.6)."""
    s = np.sort(values)
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


class DistinctCounter:
    """Distinct uint64 values: exact up to ``max_kept``, then on a spatial sample.

    New values wait in chunks of an eighth of the bound and are merged into the sorted
    kept values by binary search, so a merge holds the kept values twice and one chunk,
    not the kept values and a whole bound of new ones sorted together. The answer does
    not depend on when merges happen: the sample's threshold ends as the largest one
    under which at most ``max_kept`` distinct values were seen."""

    def __init__(self, max_kept: int = 4_000_000) -> None:
        self.max_kept = max_kept
        self.shift = 0  # keep values < 2**(64 - shift): a 1 / 2**shift sample
        self._kept = np.empty(0, dtype=np.uint64)  # sorted, distinct
        self._new: list[np.ndarray] = []
        self._new_size = 0
        self._chunk = max(1, max_kept // 8)

    def add(self, values: np.ndarray) -> None:
        if self.shift:
            values = values[values < np.uint64(1 << (64 - self.shift))]
        self._new.append(values)
        self._new_size += values.size
        if self._new_size >= self._chunk:
            self._merge()

    def _merge(self) -> None:
        if self._new:
            new = sorted_unique(np.concatenate(self._new).astype(np.uint64, copy=False))
            self._new, self._new_size = [], 0
            at = np.searchsorted(self._kept, new)
            seen = at < self._kept.size
            seen[seen] = self._kept[at[seen]] == new[seen]
            fresh = ~seen
            self._kept = np.insert(self._kept, at[fresh], new[fresh])
        while self._kept.size > self.max_kept:
            self.shift += 1
            self._kept = self._kept[self._kept < np.uint64(1 << (64 - self.shift))]

    @property
    def sample_rate(self) -> float:
        self._merge()
        return 1.0 / (1 << self.shift)

    def estimate(self) -> int:
        """Distinct values seen (exact when ``sample_rate`` is 1)."""
        self._merge()
        return int(self._kept.size) << self.shift
