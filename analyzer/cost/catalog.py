"""Model and hardware catalogs: KV geometry, parameter counts, GPUs, tiers and links.

The data lives in ``models/models.toml`` and ``models/hardware.toml`` (reviewable data
files, each entry citing its source); this module parses them into frozen specs. A
catalog model entry holds the values of the model's own Hugging Face ``config.json``, so
a user's ``config.json`` goes through the very same parser (:func:`spec_from_hf_config`).

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

import difflib
import functools
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer import limits
from analyzer.errors import InputError, Location, UsageError
from analyzer.outputs import note_input

# mxfp4: 4-bit values plus one 8-bit scale per 32 (4.25 bits), as in gpt-oss checkpoints
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "mxfp4": 4.25 / 8,
    "fp4": 4.5 / 8,  # NVFP4: 4-bit values plus one FP8 scale per 16
    "int4": 0.5,
}
KV_DTYPES = ("bf16", "fp16", "fp8")
# Deployment precisions of the weights (--weights-dtype): what the GEMMs run at when the
# GPU has tensor cores for it (W8A8 fp8, W4A4 fp4); otherwise the weights are dequantized
# and the GEMMs run at the next precision the GPU has (see GpuSpec.compute_dtype_for).
WEIGHT_DTYPES = ("bf16", "fp8", "fp4")

FULL, SLIDING, LINEAR = "full", "sliding", "linear"


def models_dir() -> Path:
    """Where the catalogs and fitted profiles live (``KVPOOL_MODELS_DIR`` overrides)."""
    env = os.environ.get("KVPOOL_MODELS_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "models"


def dtype_bytes(dtype: str, *, allowed: tuple[str, ...] | None = None) -> float:
    """Bytes per element of ``dtype``; UsageError naming the valid choices otherwise."""
    key = dtype.strip().lower()
    choices = allowed or tuple(DTYPE_BYTES)
    if key not in DTYPE_BYTES or key not in choices:
        raise UsageError(f"unknown dtype '{dtype}'", hint=f"choose one of {', '.join(choices)}")
    return DTYPE_BYTES[key]


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


# ---------------------------------------------------------------------------------------
# Model specs


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

    def to_json(self) -> dict[str, Any]:
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


def _get(cfg: Mapping[str, Any], key: str, where: Location, *, required: bool = True) -> Any:
    value = cfg.get(key)
    if value is None and required:
        raise InputError(
            f"missing field '{key}' in the model config",
            Location(where.file, None, key),
            hint="a Hugging Face config.json names it; add it or pick a catalog model",
        )
    return value


def _positive_int(cfg: Mapping[str, Any], key: str, where: Location) -> int:
    value = _get(cfg, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(
            f"field '{key}' must be a positive integer, got {value!r}",
            Location(where.file, None, key),
        )
    # 10^30 layers made the KV arithmetic run for minutes, then run out of memory.
    kind = "model_layers" if "layers" in key else "model_width"
    if why := limits.reason(value, kind):
        raise InputError(f"field '{key}' is {value:,}: {why}", Location(where.file, None, key))
    return value


# Whole-number fields a config may give (counts and sizes; 0 allowed where it means none):
# each is read as written, so `true` (Python's 1), -5 or 10^12 must not pass as a size.
_OPTIONAL_INTS = (
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "intermediate_size",
    "moe_intermediate_size",
    "sliding_window",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "n_shared_experts",
    "first_k_dense_replace",
)


def _check_optional_ints(cfg: Mapping[str, Any], where: Location) -> None:
    """Every whole-number field the config gives is one, in range (null: not given)."""
    for key in _OPTIONAL_INTS:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(
                f"field '{key}' must be a whole number >= 0, got {value!r}",
                Location(where.file, None, key),
            )
        if value and (why := limits.reason(value, "model_width")):
            raise InputError(f"field '{key}' is {value:,}: {why}", Location(where.file, None, key))
    tied = cfg.get("tie_word_embeddings")
    if tied is not None and not isinstance(tied, bool):
        raise InputError(
            f"field 'tie_word_embeddings' must be true or false, got {tied!r}",
            Location(where.file, None, "tie_word_embeddings"),
        )


def _layer_kinds(cfg: Mapping[str, Any], layers: int, where: Location) -> tuple[str, ...]:
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise InputError(
                f"'layer_types' must list {layers} entries (num_hidden_layers), "
                f"got {len(types) if isinstance(types, list) else type(types).__name__}",
                Location(where.file, None, "layer_types"),
            )
        mapping = {
            "full_attention": FULL,
            "attention": FULL,
            "sliding_attention": SLIDING,
            "chunked_attention": SLIDING,
            "linear_attention": LINEAR,
            "mamba": LINEAR,
        }
        kinds = []
        for i, t in enumerate(types):
            if t not in mapping:
                raise InputError(
                    f"unknown layer type {t!r} at layer {i}",
                    Location(where.file, None, "layer_types"),
                    hint=f"known: {', '.join(sorted(mapping))}",
                )
            kinds.append(mapping[t])
        return tuple(kinds)
    interval = cfg.get("full_attention_interval")
    if interval:  # Qwen3-Next: every interval-th layer is full attention, others linear
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers))
    pattern = cfg.get("sliding_window_pattern")
    if pattern and cfg.get("sliding_window"):  # Gemma 3: (pattern-1) local then 1 global
        return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers))
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        # Qwen2: layers from max_window_layers on use the window.
        first = cfg.get("max_window_layers", 0) or 0
        return tuple(SLIDING if i >= first else FULL for i in range(layers))
    if cfg.get("sliding_window") and "use_sliding_window" not in cfg:
        # Mistral v0.1 style: a window on every layer.
        return tuple(SLIDING for _ in range(layers))
    return tuple(FULL for _ in range(layers))


def estimate_params(cfg: Mapping[str, Any], spec_kinds: tuple[str, ...]) -> tuple[float, float]:
    """Total and active parameter counts estimated from config fields (matrices only).

    Attention projections, gated MLPs (3 matrices), MoE experts, routers, embeddings;
    norms and biases are ignored (well under 0.1%). Used for user configs and, in the
    tests, as an independent check of the catalog's published counts.
    """
    h = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    q_heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or q_heads
    head_dim = cfg.get("head_dim") or h // q_heads
    vocab = cfg.get("vocab_size", 0)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if cfg.get("kv_lora_rank"):
        rope, nope = cfg["qk_rope_head_dim"], cfg.get("qk_nope_head_dim", 128)
        v = cfg.get("v_head_dim", nope)
        q_lora = cfg.get("q_lora_rank") or 0
        q = h * q_lora + q_lora * q_heads * (nope + rope) if q_lora else h * q_heads * (nope + rope)
        kv = h * (cfg["kv_lora_rank"] + rope) + cfg["kv_lora_rank"] * q_heads * (nope + v)
        attn = q + kv + q_heads * v * h
    else:
        attn = h * q_heads * head_dim * 2 + 2 * h * kv_heads * head_dim
    # linear attention (Gated DeltaNet) projections
    nk, nv = cfg.get("linear_num_key_heads", 0), cfg.get("linear_num_value_heads", 0)
    dk, dv = cfg.get("linear_key_head_dim", 0), cfg.get("linear_value_head_dim", 0)
    lin = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + nv * dv * h
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    experts = experts or 0
    top_k = cfg.get("num_experts_per_tok") or 0
    inter = cfg.get("intermediate_size", 0)
    dense_mlp = 3 * h * inter
    total = active = float(vocab * h * (1 if tied else 2))
    first_dense = cfg.get("first_k_dense_replace", 0) or 0
    for i, kind in enumerate(spec_kinds):
        mixer = lin if kind == LINEAR else attn
        total += mixer
        active += mixer
        if experts and i >= first_dense:
            moe_inter = cfg.get("moe_intermediate_size") or inter
            per_expert = 3 * h * moe_inter
            shared = 0
            if cfg.get("n_shared_experts"):
                shared = cfg["n_shared_experts"] * per_expert
            if cfg.get("shared_expert_intermediate_size"):
                shared += 3 * h * cfg["shared_expert_intermediate_size"]
            router = h * experts
            total += experts * per_expert + shared + router
            active += top_k * per_expert + shared + router
        else:
            total += dense_mlp
            active += dense_mlp
    assert len(spec_kinds) == layers
    return float(total), float(active)


def spec_from_hf_config(
    model_id: str,
    config: Mapping[str, Any],
    *,
    name: str | None = None,
    source: str = "",
    total_params: float | None = None,
    active_params: float | None = None,
    params_source: str = "",
    hf_repo: str = "",
    aliases: tuple[str, ...] = (),
    where: str | None = None,
    weight_dtype: str = "bf16",
) -> ModelSpec:
    """Build a :class:`ModelSpec` from Hugging Face ``config.json`` fields.

    Multimodal configs (Gemma 3, Llama 4, ...) are read from their ``text_config``.
    Raises InputError naming the field when the config is incomplete or inconsistent.
    """
    loc = Location(where or source or model_id)
    cfg: Mapping[str, Any] = config
    if isinstance(cfg.get("text_config"), Mapping) and "num_hidden_layers" not in cfg:
        cfg = {**cfg["text_config"]}
    _check_optional_ints(cfg, loc)
    layers = _positive_int(cfg, "num_hidden_layers", loc)
    q_heads = _positive_int(cfg, "num_attention_heads", loc)
    hidden = _positive_int(cfg, "hidden_size", loc)
    kv_heads = cfg.get("num_key_value_heads") or q_heads
    if not isinstance(kv_heads, int) or kv_heads <= 0:
        raise InputError(
            f"field 'num_key_value_heads' must be a positive integer, got {kv_heads!r}",
            Location(loc.file, None, "num_key_value_heads"),
        )
    is_mla = bool(cfg.get("kv_lora_rank"))
    if not is_mla and q_heads % kv_heads:
        raise InputError(
            f"num_attention_heads ({q_heads}) is not a multiple of num_key_value_heads "
            f"({kv_heads}): grouped-query attention needs whole groups",
            Location(loc.file, None, "num_key_value_heads"),
        )
    head_dim = cfg.get("head_dim")
    if head_dim is None and is_mla and cfg.get("qk_rope_head_dim"):
        # MLA query/key head: the non-RoPE part plus the decoupled RoPE part
        head_dim = (cfg.get("qk_nope_head_dim") or 128) + cfg["qk_rope_head_dim"]
    if head_dim is None:
        if hidden % q_heads:
            raise InputError(
                f"no 'head_dim' and hidden_size ({hidden}) is not divisible by "
                f"num_attention_heads ({q_heads})",
                Location(loc.file, None, "head_dim"),
            )
        head_dim = hidden // q_heads
    if not isinstance(head_dim, int) or head_dim <= 0:
        raise InputError(
            f"field 'head_dim' must be a positive integer, got {head_dim!r}",
            Location(loc.file, None, "head_dim"),
        )
    kinds = _layer_kinds(cfg, layers, loc)
    window = cfg.get("sliding_window") if SLIDING in kinds else None
    if SLIDING in kinds and (not isinstance(window, int) or window <= 0):
        raise InputError(
            f"sliding-window layers need a positive 'sliding_window', got {window!r}",
            Location(loc.file, None, "sliding_window"),
        )
    kv_lora = rope = nope = v_dim = 0
    if is_mla:
        kv_lora = _positive_int(cfg, "kv_lora_rank", loc)
        rope = _positive_int(cfg, "qk_rope_head_dim", loc)
        nope = cfg.get("qk_nope_head_dim") or head_dim
        v_dim = cfg.get("v_head_dim") or nope
    state = n_v = 0
    if LINEAR in kinds:
        nk = _positive_int(cfg, "linear_num_key_heads", loc)
        n_v = _positive_int(cfg, "linear_num_value_heads", loc)
        dk = _positive_int(cfg, "linear_key_head_dim", loc)
        dv = _positive_int(cfg, "linear_value_head_dim", loc)
        kernel = cfg.get("linear_conv_kernel_dim", 4)
        # recurrent state (one dk x dv matrix per value head) + causal-conv tail over q,k,v
        state = n_v * dk * dv + (2 * nk * dk + n_v * dv) * (kernel - 1)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    experts = int(experts or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)
    if experts and not 0 < top_k <= experts:
        raise InputError(
            f"MoE config with {experts} experts needs 0 < num_experts_per_tok <= {experts}, "
            f"got {top_k}",
            Location(loc.file, None, "num_experts_per_tok"),
        )
    estimated = total_params is None or active_params is None
    if estimated:
        if "vocab_size" not in cfg:
            raise InputError(
                "missing field 'vocab_size' in the model config",
                Location(loc.file, None, "vocab_size"),
            )
        est_total, est_active = estimate_params(cfg, kinds)
        total_params = est_total if total_params is None else total_params
        active_params = est_active if active_params is None else active_params
        params_source = params_source or "estimated from config.json (matrices only)"
    assert total_params is not None and active_params is not None
    if active_params > total_params:
        raise InputError(
            f"active_params ({active_params:.3g}) exceed total_params ({total_params:.3g})",
            Location(loc.file, None, "active_params"),
        )
    return ModelSpec(
        id=model_id,
        name=name or model_id,
        source=source,
        num_layers=layers,
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=int(cfg.get("vocab_size") or 0),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        total_params=float(total_params),
        active_params=float(active_params),
        layer_kinds=kinds,
        sliding_window_tokens=window,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        v_head_dim=v_dim,
        linear_state_elements_per_layer=state,
        linear_num_value_heads=n_v,
        num_experts=experts,
        experts_per_token=top_k,
        hf_repo=hf_repo,
        params_source=params_source,
        params_estimated=estimated,
        weight_dtype=weight_dtype,
        aliases=aliases,
    )


# ---------------------------------------------------------------------------------------
# Hardware specs


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator: dense peak compute and HBM."""

    id: str
    name: str
    vendor: str
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_gib: float
    hbm_tbps: float
    source: str = ""
    aliases: tuple[str, ...] = ()
    fp4_tflops: float | None = None
    interconnect_gbps: float = 0.0  # GPU-to-GPU bandwidth each way (NVLink / Infinity Fabric)

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * 2**30)

    def compute_dtype_for(self, weight_dtype: str) -> str:
        """The precision GEMMs run at for weights stored in ``weight_dtype``.

        fp8 weights run on fp8 tensor cores (W8A8) and fp4 weights on fp4 ones (W4A4) where
        the GPU has them; otherwise they are dequantized on the fly and the GEMMs run in
        bf16 (W4A16 / W8A16 kernels: mxfp4 gpt-oss on H100, fp8 on A100).
        """
        wants = {"fp4": "fp4", "mxfp4": "fp4", "int4": "fp4", "fp8": "fp8", "int8": "fp8"}
        key = wants.get(weight_dtype.strip().lower(), "bf16")
        if key == "fp4" and self.fp4_tflops is not None:
            return "fp4"
        if key == "fp8" and self.fp8_tflops is not None:
            return "fp8"
        return "bf16"

    def tflops(self, dtype: str = "bf16") -> float:
        """Dense peak TFLOP/s for ``dtype`` (bf16/fp16 or fp8)."""
        key = dtype.strip().lower()
        if key in ("bf16", "fp16"):
            return self.bf16_tflops
        if key == "fp8":
            if self.fp8_tflops is None:
                raise UsageError(
                    f"{self.name} has no fp8 tensor cores", hint="use --compute-dtype bf16"
                )
            return self.fp8_tflops
        if key == "fp4":
            if self.fp4_tflops is None:
                raise UsageError(
                    f"{self.name} has no fp4 tensor cores", hint="use --weights-dtype fp8 or bf16"
                )
            return self.fp4_tflops
        raise UsageError(f"unknown compute dtype '{dtype}'", hint="choose bf16, fp8 or fp4")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "bf16_tflops": self.bf16_tflops,
            "fp8_tflops": self.fp8_tflops,
            "fp4_tflops": self.fp4_tflops,
            "interconnect_gbps": self.interconnect_gbps,
            "hbm_gib": self.hbm_gib,
            "hbm_tbps": self.hbm_tbps,
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class TierSpec:
    """A place KV can be loaded from, with its effective bandwidth and first-byte latency."""

    name: str
    bandwidth_gbps: float
    latency_s: float
    kind: str = "network"
    description: str = ""
    source: str = ""
    aliases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "bandwidth_gbps": self.bandwidth_gbps,
            "latency_s": self.latency_s,
            "description": self.description,
            "source": self.source,
        }


