"""replay stage: the trace replayed through a model of the cluster, per deployment option.

``run_replay(trace, ClusterConfig(...), scenarios=("none", "local", "local+dram", "pooled"))``
gives hit rates by tier, TTFT, prefill GPU-seconds, link traffic and the highest rate
that keeps p90 TTFT under an SLO, for each scenario (see docs/replay.md).
"""

from analyzer.replay import serving as serving  # registers "aggregated" (engine.SIMULATIONS)
from analyzer.replay.config import (
    DEFAULT_SCENARIOS,
    ROUTERS,
    STANDARD_SCENARIOS,
    UNBOUNDED,
    ClusterConfig,
    Scenario,
    ScenarioSpec,
    Tier,
    load_scenarios,
    parse_capacity,
    select_scenarios,
)
from analyzer.replay.link_settings import LinkSettings, resolve_link
from analyzer.replay.run import (
    ReplayResult,
    ScenarioCapacity,
    ScenarioResult,
    TtftSummary,
    find_max_rate,
    resolve,
    run_replay,
)

__all__ = [
    "DEFAULT_SCENARIOS",
    "ROUTERS",
    "STANDARD_SCENARIOS",
    "UNBOUNDED",
    "ClusterConfig",
    "LinkSettings",
    "ReplayResult",
    "Scenario",
    "ScenarioCapacity",
    "ScenarioResult",
    "ScenarioSpec",
    "Tier",
    "TtftSummary",
    "find_max_rate",
    "load_scenarios",
    "parse_capacity",
    "resolve",
    "resolve_link",
    "run_replay",
    "select_scenarios",
]
