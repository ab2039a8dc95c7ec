"""One model's KV geometry and size: :class:`ModelSpec`, whole model before tensor
parallelism, as :mod:`analyzer.cost.hf_config` reads it from a Hugging Face
``config.json`` (the catalog's entries hold those same values).

KV bytes per token (``b`` = bytes per element: 2 for bf16, 1 for fp8):

* MHA/GQA/MQA layer: ``2 * kv_heads * head_dim * b`` (keys and values);
* MLA layer (DeepSeek-V3, Kimi-K2): ``(kv_lora_rank + qk_rope_head_dim) * b``, one latent
  shared by all heads and replicated on every tensor-parallel rank;
* sliding-window layer: as MHA/GQA, but holds at most ``window`` tokens;
* linear-attention layer (Gated DeltaNet): no per-token KV, a fixed per-request state.

For a context of ``T`` tokens the cache therefore holds
``full_bytes_per_token * T + window_bytes_per_token * min(T, window) + state_bytes``;
:meth:`ModelSpec.kv_bytes_per_token` is the first (marginal, long-context) term.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from analyzer.cost.dtypes import KV_DTYPES, dtype_bytes
from analyzer.errors import UsageError

FULL, SLIDING, LINEAR = "full", "sliding", "linear"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """KV geometry and size of one model (whole model, before tensor parallelism)."""

    id: str
    name: str
    source: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    total_params: float
    active_params: float
    layer_kinds: tuple[str, ...]  # FULL / SLIDING / LINEAR per layer
    sliding_window_tokens: int | None = None
    # MLA (DeepSeek-V2/V3, Kimi): latent rank and decoupled RoPE key; 0 when not MLA
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # linear attention (Gated DeltaNet): elements of per-request state per layer
    linear_state_elements_per_layer: int = 0
    linear_num_value_heads: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    hf_repo: str = ""
    params_source: str = ""
    params_estimated: bool = False
    weight_dtype: str = "bf16"  # dtype of the published checkpoint's weights
    aliases: tuple[str, ...] = ()

    # -- geometry -----------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def full_layers(self) -> int:
        return self.layer_kinds.count(FULL)

    @property
    def sliding_layers(self) -> int:
        return self.layer_kinds.count(SLIDING)

    @property
    def linear_layers(self) -> int:
        return self.layer_kinds.count(LINEAR)

    @property
    def attention_dim(self) -> int:
        """``d_attn`` of the FLOPs formula: per token and layer, QK^T and AV cost 2*d each.

        ``q_heads * head_dim`` for MHA/GQA; for MLA the QK width (nope + rope) and the V
        width differ, so their mean is used.
        """
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            return self.num_q_heads * (qk + self.v_head_dim) // 2
        return self.num_q_heads * self.head_dim

    def _elements_per_token_per_layer(self, tp: int, per_rank: bool) -> int:
        if self.is_mla:
            # One latent (plus the RoPE key) per token, needed whole by every rank.
            return self.kv_lora_rank + self.qk_rope_head_dim
        heads = self.num_kv_heads
        if per_rank:
            # kv_heads >= tp: each rank holds kv_heads/tp heads; kv_heads < tp: each
            # rank holds one (duplicated) head.
            heads = max(self.num_kv_heads // tp, 1)
        return 2 * heads * self.head_dim

    def check_tp(self, tp: int) -> None:
        """UsageError when ``tp`` cannot shard this model's heads."""
        if tp < 1:
            raise UsageError(f"--tp must be at least 1, got {tp}")
        if self.num_q_heads % tp:
            raise UsageError(
                f"tensor parallelism {tp} does not divide the {self.num_q_heads} attention "
                f"heads of {self.id}",
                hint="use a TP degree that divides the number of attention heads",
            )
        if not self.is_mla and self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise UsageError(
                f"tensor parallelism {tp} and the {self.num_kv_heads} KV heads of {self.id} "
                "do not divide one another",
                hint="engines need kv_heads % tp == 0 or tp % kv_heads == 0",
            )

    def kv_bytes_per_token(self, dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes the cluster stores per token in full-attention layers (unique heads).

        This is the marginal cost of one more token of context; sliding-window layers add
        :meth:`kv_window_bytes_per_token` for at most ``sliding_window_tokens`` tokens and
        linear-attention layers a fixed :meth:`linear_state_bytes`. A pool stores each head
        once, so the figure does not depend on ``tp`` (which is only validated).
        """
        self.check_tp(tp)
        b = dtype_bytes(dtype, allowed=KV_DTYPES)
        return int(self.full_layers * self._elements_per_token_per_layer(1, False) * b)

    def kv_window_bytes_per_token(self, dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes per token of the sliding-window layers (held for min(T, window) tokens)."""
        self.check_tp(tp)
        b = dtype_bytes(dtype, allowed=KV_DTYPES)
        return int(self.sliding_layers * self._elements_per_token_per_layer(1, False) * b)

    def kv_bytes_per_token_per_rank(self, dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes per token one tensor-parallel rank holds (and reads) in full layers.

        ``kv_bytes_per_token / tp`` when KV heads >= TP; one duplicated head per rank when
        KV heads < TP; the whole MLA latent on every rank.
        """
        self.check_tp(tp)
        b = dtype_bytes(dtype, allowed=KV_DTYPES)
        return int(self.full_layers * self._elements_per_token_per_layer(tp, True) * b)

    def kv_window_bytes_per_token_per_rank(self, dtype: str = "bf16", tp: int = 1) -> int:
        self.check_tp(tp)
        b = dtype_bytes(dtype, allowed=KV_DTYPES)
        return int(self.sliding_layers * self._elements_per_token_per_layer(tp, True) * b)

    def linear_state_bytes(self, tp: int = 1, *, per_rank: bool = False) -> int:
        """Fixed per-request state of the linear-attention layers, kept in bf16.

        Engines keep this recurrent state in the model dtype whatever the KV dtype, so it
        is always priced at 2 bytes per element. Per rank, the value heads are split.
        """
        self.check_tp(tp)
        total = self.linear_layers * self.linear_state_elements_per_layer * 2
        if per_rank and tp > 1:
            return int(total // min(tp, max(self.linear_num_value_heads, 1)))
        return int(total)

    def kv_bytes_for_tokens(
        self, tokens: int, dtype: str = "bf16", tp: int = 1, *, per_rank: bool = False
    ) -> int:
        """Bytes of cache for a context of ``tokens`` tokens.

        ``full * T + window * min(T, window_tokens) + state`` (state only when T > 0).
        """
        if tokens <= 0:
            return 0
        if per_rank:
            full = self.kv_bytes_per_token_per_rank(dtype, tp)
            win = self.kv_window_bytes_per_token_per_rank(dtype, tp)
        else:
            full = self.kv_bytes_per_token(dtype, tp)
            win = self.kv_window_bytes_per_token(dtype, tp)
        capped = min(tokens, self.sliding_window_tokens or tokens)
        state = self.linear_state_bytes(tp, per_rank=per_rank) if self.linear_layers else 0
        return int(full * tokens + win * capped + state)

    # -- parameters ---------------------------------------------------------------------
    @property
    def embedding_params(self) -> float:
        """Input embedding plus (when untied) the output head: not part of prefill FLOPs.

        Prefill needs logits for the last token only, so the head's cost is negligible.
        """
        factor = 1 if self.tie_word_embeddings else 2
        return float(self.vocab_size * self.hidden_size * factor)

    @property
    def active_nonembedding_params(self) -> float:
        return max(self.active_params - self.embedding_params, 0.0)

    def weight_bytes(self, dtype: str | None = None) -> int:
        """Bytes of all weights (every expert) in ``dtype`` (default: the checkpoint's)."""
        return int(self.total_params * dtype_bytes(dtype or self.weight_dtype))

    def weight_bytes_read(self, tokens_in_batch: int, dtype: str | None = None) -> float:
        """Weight bytes one forward pass over ``tokens_in_batch`` tokens reads from HBM.

        Dense models read every weight. For MoE only the experts some token picks are
        read: with E experts and top-k routing, each expert is untouched by one token with
        probability (1 - k/E), so the expected touched fraction is 1 - (1 - k/E)^tokens.
        Expert and shared weights are split from total and active counts:
        ``active = shared + k/E * experts`` and ``total = shared + experts``.
        """
        b = dtype_bytes(dtype or self.weight_dtype)
        if not self.is_moe or self.total_params <= self.active_params:
            return self.total_params * b
        ratio = self.experts_per_token / self.num_experts
        experts = (self.total_params - self.active_params) / (1.0 - ratio)
        shared = max(self.total_params - experts, 0.0)
        touched = 1.0 - (1.0 - ratio) ** max(tokens_in_batch, 1)
        return (shared + experts * touched) * b

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "hf_repo": self.hf_repo,
            # A user's config.json is named, not located: outputs carry no directories.
            "source": (
                os.path.basename(self.source)
                if self.source and os.path.isabs(self.source)
                else self.source
            ),
            "layers": self.num_layers,
            "full_attention_layers": self.full_layers,
            "sliding_window_layers": self.sliding_layers,
            "sliding_window_tokens": self.sliding_window_tokens,
            "linear_attention_layers": self.linear_layers,
            "q_heads": self.num_q_heads,
            "kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "mla": {"kv_lora_rank": self.kv_lora_rank, "qk_rope_head_dim": self.qk_rope_head_dim}
            if self.is_mla
            else None,
            "experts": {"total": self.num_experts, "per_token": self.experts_per_token}
            if self.is_moe
            else None,
            "total_params": self.total_params,
            "active_params": self.active_params,
            "params_estimated": self.params_estimated,
            "params_source": self.params_source,
            "weight_dtype": self.weight_dtype,
            "kv_bytes_per_token": {d: self.kv_bytes_per_token(d) for d in ("bf16", "fp8")},
            "kv_window_bytes_per_token": {
                d: self.kv_window_bytes_per_token(d) for d in ("bf16", "fp8")
            },
            "linear_state_bytes_per_request": self.linear_state_bytes(),
        }
