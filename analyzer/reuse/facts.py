"""What a way of reading a trace hands the reuse figures: the :class:`ReuseInput` protocol
and the records it answers with.

A trace is read in memory (:class:`analyzer.reuse.analysis.TraceInput`, a ``BlockTrace``
and one compiled pass) or as a lazy frame over a canonical file or dataset
(:class:`analyzer.reuse.streamed.FrameInput`, polars group-bys and joins over hash
parts). Each answers the same questions, as arrays per request or per block; every
figure of the report is then computed once, from those answers
(:func:`analyzer.reuse.assemble.measure`). Every question of one measurement comes with
the same :class:`ScanPlan`; implementations compute on the first question that needs it
and keep the answer (the prefix hits at the trace's block size are asked twice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from analyzer.reuse.records import ReuseOptions, ShardsCheck, first_counted_request
from analyzer.reuse.result import TraceShape
from analyzer.trace import BlockTrace


@dataclass(frozen=True, slots=True)
class RequestColumns:
    """Per request, in arrival order."""

    arrival_s: np.ndarray  # float64
    prompt_tokens: np.ndarray  # int64
    session: np.ndarray  # int32 codes, -1 none
    tenant: np.ndarray  # int32 codes in order of first appearance, -1 none
    token_lcp_prev: np.ndarray | None  # int64: token-exact LCP with the trace before


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """What one measurement looks for, decided once from the options and the trace."""

    first: int  # first counted request
    window_s: float  # working-set window (0: one window)
    n_windows: int
    shards_rate: float | None  # the LRU curve is SHARDS-sampled at this rate; None: exact
    factors: tuple[int, ...]  # block-size multiples whose prefix hits are asked for
    top_n: int  # shared prefixes listed

    @property
    def exact(self) -> bool:
        return self.shards_rate is None

    @classmethod
    def of(cls, opts: ReuseOptions, shape: TraceShape, arrival_s: np.ndarray) -> ScanPlan:
        span = float(arrival_s[-1] - arrival_s[0]) if arrival_s.size else 0.0
        n_windows = max(1, opts.n_windows) if span > 0 else 1
        rate = opts.shards_rate
        if rate is None and shape.n_accesses > opts.shards_threshold_accesses:
            rate = opts.shards_auto_rate
        bs = shape.block_size
        return cls(
            first=first_counted_request(shape.n_requests, opts.warmup),
            window_s=span / n_windows if span > 0 else 0.0,
            n_windows=n_windows,
            shards_rate=rate if rate is not None and rate < 1.0 else None,
            factors=tuple(sorted({1} | {g // bs for g in opts.granularities if g % bs == 0})),
            top_n=opts.top_n,
        )


@dataclass(frozen=True, slots=True)
class PrefixCandidates:
    """Blocks that may be listed as shared prefixes: each stands for the prefix of
    ``blocks`` blocks ending at it, reused by ``requests`` counted requests, and none of
    its children was reused by as many. Every such block is here, or at least every one
    among the ``top_n`` by volume and by count. ``any_hit``: some counted request reused
    some block (with ``top_n = 0`` there are hits but no candidates)."""

    block_id: np.ndarray  # int64 dense id: rank of the block's first access
    hash: np.ndarray  # uint64 chained hash
    blocks: np.ndarray  # int64
    requests: np.ndarray  # int64
    any_hit: bool
    preview: Callable[[int], str | None] | None = None  # dense id -> text, when kept
    # dense ids -> who holds each: asked only for the prefixes listed
    holders: Callable[[np.ndarray], dict[int, PrefixHolders]] | None = None


@dataclass(frozen=True, slots=True)
class PrefixHolders:
    """Who sends a shared prefix: how many tenants' requests hold it (None when the log
    names no tenant), and the models they were served by (empty when it names none).
    The report says this, not a hash, when it shows what a prefix is."""

    tenants: int | None
    models: tuple[str, ...]


def prefix_holders(
    ids: np.ndarray,
    access_block: np.ndarray,
    access_request: np.ndarray,
    tenant: np.ndarray,
    model: np.ndarray | None,
    model_names: list[str],
) -> dict[int, PrefixHolders]:
    """:class:`PrefixHolders` of each dense id in ``ids``, from the accesses to them
    (``access_block[i]`` was read by request ``access_request[i]``) and the requests'
    tenant and model codes (-1: none)."""
    named_tenants = bool((tenant >= 0).any())
    out = {}
    for b in np.unique(ids):
        reqs = np.unique(access_request[access_block == b])
        t = tenant[reqs]
        m = np.unique(model[reqs]) if model is not None else np.zeros(0, dtype=np.int64)
        out[int(b)] = PrefixHolders(
            tenants=int(np.unique(t[t >= 0]).size) if named_tenants else None,
            models=tuple(sorted(model_names[int(c)] for c in m if c >= 0)),
        )
    return out


@dataclass(frozen=True, slots=True)
class CountedHits:
    """What the counted requests' prefix hits say about whose blocks they reused, when,
    and how many distinct blocks the trace touches."""

    source_tokens: np.ndarray  # int64 (4,): hit tokens by SOURCE_KEYS
    time_count: np.ndarray  # int64 (len(TIME_EDGES) + 1,): hit accesses per reuse-time bin
    working_set: np.ndarray  # int64 (n_windows,): distinct blocks per window
    n_distinct: int  # distinct blocks of the trace
    prefixes: PrefixCandidates


@dataclass(frozen=True, slots=True)
class LruHistograms:
    """One exact LRU stack-distance pass: token weight by distance (last bin: misses) of
    the counted requests and of every request, and counted hit accesses by distance."""

    counted: np.ndarray  # int64 (n_distinct + 1,)
    every: np.ndarray  # int64 (n_distinct + 1,)
    distances: np.ndarray  # int64 (n_distinct + 1,)


@dataclass(frozen=True, slots=True)
class SampledHistogram:
    """A SHARDS pass: token weight by scaled distance of the counted requests, and the
    counted requests' true token weight of every block access (for the SHARDS-adj
    correction)."""

    counted: np.ndarray  # float64
    counted_tokens: int


class ReuseInput(Protocol):
    """One way of reading a trace (module docstring)."""

    @property
    def shape(self) -> TraceShape: ...

    @property
    def requests(self) -> RequestColumns: ...

    @property
    def count_only(self) -> bool:
        """The trace has token counts only: no block hashes to measure reuse with."""
        ...

    def distinct_blocks(self) -> int:
        """Distinct blocks, for a trace that is not measured."""
        ...

    def counted_hits(self, plan: ScanPlan) -> CountedHits: ...

    def prefix_hits(self, plan: ScanPlan, factor: int) -> np.ndarray:
        """Per request: prefix-hit tokens with unlimited capacity at ``factor`` x block
        size (one of ``plan.factors``; the last prompt token is never a hit)."""
        ...

    def content_seen(self) -> np.ndarray | None:
        """Per request: tokens of blocks whose content an earlier request held at any
        position (None: the trace has no content hashes)."""
        ...

    def lru_histograms(self, plan: ScanPlan) -> LruHistograms: ...

    def sampled_histogram(self, plan: ScanPlan) -> SampledHistogram: ...

    def shards_check(self, plan: ScanPlan, warmup: float, n_accesses: int) -> ShardsCheck:
        """The sampled curve against the exact one on the requests within ``n_accesses``."""
        ...

    def dense_trace(self, plan: ScanPlan) -> BlockTrace:
        """The trace as dense block ids in memory, for the per-capacity simulations."""
        ...
