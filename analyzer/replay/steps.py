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
:func:`burst_ends` runs whole stretches of decode-only steps in one compiled loop, which
is how the replay advances between events without a Python iteration per token.

The step model is the cost model's ``analyzer.cost.step`` (measured kernel data where it
covers the deployment, else kvpool's engine model). Until that module is present this
module derives the same interface from the cost model's prefill times
(:func:`engine_step_pricing`): a chunk's compute time sampled at 8,192 and 16,384 tokens
gives its per-token and fixed parts, the attention term comes from the model's
attention FLOPs, a step never takes less than one token's forward (the weights streamed
from HBM), and each decoding request's context is read once from HBM.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

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


def fallback_step_seconds(
    c: np.ndarray,
    prefill_tokens: float,
    prefill_attn: float,
    decode_seqs: float,
    decode_kv_tokens: float,
) -> float:
    """:func:`engine_step_pricing`'s step time. ``c``: (floor, intercept, per token,
    per attention unit, per decode KV token) in seconds. Monotone non-decreasing in
    every count; no work takes no time."""
    tokens = prefill_tokens + decode_seqs
    if tokens <= 0.0:
        return 0.0
    t = c[1] + c[2] * tokens + c[3] * prefill_attn
    if t < c[0]:
        t = c[0]
    return float(t + c[4] * decode_kv_tokens)


def engine_step_pricing(cost: Any) -> StepPricing:
    """The step interface derived from ``cost``'s prefill model (see the module
    docstring): exact for one chunk of 8,192 or 16,384 tokens on an empty context, the
    per-token slope between them elsewhere, never below a one-token forward."""
    a, b = 8192, 16384
    ta, tb = float(cost.compute_time_s(a, 0)), float(cost.compute_time_s(b, 0))
    # attention seconds per unit of new * (cached + new / 2): what ``a`` cached tokens
    # add to a chunk of ``a`` new ones, a * a units (both chunks compute-bound)
    per_attn = max((float(cost.compute_time_s(a, a)) - ta) / (a * a), 0.0)
    slope = max((tb - ta - per_attn * (b * b - a * a) / 2.0) / (b - a), 0.0)
    intercept = max(ta - slope * a - per_attn * a * a / 2.0, 0.0)
    floor = float(cost.compute_time_s(1, 0))
    gpu = cost.gpu
    eff = float(cost.engine.hbm_eff) if getattr(cost, "engine", None) is not None else 1.0
    per_kv = float(cost.bytes_per_token_per_rank) / (float(gpu.hbm_tbps) * 1e12 * eff)
    coefficients = np.array([floor, intercept, slope, per_attn, per_kv], dtype=np.float64)
    return StepPricing(
        source=f"kvpool {cost.prefill_model_label}",
        coefficients=coefficients,
        request_overhead_s=float(cost.overhead_s),
        step_seconds=fallback_step_seconds,
    )


def step_pricing(cost: Any, backend: str = "vllm") -> StepPricing:
    """The step model for ``cost``: the cost model's own (``analyzer.cost.step``) when it
    is there, else :func:`engine_step_pricing`."""
    try:
        step = importlib.import_module("analyzer.cost.step")
    except ModuleNotFoundError:
        return engine_step_pricing(cost)
    model = step.step_model(cost, backend)
    return StepPricing(
        source=str(model.source),
        coefficients=np.ascontiguousarray(model.coefficients, dtype=np.float64),
        request_overhead_s=float(model.request_overhead_s),
        step_seconds=step.step_seconds,
    )


_BURSTS: dict[Any, Any] = {}


def compiled(fn: StepFn) -> tuple[Any, Any]:
    """``(step, ends)``: ``fn`` compiled by numba, and the burst kernel built on it
    (``ends(c, n, kv0, steps, t0)`` -> the end times of ``steps`` decode-only steps of
    ``n`` requests starting at ``t0`` with ``kv0`` context tokens, each step adding one
    token to every context). Compiled once per step function and process."""
    got = _BURSTS.get(fn)
    if got is None:
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

        got = _BURSTS[fn] = (step, ends)
    return got


def burst_ends(pricing: StepPricing, n: int, kv0: float, steps: int, t0: float) -> np.ndarray:
    """End times of ``steps`` decode-only steps (see :func:`compiled`)."""
    ends = compiled(pricing.step_seconds)[1]
    out: np.ndarray = ends(pricing.coefficients, float(n), kv0, steps, t0)
    return out
