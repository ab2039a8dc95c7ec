"""The reuse questions keyed by block, as polars queries over hash parts of a canonical
trace's block accesses (:func:`analyzer.reuse.frame.accesses`).

Everything that does not depend on LRU order is a group-by or a join over the access
rows ``(pos, r, k, h, ph)``:

* **first sight**: ``h -> min r``; an access is *seen* when its block was used by an
  earlier request. A request's prefix hit is its leading run of seen blocks, at the
  trace's block size and every coarser one, whose block ``j`` is the fine block
  ``j * f + f - 1``; content hashes the same way give the reuse that is not a prefix.
* **previous holder**: accesses sorted by ``(h, pos)``; a hit's previous holder is the
  row before it. Hits are aggregated by ``(r, previous holder)`` pair (a few a
  request), which gives the sources (same session, same tenant, other tenant) and the
  reuse-time histogram.
* **working set**: distinct ``(window, h)`` pairs per window.
* **shared prefixes**: hits per block, its parent and depth at first sight.
* **dense ids and the SHARDS sample**, for the compiled LRU passes.

The accesses are split by hash (``h mod P``, :class:`Parts`) so that the memory a query
holds is one part's, whatever the size of the trace; this holds for traces whose
chained hashes name each block once per request (true of every trace kvpool writes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from analyzer.dense import FirstSeen
from analyzer.reuse.curves import ShardsSampling
from analyzer.reuse.frame import (
    STREAMING,
    Requests,
    access_slices,
    accesses,
    collect,
    token_weight,
)

ROWS_PER_PART = 4_000_000


class Parts:
    """The accesses of one hash column, split by hash (``h mod P``) into ``P`` parts of
    about ``rows_per_part`` rows.

    Every figure keyed by a block (first sight, previous holder, distinct counts) is
    computed part by part and the parts' results are added. With more than one part, the
    parts are spilled once to temporary Parquet files under ``tmp`` (one scan of the
    trace).
    """

    def __init__(
        self, lf: pl.LazyFrame, column: str, offsets: np.ndarray, rows_per_part: int, tmp: Path
    ) -> None:
        self.n = max(1, -(-int(offsets[-1]) // max(rows_per_part, 1)))
        acc = accesses(lf, column)
        if self.n == 1:
            self.frames = [acc]
            return
        d = tmp / column
        d.mkdir(parents=True, exist_ok=True)
        paths = [d / f"part-{p:05d}.parquet" for p in range(self.n)]
        writers: list[pq.ParquetWriter | None] = [None] * self.n
        try:
            for batch in access_slices(lf, column, offsets):
                part = batch.with_columns(_p=(pl.col("h") % self.n).cast(pl.Int64))
                for key, sub in part.partition_by("_p", as_dict=True).items():
                    p = int(key[0])
                    t = sub.drop("_p").to_arrow()
                    writer = writers[p]
                    if writer is None:
                        writer = writers[p] = pq.ParquetWriter(
                            paths[p], t.schema, compression="lz4"
                        )
                    writer.write_table(t)
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


def _seen(acc: pl.LazyFrame) -> pl.LazyFrame:
    first = acc.group_by("h").agg(fr=pl.col("r").min())
    return acc.join(first, on="h").with_columns(seen=pl.col("fr") < pl.col("r"))


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
        per_req = collect(_seen(acc).select("r", *misses).group_by("r").agg(pl.col("^m.*$").min()))
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
    w = token_weight(pl.col("k"), pl.col("prompt"), block_size)
    out = np.zeros(req.n, dtype=np.int64)
    for acc in parts.frames:
        per_req = collect(
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
    w = token_weight(pl.col("k"), pl.col("prompt"), block_size)
    for p, part in enumerate(parts.frames):
        acc = part.join(reqs, on="r")
        ws = collect(acc.select("win", "h").unique().group_by("win").len())
        np.add.at(working_set, ws["win"].to_numpy(), ws["len"].to_numpy().astype(np.int64))
        # previous holder: the row before in (hash, position) order
        ordered = acc.select("h", "pos", "r", "k", "prompt", "run").sort("h", "pos")
        same = pl.col("h") == pl.col("h").shift(1)
        prev = pl.when(same).then(pl.col("r").shift(1)).otherwise(None)
        pairs = collect(
            ordered.with_columns(prev=prev)
            .filter(hit)
            .select("r", "prev", w=w)
            .group_by("r", "prev")
            .agg(n=pl.len(), w=pl.col("w").sum())
        )
        _add_pairs(pairs, req, time_edges, time_count, source_tokens)
        firsts = acc.group_by("h").agg(pl.col("pos").min())
        fp = collect(firsts.select("pos"))["pos"].to_numpy().astype(np.int64)
        first_pos.append(fp)
        if top_n:
            at_first = firsts.join(acc.select("pos", "k", "ph"), on="pos")
            hits = acc.filter(hit).group_by("h").agg(hits=pl.len())
            blocks = at_first.join(hits, on="h").select(
                "h", "ph", "k", "pos", pl.col("hits").cast(pl.Int64)
            )
            if parts.n == 1:
                hit_blocks.append(collect(blocks).lazy())
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


TOP_COLUMNS = {
    "h": pl.UInt64,
    "pos": pl.Int64,
    "hits": pl.Int64,
    "blocks": pl.Int64,
    "id": pl.Int64,
}


def top_prefix_rows(
    hit_blocks: list[pl.LazyFrame], parts: Parts, top_n: int, all_first: np.ndarray
) -> pl.DataFrame:
    """Shared-prefix candidates, among them the ``top_n`` by volume and by count
    (:func:`analyzer.reuse.hit_stats.top_prefixes` ranks them).

    Block ``b`` stands for the prefix ending at it (depth ``k`` at first sight); it is a
    candidate when counted requests hit it and none of its children (blocks whose parent
    at first sight is ``b``) was hit by as many. A block's children may sit in any part:
    each part's candidates are checked against the children from every part whose
    parent hash falls in it, and each part keeps its own ``top_n`` by volume and by
    count. Dense ids (``id``) are ranks of first accesses (``all_first``).
    """
    if top_n == 0 or not hit_blocks:
        return pl.DataFrame(schema=TOP_COLUMNS)
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
        chosen.append(collect(_tops(cand, top_n)))
    out = pl.concat(chosen).select("h", "pos", "hits", "blocks").unique().sort("pos")
    ids = np.searchsorted(all_first, out["pos"].to_numpy().astype(np.int64))
    return out.with_columns(id=pl.Series(ids.astype(np.int64)))


def _tops(cand: pl.LazyFrame, top_n: int) -> pl.LazyFrame:
    """The first ``top_n`` by volume and by count (ties: earlier first access first)."""
    base = cand.select("h", "pos", "hits", "blocks", "volume")
    by_volume = base.sort("volume", "hits", "pos", descending=[True, True, False]).head(top_n)
    by_count = base.sort("hits", "blocks", "pos", descending=[True, True, False]).head(top_n)
    return pl.concat([by_volume, by_count])


def dense_ids(parts: Parts, all_first: np.ndarray, n_accesses: int) -> np.ndarray:
    """Every access's dense block id (rank of its block's first access), in access order."""
    ids = np.empty(n_accesses, dtype=np.int64)
    for acc in parts.frames:
        firsts = acc.group_by("h").agg(first=pl.col("pos").min())
        df = collect(acc.select("pos", "h").join(firsts, on="h").select("pos", "first"))
        pos = df["pos"].to_numpy().astype(np.int64)
        ids[pos] = np.searchsorted(all_first, df["first"].to_numpy().astype(np.int64))
    return ids


# -- the SHARDS sample ----------------------------------------------------------------


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


def hot_blocks(parts: Parts, n_hot: int) -> np.ndarray:
    """Hashes of the blocks used more often than the ``n_hot``-th most used (sorted).

    The global top ``n_hot`` is within the union of each part's top ``n_hot``."""
    if n_hot <= 0:
        return np.zeros(0, dtype=np.uint64)
    tops = [collect(acc.group_by("h").len().top_k(n_hot, by="len")) for acc in parts.frames]
    union = pl.concat(tops)
    cut = int(union["len"].top_k(n_hot).min())  # type: ignore[arg-type]
    hot = union.filter(pl.col("len") > cut)["h"].to_numpy().astype(np.uint64)
    return np.sort(hot)


