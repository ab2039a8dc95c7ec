"""Hit rate against cache size: the LRU step curve from an exact stack-distance
histogram or from a SHARDS sample, the rule that picks the sample, the sample's measured
error, and the other policies (FIFO, S3-FIFO, Belady) simulated at chosen capacities.

SHARDS after Waldspurger et al., "Efficient MRC Construction with SHARDS" (FAST'15),
with the SHARDS-adj correction and stratified by use: the most used blocks are kept at
rate 1 (:class:`ShardsSampling`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

from analyzer.cache.kernels import next_use_requests, optimal_all, simulate_fast
from analyzer.cache.policies import get_policy
from analyzer.cache.policies import label as policy_label
from analyzer.cache.stack import splitmix64
from analyzer.progress import Advance
from analyzer.reuse.records import EMPTY_CURVE, ReuseOptions, StepCurve
from analyzer.trace import BlockTrace

SAMPLED_BY = "splitmix64 of the chained block hash"


def exact_curve(hist: np.ndarray, denominator: int) -> StepCurve:
    """Step curve from a stack-distance histogram (last bin = never seen)."""
    body = hist[:-1]
    d = np.flatnonzero(body)
    if d.size == 0 or denominator == 0:
        return EMPTY_CURVE
    return StepCurve((d + 1).astype(np.int64), np.cumsum(body[d]) / denominator)


def shards_adjusted_curve(hist: np.ndarray, counted_tokens: float, denominator: int) -> StepCurve:
    """Step curve from a SHARDS histogram (estimated tokens by estimated distance, last
    bin first uses). The gap between the estimated and the true counted block tokens is
    credited to distance 0 (SHARDS-adj), so the curve ends at the exact ceiling's scale."""
    if counted_tokens == 0 or denominator == 0:
        return EMPTY_CURVE
    body = hist[:-1].copy()
    body[0] += counted_tokens - float(hist.sum())
    d = np.flatnonzero(body)
    if d.size == 0:
        return EMPTY_CURVE
    rates = np.clip(np.cumsum(body[d]) / denominator, 0.0, None)
    return StepCurve((d + 1).astype(np.int64), np.maximum.accumulate(rates))


@dataclass(frozen=True, slots=True)
class ShardsSampling:
    """Which blocks a SHARDS sample at ``rate`` keeps, and what each kept block stands for.

    A block is kept when a fixed 64-bit mix of its chained hash falls under
    ``rate x 2**32`` (deterministic, and the same block is kept in every request). Plain
    SHARDS lets a handful of very hot blocks (a shared system prompt) decide the error,
    so the ``rate x distinct`` most used blocks are also kept, at rate 1, and weighted as
    themselves; the others stand for ``1 / rate`` blocks each.
    """

    rate: float

    @property
    def unit(self) -> int:
        """The threshold on the mixed hash's upper 32 bits."""
        return max(1, round(self.rate * 2**32))

    @property
    def applied_rate(self) -> float:
        """The sampling rate actually applied (the threshold is an integer)."""
        return self.unit / 2**32

    def hot_count(self, n_ids: int) -> int:
        """How many of ``n_ids`` distinct blocks may be kept at rate 1 (0: none)."""
        n_hot = int(self.applied_rate * n_ids)
        return n_hot if 0 < n_hot < n_ids else 0

    def keeps(self, hashes: np.ndarray) -> np.ndarray:
        """Blocks kept by their hash (bool per hash)."""
        kept: np.ndarray = (splitmix64(hashes) >> np.uint64(32)) < np.uint64(self.unit)
        return kept

    def id_weight(self, hot: np.ndarray) -> np.ndarray:
        """Marker weight per kept block: ``unit`` when kept at rate 1, else ``2**32``."""
        return np.where(hot, np.int64(self.unit), np.int64(2**32)).astype(np.int64)


def hot_by_uses(uses: np.ndarray, n_hot: int) -> np.ndarray:
    """Blocks used more often than the ``n_hot``-th most used (bool per block): at most
    ``n_hot``, and deterministic (ties at the cut are left out)."""
    if n_hot <= 0:
        return np.zeros(uses.size, dtype=bool)
    cut = np.partition(uses, uses.size - n_hot)[uses.size - n_hot]
    hot: np.ndarray = uses > cut
    return hot


def curve_error(sampled: StepCurve, exact: StepCurve) -> tuple[float, float]:
    """(max, mean) absolute difference at 100 capacities spread log-evenly up to the
    exact curve's footprint."""
    if exact.full_blocks == 0:
        return 0.0, 0.0
    caps = np.unique(np.round(np.geomspace(1, exact.full_blocks, 100)).astype(np.int64))
    err = np.array([abs(sampled.at(int(c)) - exact.at(int(c))) for c in caps])
    return float(err.max()), float(err.mean())


# -- the other policies ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyComparison:
    """The capacities compared, each simulated policy's steady hit rate at them, and
    notes on what was not simulated."""

    capacities_tokens: tuple[int, ...]
    points: dict[str, list[tuple[int, float]]]
    notes: list[str]


def default_capacities(curve: StepCurve, block_size: int) -> tuple[int, ...]:
    """Where LRU reaches a quarter, a half, three quarters and 90 % of its ceiling."""
    if curve.full_blocks == 0:
        return ()
    top = curve.top_rate
    caps = []
    for f in (0.25, 0.5, 0.75, 0.9):
        b = curve.smallest_reaching(f * top)
        if b:
            caps.append(b * block_size)
    return tuple(sorted(set(caps)))


def _needs_next_use(name: str) -> bool:
    """The policy orders leaves by next use (Belady): the simulation passes next uses in."""
    entry = get_policy(name)
    return entry.leaf and bool(getattr(entry.reference, "needs_next_use", False))


def compare_policies(
    opts: ReuseOptions,
    curve: StepCurve,
    n_accesses: int,
    block_size: int,
    first: int,
    den: int,
    dense: Callable[[], BlockTrace],
    step: Advance,
) -> PolicyComparison:
    """The non-LRU policies of ``opts`` at its capacities (or LRU's knees), 40 points of
    progress. ``dense`` gives the trace as dense block ids; it is asked for only when the
    policies are simulated (``n_accesses`` within ``opts.policy_max_accesses``)."""
    bs = block_size
    capacities = tuple(sorted(set(opts.capacities_tokens))) or default_capacities(curve, bs)
    points: dict[str, list[tuple[int, float]]] = {}
    notes: list[str] = []
    sim_policies = [p for p in opts.policies if p != "lru"]
    if not sim_policies or not capacities:
        step(40)
        return PolicyComparison(capacities, points, notes)
    if n_accesses > opts.policy_max_accesses:
        notes.append(
            f"{'/'.join(policy_label(p) for p in sim_policies)} not simulated: "
            f"{n_accesses:,} block accesses "
            f"exceed the per-capacity simulation limit of {opts.policy_max_accesses:,}"
        )
        step(40)
        return PolicyComparison(capacities, points, notes)
    trace = dense()
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
            trace.block_ids, trace.offsets, prompt, bs, first, run[1] // bs, run[0], next_use
        )

    hits = {**known, **_each(one, runs, opts.jobs, lambda: step(share))}
    for policy in sim_policies:
        points[policy] = [(cap, hits[(policy, cap)] / den if den else 0.0) for cap in capacities]
    return PolicyComparison(capacities, points, notes)


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
    with ThreadPoolExecutor(min(jobs, len(runs))) as pool:
        futures = {pool.submit(fn, r): r for r in sorted(runs, key=lambda r: -r[1])}
        for f in as_completed(futures):
            out[futures[f]] = f.result()
            done()
    return out
