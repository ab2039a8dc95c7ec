"""The canonical trace: its Parquet schema and the compact in-memory form analyses use.

Every input format ends up as one canonical table (``CANONICAL_SCHEMA``), one row per
request, sorted by arrival. Analyses work on :class:`BlockTrace`, a columnar, dense
form of the same data: block hashes are replaced by dense integer ids assigned in
order of first appearance, and each request's blocks are a slice of one flat array
(``block_ids[offsets[i]:offsets[i + 1]]``).

Schema version 1 (Parquet key-value metadata ``kvpool.schema_version = "1"``):

==================  ===================  ==================================================
column              type                 meaning
==================  ===================  ==================================================
request_id          string               the log's id, or ``<file>:<line>`` when it had none
arrival_s           float64              seconds since the first request of the trace
session_id          string, nullable     conversation / cache key (``prompt_cache_key``, ...)
tenant              string, nullable     tenant, or the model when no tenant is known
model               string, nullable     model named in the request
prompt_tokens       int64                prompt length as the engine sees it
output_tokens       int64, nullable      generated tokens (response usage or trace field)
block_hashes        list<uint64>         chained hashes of the full blocks of the prompt
content_hashes      list<uint64>, null   unchained hash of each full block's tokens alone
token_lcp_prev      int64, nullable      token-exact longest common prefix with any
                                         earlier request (null when not computed)
parent_request_id   string, nullable     previous turn, when the format says (Bailian)
turn                int64, nullable      turn number, when the format says
count_only          bool                 the source has lengths only, no content
approx_lengths      bool                 lengths were estimated or corrected, not counted
cached_tokens       int64, nullable      prompt tokens the serving engine found cached, as
                                         its response said (``usage.prompt_tokens_details
                                         .cached_tokens``)
engine_prompt_tokens int64, nullable     prompt tokens as the engine counted them
                                         (``usage.prompt_tokens``)
user_id             string, nullable     the end user or session owner the log names, as a
                                         salted pseudonym ``u-<16 hex>`` unless keep_names
==================  ===================  ==================================================

File-level metadata (all strings): ``kvpool.schema_version``, ``kvpool.block_size``,
``kvpool.tokenizer``, ``kvpool.template``, ``kvpool.hash_keys``, ``kvpool.source``,
``kvpool.t0_epoch_s`` (absolute time of arrival 0, empty when unknown).

Block ``k`` of a request covers tokens ``[k * block_size, (k + 1) * block_size)``; only
full blocks are hashed, so ``len(block_hashes) == prompt_tokens // block_size``.
Because hashes are chained, equal hashes at position ``k`` mean equal prompts up to
the end of block ``k``, and the hash at position ``m * j + m - 1`` identifies the
prefix of ``m * j + m`` blocks: coarser block sizes are derived without re-hashing
(:meth:`BlockTrace.coarsen`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer import limits
from analyzer.dense import first_seen
from analyzer.errors import InputError, Location
from analyzer.limits import RANGES
from analyzer.outputs import PARTITION, atomic_path, note_input
from analyzer.quoting import has_control

SCHEMA_VERSION = "1"

CANONICAL_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("arrival_s", pa.float64(), nullable=False),
        pa.field("session_id", pa.string()),
        pa.field("tenant", pa.string()),
        pa.field("model", pa.string()),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("output_tokens", pa.int64()),
        pa.field("block_hashes", pa.list_(pa.uint64()), nullable=False),
        pa.field("content_hashes", pa.list_(pa.uint64())),
        pa.field("token_lcp_prev", pa.int64()),
        pa.field("parent_request_id", pa.string()),
        pa.field("turn", pa.int64()),
        pa.field("count_only", pa.bool_(), nullable=False),
        pa.field("approx_lengths", pa.bool_(), nullable=False),
        pa.field("cached_tokens", pa.int64()),
        pa.field("engine_prompt_tokens", pa.int64()),
        pa.field("user_id", pa.string()),
    ]
)
# Nullable columns added to version 1 after its first files: a file without them reads
# as if every row left them out.
ADDED_IN_V1 = ("cached_tokens", "engine_prompt_tokens", "user_id")

META_KEYS = (
    "schema_version",
    "block_size",
    "tokenizer",
    "template",
    "hash_keys",
    "source",
    "t0_epoch_s",
    "salt_id",
)


def trace_metadata(**values: object) -> dict[bytes, bytes]:
    """Parquet key-value metadata for a canonical table; unknown keys are refused."""
    unknown = set(values) - set(META_KEYS)
    assert not unknown, f"unknown canonical metadata keys {unknown}"
    meta = {
        "schema_version": SCHEMA_VERSION,
        **{k: "" if v is None else str(v) for k, v in values.items()},
    }
    return {f"kvpool.{k}".encode(): v.encode() for k, v in meta.items()}


def read_metadata(table_or_schema: pa.Table | pa.Schema) -> dict[str, str]:
    schema = table_or_schema.schema if isinstance(table_or_schema, pa.Table) else table_or_schema
    raw = schema.metadata or {}
    out: dict[str, str] = {}
    for k, v in raw.items():
        key = k.decode()
        if key.startswith("kvpool."):
            out[key.removeprefix("kvpool.")] = v.decode()
    return out


# What an optional column holds when a row leaves it out.
_ROW_DEFAULTS = {
    f.name: (False if pa.types.is_boolean(f.type) else None)
    for f in CANONICAL_SCHEMA
    if f.nullable or pa.types.is_boolean(f.type)
}


def table_from_rows(rows: Sequence[Mapping[str, object]], **meta: object) -> pa.Table:
    """A canonical table from row dicts (request_id, arrival_s, prompt_tokens and
    block_hashes required; the other columns default to null, the flags to False)."""
    full = [{**_ROW_DEFAULTS, **r} for r in rows]
    return pa.Table.from_pylist(full, schema=CANONICAL_SCHEMA).replace_schema_metadata(
        trace_metadata(**meta)
    )


def is_canonical(path: str | Path) -> bool:
    """True when ``path`` is a Parquet file carrying the canonical metadata."""
    try:
        meta = read_metadata(pq.read_schema(path))
    except (OSError, pa.ArrowInvalid):
        return False
    return "schema_version" in meta


def write_canonical(table: pa.Table, path: str | Path, *, force: bool = False) -> None:
    """Write a canonical table atomically; the schema is enforced so every file reads the same."""

    path = Path(path)
    missing = [f.name for f in CANONICAL_SCHEMA if f.name not in table.column_names]
    assert not missing, f"canonical table lacks columns {missing}"
    meta = table.schema.metadata or {}
    table = (
        table.select(CANONICAL_SCHEMA.names).cast(CANONICAL_SCHEMA).replace_schema_metadata(meta)
    )
    with atomic_path(path, force=force) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def dataset_files(path: str | Path) -> list[Path]:
    """The Parquet files of a partitioned canonical dataset (a folder of
    ``window_start_s=NNN/`` folders, see :class:`WindowedWriter`), in time order."""

    return sorted(Path(path).glob(f"{PARTITION}=*/*.parquet"))


def read_canonical(path: str | Path) -> pa.Table:
    """A canonical file, or a partitioned dataset folder, checked and in arrival order."""

    path = Path(path)
    note_input(path)
    if path.is_dir():
        return _read_dataset(path)
    return _read_file(path)


def _read_dataset(path: Path) -> pa.Table:
    """The windows of a dataset folder as one table; every window must carry the same
    metadata (one conversion wrote them)."""
    files = dataset_files(path)
    if not files:
        raise InputError(
            "directory holds no window_start_s=*/*.parquet files, so it is not a canonical dataset",
            Location(str(path)),
            hint="pass a canonical .parquet file, or a folder written by kvpool convert --ray",
        )
    tables: list[pa.Table] = []
    for f in files:
        t = _read_file(f)
        if tables and t.schema.metadata != tables[0].schema.metadata:
            diff = sorted(
                k.decode(errors="replace").removeprefix("kvpool.")
                for k in set(t.schema.metadata) | set(tables[0].schema.metadata)
                if t.schema.metadata.get(k) != tables[0].schema.metadata.get(k)
            )
            raise InputError(
                f"this window's metadata differs from {files[0].name} in the same dataset "
                f"({', '.join(diff)})",
                Location(str(f)),
                hint="a dataset's windows must come from one conversion",
            )
        tables.append(t)
    meta = tables[0].schema.metadata
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
    return _sorted(table.replace_schema_metadata(meta))


class WindowedWriter:
    """Canonical batches, in arrival order, written as a partitioned dataset: one Parquet
    file per ``window_s`` seconds of arrival, ``DIR/window_start_s=NNNNNNNNNN/part-0.parquet``
    (Hive-style, so Ray Data, polars and Arrow read the window as a column; the start
    is in whole seconds from the trace's first request, zero-padded so that names sort
    in time order). Each file carries the whole trace's metadata."""

    def __init__(self, directory: Path, schema: pa.Schema, window_s: int, **kw: object) -> None:
        assert window_s >= 1
        self.directory, self.schema, self.window_s, self.kw = directory, schema, window_s, kw
        self._writer: pq.ParquetWriter | None = None
        self._window = -1

    def write_batch(self, batch: pa.RecordBatch) -> None:

        t = batch.column("arrival_s").to_numpy(zero_copy_only=False)
        windows = np.floor(t / self.window_s).astype(np.int64)
        cuts = np.flatnonzero(np.diff(windows)) + 1
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, t.size], strict=True):
            if a == b:
                continue
            w = int(windows[a])
            if w != self._window:
                self.close()
                start = w * self.window_s
                d = self.directory / f"{PARTITION}={start:010d}"
                d.mkdir()
                self._writer = pq.ParquetWriter(d / "part-0.parquet", self.schema, **self.kw)
                self._window = w
            assert self._writer is not None
            self._writer.write_batch(batch.slice(a, b - a))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> WindowedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_file(path: Path) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"not a readable Parquet file: {exc}", Location(str(path))) from exc
    meta = read_metadata(table)
    if "schema_version" not in meta:
        raise InputError(
            "Parquet file has no kvpool metadata, so it is not a canonical trace",
            Location(str(path)),
            hint="convert it first: kvpool convert FILE -o trace.parquet",
        )
    if meta["schema_version"] != SCHEMA_VERSION:
        raise InputError(
            f"canonical schema version {meta['schema_version']} is not supported "
            f"(this kvpool reads version {SCHEMA_VERSION})",
            Location(str(path)),
        )
    for name in ADDED_IN_V1:
        if name not in table.column_names:
            table = table.append_column(
                CANONICAL_SCHEMA.field(name),
                pa.nulls(table.num_rows, CANONICAL_SCHEMA.field(name).type),
            )
    missing = [n for n in CANONICAL_SCHEMA.names if n not in table.column_names]
    if missing:
        raise InputError(f"canonical trace lacks columns {missing}", Location(str(path)))
    check_metadata(meta, str(path))
    for f in CANONICAL_SCHEMA:  # a hand-made file: cast compatible types, name the others
        col = table.column(f.name)
        if col.type == f.type:
            continue
        try:
            col = col.cast(f.type)
        except pa.ArrowException as exc:  # invalid values, or no such cast
            raise InputError(
                f"column is {col.type}, the canonical schema has {f.type}",
                Location(str(path), field=f.name),
            ) from exc
        table = table.set_column(table.column_names.index(f.name), f.name, col)
    check_invariants(table, int(meta.get("block_size") or 16), str(path))
    return _sorted(table)


