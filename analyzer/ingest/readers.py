"""Per-format readers: each turns one file into a stream of :class:`Raw` requests.

A reader yields ``(line, Raw)`` or ``(line, RowError)``; the pipeline decides whether an
error skips the row (default) or stops the run (``--strict``). Field meanings and units
per format are documented in docs/formats.md.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from analyzer.errors import InputError, KvpoolError, Location
from analyzer.ingest.detect import PRODUCT_FORMATS, Format
from analyzer.ingest.io import Span, TruncatedInput, iter_lines
from analyzer.ingest.options import IngestOptions
from analyzer.ingest.timeparse import parse_time

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

TIME_FIELDS = (
    "timestamp",
    "ts",
    "time",
    "created",
    "created_at",
    "start_time",
    "startTime",
    "request_time",
    "requested_at",
    "arrival_time",
    "@timestamp",
    "datetime",
    "date",
    "TIMESTAMP",
    "Timestamp",
)

# Native timestamp unit and block size of the formats that define them.
NATIVE_UNIT: dict[str, str] = {
    Format.MOONCAKE: "ms",
    Format.BAILIAN: "s",
    Format.RAGPULSE: "s",
    Format.BURSTGPT: "s",
}
NATIVE_BLOCK: dict[str, int] = {Format.MOONCAKE: 512, Format.BAILIAN: 16}
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


class RowError(Exception):
    """One bad row: a short reason (the skip-summary key) and the field at fault."""

    def __init__(self, reason: str, field: str | None = None, fatal: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field
        self.fatal = fatal  # the rest of the file is unreadable (truncated stream)


@dataclass(slots=True)
class Raw:
    """One request as read, before tokenization and hashing."""

    time: float | None = None
    time_iso: bool = False
    request_id: str | None = None
    session: str | None = None
    tenant: str | None = None
    user: str | None = None  # the end user or session owner the log names
    model: str | None = None
    output_tokens: int | None = None
    output_text: str | None = None  # counted with the tokenizer when usage is absent
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    engine_prompt_tokens: int | None = None  # usage.prompt_tokens
    parent: str | None = None
    turn: int | None = None
    body: dict[str, Any] | None = None  # chat-completions request body
    text: str | None = None  # raw prompt text
    tokens: np.ndarray | None = None  # token ids given by the format (RAGPulse)
    block_ids: list[int] | None = None  # the trace's own chained block ids
    prompt_tokens: int | None = None  # from the trace (count-only and pre-hashed formats)
    count_only: bool = False
    approx: bool = False


@dataclass
class FileContext:
    path: str
    fmt: str
    opts: IngestOptions
    timed: bool | None = None  # decided by the first row: does this file carry times?
    time_name: str | None = None  # the field the file's times were found in
    shared: dict[str, Any] = field(default_factory=dict)  # per-run state (Bailian sessions, ...)
    # The file's name and folder, taken once: two Paths a row took about 0.3 s of the
    # 2.9 s `kvpool reuse` of the RAGPulse trace.
    name: str = field(init=False)
    folder: str = field(init=False)

    def __post_init__(self) -> None:
        self.name, self.folder = Path(self.path).name, str(Path(self.path).parent)


# -- field helpers -----------------------------------------------------------------------


def _get(rec: dict[str, Any], dotted: str) -> object:
    cur: object = rec
    for key in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return _str(cur)


def _int(value: object, field: str, required: bool = True) -> int | None:
    if value is None or value == "":
        if required:
            raise RowError("missing field", field)
        return None
    if isinstance(value, bool):
        raise RowError("mistyped field", field)
    if isinstance(value, int):
        out = value
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    elif isinstance(value, str):
        try:
            out = int(float(value.strip()))
        except (ValueError, OverflowError) as exc:  # "abc", "nan"; "inf"
            raise RowError("mistyped field", field) from exc
    else:
        raise RowError("mistyped field", field)
    if out < 0:
        raise RowError("negative value", field)
    if out > _I64_MAX:
        raise RowError("value out of 64-bit range", field)
    return out


def _str(value: object) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True)


def _maybe_json(value: object, field: str) -> object:
    """A cell holding JSON, parsed (orjson first, as JSON lines are; what it refuses is
    read by ``json``, which also names the reason a cell is bad)."""
    if isinstance(value, str):
        s = value.strip()
        if not s:
            return None
        try:
            return orjson.loads(s)
        except orjson.JSONDecodeError:
            pass
        try:
            return json.loads(s)
        except json.JSONDecodeError as exc:
            raise RowError("malformed JSON", field) from exc
    return value


def take_time(rec: dict[str, Any], ctx: FileContext, names: tuple[str, ...] = TIME_FIELDS) -> Raw:
    """A Raw with the row's time set; applies the per-file timed/untimed rule."""
    opts = ctx.opts
    forced = opts.time_field or opts.time_column
    fname: str | None = None
    value: object = None
    if forced:
        fname, value = forced, _get(rec, forced)
    else:
        for n in names:
            v = rec.get(n)
            if v is not None and v != "":
                fname, value = n, v
                break
    raw = Raw()
    if value is None or value == "":
        if forced:  # the user named the field: every row must have it
            raise RowError("missing timestamp", forced)
        if ctx.timed is None:
            ctx.timed = False
        elif ctx.timed:
            raise RowError("missing timestamp", ctx.time_name or "timestamp")
        return raw
    if ctx.timed is False:
        return raw  # the file started without times: arrival is file order
    try:
        t, iso = parse_time(value)
    except (ValueError, OverflowError) as exc:
        raise RowError("bad timestamp", fname) from exc
    if t < 0:
        raise RowError("negative timestamp", fname)
    ctx.timed = True
    ctx.time_name = ctx.time_name or fname
    raw.time, raw.time_iso = t, iso
    return raw


