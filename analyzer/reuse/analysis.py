"""How much prefill is repeated work, and how much cache it takes to capture it.

:func:`analyze_reuse` turns a :class:`~analyzer.trace.BlockTrace` into a
:class:`ReuseReport`:

* **ceilings**: token-weighted prefix hit rate with unlimited capacity and perfect
  routing, cold (every request counted) and steady (the first ``warmup`` fraction of
  requests fills the cache uncounted), at the trace's block size, token-exact (when
  ingest computed ``token_lcp_prev``) and at coarser block sizes;
* **sources**: who last held each reused block (same session, same tenant, another
  tenant), the top shared prefixes, reuse distance and reuse time, working set;
* **curves**: exact LRU hit rate at every capacity from one stack-distance pass
  (:mod:`analyzer.cache.stack`), SHARDS-sampled beyond ``shards_threshold_accesses``,
  plus FIFO, S3-FIFO and Belady's optimal at chosen capacities
  (:mod:`analyzer.cache.simulate`);
* **non-prefix reuse**: content seen before at any position, minus prefix hits.

Every rate is hit tokens / prompt tokens of the counted requests; a hit never covers
a request's last prompt token. Capacities are whole blocks (``capacity_tokens //
block_size``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.cache.kernels import optimal_all, simulate_fast
from analyzer.cache.policies import get_policy
from analyzer.cache.policies import label as policy_label
from analyzer.cache.simulate import next_use_requests
from analyzer.cache.stack import (
    access_weights,
    lru_histogram,
    reuse_scan,
    sampled_histogram,
    splitmix64,
)
from analyzer.errors import UsageError
from analyzer.progress import Advance
from analyzer.trace import BlockTrace

GIB = 2**30
GB = 10**9
GRANULARITIES = (16, 64, 256, 512)
SOURCE_KEYS = ("same_session", "same_tenant", "cross_tenant", "unattributed")
# Reuse times are binned on a log scale (50 bins per decade, 1 ms .. 1e8 s): a
# percentile is reported as the upper edge of its bin, within 4.7 % of the exact value.
TIME_EDGES = np.geomspace(1e-3, 1e8, 11 * 50 + 1)
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class ReuseOptions:
    warmup: float = 0.5  # fraction of requests that fill the cache uncounted
    capacities_tokens: tuple[int, ...] = ()  # where policies are compared; () = knees
    bytes_per_token: int | None = None  # KV bytes per token of the model, for GB/GiB
    policies: tuple[str, ...] = ("lru", "fifo", "s3fifo", "optimal")
    granularities: tuple[int, ...] = GRANULARITIES
    top_n: int = 10
    shards_rate: float | None = None  # None: exact up to shards_threshold_accesses
    shards_threshold_accesses: int = 50_000_000
    shards_auto_rate: float = 0.01
    shards_error_accesses: int = 5_000_000  # prefix on which the sampled curve is checked
    policy_max_accesses: int = 30_000_000  # per-capacity simulations are skipped beyond
    n_windows: int = 48  # working-set windows over the trace's time span
    curve_points: int = 200
    jobs: int = 1  # threads running the per-capacity simulations (same figures at any)

    def __post_init__(self) -> None:
        if not 0.0 <= self.warmup < 1.0:
            raise UsageError(f"--warmup must be in [0, 1), got {self.warmup}")
        if any(c < 0 for c in self.capacities_tokens):
            raise UsageError("capacities must not be negative")
        if self.top_n < 0:
            raise UsageError(f"--top must be >= 0, got {self.top_n}")
        for name in self.policies:
            get_policy(name)  # registered, or a usage error naming the choices
        if self.shards_rate is not None and not 0.0 < self.shards_rate <= 1.0:
            raise UsageError(f"SHARDS rate must be in (0, 1], got {self.shards_rate}")
        if self.bytes_per_token is not None and self.bytes_per_token <= 0:
            raise UsageError("bytes per token must be positive")


@dataclass(frozen=True, slots=True)
class StepCurve:
    """Hit rate as a step function of capacity in blocks: rate(C) = rates[last caps <= C]."""

    caps_blocks: np.ndarray  # int64, increasing
    rates: np.ndarray  # float64, non-decreasing

    def at(self, capacity_blocks: int) -> float:
        i = int(np.searchsorted(self.caps_blocks, capacity_blocks, side="right")) - 1
        return float(self.rates[i]) if i >= 0 else 0.0

    def smallest_reaching(self, rate: float) -> int | None:
        i = int(np.searchsorted(self.rates, rate - 1e-12, side="left"))
        return int(self.caps_blocks[i]) if i < self.rates.size else None

    @property
    def full_blocks(self) -> int:
        """Capacity at which the curve reaches its ceiling."""
        return int(self.caps_blocks[-1]) if self.caps_blocks.size else 0


@dataclass(frozen=True, slots=True)
class NonPrefixReuse:
    """Prompt tokens whose content was seen before at any position, and the part of them
    beyond prefixes (position-independent reuse, e.g. CacheBlend, which today's pooling
    products cannot use), as shares of the counted prompt tokens (steady) and of all of
    them (``cold_*``). Without per-block content hashes it is not ``available``."""

    available: bool
    reason: str | None = None  # why it is not available
    content_seen_rate: float = 0.0
    cold_content_seen_rate: float = 0.0
    prefix_rate: float = 0.0
    cold_prefix_rate: float = 0.0
    hit_rate: float = 0.0  # seen before, but not as a prefix
    cold_hit_rate: float = 0.0
    note: str = (
        "content seen before at any position but not as a prefix; today's "
        "pooling products cannot reuse it (position-independent reuse, e.g. CacheBlend)"
    )

    def to_json(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {
            "available": True,
            "content_seen_rate": self.content_seen_rate,
            "cold_content_seen_rate": self.cold_content_seen_rate,
            "prefix_rate": self.prefix_rate,
            "cold_prefix_rate": self.cold_prefix_rate,
            "hit_rate": self.hit_rate,
            "cold_hit_rate": self.cold_hit_rate,
            "note": self.note,
        }


NO_CONTENT = NonPrefixReuse(
    available=False,
    reason="the trace has no per-block content hashes (position-independent "
    "reuse needs logs with prompt content)",
)


@dataclass(frozen=True, slots=True)
class GranularityCeiling:
    """The steady and cold ceilings at one cache granularity: ``block_size_tokens``
    tokens per block, or token-exact (``None``). Not ``available`` when the trace cannot
    give it (``reason`` says why)."""

    block_size_tokens: int | None
    available: bool
    hit_rate: float = 0.0
    cold_hit_rate: float = 0.0
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.block_size_tokens is not None:
            out["block_size"] = self.block_size_tokens
        if self.available:
            out.update(available=True, hit_rate=self.hit_rate, cold_hit_rate=self.cold_hit_rate)
        else:
            out.update(available=False, reason=self.reason)
        return out


@dataclass(frozen=True, slots=True)
class Granularity:
    """Ceilings token-exact and at each block size compared (the trace's own among them)."""

    token_exact: GranularityCeiling
    blocks: tuple[GranularityCeiling, ...]

    def hit_rate_by_block_size(self) -> dict[int, float]:
        """Steady ceiling per block size (tokens) that the trace could give."""
        return {
            int(r.block_size_tokens): r.hit_rate
            for r in self.blocks
            if r.available and r.block_size_tokens is not None
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "token_exact": self.token_exact.to_json(),
            "blocks": [r.to_json() for r in self.blocks],
        }


SOURCE_ATTRIBUTION = "each reused block is credited to the most recent earlier request that held it"


@dataclass(frozen=True, slots=True)
class ReuseSources:
    """Whose earlier request each reused token comes from, keyed by :data:`SOURCE_KEYS`:
    hit tokens, and shares of the hit and of the counted prompt tokens."""

    hit_tokens_by_source: dict[str, int]
    share_of_hits: dict[str, float]
    share_of_prompt: dict[str, float]
    sessions_known: bool
    tenants_known: bool
    attribution: str = SOURCE_ATTRIBUTION

    def to_json(self) -> dict[str, Any]:
        return {
            "attribution": self.attribution,
            "tokens": dict(self.hit_tokens_by_source),
            "share_of_hits": dict(self.share_of_hits),
            "share_of_prompt": dict(self.share_of_prompt),
            "sessions_known": self.sessions_known,
            "tenants_known": self.tenants_known,
            **self.share_of_hits,
        }


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """One shared prefix: ``prefix_blocks`` blocks ending at block ``block_id`` (chained
    hash ``hash_hex``), reused by ``requests`` counted requests."""

    block_id: int
    hash_hex: str
    prefix_blocks: int
    prefix_tokens: int
    requests: int
    reused_tokens: int  # requests x prefix_tokens
    preview: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "block_id": self.block_id,
            "hash": self.hash_hex,
            "prefix_blocks": self.prefix_blocks,
            "prefix_tokens": self.prefix_tokens,
            "requests": self.requests,
            "reused_tokens": self.reused_tokens,
            "preview": self.preview,
        }


