"""advisor stage: the verdict, sized recommendations, product settings and pilot gates.

Public API::

    from analyzer.advisor import AnalyzeOptions, run_analysis, Verdict
    result = run_analysis(["log.jsonl.gz"], AnalyzeOptions(model="llama-3.1-8b", gpu="h100"))
    result.verdict          # one of VERDICTS
    # the report's JSON (schema "kvpool.report/2"): analyzer.report.document.report_json(result)

The decision functions (:func:`decide`, :func:`analyzer.advisor.sizing.size`,
:func:`analyzer.advisor.gates.plan`, ...) are pure functions over the records in
:mod:`analyzer.advisor.figures`, so they can be used and tested without a trace.
"""

from typing import Any

from analyzer.advisor.decide import decide
from analyzer.advisor.figures import (
    OBJECTIVES,
    VERDICTS,
    BandwidthFigures,
    Decision,
    ReplayFigures,
    ReuseFigures,
    ScenarioFigures,
    Thresholds,
    TierFigure,
    TraceFigures,
    Verdict,
)

# The pipeline (numpy, pyarrow, the stages) loads on first use, so that `kvpool --help`
# stays fast while `from analyzer.advisor import run_analysis` keeps working.
_LAZY = {"AnalysisResult", "AnalyzeOptions", "run_analysis"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from analyzer.advisor import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'analyzer.advisor' has no attribute {name!r}")


__all__ = [
    "OBJECTIVES",
    "VERDICTS",
    "AnalysisResult",
    "AnalyzeOptions",
    "BandwidthFigures",
    "Decision",
    "ReplayFigures",
    "ReuseFigures",
    "ScenarioFigures",
    "Thresholds",
    "TierFigure",
    "TraceFigures",
    "Verdict",
    "decide",
    "run_analysis",
]
