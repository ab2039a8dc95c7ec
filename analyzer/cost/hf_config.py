"""A Hugging Face ``config.json`` read into a :class:`ModelSpec`: the one parser for the
catalog's entries (``models/models.toml`` holds each model's own config values) and a
user's own config file.

Layer kinds (full, sliding-window, linear attention) come from ``layer_types`` or the
families' conventions (Qwen3-Next, Gemma 3, Qwen2, Mistral); parameter counts, when the
config does not give them, from :func:`estimate_params`. Every malformed field is an
InputError naming the file and field.
"""

from __future__ import annotations

from collections.abc import Mapping

from analyzer import limits
from analyzer.cost.model_spec import FULL, LINEAR, SLIDING, ModelSpec
from analyzer.errors import InputError, Location


def _get(cfg: Mapping[str, object], key: str, where: Location) -> object:
    value = cfg.get(key)
    if value is None:
        raise InputError(
            f"missing field '{key}' in the model config",
            Location(where.file, None, key),
            hint="a Hugging Face config.json names it; add it or pick a catalog model",
        )
    return value


def _positive_int(cfg: Mapping[str, object], key: str, where: Location) -> int:
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
    "full_attention_interval",
    "sliding_window_pattern",
    "max_window_layers",
    "shared_expert_intermediate_size",
)


# Of those, the ones 0 cannot mean none for: a model has key-value heads, a head width
# and a vocabulary (0 KV heads read as "as many as the query heads" was a silent misread).
_AT_LEAST_ONE = ("num_key_value_heads", "head_dim", "vocab_size")


def _int(cfg: Mapping[str, object], key: str, default: int = 0) -> int:
    """A whole-number field, or ``default`` when the config leaves it out or null.

    :func:`spec_from_hf_config` checks every such field (:data:`_OPTIONAL_INTS` and the
    required sizes) with the file and field named before any is read.
    """
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(
            f"field '{key}' must be a whole number, got {value!r}", Location("config", None, key)
        )
    return value


def _check_optional_ints(cfg: Mapping[str, object], where: Location) -> None:
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
        if value == 0 and key in _AT_LEAST_ONE:
            raise InputError(
                f"field '{key}' must be at least 1, got 0 (null or left out: not given)",
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


def _layer_kinds(cfg: Mapping[str, object], layers: int, where: Location) -> tuple[str, ...]:
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
            if not isinstance(t, str) or t not in mapping:
                raise InputError(
                    f"unknown layer type {t!r} at layer {i}",
                    Location(where.file, None, "layer_types"),
                    hint=f"known: {', '.join(sorted(mapping))}",
                )
            kinds.append(mapping[t])
        return tuple(kinds)
    interval = _int(cfg, "full_attention_interval")
    if interval:  # Qwen3-Next: every interval-th layer is full attention, others linear
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers))
    pattern = _int(cfg, "sliding_window_pattern")
    if pattern and cfg.get("sliding_window"):  # Gemma 3: (pattern-1) local then 1 global
        return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers))
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        # Qwen2: layers from max_window_layers on use the window.
        first = _int(cfg, "max_window_layers")
        return tuple(SLIDING if i >= first else FULL for i in range(layers))
    if cfg.get("sliding_window") and "use_sliding_window" not in cfg:
        # Mistral v0.1 style: a window on every layer.
        return tuple(SLIDING for _ in range(layers))
    return tuple(FULL for _ in range(layers))


