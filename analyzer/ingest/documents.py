"""Records of files that hold JSON documents rather than one JSON object per line.

Observability exports come in three containers: JSON lines (one record a line), CSV,
and JSON documents: a top-level array, minified on one line (Langfuse's batch export,
``transformStreamToJson``) or pretty-printed (Helicone's ``@helicone/export --format
json``), pretty-printed objects one after another (an OTLP/JSON file written by hand or
``jq``), or API pages (``{"data": [...], "meta": ...}``). :func:`container` tells
which from the first bytes, and :func:`document_records` streams the records of a
document file with bounded memory: the standard library's ``JSONDecoder.raw_decode``
parses each record where it starts in a sliding buffer, so a record is never longer in
memory than ``KVPOOL_MAX_LINE_MB`` (the per-line bound of JSON-lines files) and the
file is never held whole.

Records of a document file are numbered by their position in the file (1 for the
first), not by line: a minified array is one line, and each record still needs a
place of its own in messages and default request ids.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from analyzer.ingest.io import BOM, TruncatedInput, _chunks, max_line_bytes
from analyzer.jsontypes import JSONValue

PEEK_BYTES = 1 << 16
# Keys an API page carries besides its records (Langfuse ``meta``, Helicone ``error``).
_PAGE_KEYS = frozenset({"data", "meta", "pagination", "error", "total", "object", "has_more"})


class DocumentError:
    """A record that could not be read; ``fatal``: nothing after it can be."""

    def __init__(self, reason: str, fatal: bool = False) -> None:
        self.reason = reason
        self.fatal = fatal


def peek(path: str | Path, n: int = PEEK_BYTES) -> bytes:
    """The first ``n`` bytes of ``path``, decompressed (gzip and zstd), BOM dropped."""
    got = b""
    try:
        for chunk in _chunks(path, None):
            got += chunk
            if len(got) >= n:
                break
    except TruncatedInput:
        pass
    return got.removeprefix(BOM)[:n]


def container(path: str | Path) -> str:
    """``document`` (a JSON array, or JSON objects spread over lines), ``jsonl`` (one
    object a line) or ``csv``, from the file's first bytes."""
    head = peek(path).lstrip()
    if head.startswith(b"["):
        return "document"
    if head.startswith(b"{"):
        # Pretty-printed JSON opens with "{" alone on its line; a JSON-lines file has a
        # whole object (or a line cut by rotation, which its reader skips) on its first.
        line, newline, _ = head.partition(b"\n")
        return "document" if newline and line.strip() == b"{" else "jsonl"
    return "csv"


def page_records(obj: object) -> list[JSONValue] | None:
    """The records of an API page (``{"data": [...], "meta": {...}}``), else None."""
    if isinstance(obj, dict) and set(obj) <= _PAGE_KEYS:
        data = obj.get("data")
        if isinstance(data, list):
            return data
    return None


def document_records(
    path: str | Path, on_bytes: Callable[[int], None] | None = None
) -> Iterator[tuple[int, object]]:
    """(position, record) of each record: the elements of a top-level array, each of
    several top-level values, and the elements of API pages among them. A record that
    is not valid JSON ends the file (a :class:`DocumentError` with ``fatal``): where the
    next one starts cannot be told. Raises TruncatedInput for a cut compressed file."""
    limit = max_line_bytes()
    decode = json.JSONDecoder().raw_decode
    utf8 = codecs.getincrementaldecoder("utf-8")()
    chunks = _chunks(path, on_bytes)
    buf, pos, eof, first = "", 0, False, True
    n = 0

    def more(want: int) -> bool:
        """Read until ``want`` more characters are buffered (or the end): False at the end."""
        nonlocal buf, pos, eof, first
        if eof:
            return False
        if pos:
            buf, pos = buf[pos:], 0
        got = 0
        parts = [buf]
        while got < want:
            chunk = next(chunks, None)
            if chunk is None:
                parts.append(utf8.decode(b"", final=True))
                eof = True
                break
            if first:
                chunk, first = chunk.removeprefix(BOM), False
            text = utf8.decode(chunk)
            parts.append(text)
            got += len(text)
        buf = "".join(parts)
        return got > 0 or not eof

    def skip_space() -> bool:
        """Past whitespace; False at the end of the file."""
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(buf):
                return True
            if not more(1 << 20):
                return False

    def value() -> object:
        """The JSON value at ``pos`` (reading on as far as it needs), or a DocumentError."""
        nonlocal pos
        want = 1 << 20
        while True:
            try:
                obj, end = decode(buf, pos)
            except json.JSONDecodeError:
                if len(buf) - pos > limit:
                    return DocumentError(
                        f"JSON record longer than {limit >> 20} MiB (raise KVPOOL_MAX_LINE_MB)",
                        fatal=True,
                    )
                if not more(want):
                    return DocumentError("malformed JSON", fatal=True)
                want = max(want, len(buf) - pos)  # double the record's room each time
                continue
            except RecursionError:
                return DocumentError("JSON nested too deeply", fatal=True)
            pos = end
            return obj

    try:
        in_array = after_value = False
        while skip_space():
            c = buf[pos]
            if not in_array and c == "[":  # an array of records (or a second one)
                pos += 1
                in_array, after_value = True, False
                continue
            if in_array and c == "]":
                pos += 1
                in_array = False
                continue
            if in_array and c == "," and after_value:
                pos += 1
                after_value = False
                continue
            obj = value()
            if isinstance(obj, DocumentError):
                yield n + 1, obj
                return
            after_value = True
            for row in page_records(obj) or (obj,):
                n += 1
                yield n, row
    except UnicodeDecodeError:
        yield n + 1, DocumentError("not UTF-8", fatal=True)
