"""What a report projects for the engines' own counters (``kvpool validate --prometheus``).

Read from report.json's typed view (:mod:`analyzer.report.document`): the recommended
option's replayed hit rate by tier and TTFT (the deployment under test, ``candidate``)
and the HBM-only option's (``local``, the ``baseline``), for
:func:`analyzer.advisor.engine_metrics.compare`.
"""

from __future__ import annotations

from analyzer.advisor.current import TOLERANCE
from analyzer.advisor.engine_metrics import EngineProjection, ProjectedScenario
from analyzer.advisor.figures import Verdict
from analyzer.replay.config import Scenario
from analyzer.report.plan_views import ReportView
from analyzer.report.views import ScenarioView

# The option a verdict recommends when the report names none (docs/advisor.md).
_BY_VERDICT = {
    Verdict.DEPLOY_POOLED: Scenario.POOLED,
    Verdict.LOCAL_OFFLOAD_ONLY: Scenario.LOCAL_DRAM,
}


def _scenario(name: str, view: ScenarioView | None) -> ProjectedScenario | None:
    if view is None:
        return None
    return ProjectedScenario(
        name=name,
        hit_rate_by_tier={str(t): float(v) for t, v in view.hit_rate_by_tier.items()},
        ttft_mean_s=view.ttft_s.mean,
        ttft_p90_s=view.ttft_s.p90,
    )


def engine_projection(report: ReportView) -> EngineProjection:
    """The candidate (recommended) and baseline (HBM only) projections of ``report``."""
    scenarios = report.scenarios
    chosen = report.verdict.scenario or _BY_VERDICT.get(report.verdict.verdict)
    candidate = _scenario(str(chosen), scenarios.get(chosen)) if chosen is not None else None
    mvp = report.measured_vs_projected
    return EngineProjection(
        candidate=candidate,
        baseline=_scenario(Scenario.LOCAL, scenarios.get(Scenario.LOCAL)),
        tolerance=mvp.tolerance if mvp is not None and mvp.tolerance is not None else TOLERANCE,
    )
