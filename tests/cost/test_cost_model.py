"""Analytic prefill/load model, break-even and TTFT: oracles, golden and published figures."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.cost import CostModel, get_model
from analyzer.cost.model import window_context
from analyzer.errors import UsageError


def test_mooncake_fast25_break_even():
    """Mooncake (Qin et al., FAST'25, "Trading More Storage for Less Computation"): for an 8192-token prefix of LLaMA3-70B,
    reuse beats recompute above about 6 GB/s on 8xA800 and 19 GB/s on 8xH800.

    Assumptions that reproduce it: TP=8 (one instance of 8 GPUs), utilisation 1.0 (peak
    dense bf16: 312 and 989 TFLOP/s per GPU; the paper's cost formula has no MFU), our
    FLOPs formula and the marginal saving T(P+1) - T(1 | P), bf16 KV (327,680 B/token).
    We get 5.64 and 18.2 GB/s: within 10% of the published figures. At a realistic
    MFU of 0.5 the break-even halves (2.8 and 8.9 GB/s).
    """
    a800 = CostModel.from_catalog("llama-3.1-70b", "a800", tp=8, mfu=1.0)
    h800 = CostModel.from_catalog("llama-3.1-70b", "h800", tp=8, mfu=1.0)
    be_a = a800.break_even_bandwidth_gbps(8192)
    be_h = h800.break_even_bandwidth_gbps(8192)
    assert be_a == pytest.approx(6.0, rel=0.10)
    assert be_h == pytest.approx(19.0, rel=0.10)
    assert be_h / be_a == pytest.approx(19 / 6, rel=0.05)
    half = CostModel.from_catalog("llama-3.1-70b", "a800", tp=8, mfu=0.5)
    assert half.break_even_bandwidth_gbps(8192) == pytest.approx(be_a / 2, rel=0.03)


def test_prefill_flops_golden_llama70b():
    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=8)
    m = get_model("llama-3.1-70b")
    n = 70.6e9 - 2 * 128_256 * 8192  # active params minus embedding and untied head
    s, p = 2048, 6144
    expected = 2 * n * s + 4 * 80 * (64 * 128) * (p * s + s * s / 2)
    assert cm.prefill_flops(s, p) == pytest.approx(expected, rel=1e-12)
    assert m.active_nonembedding_params == pytest.approx(n)


@settings(max_examples=80, deadline=None)
@given(p=st.integers(0, 5000), s=st.integers(0, 5000), w=st.integers(1, 4000))
def test_window_context_oracle(p, s, w):
    # min(x, W) is linear on each unit interval when P, S, W are integers: midpoint
    # rule is exact there.
    oracle = sum(min(k + 0.5, w) for k in range(p, p + s))
    assert window_context(s, p, w) == pytest.approx(oracle, rel=1e-9, abs=1e-9)
    assert window_context(s, p, None) == pytest.approx(p * s + s * s / 2)


def test_sliding_window_caps_attention_flops():
    cm = CostModel.from_catalog("gpt-oss-120b", "h100")
    m = cm.model
    s, p = 1000, 50_000
    dense = 2 * m.active_nonembedding_params * s
    full = 4 * (64 * 64) * 18 * (p * s + s * s / 2)
    window = 4 * (64 * 64) * 18 * 128 * s
    assert cm.prefill_flops(s, p) == pytest.approx(dense + full + window, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(["llama-3.1-8b", "qwen3-235b-a22b", "gemma-3-27b", "deepseek-v3"]),
    total=st.integers(2, 60_000),
    frac=st.floats(0, 1),
)
def test_caching_never_costs_more(model, total, frac):
    cm = CostModel.from_catalog(model, "h200", tp=8 if model == "deepseek-v3" else 1)
    cached = int(frac * (total - 1))
    assert cm.compute_time_s(total - cached, cached) <= cm.compute_time_s(total, 0) + 1e-12
    assert cm.prefill_time_s(total, 0) >= cm.prefill_time_s(total - 1, 0)


def test_hbm_floor_for_small_chunks():
    cm = CostModel.from_catalog("llama-3.1-8b", "h100", mfu=0.5)
    floor = (8.03e9 * 2 + 131_072 * 16) / 3.35e12
    assert cm.compute_time_s(16, 0) == pytest.approx(floor, rel=1e-9)
    big = 2 * cm.model.active_nonembedding_params * 8192
    assert cm.compute_time_s(8192, 0) > floor  # compute-bound at long prompts
    assert cm.compute_time_s(8192, 0) >= big / (989e12 * 0.5)


def test_moe_weights_read():
    m = get_model("qwen3-235b-a22b")
    one = m.weight_bytes_read(1)
    many = m.weight_bytes_read(100_000)
    assert one == pytest.approx(m.active_params * 2, rel=1e-9)
    assert many == pytest.approx(m.total_params * 2, rel=1e-6)
    assert get_model("llama-3.1-8b").weight_bytes_read(1) == pytest.approx(8.03e9 * 2)


def test_default_mfu_lower_for_moe():
    assert CostModel.from_catalog("llama-3.1-8b", "h100").mfu == 0.5
    assert CostModel.from_catalog("qwen3-30b-a3b", "h100").mfu == 0.35
    with pytest.raises(UsageError, match="mfu"):
        CostModel.from_catalog("llama-3.1-8b", "h100", mfu=1.5)
    with pytest.raises(UsageError, match="fp8"):
        CostModel.from_catalog("llama-3.1-8b", "a100", compute_dtype="fp8")


def test_load_time_formula_and_sharing():
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    assert cm.load_time_s(1e9, 10.0, 1e-3) == pytest.approx(1e-3 + 0.1)
    assert cm.load_time_s(1e9, 10.0, 1e-3, concurrency=4) == pytest.approx(1e-3 + 0.4)
    assert cm.load_time_s(0, 10.0, 1e-3) == 0.0
    for bad in (0.0, -5.0, float("nan")):
        with pytest.raises(UsageError, match="positive"):
            cm.load_time_s(1e9, bad, 0.0)
    with pytest.raises(UsageError, match="concurrency"):
        cm.load_time_s(1e9, 1.0, 0.0, concurrency=0)


def test_transfer_bytes_duplication_and_mla():
    dup = CostModel.from_catalog("llama-3.1-8b", "h100", tp=16)  # 8 KV heads, 16 ranks
    assert dup.transfer_bytes(1000) == 2 * dup.kv_bytes(1000)
    ds = CostModel.from_catalog("deepseek-v3", "h200", tp=8)
    assert ds.transfer_bytes(1000) == 8 * 70_272 * 1000
    assert ds.kv_bytes(1000) == 70_272 * 1000


def test_break_even_falls_with_prefix_length():
    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    values = [cm.break_even_bandwidth_gbps(p) for p in (1024, 2048, 4096, 8192, 16384, 65536)]
    assert all(a > b for a, b in itertools.pairwise(values))
    # definition: bytes over the marginal saving, less the HBM scatter a hit pays
    p = 4096
    saving = cm.compute_time_s(p + 1, 0) - cm.compute_time_s(1, p)
    per_rank = cm.transfer_bytes(p) / cm.tp
    scatter = per_rank / (cm.gpu.hbm_tbps * 1e12 * cm.engine.hbm_eff)
    assert cm.hit_overhead_s(p) == pytest.approx(scatter)
    assert cm.break_even_bandwidth_gbps(p) == pytest.approx(
        cm.transfer_bytes(p) / (saving - scatter) / 1e9
    )
    roof = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4, mfu=0.5)
    saving = roof.compute_time_s(p + 1, 0) - roof.compute_time_s(1, p)
    assert roof.hit_overhead_s(p) == 0.0
    assert roof.break_even_bandwidth_gbps(p) == pytest.approx(roof.transfer_bytes(p) / saving / 1e9)
    # tiny prefixes are free to recompute (the weight-read floor is paid anyway): the
    # recompute writes the prefix's KV, which a hit's scatter writes as well
    assert math.isinf(CostModel.from_catalog("llama-3.1-8b", "h100").break_even_bandwidth_gbps(16))


@pytest.mark.parametrize("tier", ["pcie-gen4-dram", "nvme-gen4", "rdma-100", "tcp"])
def test_break_even_prefix_is_the_crossing(tier):
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    link = cm.tier_link(tier)
    p = cm.break_even_prefix_tokens(link.bandwidth_gbps, link.latency_s)
    assert p is not None and p > 1
    assert cm.load_wins(p, link.bandwidth_gbps, link.latency_s)
    assert not cm.load_wins(p - 1, link.bandwidth_gbps, link.latency_s)
    for q in (p + 1, 2 * p, 10 * p):
        assert cm.load_wins(q, link.bandwidth_gbps, link.latency_s)
    # a hopeless link never pays within the search range
    assert cm.break_even_prefix_tokens(0.001, 1.0, max_tokens=100_000) is None


def test_tier_links_scale_per_instance():
    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    assert cm.tier_link("hbm").bandwidth_gbps == pytest.approx(3350 * 4)
    assert cm.tier_link("pcie-gen5-dram").bandwidth_gbps == pytest.approx(45 * 4)
    assert cm.tier_link("rdma-200").bandwidth_gbps == pytest.approx(21.75)


def test_overlap_bound():
    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=8)
    p, bw = 16_384, 20.0
    t_compute = cm.recompute_saving_s(p)
    t_load = cm.transfer_bytes(p) / (bw * 1e9)
    bound = cm.overlap_bound_s(p, bw)
    assert bound == pytest.approx(1 / (1 / t_compute + 1 / t_load))
    assert min(t_compute, t_load) / 2 <= bound <= min(t_compute, t_load)


def test_break_even_table_is_plot_ready():
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    rows = cm.break_even_table([512, 4096, 131_072], ["pcie-gen5-dram", "rdma-200", "tcp"])
    assert len(rows) == 9
    assert rows == cm.break_even_table([512, 4096, 131_072], ["pcie-gen5-dram", "rdma-200", "tcp"])
    for r in rows:
        assert r.load_wins == (r.load_s < r.recompute_s)
        assert r.overlap_bound_s <= min(r.recompute_s, r.load_s) + 1e-12
        assert r.transfer_bytes == 131_072 * r.prefix_tokens
        assert r.to_json()["break_even_gbps"] == r.break_even_gbps
    tcp = [r for r in rows if r.tier == "tcp"]
    assert [r.load_wins for r in tcp] == [False, False, True]


def test_hbm_capacity_independent():
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    expected = (80 * 2**30 * 0.9 - 8.03e9 * 2) // 131_072
    assert cm.hbm_kv_capacity_tokens(0.1) == int(expected)
    tp4 = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    assert tp4.hbm_kv_capacity_tokens() == int((80 * 2**30 * 0.9 - 70.6e9 * 2 / 4) // (327_680 / 4))
    assert CostModel.from_catalog("llama-3.1-405b", "h100", tp=1).hbm_kv_capacity_tokens() == 0


def test_ttft_semantics():
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    none = cm.ttft(8192, 0, 1, 25.0)
    assert none.ttft_s == pytest.approx(cm.prefill_time_s(8192, 0))
    assert none.load_s == 0.0
    k, c, bw, lat = 4, 6000, 25.0, 2e-3
    r = cm.ttft(8192, c, k, bw, lat)
    scatter = k * c * 131_072 / (3.35e12 * cm.engine.hbm_eff)  # into the paged KV cache
    assert r.load_s == pytest.approx(lat + k * c * 131_072 / (bw * 1e9) + scatter)
    assert r.compute_s == pytest.approx(cm.compute_time_s(8192 - c, c, batch=k))
    assert r.ttft_s == pytest.approx(r.load_s + r.compute_s + r.overhead_s)
    assert r.recompute_ttft_s == pytest.approx(cm.compute_time_s(8192, 0, batch=k) + r.overhead_s)
    assert r.overlap_bound_s <= r.ttft_s
    assert cm.ttft(8192, c, 8, bw, lat).ttft_s > r.ttft_s
    # fully cached prompt: the last token is still computed
    assert cm.ttft(100, 100, 1, 25.0).new_tokens == 1
    with pytest.raises(UsageError, match="exceed"):
        cm.ttft(100, 200, 1, 25.0)
    with pytest.raises(UsageError, match="positive"):
        cm.ttft(100, 50, 1, 0.0)


def _slow_compute_s(cm: CostModel, s: int, p: int, k: int) -> float:
    """Oracle: the roofline straight from the ModelSpec methods, nothing precomputed."""
    m = cm.model
    flops = 2 * m.active_nonembedding_params * s
    for kind in m.layer_kinds:
        if kind == "full":
            flops += 4 * m.attention_dim * sum(x + 0.5 for x in range(p, p + s))
        elif kind == "sliding":
            w = m.sliding_window_tokens
            flops += 4 * m.attention_dim * sum(min(x + 0.5, w) for x in range(p, p + s))
        else:
            flops += 4 * m.linear_state_elements_per_layer * s
    peak = cm.gpu.tflops(cm.compute_dtype) * 1e12 * cm.tp * cm.mfu
    weights = m.weight_bytes_read(s * k, cm.weight_dtype) / cm.tp
    # each chunk writes its new tokens' KV (the cached context's read is priced as
    # attention FLOPs: analyzer/cost/step.py)
    kv = k * m.kv_bytes_for_tokens(s, cm.kv_dtype, cm.tp, per_rank=True)
    return max(k * flops / peak, (weights + kv) / (cm.gpu.hbm_tbps * 1e12))


def _slow_engine_s(cm: CostModel, s: int, p: int, k: int) -> float:
    """Oracle: the engine model of analyzer/cost/engine.py's docstring, layer by layer."""
    m, e = cm.model, cm.engine
    tokens = s * k
    expert_active = 0.0
    if m.is_moe and m.total_params > m.active_params:
        r = m.experts_per_token / m.num_experts
        expert_active = (m.total_params - m.active_params) / (1 - r) * r
    dense = 2 * (m.active_nonembedding_params - expert_active) * tokens
    attn = 0.0
    for kind in m.layer_kinds:
        if kind == "full":
            attn += 4 * m.attention_dim * sum(x + 0.5 for x in range(p, p + s))
        elif kind == "sliding":
            w = m.sliding_window_tokens
            attn += 4 * m.attention_dim * sum(min(x + 0.5, w) for x in range(p, p + s))
        else:
            dense += 4 * m.linear_state_elements_per_layer * tokens
    peak = cm.gpu.tflops(cm.compute_dtype) * 1e12 * cm.tp
    base = e.gemm_eff_bf16 if cm.compute_dtype == "bf16" else e.gemm_eff_fp8
    eff = base * tokens / (tokens + e.gemm_half_tokens)
    gemm = dense / (peak * eff) + 2 * expert_active * tokens / (peak * eff * e.moe_eff)
    attn_s = k * attn / (cm.gpu.tflops("bf16") * 1e12 * cm.tp * e.attn_eff)
    weights = m.weight_bytes_read(s * k, cm.weight_dtype) / cm.tp
    # each chunk writes its new tokens' KV (the cached context's read is priced as
    # attention FLOPs: analyzer/cost/step.py)
    kv = k * m.kv_bytes_for_tokens(s, cm.kv_dtype, cm.tp, per_rank=True)
    hbm = cm.gpu.hbm_tbps * 1e12 * e.hbm_eff
    comm = 0.0
    if cm.tp > 1:
        ring = 2 * (cm.tp - 1) / cm.tp * tokens * m.hidden_size * 2
        link = cm.gpu.interconnect_gbps * 1e9 * e.link_eff
        comm = sum(2 * ring / link for _ in range(m.num_layers))
    # GEMMs against the weights, attention against the KV: each its own roofline
    return max(gemm, weights / hbm) + max(attn_s, kv / hbm) + comm + m.num_layers * e.layer_step_s


@settings(max_examples=40, deadline=None)
@given(
    # full attention only: windows and linear state are bounded in tests/cost/test_cost_step.py
    model=st.sampled_from(["llama-3.1-70b", "qwen3-235b-a22b", "mixtral-8x7b", "qwen3-32b"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    s=st.integers(1, 3000),
    p=st.integers(0, 3000),
    k=st.integers(1, 4),
    kv_dtype=st.sampled_from(["bf16", "fp8"]),
)
def test_fast_path_matches_slow_oracle(model, tp, s, p, k, kv_dtype):
    cm = CostModel.from_catalog(model, "h200", tp=tp, kv_dtype=kv_dtype)
    assert cm.analytic_compute_s(s, p, k) == pytest.approx(_slow_engine_s(cm, s, p, k), rel=1e-9)
    roof = CostModel.from_catalog(model, "h200", tp=tp, kv_dtype=kv_dtype, mfu=0.4)
    assert roof.analytic_compute_s(s, p, k) == pytest.approx(
        _slow_compute_s(roof, s, p, k), rel=1e-9
    )
    assert cm.transfer_bytes(p) == tp * cm.model.kv_bytes_for_tokens(p, kv_dtype, tp, per_rank=True)


def test_moe_tiny_prefix_saves_flops_not_weight_reads():
    """Skipping a prefix saves its FLOPs; the experts a batch touches are read anyway."""
    ds = CostModel.from_catalog("deepseek-v3", "h200", tp=8, mfu=0.35, compute_dtype="bf16")
    # the roofline has no scatter: a tiny prefix saves only its KV write, so loading would
    # have to beat the instance's own HBM
    assert ds.break_even_bandwidth_gbps(4) == pytest.approx(8 * 4.8e3, rel=1e-6)
    p = ds.break_even_prefix_tokens(21.75, 2e-5)
    assert p is not None and p > 256
    # the full recompute is compute-bound; the 1-token suffix still streams the weights
    full = ds.prefill_flops(8193, 0) / (989e12 * 8 * 0.35)
    weights = ds.model.weight_bytes_read(8193) / 8
    suffix = (weights + ds.model.kv_bytes_for_tokens(1, "bf16", 8, per_rank=True)) / 4.8e12
    assert ds.recompute_saving_s(8192) == pytest.approx(full - suffix, rel=1e-9)


def test_load_path_costs_the_replay_adds():
    """Per load: the scatter into the paged KV (each rank's bytes at the achieved HBM
    bandwidth) and the engine's fixed cost per load; K hits pay K of each."""
    from dataclasses import replace

    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    per_rank = cm.transfer_bytes(8192) / 4
    assert cm.scatter_s(8192) == pytest.approx(per_rank / (3.35e12 * cm.engine.hbm_eff))
    assert cm.load_fixed_s == 0.0
    slow = replace(cm, load_fixed_s=0.002)
    assert slow.hit_overhead_s(8192, 3) == pytest.approx(3 * (cm.scatter_s(8192) + 0.002))
    assert slow.load_prefix_s(8192, 25.0, 1e-5) == pytest.approx(
        1e-5 + cm.transfer_bytes(8192) / 25e9 + cm.scatter_s(8192) + 0.002
    )
    assert CostModel.from_catalog("llama-3.1-70b", "h100", tp=4, mfu=0.5).scatter_s(8192) == 0.0