TOP_PREFIXES_NOTE = "reused_tokens = requests x prefix length (each request reusing it counts once)"


@dataclass(frozen=True, slots=True)
class TopPrefixes:
    """The most reused prefixes, by reused tokens and by requests (``note`` only when
    some prefix was reused)."""

    by_volume: tuple[SharedPrefix, ...] = ()
    by_count: tuple[SharedPrefix, ...] = ()
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "by_volume": [e.to_json() for e in self.by_volume],
            "by_count": [e.to_json() for e in self.by_count],
        }
        if self.note is not None:
            out["note"] = self.note
        return out


NO_TOP_PREFIXES = TopPrefixes()


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One point of a hit-ratio curve: steady hit rate with ``capacity_tokens`` of cache
    (also in GB and GiB when the bytes per token are known)."""

    capacity_tokens: int
    hit_rate: float
    capacity_gb: float | None = None
    capacity_gib: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            **_capacity_json(self.capacity_tokens, self.capacity_gb, self.capacity_gib),
            "hit_rate": _round(self.hit_rate),
        }


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """The policies compared at one capacity: LRU's steady hit rate and each simulated
    policy's (``None`` where it was not simulated there)."""

    capacity_tokens: int
    capacity_blocks: int
    lru_hit_rate: float
    hit_rate_by_policy: dict[str, float | None]
    capacity_gb: float | None = None
    capacity_gib: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            **_capacity_json(self.capacity_tokens, self.capacity_gb, self.capacity_gib),
            "capacity_blocks": self.capacity_blocks,
            "lru": _round(self.lru_hit_rate),
            **{p: _round(r) for p, r in self.hit_rate_by_policy.items()},
        }


def _capacity_json(tokens: int, gb: float | None, gib: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"capacity_tokens": tokens}
    if gb is not None:
        out["capacity_gb"] = gb
        out["capacity_gib"] = gib
    return out


