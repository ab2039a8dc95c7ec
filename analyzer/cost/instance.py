"""What one instance (a model on ``tp`` GPUs) is made of, in the step model's terms.

:class:`InstanceConstants` are the per-instance constants of the hot path (FLOPs and
bytes per token, peaks, weights per rank), computed once per cost model;
:func:`engine_coefficients` turns them into the step model's coefficients
(:mod:`analyzer.cost.step_formula`) under the engine model's constants
(:mod:`analyzer.cost.engine_constants`) or the plain roofline. Whatever describes a
deployment (:class:`Deployment`: :class:`analyzer.cost.model.CostModel` is one) can be
read, so this module needs nothing above the catalogs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from analyzer.cost import step_formula
from analyzer.cost.dtypes import dtype_bytes
from analyzer.cost.engine_constants import EngineConstants
from analyzer.cost.hardware import GpuSpec
from analyzer.cost.model_spec import ModelSpec


class Deployment(Protocol):
    """One instance's model, GPUs and precisions (what :class:`InstanceConstants` reads)."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def gpu(self) -> GpuSpec: ...
    @property
    def tp(self) -> int: ...
    @property
    def mfu(self) -> float: ...
    @property
    def compute_dtype(self) -> str: ...
    @property
    def weight_dtype(self) -> str: ...
    @property
    def kv_dtype(self) -> str: ...
    @property
    def expert_parallel(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class InstanceConstants:
    """Per-instance constants of the hot path (replay calls prefill_time_s per chunk)."""

    dense_flops_per_token: float
    attn_coef: float  # 4 * d_attn
    full_layers: int
    sliding_layers: int
    window: int | None
    linear_flops_per_token: float
    flops_per_s: float  # peak * mfu of the whole instance
    hbm_bytes_per_s: float  # one rank's HBM bandwidth
    dense_weight_bytes_per_rank: float  # all weights, or the non-expert part of a MoE
    expert_weight_bytes_per_rank: float  # 0 for dense models
    expert_miss: float  # 1 - k/E: probability a token does not pick a given expert
    full_per_rank: int  # KV bytes per token per rank, full-attention layers
    window_per_rank: int
    state_per_rank: int
    # engine model (analyzer.cost.engine_constants)
    expert_flops_per_token: float = 0.0  # 2 * active expert parameters (part of dense_...)
    gemm_flops_per_s: float = 0.0  # peak at the compute dtype, whole instance
    attn_flops_per_s: float = 0.0  # bf16 peak, whole instance
    comm_bytes_per_token: float = 0.0  # all-reduce bytes each rank sends per token, all layers
    interconnect_bytes_per_s: float = 0.0
    num_layers: int = 0

    @classmethod
    def of(cls, cm: Deployment) -> InstanceConstants:
        m = cm.model
        b = dtype_bytes(cm.weight_dtype)
        expert = 0.0
        miss = 1.0
        dense = m.total_params * b
        expert_active = 0.0
        if m.is_moe and m.total_params > m.active_params:
            ratio = m.experts_per_token / m.num_experts
            expert = (m.total_params - m.active_params) / (1.0 - ratio) * b
            dense = max(m.total_params * b - expert, 0.0)
            miss = 1.0 - ratio
            expert_active = expert / b * ratio
        comm = 0.0
        if cm.tp > 1 and not cm.expert_parallel:
            # two all-reduces per layer (after attention and after the MLP) of the hidden
            # states in 16-bit; a ring sends 2(TP-1)/TP of the buffer from every rank
            comm = m.num_layers * 2 * 2 * (cm.tp - 1) / cm.tp * m.hidden_size * 2
        return cls(
            dense_flops_per_token=2.0 * m.active_nonembedding_params,
            attn_coef=4.0 * m.attention_dim,
            full_layers=m.full_layers,
            sliding_layers=m.sliding_layers,
            window=m.sliding_window_tokens,
            linear_flops_per_token=4.0 * m.linear_state_elements_per_layer * m.linear_layers,
            flops_per_s=cm.gpu.tflops(cm.compute_dtype) * 1e12 * cm.tp * cm.mfu,
            hbm_bytes_per_s=cm.gpu.hbm_tbps * 1e12,
            dense_weight_bytes_per_rank=dense / cm.tp,
            expert_weight_bytes_per_rank=expert / cm.tp,
            expert_miss=miss,
            full_per_rank=m.kv_bytes_per_token_per_rank(cm.kv_dtype, cm.tp),
            window_per_rank=m.kv_window_bytes_per_token_per_rank(cm.kv_dtype, cm.tp),
            state_per_rank=m.linear_state_bytes(cm.tp, per_rank=True) if m.linear_layers else 0,
            expert_flops_per_token=2.0 * expert_active,
            gemm_flops_per_s=cm.gpu.tflops(cm.compute_dtype) * 1e12 * cm.tp,
            attn_flops_per_s=cm.gpu.tflops("bf16") * 1e12 * cm.tp,
            comm_bytes_per_token=comm,
            interconnect_bytes_per_s=cm.gpu.interconnect_gbps * 1e9,
            num_layers=m.num_layers,
        )

    def kv_per_rank(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        capped = tokens if self.window is None else min(tokens, self.window)
        return self.full_per_rank * tokens + self.window_per_rank * capped + self.state_per_rank


def engine_coefficients(
    k: InstanceConstants, e: EngineConstants | None, compute_dtype: str
) -> np.ndarray:
    """The step model's coefficients of the instance ``k`` under the engine model with
    constants ``e`` (GEMMs at ``compute_dtype``), or the plain roofline at its ``mfu``
    (None); uncalibrated."""
    c = np.zeros(step_formula.N_COEFFICIENTS)
    c[step_formula.SCALE] = 1.0
    c[step_formula.ENGINE_PREFILL] = 1.0
    if e is None:
        # max(FLOPs / (peak * mfu), HBM floor): attention at the same peak, no curve
        flops = k.flops_per_s
        c[step_formula.GEMM_S_PER_ROW] = (
            k.dense_flops_per_token + k.linear_flops_per_token
        ) / flops
        c[step_formula.ATTN_S] = k.attn_coef * k.full_layers / flops
        c[step_formula.WINDOW_ATTN_S] = k.attn_coef * k.sliding_layers / flops
        c[step_formula.ONE_ROOFLINE] = 1.0
        hbm = k.hbm_bytes_per_s
    else:
        gemm = k.gemm_flops_per_s * e.gemm_eff(compute_dtype)
        dense = k.dense_flops_per_token - k.expert_flops_per_token + k.linear_flops_per_token
        c[step_formula.GEMM_S_PER_ROW] = dense / gemm + k.expert_flops_per_token / (
            gemm * e.moe_eff
        )
        c[step_formula.GEMM_HALF_ROWS] = e.gemm_half_tokens
        attn = k.attn_flops_per_s * e.attn_eff
        c[step_formula.ATTN_S] = k.attn_coef * k.full_layers / attn
        c[step_formula.WINDOW_ATTN_S] = k.attn_coef * k.sliding_layers / attn
        hbm = k.hbm_bytes_per_s * e.hbm_eff
        if k.comm_bytes_per_token:
            c[step_formula.COMM_S_PER_ROW] = k.comm_bytes_per_token / (
                k.interconnect_bytes_per_s * e.link_eff
            )
        c[step_formula.FIXED_S] = k.num_layers * e.layer_step_s
    if k.sliding_layers and k.window is not None:
        c[step_formula.WINDOW] = float(k.window)
    c[step_formula.WEIGHTS_DENSE_S] = k.dense_weight_bytes_per_rank / hbm
    c[step_formula.WEIGHTS_EXPERT_S] = k.expert_weight_bytes_per_rank / hbm
    c[step_formula.EXPERT_MISS] = k.expert_miss
    c[step_formula.KV_S] = k.full_per_rank / hbm
    c[step_formula.WINDOW_KV_S] = k.window_per_rank / hbm
    c[step_formula.STATE_S] = k.state_per_rank / hbm
    return c