# -- record streams ----------------------------------------------------------------------

# Formats whose uncompressed files may be read in byte ranges by parallel workers: one
# record a line, and no state carried from row to row (Bailian and RAGPulse carry some).
SPLITTABLE = frozenset({Format.OPENAI, Format.OPENAI_BATCH, Format.GENERIC_JSONL})
# CSV formats split the same way, at line ends between records (``csv_records``' span);
# the public traces' CSVs (Azure, BurstGPT) are read in columns instead.
SPLITTABLE_CSV = frozenset({Format.GATEWAY_CSV, Format.GENERIC_CSV})

Record = tuple[int, dict[str, Any] | RowError]


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
    import pyarrow as pa
    import pyarrow.parquet as pq

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


def records(
    path: str, fmt: str, on_bytes: Callable[[int], None] | None, span: Span | None = None
) -> Iterator[Record]:
    """The records of ``path`` (of ``span`` only: JSON-lines and CSV formats,
    uncompressed)."""
    if span is not None:
        assert fmt in SPLITTABLE or fmt in SPLITTABLE_CSV
        if fmt in SPLITTABLE_CSV:
            return csv_records(path, on_bytes, span)
        return json_records(path, on_bytes, span)
    if fmt in PRODUCT_FORMATS:
        return _products.records(path, fmt, on_bytes)
    if fmt.endswith("parquet"):
        return parquet_records(path, on_bytes)
    if fmt.endswith("csv") or fmt in (Format.AZURE, Format.BURSTGPT):
        return csv_records(path, on_bytes)
    return json_records(path, on_bytes)


# -- parsers: one record -> Raw ----------------------------------------------------------

_BODY_KEYS = ("request", "body", "request_json", "request_body")
_RESPONSE_KEYS = ("response", "response_json", "response_body")
_ID_KEYS = ("request_id", "id", "custom_id")
_TENANT_KEYS = ("tenant", "tenant_id", "org", "organization", "team")
# (source, key) in order of precedence; sources: 0 body, 1 row, 2 body metadata, 3 row
# metadata.
_SESSION_SOURCES = (
    (0, "prompt_cache_key"),
    (1, "prompt_cache_key"),
    (0, "user"),
    (1, "user"),
    (2, "session_id"),
    (3, "session_id"),
    (1, "session_id"),
    (1, "conversation_id"),
)
_TENANT_SOURCES = (*((1, k) for k in _TENANT_KEYS), (2, "tenant"), (3, "tenant"))
# The end user: OpenAI's ``user`` ("a stable identifier for your end-users") or its
# successor ``safety_identifier``, in the body or beside it, or a ``user_id``.
_USER_SOURCES = (
    (0, "user"),
    (0, "safety_identifier"),
    (1, "user"),
    (1, "user_id"),
    (2, "user_id"),
    (3, "user_id"),
)
_USER_COLUMNS = ("user_id", "user")


