"""Replays remembered per scenario, keyed by exactly the settings each scenario reads.

A what-if tool changes one setting at a time. Most settings matter to only some of the
deployment options: the pool's bandwidth never reaches the ``local`` or ``none``
scenarios, the host DRAM link never reaches ``local``. :class:`ReplayMemo` keeps each
scenario's result under a key from which the settings it never reads are removed
(:func:`scenario_key`), so a change re-runs only the scenarios it can move; the others
come back from memory. ``ReplayMemo.run`` takes the same arguments as
:func:`analyzer.replay.run_replay` and returns the same result: a remembered scenario is
re-resolved for the settings asked (its capacities and links are reported as asked),
and its simulation, which those settings cannot reach, is reused; a replay with the rate
search also answers the same replay without it (its first run). ``tests/test_replay_memo``
checks that against a fresh replay for every setting the key leaves out.

The memo is bounded (least recently used entries go first) and safe to share between
threads (the dashboard prefetches likely next settings in the background).

``ReplayMemo(record=True)`` replays with recordings (``run_replay(..., record=True)``),
kept on the most recent results up to :data:`RECORDED_REQUESTS`; ``run(..., only_known=True,
repriced=[])`` then answers a scenario whose replay differs from a remembered one only
in link bandwidths and latencies by re-pricing that replay
(:func:`analyzer.replay.reprice.reprice_scenario`) instead of raising
:class:`NotRemembered`, and says so (a :class:`Repriced` per scenario, appended to the
list). A re-priced result is never remembered as a replay.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, fields, replace
from typing import Any

from analyzer.progress import Advance
from analyzer.replay.config import (
    DEFAULT_SCENARIOS,
    ClusterConfig,
    ScenarioSpec,
    select_scenarios,
)
from analyzer.replay.miniature import sample
from analyzer.replay.reprice import Unrepriceable, reprice_scenario
from analyzer.replay.run import (
    ReplayResult,
    UnknownPoint,
    resolve,
    run_replay,
    sampling_rate,
    search_again,
)

# Settings only a tier's scenarios read. The pool's default capacity is the nodes' DRAM
# summed, so a pooled scenario keeps the DRAM sizes in its key.
POOL_FIELDS = frozenset(
    {"pool_capacity_tokens", "pool_tier", "pool_gbps", "pool_aggregate_gbps", "pool_latency_s"}
)
DRAM_FIELDS = frozenset(
    {
        "dram_capacity_tokens",
        "dram_scope",
        "dram_capacity_gb",
        "dram_tier",
        "dram_gbps",
        "dram_latency_s",
    }
)
NVME_FIELDS = frozenset(
    {"nvme_capacity_tokens", "nvme_capacity_gb", "nvme_tier", "nvme_gbps", "nvme_latency_s"}
)
_DEFAULTS = {f.name: f.default for f in fields(ClusterConfig)}
# Settings a re-pricing may answer for: the links' speeds and latencies, and the catalog
# tiers that give them (the resolved plans are compared, analyzer.replay.reprice).
TIMING_FIELDS = frozenset(
    {
        "pool_tier",
        "pool_gbps",
        "pool_aggregate_gbps",
        "pool_latency_s",
        "dram_tier",
        "dram_gbps",
        "dram_latency_s",
        "nvme_tier",
        "nvme_gbps",
        "nvme_latency_s",
    }
)
# Requests recorded (summed over every run kept, about 350 bytes each) that the most
# recent results keep; older results lose their recordings. An analysis of the bundled
# ``mixed`` sample records about 80,000.
RECORDED_REQUESTS = 400_000


@dataclass(frozen=True, slots=True)
class Repriced:
    """A scenario answered by re-pricing a remembered replay rather than replaying it.

    ``link_gbps``: per tier (``dram``, ``nvme``, ``pool``) the bandwidth it was replayed
    at and the one asked, where they differ; ``exact``, ``main_exact``, ``runs``,
    ``reordered``, ``rerouted``: as :class:`analyzer.replay.reprice.RepricedScenario`."""

    scenario: str
    link_gbps: tuple[tuple[str, float | None, float | None], ...]
    exact: bool
    main_exact: bool
    runs: int
    reordered: int
    rerouted: int


def unread_fields(spec: ScenarioSpec) -> frozenset[str]:
    """The cluster settings a scenario's replay never reads."""
    out: set[str] = set()
    if not spec.pool:
        out |= POOL_FIELDS
    if not spec.dram and not spec.pool:
        out |= DRAM_FIELDS
    if not spec.nvme:
        out |= NVME_FIELDS
    return frozenset(out)


