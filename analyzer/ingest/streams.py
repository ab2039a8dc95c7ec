"""Record streams: the records of a JSON-lines, CSV or Parquet file (or of a byte range of
one, for ``--jobs``), each with its line, or the reason the line is bad.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.errors import InputError, KvpoolError, Location
from analyzer.ingest.detect import Format
from analyzer.ingest.fields import Record, RowError
from analyzer.ingest.io import Span, TruncatedInput, iter_lines

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

# Formats whose uncompressed files may be read in byte ranges by parallel workers: one
# record a line, and no state carried from row to row (Bailian and RAGPulse carry some).
SPLITTABLE = frozenset({Format.OPENAI, Format.OPENAI_BATCH, Format.GENERIC_JSONL})
# CSV formats split the same way, at line ends between records (``csv_records``' span);
# the public traces' CSVs (Azure, BurstGPT) are read in columns instead.
SPLITTABLE_CSV = frozenset({Format.GATEWAY_CSV, Format.GENERIC_CSV})


def _slow_json(line: bytes) -> object:
    """The standard library's reading of a line orjson refused, or the reason it is bad.

    orjson rejects what ``json`` accepts as extensions (NaN, Infinity, lone surrogates),
    so those lines read as before; a line neither accepts gets the reason ``json`` gives.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return RowError("not UTF-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return RowError("malformed JSON")
    except RecursionError:
        return RowError("JSON nested too deeply")


def json_records(
    path: str, on_bytes: Callable[[int], None] | None, span: Span | None = None
) -> Iterator[Record]:
    """JSON lines through orjson (twice the standard library's speed on chat logs).

    One difference remains: an integer beyond 64 bits reads as a float (orjson), where
    ``json`` gives an int; every field that takes such a number refuses it either way.
    """
    lineno = 0
    loads, refused = orjson.loads, orjson.JSONDecodeError
    try:
        for lineno, line in iter_lines(path, on_bytes, span):
            if not line.strip():
                continue
            try:
                obj = loads(line)
            except refused:
                obj = _slow_json(line)
                if isinstance(obj, RowError):
                    yield lineno, obj
                    continue
            if not isinstance(obj, dict):
                yield lineno, RowError("line is not a JSON object")
                continue
            yield lineno, obj
    except TruncatedInput as exc:
        raise truncated(path, exc.line) from None


def truncated(path: str, line: int) -> InputError:
    """A compressed file cut short is an error, not a skipped row: the rows after the cut
    (often most of the file) are lost, and a summary saying "1 row skipped" hid that."""
    return InputError(
        f"truncated compressed file: the stream ends inside line {line} "
        f"(the {line - 1:,} lines before it are complete)",
        Location(path, line),
        hint="a copy or download was cut short, or the file is still being written; "
        "to use the complete lines, decompress what is there (zcat / zstdcat) to a new file",
    )


MAX_CSV_RESTARTS = 20


class SplitMisaligned(KvpoolError):
    """A CSV byte range read by a worker did not end between records (a quoted field ran
    past the cut, an unterminated quote or a CSV error): the file is read in one piece."""


def csv_records(
    path: str, on_bytes: Callable[[int], None] | None, span: Span | None = None
) -> Iterator[Record]:
    """CSV rows as dicts by header; a quoted field may span lines, as CSV allows.

    A quote that is never closed makes the csv module read on, to the end of the file
    if need be, and return one long row with the wrong number of columns. Such a row
    (the wrong column count, over more than one line) is skipped as "unterminated
    quote" at the line where it started, and reading starts again on the line after it,
    so the rows it swallowed are read, not lost. After ``MAX_CSV_RESTARTS`` of these
    the file's quoting is called broken (a fatal row error).

    ``span`` (:func:`~analyzer.ingest.io.line_spans` with ``quoted``): the records of
    that byte range, under the file's header, as a read of the whole file gives them.
    The last record must end on the span's last line (reading on past it as a quoted
    field needs); when it does not, or a quote is unterminated or the CSV is broken in
    the range, :class:`SplitMisaligned` is raised and the caller reads the file whole.
    """
    bad: list[int] = []
    told: set[int] = set()  # non-UTF-8 lines already reported (a restart reads them again)
    # "line": the last line read; "first": the first line of the record being read that
    # decoded (a non-UTF-8 line is dropped, so a record can begin after the one it follows)
    state = {"line": 0, "first": 0}
    header: list[str] | None = None
    resume = 1  # the first line of the file to read in this pass
    restarts = 0
    last = 0  # the span's last line (0: read to the end of the file)
    if span is not None:
        resume, last = span.first_line, span.last_line
        if span.start > 0:
            header = _csv_header(path)
        # The range, and on past its end as far as its last record needs (to the end of
        # the file): progress counts the range's bytes only.
        left = span.end - span.start
        inner = on_bytes

        def counted(n: int) -> None:
            nonlocal left
            n, left = min(n, left), left - min(n, left)
            if inner and n:
                inner(n)

        on_bytes = counted if inner else None
        span = Span(span.start, os.path.getsize(path), span.first_line)

    def lines(first: int) -> Iterator[str]:
        at = span if span is not None and first == span.first_line else None
        for lineno, line in iter_lines(path, on_bytes if first == resume0 else None, at):
            if lineno < first:
                continue
            state["line"] = lineno
            try:
                text = line.decode("utf-8") + "\n"
            except UnicodeDecodeError:
                if lineno not in told:
                    told.add(lineno)
                    bad.append(lineno)
                continue
            if not state["first"]:
                state["first"] = lineno
            yield text

    resume0 = resume
    try:
        while True:
            state["line"] = resume - 1
            reader = csv.reader(lines(resume))
            if header is None:
                row0 = next(reader, None)
                if row0 is None:
                    raise InputError("CSV file has no header row", Location(path))
                header = [h.strip() for h in row0]  # iter_lines drops a BOM
            start = state["line"] + 1  # where the next record begins
            state["first"] = 0
            restart = None
            for row in reader:
                while bad:
                    yield bad.pop(0), RowError("not UTF-8")
                end, first, start = state["line"], start, state["line"] + 1
                began, state["first"] = state["first"], 0
                if last and end > last:
                    if began <= last:  # a record runs over the cut: not between records
                        raise SplitMisaligned(f"{path}: a CSV record crosses line {last}")
                    return
                if not row or (len(row) == 1 and not row[0].strip()):
                    if end == last:
                        return
                    continue
                if len(row) != len(header):
                    if end > first:  # an open quote ran on over the lines below
                        if span is not None:
                            raise SplitMisaligned(f"{path}: unterminated quote at line {first}")
                        yield first, RowError("unterminated quote")
                        restart = first + 1
                        break
                    yield end, RowError(f"row has {len(row)} columns, header has {len(header)}")
                    if end == last:
                        return
                    continue
                yield end, dict(zip(header, row, strict=True))
                if end == last:
                    return
            while bad:
                yield bad.pop(0), RowError("not UTF-8")
            if restart is None:
                return
            restarts += 1
            if restarts > MAX_CSV_RESTARTS:
                yield (
                    restart,
                    RowError("CSV quoting is broken (too many unterminated quotes)", fatal=True),
                )
                return
            resume = restart
    except TruncatedInput as exc:
        raise truncated(path, exc.line) from None
    except csv.Error as exc:
        if span is not None:
            raise SplitMisaligned(f"{path}: CSV error near line {state['line']}") from None
        yield state["line"], RowError(f"CSV error: {exc}", fatal=True)


def _csv_header(path: str) -> list[str]:
    """The header of a CSV file: its first record, as :func:`csv_records` reads it."""

    def lines() -> Iterator[str]:
        for _, line in iter_lines(path):
            try:
                yield line.decode("utf-8") + "\n"
            except UnicodeDecodeError:
                continue

    try:
        row0 = next(csv.reader(lines()), None)
    except csv.Error:
        row0 = None
    if row0 is None:
        raise SplitMisaligned(f"{path}: no readable header")
    return [h.strip() for h in row0]


def parquet_records(path: str, on_bytes: Callable[[int], None] | None) -> Iterator[Record]:
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"not a readable Parquet file: {exc}", Location(path)) from exc
    size = Path(path).stat().st_size
    n_rows = max(1, pf.metadata.num_rows)
    row = 0
    for g in range(pf.metadata.num_row_groups):
        in_group = pf.metadata.row_group(g).num_rows
        try:  # a row group is decoded whole before any of its rows is used
            batches = list(pf.iter_batches(batch_size=20_000, row_groups=[g]))
        except (OSError, pa.ArrowException):
            # A corrupt row group: each of its rows is a counted skip; the others are kept.
            for _ in range(in_group):
                row += 1
                yield row, RowError("corrupt Parquet data")
            batches = []
        for batch in batches:
            for rec in batch.to_pylist():
                row += 1
                yield row, rec
        if on_bytes:
            on_bytes(size * in_group / n_rows)
