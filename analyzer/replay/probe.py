"""One question the plan asks the replay: do ``N`` instances of this option meet the TTFT
SLO at this load?

:func:`probe` answers it with one run of :func:`analyzer.replay.engine.simulate` on the
cluster ``cfg`` resized to ``instances`` (their caches and router included: a pool, by
default the nodes' DRAM summed, and the nodes themselves follow the count) with the
trace's inter-arrival times multiplied by ``time_scale`` (0.5: twice the log's rate).
The SLO is the rate search's (:mod:`analyzer.replay.run`): at least 90 % of the measured
requests (after the warm-up) get their first token within ``ttft_slo_s`` (p90 TTFT <=
SLO, nearest rank). A run stops as soon as more measured requests have missed the SLO
than it allows, so a size that fails costs only the part of the replay that shows it;
a size that passes runs to the end and keeps its whole :class:`ScenarioResult` (hit
rates by tier, TTFT percentiles, links, what its tiers held), which the plan reports as
that option's figures.

The probe is built on :func:`analyzer.replay.run.resolve` and ``simulate`` alone, whose
signatures and ``RunStats`` meaning (``ttft_s`` of the measured requests, ``aborted``)
the engine keeps, so it answers the same question whatever the engine models inside.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from analyzer.errors import UsageError
from analyzer.replay.config import ClusterConfig, ScenarioSpec
from analyzer.replay.engine import TraceTree, simulate
from analyzer.replay.run import (
    SLO_QUANTILE,
    ScenarioResult,
    TtftSummary,
    resolve,
)
from analyzer.trace import BlockTrace


def allowed_misses(n_measured: int) -> int:
    """Measured requests that may miss the SLO while p90 TTFT still meets it."""
    return n_measured - math.ceil(SLO_QUANTILE * n_measured)


def measured_requests(trace: BlockTrace, warmup_fraction: float) -> int:
    """Requests counted in a replay of ``trace``: those after the warm-up."""
    n = trace.n_requests
    return n - int(warmup_fraction * n)


@dataclass(frozen=True, slots=True)
class Probe:
    """The answer for one option at one size and load.

    ``passed``: p90 TTFT of the measured requests within ``ttft_slo_s``. ``complete``:
    the run went to the end (every passing run does; a failing one stops once it has
    lost the SLO it was asked to lose, and then only knows that: its ``ttft_slo_s`` is
    that SLO, which may be looser than the question's). ``ttft`` holds the run's
    percentiles when it is complete (all None otherwise); ``result`` the whole run's
    figures then."""

    option: str
    instances: int
    time_scale: float  # the log's inter-arrival times x this (1 / the load multiple)
    ttft_slo_s: float
    passed: bool
    complete: bool
    requests: int  # measured requests
    missed: int  # measured requests over the SLO (of those replayed, when stopped early)
    ttft: TtftSummary = field(default_factory=TtftSummary)
    # A complete run: the TTFT that decides the p90 test at any SLO (nearest rank), and
    # the share of the time its instances' GPUs were busy.
    rank_s: float | None = None
    busy: float | None = None
    result: ScenarioResult | None = field(default=None, compare=False, repr=False)

    @property
    def load(self) -> float:
        """The load replayed, as a multiple of the log's own arrival rate."""
        return 1.0 / self.time_scale

    def passes(self, slo_s: float) -> bool | None:
        """Whether this run meets ``slo_s``; None when it cannot say (a run stopped
        once it lost its own SLO only knows that every SLO up to that one fails)."""
        if self.rank_s is not None:
            return self.rank_s <= slo_s
        return False if slo_s <= self.ttft_slo_s else None

    def without_result(self) -> Probe:
        """This probe without its run's figures (what a search keeps of the sizes it
        did not choose)."""
        return replace(self, result=None)


def probe(
    trace: BlockTrace,
    cfg: ClusterConfig,
    spec: ScenarioSpec,
    *,
    instances: int,
    time_scale: float,
    ttft_slo_s: float,
    cost: Any,
    sampling_rate: float = 1.0,
    tree: TraceTree | None = None,
    prefill_s: Callable[[int, int], float] | None = None,
    stop_slo_s: float | None = None,
) -> Probe:
    """Whether ``instances`` instances of ``spec`` on ``cfg`` keep p90 TTFT within
    ``ttft_slo_s`` when the log arrives with its gaps multiplied by ``time_scale``.

    ``sampling_rate`` below 1: ``trace`` is a miniature sampled at that rate
    (:func:`analyzer.replay.miniature.sample`): its caches are scaled by it and its
    requests arrive ``1 / sampling_rate`` times faster, at the whole trace's load.
    ``tree`` is the trace's :class:`TraceTree` when the caller probes it more than once;
    ``prefill_s`` a remembered ``cost.compute_time_s`` shared by the caller's probes.
    ``stop_slo_s`` (at least ``ttft_slo_s``): a failing run goes on until it has lost
    this looser SLO too, so that it answers a later question at any SLO up to it (it
    stops sooner at its own SLO by default)."""
    if instances < 1:
        raise UsageError(f"a probe needs at least one instance, got {instances}")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise UsageError(f"time scale must be a positive number, got {time_scale}")
    if not (ttft_slo_s > 0 and math.isfinite(ttft_slo_s)):
        raise UsageError("--ttft-slo must be a positive number of seconds")
    lost_at = ttft_slo_s if stop_slo_s is None else max(ttft_slo_s, stop_slo_s)
    if not math.isfinite(lost_at):
        raise UsageError(f"a probe's stop SLO must be finite, got {stop_slo_s}")
    sized = replace(cfg, instances=instances)
    res = resolve(
        sized,
        spec,
        trace.block_size,
        cost=cost,
        prefill_s=prefill_s,
        sampling_rate=sampling_rate,
    )
    n = measured_requests(trace, res.plan.warmup_fraction)
    allowed = allowed_misses(n)
    stats = simulate(
        trace,
        res.plan,
        res.cluster.time_scale * time_scale * sampling_rate,
        slo_abort=(lost_at, allowed),
        tree=tree,
    )
    missed = int(np.count_nonzero(stats.ttft_s > ttft_slo_s))
    passed = not stats.aborted and missed <= allowed
    if stats.aborted:  # it lost ``lost_at``, and so every SLO up to it
        return Probe(spec.name, instances, time_scale, lost_at, False, False, n, missed)
    run = ScenarioResult(spec, res, stats, None, 1.0 / sampling_rate)
    return Probe(
        spec.name,
        instances,
        time_scale,
        ttft_slo_s,
        passed,
        True,
        n,
        missed,
        run.ttft,
        deciding_ttft_s(stats.ttft_s),
        stats.gpu_s_all / res.plan.tp / (instances * stats.duration_s)
        if stats.duration_s > 0
        else 0.0,
        run,
    )


def deciding_ttft_s(ttft_s: np.ndarray) -> float:
    """The TTFT that decides the p90 test: the smallest SLO these TTFTs meet (the
    ``k``-th smallest, ``k`` = the requests that must meet it; 0 without requests)."""
    if not ttft_s.size:
        return 0.0
    k = int(ttft_s.size) - allowed_misses(int(ttft_s.size))
    return float(np.partition(ttft_s, k - 1)[k - 1])