@dataclass(frozen=True)
class ReuseReport:
    measurable: bool
    reason: str | None
    block_size: int
    warmup: float
    n_requests: int
    counted_requests: int
    n_accesses: int
    n_blocks: int
    prompt_tokens: int  # counted requests
    hit_tokens: int  # counted requests, unlimited capacity
    ceiling_hit_rate: float
    cold_ceiling_hit_rate: float
    bytes_per_token: int | None = None
    curve: StepCurve | None = None
    cold_curve: StepCurve | None = None  # every request counted (exact runs only)
    curve_method: str = "exact"  # or "shards"
    shards: dict[str, Any] | None = None
    policy_points: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    policy_notes: list[str] = field(default_factory=list)
    capacities_tokens: tuple[int, ...] = ()
    sources: ReuseSources | None = None
    top_prefixes: TopPrefixes = NO_TOP_PREFIXES
    granularity: Granularity | None = None
    non_prefix: NonPrefixReuse = NO_CONTENT
    reuse_distance: dict[str, Any] = field(default_factory=dict)
    reuse_time: dict[str, Any] = field(default_factory=dict)
    working_set: dict[str, Any] = field(default_factory=dict)
    curve_points: int = 200
    breakdowns: dict[str, Any] = field(default_factory=dict)  # ceilings per tenant, per hour

    # -- capacity queries ----------------------------------------------------------

    def hit_rate_at(self, capacity_tokens: int, policy: str = "lru") -> float:
        """Steady-state hit rate with ``capacity_tokens`` of cache (whole blocks)."""
        if not self.measurable:
            return 0.0
        blocks = int(capacity_tokens) // self.block_size
        if policy == "lru":
            assert self.curve is not None
            return self.curve.at(blocks)
        points = dict(self.policy_points.get(policy, []))
        for cap, rate in points.items():
            if cap // self.block_size == blocks:
                return rate
        raise ValueError(
            f"policy {policy!r} was not simulated at {capacity_tokens} tokens "
            f"(simulated: {sorted(points)}); pass it in ReuseOptions.capacities_tokens"
        )

    def knee_tokens(self, fraction: float = 0.9) -> int:
        """Smallest capacity (tokens) whose LRU hit rate reaches ``fraction`` x ceiling."""
        if not self.measurable or self.curve is None or self.ceiling_hit_rate <= 0:
            return 0
        target = fraction * float(self.curve.rates[-1])
        blocks = self.curve.smallest_reaching(target)
        return (blocks if blocks is not None else self.curve.full_blocks) * self.block_size

    @property
    def lru_curve(self) -> list[tuple[int, float]]:
        """(capacity_tokens, hit_rate) at capacities dense enough to plot (log and linear)."""
        if not self.measurable or self.curve is None:
            return []
        return self._plot_points(self.curve)

    def _plot_points(self, curve: StepCurve) -> list[tuple[int, float]]:
        if curve.full_blocks == 0:
            return []
        top = curve.full_blocks
        n = max(self.curve_points // 2, 2)
        caps = np.unique(
            np.concatenate(
                [
                    np.round(np.geomspace(1, top, n)),
                    np.round(np.linspace(0, top, n)),
                    [0, top],
                ]
            ).astype(np.int64)
        )
        return [(int(c) * self.block_size, curve.at(int(c))) for c in caps]

    @property
    def footprint_tokens(self) -> int:
        """Capacity at which LRU reaches the ceiling (the whole reusable working set)."""
        return self.curve.full_blocks * self.block_size if self.curve is not None else 0

    # -- output ---------------------------------------------------------------------

    def _capacity_fields(self, capacity_tokens: int) -> dict[str, Any]:
        return _capacity_json(int(capacity_tokens), *self._capacity_gb(capacity_tokens))

    def _capacity_gb(self, capacity_tokens: int) -> tuple[float | None, float | None]:
        """``capacity_tokens`` of KV in GB and GiB (3 places), when bytes per token are known."""
        if not self.bytes_per_token:
            return None, None
        n_bytes = capacity_tokens * self.bytes_per_token
        return round(n_bytes / GB, 3), round(n_bytes / GIB, 3)

    def _points(self, points: list[tuple[int, float]]) -> tuple[CurvePoint, ...]:
        return tuple(CurvePoint(int(c), h, *self._capacity_gb(c)) for c, h in points)

    def curves(self) -> dict[str, tuple[CurvePoint, ...]]:
        """Hit-ratio curve per policy: LRU dense enough to plot, the others at the
        capacities compared (empty when the trace was not measurable)."""
        if not self.measurable:
            return {}
        out = {"lru": self._points(self.lru_curve)}
        for policy, points in self.policy_points.items():
            out[policy] = self._points(points)
        return out

    def lru_cold_curve(self) -> tuple[CurvePoint, ...]:
        """LRU with every request counted (exact runs only)."""
        if self.cold_curve is None:
            return ()
        return self._points(self._plot_points(self.cold_curve))

    def capacity_rows(self) -> tuple[CapacityRow, ...]:
        """The capacities compared, each with every policy's steady hit rate."""
        rows = []
        for cap in self.capacities_tokens:
            by_policy: dict[str, float | None] = {}
            for policy, points in self.policy_points.items():
                at = dict(points)
                by_policy[policy] = at.get(cap)
            rows.append(
                CapacityRow(
                    capacity_tokens=int(cap),
                    capacity_blocks=cap // self.block_size,
                    lru_hit_rate=self.hit_rate_at(cap),
                    hit_rate_by_policy=by_policy,
                    capacity_gb=self._capacity_gb(cap)[0],
                    capacity_gib=self._capacity_gb(cap)[1],
                )
            )
        return tuple(rows)

    def to_json(self) -> dict[str, Any]:
        """Plain, deterministic JSON (floats rounded to 6 places)."""
        r6 = _round
        doc: dict[str, Any] = {
            "measurable": self.measurable,
            "reason": self.reason,
            "trace": {
                "requests": self.n_requests,
                "block_accesses": self.n_accesses,
                "distinct_blocks": self.n_blocks,
                "block_size": self.block_size,
            },
            "ceiling": {
                "hit_rate": r6(self.ceiling_hit_rate),
                "cold_hit_rate": r6(self.cold_ceiling_hit_rate),
                "warmup": self.warmup,
                "block_size": self.block_size,
                "counted_requests": self.counted_requests,
                "prompt_tokens": self.prompt_tokens,
                "hit_tokens": self.hit_tokens,
                "token_weighted": True,
                "last_token_recomputed": True,
            },
            "bytes_per_token": self.bytes_per_token,
        }
        if not self.measurable:
            doc["curves"] = {}
            return doc
        doc.update(
            {
                "curves": {
                    policy: [p.to_json() for p in points]
                    for policy, points in self.curves().items()
                },
                "lru_cold_curve": [p.to_json() for p in self.lru_cold_curve()],
                "curve_method": self.curve_method,
                "shards": _round_tree(self.shards),
                "policy_notes": list(self.policy_notes),
                "capacities": [r.to_json() for r in self.capacity_rows()],
                "knees": {
                    str(f): self._capacity_fields(self.knee_tokens(f))
                    for f in (0.5, 0.8, 0.9, 0.95)
                },
                "footprint": self._capacity_fields(self.footprint_tokens),
                "sources": _round_tree(self.sources.to_json() if self.sources else {}),
                "top_prefixes": _round_tree(self.top_prefixes.to_json()),
                "granularity": _round_tree(self.granularity.to_json() if self.granularity else {}),
                "non_prefix": _round_tree(self.non_prefix.to_json()),
                "reuse_distance": _round_tree(self.reuse_distance),
                "reuse_time": _round_tree(self.reuse_time),
                "working_set": _round_tree(self.working_set),
                "breakdowns": _round_tree(self.breakdowns),
            }
        )
        return doc


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def _round_tree(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _round_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_round_tree(v) for v in obj]
    return obj


# -- building blocks ---------------------------------------------------------------


def first_counted_request(n_requests: int, warmup: float) -> int:
    """Index of the first request counted under ``warmup`` (earlier ones fill the cache)."""
    return int(warmup * n_requests)


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


def _rates(hit: np.ndarray, prompt: np.ndarray, first: int) -> tuple[float, float]:
    """(steady, cold) token-weighted rates."""
    steady_den = int(prompt[first:].sum())
    cold_den = int(prompt.sum())
    steady = int(hit[first:].sum()) / steady_den if steady_den else 0.0
    cold = int(hit.sum()) / cold_den if cold_den else 0.0
    return steady, cold


def granularity_table(
    trace: BlockTrace, first: int, sizes: tuple[int, ...], own_hits: np.ndarray | None = None
) -> Granularity:
    """Ceilings token-exact and at each block size derivable from the trace's hashes.

    ``own_hits`` (per-request hit tokens at the trace's own block size) saves a pass.
    """

    def hits_at(factor: int) -> np.ndarray:
        if factor == 1 and own_hits is not None:
            return own_hits
        return prefix_hit_tokens(trace, factor)

    return granularity_document(
        trace.prompt_tokens, trace.token_lcp_prev, first, sizes, trace.block_size, hits_at
    )


def granularity_document(
    prompt: np.ndarray,
    token_lcp_prev: np.ndarray | None,
    first: int,
    sizes: tuple[int, ...],
    block_size: int,
    hits_at: Callable[[int], np.ndarray],
) -> Granularity:
    """The granularity ceilings from per-request hit tokens at each ``factor x`` block size."""
    if token_lcp_prev is not None:
        hit = np.clip(np.minimum(token_lcp_prev, prompt - 1), 0, None)
        steady, cold = _rates(hit, prompt, first)
        exact = GranularityCeiling(None, True, hit_rate=steady, cold_hit_rate=cold)
    else:
        exact = GranularityCeiling(
            None,
            False,
            reason="unknown: the trace has no token-exact prefix lengths "
            "(only logs with prompt text give them)",
        )
    rows = []
    for size in sorted(set(sizes) | {block_size}):
        if size % block_size:
            rows.append(
                GranularityCeiling(
                    size,
                    False,
                    reason=f"not a multiple of the trace's block size {block_size}; "
                    f"re-ingest with --block-size {size}",
                )
            )
        else:
            steady, cold = _rates(hits_at(size // block_size), prompt, first)
            rows.append(GranularityCeiling(size, True, hit_rate=steady, cold_hit_rate=cold))
    return Granularity(exact, tuple(rows))


def non_prefix_reuse(trace: BlockTrace, first: int, prefix_hit: np.ndarray) -> NonPrefixReuse:
    """Tokens whose content was seen before at any position, and the part beyond prefixes."""
    if trace.content_ids is None:
        return NO_CONTENT
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
    return non_prefix_document(per_req, trace.prompt_tokens, first, prefix_hit)


NON_PREFIX_CHUNK = 1 << 20  # block accesses per step of non_prefix_reuse


def non_prefix_document(
    content_seen: np.ndarray, prompt: np.ndarray, first: int, prefix_hit: np.ndarray
) -> NonPrefixReuse:
    """The non-prefix figures from per-request tokens whose content was seen before."""
    content_steady, content_cold = _rates(content_seen, prompt, first)
    prefix_steady, prefix_cold = _rates(prefix_hit, prompt, first)
    return NonPrefixReuse(
        available=True,
        content_seen_rate=content_steady,
        cold_content_seen_rate=content_cold,
        prefix_rate=prefix_steady,
        cold_prefix_rate=prefix_cold,
        hit_rate=max(content_steady - prefix_steady, 0.0),
        cold_hit_rate=max(content_cold - prefix_cold, 0.0),
    )


BREAKDOWN_NOTE = (
    "steady-state ceilings (unlimited capacity) of the counted requests; tenants are "
    "numbered 1, 2, ... in order of first appearance in the trace (names stay private), "
    "null: no tenant; hour 0 starts at the first request"
)


def breakdown_rows(keys: np.ndarray, prompt: np.ndarray, hit: np.ndarray) -> list[dict[str, Any]]:
    """Rows ``{key, requests, prompt_tokens, hit_tokens, hit_rate}`` per distinct key."""
    uniq, inv = np.unique(keys, return_inverse=True)
    n = np.bincount(inv, minlength=uniq.size)
    p = np.bincount(inv, weights=prompt, minlength=uniq.size).astype(np.int64)
    h = np.bincount(inv, weights=hit, minlength=uniq.size).astype(np.int64)
    return [
        {
            "key": int(uniq[i]),
            "requests": int(n[i]),
            "prompt_tokens": int(p[i]),
            "hit_tokens": int(h[i]),
            "hit_rate": int(h[i]) / int(p[i]) if p[i] else 0.0,
        }
        for i in range(uniq.size)
    ]


def breakdowns(
    hit_per_req: np.ndarray,
    prompt: np.ndarray,
    tenant: np.ndarray,
    arrival_s: np.ndarray,
    first: int,
) -> dict[str, Any]:
    """Steady-state ceiling per tenant and per hour of the trace (the numpy form; the
    canonical-file path computes the same with polars group-bys)."""
    if arrival_s.size == 0:
        return {}
    hour = ((arrival_s - arrival_s[0]) // 3600).astype(np.int64)
    return breakdown_document(
        breakdown_rows(tenant[first:].astype(np.int64), prompt[first:], hit_per_req[first:]),
        breakdown_rows(hour[first:], prompt[first:], hit_per_req[first:]),
    )


def breakdown_document(
    by_tenant: list[dict[str, Any]], by_hour: list[dict[str, Any]]
) -> dict[str, Any]:
    for row in by_tenant:
        code = row.pop("key")
        row["tenant"] = code + 1 if code >= 0 else None
    for row in by_hour:
        row["hour"] = row.pop("key")
    order = ("tenant", "hour", "requests", "prompt_tokens", "hit_tokens", "hit_rate")
    return {
        "by_tenant": [{k: r[k] for k in order if k in r} for r in by_tenant],
        "by_hour": [{k: r[k] for k in order if k in r} for r in by_hour],
        "note": BREAKDOWN_NOTE,
    }


def _percentiles_from_counts(values: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    total = int(counts.sum())
    if total == 0:
        return {f"p{p}": None for p in PERCENTILES}
    cum = np.cumsum(counts)
    out = {}
    for p in PERCENTILES:
        i = int(np.searchsorted(cum, p / 100 * total, side="left"))
        out[f"p{p}"] = float(values[min(i, values.size - 1)])
    return out


def _preview(trace: BlockTrace, block: int, parent: np.ndarray) -> str | None:
    if not trace.previews:
        return None
    chain = [block]
    while parent[chain[-1]] >= 0 and len(chain) < 100_000:
        chain.append(int(parent[chain[-1]]))
    head = trace.previews.get(chain[-1])
    tail = trace.previews.get(block) if block != chain[-1] else None
    text = " … ".join(t.strip() for t in (head, tail) if t)
    text = " ".join(text.split())
    return (text[:117] + "...") if len(text) > 120 else (text or None)


def top_prefixes(
    trace: BlockTrace, hits: np.ndarray, parent: np.ndarray, depth: np.ndarray, top_n: int
) -> TopPrefixes:
    """Shared prefixes: chains ending where the number of requests reusing them drops.

    Block ``b`` stands for the prefix of ``depth[b] + 1`` blocks ending at ``b``; it is
    listed when some counted request reused it and none of its children was reused by
    as many requests (otherwise the longer prefix tells the same story).
    """
    n = hits.size
    if n == 0 or not hits.any():
        return NO_TOP_PREFIXES
    max_child = np.zeros(n, dtype=np.int64)
    has_parent = parent >= 0
    np.maximum.at(max_child, parent[has_parent], hits[has_parent])
    cand = np.flatnonzero((hits > 0) & (max_child < hits))
    prefix_tokens = (depth[cand] + 1) * trace.block_size
    volume = hits[cand] * prefix_tokens

    def entry(i: int) -> SharedPrefix:
        b = int(cand[i])
        return SharedPrefix(
            block_id=b,
            hash_hex=f"{int(trace.block_hashes[b]):016x}",
            prefix_blocks=int(depth[b] + 1),
            prefix_tokens=int(prefix_tokens[i]),
            requests=int(hits[b]),
            reused_tokens=int(volume[i]),
            preview=_preview(trace, b, parent),
        )

    by_volume = np.lexsort((cand, -hits[cand], -volume))[:top_n]
    by_count = np.lexsort((cand, -prefix_tokens, -hits[cand]))[:top_n]
    return TopPrefixes(
        by_volume=tuple(entry(int(i)) for i in by_volume),
        by_count=tuple(entry(int(i)) for i in by_count),
        note=TOP_PREFIXES_NOTE,
    )


def exact_curve(hist: np.ndarray, denominator: int) -> StepCurve:
    """Step curve from a stack-distance histogram (last bin = never seen)."""
    body = hist[:-1]
    d = np.flatnonzero(body)
    if d.size == 0 or denominator == 0:
        return StepCurve(np.zeros(0, dtype=np.int64), np.zeros(0))
    return StepCurve((d + 1).astype(np.int64), np.cumsum(body[d]) / denominator)


def _shards_threshold(rate: float) -> int:
    return max(1, round(rate * 2**32))


def _shards_rate(rate: float) -> float:
    """The sampling rate actually applied (the threshold is an integer)."""
    return _shards_threshold(rate) / 2**32


def _sample(
    trace: BlockTrace, rate: float, n_ids: int, n_acc: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """SHARDS spatial sample of the first ``n_acc`` accesses (ids below ``n_ids``), stratified.

    A block is sampled when a fixed 64-bit mix of its chained hash falls under
    ``rate x 2**32`` (deterministic, and the same block is sampled in every request).
    Plain SHARDS lets a handful of very hot blocks (a shared system prompt) decide the
    error, so the ``rate x distinct`` most-used blocks are kept at rate 1 and weighted
    as themselves; the others stand for ``1 / rate`` blocks each. Returns
    (sample_index per block id, id_weight per sampled block, unit).
    """
    unit = _shards_threshold(rate)
    keep = (splitmix64(trace.block_hashes[:n_ids]) >> np.uint64(32)) < np.uint64(unit)
    uses = np.bincount(trace.block_ids[:n_acc], minlength=n_ids)
    n_hot = int(_shards_rate(rate) * n_ids)
    hot = np.zeros(n_ids, dtype=bool)
    if 0 < n_hot < n_ids:
        cut = np.partition(uses, n_ids - n_hot)[n_ids - n_hot]
        hot = uses > cut  # strictly above the cut: at most n_hot, and deterministic
    keep |= hot
    sample_index = np.full(n_ids, -1, dtype=np.int64)
    sample_index[keep] = np.arange(int(keep.sum()), dtype=np.int64)
    id_weight = np.where(hot[keep], np.int64(unit), np.int64(2**32))
    return sample_index, id_weight, unit


def _prefix_requests(trace: BlockTrace, n_accesses: int | None) -> tuple[int, int, int]:
    """(requests, accesses, distinct ids) of the longest request prefix within n_accesses."""
    if n_accesses is None or n_accesses >= trace.n_accesses:
        return trace.n_requests, trace.n_accesses, trace.n_blocks
    n_req = int(np.searchsorted(trace.offsets, n_accesses, side="right")) - 1
    acc = int(trace.offsets[n_req])
    n_ids = int(trace.block_ids[:acc].max()) + 1 if acc else 0
    return n_req, acc, n_ids


def shards_curve(trace: BlockTrace, rate: float, first: int, n_accesses: int | None = None) -> Any:
    """Stratified SHARDS-adj LRU curve (after Waldspurger et al., FAST'15), token-weighted.

    Runs over the first requests within ``n_accesses`` (all by default). The gap between
    the estimated and the true number of counted block tokens is credited to distance 0
    (the SHARDS-adj correction), so the curve ends at the exact ceiling's scale.
    """
    n_req, acc, n_ids = _prefix_requests(trace, n_accesses)
    empty = StepCurve(np.zeros(0, dtype=np.int64), np.zeros(0))
    if n_ids == 0:
        return empty
    sample_index, id_weight, unit = _sample(trace, rate, n_ids, acc)
    hist, counted_all = sampled_histogram(
        trace.block_ids,
        trace.offsets[: n_req + 1],
        trace.prompt_tokens,
        trace.block_size,
        sample_index,
        id_weight,
        unit,
        first,
        max(n_ids, 1),
    )
    den = int(trace.prompt_tokens[first:n_req].sum())
    if counted_all == 0 or den == 0:
        return empty
    body = hist[:-1].copy()
    body[0] += counted_all - float(hist.sum())
    d = np.flatnonzero(body)
    if d.size == 0:
        return empty
    rates = np.clip(np.cumsum(body[d]) / den, 0.0, None)
    return StepCurve((d + 1).astype(np.int64), np.maximum.accumulate(rates))


def shards_error(trace: BlockTrace, rate: float, warmup: float, n_accesses: int) -> dict[str, Any]:
    """Measured error of the sampled curve against the exact one on a prefix of the trace."""
    n_req, acc, n_ids = _prefix_requests(trace, n_accesses)
    first = first_counted_request(n_req, warmup)
    sampled = shards_curve(trace, rate, first, n_accesses)
    offsets = trace.offsets[: n_req + 1]
    hist = lru_histogram(
        trace.block_ids,
        offsets,
        trace.prompt_tokens,
        np.empty(0, np.int64),
        trace.block_size,
        first,
        n_ids,
        True,
    )
    exact = exact_curve(hist, int(trace.prompt_tokens[first:n_req].sum()))
    out = {"checked_requests": n_req, "checked_accesses": acc}
    if exact.full_blocks == 0:
        return {**out, "max_abs_error": 0.0, "mean_abs_error": 0.0}
    caps = np.unique(np.round(np.geomspace(1, exact.full_blocks, 100)).astype(np.int64))
    err = np.array([abs(sampled.at(int(c)) - exact.at(int(c))) for c in caps])
    return {**out, "max_abs_error": float(err.max()), "mean_abs_error": float(err.mean())}


def _default_capacities(curve: StepCurve, block_size: int) -> tuple[int, ...]:
    if curve.full_blocks == 0:
        return ()
    top = float(curve.rates[-1])
    caps = []
    for f in (0.25, 0.5, 0.75, 0.9):
        b = curve.smallest_reaching(f * top)
        if b:
            caps.append(b * block_size)
    return tuple(sorted(set(caps)))


@dataclass(frozen=True, slots=True)
class TraceShape:
    """What each way of measuring reuse (the in-memory scan here, the lazy frame of
    :mod:`analyzer.reuse.frame`) knows of a trace before measuring it."""

    block_size: int
    n_requests: int
    n_accesses: int
    n_blocks: int  # distinct blocks
    all_prompt_tokens: int  # every request's, the warm-up's too


def make_report(
    opts: ReuseOptions, shape: TraceShape, *, reason: str | None = None, **measured: Any
) -> ReuseReport:
    """The one place a :class:`ReuseReport` is built, by both ways of measuring: the
    fields that follow from the options and the trace's shape are set here, so the two
    cannot disagree on them; ``measured`` holds what the measurement found (every other
    field). With a ``reason`` the trace could not be measured, and ``measured`` is empty."""
    first = first_counted_request(shape.n_requests, opts.warmup)
    common: dict[str, Any] = {
        "block_size": shape.block_size,
        "warmup": opts.warmup,
        "n_requests": shape.n_requests,
        "counted_requests": shape.n_requests - first,
        "n_accesses": shape.n_accesses,
        "n_blocks": shape.n_blocks,
        "bytes_per_token": opts.bytes_per_token,
        "curve_points": opts.curve_points,
    }
    if reason is not None:
        assert not measured, "an unmeasurable trace has no measured fields"
        return ReuseReport(
            measurable=False,
            reason=reason,
            prompt_tokens=shape.all_prompt_tokens,
            hit_tokens=0,
            ceiling_hit_rate=0.0,
            cold_ceiling_hit_rate=0.0,
            **common,
        )
    return ReuseReport(measurable=True, reason=None, **common, **measured)


def _shape(trace: BlockTrace) -> TraceShape:
    return TraceShape(
        block_size=trace.block_size,
        n_requests=trace.n_requests,
        n_accesses=trace.n_accesses,
        n_blocks=trace.n_blocks,
        all_prompt_tokens=int(trace.prompt_tokens.sum()),
    )


def _unmeasurable(trace: BlockTrace, opts: ReuseOptions, reason: str) -> ReuseReport:
    return make_report(opts, _shape(trace), reason=reason)


# -- the analysis ------------------------------------------------------------------


def _needs_next_use(name: str) -> bool:
    """The policy orders leaves by next use (Belady): the simulation passes next uses in."""
    entry = get_policy(name)
    return entry.leaf and bool(getattr(entry.reference, "needs_next_use", False))


def analyze_reuse(
    trace: BlockTrace, opts: ReuseOptions | None = None, advance: Advance | None = None
) -> ReuseReport:
    """Full reuse report; ``advance`` receives percentage points (100 in all)."""
    opts = opts or ReuseOptions()
    step = advance or (lambda _n: None)
    if trace.count_only:
        return _unmeasurable(
            trace,
            opts,
            "this trace has token counts only (no prompt content or block hashes), so "
            "prefix reuse cannot be measured from it; use logs with prompts or block hashes",
        )
    if trace.n_requests == 0:
        return _unmeasurable(trace, opts, "the trace has no requests")
    n = trace.n_requests
    first = first_counted_request(n, opts.warmup)
    bs = trace.block_size
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    n_windows = max(1, opts.n_windows) if span > 0 else 1
    window_s = span / n_windows if span > 0 else 0.0
    rate = opts.shards_rate
    if rate is None and trace.n_accesses > opts.shards_threshold_accesses:
        rate = opts.shards_auto_rate
    sampled = rate is not None and rate < 1.0
    scan = reuse_scan(
        trace.block_ids,
        trace.offsets,
        trace.prompt_tokens,
        trace.arrival_s,
        trace.session,
        trace.tenant,
        bs,
        first,
        trace.n_blocks,
        window_s,
        n_windows,
        TIME_EDGES,
        not sampled,
    )
    hist_all, hist_cnt, dist_count, time_count, src, hits, parent, depth, ws, hit_per_req = scan
    step(40)
    prompt = trace.prompt_tokens
    steady, cold = _rates(hit_per_req, prompt, first)
    assert int(hist_cnt[:-1].sum()) == int(hit_per_req[first:].sum())
    den = int(prompt[first:].sum())

    curve_method = "exact"
    shards = None
    if sampled:
        assert rate is not None
        curve = shards_curve(trace, rate, first)
        curve_method = "shards"
        shards = {
            "rate": rate,
            "sampled_by": "splitmix64 of the chained block hash",
            **shards_error(trace, rate, opts.warmup, opts.shards_error_accesses),
        }
    else:
        curve = exact_curve(hist_cnt, den)
    cold_curve = exact_curve(hist_all, int(prompt.sum())) if curve_method == "exact" else None
    step(10)

    capacities, policy_points, notes = _policies(
        trace, trace.n_accesses, bs, opts, curve, first, den, step
    )
    sources, reuse_distance, reuse_time, working_set = _summaries(
        src,
        den,
        bool((trace.session >= 0).any()),
        bool((trace.tenant >= 0).any()),
        curve if sampled else None,
        dist_count,
        time_count,
        float(trace.arrival_s[0]),
        window_s,
        ws,
        trace.n_blocks,
        bs,
    )
    granularity = granularity_table(trace, first, opts.granularities, hit_per_req)
    step(5)
    non_prefix = non_prefix_reuse(trace, first, hit_per_req)
    tops = top_prefixes(trace, hits, parent, depth, opts.top_n)
    step(5)
    return make_report(
        opts,
        _shape(trace),
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
        top_prefixes=tops,
        granularity=granularity,
        non_prefix=non_prefix,
        reuse_distance=reuse_distance,
        reuse_time=reuse_time,
        working_set=working_set,
        breakdowns=breakdowns(hit_per_req, prompt, trace.tenant, trace.arrival_s, first),
    )


def _policies(
    trace: BlockTrace | None,
    n_accesses: int,
    block_size: int,
    opts: ReuseOptions,
    curve: StepCurve,
    first: int,
    den: int,
    step: Advance,
) -> tuple[tuple[int, ...], dict[str, list[tuple[int, float]]], list[str]]:
    """Capacities compared, the non-LRU policies' hit rates at them, and notes (40 points).

    ``trace`` (the dense block ids) is needed only when the policies are simulated: when
    ``n_accesses`` is within ``opts.policy_max_accesses``."""
    bs = block_size
    capacities = tuple(sorted(set(opts.capacities_tokens))) or _default_capacities(curve, bs)
    policy_points: dict[str, list[tuple[int, float]]] = {}
    notes: list[str] = []
    sim_policies = [p for p in opts.policies if p != "lru"]
    if sim_policies and capacities:
        if n_accesses > opts.policy_max_accesses:
            notes.append(
                f"{'/'.join(policy_label(p) for p in sim_policies)} not simulated: "
                f"{n_accesses:,} block accesses "
                f"exceed the per-capacity simulation limit of {opts.policy_max_accesses:,}"
            )
            step(40)
        else:
            assert trace is not None
            prompt = trace.prompt_tokens
            share = 40 / (len(sim_policies) * len(capacities))
            next_use = (
                next_use_requests(trace.block_ids, trace.offsets)
                if any(_needs_next_use(p) for p in sim_policies)
                else None
            )
            runs = [(p, cap) for p in sim_policies for cap in capacities]
            known: dict[tuple[str, int], int] = {}
            if "optimal" in sim_policies and get_policy("optimal").kernel == "optimal":
                assert next_use is not None
                # Belady at every capacity from one stack pass, where that is cheaper
                got = optimal_all(
                    trace.block_ids,
                    trace.offsets,
                    prompt,
                    bs,
                    first,
                    [cap // bs for cap in capacities],
                    next_use,
                )
                if got is not None:
                    known = {("optimal", cap): h for cap, h in zip(capacities, got, strict=True)}
                    runs = [run for run in runs if run not in known]
                    step(share * len(known))

            def one(run: tuple[str, int]) -> int:
                return simulate_fast(
                    trace.block_ids,
                    trace.offsets,
                    prompt,
                    bs,
                    first,
                    run[1] // bs,
                    run[0],
                    next_use,
                )

            hits = {**known, **_each(one, runs, opts.jobs, lambda: step(share))}
            for policy in sim_policies:
                policy_points[policy] = [
                    (cap, hits[(policy, cap)] / den if den else 0.0) for cap in capacities
                ]
    else:
        step(40)

    return capacities, policy_points, notes


def _each(
    fn: Callable[[tuple[str, int]], int],
    runs: list[tuple[str, int]],
    jobs: int,
    done: Callable[[], None],
) -> dict[tuple[str, int], int]:
    """``fn`` of every run, on up to ``jobs`` threads (the compiled simulations release
    the GIL), largest capacity first so the longest runs do not start last."""
    out: dict[tuple[str, int], int] = {}
    if jobs <= 1 or len(runs) <= 1:
        for r in runs:
            out[r] = fn(r)
            done()
        return out
    from concurrent.futures import ThreadPoolExecutor, as_completed

    with ThreadPoolExecutor(min(jobs, len(runs))) as pool:
        futures = {pool.submit(fn, r): r for r in sorted(runs, key=lambda r: -r[1])}
        for f in as_completed(futures):
            out[futures[f]] = f.result()
            done()
    return out


def _summaries(
    src: np.ndarray,
    den: int,
    sessions_known: bool,
    tenants_known: bool,
    sampled_curve: StepCurve | None,
    dist_count: np.ndarray | None,
    time_count: np.ndarray,
    t0: float,
    window_s: float,
    ws: np.ndarray,
    n_blocks: int,
    bs: int,
) -> tuple[ReuseSources, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Sources, reuse distance, reuse time and working set sections of the report.

    ``sampled_curve``: the SHARDS curve, whose percentiles stand for the distances
    (``dist_count`` is then unused)."""
    hit_total = int(src.sum())
    sources = ReuseSources(
        hit_tokens_by_source={k: int(v) for k, v in zip(SOURCE_KEYS, src, strict=True)},
        share_of_hits={
            k: (int(v) / hit_total if hit_total else 0.0)
            for k, v in zip(SOURCE_KEYS, src, strict=True)
        },
        share_of_prompt={
            k: (int(v) / den if den else 0.0) for k, v in zip(SOURCE_KEYS, src, strict=True)
        },
        sessions_known=sessions_known,
        tenants_known=tenants_known,
    )

    if sampled_curve is not None:
        curve = sampled_curve
        # token-weighted percentiles of the sampled distances: where the curve reaches p %
        top = float(curve.rates[-1]) if curve.rates.size else 0.0
        dist_pct = {
            f"p{p}": (float(curve.smallest_reaching(p / 100 * top) or 0) if top > 0 else None)
            for p in PERCENTILES
        }
        weighting = "prefix-hit tokens, estimated from the SHARDS sample"
    else:
        assert dist_count is not None
        dist_values = np.arange(dist_count.size, dtype=np.float64)
        dist_pct = _percentiles_from_counts(dist_values, dist_count)
        weighting = "hit block accesses"
    reuse_distance = {
        "unit": "distinct blocks touched since the block's previous use (LRU stack distance)",
        "weighting": weighting,
        "hit_accesses": int(time_count.sum()),
        "blocks": dist_pct,
        "tokens": {k: (None if v is None else v * bs) for k, v in dist_pct.items()},
    }
    upper = np.concatenate([TIME_EDGES, [np.inf]])
    reuse_time = {
        "unit": "seconds since the previous request holding the block "
        "(upper edge of a 50-per-decade log bin)",
        "hit_accesses": int(time_count.sum()),
        **{k: v for k, v in _percentiles_from_counts(upper, time_count).items()},
    }
    working_set = {
        "window_s": window_s,
        "windows": [
            {
                "start_s": t0 + i * window_s,
                "distinct_blocks": int(c),
                "distinct_tokens": int(c) * bs,
            }
            for i, c in enumerate(ws)
        ],
        "peak_distinct_tokens": int(ws.max()) * bs if ws.size else 0,
        "total_distinct_tokens": n_blocks * bs,
    }
    return sources, reuse_distance, reuse_time, working_set
