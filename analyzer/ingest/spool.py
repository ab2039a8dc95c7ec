"""The rows of a conversion, held on disk until they can be written in arrival order.

A conversion reads requests in file order, but the canonical trace is sorted by
arrival and its ``token_lcp_prev`` column is only known once every request has been
seen. Holding every row in memory until then made peak memory grow with the log (the
block hashes alone are 16 bytes a block, several GB for a million chat requests).

:class:`RowSpool` keeps in memory only what the sort and the LCP need (arrival time,
prompt length and radix-tree index: 24 bytes a row); every ``batch_rows`` rows the rest
is written as one record batch of a temporary Arrow IPC file (under ``$TMPDIR``),
uncompressed (block hashes do not compress). :meth:`RowSpool.batches` then gives the
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
import shutil
import tempfile
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from analyzer.errors import OutputError

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
    ]
)
BATCH_ROWS = 8_192


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

    def __len__(self) -> int:
        return len(self.request_id)

    def batch(self) -> pa.RecordBatch:
        counts = np.frombuffer(self.n_blocks, dtype=np.int64)
        has = np.asarray(self.has_contents, dtype=bool)
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        coffsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(np.where(has, counts, 0), out=coffsets[1:])
        cols = [
            pa.array(self.request_id, pa.string()),
            pa.array(self.session, pa.string()),
            pa.array(self.tenant, pa.string()),
            pa.array(self.model, pa.string()),
            pa.array(self.prompt_tokens, pa.int64()),
            pa.array(self.output_tokens, pa.int64()),
            list_array(offsets, np.frombuffer(self.hashes, dtype=np.uint64)),
            list_array(coffsets, np.frombuffer(self.contents, dtype=np.uint64), mask=~has),
            pa.array(self.parent, pa.string()),
            pa.array(self.turn, pa.int64()),
            pa.array(self.count_only, pa.bool_()),
            pa.array(self.approx, pa.bool_()),
            pa.array(self.cached, pa.int64()),
            pa.array(self.engine_prompt, pa.int64()),
        ]
        return pa.RecordBatch.from_arrays(cols, schema=SPOOLED)


def list_array(offsets: np.ndarray, flat: np.ndarray, mask=None) -> pa.Array:  # type: ignore[no-untyped-def]
    """A ``list<uint64>`` array from offsets (per batch: the 2**31 limit is per batch)."""
    assert offsets[-1] < 2**31
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)),
        pa.array(flat, type=pa.uint64()),
        mask=None if mask is None else pa.array(mask),
    )


class RowSpool:
    """Canonical rows in input order: the sort keys in memory, the rest on disk."""

    def __init__(self, batch_rows: int | None = None) -> None:
        self.batch_rows = batch_rows or BATCH_ROWS
        assert self.batch_rows >= 1
        self.time = array("d")
        self.prompt_tokens = array("q")
        self.lcp_index = array("q")
        self._pending = _Pending()
        self._dir: str | None = None
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._reader: pa.ipc.RecordBatchFileReader | None = None
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
        if len(p) >= self.batch_rows:
            self._spool()

    def _spool(self) -> None:
        if not len(self._pending):
            return
        try:
            if self._writer is None:
                self._dir = tempfile.mkdtemp(prefix="kvpool-rows-")
                self._sink = pa.OSFile(os.path.join(self._dir, "rows.arrow"), "wb")
                self._writer = pa.ipc.new_file(self._sink, SPOOLED)
            self._writer.write_batch(self._pending.batch())
        except OSError as exc:  # a full temporary disk is an output error, in one line
            self.close()
            raise OutputError(
                f"cannot write the temporary row spool in {tempfile.gettempdir()}: "
                f"{exc.strerror or exc}",
                hint="free space there, or point TMPDIR at a larger disk",
            ) from exc
        self._n_spooled += len(self._pending)
        self._pending = _Pending()

    def close(self) -> None:
        """Remove the temporary file (also done when the spool is garbage-collected)."""
        # Each step on its own: after a failed write (a full disk) the others still run,
        # so the temporary folder is removed whatever happened.
        writer, sink, self._writer, self._sink, self._reader = (
            self._writer,
            self._sink,
            None,
            None,
            None,
        )
        for part in (writer, sink):
            if part is not None:
                with contextlib.suppress(OSError):
                    part.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at exit, after a failed write: stay quiet
            self.close()

    def batches(self, order: np.ndarray, out_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """The spooled columns of rows ``order[0], order[1], ...``, a batch at a time."""
        self._spool()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            assert self._sink is not None
            self._sink.close()
            self._sink = None
            assert self._dir is not None
            self._reader = pa.ipc.open_file(pa.OSFile(os.path.join(self._dir, "rows.arrow")))
        n = order.size  # all rows, or fewer (rows dropped as timestamp outliers)
        assert n <= len(self)
        step = out_rows or self.batch_rows
        cache: dict[int, pa.RecordBatch] = {}
        for a in range(0, n, step):
            rows = order[a : a + step]
            which = rows // self.batch_rows
            pieces, where = [], []
            for k in np.unique(which):
                batch = cache.get(int(k))
                if batch is None:
                    assert self._reader is not None
                    batch = self._reader.get_batch(int(k))
                    cache[int(k)] = batch
                    while len(cache) > 2:
                        cache.pop(next(iter(cache)))
                sel = np.flatnonzero(which == k)
                pieces.append(batch.take(pa.array(rows[sel] - k * self.batch_rows)))
                where.append(sel)
            merged = pa.Table.from_batches(pieces, schema=SPOOLED).combine_chunks()
            pos = np.concatenate(where)
            if not np.array_equal(pos, np.arange(pos.size)):
                inv = np.empty_like(pos)
                inv[pos] = np.arange(pos.size)
                merged = merged.take(pa.array(inv))
            yield from merged.to_batches()


class DistinctCounter:
    """Distinct uint64 values: exact up to ``max_kept``, then on a spatial sample."""

    def __init__(self, max_kept: int = 4_000_000) -> None:
        self.max_kept = max_kept
        self.shift = 0  # keep values < 2**(64 - shift): a 1 / 2**shift sample
        self._kept = np.empty(0, dtype=np.uint64)
        self._new: list[np.ndarray] = []
        self._new_size = 0

    def add(self, values: np.ndarray) -> None:
        if self.shift:
            values = values[values < np.uint64(1 << (64 - self.shift))]
        self._new.append(values)
        self._new_size += values.size
        if self._new_size >= self.max_kept:
            self._merge()

    def _merge(self) -> None:
        if self._new:
            self._kept = np.unique(np.concatenate([self._kept, *self._new]))
            self._new, self._new_size = [], 0
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