def _sorted(table: pa.Table) -> pa.Table:
    """Rows in arrival order. A file whose rows are not (hand-made, or edited) is sorted
    (stably); its ``token_lcp_prev``, measured against the rows before each in the old
    order, no longer holds and is dropped (the block-level figures remain)."""
    t = table.column("arrival_s").to_numpy(zero_copy_only=False)
    if t.size < 2 or not bool(np.any(t[1:] < t[:-1])):
        return table
    order = np.argsort(t, kind="stable")
    table = table.take(pa.array(order))
    i = table.column_names.index("token_lcp_prev")
    return table.set_column(i, "token_lcp_prev", pa.nulls(table.num_rows, pa.int64()))


# kvpool.tokenizer: cl100k_base, or hf:NAME of a tokenizer.json or a model folder, then
# *RATIO when --token-ratio scaled the counts
_TOKENIZER_META = re.compile(r"(?:cl100k_base|hf:[^*]{1,255})(?:\*(?P<ratio>[0-9.e+-]{1,24}))?")
# kvpool.template: a built-in framing (--template), or hf:NAME#DIGEST of a model folder's
# chat templates (--tokenizer DIR)
_TEMPLATE_META = re.compile(r"chatml|llama3|hf:[^*]{1,255}#[0-9a-f]{12}")