def scenario_key(cfg: ClusterConfig, spec: ScenarioSpec) -> ClusterConfig:
    """``cfg`` with the settings ``spec`` never reads put back to their defaults."""
    defaults: dict[str, Any] = {name: _DEFAULTS[name] for name in unread_fields(spec)}
    return replace(cfg, **defaults)


def _recordings(got: Any, points: tuple[Any, ...]) -> list[Any]:
    """The recordings a remembered result and its search points hold."""
    out = [got.stats.recording] if got.stats.recording is not None else []
    searched = got.search.points if got.search is not None else ()
    return out + [p.recording for p in (*points, *searched) if p.recording is not None]


class NotRemembered(LookupError):
    """A replay asked with ``only_known=True`` that would have to simulate a scenario."""

    def __init__(self, scenarios: list[str]) -> None:
        super().__init__(f"not remembered: {', '.join(scenarios)}")
        self.scenarios = scenarios


class ReplayMemo:
    """Per-scenario replay results, remembered under :func:`scenario_key`."""

    def __init__(self, max_entries: int = 96, record: bool = False) -> None:
        self.max_entries = max_entries
        self.record = record
        self.repriced = 0  # scenarios answered by re-pricing
        self._lock = threading.Lock()
        self._results: OrderedDict[Hashable, Any] = OrderedDict()
        # Per scenario and settings, whatever the SLO: one result (its run at the
        # trace's rate) and the points of every rate search it had, so that a new SLO
        # re-reads them (analyzer.replay.run.search_again).
        self._searched: OrderedDict[Hashable, tuple[Any, tuple[Any, ...]]] = OrderedDict()
        self.runs = 0  # scenarios actually simulated (misses)
        self.hits = 0
        self.searched_again = 0  # scenarios whose rate search alone ran again (a new SLO)

    def _key(
        self,
        trace_key: Hashable,
        cost_key: Hashable,
        cfg: ClusterConfig,
        spec: ScenarioSpec,
        slo: float,
        search: bool,
        full_replay: bool = False,
    ) -> Hashable:
        return (
            trace_key,
            cost_key,
            scenario_key(cfg, spec),
            spec,
            slo if search else None,
            search,
            full_replay,
        )

    def _base(self, key: Hashable) -> Hashable:
        """A result's key without its SLO and search flag (full or miniature kept)."""
        assert isinstance(key, tuple)
        return key[:4] + key[6:]

    def _keep(self, key: Hashable, got: Any) -> None:
        """Remember ``got`` under ``key`` (the lock held), and its run and search points."""
        self._results[key] = got
        self._results.move_to_end(key)
        base = self._base(key)
        _, points = self._searched.get(base, (None, ()))
        if got.search is not None:
            points = tuple({*points, *got.search.points})
        self._searched[base] = (got, points)
        self._searched.move_to_end(base)
        while len(self._results) > self.max_entries:
            self._results.popitem(last=False)
        while len(self._searched) > self.max_entries:
            self._searched.popitem(last=False)
        self._forget_old_recordings()

    def _forget_old_recordings(self) -> None:
        """Keep recordings on the most recent results up to :data:`RECORDED_REQUESTS`
        recorded requests, drop the others' (the lock held): they only serve
        re-pricing, and cost memory."""
        recent: list[tuple[Any, tuple[Any, ...]]] = []
        total = 0
        for got, points in reversed(self._searched.values()):
            runs = {id(r): len(r.picks) for r in _recordings(got, points)}
            total += sum(runs.values())
            if recent and total > RECORDED_REQUESTS:
                break
            recent.append((got, points))
        keep = {id(got.stats) for got, _ in recent}
        keep_points = {id(points) for _, points in recent}
        for base, (got, points) in list(self._searched.items()):
            if id(points) not in keep_points and any(p.recording is not None for p in points):
                self._searched[base] = (got, tuple(replace(p, recording=None) for p in points))
        for got in [*self._results.values(), *(g for g, _ in self._searched.values())]:
            if id(got.stats) in keep:  # (a result without the search shares its stats)
                continue
            got.stats.recording = None
            if got.search is not None and any(p.recording is not None for p in got.search.points):
                got.search = replace(
                    got.search,
                    points=tuple(replace(p, recording=None) for p in got.search.points),
                )

    def _reprice(  # type: ignore[no-untyped-def]
        self,
        trace,
        cfg: ClusterConfig,
        specs: list[ScenarioSpec],
        ttft_slo_s: float,
        search_rate: bool,
        cost,
        trace_key: Hashable,
        cost_key: Hashable,
        full_replay: bool,
    ) -> dict[str, tuple[Any, Repriced]]:
        """The scenarios of ``specs`` that a remembered replay differing only in link
        bandwidths and latencies re-prices, the most recent such replay first."""

        timing: dict[str, Any] = {f: _DEFAULTS[f] for f in TIMING_FIELDS}
        with self._lock:
            candidates = list(reversed(self._searched.items()))
        out: dict[str, tuple[Any, Repriced]] = {}
        for s in specs:
            want = replace(scenario_key(cfg, s), **timing)
            for base, (old, points) in candidates:
                assert isinstance(base, tuple)
                if base[0] != trace_key or base[1] != cost_key or base[3] != s:
                    continue
                if base[4] != full_replay or replace(base[2], **timing) != want:
                    continue
                if old.stats.recording is None:
                    continue
                res = resolve(
                    cfg,
                    s,
                    trace.block_size,
                    cost=cost,
                    # The same cost model (same key): its remembered compute times too.
                    prefill_s=old.resolved.plan.prefill_s,
                    sampling_rate=1.0 / old.scale,
                )
                try:
                    got = reprice_scenario(trace, old, res, ttft_slo_s, search_rate, points)
                except Unrepriceable:
                    continue
                was = old.resolved
                links = tuple(
                    (tier, getattr(was, f"{tier}_gbps"), getattr(res, f"{tier}_gbps"))
                    for tier in ("dram", "nvme", "pool")
                    if getattr(was, f"{tier}_gbps") != getattr(res, f"{tier}_gbps")
                )
                out[s.name] = (
                    got.result,
                    Repriced(
                        s.name,
                        links,
                        got.exact,
                        got.main_exact,
                        got.runs,
                        got.reordered,
                        got.rerouted,
                    ),
                )
                break
        with self._lock:
            self.repriced += len(out)
        return out

    def known(
        self,
        trace_key: Hashable,
        cost_key: Hashable,
        cfg: ClusterConfig,
        scenario: str | ScenarioSpec,
        ttft_slo_s: float,
        search_rate: bool,
    ) -> bool:
        """Whether this scenario's replay is remembered."""
        (spec,) = select_scenarios([scenario])
        with self._lock:
            return (
                self._key(trace_key, cost_key, cfg, spec, ttft_slo_s, search_rate) in self._results
            )

    def _search_again(  # type: ignore[no-untyped-def]
        self,
        trace,
        specs: list[ScenarioSpec],
        keys: dict[str, Hashable],
        ttft_slo_s: float,
        advance: Advance | None,
        on_run: Callable[[str], None] | None,
        only_known: bool,
    ) -> dict[str, Any]:
        """The scenarios of ``specs`` replayed before under the same settings (another SLO,
        or no search), with the rate search for ``ttft_slo_s`` from their points; those
        needing a run the points do not decide are left out when ``only_known``."""

        with self._lock:
            before = {
                s.name: self._searched[self._base(keys[s.name])]
                for s in specs
                if self._base(keys[s.name]) in self._searched
            }
        out: dict[str, Any] = {}
        for name, (old, points) in before.items():
            simulated = [0.0]

            def counted(n: float, simulated: list[float] = simulated) -> None:
                simulated[0] += n
                if advance is not None:
                    advance(n)

            try:
                got = search_again(
                    trace,
                    old,
                    ttft_slo_s,
                    known=points,
                    advance=counted,
                    simulate_missing=not only_known,
                    record=self.record,
                )
            except UnknownPoint:
                continue
            # A point the earlier searches lacked (or could not decide) was simulated.
            if on_run is not None and simulated[0] > 0:
                on_run(name)
            with self._lock:
                self.searched_again += 1
                self._keep(keys[name], got)
            out[name] = got
        return out

    def run(  # type: ignore[no-untyped-def]
        self,
        trace,
        cfg: ClusterConfig,
        scenarios=DEFAULT_SCENARIOS,
        ttft_slo_s: float = 2.0,
        search_rate: bool = True,
        advance: Advance | None = None,
        cost=None,
        workers: int = 1,
        full_replay: bool = False,
        *,
        trace_key: Hashable,
        cost_key: Hashable | None = None,
        on_run: Callable[[str], None] | None = None,
        only_known: bool = False,
        pool: Any = None,
        repriced: list[Repriced] | None = None,
    ):
        """:func:`run_replay` with remembered scenarios reused.

        ``trace_key`` names the trace (its content hash); ``cost_key`` the cost model when
        one is given (None: the catalog model of ``cfg``). ``on_run(name)`` is called for
        every scenario that is really simulated. With ``only_known`` nothing is simulated:
        a scenario not remembered raises :class:`NotRemembered` (the dashboard decides
        at once from what it has, and replays the rest in the background). ``pool``: the
        worker processes to replay in (:func:`analyzer.replay.run.worker_pool`).
        ``repriced`` (with ``only_known``): a scenario not remembered is re-priced from
        a remembered replay when only link speeds differ (see the module docstring),
        and its :class:`Repriced` appended to this list."""

        specs = select_scenarios(scenarios)
        ck = (
            cost_key
            if cost is not None
            else ("catalog", cfg.model, cfg.gpu, cfg.tp, cfg.kv_dtype, cfg.mfu)
        )
        keys = {
            s.name: self._key(trace_key, ck, cfg, s, ttft_slo_s, search_rate, full_replay)
            for s in specs
        }
        with self._lock:
            found = {n: self._results[k] for n, k in keys.items() if k in self._results}
            for k in keys.values():
                if k in self._results:
                    self._results.move_to_end(k)
        missing = [s for s in specs if s.name not in found]
        if search_rate and missing:
            # Replayed before for another SLO (or without the search): only the search
            # runs again, re-reading the points it has.
            again = self._search_again(
                trace, missing, keys, ttft_slo_s, advance, on_run, only_known
            )
            found.update(again)
            missing = [s for s in missing if s.name not in again]
        if missing and only_known and repriced is not None:
            if cost is None:
                cost = cfg.cost_model()
            priced = self._reprice(
                trace, cfg, missing, ttft_slo_s, search_rate, cost, trace_key, ck, full_replay
            )
            for name, (result, note) in priced.items():
                found[name] = result
                repriced.append(note)
            missing = [s for s in missing if s.name not in priced]
        if missing and only_known:
            raise NotRemembered([s.name for s in missing])
        fresh = None
        if missing:
            for s in missing:
                if on_run is not None:
                    on_run(s.name)
            fresh = run_replay(
                trace,
                cfg,
                scenarios=missing,
                ttft_slo_s=ttft_slo_s,
                search_rate=search_rate,
                advance=advance,
                cost=cost,
                workers=workers,
                full_replay=full_replay,
                pool=pool,
                record=self.record,
            )
            with self._lock:
                self.runs += len(missing)
                for s in missing:
                    got = fresh.scenarios[s.name]
                    self._keep(keys[s.name], got)
                    if search_rate:  # its first run is the replay without the search
                        plain = self._key(trace_key, ck, cfg, s, ttft_slo_s, False, full_replay)
                        if plain not in self._results:
                            self._keep(
                                plain,
                                type(got)(
                                    s,
                                    got.resolved,
                                    got.stats,
                                    None,
                                    got.scale,
                                    decode_pool=got.decode_pool,
                                ),
                            )
        with self._lock:
            self.hits += len(found)
        if fresh is not None and not found:
            return fresh
        if cost is None:
            cost = cfg.cost_model()
        result = ReplayResult(
            cluster=cfg,
            ttft_slo_s=ttft_slo_s,
            block_size=trace.block_size,
            n_requests=trace.n_requests,
            bytes_per_token=int(cost.bytes_per_token),
        )
        rate = None if full_replay or trace.count_only else sampling_rate(trace.n_accesses)
        if rate is not None:  # how the remembered replays sampled this trace
            result.miniature = sample(trace, rate)[1]
        for s in specs:
            if s.name in found:
                old = found[s.name]
                # The settings as asked (capacities, links in the JSON); the simulation
                # is the remembered one, which the differing settings cannot reach.
                res = resolve(cfg, s, trace.block_size, cost=cost)
                result.scenarios[s.name] = type(old)(
                    s, res, old.stats, old.search, old.scale, decode_pool=old.decode_pool
                )
            else:
                assert fresh is not None  # every scenario not remembered was just run
                result.scenarios[s.name] = fresh.scenarios[s.name]
        return result
