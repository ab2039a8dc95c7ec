"""reuse stage: radix caches, reuse ceilings, hit-ratio curves and where reuse comes from."""

from analyzer.reuse.analysis import ReuseOptions, ReuseReport, StepCurve, analyze_reuse

__all__ = ["ReuseOptions", "ReuseReport", "StepCurve", "analyze_reuse"]