def check_metadata(meta: Mapping[str, str], where: str) -> None:
    """The file's metadata strings by the rules of the flags they stand for: a
    tokenizer is ``cl100k_base`` or ``hf:`` and a folder or file name (which
    ``--tokenizer`` refuses with a control character or ``*``), its ratio a
    ``--token-ratio`` in range; a template one of ``--template``'s or a model folder's;
    the block size a whole number in ``--block-size``'s range and the start time a
    number (every reader goes through here, the streamed ``reuse`` of a canonical
    file too); no value carries a control character. They reach launch scripts, pilot
    commands and reports, so an edited file must not be able to smuggle code in."""

    for key, value in meta.items():
        if has_control(value):
            raise InputError(
                f"kvpool.{key} holds a control character", Location(where, field=f"kvpool.{key}")
            )
    bs = meta.get("block_size", "")
    if bs and not (bs.isascii() and bs.isdigit() and int(bs) >= 1):
        raise InputError(
            f"kvpool.block_size '{bs}' is not a positive integer",
            Location(where, field="kvpool.block_size"),
        )
    if bs and (why := limits.reason(int(bs), "block_size")):
        raise InputError(
            f"kvpool.block_size {bs}: {why}", Location(where, field="kvpool.block_size")
        )
    t0 = meta.get("t0_epoch_s", "")
    try:
        finite = math.isfinite(float(t0 or 0))
    except ValueError:
        finite = False
    if not finite:  # it places the file's times among others' when several are read
        raise InputError(
            f"kvpool.t0_epoch_s '{t0}' is not a finite number",
            Location(where, field="kvpool.t0_epoch_s"),
        )
    tok = meta.get("tokenizer", "")
    m = _TOKENIZER_META.fullmatch(tok)
    ratio = m.group("ratio") if m else None
    ok = m is not None
    if ok and ratio is not None:
        try:
            ok = float(ratio) in RANGES["token_ratio"]
        except ValueError:
            ok = False
    if tok and not ok:
        raise InputError(
            f"kvpool.tokenizer {tok!r} is not a tokenizer kvpool writes (cl100k_base, or "
            "hf:NAME, with *RATIO for --token-ratio in its range)",
            Location(where, field="kvpool.tokenizer"),
        )
    template = meta.get("template", "")
    if template and not _TEMPLATE_META.fullmatch(template):
        raise InputError(
            f"kvpool.template {template!r} is not a template kvpool writes (chatml, llama3, "
            "or hf:NAME#DIGEST of a model folder's)",
            Location(where, field="kvpool.template"),
        )


