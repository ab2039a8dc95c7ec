"""advisor stage: the verdict, sized recommendations, product settings and pilot gates.

Public API::

    from analyzer.advisor import AnalyzeOptions, run_analysis, Verdict
    result = run_analysis(["log.jsonl.gz"], AnalyzeOptions(model="llama-3.1-8b", gpu="h100"))
    result.verdict          # one of VERDICTS
    # the report's JSON (schema "kvpool.report/3"): analyzer.report.document.report_json(result)

The decision functions (:func:`analyzer.advisor.decide.decide`,
:func:`analyzer.advisor.sizing.size`, :func:`analyzer.advisor.gates.plan`, ...) are pure
functions over the records in :mod:`analyzer.advisor.figures`, so they can be used and
tested without a trace. Every name here loads on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from analyzer.advisor.pipeline import AnalysisResult, AnalyzeOptions, run_analysis

# Every name loads on first use: the decision records pull in the replay stage, and the
# pipeline numpy, pyarrow and the stages, none of which `kvpool --help` or a command that
# only reads a submodule (`kvpool reuse` reads analyzer.advisor.models) should pay for,
# while `from analyzer.advisor import run_analysis` keeps working.
_LAZY = {
    **dict.fromkeys(
        (
            "OBJECTIVES",
            "VERDICTS",
            "BandwidthFigures",
            "Decision",
            "ReplayFigures",
            "ReuseFigures",
            "ScenarioFigures",
            "Thresholds",
            "TierFigure",
            "TraceFigures",
            "Verdict",
        ),
        "analyzer.advisor.figures",
    ),
    **dict.fromkeys(
        ("AnalysisResult", "AnalyzeOptions", "run_analysis"), "analyzer.advisor.pipeline"
    ),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
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
    "run_analysis",
]
