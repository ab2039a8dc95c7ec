"""How serving engines really prefill: achieved efficiencies and fixed costs.

The roofline (peak FLOP/s x one utilisation factor) is 0.24x to 2.6x off published
first-token latencies. This module holds the constants of the engine model that replaces
it (docs/cost-model.md section 3); :mod:`analyzer.cost.step_formula` evaluates it for a whole
continuous-batching step and :class:`analyzer.cost.model.CostModel` for one chunk:

    tokens  = S * K                                        (one forward of K requests)
    e(dt)   = gemm_eff[dt] * tokens / (tokens + gemm_half_tokens)
    gemm_s  = dense_FLOPs / (peak[dt] * e) + expert_FLOPs / (peak[dt] * e * moe_eff)
    attn_s  = attention_FLOPs / (peak[bf16] * attn_eff)
    weights_s = weights read per rank / (HBM bandwidth * hbm_eff)
    kv_s    = KV of the new tokens per rank / (HBM bandwidth * hbm_eff)
    comm_s  = layers * 2 * 2(TP-1)/TP * tokens * hidden * 2 B / (interconnect * link_eff)
    compute_s = max(gemm_s, weights_s) + max(attn_s, kv_s) + comm_s + layers * layer_step_s

``dt`` is the precision the GEMMs run at (the deployment's weights dtype where the GPU
has tensor cores for it). The five fitted constants are fitted on the published
measurements of ``models/measurements.toml`` by ``kvpool cost check`` (which also prints
their leave-one-out error); a test refits them and checks that these defaults are that
fit. The others are fixed from published kernel figures and are not fitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

# The five constants fitted on models/measurements.toml, in this order.
FITTED = ("gemm_eff_bf16", "gemm_eff_fp8", "gemm_half_tokens", "layer_step_s", "moe_eff")


@dataclass(frozen=True, slots=True)
class EngineConstants:
    """Achieved efficiencies and fixed costs of an engine's prefill forward pass."""

    # fitted (models/measurements.toml, `kvpool cost check`)
    gemm_eff_bf16: float = 0.7332  # share of the bf16 dense peak large GEMMs reach
    gemm_eff_fp8: float = 0.5428  # share of the fp8 peak (W8A8; scaling and casts cost more)
    gemm_half_tokens: float = 68.24  # tokens per forward at which GEMMs reach half of that
    layer_step_s: float = 1.761e-4  # fixed per layer per forward: launches, norms, RoPE, gaps
    moe_eff: float = 0.3533  # expert GEMMs relative to dense ones: grouped GEMM, imbalance, EP
    # fixed from published kernel measurements (not fitted)
    attn_eff: float = 0.5  # FlashAttention forward: 50-73% of peak on A100 (FA2 paper)
    hbm_eff: float = 0.85  # weight streaming reaches ~85% of the HBM datasheet bandwidth
    link_eff: float = 0.8  # NCCL ring all-reduce bus bandwidth / NVLink rate each way
    source: str = "models/measurements.toml"

    def gemm_eff(self, compute_dtype: str) -> float:
        """Large-GEMM efficiency at ``compute_dtype`` (fp4 has no published row: fp8's)."""
        return self.gemm_eff_bf16 if compute_dtype in ("bf16", "fp16") else self.gemm_eff_fp8

    def with_values(self, values: Mapping[str, float]) -> EngineConstants:
        """These constants with some of the fitted ones (:data:`FITTED`) replaced."""
        assert set(values) <= set(FITTED), sorted(set(values) - set(FITTED))
        v = {name: float(values.get(name, getattr(self, name))) for name in FITTED}
        return replace(
            self,
            gemm_eff_bf16=v["gemm_eff_bf16"],
            gemm_eff_fp8=v["gemm_eff_fp8"],
            gemm_half_tokens=v["gemm_half_tokens"],
            layer_step_s=v["layer_step_s"],
            moe_eff=v["moe_eff"],
        )

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULT_ENGINE = EngineConstants()
