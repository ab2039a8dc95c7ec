"""The reuse statistics that are set operations, as polars queries over the canonical trace.

The canonical trace (one Parquet file, or a directory of Parquet files read in name
order: a partitioned dataset) is scanned as a polars ``LazyFrame``; its blocks are one
row per access ``(request r, position k, chained hash h)``. Everything the reuse report
needs that does not depend on LRU order is a group-by or a join over those rows, run
by polars' streaming engine (``collect(engine="streaming")``), so it never needs the
whole trace in memory:

* **first sight**: ``h -> min r``; an access is *seen* when its block was used by an
  earlier request. A request's prefix hit is its leading run of seen blocks (the
  ceilings, cold and steady, at the trace's block size and every coarser one, whose
  block ``j`` is the fine block ``j * f + f - 1``); content hashes the same way give
  the reuse that is not a prefix.
* **previous holder**: accesses sorted by ``(h, r)``; a hit's previous holder is the
  row before it. Hits are aggregated by ``(r, previous holder)`` pair (a few a
  request), which gives the sources (same session, same tenant, other tenant) and the
  reuse-time histogram.
* **working set**: distinct ``(window, h)`` pairs per window.
* **shared prefixes**: hits per block, its parent and depth at first sight.
* **breakdowns**: ceilings per tenant and per hour of the trace.

The figures are those of :func:`analyzer.reuse.analysis.analyze_reuse` (its compiled
one-pass scan is the oracle, ``tests/test_reuse_frame.py``), for traces whose chained
hashes name each block once per request (true of every trace kvpool writes).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import polars as pl

from analyzer.errors import InputError, Location
from analyzer.spill import new_dir

if TYPE_CHECKING:
    from analyzer.progress import Advance
    from analyzer.reuse.analysis import ReuseOptions, ReuseReport, TopPrefixes, TraceShape

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
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analyzer.trace import ADDED_IN_V1, SCHEMA_VERSION, check_metadata, read_metadata

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


def _collect(lf: pl.LazyFrame) -> pl.DataFrame:
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


def read_requests(lf: pl.LazyFrame) -> Requests:
    df = _collect(
        lf.select(
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
    )


def _accesses(lf: pl.LazyFrame, column: str = "block_hashes") -> pl.LazyFrame:
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


def _weight(k: pl.Expr, prompt: pl.Expr, block_size: int) -> pl.Expr:
    """Tokens block ``k`` is worth under the last-token rule (``stack._weight``)."""
    last = prompt - 1
    hi = pl.min_horizontal((k + 1) * block_size, last)
    lo = pl.min_horizontal(k * block_size, last)
    return pl.max_horizontal(hi - lo, pl.lit(0))


def _seen(acc: pl.LazyFrame) -> pl.LazyFrame:
    first = acc.group_by("h").agg(fr=pl.col("r").min())
    return acc.join(first, on="h").with_columns(seen=pl.col("fr") < pl.col("r"))


ROWS_PER_PART = 4_000_000


class Parts:
    """The accesses of one hash column, split by hash (``h mod P``) into ``P`` parts of
    about ``rows_per_part`` rows.

    Every figure keyed by a block (first sight, previous holder, distinct counts) is
    computed part by part and the parts' results are added, so the memory a query holds
    is one part's, whatever the size of the trace. With more than one part, the parts
    are spilled once to temporary Parquet files under ``tmp`` (one scan of the trace).
    """

    def __init__(
        self, lf: pl.LazyFrame, column: str, offsets: np.ndarray, rows_per_part: int, tmp: Path
    ) -> None:
        import pyarrow.parquet as pq

        self.n = max(1, -(-int(offsets[-1]) // max(rows_per_part, 1)))
        acc = _accesses(lf, column)
        if self.n == 1:
            self.frames = [acc]
            return
        d = tmp / column
        d.mkdir(parents=True, exist_ok=True)
        paths = [d / f"part-{p:05d}.parquet" for p in range(self.n)]
        writers: list[Any] = [None] * self.n
        try:
            for batch in access_slices(lf, column, offsets):
                part = batch.with_columns(_p=(pl.col("h") % self.n).cast(pl.Int64))
                for key, sub in part.partition_by("_p", as_dict=True).items():
                    p = int(key[0])
                    t = sub.drop("_p").to_arrow()
                    if writers[p] is None:
                        writers[p] = pq.ParquetWriter(paths[p], t.schema, compression="lz4")
                    writers[p].write_table(t)
        finally:
            for w in writers:
                if w is not None:
                    w.close()
        self.frames = [
            pl.scan_parquet(path) if w is not None else acc.clear()
            for path, w in zip(paths, writers, strict=True)
        ]

    def of(self, key: str) -> pl.Expr:
        """Rows whose ``key`` hash falls in the same part as the part's own hashes."""
        return pl.col(key) % self.n


