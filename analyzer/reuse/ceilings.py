"""Ceilings: the share of prompt tokens an unlimited cache with perfect routing would
serve, from per-request hit tokens, whichever way they were measured.

Steady counts the requests after the warm-up, cold counts every request; both are
token-weighted (hit tokens / prompt tokens). Given here: the ceilings at every cache
granularity (token-exact, the trace's block size and coarser ones), the reuse that is
not a prefix, and the steady ceiling per tenant and per hour of the trace.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from analyzer.reuse.records import (
    NO_CONTENT,
    Breakdowns,
    Granularity,
    GranularityCeiling,
    HourRow,
    NonPrefixReuse,
    TenantRow,
)


def token_rates(hit: np.ndarray, prompt: np.ndarray, first: int) -> tuple[float, float]:
    """(steady, cold) token-weighted rates of per-request ``hit`` tokens."""
    steady_den = int(prompt[first:].sum())
    cold_den = int(prompt.sum())
    steady = int(hit[first:].sum()) / steady_den if steady_den else 0.0
    cold = int(hit.sum()) / cold_den if cold_den else 0.0
    return steady, cold


def granularity_table(
    prompt: np.ndarray,
    token_lcp_prev: np.ndarray | None,
    first: int,
    sizes: tuple[int, ...],
    block_size: int,
    hits_at: Callable[[int], np.ndarray],
) -> Granularity:
    """Ceilings token-exact (from ``token_lcp_prev``, when ingest computed it) and at each
    block size derivable from the trace's hashes: ``hits_at(f)`` gives per-request hit
    tokens at ``f`` x ``block_size``."""
    if token_lcp_prev is not None:
        hit = np.clip(np.minimum(token_lcp_prev, prompt - 1), 0, None)
        steady, cold = token_rates(hit, prompt, first)
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
            steady, cold = token_rates(hits_at(size // block_size), prompt, first)
            rows.append(GranularityCeiling(size, True, hit_rate=steady, cold_hit_rate=cold))
    return Granularity(exact, tuple(rows))


def non_prefix_figures(
    content_seen: np.ndarray | None, prompt: np.ndarray, first: int, prefix_hit: np.ndarray
) -> NonPrefixReuse:
    """Tokens whose content was seen before at any position (per request), and the part
    of them beyond the prefix hits."""
    if content_seen is None:
        return NO_CONTENT
    content_steady, content_cold = token_rates(content_seen, prompt, first)
    prefix_steady, prefix_cold = token_rates(prefix_hit, prompt, first)
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


def breakdowns(
    hit: np.ndarray, prompt: np.ndarray, tenant: np.ndarray, arrival_s: np.ndarray, first: int
) -> Breakdowns | None:
    """Steady-state ceiling per tenant (codes in order of first appearance, -1 none) and
    per hour of the trace (None for a trace without requests)."""
    if arrival_s.size == 0:
        return None
    hour = ((arrival_s - arrival_s[0]) // 3600).astype(np.int64)
    p, h = prompt[first:], hit[first:]
    by_tenant = [
        TenantRow(
            tenant=key + 1 if key >= 0 else None,
            requests=n,
            prompt_tokens=pt,
            hit_tokens=ht,
            hit_rate=ht / pt if pt else 0.0,
        )
        for key, n, pt, ht in _grouped(tenant[first:].astype(np.int64), p, h)
    ]
    by_hour = [
        HourRow(
            hour=key, requests=n, prompt_tokens=pt, hit_tokens=ht, hit_rate=ht / pt if pt else 0.0
        )
        for key, n, pt, ht in _grouped(hour[first:], p, h)
    ]
    return {"by_tenant": by_tenant, "by_hour": by_hour, "note": BREAKDOWN_NOTE}


def _grouped(
    keys: np.ndarray, prompt: np.ndarray, hit: np.ndarray
) -> list[tuple[int, int, int, int]]:
    """(key, requests, prompt tokens, hit tokens) per distinct key, keys ascending; the
    sums in exact integers."""
    uniq, inv = np.unique(keys, return_inverse=True)
    n = np.bincount(inv, minlength=uniq.size)
    p = np.zeros(uniq.size, dtype=np.int64)
    h = np.zeros(uniq.size, dtype=np.int64)
    np.add.at(p, inv, prompt.astype(np.int64))
    np.add.at(h, inv, hit.astype(np.int64))
    return [(int(uniq[i]), int(n[i]), int(p[i]), int(h[i])) for i in range(uniq.size)]