def named_field(rec: dict[str, Any], name: str) -> str | None:
    """The value a ``--tenant-field`` / ``--user-field`` names in a record, as text: the
    column or key of that exact name, else the dotted path, read into cells that hold JSON
    text (a gateway's ``request_json``); None when absent or empty."""
    if name in rec:
        return _str(rec[name])
    cur: object = rec
    for key in name.split("."):
        if isinstance(cur, str):
            try:
                cur = _maybe_json(cur, key)
            except RowError:
                return None
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return _str(cur)


def take_usage(raw: Raw, usage: object, where: str = "usage") -> None:
    """Output tokens and the measured cache hits of an OpenAI ``usage`` object into
    ``raw`` (nothing when ``usage`` is not an object); ``where`` names it in errors."""
    if not isinstance(usage, dict):
        return
    for k in ("completion_tokens", "output_tokens"):
        if usage.get(k) is not None:
            raw.output_tokens = _int(usage[k], f"{where}.{k}")
            break
    # The hits today's engine measured (vLLM with --enable-prompt-tokens-details,
    # SGLang, OpenAI): cached prompt tokens, and the prompt as the engine counted it.
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        cached = _int(details["cached_tokens"], f"{where}.prompt_tokens_details.cached_tokens")
        prompt = None
        if usage.get("prompt_tokens") is not None:
            prompt = _int(usage["prompt_tokens"], f"{where}.prompt_tokens")
        take_cached(raw, cached, prompt, f"{where}.prompt_tokens_details.cached_tokens")


def take_cached(raw: Raw, cached: int | None, prompt: int | None, field: str) -> None:
    """The engine's measured hit (``cached`` of ``prompt`` tokens) into ``raw``; more hits
    than prompt tokens is a bad row naming ``field``."""
    if cached is None:
        return
    if prompt is not None and cached > prompt:
        raise RowError("invalid value", field)
    raw.cached_tokens, raw.engine_prompt_tokens = cached, prompt


def parse_openai(rec: dict[str, Any], ctx: FileContext) -> Raw:
    """OpenAI chat-completions log rows, Batch input lines and gateway CSV/Parquet rows."""
    body: dict[str, Any] | None = None
    if isinstance(rec.get("messages"), list) or isinstance(rec.get("prompt"), str):
        body = rec
    else:
        for k in _BODY_KEYS:
            if k in rec and rec[k] is not None:
                v = _maybe_json(rec[k], k)
                if isinstance(v, dict):
                    body = v
                    break
                if v is not None:
                    raise RowError("mistyped field", k)
    if body is None:
        for k in ("messages", "prompt"):
            if rec.get(k) is not None:  # present but neither a list nor a string
                raise RowError("mistyped field", k)
        raise RowError("missing field", "messages")
    raw = take_time(rec, ctx)
    if isinstance(body.get("messages"), list):
        raw.body = body
    elif isinstance(body.get("prompt"), str):
        raw.text = body["prompt"]
    elif "messages" in body:
        raise RowError("mistyped field", "messages")
    else:
        raise RowError("missing field", "messages")
    resp = None
    for k in _RESPONSE_KEYS:
        if rec.get(k) is not None:
            resp = _maybe_json(rec[k], k)
            break
    if isinstance(resp, dict) and isinstance(resp.get("body"), dict):
        resp = resp["body"]  # Batch output lines wrap the response
    usage = (resp.get("usage") if isinstance(resp, dict) else None) or rec.get("usage")
    take_usage(raw, _maybe_json(usage, "usage"))
    if raw.output_tokens is None:
        for k in ("output_tokens", "completion_tokens"):
            if rec.get(k) not in (None, ""):
                raw.output_tokens = _int(rec[k], k)
                break
    if raw.output_tokens is None and isinstance(resp, dict):
        choices = resp.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = choices[0].get("message") or {}
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                raw.output_text = content
            elif isinstance(choices[0].get("text"), str):
                raw.output_text = choices[0]["text"]
    meta = body.get("metadata")
    rmeta = rec.get("metadata")
    where = (
        body,
        rec,
        meta if isinstance(meta, dict) else {},
        rmeta if isinstance(rmeta, dict) else {},
    )
    for i, k in _SESSION_SOURCES:  # first present wins; stops at the first
        v = where[i].get(k)
        if v is not None and v != "":
            raw.session = _str(v)
            break
    raw.model = _str(body.get("model") or rec.get("model") or rec.get("model_name"))
    for i, k in _TENANT_SOURCES:
        v = where[i].get(k)
        if v is not None and v != "":
            raw.tenant = _str(v)
            break
    for i, k in _USER_SOURCES:
        v = where[i].get(k)
        if v is not None and v != "":
            raw.user = _str(v)
            break
    for k in _ID_KEYS:
        v = rec.get(k)
        if v is not None and v != "":
            raw.request_id = _str(v)
            break
    return raw