def leading_runs(parts: Parts, req: Requests, factors: tuple[int, ...]) -> dict[int, np.ndarray]:
    """Per request, its leading run of blocks seen before, at each ``factor x`` block size
    (a coarse block ``j`` is the fine block ``j * f + f - 1``: same chained hash)."""
    k, seen = pl.col("k"), pl.col("seen")
    misses = [
        pl.when(~seen & ((k + 1) % f == 0)).then(k // f).otherwise(None).alias(f"m{f}")
        for f in factors
    ]
    big = np.iinfo(np.int64).max
    first_miss = {f: np.full(req.n, big, dtype=np.int64) for f in factors}
    for acc in parts.frames:
        per_req = _collect(_seen(acc).select("r", *misses).group_by("r").agg(pl.col("^m.*$").min()))
        r = per_req["r"].to_numpy()
        for f in factors:
            m = per_req[f"m{f}"]
            has = m.is_not_null().to_numpy()
            idx = r[has]
            first_miss[f][idx] = np.minimum(first_miss[f][idx], m.to_numpy()[has])
    return {
        f: np.where(first_miss[f] == big, req.n_blocks // f, first_miss[f]).astype(np.int64)
        for f in factors
    }


def run_tokens(run: np.ndarray, req: Requests, size: int) -> np.ndarray:
    """Prefix-hit tokens of leading runs of ``size``-token blocks (last-token rule)."""
    hit: np.ndarray = np.clip(np.minimum(run * size, req.prompt_tokens - 1), 0, None)
    return hit.astype(np.int64)


def content_seen_tokens(parts: Parts, req: Requests, block_size: int) -> np.ndarray:
    """Per request, tokens of blocks whose content an earlier request held (any position)."""
    reqs = pl.LazyFrame({"r": np.arange(req.n, dtype=np.int64), "prompt": req.prompt_tokens})
    w = _weight(pl.col("k"), pl.col("prompt"), block_size)
    out = np.zeros(req.n, dtype=np.int64)
    for acc in parts.frames:
        per_req = _collect(
            _seen(acc)
            .filter(pl.col("seen"))
            .join(reqs, on="r")
            .select("r", w=w)
            .group_by("r")
            .agg(pl.col("w").sum())
        )
        np.add.at(out, per_req["r"].to_numpy(), per_req["w"].to_numpy().astype(np.int64))
    return out


@dataclass(frozen=True)
class HitFacts:
    """What the reuse report needs of the counted prefix hits, from set operations."""

    source_tokens: np.ndarray  # int64 (4,): same session, same tenant, other, unknown
    time_count: np.ndarray  # int64 (len(time_edges) + 1,): hit accesses per reuse-time bin
    working_set: np.ndarray  # int64 (n_windows,): distinct blocks per window
    first_pos: np.ndarray  # sorted: each distinct block's first access (its dense id's rank)
    top: pl.DataFrame  # shared-prefix candidates (see top_prefix_rows)

    @property
    def n_distinct(self) -> int:
        return int(self.first_pos.size)


def hit_facts(
    parts: Parts,
    req: Requests,
    run: np.ndarray,
    block_size: int,
    first: int,
    window_s: float,
    n_windows: int,
    time_edges: np.ndarray,
    top_n: int,
    tmp: Path,
) -> HitFacts:
    """Sources, reuse times, working set and shared prefixes of the counted prefix hits."""
    n = req.n
    t0 = float(req.arrival_s[0]) if n else 0.0
    if window_s > 0:
        win = ((req.arrival_s - t0) / window_s).astype(np.int64)
        win = np.minimum(np.maximum(win, 0), n_windows - 1)
    else:
        win = np.zeros(n, dtype=np.int64)
    reqs = pl.LazyFrame(
        {"r": np.arange(n, dtype=np.int64), "run": run, "prompt": req.prompt_tokens, "win": win}
    )
    working_set = np.zeros(max(n_windows, 1), dtype=np.int64)
    time_count = np.zeros(time_edges.size + 1, dtype=np.int64)
    source_tokens = np.zeros(4, dtype=np.int64)
    first_pos: list[np.ndarray] = []
    hit_blocks: list[pl.LazyFrame] = []
    hit = (pl.col("k") < pl.col("run")) & (pl.col("r") >= first)
    w = _weight(pl.col("k"), pl.col("prompt"), block_size)
    for p, part in enumerate(parts.frames):
        acc = part.join(reqs, on="r")
        ws = _collect(acc.select("win", "h").unique().group_by("win").len())
        np.add.at(working_set, ws["win"].to_numpy(), ws["len"].to_numpy().astype(np.int64))
        # previous holder: the row before in (hash, position) order
        ordered = acc.select("h", "pos", "r", "k", "prompt", "run").sort("h", "pos")
        same = pl.col("h") == pl.col("h").shift(1)
        prev = pl.when(same).then(pl.col("r").shift(1)).otherwise(None)
        pairs = _collect(
            ordered.with_columns(prev=prev)
            .filter(hit)
            .select("r", "prev", w=w)
            .group_by("r", "prev")
            .agg(n=pl.len(), w=pl.col("w").sum())
        )
        _add_pairs(pairs, req, time_edges, time_count, source_tokens)
        firsts = acc.group_by("h").agg(pl.col("pos").min())
        fp = _collect(firsts.select("pos"))["pos"].to_numpy().astype(np.int64)
        first_pos.append(fp)
        if top_n:
            at_first = firsts.join(acc.select("pos", "k", "ph"), on="pos")
            hits = acc.filter(hit).group_by("h").agg(hits=pl.len())
            blocks = at_first.join(hits, on="h").select(
                "h", "ph", "k", "pos", pl.col("hits").cast(pl.Int64)
            )
            if parts.n == 1:
                hit_blocks.append(_collect(blocks).lazy())
            else:
                path = tmp / f"hit-blocks-{p:05d}.parquet"
                blocks.sink_parquet(path, engine=STREAMING)
                hit_blocks.append(pl.scan_parquet(path))
    all_first = np.sort(np.concatenate(first_pos)) if first_pos else np.zeros(0, np.int64)
    top = top_prefix_rows(hit_blocks, parts, top_n, all_first)
    return HitFacts(source_tokens, time_count, working_set, all_first, top)


def _add_pairs(
    pairs: pl.DataFrame,
    req: Requests,
    time_edges: np.ndarray,
    time_count: np.ndarray,
    source_tokens: np.ndarray,
) -> None:
    """Add hits grouped by (request, previous holder) to the time and source counts."""
    r = pairs["r"].to_numpy()
    p = pairs["prev"].to_numpy()
    counts = pairs["n"].to_numpy().astype(np.int64)
    weights = pairs["w"].to_numpy().astype(np.int64)
    dt = req.arrival_s[r] - req.arrival_s[p]
    bins = np.searchsorted(time_edges, dt, side="right")
    np.add.at(time_count, bins, counts)
    s, t = req.session, req.tenant
    cls = np.full(r.size, 3, dtype=np.int64)
    cls[(t[r] >= 0) & (t[p] >= 0)] = 2
    cls[(t[r] >= 0) & (t[r] == t[p])] = 1
    cls[(s[r] >= 0) & (s[r] == s[p])] = 0
    np.add.at(source_tokens, cls, weights)


def top_prefix_rows(
    hit_blocks: list[pl.LazyFrame], parts: Parts, top_n: int, all_first: np.ndarray
) -> pl.DataFrame:
    """The ``top_n`` shared-prefix candidates by volume and by count.

    Block ``b`` stands for the prefix ending at it (depth ``k`` at first sight); it is a
    candidate when counted requests hit it and none of its children (blocks whose parent
    at first sight is ``b``) was hit by as many. A block's children may sit in any part:
    each part's candidates are checked against the children from every part whose
    parent hash falls in it. Dense ids are ranks of first accesses (``all_first``).
    """
    if top_n == 0 or not hit_blocks:
        return pl.DataFrame()
    everything = pl.concat(hit_blocks)
    chosen = []
    for p, blocks in enumerate(hit_blocks):
        children = (
            everything.filter(pl.col("ph").is_not_null() & (parts.of("ph") == p))
            .group_by("ph")
            .agg(max_child=pl.col("hits").max())
        )
        cand = (
            blocks.join(children, left_on="h", right_on="ph", how="left")
            .filter(pl.col("max_child").fill_null(0) < pl.col("hits"))
            .select("h", "pos", "hits", blocks=pl.col("k") + 1)
            .with_columns(volume=pl.col("hits") * pl.col("blocks"))
        )
        chosen.append(_collect(_tops(cand, top_n, "pos")))
    best = _tops(pl.concat(chosen).drop("order").unique().lazy(), top_n, "pos")
    out = _collect(best)
    ids = np.searchsorted(all_first, out["pos"].to_numpy().astype(np.int64))
    return out.with_columns(id=pl.Series(ids.astype(np.int64)))


def _tops(cand: pl.LazyFrame, top_n: int, tie: str) -> pl.LazyFrame:
    """The first ``top_n`` by volume and by count (ties: earlier first access first)."""
    base = cand.select("h", "pos", "hits", "blocks", "volume")
    by_volume = base.sort("volume", "hits", tie, descending=[True, True, False]).head(top_n)
    by_count = base.sort("hits", "blocks", tie, descending=[True, True, False]).head(top_n)
    return pl.concat(
        [
            by_volume.with_columns(order=pl.lit("by_volume")),
            by_count.with_columns(order=pl.lit("by_count")),
        ]
    )


def dense_ids(parts: Parts, all_first: np.ndarray, n_accesses: int) -> np.ndarray:
    """Every access's dense block id (rank of its block's first access), in access order."""
    ids = np.empty(n_accesses, dtype=np.int64)
    for acc in parts.frames:
        firsts = acc.group_by("h").agg(first=pl.col("pos").min())
        df = _collect(acc.select("pos", "h").join(firsts, on="h").select("pos", "first"))
        pos = df["pos"].to_numpy().astype(np.int64)
        ids[pos] = np.searchsorted(all_first, df["first"].to_numpy().astype(np.int64))
    return ids


@dataclass(frozen=True)
class Sample:
    """A SHARDS spatial sample of the accesses, taken while scanning."""

    ids: np.ndarray  # int32 (int64 past 2**31 slots) per kept access: slot among the kept
    # blocks (first-seen order)
    offsets: np.ndarray  # int64 (n + 1,): each request's kept accesses
    weights: np.ndarray  # int32 per kept access: tokens (last-token rule)
    id_weight: np.ndarray  # int64 per slot: unit (kept at rate 1) or 2**32
    unit: int
    kept_accesses: int


SLICE_ROWS = 1 << 22


def access_slices(
    lf: pl.LazyFrame, column: str, offsets: np.ndarray, rows: int | None = None
) -> Iterator[pl.DataFrame]:
    """:func:`_accesses` of ``lf`` (``pos`` and ``r`` as over the whole trace), the
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
        df = _collect(_accesses(lf.slice(start, end - start), column))
        yield df.with_columns(
            (pl.col("r") + start).cast(df.schema["r"]), (pl.col("pos") + pos).cast(df.schema["pos"])
        )
        start, pos = end, pos + df.height


def hot_blocks(parts: Parts, n_hot: int) -> np.ndarray:
    """Hashes of the blocks used more often than the ``n_hot``-th most used (sorted).

    The global top ``n_hot`` is within the union of each part's top ``n_hot``."""
    if n_hot <= 0:
        return np.zeros(0, dtype=np.uint64)
    tops = [_collect(acc.group_by("h").len().top_k(n_hot, by="len")) for acc in parts.frames]
    union = pl.concat(tops)
    cut = int(union["len"].top_k(n_hot).min())  # type: ignore[arg-type]
    hot = union.filter(pl.col("len") > cut)["h"].to_numpy().astype(np.uint64)
    return np.sort(hot)


def shards_sample(
    lf: pl.LazyFrame, parts: Parts, req: Requests, block_size: int, rate: float, n_ids: int
) -> Sample:
    """Stratified SHARDS sample (``analysis._sample``) taken in one scan of the accesses.

    A block is kept when ``splitmix64(hash) >> 32 < rate x 2**32``, or when it is one of
    the ``rate x distinct`` most-used blocks (kept at rate 1, found by group-bys); only
    kept accesses are held, so memory is the sample's, not the trace's.
    """
    from analyzer.cache.stack import splitmix64
    from analyzer.reuse.analysis import _shards_rate, _shards_threshold

    unit = _shards_threshold(rate)
    n_hot = int(_shards_rate(rate) * n_ids)
    hot = hot_blocks(parts, n_hot) if 0 < n_hot < n_ids else np.zeros(0, dtype=np.uint64)
    # Only what the sample needs is held per kept access: its slot and its weight (the
    # accesses come request by request, so the offsets are counts); the slots are
    # numbered slice by slice as the scan hands them over (analyzer/dense.py), so the
    # kept hashes are never held. Hot blocks are kept at rate 1, so the kept accesses
    # are a good part of a chat log's: at 1M requests this held 2.9 GB with the
    # requests, positions and a sort.
    from analyzer.dense import FirstSeen

    numbering = FirstSeen()
    slots: list[np.ndarray] = []
    ws: list[np.ndarray] = []
    counts = np.zeros(req.n, dtype=np.int64)
    last_token = req.prompt_tokens - 1
    for batch in access_slices(lf, "block_hashes", req.offsets):
        h = batch["h"].to_numpy().astype(np.uint64)
        keep = (splitmix64(h) >> np.uint64(32)) < np.uint64(unit)
        if hot.size:
            keep |= np.isin(h, hot)
        if not keep.any():
            continue
        r = batch["r"].to_numpy()[keep]
        k = batch["k"].to_numpy()[keep].astype(np.int64)
        last = last_token[r]
        w = np.minimum((k + 1) * block_size, last) - np.minimum(k * block_size, last)
        slot = numbering.number(np.ascontiguousarray(h[keep]))
        # 4 bytes a kept access while the slots fit (np.concatenate widens a later int64)
        slots.append(slot.astype(np.int32) if numbering.distinct <= 2**31 - 1 else slot)
        ws.append(np.maximum(w, 0).astype(np.int32))
        counts += np.bincount(r, minlength=req.n)
    offsets = np.zeros(req.n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = _drain(slots, np.int32)
    weights = _drain(ws, np.int32)
    seen = numbering.hashes()  # slot -> hash, slots in order of first appearance
    is_hot = np.isin(seen, hot) if hot.size else np.zeros(seen.size, dtype=bool)
    id_weight = np.where(is_hot, np.int64(unit), np.int64(2**32)).astype(np.int64)
    return Sample(ids, offsets, weights, id_weight, unit, int(ids.size))


def _drain(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    """``np.concatenate(parts)``, emptying ``parts`` as it copies them: the peak is the
    result and one part, not the result and all the parts."""
    out = np.empty(sum(p.size for p in parts), dtype=np.result_type(dtype, *parts))
    at = 0
    parts.reverse()
    while parts:
        p = parts.pop()
        out[at : at + p.size] = p
        at += p.size
    return out


def breakdown_rows(keyed: pl.LazyFrame) -> list[dict[str, Any]]:
    """Group-by ``key`` of (prompt, hit) rows: the rows of ``analysis.breakdown_rows``."""
    df = _collect(
        keyed.group_by("key")
        .agg(
            requests=pl.len(),
            prompt_tokens=pl.col("prompt").sum(),
            hit_tokens=pl.col("hit").sum(),
        )
        .sort("key")
    )
    return [
        {
            "key": int(row["key"]),
            "requests": int(row["requests"]),
            "prompt_tokens": int(row["prompt_tokens"]),
            "hit_tokens": int(row["hit_tokens"]),
            "hit_rate": int(row["hit_tokens"]) / int(row["prompt_tokens"])
            if row["prompt_tokens"]
            else 0.0,
        }
        for row in df.iter_rows(named=True)
    ]


def breakdowns(req: Requests, hit: np.ndarray, first: int) -> dict[str, Any]:
    """Steady-state ceilings per tenant and per hour, as polars group-bys."""
    from analyzer.reuse.analysis import breakdown_document

    if req.n == 0:
        return {}
    rows = pl.LazyFrame(
        {
            "tenant": req.tenant.astype(np.int64),
            "t": req.arrival_s,
            "prompt": req.prompt_tokens,
            "hit": hit,
        }
    ).slice(first)
    t0 = float(req.arrival_s[0])
    hour = ((pl.col("t") - t0) // 3600).cast(pl.Int64)
    return breakdown_document(
        breakdown_rows(rows.select(pl.col("tenant").alias("key"), "prompt", "hit")),
        breakdown_rows(rows.select(hour.alias("key"), "prompt", "hit")),
    )


def _check_rows(req: Requests, block_size: int, where: str) -> None:
    """The row invariants ``trace.check_invariants`` checks that this path relies on."""
    from analyzer import limits

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
    t = _collect(lf.select("arrival_s"))["arrival_s"].to_numpy()
    return bool(t.size < 2 or not np.any(t[1:] < t[:-1]))


def analyze_canonical(
    source: str | Path,
    opts: ReuseOptions | None = None,
    advance: Advance | None = None,
    rows_per_part: int = ROWS_PER_PART,
    isolation: str = "shared",
) -> ReuseReport:
    """:func:`analysis.analyze_reuse` of a canonical file or dataset, streaming.

    The set-operation figures come from polars queries (module docstring); the LRU curve
    from the compiled one-pass scan over dense block ids, or, above
    ``opts.shards_threshold_accesses`` accesses (or with ``opts.shards_rate``), over a
    SHARDS sample taken while scanning, so only the sample is held. Above
    ``rows_per_part`` block accesses the block-keyed queries run on hash parts of that
    size (:class:`Parts`), spilled to a temporary directory. A file whose rows are not in
    arrival order is read whole and sorted (:func:`analysis.analyze_reuse`).
    ``isolation`` keys every block by its request's salt group first
    (:func:`analyzer.reuse.isolation.isolate_frame`).
    """
    from analyzer.reuse import analysis as a
    from analyzer.reuse.isolation import isolate, isolate_frame
    from analyzer.trace import BlockTrace

    opts = opts or a.ReuseOptions()
    step = advance or (lambda _n: None)
    lf, meta = scan_trace(source)
    lf = isolate_frame(lf, isolation)
    bs = int(meta.get("block_size") or 16)
    req = read_requests(lf)
    _check_rows(req, bs, str(source))
    t = req.arrival_s
    if t.size > 1 and bool(np.any(t[1:] < t[:-1])):
        files = canonical_files(source)
        import pyarrow as pa

        from analyzer.trace import read_canonical

        table = pa.concat_tables([read_canonical(f) for f in files], promote_options="default")
        return a.analyze_reuse(isolate(BlockTrace.from_table(table), isolation), opts, advance)
    n = req.n
    n_acc = int(req.n_blocks.sum())

    def unmeasurable(reason: str) -> a.ReuseReport:
        n_blocks = n_distinct_blocks(lf) if n_acc else 0
        return a.make_report(opts, _shape(bs, req, n_blocks), reason=reason)

    if req.count_only:
        return unmeasurable(
            "this trace has token counts only (no prompt content or block hashes), so "
            "prefix reuse cannot be measured from it; use logs with prompts or block hashes"
        )
    if n == 0:
        return unmeasurable("the trace has no requests")
    tmp = new_dir("reuse")
    try:
        return _measure(lf, meta, req, opts, step, tmp, rows_per_part)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _shape(block_size: int, req: Requests, n_blocks: int) -> TraceShape:
    from analyzer.reuse.analysis import TraceShape

    return TraceShape(
        block_size=block_size,
        n_requests=req.n,
        n_accesses=int(req.n_blocks.sum()),
        n_blocks=n_blocks,
        all_prompt_tokens=int(req.prompt_tokens.sum()),
    )


def _measure(
    lf: pl.LazyFrame,
    meta: dict[str, str],
    req: Requests,
    opts: ReuseOptions,
    step: Advance,
    tmp: Path,
    rows_per_part: int,
) -> ReuseReport:
    """The measurable case of :func:`analyze_canonical`."""
    from analyzer.cache.stack import reuse_scan, sampled_histogram_sparse
    from analyzer.reuse import analysis as a
    from analyzer.trace import BlockTrace

    bs = int(meta.get("block_size") or 16)
    n, t, prompt = req.n, req.arrival_s, req.prompt_tokens
    first = a.first_counted_request(n, opts.warmup)
    n_acc = int(req.n_blocks.sum())
    parts = Parts(lf, "block_hashes", req.offsets, rows_per_part, tmp)
    span = float(t[-1] - t[0])
    n_windows = max(1, opts.n_windows) if span > 0 else 1
    window_s = span / n_windows if span > 0 else 0.0

    factors = tuple(sorted({1} | {g // bs for g in opts.granularities if g % bs == 0}))
    runs = leading_runs(parts, req, factors)
    hit_per_req = run_tokens(runs[1], req, bs)
    steady, cold = a._rates(hit_per_req, prompt, first)
    den = int(prompt[first:].sum())
    granularity = a.granularity_document(
        prompt,
        req.token_lcp_prev,
        first,
        opts.granularities,
        bs,
        lambda f: run_tokens(runs[f], req, bs * f),
    )
    if req.content_ok:
        non_prefix = a.non_prefix_document(
            content_seen_tokens(
                Parts(lf, "content_hashes", req.offsets, rows_per_part, tmp), req, bs
            ),
            prompt,
            first,
            hit_per_req,
        )
    else:
        non_prefix = a.NO_CONTENT
    step(15)
    facts = hit_facts(
        parts, req, runs[1], bs, first, window_s, n_windows, a.TIME_EDGES, opts.top_n, tmp
    )
    step(15)

    rate = opts.shards_rate
    if rate is None and n_acc > opts.shards_threshold_accesses:
        rate = opts.shards_auto_rate
    sampled = rate is not None and rate < 1.0
    trace: BlockTrace | None = None

    def dense_trace() -> BlockTrace:
        return BlockTrace(
            block_size=bs,
            arrival_s=t,
            prompt_tokens=prompt,
            output_tokens=np.full(n, -1, dtype=np.int64),
            session=req.session,
            tenant=req.tenant,
            offsets=req.offsets,
            block_ids=dense_ids(parts, facts.first_pos, n_acc),
            block_hashes=np.zeros(facts.n_distinct, dtype=np.uint64),  # not used here
            request_ids=[],
            session_names=[],
            tenant_names=[],
        )

    shards = None
    dist_count = None
    cold_curve = None
    if sampled:
        assert rate is not None
        sample = shards_sample(lf, parts, req, bs, rate, facts.n_distinct)
        hist = sampled_histogram_sparse(
            sample.ids,
            sample.offsets,
            sample.weights,
            sample.id_weight,
            sample.unit,
            first,
            max(facts.n_distinct, 1),
        )
        counted_all = int(run_tokens(req.n_blocks, req, bs)[first:].sum())
        curve = _sampled_curve(hist, counted_all, den)
        shards = {
            "rate": rate,
            "sampled_by": "splitmix64 of the chained block hash",
            **prefix_shards_error(lf, meta, req, rate, opts),
        }
        curve_method = "shards"
    else:
        trace = dense_trace()
        scan = reuse_scan(
            trace.block_ids,
            trace.offsets,
            prompt,
            t,
            req.session,
            req.tenant,
            bs,
            first,
            facts.n_distinct,
            window_s,
            n_windows,
            a.TIME_EDGES,
            True,
        )
        hist_all, hist_cnt, dist_count = scan[0], scan[1], scan[2]
        curve = a.exact_curve(hist_cnt, den)
        cold_curve = a.exact_curve(hist_all, int(prompt.sum()))
        curve_method = "exact"
    step(20)
    sim = [p for p in opts.policies if p != "lru"]
    if trace is None and sim and n_acc <= opts.policy_max_accesses:
        trace = dense_trace()
    capacities, policy_points, notes = a._policies(
        trace, n_acc, bs, opts, curve, first, den, lambda x: step(x * 0.75)
    )
    sources, reuse_distance, reuse_time, working_set = a._summaries(
        facts.source_tokens,
        den,
        bool((req.session >= 0).any()),
        bool((req.tenant >= 0).any()),
        curve if sampled else None,
        dist_count,
        facts.time_count,
        float(t[0]),
        window_s,
        facts.working_set,
        facts.n_distinct,
        bs,
    )
    return a.make_report(
        opts,
        _shape(bs, req, facts.n_distinct),
        prompt_tokens=den,
        hit_tokens=int(hit_per_req[first:].sum()),
        ceiling_hit_rate=steady,
        cold_ceiling_hit_rate=cold,
        curve=curve,
        cold_curve=cold_curve,
        curve_method=curve_method,
        shards=shards,
        policy_points=policy_points,
        policy_notes=notes,
        capacities_tokens=capacities,
        sources=sources,
        top_prefixes=top_prefixes_document(facts, bs, opts.top_n),
        granularity=granularity,
        non_prefix=non_prefix,
        reuse_distance=reuse_distance,
        reuse_time=reuse_time,
        working_set=working_set,
        breakdowns=breakdowns(req, hit_per_req, first),
    )


def n_distinct_blocks(lf: pl.LazyFrame) -> int:
    return int(_collect(_accesses(lf).select(pl.col("h").n_unique()))[0, 0])


def _sampled_curve(hist: np.ndarray, counted_all: int, den: int) -> Any:
    """The tail of ``analysis.shards_curve``: SHARDS-adj correction, step curve."""
    from analyzer.reuse.analysis import StepCurve

    empty = StepCurve(np.zeros(0, dtype=np.int64), np.zeros(0))
    if counted_all == 0 or den == 0:
        return empty
    body = hist[:-1].copy()
    body[0] += counted_all - float(hist.sum())
    d = np.flatnonzero(body)
    if d.size == 0:
        return empty
    rates = np.clip(np.cumsum(body[d]) / den, 0.0, None)
    return StepCurve((d + 1).astype(np.int64), np.maximum.accumulate(rates))


def prefix_shards_error(
    lf: pl.LazyFrame, meta: dict[str, str], req: Requests, rate: float, opts: Any
) -> dict[str, Any]:
    """``analysis.shards_error`` on the requests within ``opts.shards_error_accesses``
    (read alone: exact and sampled curves of that prefix, compared)."""
    from analyzer.reuse.analysis import shards_error
    from analyzer.trace import BlockTrace

    n_req = int(np.searchsorted(req.offsets, opts.shards_error_accesses, side="right")) - 1
    n_req = min(max(n_req, 0), req.n)
    table = _collect(lf.head(n_req)).to_arrow()
    table = table.replace_schema_metadata({f"kvpool.{k}": v for k, v in meta.items()})
    trace = BlockTrace.from_table(table)
    return shards_error(trace, rate, opts.warmup, opts.shards_error_accesses)


def top_prefixes_document(facts: HitFacts, block_size: int, top_n: int) -> TopPrefixes:
    """The top shared prefixes from :func:`top_prefix_rows`."""
    from analyzer.reuse.analysis import (
        NO_TOP_PREFIXES,
        TOP_PREFIXES_NOTE,
        SharedPrefix,
        TopPrefixes,
    )

    if int(facts.time_count.sum()) == 0:
        return NO_TOP_PREFIXES

    def entries(order: str) -> tuple[SharedPrefix, ...]:
        if facts.top.height == 0:
            return ()
        rows = facts.top.filter(pl.col("order") == order)
        return tuple(
            SharedPrefix(
                block_id=int(r["id"]),
                hash_hex=f"{int(r['h']):016x}",
                prefix_blocks=int(r["blocks"]),
                prefix_tokens=int(r["blocks"]) * block_size,
                requests=int(r["hits"]),
                reused_tokens=int(r["hits"]) * int(r["blocks"]) * block_size,
                preview=None,
            )
            for r in rows.iter_rows(named=True)
        )

    return TopPrefixes(entries("by_volume"), entries("by_count"), TOP_PREFIXES_NOTE)