def check_invariants(table: pa.Table, block_size: int, where: str) -> None:
    """The invariants of docs/schema.md, checked on read: a canonical file is input too.

    An edited ``block_size``, negative or absurd lengths, or NaN arrival times would
    otherwise give wrong answers with exit 0 (or hang the replay). Vectorised: a
    few milliseconds per million rows.
    """
    import pyarrow.compute as pc

    def bad(message: str, column: str, mask: pa.ChunkedArray | np.ndarray) -> None:
        idx = np.flatnonzero(np.asarray(mask, dtype=bool))
        if idx.size:
            raise InputError(
                f"{message} ({idx.size:,} row{'s' if idx.size > 1 else ''}; "
                f"first at row {int(idx[0])})",
                Location(where, field=column),
                hint="canonical files are written by kvpool convert; re-convert the raw logs",
            )

    if why := limits.reason(block_size, "block_size"):
        raise InputError(f"kvpool.block_size {block_size}: {why}", Location(where))
    if table.num_rows == 0:
        return
    prompt = table.column("prompt_tokens")
    top = limits.MAX_REQUEST_TOKENS
    bad("prompt_tokens is null", "prompt_tokens", pc.is_null(prompt).to_numpy())
    p = prompt.to_numpy(zero_copy_only=False)
    bad(f"prompt_tokens outside 0..{top:,}", "prompt_tokens", (p < 0) | (p > top))
    out = table.column("output_tokens").to_numpy(zero_copy_only=False)
    out_f = np.asarray(out, dtype=np.float64)  # nulls are NaN
    bad(f"output_tokens outside 0..{top:,}", "output_tokens", (out_f < 0) | (out_f > top))
    t = np.asarray(table.column("arrival_s").to_numpy(zero_copy_only=False), dtype=np.float64)
    bad("arrival_s is not a finite number", "arrival_s", ~np.isfinite(t))
    bad("arrival_s is negative", "arrival_s", t < 0)
    n_blocks = pc.list_value_length(table.column("block_hashes")).to_numpy(zero_copy_only=False)
    n_blocks = np.asarray(n_blocks, dtype=np.float64)
    count_only = np.asarray(table.column("count_only").to_numpy(zero_copy_only=False), dtype=bool)
    want = p // block_size
    bad(
        f"block_hashes length is not prompt_tokens // block_size ({block_size})",
        "block_hashes",
        ~count_only & (n_blocks != want),
    )
    n_content = pc.list_value_length(table.column("content_hashes")).to_numpy(zero_copy_only=False)
    n_content = np.asarray(n_content, dtype=np.float64)  # null lists are NaN
    bad(
        "content_hashes is neither null nor as long as block_hashes",
        "content_hashes",
        ~np.isnan(n_content) & (n_content != n_blocks),
    )
    lcp = np.asarray(
        table.column("token_lcp_prev").to_numpy(zero_copy_only=False), dtype=np.float64
    )
    bad("token_lcp_prev outside 0..prompt_tokens", "token_lcp_prev", (lcp < 0) | (lcp > p))


