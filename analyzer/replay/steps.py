"""What one forward pass of an aggregated engine costs, as the replay asks it.

The aggregated replay (:mod:`analyzer.replay.serving`) prices every step of an
instance's continuous batch with one function of four counts::

    step_seconds(c, prefill_tokens, prefill_attn, decode_seqs, decode_kv_tokens)

- ``prefill_tokens``: new tokens prefilled in the step, all chunks together;
- ``prefill_attn``: the sum over the step's prefill chunks of
  ``new * (cached_before + new / 2)`` (the causal attention a chunk computes);
- ``decode_seqs``: requests decoding one token in the step;
- ``decode_kv_tokens``: the KV tokens those requests attend over (their contexts summed).

``c`` is a float64 array whose layout belongs to the step model; the replay only passes
it on. The function is pure float arithmetic on ``c``, so numba compiles it unchanged:
:func:`compiled`'s burst kernel runs whole stretches of decode-only steps in one compiled
loop, which is how the replay advances between events without a Python iteration per
token.

The step model is the cost model's (:mod:`analyzer.cost.step`: measured kernel data from
aiconfigurator-core where it covers the deployment, else kvpool's engine model); its
``source`` is reported with every aggregated replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.cost.step import step_model, step_seconds
from analyzer.cost.step_formula import compiled_step

StepFn = Callable[[np.ndarray, float, float, float, float], float]


@dataclass(frozen=True, slots=True, eq=False)
class StepPricing:
    """The step model one replay runs with: ``coefficients`` for ``step_seconds``, the
    fixed per-request time outside the forward passes (HTTP, tokenization, scheduling:
    added once to every TTFT) and what the figures come from (``source``, reported)."""

    source: str
    coefficients: np.ndarray
    request_overhead_s: float
    step_seconds: StepFn

    def step_s(
        self, prefill_tokens: float, prefill_attn: float, decode_seqs: float, decode_kv: float
    ) -> float:
        return self.step_seconds(
            self.coefficients, prefill_tokens, prefill_attn, decode_seqs, decode_kv
        )


def step_pricing(cost: Any, backend: str = "vllm") -> StepPricing:
    """The cost model's step model for ``cost`` on the ``backend`` engine."""
    model = step_model(cost, backend)
    return StepPricing(
        source=str(model.source),
        coefficients=np.ascontiguousarray(model.coefficients, dtype=np.float64),
        request_overhead_s=float(model.request_overhead_s),
        step_seconds=step_seconds,
    )


_BURSTS: dict[Any, Any] = {}


def compiled(fn: StepFn) -> tuple[Any, Any, Any]:
    """``(step, ends, mixed)``: ``fn`` compiled by numba, the burst kernel built on it
    (``ends(c, n, kv0, steps, t0)`` -> the end times of ``steps`` decode-only steps of
    ``n`` requests starting at ``t0`` with ``kv0`` context tokens, each step adding one
    token to every context) and the mixed-step kernel (``mixed(c, t, a, n, kv)`` -> the
    step's duration and its prefill share: the duration x the step's time for its
    prefill alone / (that + its time for its decode alone)). Compiled once per step
    function and process, the cost model's own from numba's cache
    (:func:`analyzer.cost.step_formula.compiled_step`)."""
    if fn is step_seconds:
        return compiled_step()
    got = _BURSTS.get(fn)
    if got is None:  # another step function (a test's): compiled here, not cached
        from numba import njit

        step: Any = njit(fn)

        @njit
        def ends(c: np.ndarray, n: float, kv0: float, steps: int, t0: float) -> np.ndarray:
            out = np.empty(steps, dtype=np.float64)
            t = t0
            kv = kv0
            for j in range(steps):
                t += step(c, 0.0, 0.0, n, kv)
                out[j] = t
                kv += n
            return out

        @njit
        def mixed(c: np.ndarray, t: float, a: float, n: float, kv: float) -> tuple[float, float]:
            dt = step(c, t, a, n, kv)
            p = step(c, t, a, 0.0, 0.0)
            d = step(c, 0.0, 0.0, n, kv) if n > 0.0 else 0.0
            return dt, (dt * p / (p + d) if p + d > 0 else 0.0)

        got = _BURSTS[fn] = (step, ends, mixed)
    return got
