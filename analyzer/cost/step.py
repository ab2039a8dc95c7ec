"""The step model a replay advances by: which figures price one forward pass.

:mod:`analyzer.cost.step_formula` holds the formula (:func:`step_seconds`, pure float
arithmetic on a coefficient array); this module chooses the coefficients for one
deployment and hands them on as a :class:`StepModel`: measured kernel data
(aiconfigurator-core, :mod:`analyzer.cost.aic`) where it covers the GPU, model, back end
and precision, else kvpool's engine model (:class:`analyzer.cost.model.CostModel`). It
sits above both, so the formula imports neither and the import graph stays a tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.cost.aic import measured_step
from analyzer.cost.model import CostModel
from analyzer.cost.step_formula import chunk_attn, step_seconds
from analyzer.errors import UsageError

__all__ = ["BACKENDS", "StepModel", "chunk_attn", "engine_step_model", "step_model", "step_seconds"]

BACKENDS = ("vllm", "sglang", "trtllm")  # the serving engines a step model can stand for


@dataclass(frozen=True, slots=True)
class StepModel:
    """Seconds of one forward pass of an aggregated engine's continuous batch."""

    # what the figures come from, e.g. "kvpool engine model (models/measurements.toml)"
    source: str
    coefficients: np.ndarray  # float64, read only by step_seconds()
    # fixed time per request outside the forward passes (HTTP, tokenization, scheduling),
    # added once to each TTFT
    request_overhead_s: float

    def step_s(
        self,
        prefill_tokens: float,
        prefill_attn: float,
        decode_seqs: float,
        decode_kv_tokens: float,
    ) -> float:
        return step_seconds(
            self.coefficients, prefill_tokens, prefill_attn, decode_seqs, decode_kv_tokens
        )


def step_model(cost: CostModel, backend: str = "vllm") -> StepModel:
    """Measured kernel data (aiconfigurator-core) where it covers the GPU, model, back end
    and precision, else kvpool's engine model; ``source`` says which (and, for the engine
    model, why the measured data was not used).

    The measured coefficients are fitted once per deployment (analyzer/cost/aic.py, a few
    seconds, then cached in the process). A calibration of your own (``--profile``,
    ``--calibration``) and the plain roofline (``--mfu``) are used as asked.
    ``request_overhead_s`` is the cost model's per-request overhead.
    """
    if backend not in BACKENDS:
        raise UsageError(f"unknown serving back end {backend!r}: one of {', '.join(BACKENDS)}")
    measured = measured_step(cost, backend)
    if isinstance(measured, str):
        c = cost.step_coefficients()
        source = f"kvpool {cost.prefill_model_label}"
        if cost.engine is not None and not cost.prefill.fitted and cost.ttft_fit is None:
            source += f"; {measured}"
    else:
        c = measured.coefficients.copy()
        source = measured.source
    c.setflags(write=False)
    return StepModel(source=source, coefficients=c, request_overhead_s=float(cost.overhead_s))


def engine_step_model(cost: CostModel) -> StepModel:
    """kvpool's own engine model (with the cost model's calibration), never measured data:
    what ``kvpool cost check`` compares beside aiconfigurator-core."""
    c = cost.step_coefficients()
    c.setflags(write=False)
    return StepModel(
        source=f"kvpool {cost.prefill_model_label}",
        coefficients=c,
        request_overhead_s=float(cost.overhead_s),
    )