_PROMPT_GUESSES = ("prompt", "text", "input", "messages", "question", "query")
# Columns that count tokens: a table with these and no prompt is a count-only trace.
_COUNT_COLUMNS = (
    "input_tokens",
    "prompt_tokens",
    "output_tokens",
    "completion_tokens",
    "input_length",
    "num_tokens",
    "tokens",
)


def _no_prompt_column(rec: dict[str, Any], ctx: FileContext) -> InputError:
    """No prompt column: a table of token counts is pointed at the count-only formats."""
    columns = ", ".join(map(str, rec))
    counts = [c for c in rec if str(c).strip().lower() in _COUNT_COLUMNS]
    if counts:
        return InputError(
            f"no prompt column: this table has token counts ({', '.join(counts)}) but no "
            "prompt text, so prefix reuse cannot be measured from it",
            Location(ctx.path),
            hint="kvpool reads such count-only traces (arrivals and lengths) as --format "
            "azure (columns TIMESTAMP, ContextTokens, GeneratedTokens) or --format burstgpt "
            "(Timestamp, Request tokens, Response tokens): rename the columns to one of "
            "these (docs/formats.md, count-only traces); or name the prompt with "
            f"--prompt-column (columns: {columns})",
        )
    return InputError(
        "no prompt column found",
        Location(ctx.path),
        hint=f"name it with --prompt-column (columns: {columns})",
    )


def parse_generic(rec: dict[str, Any], ctx: FileContext) -> Raw:
    """A table with a prompt column (text, or a JSON list of messages)."""
    col = ctx.opts.prompt_column
    if col is None:
        col = next((c for c in _PROMPT_GUESSES if c in rec), None)
        if col is None:
            raise _no_prompt_column(rec, ctx)
    value = rec.get(col)
    if value is None or value == "":  # an empty CSV cell is how a table says "missing"
        raise RowError("missing field", col)
    raw = take_time(rec, ctx)
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if (
            isinstance(parsed, list)
            and parsed
            and all(isinstance(m, dict) and "role" in m for m in parsed)
        ):
            value = parsed
        elif isinstance(parsed, dict) and isinstance(parsed.get("messages"), list):
            value = parsed["messages"]
    if isinstance(value, list):
        raw.body = {"messages": value}
    elif isinstance(value, str):
        raw.text = value
    else:
        raise RowError("mistyped field", col)
    scol = ctx.opts.session_column or next(
        (c for c in ("session_id", "session", "conversation_id", "user") if c in rec), None
    )
    if scol:
        raw.session = _str(rec.get(scol))
    raw.model = _str(rec.get("model") or rec.get("model_name"))
    raw.tenant = _str(next((rec[k] for k in _TENANT_KEYS if rec.get(k) not in (None, "")), None))
    raw.user = _str(next((rec[k] for k in _USER_COLUMNS if rec.get(k) not in (None, "")), None))
    for k in ("output_tokens", "completion_tokens", "response_tokens"):
        if rec.get(k) not in (None, ""):
            raw.output_tokens = _int(rec[k], k)
            break
    for k in _ID_KEYS:
        if rec.get(k) not in (None, ""):
            raw.request_id = _str(rec[k])
            break
    return raw


