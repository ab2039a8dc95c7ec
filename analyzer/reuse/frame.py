"""A canonical trace read as a polars ``LazyFrame``: its files and metadata, its
per-request columns (checked as they stream), and its block accesses, one row per
access ``(request r, position k, chained hash h)``, all at once or a slice of requests
at a time.

The canonical trace is one Parquet file, or a directory of Parquet files read in name
order (a partitioned dataset). Queries run on polars' streaming engine
(``collect(engine="streaming")``), so a scan never needs the whole trace in memory; the
reuse figures keyed by block are queries over hash parts of the accesses
(:mod:`analyzer.reuse.hash_parts`), and :mod:`analyzer.reuse.streamed` answers the
reuse figures' questions with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer import limits
from analyzer.errors import InputError, Location
from analyzer.trace import ADDED_IN_V1, SCHEMA_VERSION, check_metadata, read_metadata

STREAMING: Literal["streaming"] = "streaming"


def canonical_files(source: str | Path) -> list[Path]:
    """The Parquet files of one canonical file or a partitioned dataset directory."""
    p = Path(source)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.parquet") if f.is_file())
        if not files:
            raise InputError("directory holds no .parquet files", Location(str(p)))
        return files
    return [p]


def scan_trace(source: str | Path) -> tuple[pl.LazyFrame, dict[str, str]]:
    """A LazyFrame over a canonical trace (file or dataset directory) and its metadata.

    Checks the kvpool metadata of every file (same schema version and block size); the
    rows' own invariants are checked as they stream (:func:`check_rows`).
    """
    files = canonical_files(source)
    meta: dict[str, str] | None = None
    for f in files:
        try:
            m = read_metadata(pq.read_schema(f))
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"not a readable Parquet file: {exc}", Location(str(f))) from exc
        if m.get("schema_version") != SCHEMA_VERSION:
            raise InputError(
                "not a canonical trace of schema version " + SCHEMA_VERSION,
                Location(str(f)),
                hint="convert it first: kvpool convert FILE -o trace.parquet",
            )
        check_metadata(m, str(f))
        if meta is not None and m.get("block_size") != meta.get("block_size"):
            raise InputError(
                f"block size {m.get('block_size')} differs from {meta.get('block_size')} "
                f"of {files[0]}",
                Location(str(f)),
            )
        meta = meta or m
    assert meta is not None
    lf = pl.scan_parquet([str(f) for f in files])
    names = lf.collect_schema().names()
    missing = [c for c in ADDED_IN_V1 if c not in names]
    if missing:
        lf = lf.with_columns(
            pl.lit(None, dtype=pl.String if c == "user_id" else pl.Int64).alias(c) for c in missing
        )
    return lf, meta


def collect(lf: pl.LazyFrame) -> pl.DataFrame:
    """``lf`` run on the streaming engine."""
    out = lf.collect(engine=STREAMING)
    assert isinstance(out, pl.DataFrame)
    return out


@dataclass(frozen=True)
class Requests:
    """Per-request columns (memory: a few tens of bytes a request)."""

    arrival_s: np.ndarray  # float64
    prompt_tokens: np.ndarray  # int64
    n_blocks: np.ndarray  # int64
    session: np.ndarray  # int32 codes, -1 none
    tenant: np.ndarray  # int32 codes in order of first appearance, -1 none
    token_lcp_prev: np.ndarray | None
    content_ok: bool  # every request has content hashes as long as its block hashes
    count_only: bool
    model: np.ndarray | None = None  # int32 codes into model_names, -1 none
    model_names: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return int(self.arrival_s.size)

    @property
    def offsets(self) -> np.ndarray:
        off = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(self.n_blocks, out=off[1:])
        return off


def _codes(col: pl.Series) -> np.ndarray:
    """Dense codes in order of first appearance; null -> -1."""
    df = pl.DataFrame({"v": col}).with_row_index("i")
    first = df.drop_nulls("v").group_by("v").agg(pl.col("i").min()).sort("i")
    first = first.with_row_index("code")
    codes = df.join(first.select("v", "code"), on="v", how="left", maintain_order="left")
    return codes["code"].fill_null(-1).cast(pl.Int32).to_numpy()


def _names(col: pl.Series) -> list[str]:
    """The distinct values of ``col`` in the order :func:`_codes` numbers them."""
    return [str(v) for v in col.drop_nulls().unique(maintain_order=True).to_list()]


def read_requests(lf: pl.LazyFrame) -> Requests:
    has_model = "model" in lf.collect_schema().names()
    df = collect(
        lf.select(
            *(["model"] if has_model else []),
            "arrival_s",
            "prompt_tokens",
            "session_id",
            "tenant",
            "token_lcp_prev",
            "count_only",
            n_blocks=pl.col("block_hashes").list.len(),
            content_ok=pl.col("content_hashes").list.len() == pl.col("block_hashes").list.len(),
        )
    )
    lcp = None
    if df.height and df["token_lcp_prev"].null_count() == 0:
        lcp = df["token_lcp_prev"].cast(pl.Int64).to_numpy()
    return Requests(
        arrival_s=df["arrival_s"].cast(pl.Float64).to_numpy(),
        prompt_tokens=df["prompt_tokens"].cast(pl.Int64).to_numpy(),
        n_blocks=df["n_blocks"].cast(pl.Int64).to_numpy(),
        session=_codes(df["session_id"]),
        tenant=_codes(df["tenant"]),
        token_lcp_prev=lcp,
        content_ok=bool(df.height) and bool(df["content_ok"].fill_null(False).all()),
        count_only=bool(df.height) and bool(df["count_only"].all()),
        model=_codes(df["model"]) if has_model else None,
        model_names=_names(df["model"]) if has_model else [],
    )


def check_rows(req: Requests, block_size: int, where: str) -> None:
    """The row invariants ``trace.check_invariants`` checks that this path relies on."""

    def bad(message: str, column: str, mask: np.ndarray) -> None:
        idx = np.flatnonzero(mask)
        if idx.size:
            raise InputError(
                f"{message} ({idx.size:,} row{'s' if idx.size > 1 else ''}; "
                f"first at row {int(idx[0])})",
                Location(where, field=column),
                hint="canonical files are written by kvpool convert; re-convert the raw logs",
            )

    if why := limits.reason(block_size, "block_size"):
        raise InputError(f"kvpool.block_size {block_size}: {why}", Location(where))
    p, t = req.prompt_tokens, req.arrival_s
    top = limits.MAX_REQUEST_TOKENS
    bad(f"prompt_tokens outside 0..{top:,}", "prompt_tokens", (p < 0) | (p > top))
    bad("arrival_s is not a finite number", "arrival_s", ~np.isfinite(t))
    bad("arrival_s is negative", "arrival_s", t < 0)
    if not req.count_only:
        bad(
            f"block_hashes length is not prompt_tokens // block_size ({block_size})",
            "block_hashes",
            req.n_blocks != p // block_size,
        )
    if req.token_lcp_prev is not None:
        lcp = req.token_lcp_prev
        bad("token_lcp_prev outside 0..prompt_tokens", "token_lcp_prev", (lcp < 0) | (lcp > p))


def in_arrival_order(source: str | Path) -> bool:
    """Rows sorted by arrival (kvpool writes them so); others go through the eager path,
    which sorts them."""
    lf, _ = scan_trace(source)
    t = collect(lf.select("arrival_s"))["arrival_s"].to_numpy()
    return bool(t.size < 2 or not np.any(t[1:] < t[:-1]))


# -- block accesses -------------------------------------------------------------------


def accesses(lf: pl.LazyFrame, column: str = "block_hashes") -> pl.LazyFrame:
    """One row per block access: pos (its place in the trace, requests in order, blocks in
    order), r (request), k (position in it), h (hash), ph (parent hash)."""
    hashes = pl.col(column)
    return (
        lf.select(column)
        .with_row_index("r")
        .select(
            pl.col("r").cast(pl.Int64),
            h=hashes,
            k=pl.int_ranges(0, hashes.list.len()),
            ph=hashes.list.shift(1),
        )
        .explode("h", "k", "ph")
        .filter(pl.col("h").is_not_null())
        .with_row_index("pos")
    )


def token_weight(k: pl.Expr, prompt: pl.Expr, block_size: int) -> pl.Expr:
    """Tokens block ``k`` is worth under the last-token rule (``stack._weight``)."""
    last = prompt - 1
    hi = pl.min_horizontal((k + 1) * block_size, last)
    lo = pl.min_horizontal(k * block_size, last)
    return pl.max_horizontal(hi - lo, pl.lit(0))


def n_distinct_blocks(lf: pl.LazyFrame) -> int:
    return int(collect(accesses(lf).select(pl.col("h").n_unique()))[0, 0])


SLICE_ROWS = 1 << 22


def access_slices(
    lf: pl.LazyFrame, column: str, offsets: np.ndarray, rows: int | None = None
) -> Iterator[pl.DataFrame]:
    """:func:`accesses` of ``lf`` (``pos`` and ``r`` as over the whole trace), the
    requests of about ``rows`` block accesses at a time (``offsets``: each request's
    first access), each slice collected whole when the caller asks for it. Pull-based:
    ``collect_batches`` runs its query ahead of a slower caller and holds what it has
    not taken (1.6 GB while a 1M-request trace's parts were written)."""
    rows = rows or SLICE_ROWS
    n = offsets.size - 1
    start, pos = 0, 0
    while start < n:
        end = int(np.searchsorted(offsets, offsets[start] + rows, side="right")) - 1
        end = min(n, max(end, start + 1))
        df = collect(accesses(lf.slice(start, end - start), column))
        yield df.with_columns(
            (pl.col("r") + start).cast(df.schema["r"]), (pl.col("pos") + pos).cast(df.schema["pos"])
        )
        start, pos = end, pos + df.height
