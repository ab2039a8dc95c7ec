"""Bulk readers: a clean pre-hashed trace read whole with polars instead of line by line.

Public traces are large, regular JSON-lines files (Mooncake FAST'25: ``timestamp``,
``input_length``, ``output_length``, ``hash_ids``). Reading them a line at a time in
Python (orjson, a parser call, a row append) cost most of ``kvpool reuse``'s time on
the Mooncake trace; here Arrow's C++ JSON reader (``pyarrow.json``, multithreaded,
already loaded: polars parses as fast but importing it costs more than the whole read)
parses the file in one call into columns, the block ids every request keeps are picked
with numpy, and each distinct id is hashed once in one compiled call
(:func:`analyzer.blocks.id_hashes`).

The bulk path only takes files it can read exactly as the line reader would: an
uncompressed file, one JSON object a line and no blank lines (so row ``i`` is line
``i + 1``, which default request ids name), every required field present with integer
values in range, and ``hash_ids`` long enough. Anything else (a bad row, a float where
an integer belongs, a session column) returns ``None`` and the line reader runs, with
its per-row skips and messages. Tests check both paths give the same table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from analyzer.blocks import id_hashes
from analyzer.ingest.detect import Format
from analyzer.ingest.io import compression
from analyzer.ingest.spool import SPOOLED, list_array

# Formats with a bulk reader, and the block size their hash ids stand for.
BULK: dict[str, int] = {Format.MOONCAKE: 512}


def _line_count(path: str) -> int:
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def read_bulk(
    path: str, fmt: str, block_size: int, salt: bytes, namespace: bytes
) -> tuple[pa.Table, np.ndarray] | None:
    """(the rows in ``SPOOLED`` form, their raw times), or None: use the line reader."""
    import pyarrow.compute as pc
    import pyarrow.json as pj

    native = BULK[fmt]
    if compression(path) != "none" or block_size % native:
        return None
    try:
        df = pj.read_json(path)
    except (pa.ArrowException, OSError):  # the line reader says which line and why
        return None
    names = set(df.column_names)
    ints = (pa.int64(), pa.int32(), pa.uint32(), pa.uint64())

    def kind(name: str) -> pa.DataType | None:
        return df.schema.field(name).type if name in names else None

    if (
        df.num_rows == 0
        or df.num_rows != _line_count(path)
        or names & {"session_id", "chat_id"}
        or kind("timestamp") not in (*ints, pa.float64())
        or kind("input_length") not in ints
        or ("output_length" in names and kind("output_length") not in ints)
        or kind("hash_ids") != pa.list_(pa.int64())
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
    out_tokens = pa.nulls(df.num_rows, pa.int64())
    if "output_length" in names:
        out_tokens = df["output_length"].cast(pa.int64())
        if pc.any(pc.less(out_tokens, 0)).as_py():
            return None
    lengths = pc.list_value_length(ids_col).to_numpy().astype(np.int64)
    if np.any(lengths < n_in // native):
        return None
    flat_ids = flat.to_numpy().astype(np.int64)
    m = block_size // native
    n_blocks = n_in // block_size
    starts = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    offsets = np.zeros(n_blocks.size + 1, dtype=np.int64)
    np.cumsum(n_blocks, out=offsets[1:])
    row = np.repeat(np.arange(n_blocks.size), n_blocks)
    j = np.arange(offsets[-1]) - offsets[row]
    hashes = id_hashes(namespace, flat_ids[starts[row] + m * j + m - 1], salt)
    n = df.num_rows
    name = Path(path).name
    nulls = pa.nulls(n, pa.string())
    table = pa.Table.from_arrays(
        [
            pa.array(np.char.add(f"{name}:", np.arange(1, n + 1).astype(str)).astype(object)),
            nulls,
            nulls,
            nulls,
            pa.array(n_in),
            out_tokens,
            _lists(offsets, hashes),
            pa.nulls(n, pa.list_(pa.uint64())),
            nulls,
            pa.nulls(n, pa.int64()),
            pa.array(np.zeros(n, dtype=bool)),
            pa.array(np.zeros(n, dtype=bool)),
            pa.nulls(n, pa.int64()),  # cached_tokens: a trace has no engine usage
            pa.nulls(n, pa.int64()),  # engine_prompt_tokens
        ],
        schema=SPOOLED,
    )
    return table, t


def _lists(offsets: np.ndarray, flat: np.ndarray) -> pa.ChunkedArray:
    """A list column in pieces that each fit 32-bit offsets."""
    pieces, a, step = [], 0, 1 << 16
    n = offsets.size - 1
    while a < n:
        b = min(n, a + step)
        pieces.append(list_array(offsets[a : b + 1] - offsets[a], flat[offsets[a] : offsets[b]]))
        a = b
    return pa.chunked_array(pieces, type=pa.list_(pa.uint64()))