def estimate_params(cfg: Mapping[str, object], spec_kinds: tuple[str, ...]) -> tuple[float, float]:
    """Total and active parameter counts estimated from config fields (matrices only).

    Attention projections, gated MLPs (3 matrices), MoE experts, routers, embeddings;
    norms and biases are ignored (well under 0.1%). Used for user configs and, in the
    tests, as an independent check of the catalog's published counts.
    """
    h = _int(cfg, "hidden_size")
    layers = _int(cfg, "num_hidden_layers")
    q_heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads") or q_heads
    head_dim = _int(cfg, "head_dim") or h // q_heads
    vocab = _int(cfg, "vocab_size")
    tied = bool(cfg.get("tie_word_embeddings", False))
    if lora := _int(cfg, "kv_lora_rank"):
        rope, nope = _int(cfg, "qk_rope_head_dim"), _int(cfg, "qk_nope_head_dim", 128)
        v = _int(cfg, "v_head_dim", nope)
        q_lora = _int(cfg, "q_lora_rank")
        q = h * q_lora + q_lora * q_heads * (nope + rope) if q_lora else h * q_heads * (nope + rope)
        kv = h * (lora + rope) + lora * q_heads * (nope + v)
        attn = q + kv + q_heads * v * h
    else:
        attn = h * q_heads * head_dim * 2 + 2 * h * kv_heads * head_dim
    # linear attention (Gated DeltaNet) projections
    nk, nv = _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_num_value_heads")
    dk, dv = _int(cfg, "linear_key_head_dim"), _int(cfg, "linear_value_head_dim")
    lin = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + nv * dv * h
    experts = (
        _int(cfg, "num_experts") or _int(cfg, "num_local_experts") or _int(cfg, "n_routed_experts")
    )
    top_k = _int(cfg, "num_experts_per_tok")
    inter = _int(cfg, "intermediate_size")
    dense_mlp = 3 * h * inter
    total = active = float(vocab * h * (1 if tied else 2))
    first_dense = _int(cfg, "first_k_dense_replace")
    for i, kind in enumerate(spec_kinds):
        mixer = lin if kind == LINEAR else attn
        total += mixer
        active += mixer
        if experts and i >= first_dense:
            moe_inter = _int(cfg, "moe_intermediate_size") or inter
            per_expert = 3 * h * moe_inter
            shared = _int(cfg, "n_shared_experts") * per_expert
            shared += 3 * h * _int(cfg, "shared_expert_intermediate_size")
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
    config: Mapping[str, object],
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
    cfg: Mapping[str, object] = config
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in cfg:
        cfg = {**text}
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
        head_dim = (_int(cfg, "qk_nope_head_dim") or 128) + _int(cfg, "qk_rope_head_dim")
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
    given = cfg.get("sliding_window") if SLIDING in kinds else None
    if SLIDING in kinds and (not isinstance(given, int) or given <= 0):
        raise InputError(
            f"sliding-window layers need a positive 'sliding_window', got {given!r}",
            Location(loc.file, None, "sliding_window"),
        )
    window = given if isinstance(given, int) else None
    kv_lora = rope = nope = v_dim = 0
    if is_mla:
        kv_lora = _positive_int(cfg, "kv_lora_rank", loc)
        rope = _positive_int(cfg, "qk_rope_head_dim", loc)
        nope = _int(cfg, "qk_nope_head_dim") or head_dim
        v_dim = _int(cfg, "v_head_dim") or nope
    state = n_v = 0
    if LINEAR in kinds:
        nk = _positive_int(cfg, "linear_num_key_heads", loc)
        n_v = _positive_int(cfg, "linear_num_value_heads", loc)
        dk = _positive_int(cfg, "linear_key_head_dim", loc)
        dv = _positive_int(cfg, "linear_value_head_dim", loc)
        kernel = _int(cfg, "linear_conv_kernel_dim", 4)
        # recurrent state (one dk x dv matrix per value head) + causal-conv tail over q,k,v
        state = n_v * dk * dv + (2 * nk * dk + n_v * dv) * (kernel - 1)
    experts = (
        _int(cfg, "num_experts") or _int(cfg, "num_local_experts") or _int(cfg, "n_routed_experts")
    )
    top_k = _int(cfg, "num_experts_per_tok") or _int(cfg, "experts_per_token")
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
        vocab_size=_int(cfg, "vocab_size"),
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
