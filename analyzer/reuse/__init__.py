"""reuse stage: reuse ceilings, hit-ratio curves and where reuse comes from, measured on a
trace in memory (analysis.py) or streamed from a canonical file (streamed.py)."""

from analyzer.reuse.analysis import analyze_reuse
from analyzer.reuse.records import ReuseOptions, StepCurve
from analyzer.reuse.result import ReuseReport

__all__ = ["ReuseOptions", "ReuseReport", "StepCurve", "analyze_reuse"]