def shards_sample(
    lf: pl.LazyFrame, parts: Parts, req: Requests, block_size: int, rate: float, n_ids: int
) -> Sample:
    """The stratified SHARDS sample of :class:`~analyzer.reuse.curves.ShardsSampling`,
    taken in one scan of the accesses; the most used blocks are found by group-bys, and
    only kept accesses are held, so memory is the sample's, not the trace's.
    """
    sampling = ShardsSampling(rate)
    unit = sampling.unit
    hot = hot_blocks(parts, sampling.hot_count(n_ids))
    # Only what the sample needs is held per kept access: its slot and its weight (the
    # accesses come request by request, so the offsets are counts); the slots are
    # numbered slice by slice as the scan hands them over (analyzer/dense.py), so the
    # kept hashes are never held. Hot blocks are kept at rate 1, so the kept accesses
    # are a good part of a chat log's: at 1M requests this held 2.9 GB with the
    # requests, positions and a sort.
    numbering = FirstSeen()
    slots: list[np.ndarray] = []
    ws: list[np.ndarray] = []
    counts = np.zeros(req.n, dtype=np.int64)
    last_token = req.prompt_tokens - 1
    for batch in access_slices(lf, "block_hashes", req.offsets):
        h = batch["h"].to_numpy().astype(np.uint64)
        keep = sampling.keeps(h)
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
    return Sample(ids, offsets, weights, sampling.id_weight(is_hot), unit, int(ids.size))


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