def _hash_id_list(value: object, field: str) -> list[int]:
    if not isinstance(value, list):
        raise RowError("missing field" if value is None else "mistyped field", field)
    for v in value:
        if isinstance(v, float) and v.is_integer() and abs(v) >= 2**63:
            # orjson reads an integer beyond 64 bits as a float
            raise RowError("hash id out of 64-bit range", field)
        if not isinstance(v, int) or isinstance(v, bool):
            raise RowError("mistyped field", field)
        if not _I64_MIN <= v <= _I64_MAX:
            raise RowError("hash id out of 64-bit range", field)
    return value


def parse_mooncake(rec: dict[str, Any], ctx: FileContext) -> Raw:
    raw = take_time(rec, ctx, ("timestamp",))
    raw.prompt_tokens = _int(rec.get("input_length"), "input_length")
    raw.output_tokens = _int(rec.get("output_length"), "output_length", required=False)
    ids = _hash_id_list(rec.get("hash_ids"), "hash_ids")
    if len(ids) < (raw.prompt_tokens or 0) // 512:
        raise RowError("hash_ids shorter than input_length / 512", "hash_ids")
    raw.block_ids = ids
    for k in ("session_id", "chat_id"):
        if rec.get(k) not in (None, ""):
            raw.session = _str(rec[k])
            break
    return raw


def parse_bailian(rec: dict[str, Any], ctx: FileContext) -> Raw:
    raw = take_time(rec, ctx, ("timestamp",))
    chat = rec.get("chat_id")
    if chat is None:
        raise RowError("missing field", "chat_id")
    parent = rec.get("parent_chat_id")
    raw.request_id = _str(chat)
    raw.parent = None if parent in (None, -1, "-1", "") else _str(parent)
    roots: dict[str, str] = ctx.shared.setdefault("bailian_roots", {})
    root = roots.get(raw.parent, raw.parent) if raw.parent is not None else raw.request_id
    assert raw.request_id is not None
    assert root is not None
    roots[raw.request_id] = root
    raw.session = root
    raw.turn = _int(rec.get("turn"), "turn", required=False)
    raw.prompt_tokens = _int(rec.get("input_length"), "input_length")
    raw.output_tokens = _int(rec.get("output_length"), "output_length", required=False)
    ids = _hash_id_list(rec.get("hash_ids"), "hash_ids")
    if len(ids) < (raw.prompt_tokens or 0) // 16:
        raise RowError("hash_ids shorter than input_length / 16", "hash_ids")
    raw.block_ids = ids
    raw.tenant = _str(rec.get("type"))
    return raw


# RAGPulse components in assumed prompt order: (key in hash_ids, file, id key, kind code).
RAGPULSE_COMPONENTS = (
    ("sys_prompt", "1_sys_prompt.jsonl", "sys_prompt_id", 1),
    ("passages_ids", "2_passages.jsonl", "passage_id", 2),
    ("history", "3_history.jsonl", "history_id", 3),
    ("web_search", "5_web_search.jsonl", "web_search_id", 4),
    ("user_input", "4_user_input.jsonl", "user_input_id", 5),
)
RAGPULSE_ID_STRIDE = 4096  # component c of kind k -> tokens (k << 28) + c * 4096 + pos
RAGPULSE_PAD_KIND = 15


def _ragpulse_lengths(ctx: FileContext) -> dict[str, dict[int, int]]:
    """Token lengths of the components beside ``ctx.path``, read once per folder."""
    cache: dict[str, dict[str, dict[int, int]]] = ctx.shared.setdefault("ragpulse_lengths", {})
    folder = ctx.folder
    if folder in cache:
        return cache[folder]
    out: dict[str, dict[int, int]] = {}
    for key, fname, idkey, _ in RAGPULSE_COMPONENTS:
        p = Path(folder) / fname
        if not p.exists():
            raise InputError(
                f"RAGPulse component file {fname} not found beside the trace",
                Location(str(p)),
                hint="keep 1_sys_prompt.jsonl ... 5_web_search.jsonl next to 0_trace.jsonl",
            )
        lengths: dict[int, int] = {}
        for lineno, rec in json_records(str(p), None):
            if isinstance(rec, RowError):
                raise InputError(rec.reason, Location(str(p), lineno))
            try:
                lengths[int(rec[idkey])] = int(rec["token_length"])
            except (KeyError, TypeError, ValueError) as exc:
                raise InputError("bad component row", Location(str(p), lineno, idkey)) from exc
        out[key] = lengths
    cache[folder] = out
    return out