def check_bandwidth(bandwidth_gbps: float, what: str = "bandwidth") -> float:
    """UsageError unless ``bandwidth_gbps`` is a finite positive number."""
    if (
        not bandwidth_gbps == bandwidth_gbps
        or bandwidth_gbps <= 0
        or bandwidth_gbps == float("inf")
    ):
        raise UsageError(
            f"{what} must be a positive number of GB/s, got {bandwidth_gbps}",
            hint="GB/s are decimal (1e9 bytes/s); a 200 Gb/s NIC is about 21.75 GB/s effective",
        )
    return float(bandwidth_gbps)


# ---------------------------------------------------------------------------------------
# Catalog loading and lookup


@dataclass(frozen=True, slots=True)
class _Catalog:
    models: dict[str, ModelSpec]
    gpus: dict[str, GpuSpec]
    tiers: dict[str, TierSpec]
    model_alias: dict[str, str]
    gpu_alias: dict[str, str]
    tier_alias: dict[str, str]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise InputError(f"catalog file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"catalog file is not valid TOML: {exc}", Location(str(path))) from exc


def _aliases(key: str, entry: Mapping[str, Any], extra: tuple[str, ...] = ()) -> dict[str, str]:
    out = {_norm(key): key}
    for alias in (*entry.get("aliases", ()), *extra):
        out.setdefault(_norm(alias), key)
    return out


@functools.cache
def _load(directory: str) -> _Catalog:
    root = Path(directory)
    mdata = _read_toml(root / "models.toml").get("models", {})
    models: dict[str, ModelSpec] = {}
    model_alias: dict[str, str] = {}
    for key, entry in mdata.items():
        where = f'{root / "models.toml"} [models."{key}"]'
        for field in ("config", "total_params", "active_params", "source"):
            if field not in entry:
                raise InputError(f"catalog entry lacks '{field}'", Location(where, None, field))
        models[key] = spec_from_hf_config(
            key,
            entry["config"],
            name=entry.get("name", key),
            source=entry["source"],
            total_params=float(entry["total_params"]),
            active_params=float(entry["active_params"]),
            params_source=entry.get("params_source", ""),
            hf_repo=entry.get("hf_repo", ""),
            aliases=tuple(entry.get("aliases", ())),
            where=where,
            weight_dtype=entry.get("weight_dtype", "bf16"),
        )
        repo = entry.get("hf_repo", "")
        extra = (repo, repo.split("/")[-1]) if repo else ()
        for alias, target in _aliases(key, entry, extra).items():
            model_alias.setdefault(alias, target)
    hdata = _read_toml(root / "hardware.toml")
    gpus: dict[str, GpuSpec] = {}
    gpu_alias: dict[str, str] = {}
    for key, entry in hdata.get("gpus", {}).items():
        gpus[key] = GpuSpec(
            id=key,
            name=entry.get("name", key),
            vendor=entry.get("vendor", ""),
            bf16_tflops=float(entry["bf16_tflops"]),
            fp8_tflops=float(entry["fp8_tflops"]) if "fp8_tflops" in entry else None,
            hbm_gib=float(entry["hbm_gib"]),
            hbm_tbps=float(entry["hbm_tbps"]),
            source=entry.get("source", ""),
            aliases=tuple(entry.get("aliases", ())),
            fp4_tflops=float(entry["fp4_tflops"]) if "fp4_tflops" in entry else None,
            interconnect_gbps=float(entry.get("interconnect_gbps", 0.0)),
        )
        gpu_alias.update(_aliases(key, entry))
    tiers: dict[str, TierSpec] = {}
    tier_alias: dict[str, str] = {}
    for key, entry in hdata.get("tiers", {}).items():
        tiers[key] = TierSpec(
            name=key,
            bandwidth_gbps=float(entry["bandwidth_gbps"]),
            latency_s=float(entry["latency_s"]),
            kind=entry.get("kind", "network"),
            description=entry.get("description", ""),
            source=entry.get("source", ""),
            aliases=tuple(entry.get("aliases", ())),
        )
        tier_alias.update(_aliases(key, entry))
    return _Catalog(models, gpus, tiers, model_alias, gpu_alias, tier_alias)


def _catalog() -> _Catalog:
    return _load(str(models_dir()))


def _unknown(kind: str, name: str, names: list[str], listing: str) -> UsageError:
    close = difflib.get_close_matches(_norm(name), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return UsageError(f"unknown {kind} '{name}'", hint=f"{hint}`{listing}` lists them all")


def _suggestions(alias_map: dict[str, str]) -> list[str]:
    return sorted(set(alias_map) | set(alias_map.values()))


# What served names add to a model's name: its variant (-Instruct, -chat) and the
# quantization of the checkpoint, as Hugging Face repositories name them (-FP8,
# -FP8-Dynamic, -AWQ, -GPTQ-Int4, -W8A8, -NVFP4, ...), and a release date (-2507).
_VARIANT_SUFFIXES = ("-instruct", "-it", "-chat", "-hf", "-base")
# suffix -> the weights precision the cost model can price it at (None: kept as the
# catalog's, since the cost model has no integer weight formats)
_QUANT_SUFFIXES: dict[str, str | None] = {
    "-fp8-dynamic": "fp8",
    "-fp8": "fp8",
    "-nvfp4": "fp4",
    "-mxfp4": "fp4",
    "-fp4": "fp4",
    "-bf16": None,
    "-fp16": None,
    "-awq": None,
    "-gptq-int4": None,
    "-gptq-int8": None,
    "-gptq": None,
    "-int4": None,
    "-int8": None,
    "-w8a8": None,
    "-w4a16": None,
    "-gguf": None,
}
_DATE_SUFFIX = re.compile(r"-\d{4}$")


def _suffixes(key: str) -> tuple[str, list[str]]:
    """``key`` without its variant, quantization and date suffixes (any order, any
    number of them), and the quantization suffixes it had."""
    quant: list[str] = []
    while True:
        for suffix in (*_QUANT_SUFFIXES, *_VARIANT_SUFFIXES):
            if key.endswith(suffix) and len(key) > len(suffix):
                if suffix in _QUANT_SUFFIXES:
                    quant.append(suffix)
                key = key[: -len(suffix)]
                break
        else:
            m = _DATE_SUFFIX.search(key)
            if m is None or m.start() == 0:
                return key, quant
            key = key[: m.start()]


def _strip_suffixes(key: str) -> str:
    return _suffixes(key)[0]


def quantization_of(served_name: str) -> str | None:
    """The weights precision a served name's quantization suffix stands for (``fp8`` for
    ``Qwen/Qwen3-32B-FP8``), None when it has none the cost model prices differently."""
    _, quant = _suffixes(_norm(served_name).split("/")[-1])
    for q in quant:
        if _QUANT_SUFFIXES[q] is not None:
            return _QUANT_SUFFIXES[q]
    return None


def model_from_config_file(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` on disk."""
    p = Path(path)
    note_input(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InputError(f"model config not found: {p}") from exc
    except OSError as exc:
        raise InputError(f"cannot read model config {p}: {exc}") from exc
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", Location(str(p), exc.lineno)) from exc
    if not isinstance(cfg, dict):
        raise InputError("a config.json must hold a JSON object", Location(str(p), 1))
    model_id = cfg.get("_name_or_path") or (p.parent.name if p.parent.name else p.stem)
    return spec_from_hf_config(
        _norm(str(model_id).split("/")[-1]) or "custom",
        cfg,
        name=str(model_id),
        source=str(p),  # a profile rebuilds the model from it (CostModel.model_ref)
        where=str(p),
    )


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog model by id or alias (case-insensitive), or a ``config.json`` path."""
    text = str(name_or_path)
    if text.endswith(".json") or Path(text).is_file():
        return model_from_config_file(text)
    if Path(text).is_dir():  # a downloaded model directory
        return model_from_config_file(Path(text) / "config.json")
    cat = _catalog()
    key = _norm(text)
    target = cat.model_alias.get(key) or cat.model_alias.get(_strip_suffixes(key))
    if target is None:
        raise _unknown("model", text, _suggestions(cat.model_alias), "kvpool cost models")
    return cat.models[target]


def recognize_model(served_name: str) -> str | None:
    """The catalog id a served model name stands for, or None.

    Gateway logs name the model as the engine serves it: a Hugging Face repo
    (``meta-llama/Llama-3.1-70B-Instruct``), its last part, a catalog alias or a
    variant with a suffix (``-Instruct``, ``-FP8``). Paths are not names: never read.
    """
    cat = _catalog()
    key = _norm(served_name)
    for k in (key, key.split("/")[-1]):
        target = cat.model_alias.get(k) or cat.model_alias.get(_strip_suffixes(k))
        if target is not None:
            return target
    return None


# Words in a GPU's name that make it another product than the catalog's SXM part of
# the same family (a PCIe card or an NVL board has other memory, clocks and links).
_OTHER_FORM = {"pcie", "nvl", "40gb"}


def recognize_gpu(name: str) -> str | None:
    """The catalog id a GPU name stands for, as vendors and clouds write them: the id or
    an alias (``H100-SXM``, ``h100_sxm``, ``p5.48xlarge``), or a name holding one as a
    word (``NVIDIA H100 80GB HBM3``, ``gpu_8x_h100_sxm5``); None for another form of the
    chip (``H100 PCIe``, ``H100 NVL``) or a GPU the catalog does not hold."""
    cat = _catalog()
    key = _norm(name)
    for k in (key, key.removeprefix("nvidia-"), key.removeprefix("amd-")):
        if k in cat.gpu_alias:
            return cat.gpu_alias[k]
    words = [w for w in re.split(r"[-.]", key) if w]
    if _OTHER_FORM & set(words):
        return None
    found = {cat.gpu_alias[w] for w in words if w in cat.gpu_alias}
    return found.pop() if len(found) == 1 else None


def get_gpu(name: str) -> GpuSpec:
    """A catalog GPU by id or alias (case-insensitive): ``h100``, ``H100-SXM``, ``mi300x``,
    or a name as vendors and clouds write it (:func:`recognize_gpu`)."""
    cat = _catalog()
    target = recognize_gpu(name)
    if target is None:
        raise _unknown("GPU", name, _suggestions(cat.gpu_alias), "kvpool cost gpus")
    return cat.gpus[target]


def get_tier(name: str) -> TierSpec:
    """A catalog tier or link by name or alias: ``rdma-200``, ``pcie-gen5-dram``, ``nvme-gen4``."""
    cat = _catalog()
    target = cat.tier_alias.get(_norm(name))
    if target is None:
        raise _unknown("tier", name, _suggestions(cat.tier_alias), "kvpool cost gpus")
    return cat.tiers[target]


def list_models() -> list[ModelSpec]:
    return [m for _, m in sorted(_catalog().models.items())]


def list_gpus() -> list[GpuSpec]:
    return [g for _, g in sorted(_catalog().gpus.items())]


def list_tiers() -> list[TierSpec]:
    """Tiers in catalog order (fastest local first, as the data file lists them)."""
    return list(_catalog().tiers.values())
