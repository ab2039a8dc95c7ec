"""Canonical traces read back: one or several canonical Parquet files (or dataset folders)
merged on one clock, coarsened to a larger block size from their chained hashes alone,
with the previews sidecar ``--keep-previews`` wrote beside them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.errors import InputError, UsageError
from analyzer.ingest.detect import Format
from analyzer.ingest.options import LoadedTrace, SkipSummary
from analyzer.ingest.spool import list_array
from analyzer.trace import CANONICAL_SCHEMA, coarse_positions, read_canonical, read_metadata
from analyzer.trace import trace_metadata as make_metadata


def previews_path(out: str | Path) -> Path:
    """Where ``--keep-previews`` writes the preview sidecar of canonical file ``out``."""
    p = Path(out)
    return p.with_name(p.stem + ".previews.parquet")


def _list_array(offsets: np.ndarray, flat: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    if offsets[-1] >= 2**31:
        raise InputError(
            f"{offsets[-1]:,} blocks do not fit in one canonical file",
            hint="convert the log in parts, or with a larger --block-size",
        )
    return list_array(offsets, flat, mask)


def _read_previews(path: Path) -> dict[int, str]:
    side = previews_path(path)
    if not side.exists():
        return {}
    try:
        t = pq.read_table(side)
        return dict(
            zip(
                (int(h) for h in t.column("block_hash").to_pylist()),
                t.column("preview").to_pylist(),
                strict=True,
            )
        )
    except (OSError, pa.ArrowInvalid, KeyError):
        return {}


def coarsen_table(table: pa.Table, factor: int) -> pa.Table:
    """The canonical table at ``factor`` times its block size, from chained hashes alone.

    Coarse block ``j`` is the fine hash at position ``factor * j + factor - 1`` (it names
    the whole prefix). Content hashes cannot be derived without the tokens: null.
    """
    meta = read_metadata(table)
    fine = int(meta.get("block_size") or 16)
    col = table.column("block_hashes").combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    flat = col.values.to_numpy(zero_copy_only=False)
    new_off, fine_pos = coarse_positions(offsets, factor)
    coarse = flat[fine_pos]
    i = table.column_names.index("block_hashes")
    table = table.set_column(i, "block_hashes", _list_array(new_off, coarse))
    j = table.column_names.index("content_hashes")
    table = table.set_column(j, "content_hashes", pa.nulls(table.num_rows, pa.list_(pa.uint64())))
    new_meta = {**meta, "block_size": str(fine * factor)}
    new_meta.pop("schema_version", None)
    return table.cast(CANONICAL_SCHEMA).replace_schema_metadata(make_metadata(**new_meta))


# Metadata that decides what a block hash means: files that differ in one of these can
# never share a block, so merging them would report no reuse between them, wrongly.
# (key, what it is, whether an empty value is compatible with any: pre-hashed traces
# have no tokenizer or template; files from before salt ids have none).
_HASHING_KEYS = (
    ("salt_id", "salts", True),
    ("tokenizer", "tokenizers", True),
    ("template", "chat templates", True),
    ("hash_keys", "hash keys", False),
)


def _check_same_hashing(paths: list[str], metas: list[dict[str, str]]) -> None:
    for key, what, empty_ok in _HASHING_KEYS:
        seen = {(m.get(key) or "") for m in metas}
        if empty_ok:
            seen.discard("")
        if len(seen) > 1:
            raise InputError(
                f"canonical traces converted with different {what} cannot be merged (their "
                "blocks could never match): "
                + ", ".join(
                    f"{p} ({m.get(key) or 'none'})" for p, m in zip(paths, metas, strict=True)
                ),
                hint="convert the raw logs again with the same salt file and flags",
            )


def open_canonical(
    paths: list[str], block_size: int | None = None, previews_wanted: bool = False
) -> LoadedTrace:
    tables = [read_canonical(p) for p in paths]
    sizes = {read_metadata(t).get("block_size") for t in tables}
    if len(sizes) > 1:
        raise InputError(
            "canonical traces with different block sizes cannot be merged: "
            + ", ".join(
                f"{p} ({read_metadata(t).get('block_size')})"
                for p, t in zip(paths, tables, strict=True)
            )
        )
    _check_same_hashing(paths, [read_metadata(t) for t in tables])
    table = tables[0]
    if len(tables) > 1:
        # Each file's arrival_s counts from its own first request: put them on one clock.
        t0s = [read_metadata(t).get("t0_epoch_s", "") for t in tables]
        if len({bool(t0) for t0 in t0s}) > 1:
            raise InputError(
                "cannot merge canonical traces with absolute and relative timestamps: "
                + ", ".join(
                    f"{p} ({'absolute' if t0 else 'relative'})"
                    for p, t0 in zip(paths, t0s, strict=True)
                )
            )
        meta = dict(tables[0].schema.metadata)
        if t0s[0]:
            start = min(float(t0) for t0 in t0s)
            tables = [
                t.set_column(
                    t.column_names.index("arrival_s"),
                    "arrival_s",
                    pa.array(t.column("arrival_s").to_numpy() + (float(t0) - start)),
                )
                for t, t0 in zip(tables, t0s, strict=True)
            ]
            meta[b"kvpool.t0_epoch_s"] = repr(start).encode()
        table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
        order = np.lexsort((np.arange(table.num_rows), table.column("arrival_s").to_numpy()))
        table = table.take(pa.array(order)).replace_schema_metadata(meta)
    fine = int(read_metadata(table).get("block_size") or 16)
    if block_size is not None and block_size != fine:
        if block_size % fine:
            raise UsageError(
                f"the canonical trace has {fine}-token blocks; --block-size {block_size} is "
                "not a multiple of it",
                hint="convert the raw log again to get finer blocks",
            )
        table = coarsen_table(table, block_size // fine)
    previews: dict[int, str] = {}
    for p in paths if previews_wanted else ():
        previews.update(_read_previews(Path(p)))
    return LoadedTrace(
        table=table,
        skipped=SkipSummary(),
        sources=list(paths),
        formats=[Format.CANONICAL] * len(paths),
        previews=previews,
    )