def parse_ragpulse(rec: dict[str, Any], ctx: FileContext) -> Raw:
    lengths = _ragpulse_lengths(ctx)
    raw = take_time(rec, ctx, ("timestamp",))
    n_in = _int(rec.get("input_length"), "input_length")
    raw.output_tokens = _int(rec.get("output_length"), "output_length", required=False)
    raw.session = _str(rec.get("session_id"))
    comps = rec.get("hash_ids")
    if not isinstance(comps, dict):
        raise RowError("missing field" if comps is None else "mistyped field", "hash_ids")
    pieces = []
    for key, _, _, kind in RAGPULSE_COMPONENTS:
        ids = comps.get(key) or []
        if not isinstance(ids, list):
            raise RowError("mistyped field", f"hash_ids.{key}")
        for c in ids:
            if not isinstance(c, int) or isinstance(c, bool):
                raise RowError("mistyped field", f"hash_ids.{key}")
            n = lengths[key].get(c)
            if n is None:
                raise RowError("unknown component id", f"hash_ids.{key}")
            if c >= (1 << 28) // RAGPULSE_ID_STRIDE or n >= RAGPULSE_ID_STRIDE:
                raise RowError("component id or length out of range", f"hash_ids.{key}")
            start = (kind << 28) + c * RAGPULSE_ID_STRIDE
            pieces.append(np.arange(start, start + n, dtype=np.uint32))
    tokens = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.uint32)
    assert n_in is not None
    if tokens.size < n_in:
        # Tokens the components do not account for (template, separators): unique to
        # this request, placed at the end where they cannot create false sharing.
        counter = ctx.shared.get("ragpulse_pad", 0)
        pad = (RAGPULSE_PAD_KIND << 28) + (
            (counter + np.arange(n_in - tokens.size, dtype=np.int64)) % (1 << 28)
        )
        ctx.shared["ragpulse_pad"] = counter + n_in - tokens.size
        tokens = np.concatenate([tokens, pad.astype(np.uint32)])
    elif tokens.size > n_in:
        raw.approx = True  # components sum to more than input_length: use the components
    raw.tokens = tokens
    return raw


def parse_azure(rec: dict[str, Any], ctx: FileContext) -> Raw:
    raw = take_time(rec, ctx, ("TIMESTAMP", "timestamp"))
    raw.prompt_tokens = _int(rec.get("ContextTokens"), "ContextTokens")
    raw.output_tokens = _int(rec.get("GeneratedTokens"), "GeneratedTokens", required=False)
    raw.count_only = True
    return raw


def parse_burstgpt(rec: dict[str, Any], ctx: FileContext) -> Raw:
    raw = take_time(rec, ctx, ("Timestamp", "timestamp"))
    raw.prompt_tokens = _int(rec.get("Request tokens"), "Request tokens")
    raw.output_tokens = _int(rec.get("Response tokens"), "Response tokens", required=False)
    raw.model = _str(rec.get("Model"))
    raw.session = None
    raw.count_only = True
    return raw


PARSERS: dict[str, Callable[[dict[str, Any], FileContext], Raw]] = {
    Format.OPENAI: parse_openai,
    Format.OPENAI_BATCH: parse_openai,
    Format.GATEWAY_CSV: parse_openai,
    Format.GATEWAY_PARQUET: parse_openai,
    Format.GENERIC_CSV: parse_generic,
    Format.GENERIC_JSONL: parse_generic,
    Format.GENERIC_PARQUET: parse_generic,
    Format.MOONCAKE: parse_mooncake,
    Format.BAILIAN: parse_bailian,
    Format.RAGPULSE: parse_ragpulse,
    Format.AZURE: parse_azure,
    Format.BURSTGPT: parse_burstgpt,
}

# The gateway and observability exports read their rows with the helpers above, so
# their module is imported last; their parsers join the one registry.
from analyzer.ingest import products as _products  # noqa: E402

PARSERS.update(_products.PARSERS)
