"""Reuse measured on a :class:`~analyzer.trace.BlockTrace` held in memory.

:func:`analyze_reuse` turns a trace into a :class:`~analyzer.reuse.result.ReuseReport`
(what is in it: :mod:`analyzer.reuse.records`). The trace is read here, through
:class:`TraceInput`: one compiled pass over its dense block ids
(:func:`analyzer.cache.stack.reuse_scan`) gives the counted hits, the prefix hits at the
trace's block size and the exact LRU stack distances; coarser block sizes, content seen
before and the SHARDS sample are vectorised numpy over the same arrays. The figures
themselves are computed once for both ways of reading a trace
(:func:`analyzer.reuse.assemble.measure`; the other way is the lazy frame of
:mod:`analyzer.reuse.streamed`).

Every rate is hit tokens / prompt tokens of the counted requests; a hit never covers
a request's last prompt token. Capacities are whole blocks (``capacity_tokens //
block_size``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.cache.stack import (
    access_weights,
    lru_histogram,
    reuse_scan,
    sampled_histogram,
)
from analyzer.progress import Advance
from analyzer.reuse.assemble import measure
from analyzer.reuse.ceilings import non_prefix_figures
from analyzer.reuse.curves import (
    ShardsSampling,
    curve_error,
    exact_curve,
    hot_by_uses,
    shards_adjusted_curve,
)
from analyzer.reuse.facts import (
    CountedHits,
    LruHistograms,
    PrefixCandidates,
    PrefixHolders,
    RequestColumns,
    SampledHistogram,
    ScanPlan,
    prefix_holders,
)
from analyzer.reuse.records import (
    EMPTY_CURVE,
    TIME_EDGES,
    NonPrefixReuse,
    ReuseOptions,
    ShardsCheck,
    StepCurve,
    first_counted_request,
)
from analyzer.reuse.result import ReuseReport, TraceShape
from analyzer.trace import BlockTrace

__all__ = [
    "ReuseOptions",
    "TraceInput",
    "analyze_reuse",
    "content_seen_tokens",
    "first_counted_request",
    "non_prefix_reuse",
    "prefix_hit_tokens",
    "shards_curve",
    "shards_error",
]


def analyze_reuse(
    trace: BlockTrace, opts: ReuseOptions | None = None, advance: Advance | None = None
) -> ReuseReport:
    """Full reuse report; ``advance`` receives percentage points (100 in all)."""
    return measure(TraceInput(trace), opts or ReuseOptions(), advance)


@dataclass(frozen=True, slots=True)
class _Scan:
    """What :func:`~analyzer.cache.stack.reuse_scan` returns, by name."""

    hist_all: np.ndarray
    hist_counted: np.ndarray
    dist_count: np.ndarray
    time_count: np.ndarray
    source_tokens: np.ndarray
    hits: np.ndarray  # per block: counted requests that hit it
    parent: np.ndarray  # per block: its parent at first sight (-1: none)
    depth: np.ndarray  # per block: its position at first sight
    working_set: np.ndarray
    request_hits: np.ndarray  # per request: prefix-hit tokens, unlimited capacity


class TraceInput:
    """The :class:`~analyzer.reuse.facts.ReuseInput` of a trace in memory (module
    docstring); the compiled pass runs once, on the first question that needs it."""

    def __init__(self, trace: BlockTrace) -> None:
        self.trace = trace
        self._scan: _Scan | None = None
        self._scanned_with: ScanPlan | None = None

    @property
    def shape(self) -> TraceShape:
        t = self.trace
        return TraceShape(
            block_size=t.block_size,
            n_requests=t.n_requests,
            n_accesses=t.n_accesses,
            all_prompt_tokens=int(t.prompt_tokens.sum()),
        )

    @property
    def requests(self) -> RequestColumns:
        t = self.trace
        return RequestColumns(t.arrival_s, t.prompt_tokens, t.session, t.tenant, t.token_lcp_prev)

    @property
    def count_only(self) -> bool:
        return self.trace.count_only

    def distinct_blocks(self) -> int:
        return self.trace.n_blocks

    def _scanned(self, plan: ScanPlan) -> _Scan:
        if self._scan is None:
            t = self.trace
            self._scan = _Scan(
                *reuse_scan(
                    t.block_ids,
                    t.offsets,
                    t.prompt_tokens,
                    t.arrival_s,
                    t.session,
                    t.tenant,
                    t.block_size,
                    plan.first,
                    t.n_blocks,
                    plan.window_s,
                    plan.n_windows,
                    TIME_EDGES,
                    plan.exact,
                )
            )
            self._scanned_with = plan
        assert self._scanned_with == plan, "one plan per trace input"
        return self._scan

    def counted_hits(self, plan: ScanPlan) -> CountedHits:
        scan = self._scanned(plan)
        return CountedHits(
            source_tokens=scan.source_tokens,
            time_count=scan.time_count,
            working_set=scan.working_set,
            n_distinct=self.trace.n_blocks,
            prefixes=prefix_candidates(self.trace, scan.hits, scan.parent, scan.depth),
        )

    def prefix_hits(self, plan: ScanPlan, factor: int) -> np.ndarray:
        if factor == 1:
            return self._scanned(plan).request_hits
        return prefix_hit_tokens(self.trace, factor)

    def content_seen(self) -> np.ndarray | None:
        return content_seen_tokens(self.trace)

    def lru_histograms(self, plan: ScanPlan) -> LruHistograms:
        assert plan.exact
        scan = self._scanned(plan)
        return LruHistograms(scan.hist_counted, scan.hist_all, scan.dist_count)

    def sampled_histogram(self, plan: ScanPlan) -> SampledHistogram:
        assert plan.shards_rate is not None
        t = self.trace
        return _sampled(t, ShardsSampling(plan.shards_rate), plan.first, t.n_requests, t.n_blocks)

    def shards_check(self, plan: ScanPlan, warmup: float, n_accesses: int) -> ShardsCheck:
        assert plan.shards_rate is not None
        return shards_error(self.trace, plan.shards_rate, warmup, n_accesses)

    def dense_trace(self, plan: ScanPlan) -> BlockTrace:
        return self.trace


# -- prefix hits at coarser blocks ----------------------------------------------------

PREFIX_SLICE = 1 << 22  # fine block accesses a slice of prefix_hit_tokens covers


def prefix_hit_tokens(trace: BlockTrace, factor: int = 1) -> np.ndarray:
    """Per request: prefix-hit tokens with unlimited capacity at ``factor x`` block size.

    A coarse block is the fine block ending it (chained hashes: that one id names the
    whole prefix), and a chained block always sits at the same depth, so the coarse ids
    keep the fine ids' first-seen order: a block was used by an earlier request exactly
    when its id is at most the largest id of the earlier requests. Requests are taken a
    slice of about :data:`PREFIX_SLICE` accesses at a time, carrying that largest id, so
    the arrays are the slice's, not the trace's (2 GB at a million chat requests).
    """
    offsets, n = trace.offsets, trace.n_requests
    counts = np.diff(offsets) // factor
    run = counts.copy()  # requests without a miss: every block
    carry = -1  # the largest id of the requests before the slice
    lo = 0
    while lo < n:
        end = int(np.searchsorted(offsets, offsets[lo] + PREFIX_SLICE, "right")) - 1
        hi = min(max(lo + 1, end), n)
        c = counts[lo:hi]
        starts = np.zeros(c.size + 1, dtype=np.int64)
        np.cumsum(c, out=starts[1:])
        req = np.repeat(np.arange(c.size), c)
        within = np.arange(starts[-1]) - starts[req]
        ids = trace.block_ids[offsets[lo:hi][req] + within * factor + factor - 1]
        del within
        most = np.full(c.size, -1, dtype=np.int64)
        nonempty = c > 0
        most[nonempty] = np.maximum.reduceat(ids, starts[:-1][nonempty])
        before = np.maximum.accumulate(np.concatenate([[carry], most]))
        carry = int(before[-1])
        miss = np.flatnonzero(ids > before[:-1][req])
        r = req[miss]
        first = np.flatnonzero(np.diff(r, prepend=-1))  # a request's first miss (r ascends)
        run[lo + r[first]] = miss[first] - starts[r[first]]
        lo = hi
    size = trace.block_size * factor
    hits: np.ndarray = np.clip(np.minimum(run * size, trace.prompt_tokens - 1), 0, None)
    return hits


# -- reuse beyond prefixes ------------------------------------------------------------

NON_PREFIX_CHUNK = 1 << 20  # block accesses per step of content_seen_tokens


def content_seen_tokens(trace: BlockTrace) -> np.ndarray | None:
    """Per request: tokens of blocks whose content an earlier request held, at any
    position (None without content ids)."""
    if trace.content_ids is None:
        return None
    # A million accesses at a time, so the temporaries stay small on a large trace; the
    # running maximum of the ids carries "seen before" across the chunks.
    n, off, ids = trace.n_requests, trace.offsets, trace.content_ids
    per_req = np.zeros(n, dtype=np.int64)
    carry = -1  # the largest content id before the chunk
    r0 = 0
    while r0 < n:
        r1 = int(np.searchsorted(off, off[r0] + NON_PREFIX_CHUNK, side="right")) - 1
        r1 = min(max(r1, r0 + 1), n)
        sub = off[r0 : r1 + 1] - off[r0]
        chunk = ids[off[r0] : off[r1]]
        weights = access_weights(sub, trace.prompt_tokens[r0:r1], trace.block_size)
        if chunk.size:
            running_max = np.maximum(np.maximum.accumulate(chunk), carry)
            starts = sub[:-1]
            max_before = np.where(starts > 0, running_max[np.maximum(starts - 1, 0)], carry)
            req = np.repeat(np.arange(r1 - r0), np.diff(sub))
            seen = chunk <= max_before[req]
            got = np.bincount(req, weights=weights * seen, minlength=r1 - r0)
            per_req[r0:r1] = got.astype(np.int64)
            carry = int(running_max[-1])
        r0 = r1
    return per_req


def non_prefix_reuse(trace: BlockTrace, first: int, prefix_hit: np.ndarray) -> NonPrefixReuse:
    """Tokens whose content was seen before at any position, and the part beyond prefixes."""
    return non_prefix_figures(content_seen_tokens(trace), trace.prompt_tokens, first, prefix_hit)


# -- shared prefixes ------------------------------------------------------------------


def prefix_candidates(
    trace: BlockTrace, hits: np.ndarray, parent: np.ndarray, depth: np.ndarray
) -> PrefixCandidates:
    """Shared-prefix candidates: chains ending where the number of requests reusing them
    drops.

    Block ``b`` stands for the prefix of ``depth[b] + 1`` blocks ending at ``b``; it is a
    candidate when some counted request reused it and none of its children was reused by
    as many (otherwise the longer prefix tells the same story).
    """
    n = hits.size
    if n == 0 or not hits.any():
        none = np.zeros(0, dtype=np.int64)
        return PrefixCandidates(none, none.astype(np.uint64), none, none, any_hit=False)
    max_child = np.zeros(n, dtype=np.int64)
    has_parent = parent >= 0
    np.maximum.at(max_child, parent[has_parent], hits[has_parent])
    cand = np.flatnonzero((hits > 0) & (max_child < hits))

    def preview(block: int) -> str | None:
        return _preview(trace, block, parent)

    def holders(ids: np.ndarray) -> dict[int, PrefixHolders]:
        # A table by dense id, not np.isin: isin's own table copies the ids in its range
        # twice over (16 bytes an access, 190 MB at a 50k long-prompt log).
        listed = np.zeros(trace.n_blocks, dtype=bool)
        listed[ids] = True
        at = np.flatnonzero(listed[trace.block_ids])
        reqs = np.searchsorted(trace.offsets, at, side="right") - 1
        return prefix_holders(
            ids, trace.block_ids[at], reqs, trace.tenant, trace.model, trace.model_names
        )

    return PrefixCandidates(
        block_id=cand,
        hash=trace.block_hashes[cand],
        blocks=depth[cand] + 1,
        requests=hits[cand],
        any_hit=True,
        preview=preview if trace.previews else None,
        holders=holders,
    )


def _preview(trace: BlockTrace, block: int, parent: np.ndarray) -> str | None:
    chain = [block]
    while parent[chain[-1]] >= 0 and len(chain) < 100_000:
        chain.append(int(parent[chain[-1]]))
    head = trace.previews.get(chain[-1])
    tail = trace.previews.get(block) if block != chain[-1] else None
    text = " … ".join(t.strip() for t in (head, tail) if t)
    text = " ".join(text.split())
    return (text[:117] + "...") if len(text) > 120 else (text or None)


# -- SHARDS ---------------------------------------------------------------------------


def _prefix_requests(trace: BlockTrace, n_accesses: int | None) -> tuple[int, int, int]:
    """(requests, accesses, distinct ids) of the longest request prefix within n_accesses."""
    if n_accesses is None or n_accesses >= trace.n_accesses:
        return trace.n_requests, trace.n_accesses, trace.n_blocks
    n_req = int(np.searchsorted(trace.offsets, n_accesses, side="right")) - 1
    acc = int(trace.offsets[n_req])
    n_ids = int(trace.block_ids[:acc].max()) + 1 if acc else 0
    return n_req, acc, n_ids


def _sampled(
    trace: BlockTrace, sampling: ShardsSampling, first: int, n_req: int, n_ids: int
) -> SampledHistogram:
    """The SHARDS pass over the first ``n_req`` requests (ids below ``n_ids``): a block
    is kept by :class:`~analyzer.reuse.curves.ShardsSampling`, its uses counted over
    those requests."""
    if n_ids == 0:
        return SampledHistogram(np.zeros(1), 0)
    n_acc = int(trace.offsets[n_req])
    keep = sampling.keeps(trace.block_hashes[:n_ids])
    uses = np.bincount(trace.block_ids[:n_acc], minlength=n_ids)
    hot = hot_by_uses(uses, sampling.hot_count(n_ids))
    keep |= hot
    sample_index = np.full(n_ids, -1, dtype=np.int64)
    sample_index[keep] = np.arange(int(keep.sum()), dtype=np.int64)
    hist, counted_tokens = sampled_histogram(
        trace.block_ids,
        trace.offsets[: n_req + 1],
        trace.prompt_tokens,
        trace.block_size,
        sample_index,
        sampling.id_weight(hot[keep]),
        sampling.unit,
        first,
        max(n_ids, 1),
    )
    return SampledHistogram(hist, counted_tokens)


def shards_curve(
    trace: BlockTrace, rate: float, first: int, n_accesses: int | None = None
) -> StepCurve:
    """Stratified SHARDS-adj LRU curve (:mod:`analyzer.reuse.curves`), token-weighted,
    over the first requests within ``n_accesses`` (all by default)."""
    n_req, _, n_ids = _prefix_requests(trace, n_accesses)
    if n_ids == 0:
        return EMPTY_CURVE
    sample = _sampled(trace, ShardsSampling(rate), first, n_req, n_ids)
    den = int(trace.prompt_tokens[first:n_req].sum())
    return shards_adjusted_curve(sample.counted, sample.counted_tokens, den)


def shards_error(trace: BlockTrace, rate: float, warmup: float, n_accesses: int) -> ShardsCheck:
    """Measured error of the sampled curve against the exact one on a prefix of the trace."""
    n_req, acc, n_ids = _prefix_requests(trace, n_accesses)
    first = first_counted_request(n_req, warmup)
    sampled = shards_curve(trace, rate, first, n_accesses)
    hist = lru_histogram(
        trace.block_ids,
        trace.offsets[: n_req + 1],
        trace.prompt_tokens,
        np.empty(0, np.int64),
        trace.block_size,
        first,
        n_ids,
        True,
    )
    exact = exact_curve(hist, int(trace.prompt_tokens[first:n_req].sum()))
    max_error, mean_error = curve_error(sampled, exact)
    return {
        "checked_requests": n_req,
        "checked_accesses": acc,
        "max_abs_error": max_error,
        "mean_abs_error": mean_error,
    }
