"""The grid of arrival-rate multiples the SLO search walks, and the walk itself.

The rates searched are ``STEP ** (j / GRID)`` for integer ``j`` from ``J_BOTTOM`` (1/1024x)
to ``J_TOP`` (64x), about 4.4% apart. :func:`search_grid` gallops from a start
(:func:`first_guess`) until the answer flips, then bisects, asking at most ``MAX_RUNS``
grid points; :func:`analyzer.replay.run.find_max_rate` asks them by replaying the trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from analyzer.replay.engine import Plan, RunStats

STEP = 4.0  # the bracket grows or shrinks by this factor
MAX_UP = 3  # rate multiples searched up to 4**3 = 64
MAX_DOWN = 5  # and down to 4**-5 = 1/1024
BISECTIONS = 5  # final bracket ratio 4**(1/32) = 2**(1/16): about 4.4% precision
GRID: int = 2**BISECTIONS  # grid points per factor STEP: the rates searched are STEP ** (j / GRID)
J_TOP = MAX_UP * GRID  # 64x
J_BOTTOM = -MAX_DOWN * GRID  # 1/1024x
# Most runs one search takes: galloping across the whole grid, then bisecting the last step.
MAX_RUNS = 2 * math.ceil(math.log2(J_TOP - J_BOTTOM)) + 1
SLO_QUANTILE = 0.9
# The prefill share of the GPUs' time at which an aggregated replay's p90 TTFT reaches a
# 2 s SLO: 0.52 to 0.55 for the four standard scenarios on the Mooncake conversation
# trace (8 H100s, Llama-3.1-8B). Only where the rate search starts (first_guess).
AGGREGATED_PREFILL_AT_SLO = 0.53


def _allowed(n_measured: int) -> int:
    """Measured requests that may miss the SLO while p90 still meets it."""
    return n_measured - math.ceil(SLO_QUANTILE * n_measured)


def _passes(stats: RunStats, slo_s: float) -> bool:
    ttft = stats.ttft_s
    return not stats.aborted and int(np.count_nonzero(ttft > slo_s)) <= _allowed(int(ttft.size))


def grid_rate(j: int) -> float:
    """The ``j``-th rate of the search's grid: ``STEP ** (j / GRID)`` (1 at ``j = 0``)."""
    return float(STEP ** (j / GRID))


class UnknownPoint(LookupError):
    """:func:`find_max_rate` with ``simulate_missing=False`` met a rate its known points
    do not decide."""


def first_guess(stats: RunStats, plan: Plan) -> int:
    """Grid index of the rate at which the busiest-on-average GPU would be saturated
    (1 / mean busy fraction at rate 1): where the search looks first. Only a starting
    point: the search's answer does not depend on it (see :func:`find_max_rate`).

    An aggregated engine's steps also decode: its p90 TTFT leaves the SLO when prefill
    fills about half of the GPUs' time (:data:`AGGREGATED_PREFILL_AT_SLO`), so that is
    where its search starts."""
    busy = (
        stats.gpu_s_all / plan.tp / (plan.instances * stats.duration_s) if stats.duration_s else 0
    )
    if plan.serving == "aggregated":
        busy /= AGGREGATED_PREFILL_AT_SLO
    if not busy > 0:
        return J_TOP
    j: int = round(GRID * math.log(1 / busy) / math.log(STEP))
    return max(J_BOTTOM, min(J_TOP, j))


def search_grid(
    ok: Callable[[int], bool], passed_at_1: bool, guess: int | None = None
) -> tuple[int | None, int | None]:
    """The grid indices ``(lo, hi)`` with ``ok(lo)`` and not ``ok(hi = lo + 1)``, found
    from the start ``guess`` by galloping away from it (steps of 2, 4, 8... grid points,
    up while it passes, down while it fails) until the answer flips, then bisecting. ``lo`` is None when ``ok(J_BOTTOM)`` fails, ``hi`` None when
    ``ok(J_TOP)`` passes. ``ok(0)`` is ``passed_at_1`` and is not asked again; no
    index is asked twice, and at most ``MAX_RUNS`` are asked."""
    lo: int | None = 0 if passed_at_1 else None  # highest grid index known to pass
    hi: int | None = None if passed_at_1 else 0  # lowest grid index known to fail
    j = guess if guess is not None else (J_TOP if passed_at_1 else J_BOTTOM) // 2
    j = max(j, lo + 1) if lo is not None else min(j, hi - 1)  # type: ignore[operator]
    j = min(max(j, J_BOTTOM), J_TOP)
    asked = 1
    up = ok(j)  # then gallop that way until the answer flips
    if up:
        lo = j
    else:
        hi = j
    step = 2
    while True:
        if up:
            if lo == J_TOP or (hi is not None and lo + step >= hi):  # type: ignore[operator]
                break
            j = min(lo + step, J_TOP)  # type: ignore[operator]
        else:
            if hi == J_BOTTOM or (lo is not None and hi - step <= lo):  # type: ignore[operator]
                break
            j = max(hi - step, J_BOTTOM)  # type: ignore[operator]
        step *= 2
        asked += 1
        if ok(j):
            lo = j
            if not up:
                break
        else:
            hi = j
            if up:
                break
    if lo is None or hi is None:
        return lo, hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        asked += 1
        if ok(mid):
            lo = mid
        else:
            hi = mid
    assert asked <= MAX_RUNS
    return lo, hi
