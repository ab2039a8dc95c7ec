"""Catalog checks: every entry's KV bytes per token against an independent computation
from its raw config fields, golden figures from the models' published config.json, TP sharding, user configs, lookups."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.cost import get_gpu, get_model, get_tier, list_gpus, list_models, list_tiers
from analyzer.cost.hf_config import estimate_params, spec_from_hf_config
from analyzer.errors import InputError, UsageError

ROOT = Path(__file__).resolve().parents[2]
RAW = tomllib.loads((ROOT / "models" / "models.toml").read_text())["models"]
HW = tomllib.loads((ROOT / "models" / "hardware.toml").read_text())

# bf16 bytes per token: 2 (K and V) x layers x KV heads x head dim x 2 bytes, from each
# model's config.json on Hugging Face.
GOLDEN_BF16 = {
    "llama-3.1-8b": 131_072,
    "llama-3.1-70b": 327_680,
    "qwen2.5-32b": 262_144,
    "qwen2.5-7b": 57_344,
    "qwen3-235b-a22b": 192_512,
    "qwen3-coder-480b-a35b": 253_952,
    "deepseek-v3": 70_272,
}

REQUIRED = [
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "qwen2.5-7b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen3-32b",
    "qwen3-235b-a22b",
    "qwen3-coder-480b-a35b",
    "deepseek-v3",
    "mixtral-8x7b",
    "gpt-oss-120b",
    "gemma-3-27b",
    "qwen3-next-80b-a3b",
]


def _independent_layers(cfg: dict) -> tuple[int, int, int]:
    """(full, sliding, linear) layer counts read straight from the raw config."""
    n = cfg["num_hidden_layers"]
    if "layer_types" in cfg:
        t = cfg["layer_types"]
        return t.count("full_attention"), t.count("sliding_attention"), t.count("linear_attention")
    if "full_attention_interval" in cfg:
        full = n // cfg["full_attention_interval"]
        return full, 0, n - full
    if "sliding_window_pattern" in cfg:
        full = n // cfg["sliding_window_pattern"]
        return full, n - full, 0
    assert not cfg.get("use_sliding_window", False)
    return n, 0, 0


def _independent_bytes(cfg: dict, elem_bytes: int) -> tuple[int, int]:
    """(full-layer bytes per token, window-layer bytes per token)."""
    full, sliding, _ = _independent_layers(cfg)
    if cfg.get("kv_lora_rank"):
        per_layer = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    else:
        head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        per_layer = 2 * cfg["num_key_value_heads"] * head_dim
    return per_layer * full * elem_bytes, per_layer * sliding * elem_bytes


def test_required_models_and_extras_present():
    ids = {m.id for m in list_models()}
    assert set(REQUIRED) <= ids
    assert {"llama-3.2-3b", "qwen3-8b", "mistral-7b", "kimi-k2"} <= ids
    assert len(ids) >= 20


@pytest.mark.parametrize("model_id", sorted(RAW))
def test_every_entry_bytes_per_token_independent(model_id):
    raw = RAW[model_id]
    spec = get_model(model_id)
    for dtype, b in (("bf16", 2), ("fp8", 1)):
        full, window = _independent_bytes(raw["config"], b)
        assert spec.kv_bytes_per_token(dtype) == full
        assert spec.kv_window_bytes_per_token(dtype) == window
    # every entry cites the config.json it was read from
    assert "huggingface.co" in raw["source"] and raw["hf_repo"] in raw["source"]
    assert raw["params_source"]


@pytest.mark.parametrize("model_id", sorted(GOLDEN_BF16))
def test_field_md_golden_numbers(model_id):
    assert get_model(model_id).kv_bytes_per_token("bf16") == GOLDEN_BF16[model_id]
    assert get_model(model_id).kv_bytes_per_token("fp8") == GOLDEN_BF16[model_id] // 2


@pytest.mark.parametrize("model_id", sorted(RAW))
def test_published_params_agree_with_config_estimate(model_id):
    raw = RAW[model_id]
    spec = get_model(model_id)
    cfg = raw["config"]
    total, active = estimate_params(cfg, spec.layer_kinds)
    assert abs(total - raw["total_params"]) / raw["total_params"] < 0.03
    # active counts differ in whether embeddings are counted: allow 30%
    assert abs(active - raw["active_params"]) / raw["active_params"] < 0.30
    assert spec.active_params <= spec.total_params


def test_sliding_window_models():
    g = get_model("gpt-oss-120b")
    assert (g.full_layers, g.sliding_layers, g.sliding_window_tokens) == (18, 18, 128)
    per_layer = 2 * 8 * 64 * 2
    assert g.kv_bytes_per_token() == 18 * per_layer == 36_864
    # bytes(T) = full * T + window * min(T, 128)
    assert g.kv_bytes_for_tokens(1000) == 36_864 * 1000 + 36_864 * 128
    assert g.kv_bytes_for_tokens(100) == 36_864 * 100 * 2
    gem = get_model("gemma-3-27b")
    assert (gem.full_layers, gem.sliding_layers, gem.sliding_window_tokens) == (10, 52, 1024)
    assert gem.kv_bytes_for_tokens(4096) == 10 * 8192 * 4096 + 52 * 8192 * 1024


def test_hybrid_linear_attention_state():
    q = get_model("qwen3-next-80b-a3b")
    assert (q.full_layers, q.linear_layers) == (12, 36)
    assert q.kv_bytes_per_token() == 2 * 12 * 2 * 256 * 2 == 24_576
    recurrent = 32 * 128 * 128
    conv = (2 * 16 * 128 + 32 * 128) * (4 - 1)
    assert q.linear_state_bytes() == 36 * (recurrent + conv) * 2 == 39_518_208
    assert q.kv_bytes_for_tokens(10) == 24_576 * 10 + 39_518_208
    assert q.kv_bytes_for_tokens(0) == 0


def test_tensor_parallel_sharding():
    m = get_model("llama-3.1-70b")  # 8 KV heads
    assert m.kv_bytes_per_token_per_rank("bf16", tp=8) == 327_680 // 8
    assert m.kv_bytes_per_token_per_rank("bf16", tp=4) == 327_680 // 4
    # 16 ranks > 8 KV heads: each rank still holds one whole head (duplicated)
    assert m.kv_bytes_per_token_per_rank("bf16", tp=16) == 327_680 // 8
    assert m.kv_bytes_per_token("bf16", tp=16) == 327_680  # the pool stores each head once
    ds = get_model("deepseek-v3")  # MLA latent replicated on every rank
    assert ds.kv_bytes_per_token_per_rank("bf16", tp=8) == 70_272
    q = get_model("qwen2.5-7b")  # 4 KV heads
    assert q.kv_bytes_per_token_per_rank("bf16", tp=4) == 57_344 // 4
    with pytest.raises(UsageError, match="does not divide"):
        m.kv_bytes_per_token("bf16", tp=3)
    with pytest.raises(UsageError, match="at least 1"):
        m.kv_bytes_per_token("bf16", tp=0)


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 64),
    kv=st.sampled_from([1, 2, 4, 8, 16]),
    group=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([64, 80, 128, 256]),
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    tokens=st.integers(0, 100_000),
)
def test_gqa_bytes_oracle(layers, kv, group, head_dim, tp, tokens):
    heads = kv * group
    cfg = {
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "hidden_size": heads * head_dim,
        "intermediate_size": 4 * heads * head_dim,
        "vocab_size": 1000,
    }
    spec = spec_from_hf_config("x", cfg)
    if heads % tp or (kv % tp and tp % kv):
        with pytest.raises(UsageError):
            spec.kv_bytes_per_token_per_rank("bf16", tp)
        return
    # slow oracle: count per-rank heads one rank at a time
    per_rank_heads = [0] * tp
    if kv >= tp:
        for h in range(kv):
            per_rank_heads[h % tp] += 1
    else:
        per_rank_heads = [1] * tp
    assert (
        spec.kv_bytes_per_token_per_rank("bf16", tp)
        == 2 * layers * per_rank_heads[0] * head_dim * 2
    )
    stored = spec.kv_bytes_for_tokens(tokens, "bf16", tp)
    moved = spec.kv_bytes_for_tokens(tokens, "bf16", tp, per_rank=True) * tp
    assert stored == 2 * layers * kv * head_dim * 2 * tokens
    assert moved >= stored


def test_user_config_json(tmp_path):
    cfg = {
        "_name_or_path": "acme/Tiny-1B",
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = get_model(str(path))
    assert spec.kv_bytes_per_token() == 2 * 16 * 8 * 64 * 2
    assert spec.params_estimated
    # Llama-3.2-1B has these dimensions and 1.24B parameters
    assert abs(spec.total_params - 1.236e9) / 1.236e9 < 0.03
    # multimodal nesting (Gemma 3 style)
    nested = tmp_path / "mm" / "config.json"
    nested.parent.mkdir()
    nested.write_text(json.dumps({"model_type": "x", "text_config": cfg}))
    assert get_model(nested).kv_bytes_per_token() == spec.kv_bytes_per_token()
    assert get_model(str(nested.parent)).kv_bytes_per_token() == spec.kv_bytes_per_token()


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"num_key_value_heads": 7}, "num_key_value_heads"),
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"hidden_size": 2000, "head_dim": None}, "head_dim"),
        ({"sliding_window_pattern": 6, "sliding_window": 0}, None),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
    ],
)
def test_inconsistent_config_errors(tmp_path, patch, field):
    cfg = {
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "vocab_size": 1000,
    }
    for k, v in patch.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    if field is None:
        # window 0 with no sliding layers inferred is simply a full-attention model
        assert get_model(path).sliding_layers == 0
        return
    with pytest.raises(InputError) as err:
        get_model(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_config_file_not_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": 4,\n oops}')
    with pytest.raises(InputError, match=r"config.json:2"):
        get_model(path)
    with pytest.raises(InputError, match="not found"):
        get_model(tmp_path / "missing.json")


def test_lookup_aliases_and_suggestions():
    assert get_model("Llama-3.1-70B").id == "llama-3.1-70b"
    assert get_model("meta-llama/Llama-3.1-70B-Instruct").id == "llama-3.1-70b"
    assert get_model("Qwen/Qwen3-235B-A22B").id == "qwen3-235b-a22b"
    assert get_model("DeepSeek_V3").id == "deepseek-v3"
    assert get_gpu("H100").id == "h100" and get_gpu("h100-sxm").id == "h100"
    assert get_gpu("NVIDIA-H200").id == "h200" and get_gpu("MI300X").id == "mi300x"
    assert get_tier("RDMA-200").bandwidth_gbps == pytest.approx(200 / 8 * 0.87)
    with pytest.raises(UsageError) as err:
        get_model("llama-3.1-7b")
    assert "did you mean" in str(err.value) and "llama-3.1-8b" in str(err.value)
    with pytest.raises(UsageError, match=r"did you mean.*h100"):
        get_gpu("h1000")
    with pytest.raises(UsageError, match="unknown tier"):
        get_tier("carrier-pigeon")


def test_hardware_catalog():
    gpus = {g.id: g for g in list_gpus()}
    assert {"a100", "a800", "h100", "h800", "h200", "b200", "mi300x", "mi325x"} <= set(gpus)
    assert (gpus["a100"].bf16_tflops, gpus["a100"].fp8_tflops) == (312.0, None)
    for gid, (bf16, tbps) in {
        "h100": (989, 3.35),
        "h200": (989, 4.8),
        "b200": (2250, 8.0),
        "mi300x": (1307.4, 5.3),
        "mi325x": (1307.4, 6.0),
    }.items():
        assert (gpus[gid].bf16_tflops, gpus[gid].hbm_tbps) == (bf16, tbps)
        assert gpus[gid].fp8_tflops == pytest.approx(2 * bf16, rel=0.01)
    assert gpus["a800"].bf16_tflops == gpus["a100"].bf16_tflops
    assert gpus["h800"].bf16_tflops == gpus["h100"].bf16_tflops
    with pytest.raises(UsageError, match="no fp8"):
        gpus["a100"].tflops("fp8")
    tiers = {t.name: t for t in list_tiers()}
    need = {"hbm", "pcie-gen4-dram", "pcie-gen5-dram", "nvme-gen4", "nvme-gen5", "nvme-of"}
    assert need | {"rdma-100", "rdma-200", "rdma-400", "tcp"} <= set(tiers)
    for rate in (100, 200):
        assert tiers[f"rdma-{rate}"].bandwidth_gbps == pytest.approx(rate / 8 * 0.87)
    # Mooncake's 190 GB/s over 8 x 400 Gb/s, per NIC (line rate x 0.87 was 1.83x too high)
    assert tiers["rdma-400"].bandwidth_gbps == pytest.approx(190 / 8)
    for name, entry in {**HW["gpus"], **HW["tiers"]}.items():
        assert entry["source"], name
        assert all(t.latency_s > 0 and t.bandwidth_gbps > 0 for t in tiers.values())


def test_quantized_and_vendor_names_are_matched():
    from analyzer.cost.catalog import quantization_of, recognize_model

    assert recognize_model("Qwen/Qwen2.5-32B-Instruct-AWQ") == "qwen2.5-32b"
    assert recognize_model("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic") == "llama-3.1-8b"
    assert recognize_model("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8") == "qwen3-235b-a22b"
    assert quantization_of("Qwen/Qwen3-32B-FP8") == "fp8"
    assert quantization_of("Qwen/Qwen2.5-32B-Instruct-AWQ") is None
    for name in ("H100-SXM", "H100 80GB HBM3", "h100_sxm", "NVIDIA H100 80GB HBM3", "p5.48xlarge"):
        assert get_gpu(name).id == "h100", name
    assert get_gpu("L40S").id == "l40s"
    with pytest.raises(UsageError):
        get_gpu("H100 PCIe")  # another product: not planned as the SXM part


def test_a_gpu_named_as_vendors_write_it_finds_its_price():
    from analyzer.cost.prices import resolve_prices

    h100 = resolve_prices("h100").gpu_hour
    assert h100 is not None
    for name in ("H100-SXM", "NVIDIA H100 80GB HBM3", "p5.48xlarge"):
        p = resolve_prices(name)
        assert p.gpu == "h100" and p.gpu_hour == h100, name
        assert p.gpu_hour_for(name) == h100
    l40s = resolve_prices("L40S").gpu_hour
    assert l40s is not None and l40s.usd > 0 and l40s.source
