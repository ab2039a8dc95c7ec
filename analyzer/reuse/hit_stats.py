"""Where the counted prefix hits come from and how they spread: sources (same session,
same tenant, another tenant), reuse distance, reuse time, the working set per window and
the top shared prefixes, from the :class:`~analyzer.reuse.facts.CountedHits` either way
of reading a trace gives.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from analyzer.reuse.facts import PrefixCandidates
from analyzer.reuse.records import (
    NO_TOP_PREFIXES,
    SOURCE_KEYS,
    TIME_EDGES,
    TOP_PREFIXES_NOTE,
    Percentiles,
    ReuseDistance,
    ReuseSources,
    ReuseTime,
    SharedPrefix,
    StepCurve,
    TopPrefixes,
    WorkingSet,
    WorkingSetWindow,
)


def reuse_sources(
    source_tokens: np.ndarray, den: int, sessions_known: bool, tenants_known: bool
) -> ReuseSources:
    """Hit tokens by whose earlier request last held the block, with shares of the hits
    and of ``den`` (the counted prompt tokens)."""
    hit_total = int(source_tokens.sum())
    tokens = {k: int(v) for k, v in zip(SOURCE_KEYS, source_tokens, strict=True)}
    return ReuseSources(
        hit_tokens_by_source=tokens,
        share_of_hits={k: (v / hit_total if hit_total else 0.0) for k, v in tokens.items()},
        share_of_prompt={k: (v / den if den else 0.0) for k, v in tokens.items()},
        sessions_known=sessions_known,
        tenants_known=tenants_known,
    )


def _percentiles(at: Callable[[int], float | None]) -> Percentiles:
    return {"p50": at(50), "p90": at(90), "p99": at(99)}


def _scaled(pct: Percentiles, factor: int) -> Percentiles:
    def times(v: float | None) -> float | None:
        return None if v is None else v * factor

    return {"p50": times(pct["p50"]), "p90": times(pct["p90"]), "p99": times(pct["p99"])}


def _from_counts(values: np.ndarray, counts: np.ndarray) -> Percentiles:
    """Percentiles of ``values`` weighted by ``counts`` (None when there are none)."""
    total = int(counts.sum())
    cum = np.cumsum(counts)

    def at(p: int) -> float | None:
        if total == 0:
            return None
        i = int(np.searchsorted(cum, p / 100 * total, side="left"))
        return float(values[min(i, values.size - 1)])

    return _percentiles(at)


def reuse_distance(
    distances: np.ndarray | None, sampled_curve: StepCurve | None, hit_accesses: int, bs: int
) -> ReuseDistance:
    """Percentiles of the LRU stack distance of the counted hits: from the exact count of
    hit accesses per distance, or, on a SHARDS run, where the sampled curve reaches p %
    of its ceiling (token-weighted)."""
    if sampled_curve is not None:
        curve = sampled_curve
        top = curve.top_rate
        blocks = _percentiles(
            lambda p: float(curve.smallest_reaching(p / 100 * top) or 0) if top > 0 else None
        )
        weighting = "prefix-hit tokens, estimated from the SHARDS sample"
    else:
        assert distances is not None
        blocks = _from_counts(np.arange(distances.size, dtype=np.float64), distances)
        weighting = "hit block accesses"
    return {
        "unit": "distinct blocks touched since the block's previous use (LRU stack distance)",
        "weighting": weighting,
        "hit_accesses": hit_accesses,
        "blocks": blocks,
        "tokens": _scaled(blocks, bs),
    }


def reuse_time(time_count: np.ndarray) -> ReuseTime:
    """Percentiles of the time since the previous request holding each hit block, from
    hit accesses per bin of :data:`TIME_EDGES`."""
    pct = _from_counts(np.concatenate([TIME_EDGES, [np.inf]]), time_count)
    return {
        "unit": "seconds since the previous request holding the block "
        "(upper edge of a 50-per-decade log bin)",
        "hit_accesses": int(time_count.sum()),
        "p50": pct["p50"],
        "p90": pct["p90"],
        "p99": pct["p99"],
    }


def working_set(
    counts: np.ndarray, t0: float, window_s: float, n_blocks: int, bs: int
) -> WorkingSet:
    """Distinct blocks per window of ``window_s`` from ``t0``, and over the trace."""
    windows: list[WorkingSetWindow] = [
        {"start_s": t0 + i * window_s, "distinct_blocks": int(c), "distinct_tokens": int(c) * bs}
        for i, c in enumerate(counts)
    ]
    return {
        "window_s": window_s,
        "windows": windows,
        "peak_distinct_tokens": int(counts.max()) * bs if counts.size else 0,
        "total_distinct_tokens": n_blocks * bs,
    }


def top_prefixes(cands: PrefixCandidates, bs: int, top_n: int) -> TopPrefixes:
    """The ``top_n`` shared prefixes by reused tokens (then requests) and by requests
    (then length); ties go to the block seen first."""
    if not cands.any_hit:
        return NO_TOP_PREFIXES
    prefix_tokens = cands.blocks * bs
    volume = cands.requests * prefix_tokens
    preview = cands.preview

    by_volume = np.lexsort((cands.block_id, -cands.requests, -volume))[:top_n]
    by_count = np.lexsort((cands.block_id, -prefix_tokens, -cands.requests))[:top_n]
    listed = cands.block_id[np.concatenate([by_volume, by_count])]
    held = cands.holders(listed) if cands.holders is not None else {}

    def entry(i: int) -> SharedPrefix:
        b = int(cands.block_id[i])
        who = held.get(b)
        return SharedPrefix(
            block_id=b,
            hash_hex=f"{int(cands.hash[i]):016x}",
            prefix_blocks=int(cands.blocks[i]),
            prefix_tokens=int(prefix_tokens[i]),
            requests=int(cands.requests[i]),
            reused_tokens=int(volume[i]),
            preview=preview(b) if preview is not None else None,
            tenants=who.tenants if who is not None else None,
            models=who.models if who is not None else (),
        )

    return TopPrefixes(
        by_volume=tuple(entry(int(i)) for i in by_volume),
        by_count=tuple(entry(int(i)) for i in by_count),
        note=TOP_PREFIXES_NOTE,
    )
