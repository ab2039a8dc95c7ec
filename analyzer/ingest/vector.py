"""Bulk readers: a clean public trace read whole, in columns, instead of line by line.

Public traces are large, regular JSON-lines files (Mooncake FAST'25: ``timestamp``,
``input_length``, ``output_length``, ``hash_ids``). Reading them a line at a time in
Python (orjson, a parser call, a row append) cost most of ``kvpool reuse``'s time on
the Mooncake trace; here Arrow's C++ JSON reader (``pyarrow.json``, multithreaded,
already loaded: polars parses as fast but importing it costs more than the whole read)
parses the file in one call into columns, the block ids every request keeps are picked
with numpy, and each distinct id is hashed once in one compiled call
(:func:`analyzer.blocks.id_hashes`). Alibaba's Bailian traces add ``chat_id``,
``parent_chat_id``, ``type`` and ``turn`` (one id per 16 tokens): read the same way, with
each chat's session (its first ancestor) found in file order in one pass over the ids,
as the line reader finds it.

Azure's LLM inference traces (Splitwise, ISCA'24: ``TIMESTAMP``, ``ContextTokens``,
``GeneratedTokens``, count-only) are CSV: polars' CSV reader parses them into columns and
its ``strptime`` reads the timestamps (cut to microseconds and taken as UTC, as
:func:`~analyzer.ingest.timeparse.parse_time` does).

The bulk path only takes files it can read exactly as the line reader would: an
uncompressed file of at most ``BULK_MAX_BYTES`` (it is read whole), one JSON object a
line and no blank lines but at the end (so row ``i`` is line ``i + 1``, which default
request ids name), every required field present with integer values in range, and
``hash_ids`` long enough. Anything else (a bad row, a float where
an integer belongs, a session column) returns ``None`` and the line reader runs, with
its per-row skips and messages. Tests check both paths give the same table.

Imported where it is used, for start-up time: polars (the Azure CSV reader; importing it
costs more than reading a Mooncake trace whole).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from analyzer import limits
from analyzer.blocks import id_hashes
from analyzer.ingest.detect import Format
from analyzer.ingest.fields import NATIVE_BLOCK
from analyzer.ingest.io import compression
from analyzer.ingest.spool import SPOOLED, list_array

# Formats with a bulk reader.
BULK = frozenset({Format.MOONCAKE, Format.AZURE, Format.BAILIAN})
# A file is read whole: larger ones go to the line reader, whose memory does not grow
# with the file (Arrow's table of a JSON-lines trace is about its size again).
BULK_MAX_BYTES = 256 << 20
HASH_BLOCKS = 1 << 22  # blocks whose ids are picked and hashed in one step


def _content_lines(path: str) -> int:
    """Lines up to the last that is not blank: the line reader skips blank lines, and
    trailing ones (RAGPulse's files end with one) shift no row's line."""
    n = tail = 0  # newlines; those after the last byte that is not whitespace
    content = False
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += chunk.count(b"\n")
            body = chunk.rstrip()
            if body:
                content, tail = True, chunk.count(b"\n", len(body))
            else:
                tail += chunk.count(b"\n")
    return n - tail + 1 if content else 0


class Bulk(NamedTuple):
    """A file read whole: its rows in ``SPOOLED`` form, with request ids, sessions, tenants
    and parents as written (the builder makes them pseudonyms), and their raw times."""

    table: pa.Table
    times: np.ndarray
    iso: bool  # the times were ISO strings, read to epoch seconds
    own_ids: bool  # request ids are the file's (else ``file:line``, counted apart)


def read_bulk(
    path: str,
    fmt: str,
    block_size: int,
    salt: bytes,
    namespace: bytes,
    roots: dict[str, str] | None = None,
) -> Bulk | None:
    """``path`` read in columns, or None: use the line reader.

    ``roots``: Bailian's session of every chat id read so far in the run (the line
    reader's ``bailian_roots``), extended here with this file's chats."""
    if compression(path) != "none" or os.path.getsize(path) > BULK_MAX_BYTES:
        return None
    if fmt == Format.AZURE:
        return _azure(path)
    if fmt == Format.BAILIAN:
        return _bailian(path, block_size, salt, namespace, {} if roots is None else roots)
    return _mooncake(path, block_size, salt, namespace)


def _in_limits(values: np.ndarray, name: str) -> bool:
    return not values.size or (
        limits.reason(int(values.min()), name) is None
        and limits.reason(int(values.max()), name) is None
    )


_INTS = (pa.int64(), pa.int32(), pa.uint32(), pa.uint64())


def _json_rows(path: str) -> pa.Table | None:
    """The file parsed by Arrow, when it is one JSON object a line with no blank lines
    but at its end (so row ``i`` is line ``i + 1``)."""
    try:
        df = pj.read_json(path)
    except (pa.ArrowException, OSError):  # the line reader says which line and why
        return None
    return df if df.num_rows and df.num_rows == _content_lines(path) else None


def _kind(df: pa.Table, name: str) -> pa.DataType | None:
    return df.schema.field(name).type if name in df.column_names else None


def _hashed(
    df: pa.Table, native: int, block_size: int, salt: bytes, namespace: bytes
) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.ChunkedArray] | None:
    """(times, prompt tokens, output tokens, block hashes) of a trace of ``timestamp``,
    ``input_length``, optional ``output_length`` and ``hash_ids`` (one id per ``native``
    tokens), read as the line reader reads them, or None where it would read a row
    otherwise (or skip it)."""
    if (
        block_size % native
        or _kind(df, "timestamp") not in (*_INTS, pa.float64())
        or _kind(df, "input_length") not in _INTS
        or _kind(df, "output_length") not in (*_INTS, pa.null(), None)
        or _kind(df, "hash_ids") != pa.list_(pa.int64())
    ):
        return None
    ts, n_in_col, ids_col = df["timestamp"], df["input_length"], df["hash_ids"]
    if ts.null_count or n_in_col.null_count or ids_col.null_count:
        return None
    t = ts.to_numpy().astype(np.float64)
    n_in = n_in_col.to_numpy().astype(np.int64)
    flat = pc.list_flatten(ids_col)
    if flat.null_count or not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(n_in < 0):
        return None
    if not _in_limits(n_in, "prompt_tokens"):
        return None
    out_tokens = pa.nulls(df.num_rows, pa.int64())
    if "output_length" in df.column_names:
        out_tokens = df["output_length"].cast(pa.int64())
        outs = np.asarray(out_tokens.drop_null())
        if np.any(outs < 0) or not _in_limits(outs, "output_tokens"):
            return None
    lengths = pc.list_value_length(ids_col).to_numpy().astype(np.int64)
    if np.any(lengths < n_in // native):
        return None
    flat_ids = np.asarray(flat.to_numpy(), dtype=np.int64)
    m = block_size // native
    n_blocks = n_in // block_size
    starts = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    offsets = np.zeros(n_blocks.size + 1, dtype=np.int64)
    np.cumsum(n_blocks, out=offsets[1:])
    # The kept ids (every m-th, ending each block) hashed HASH_BLOCKS at a time: the
    # index arrays of all blocks at once took five times the hashes' own memory.
    hashes = np.empty(int(offsets[-1]), dtype=np.uint64)
    a = 0
    while a < n_blocks.size:
        b = int(np.searchsorted(offsets, offsets[a] + HASH_BLOCKS, side="right")) - 1
        b = min(max(b, a + 1), n_blocks.size)
        row = np.repeat(np.arange(a, b), n_blocks[a:b])
        j = np.arange(offsets[b] - offsets[a]) - (offsets[row] - offsets[a])
        picked = flat_ids[starts[row] + m * j + m - 1]
        hashes[offsets[a] : offsets[b]] = id_hashes(namespace, picked, salt)
        a = b
    return t, n_in, out_tokens, _lists(offsets, hashes)


def _spooled(
    n: int,
    request_id: pa.Array,
    prompt: np.ndarray,
    output: pa.Array | pa.ChunkedArray,
    hashes: pa.ChunkedArray,
    session: pa.Array | None = None,
    tenant: pa.Array | None = None,
    parent: pa.Array | None = None,
    turn: pa.Array | pa.ChunkedArray | None = None,
    count_only: bool = False,
) -> pa.Table:
    nulls = pa.nulls(n, pa.string())
    return pa.Table.from_arrays(
        [
            request_id,
            nulls if session is None else session,
            nulls if tenant is None else tenant,
            nulls,  # model: a public trace names none
            pa.array(prompt.astype(np.int64)),
            output,
            hashes,
            pa.nulls(n, pa.list_(pa.uint64())),
            nulls if parent is None else parent,
            pa.nulls(n, pa.int64()) if turn is None else turn,
            pa.array(np.full(n, count_only)),
            pa.array(np.zeros(n, dtype=bool)),
            pa.nulls(n, pa.int64()),  # cached_tokens: a trace has no engine usage
            pa.nulls(n, pa.int64()),  # engine_prompt_tokens
            nulls,  # user_id: a public trace names no user
        ],
        schema=SPOOLED,
    )


def _line_ids(path: str, n: int, line1: int = 1) -> pa.Array:
    """``file:line`` request ids, as the line reader names rows without one."""
    name = Path(path).name
    return pa.array(np.char.add(f"{name}:", np.arange(line1, n + line1).astype(str)).astype(object))


def _mooncake(path: str, block_size: int, salt: bytes, namespace: bytes) -> Bulk | None:
    df = _json_rows(path)
    if df is None or set(df.column_names) & {"session_id", "chat_id"}:
        return None
    got = _hashed(df, NATIVE_BLOCK[Format.MOONCAKE], block_size, salt, namespace)
    if got is None:
        return None
    t, n_in, out_tokens, hashes = got
    n = df.num_rows
    return Bulk(_spooled(n, _line_ids(path, n), n_in, out_tokens, hashes), t, False, False)


def _bailian(
    path: str, block_size: int, salt: bytes, namespace: bytes, roots: dict[str, str]
) -> Bulk | None:
    """Alibaba Bailian (``chat_id``, ``parent_chat_id``, ``type``, ``turn`` beside
    Mooncake's fields; one id per 16 tokens). A chat's session is its first ancestor's id,
    found through ``roots`` in file order as :func:`~analyzer.ingest.readers.parse_bailian`
    finds it; ``type`` is the tenant."""
    df = _json_rows(path)
    if df is None:
        return None
    names = set(df.column_names)
    if (
        _kind(df, "chat_id") not in _INTS
        or df["chat_id"].null_count
        or _kind(df, "parent_chat_id") not in (*_INTS, pa.null(), None)  # None: absent
        or _kind(df, "turn") not in (*_INTS, pa.null(), None)
        or _kind(df, "type") not in (pa.string(), pa.null(), None)
    ):
        return None
    turn = df["turn"].cast(pa.int64()) if "turn" in names else None
    if turn is not None and np.any(np.asarray(turn.drop_null()) < 0):
        return None
    got = _hashed(df, NATIVE_BLOCK[Format.BAILIAN], block_size, salt, namespace)
    if got is None:
        return None
    t, n_in, out_tokens, hashes = got
    n = df.num_rows
    chats = [str(c) for c in df["chat_id"].to_pylist()]
    parents: list[str | None] = [None] * n
    if "parent_chat_id" in names:
        parents = [None if p in (None, -1) else str(p) for p in df["parent_chat_id"].to_pylist()]
    sessions = []
    for chat, parent in zip(chats, parents, strict=True):
        root = chat if parent is None else roots.get(parent, parent)
        roots[chat] = root
        sessions.append(root)
    tenant = None
    if "type" in names:  # an empty type is no tenant, as in the line reader
        types = df["type"].cast(pa.string())
        tenant = pa.array([v or None for v in types.to_pylist()], type=pa.string())
    table = _spooled(
        n,
        pa.array(chats, type=pa.string()),
        n_in,
        out_tokens,
        hashes,
        session=pa.array(sessions, type=pa.string()),
        tenant=tenant,
        parent=pa.array(parents, type=pa.string()),
        turn=turn,
    )
    return Bulk(table, t, False, True)


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_DIGITS = r"^[0-9]{1,18}$"  # what int() reads the same as the line reader, in int64
_AZURE_TIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-2][0-9]:[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?$"


def _csv_shape(path: str) -> tuple[int, int, bool]:
    """(lines, commas, whether the file has quotes, blank lines or a CR outside CRLF)."""
    lines = commas = 0
    odd = False
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            lines += chunk.count(b"\n")
            commas += chunk.count(b",")
            odd = odd or b'"' in chunk or b"\n\n" in chunk or b"\n\r\n" in chunk
            odd = odd or chunk.count(b"\r") != chunk.count(b"\r\n")  # CR only in CRLF
            odd = odd or (last == b"\n" and chunk[:1] == b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n"), commas, odd


def _azure(path: str) -> Bulk | None:
    """An Azure LLM inference trace (CSV) read by polars, or None: use the line reader.

    Taken only when every row is one line with the header's columns (no quotes, blank
    lines, or CR but in CRLF line ends, as the public files have), every timestamp is
    ``YYYY-MM-DD HH:MM:SS[.fffffff]`` at or after 1970, every ``ContextTokens`` a plain
    non-negative integer and every ``GeneratedTokens`` one or empty, all within the
    per-row limits: then row ``i`` is line ``i + 2`` and the line reader would keep every
    row as read here.
    """
    import polars as pl

    lines, commas, odd = _csv_shape(path)
    if odd or lines < 2:
        return None
    try:
        df = pl.read_csv(path, infer_schema=False)
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError):
        return None
    if (
        not set(AZURE_COLUMNS) <= set(df.columns)
        or df.height != lines - 1
        or commas != (len(df.columns) - 1) * lines
    ):
        return None
    ts, n_in, n_out = (df.get_column(c) for c in AZURE_COLUMNS)
    if (
        ts.null_count()
        or n_in.null_count()
        or not ts.str.contains(_AZURE_TIME).all()
        or not n_in.str.contains(_DIGITS).all()
        or not n_out.drop_nulls().str.contains(_DIGITS).all()
    ):
        return None
    # Nanoseconds cut to microseconds (floor: the fraction is after the second), then
    # seconds: the float Python's datetime.timestamp() gives for the same string.
    ns = ts.str.strptime(pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S%.f", strict=False)
    if ns.null_count():
        return None
    us = ns.cast(pl.Int64).to_numpy() // 1000
    if np.any(us < 0):
        return None
    t = us / 1e6
    prompt = n_in.cast(pl.Int64).to_numpy()
    out = n_out.cast(pl.Int64)
    if not _in_limits(prompt, "prompt_tokens") or not _in_limits(
        out.drop_nulls().to_numpy(), "output_tokens"
    ):
        return None
    n = df.height
    missing = out.is_null().to_numpy() if out.null_count() else None
    out_arr = pa.array(out.fill_null(0).to_numpy().astype(np.int64), mask=missing)
    none = _lists(np.zeros(n + 1, dtype=np.int64), np.empty(0, dtype=np.uint64))
    table = _spooled(n, _line_ids(path, n, 2), prompt, out_arr, none, count_only=True)
    return Bulk(table, t, True, False)


def _lists(offsets: np.ndarray, flat: np.ndarray) -> pa.ChunkedArray:
    """A list column in pieces that each fit 32-bit offsets."""
    pieces, a, step = [], 0, 1 << 16
    n = offsets.size - 1
    while a < n:
        b = min(n, a + step)
        pieces.append(list_array(offsets[a : b + 1] - offsets[a], flat[offsets[a] : offsets[b]]))
        a = b
    return pa.chunked_array(pieces, type=pa.list_(pa.uint64()))