def _codes(values: list[str | None]) -> tuple[np.ndarray, list[str]]:
    """Dense codes in order of first appearance; None becomes -1."""
    index: dict[str, int] = {}
    codes = np.empty(len(values), dtype=np.int32)
    for i, v in enumerate(values):
        if v is None:
            codes[i] = -1
        else:
            codes[i] = index.setdefault(v, len(index))
    return codes, list(index)


def _recoded(codes: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes of :func:`_codes` (-1: none) of some of the rows, renumbered in order of
    first appearance among them, with their names: :func:`_codes` of those rows' values."""
    out = np.full(codes.size, -1, dtype=np.int32)
    known = codes >= 0
    if not known.any():
        return out, []
    uniq, first, inverse = np.unique(codes[known], return_index=True, return_inverse=True)
    ranks, order = _first_seen(first, inverse)
    out[known] = ranks
    return out, [names[int(c)] for c in uniq[order]]


# Above this many hashes the dense ids come from one compiled pass with a hash table
# (analyzer/dense.py): np.unique with the first indices and the inverse sorts
# them all, 1.5 s of a 50,000-request log's 4.2M block accesses on two cores, and a hash
# join holds about 24 bytes an access (2 GB at a million chat requests).
DENSE_COMPILED = 200_000
# The per-access columns of a canonical table: 8 bytes an access each.
HASH_COLUMNS = ("block_hashes", "content_hashes")


def first_seen_ids(
    flat_hashes: np.ndarray | Sequence[np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Map hashes to dense ids in order of first appearance; return (ids, id -> hash).

    The hashes are one array or several read one after the other (a column's chunks)."""
    parts = [flat_hashes] if isinstance(flat_hashes, np.ndarray) else list(flat_hashes)
    total = sum(p.size for p in parts)
    if total == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
    if total > DENSE_COMPILED:
        return _dense_compiled(parts)
    flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
    uniq, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    ids, order = _first_seen(first, inverse)
    return ids, uniq[order]


def _dense_compiled(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`first_seen_ids` in one compiled pass (the same ids: tests/ingest/test_trace.py);
    64-bit hashes of either sign are read as their bits."""

    dtype = parts[0].dtype
    ids, seen = first_seen([np.ascontiguousarray(p).view(np.uint64) for p in parts])
    return ids, seen.view(dtype)


def _flat_chunks(column: pa.ChunkedArray) -> list[np.ndarray]:
    """The values of a list<uint64> column, one array per chunk, without copying them."""
    return [
        c.flatten().to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
        for c in column.chunks
    ]


def _first_seen(first: np.ndarray, inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Renumber ``np.unique``'s sorted values by first appearance: (ids, unique order)."""
    order = np.argsort(first, kind="stable")  # unique values by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse.reshape(-1)].astype(np.int64, copy=False), order


def coarse_positions(offsets: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """(new offsets, fine positions) of the blocks ``factor`` times coarser.

    Request ``i`` with ``c`` fine blocks has ``c // factor`` coarse ones; coarse block ``j``
    is named by the chained hash at fine position ``j * factor + factor - 1`` (the
    returned positions index the flat fine array, request by request).
    """
    new_counts = np.diff(offsets) // factor
    new_offsets = np.zeros(new_counts.size + 1, dtype=np.int64)
    np.cumsum(new_counts, out=new_offsets[1:])
    req = np.repeat(np.arange(new_counts.size), new_counts)
    within = np.arange(new_offsets[-1]) - new_offsets[req]
    return new_offsets, offsets[req] + within * factor + factor - 1


@dataclass(frozen=True, slots=True)
class BlockTrace:
    """Compact, columnar form of a canonical trace, sorted by arrival.

    ``block_ids`` are dense in order of first appearance, so a block is new exactly when
    its id equals the number of distinct blocks seen so far. ``content_ids`` (when the
    source had content) identify each block's tokens regardless of position, for reuse
    that is not a prefix.
    """

    block_size: int
    arrival_s: np.ndarray  # float64 (n,)
    prompt_tokens: np.ndarray  # int64 (n,)
    output_tokens: np.ndarray  # int64 (n,), -1 when unknown
    session: np.ndarray  # int32 (n,), -1 when none
    tenant: np.ndarray  # int32 (n,), -1 when none
    offsets: np.ndarray  # int64 (n + 1,)
    block_ids: np.ndarray  # int64 (offsets[-1],)
    block_hashes: np.ndarray  # uint64 (distinct blocks,): dense id -> chained hash
    request_ids: list[str]
    session_names: list[str]
    tenant_names: list[str]
    count_only: bool = False
    content_ids: np.ndarray | None = None  # int64 (offsets[-1],)
    token_lcp_prev: np.ndarray | None = None  # int64 (n,)
    previews: dict[int, str] = field(default_factory=dict)  # dense block id -> text
    meta: dict[str, str] = field(default_factory=dict)
    # What the serving engine's responses said, -1 where a request's did not say
    # (None: no request did): cached prompt tokens, and the prompt as it counted it.
    cached_tokens: np.ndarray | None = None  # int64 (n,)
    engine_prompt_tokens: np.ndarray | None = None  # int64 (n,)
    model: np.ndarray | None = None  # int32 (n,) codes into model_names, -1 when none
    model_names: list[str] = field(default_factory=list)
    # The end user of each request (None: no request named one), codes into user_names.
    user: np.ndarray | None = None  # int32 (n,), -1 when none
    user_names: list[str] = field(default_factory=list)

    @property
    def n_requests(self) -> int:
        return int(self.arrival_s.size)

    @property
    def n_blocks(self) -> int:
        """Distinct blocks."""
        return int(self.block_hashes.size)

    @property
    def n_accesses(self) -> int:
        return int(self.block_ids.size)

    def blocks_of(self, i: int) -> np.ndarray:
        return self.block_ids[self.offsets[i] : self.offsets[i + 1]]

    @classmethod
    def from_table(
        cls,
        table: pa.Table,
        previews: Mapping[int, str] | None = None,
        *,
        hashes: dict[str, pa.ChunkedArray] | None = None,
    ) -> BlockTrace:
        """Build from a canonical table (rows need not be sorted; they are sorted here).

        ``previews`` maps chained block hash -> text preview and is re-keyed by dense id.
        ``hashes``: the ``block_hashes`` (and ``content_hashes``) columns given apart from
        ``table``, which then has none; each is taken out of the dict once numbered, so a
        caller holding no other reference frees it before the next is numbered.
        """
        meta = read_metadata(table)
        block_size = int(meta.get("block_size") or 16)
        handed = hashes is not None
        if hashes is None:
            hashes = {c: table.column(c) for c in HASH_COLUMNS if c in table.column_names}
        order = np.argsort(table.column("arrival_s").to_numpy(), kind="stable")
        if not np.array_equal(order, np.arange(order.size)):
            table = table.take(pa.array(order))
            hashes = {c: a.take(pa.array(order)) for c, a in hashes.items()}
        col = table.column
        # Read in Arrow's chunks as they are (no copy of the 8 bytes an access each
        # hash column holds)
        import pyarrow.compute as pc

        block = hashes.pop("block_hashes")
        counts = pc.list_value_length(block).fill_null(0).to_numpy(zero_copy_only=False)
        offsets = np.zeros(table.num_rows + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        ids, id_hash = first_seen_ids(_flat_chunks(block))
        del block
        if handed:  # the column is gone: return its pages before the next is numbered
            pa.default_memory_pool().release_unused()
        content_ids = None
        content = hashes.pop("content_hashes", None)
        if content is not None and content.null_count == 0:
            cparts = _flat_chunks(content)
            if sum(p.size for p in cparts) == ids.size:
                content_ids, _ = first_seen_ids(cparts)
            del cparts
        del content
        lcp = None
        if "token_lcp_prev" in table.column_names and col("token_lcp_prev").null_count == 0:
            lcp = col("token_lcp_prev").to_numpy().astype(np.int64)
        sess, sess_names = _codes(col("session_id").to_pylist())
        ten, ten_names = _codes(col("tenant").to_pylist())
        out_tok = col("output_tokens").fill_null(-1).to_numpy().astype(np.int64)
        cached = engine_prompt = None
        names = table.column_names
        if "cached_tokens" in names and col("cached_tokens").null_count < table.num_rows:
            cached = col("cached_tokens").fill_null(-1).to_numpy().astype(np.int64)
            if "engine_prompt_tokens" in names:
                engine_prompt = col("engine_prompt_tokens").fill_null(-1).to_numpy()
                engine_prompt = engine_prompt.astype(np.int64)
        model, model_names = _codes(col("model").to_pylist())
        user: np.ndarray | None = None
        user_names: list[str] = []
        if "user_id" in names and col("user_id").null_count < table.num_rows:
            user, user_names = _codes(col("user_id").to_pylist())
        count_only = bool(table.num_rows) and bool(pa.compute.all(col("count_only")).as_py())
        by_id: dict[int, str] = {}
        if previews:
            pos = {int(h): i for i, h in enumerate(id_hash)}
            by_id = {pos[h]: t for h, t in previews.items() if h in pos}
        return cls(
            block_size=block_size,
            arrival_s=col("arrival_s").to_numpy().astype(np.float64),
            prompt_tokens=col("prompt_tokens").to_numpy().astype(np.int64),
            output_tokens=out_tok,
            session=sess,
            tenant=ten,
            offsets=offsets,
            block_ids=ids,
            block_hashes=id_hash,
            request_ids=col("request_id").to_pylist(),
            session_names=sess_names,
            tenant_names=ten_names,
            count_only=count_only,
            content_ids=content_ids,
            token_lcp_prev=lcp,
            previews=by_id,
            meta=meta,
            cached_tokens=cached,
            engine_prompt_tokens=engine_prompt,
            model=model,
            model_names=model_names,
            user=user,
            user_names=user_names,
        )

    @classmethod
    def from_parquet(cls, path: str | Path) -> BlockTrace:
        return cls.from_table(read_canonical(path))

    def requests(
        self,
        rows: np.ndarray,
        *,
        count_only: bool,
        token_lcp_prev: np.ndarray | None,
        content: bool = True,
    ) -> BlockTrace:
        """The requests at positions ``rows`` (increasing) as a trace of their own: what
        :meth:`from_table` builds from the table rows they came from (block, content,
        session, tenant, user and model ids renumbered by first appearance among them;
        no previews), without the block hash columns, which a caller may have dropped.

        ``count_only`` and ``token_lcp_prev`` are the rows' own, which this trace cannot
        tell (its flag and column are the whole table's): from the table's columns.
        ``content``: with content ids (when this trace has them)."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = np.diff(self.offsets)[rows]
        offsets = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        # the flat positions of the rows' accesses, request by request
        pos = np.repeat(self.offsets[rows] - offsets[:-1], counts) + np.arange(offsets[-1])
        ids, old = first_seen_ids(self.block_ids[pos])
        content_ids = None
        if content and self.content_ids is not None:
            content_ids, _ = first_seen_ids(self.content_ids[pos])
        del pos
        session, session_names = _recoded(self.session[rows], self.session_names)
        tenant, tenant_names = _recoded(self.tenant[rows], self.tenant_names)
        model: np.ndarray | None = None
        model_names: list[str] = []
        if self.model is not None:
            model, model_names = _recoded(self.model[rows], self.model_names)
        user: np.ndarray | None = None
        user_names: list[str] = []
        if self.user is not None and bool((self.user[rows] >= 0).any()):
            user, user_names = _recoded(self.user[rows], self.user_names)
        cached = engine_prompt = None
        if self.cached_tokens is not None and bool((self.cached_tokens[rows] != -1).any()):
            cached = self.cached_tokens[rows]
            if self.engine_prompt_tokens is not None:
                engine_prompt = self.engine_prompt_tokens[rows]
        return BlockTrace(
            block_size=self.block_size,
            arrival_s=self.arrival_s[rows],
            prompt_tokens=self.prompt_tokens[rows],
            output_tokens=self.output_tokens[rows],
            session=session,
            tenant=tenant,
            offsets=offsets,
            block_ids=ids,
            block_hashes=self.block_hashes[old],
            request_ids=[self.request_ids[i] for i in rows.tolist()],
            session_names=session_names,
            tenant_names=tenant_names,
            count_only=count_only,
            content_ids=content_ids,
            token_lcp_prev=token_lcp_prev,
            meta=dict(self.meta),
            cached_tokens=cached,
            engine_prompt_tokens=engine_prompt,
            model=model,
            model_names=model_names,
            user=user,
            user_names=user_names,
        )

    def coarsen(self, factor: int) -> BlockTrace:
        """The same trace at ``block_size * factor``, from the chained hashes alone."""
        assert factor >= 1
        if factor == 1:
            return self
        new_offsets, fine_pos = coarse_positions(self.offsets, factor)
        fine_ids = self.block_ids[fine_pos]
        ids, id_hash_idx = first_seen_ids(fine_ids.astype(np.uint64))
        hashes = self.block_hashes[id_hash_idx.astype(np.int64)] if fine_ids.size else id_hash_idx
        content_ids = None
        if self.content_ids is not None and fine_ids.size:
            # A coarse block's content is the tuple of its fine blocks' contents.
            parts = np.stack(
                [self.content_ids[fine_pos - (factor - 1 - k)] for k in range(factor)], axis=1
            )
            _, first, inv = np.unique(parts, axis=0, return_index=True, return_inverse=True)
            content_ids, _ = _first_seen(first, inv)
        previews: dict[int, str] = {}
        if self.previews:
            # Re-key only the previewed blocks: a dict over every access costs seconds at 20M.
            wanted = np.fromiter(self.previews, dtype=np.int64, count=len(self.previews))
            hit = np.isin(fine_ids, wanted)
            fine_hit, first = np.unique(fine_ids[hit], return_index=True)
            coarse_hit = ids[hit][first]
            previews = {
                int(c): self.previews[int(f)] for f, c in zip(fine_hit, coarse_hit, strict=True)
            }
        return BlockTrace(
            block_size=self.block_size * factor,
            arrival_s=self.arrival_s,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            session=self.session,
            tenant=self.tenant,
            offsets=new_offsets,
            block_ids=ids,
            block_hashes=hashes.astype(np.uint64),
            request_ids=self.request_ids,
            session_names=self.session_names,
            tenant_names=self.tenant_names,
            count_only=self.count_only,
            content_ids=content_ids,
            token_lcp_prev=self.token_lcp_prev,
            previews=previews,
            meta={**self.meta, "block_size": str(self.block_size * factor)},
            cached_tokens=self.cached_tokens,
            engine_prompt_tokens=self.engine_prompt_tokens,
            model=self.model,
            model_names=self.model_names,
            user=self.user,
            user_names=self.user_names,
        )
