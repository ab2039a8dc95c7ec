"""Seconds of one forward pass of a continuous batch: the step time a replay advances by.

An aggregated engine (vLLM, SGLang) runs one forward per step over everything it has
scheduled: prefill chunks of waiting requests plus one token of every decoding request
(vLLM's chunked prefill, ``--max-num-batched-tokens``; SGLang's mixed chunk). A replay
calls :func:`step_seconds` once per simulated step, so it is pure float arithmetic on a
coefficient array, compiled unchanged by ``numba.njit``. Its four arguments describe the
step's work:

* ``prefill_tokens`` ``t``: new tokens prefilled in the step (all chunks);
* ``prefill_attn`` ``a``: the sum over the step's prefill chunks of
  ``new * (cached_before + new / 2)``, the causal attention context of their tokens;
* ``decode_seqs`` ``d``: requests decoding one token in the step;
* ``decode_kv_tokens`` ``kv``: the KV tokens those requests attend over (the sum of
  their context lengths).

kvpool's engine model (docs/cost-model.md section 3a, constants in
analyzer/cost/engine_constants.py, fitted on models/measurements.toml) generalised to such a mixed
batch. The GEMM rows are ``t + d`` (a decoding request is one row of every projection);
the GEMMs stream the weights once per step and the attention kernels read the KV (decode
attention reads the KV of every decoding request), each class of kernels bound by its
own FLOPs or bytes (a sum of rooflines, as a profile of one forward sums its kernels);
the TP all-reduce moves every row; the per-layer fixed cost is paid once per step with
prefill, and not by a decode-only step, which vLLM and SGLang replay as a CUDA graph::

    rows   = t + d
    gemm   = (rows + half) * gemm_s_per_row             (= rows * FLOPs / (peak * e(rows)))
    attn   = attn_s * (a + kv) + window_attn_s * (min(a, W t) + min(kv, W d))
    weights = weights_dense_s + weights_expert_s * (1 - miss^rows)
    kv_read = kv_s * (t + kv) + window_kv_s * (min(t, W) + min(kv, W d))
            + state_s * (min(t, 1) + d)
    engine = max(gemm, weights) + max(attn, kv_read) + comm_s_per_row * rows
           + (fixed_s if t > 0 else fixed_decode_s)
    step   = scale * engine + per_token_s * t + per_attn_s * a + per_sq_s * t^2

``e(rows) = eff * rows / (rows + half)`` is the GEMM efficiency curve, so the GEMM time
is linear in the rows with an intercept of ``half`` rows. The plain roofline (``--mfu``)
keeps its one ``max(all FLOPs, all bytes)``. A prefill chunk's attention is
priced by its FLOPs: its KV read in the HBM floor is that of its new tokens (the read of
the cached context is not a function of ``t`` and ``a`` that is also monotone; a chunk of
very few tokens after a long cached context is memory bound, which the weights floor of
the step covers until that context's KV approaches the weights). Sliding-window layers
attend over at most ``W`` tokens: ``min(a, W t)`` is exact for a chunk that lies wholly
inside or wholly past the window and over-counts by at most ``W^2 / 2`` per chunk in
between. The last line is a calibration (``kvpool cost fit``, ``--calibration``):
``scale`` is its compute scale, the polynomial its fitted prefill form
``K (c1 S + c2 P S + c3 S^2)`` written in ``t`` and ``a`` (exact for one chunk). With a
pure polynomial fit the engine prices only the step's decode work.

Every term is non-decreasing in every argument, and no work takes no time. A single
prefill chunk of ``S`` new tokens after ``P`` cached ones, ``K`` alike, is
``step_seconds(c, K S, K S (P + S / 2), 0, 0)``: :meth:`CostModel.compute_time_s` is
exactly that, so the break-even, ``kvpool cost ttft`` and the replay price prefill with
one formula.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The coefficient layout (private: callers pass the array to step_seconds untouched).
SCALE = 0  # multiplies the engine form (a calibrated compute scale; 1 from the catalog)
ENGINE_PREFILL = 1  # 1: the engine form prices prefill; 0: a fitted polynomial does
GEMM_S_PER_ROW = 2  # seconds per GEMM row at the GEMMs' full efficiency
GEMM_HALF_ROWS = 3  # rows at which the GEMMs reach half of that efficiency
ATTN_S = 4  # seconds per unit of attention context, full-attention layers
WINDOW_ATTN_S = 5  # the same for sliding-window layers
WINDOW = 6  # the sliding window in tokens (0: none)
WEIGHTS_DENSE_S = 7  # streaming the non-expert weights of one rank from HBM
WEIGHTS_EXPERT_S = 8  # streaming every expert of one rank
EXPERT_MISS = 9  # 1 - k / E: the chance a routed row leaves an expert unread
KV_S = 10  # reading one token's KV on one rank, full-attention layers
WINDOW_KV_S = 11  # the same for sliding-window layers
STATE_S = 12  # reading one sequence's linear-attention state on one rank
COMM_S_PER_ROW = 13  # the tensor-parallel all-reduces of one row
FIXED_S = 14  # per step with prefill: launches, norms, gaps between kernels
PER_TOKEN_S = 15  # calibrated polynomial: per new token
PER_ATTN_S = 16  # per unit of attention context
PER_SQ_S = 17  # per squared prefill token (the polynomial's S^2 beyond a's S^2 / 2)
FIXED_DECODE_S = 18  # per decode-only step (CUDA graphs: no launch gaps)
ONE_ROOFLINE = 19  # 1: max(all FLOPs, all bytes), the plain roofline; 0: per kernel class
N_COEFFICIENTS = 20


def step_seconds(
    c: np.ndarray,
    prefill_tokens: float,
    prefill_attn: float,
    decode_seqs: float,
    decode_kv_tokens: float,
) -> float:
    """Seconds of one forward over the step's work (module docstring for the formula).

    Pure float arithmetic on ``c`` (no objects, no containers), so that
    ``numba.njit(step_seconds)`` compiles it unchanged; monotone non-decreasing in every
    argument; no work takes 0 s.
    """
    t = prefill_tokens
    a = prefill_attn
    d = decode_seqs
    kv = decode_kv_tokens
    poly = c[PER_TOKEN_S] * t + c[PER_ATTN_S] * a + c[PER_SQ_S] * t * t
    # the engine form sees the prefill only when it prices it (not under a polynomial fit)
    te = t * c[ENGINE_PREFILL]
    ae = a * c[ENGINE_PREFILL]
    rows = te + d
    if rows <= 0.0 and ae <= 0.0 and kv <= 0.0:
        return float(poly)
    w = c[WINDOW]
    gemm = 0.0
    if rows > 0.0:
        gemm = (rows + c[GEMM_HALF_ROWS]) * c[GEMM_S_PER_ROW]
    win_a = 0.0
    win_kv = 0.0
    if w > 0.0:
        win_a = min(ae, w * te) + min(kv, w * d)
        win_kv = min(te, w) + min(kv, w * d)
    attn = c[ATTN_S] * (ae + kv) + c[WINDOW_ATTN_S] * win_a
    touched = 1.0 - c[EXPERT_MISS] ** max(rows, 1.0)
    weights = c[WEIGHTS_DENSE_S] + c[WEIGHTS_EXPERT_S] * touched
    kv_read = c[KV_S] * (te + kv) + c[WINDOW_KV_S] * win_kv + c[STATE_S] * (min(te, 1.0) + d)
    if c[ONE_ROOFLINE] > 0.0:
        # the plain roofline (--mfu): all FLOPs against all bytes
        engine = max(gemm + attn, weights + kv_read)
    else:
        # GEMMs stream the weights; attention kernels read the KV: each its own roofline
        engine = max(gemm, weights) + max(attn, kv_read)
    fixed = c[FIXED_DECODE_S]
    if te > 0.0 or ae > 0.0:
        fixed = max(c[FIXED_S], fixed)
    engine += c[COMM_S_PER_ROW] * rows + fixed
    return float(c[SCALE] * engine + poly)


def chunk_attn(new_tokens: float, cached_tokens: float) -> float:
    """``prefill_attn`` of one chunk: ``new * (cached_before + new / 2)``."""
    return new_tokens * (cached_tokens + new_tokens / 2.0)


# The compiled kernels, made on first use (:func:`compiled_step`) and kept in numba's
# cache beside this file, so that a process loads them rather than compiling them (about
# 0.8 s in every process that replays); they live here so that a change to
# :func:`step_seconds` invalidates the cached loops that call it.
_step_jit: Any = None
_COMPILED: tuple[Any, Any, Any] | None = None


def _decode_ends(c: np.ndarray, n: float, kv0: float, steps: int, t0: float) -> np.ndarray:
    """End times of ``steps`` decode-only steps of ``n`` requests from ``t0`` with ``kv0``
    context tokens, each step adding one token to every context (compiled).

    Each step is :func:`step_seconds` of ``(c, 0, 0, n, kv)``, float for float: the
    terms that do not depend on ``kv`` are taken out of the loop (the compiler does not,
    and they were five sixths of a step), the rest is the same expressions in the same
    order (a Hypothesis test compares the two over the coefficients' whole space)."""
    out = np.empty(steps, dtype=np.float64)
    # step_seconds with prefill_tokens = prefill_attn = 0 and decode_seqs = n
    poly = c[PER_TOKEN_S] * 0.0 + c[PER_ATTN_S] * 0.0 + c[PER_SQ_S] * 0.0 * 0.0
    te = 0.0 * c[ENGINE_PREFILL]
    ae = 0.0 * c[ENGINE_PREFILL]
    d = n
    rows = te + d
    w = c[WINDOW]
    gemm = 0.0
    if rows > 0.0:
        gemm = (rows + c[GEMM_HALF_ROWS]) * c[GEMM_S_PER_ROW]
    windowed = w > 0.0
    wa0 = min(ae, w * te)
    wk0 = min(te, w)
    wd = w * d
    attn_s = c[ATTN_S]
    window_attn_s = c[WINDOW_ATTN_S]
    touched = 1.0 - c[EXPERT_MISS] ** max(rows, 1.0)
    weights = c[WEIGHTS_DENSE_S] + c[WEIGHTS_EXPERT_S] * touched
    kv_s = c[KV_S]
    window_kv_s = c[WINDOW_KV_S]
    state = c[STATE_S] * (min(te, 1.0) + d)
    one_roofline = c[ONE_ROOFLINE] > 0.0
    fixed = c[FIXED_DECODE_S]
    if te > 0.0 or ae > 0.0:
        fixed = max(c[FIXED_S], fixed)
    comm_fixed = c[COMM_S_PER_ROW] * rows + fixed
    scale = c[SCALE]
    t = t0
    kv = kv0
    for j in range(steps):
        if rows <= 0.0 and ae <= 0.0 and kv <= 0.0:
            dt = float(poly)
        else:
            win_a = 0.0
            win_kv = 0.0
            if windowed:
                win_a = wa0 + min(kv, wd)
                win_kv = wk0 + min(kv, wd)
            attn = attn_s * (ae + kv) + window_attn_s * win_a
            kv_read = kv_s * (te + kv) + window_kv_s * win_kv + state
            if one_roofline:
                engine = max(gemm + attn, weights + kv_read)
            else:
                engine = max(gemm, weights) + max(attn, kv_read)
            engine += comm_fixed
            dt = float(scale * engine + poly)
        t += dt
        out[j] = t
        kv += n
    return out


def _mixed_step(c: np.ndarray, t: float, a: float, n: float, kv: float) -> tuple[float, float]:
    """A mixed step's duration and its prefill share: the duration times the step's
    time for the prefill alone over that plus its time for the decode alone (compiled)."""
    dt = _step_jit(c, t, a, n, kv)
    p = _step_jit(c, t, a, 0.0, 0.0)
    d = _step_jit(c, 0.0, 0.0, n, kv) if n > 0.0 else 0.0
    return dt, (dt * p / (p + d) if p + d > 0 else 0.0)


def compiled_step() -> tuple[Any, Any, Any]:
    """``(step, ends, mixed)``: :func:`step_seconds`, :func:`_decode_ends` and
    :func:`_mixed_step` compiled by numba."""
    global _step_jit, _COMPILED
    if _COMPILED is None:
        from numba import njit

        _step_jit = njit(cache=True)(step_seconds)
        _COMPILED = (
            _step_jit,
            njit(cache=True)(_decode_ends),
            njit(cache=True)(_mixed_step),
        )
    return _COMPILED
