"""The step model (analyzer/cost/step.py): a slow per-layer oracle of a mixed batch,
monotonicity, the single-chunk identity with CostModel.compute_time_s, and numba."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analyzer.cost.aic as aic
from analyzer.cost import CostModel, StepModel, step_model, step_seconds
from analyzer.cost.coefficients import PrefillCoefficients, TtftCoefficients
from analyzer.cost.step import chunk_attn, engine_step_model
from analyzer.errors import UsageError

# full attention only (no window, no linear state): the step model is exact on these
EXACT = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "mixtral-8x7b", "qwen3-235b-a22b"]
OTHERS = ["gpt-oss-120b", "gemma-3-27b", "qwen3-next-80b-a3b", "deepseek-v3"]


def _slow_step_s(cm: CostModel, chunks: list[tuple[int, int]], decodes: list[int]) -> float:
    """Oracle: one forward of prefill chunks ``(new, cached)`` and decoding requests (their
    context lengths), layer by layer and token by token from the ModelSpec, under the
    engine model of docs/cost-model.md section 3a."""
    m, e = cm.model, cm.engine
    assert e is not None
    rows = sum(s for s, _ in chunks) + len(decodes)
    if rows == 0:
        return 0.0
    expert_active = 0.0
    if m.is_moe and m.total_params > m.active_params:
        r = m.experts_per_token / m.num_experts
        expert_active = (m.total_params - m.active_params) / (1 - r) * r
    dense = 2 * (m.active_nonembedding_params - expert_active) * rows
    attn = 0.0
    for kind in m.layer_kinds:
        if kind == "full":
            for s, p in chunks:
                attn += 4 * m.attention_dim * sum(x + 0.5 for x in range(p, p + s))
            attn += 4 * m.attention_dim * sum(decodes)
        elif kind == "sliding":
            w = m.sliding_window_tokens
            for s, p in chunks:
                attn += 4 * m.attention_dim * sum(min(x + 0.5, w) for x in range(p, p + s))
            attn += 4 * m.attention_dim * sum(min(c, w) for c in decodes)
        else:
            dense += 4 * m.linear_state_elements_per_layer * rows
    peak = cm.gpu.tflops(cm.compute_dtype) * 1e12 * cm.tp
    base = e.gemm_eff_bf16 if cm.compute_dtype == "bf16" else e.gemm_eff_fp8
    eff = base * rows / (rows + e.gemm_half_tokens)
    gemm = dense / (peak * eff) + 2 * expert_active * rows / (peak * eff * e.moe_eff)
    attn_s = attn / (cm.gpu.tflops("bf16") * 1e12 * cm.tp * e.attn_eff)
    weights = m.weight_bytes_read(rows, cm.weight_dtype) / cm.tp
    # a chunk writes its new tokens' KV; a decoding request reads its whole context
    kv = sum(m.kv_bytes_for_tokens(s, cm.kv_dtype, cm.tp, per_rank=True) for s, _ in chunks)
    kv += sum(m.kv_bytes_for_tokens(c, cm.kv_dtype, cm.tp, per_rank=True) for c in decodes)
    hbm = cm.gpu.hbm_tbps * 1e12 * e.hbm_eff
    comm = 0.0
    if cm.tp > 1:
        ring = 2 * (cm.tp - 1) / cm.tp * rows * m.hidden_size * 2
        link = cm.gpu.interconnect_gbps * 1e9 * e.link_eff
        comm = sum(2 * ring / link for _ in range(m.num_layers))
    # decode-only steps replay a CUDA graph: no per-layer fixed cost
    fixed = m.num_layers * e.layer_step_s if chunks else 0.0
    return max(gemm, weights / hbm) + max(attn_s, kv / hbm) + comm + fixed


def _args(chunks: list[tuple[int, int]], decodes: list[int]) -> tuple[float, ...]:
    return (
        float(sum(s for s, _ in chunks)),
        sum(chunk_attn(s, p) for s, p in chunks),
        float(len(decodes)),
        float(sum(decodes)),
    )


_chunks = st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 8192)), max_size=4)
_decodes = st.lists(st.integers(1, 20_000), max_size=32)


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(EXACT),
    tp=st.sampled_from([1, 2, 4, 8]),
    chunks=_chunks,
    decodes=_decodes,
    kv_dtype=st.sampled_from(["bf16", "fp8"]),
)
def test_mixed_step_matches_the_slow_oracle(model, tp, chunks, decodes, kv_dtype):
    cm = CostModel.from_catalog(model, "h100", tp=tp, kv_dtype=kv_dtype)
    got = engine_step_model(cm).step_s(*_args(chunks, decodes))
    assert got == pytest.approx(_slow_step_s(cm, chunks, decodes), rel=1e-9, abs=1e-15)


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(OTHERS),
    s=st.integers(1, 6000),
    p=st.integers(0, 6000),
)
def test_window_and_state_models_single_chunk_bound(model, s, p):
    """Sliding windows: ``min(a, W t)`` over-counts a chunk straddling the window's edge by
    at most ``W^2 / 2`` of attention context per window layer, never under-counts."""
    cm = CostModel.from_catalog(model, "h200", tp=8)
    got = cm.compute_time_s(s, p)
    exact = _slow_step_s(cm, [(s, p)], [])
    assert got >= exact * (1 - 1e-9)
    w = cm.model.sliding_window_tokens or 0
    slack = 4 * cm.model.attention_dim * cm.model.sliding_layers * w * w / 2
    slack /= cm.gpu.tflops("bf16") * 1e12 * cm.tp * cm.engine.attn_eff
    assert got <= exact + slack + 1e-12
    if p + s <= w or p >= w or not w:
        assert got == pytest.approx(exact, rel=1e-9)


_value = st.floats(0, 1e7, allow_nan=False, allow_infinity=False)


def _coefficient_sets() -> list[tuple[str, np.ndarray]]:
    out = []
    for model in [*EXACT, *OTHERS]:
        cm = CostModel.from_catalog(model, "h200", tp=8)
        out.append((f"{model} engine", engine_step_model(cm).coefficients))
        out.append((f"{model} roofline", CostModel.from_catalog(model, "h200", 8, mfu=0.4)._c))
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    poly = cm.with_prefill(PrefillCoefficients(0.0, 3e-5, 1e-9, 2e-9, 0.01, ("per_token_s",)))
    out.append(("polynomial", engine_step_model(poly).coefficients))
    scaled = replace(cm, ttft_fit=TtftCoefficients(0.02, 1e-3, 1.0, 1.3, ("compute_scale",)))
    out.append(("ttft-scaled", engine_step_model(scaled).coefficients))
    return out


COEFFICIENTS = _coefficient_sets()


@settings(max_examples=300, deadline=None)
@given(
    which=st.sampled_from(range(len(COEFFICIENTS))),
    args=st.tuples(_value, _value, st.floats(0, 4096), _value),
    arg=st.integers(0, 3),
    more=st.floats(0, 1e6, allow_nan=False),
)
def test_monotone_in_every_argument(which, args, arg, more):
    _, c = COEFFICIENTS[which]
    bigger = list(args)
    bigger[arg] += more
    lo = step_seconds(c, *args)
    hi = step_seconds(c, *bigger)
    assert hi >= lo * (1 - 1e-12)
    assert lo >= 0.0


@pytest.mark.parametrize("name,c", COEFFICIENTS, ids=[n for n, _ in COEFFICIENTS])
def test_no_work_takes_no_time(name, c):
    assert step_seconds(c, 0.0, 0.0, 0.0, 0.0) == 0.0
    assert step_seconds(c, 1.0, 0.5, 0.0, 0.0) > 0.0
    if c[1] > 0 or name != "polynomial":  # a pure polynomial fit leaves decode to the engine
        assert step_seconds(c, 0.0, 0.0, 1.0, 100.0) > 0.0


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from([*EXACT, *OTHERS]),
    tp=st.sampled_from([1, 2, 8]),
    s=st.integers(1, 8192),
    p=st.integers(0, 65536),
    k=st.integers(1, 8),
    roofline=st.booleans(),
)
def test_single_chunk_is_compute_time(model, tp, s, p, k, roofline):
    """One prefill chunk (``k`` alike) and no decode is CostModel.compute_time_s."""
    if model == "deepseek-v3" and tp == 1:
        tp = 8
    cm = CostModel.from_catalog(model, "h200", tp=tp, mfu=0.4 if roofline else None)
    sm = engine_step_model(cm)
    assert sm.step_s(k * s, k * chunk_attn(s, p), 0, 0) == pytest.approx(
        cm.compute_time_s(s, p, k), rel=1e-12
    )
    assert sm.request_overhead_s == cm.overhead_s


def test_reference_rows_unchanged_by_the_step_form():
    """The reference rows (no cached prefix, full attention) price exactly as the
    per-request engine model of docs/cost-model.md section 3a did before the step form."""
    cm = CostModel.from_catalog("llama-2-70b", "h100", tp=4, weight_dtype="fp8", kv_dtype="fp8")
    for s in (128, 2048):
        assert cm.compute_time_s(s, 0) == pytest.approx(_slow_step_s(cm, [(s, 0)], []), rel=1e-12)


def test_numba_compiles_it_unchanged():
    numba = pytest.importorskip("numba")
    fast = numba.njit(cache=False)(step_seconds)
    rng = np.random.default_rng(7)
    for _, c in COEFFICIENTS:
        for _ in range(50):
            args = rng.uniform(0, [8192, 8192 * 20_000, 512, 512 * 32_000])
            args[rng.integers(0, 4)] = 0.0
            assert fast(c, *args) == pytest.approx(step_seconds(c, *args), rel=1e-12)
        assert fast(c, 0.0, 0.0, 0.0, 0.0) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    which=st.one_of(st.none(), st.sampled_from(range(len(COEFFICIENTS)))),
    raw=st.lists(st.floats(1e-9, 1e-2), min_size=20, max_size=20),
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    n=st.integers(0, 600),
    kv0=st.integers(0, 4_000_000),
    steps=st.integers(1, 300),
    t0=st.floats(0, 1e5, allow_nan=False),
)
def test_decode_burst_kernel_is_the_step_summed(which, raw, flags, n, kv0, steps, t0):
    """The decode-only burst kernel (its kv-free terms out of the loop) gives the end
    times that the compiled step_seconds gives step by step, float for float: on every
    catalog form, and on arbitrary coefficients (a window, one roofline, experts)."""
    from analyzer.cost.step_formula import (
        ENGINE_PREFILL,
        EXPERT_MISS,
        ONE_ROOFLINE,
        WINDOW,
        compiled_step,
    )

    if which is not None:
        c = COEFFICIENTS[which][1]
    else:
        c = np.asarray(raw, dtype=np.float64)
        c[WINDOW] = 4096.0 if flags[0] else 0.0
        c[ONE_ROOFLINE] = 1.0 if flags[1] else 0.0
        c[ENGINE_PREFILL] = 1.0 if flags[2] else 0.0
        c[EXPERT_MISS] = min(1.0, c[EXPERT_MISS] * 100)
    step, ends, _ = compiled_step()
    want = np.empty(steps)
    t, kv = t0, float(kv0)
    for j in range(steps):
        t += step(c, 0.0, 0.0, float(n), kv)
        want[j] = t
        kv += n
    assert np.array_equal(ends(c, float(n), float(kv0), steps, t0), want)


def test_step_model_record():
    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    sm = engine_step_model(cm)
    assert isinstance(sm, StepModel)
    assert sm.source == "kvpool engine model (models/measurements.toml)"
    assert sm.coefficients.dtype == np.float64 and not sm.coefficients.flags.writeable
    assert sm.request_overhead_s == pytest.approx(0.01)
    with pytest.raises(UsageError, match="back end"):
        step_model(cm, "tgi")
    roof = engine_step_model(CostModel.from_catalog("llama-3.1-70b", "h100", tp=4, mfu=0.5))
    assert roof.source == "kvpool roofline at MFU 0.5"
    # decode: the weights floor, then each request's KV read
    one = sm.step_s(0, 0, 1, 1000)
    many = sm.step_s(0, 0, 64, 64_000)
    assert many > one and many < 64 * one
    # a mixed step costs at least its prefill alone and its decode alone
    mixed = sm.step_s(2048, chunk_attn(2048, 0), 64, 64_000)
    assert mixed >= max(sm.step_s(2048, chunk_attn(2048, 0), 0, 0), many)


def test_polynomial_profile_prices_one_request_exactly():
    """A fitted polynomial ``K (c1 S + c2 P S + c3 S^2)`` is exact for one request, and the
    engine still prices the step's decode work."""
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    fit = PrefillCoefficients(0.0, 3e-5, 1e-9, 2e-9, 0.012, ("per_token_s",))
    poly = cm.with_prefill(fit)
    sm = engine_step_model(poly)
    for s, p in ((512, 0), (100, 9000), (4096, 4096)):
        want = 3e-5 * s + 1e-9 * p * s + 2e-9 * s * s
        assert sm.step_s(s, chunk_attn(s, p), 0, 0) == pytest.approx(want, rel=1e-12)
        assert poly.compute_time_s(s, p) == pytest.approx(want, rel=1e-12)
    assert sm.step_s(0, 0, 8, 8000) == pytest.approx(engine_step_model(cm).step_s(0, 0, 8, 8000))
    assert sm.request_overhead_s == 0.012
    assert math.isfinite(sm.step_s(512, chunk_attn(512, 0), 8, 8000))


# -- measured step times (aiconfigurator-core), analyzer/cost/aic.py ----------------------


def test_coverage_names_what_the_library_lacks():
    from analyzer.cost.aic import coverage

    assert coverage(CostModel.from_catalog("llama-3.1-8b", "h100"), "vllm") == (
        "h100_sxm",
        "meta-llama/Meta-Llama-3.1-8B",
    )
    assert coverage(CostModel.from_catalog("llama-3.1-70b", "h100", 4, weight_dtype="fp8"), "vllm")[
        1
    ] == ("nvidia/Llama-3.1-70B-Instruct-FP8")
    for gpu in ("h20", "h800", "a800", "mi300x", "mi325x"):
        why = coverage(CostModel.from_catalog("llama-3.1-8b", gpu), "vllm")
        assert isinstance(why, str) and "no kernel data" in why
    why = coverage(CostModel.from_catalog("llama-2-7b", "h100"), "vllm")
    assert why == "aiconfigurator-core has no configuration for Llama-2-7B"
    why = coverage(CostModel.from_catalog("llama-3.1-8b", "h100", weight_dtype="fp8"), "vllm")
    assert why == "aiconfigurator-core has no fp8 configuration for Llama-3.1-8B"
    assert "roofline" in coverage(CostModel.from_catalog("llama-3.1-8b", "h100", mfu=0.5), "vllm")


def test_uncovered_deployment_says_why_in_the_source():
    sm = step_model(CostModel.from_catalog("llama-3.1-8b", "h20"))
    assert sm.source == (
        "kvpool engine model (models/measurements.toml); "
        "aiconfigurator-core has no kernel data for NVIDIA H20 96GB"
    )
    assert np.array_equal(sm.coefficients, CostModel.from_catalog("llama-3.1-8b", "h20")._steps)


@settings(max_examples=10, deadline=None)
@given(
    scales=st.tuples(*(st.floats(0.5, 2.0) for _ in range(5))),
    half=st.floats(8.0, 400.0),
    fixed=st.tuples(st.floats(1e-4, 5e-3), st.floats(1e-5, 2e-3)),
    model=st.sampled_from(["llama-3.1-70b", "qwen3-30b-a3b"]),
)
def test_fit_recovers_known_coefficients(scales, half, fixed, model):
    """Oracle: predictions made by the step form itself with known quantities are fitted
    back (the least squares starts elsewhere, from the engine model)."""
    from analyzer.cost import aic

    cm = CostModel.from_catalog(model, "h100", tp=4)
    base = cm.engine_coefficients(cm.engine)
    x = np.log([scales[0], half, scales[1], scales[2], scales[3], fixed[0], fixed[1], scales[4]])
    truth_c = aic._coefficients(base, x)
    truth = np.array([step_seconds(truth_c, *aic._args(q)) for q in aic.FIT_GRID])
    fitted = aic.fit_to(base, aic.FIT_GRID, truth)
    pred = np.array([step_seconds(fitted, *aic._args(q)) for q in aic.HELD_OUT_GRID])
    want = np.array([step_seconds(truth_c, *aic._args(q)) for q in aic.HELD_OUT_GRID])
    assert pred == pytest.approx(want, rel=2e-3)


@pytest.mark.slow
def test_measured_step_fits_the_library():
    """aiconfigurator-core's own predictions for Llama-3.1-70B on 4xH100 (vLLM): the fitted
    step is within 10% of them at the median and 1.35x at worst, fitted and held out."""
    pytest.importorskip("aiconfigurator_core")
    from analyzer.cost.aic import measured_step

    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    m = measured_step(cm, "vllm")
    assert not isinstance(m, str), m
    assert m.source.startswith("aiconfigurator-core 0.12.0 (vllm, h100_sxm, ")
    assert m.fit_median_error < 0.10 and m.fit_worst_factor < 1.35
    assert m.held_out_median_error < 0.10 and m.held_out_worst_factor < 1.35
    sm = step_model(cm)
    assert sm.source == m.source
    for args in ((0, 0, 1, 1000), (2048, chunk_attn(2048, 0), 0, 0), (512, 1e6, 64, 64_000)):
        assert sm.step_s(*args) > 0
    # monotone, as every step model
    assert sm.step_s(0, 0, 64, 64_000) <= sm.step_s(0, 0, 65, 64_000) <= sm.step_s(1, 1, 65, 64_000)


def test_library_errors_name_no_path():
    from analyzer.cost.aic import _reason

    exc = ValueError(
        'perf database error: context MLA data missing for ContextKey { fmha_quant: "fp8" } '
        "at /home/me/.venv/lib/python3.11/site-packages/aiconfigurator_core/systems/data\nmore"
    )
    got = _reason(exc)
    assert (
        got == 'perf database error: context MLA data missing for ContextKey { fmha_quant: "fp8" }'
    )
    assert "/" not in _reason(ValueError("cannot read /secret/place/file.parquet"))


def test_a_fit_made_in_another_process_is_taken_not_made_again(monkeypatch):
    """A replay worker given the parent's fits (fitted / remember_fitted) answers from
    them: the library is not asked again, and the answer is the parent's."""
    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    where = aic.coverage(cm, "vllm")
    if isinstance(where, str):
        pytest.skip(where)
    made = aic.MeasuredStep(
        coefficients=np.arange(8.0),
        source="the parent's fit",
        fit_median_error=0.01,
        fit_worst_factor=1.1,
        held_out_median_error=0.02,
        held_out_worst_factor=1.2,
        points=len(aic.FIT_GRID),
    )
    key = (*where, "vllm", cm.model.id, cm.gpu.id, cm.tp, cm.weight_dtype, cm.kv_dtype,
           cm.expert_parallel)  # fmt: skip
    monkeypatch.setattr(aic, "_FITTED", {})
    aic.remember_fitted({key: made})

    def no_library(*args: object) -> None:
        raise AssertionError("fitted again")

    monkeypatch.setattr(aic, "_measured", no_library)
    assert aic.measured_step(cm, "vllm") is made
    assert step_model(cm).source == "the parent's fit"
    assert aic.fitted() == {key: made}


def test_a_fit_is_kept_on_disk_and_taken_by_the_next_run(tmp_path, monkeypatch):
    """A deployment's fit is made in a process of its own (this one never imports the
    library) and written once, whole; a later process (an empty in-memory table) takes
    it from disk equal to the fit made, without fitting again; an unreadable file or an
    unwritable folder only means fitting again."""
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    where = aic.coverage(cm, "vllm")
    if isinstance(where, str):
        pytest.skip(where)
    monkeypatch.setenv("KVPOOL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(aic, "_FITTED", {})
    made = aic.measured_step(cm, "vllm")
    assert isinstance(made, aic.MeasuredStep)
    files = list((tmp_path / "step-fits").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"

    def no_library(*args: object) -> None:
        raise AssertionError("fitted again")

    monkeypatch.setattr(aic, "_FITTED", {})
    monkeypatch.setattr(aic, "_fit", no_library)
    again = aic.measured_step(cm, "vllm")
    assert isinstance(again, aic.MeasuredStep)
    assert np.array_equal(again.coefficients, made.coefficients)
    assert (again.source, again.points) == (made.source, made.points)
    assert again.held_out_worst_factor == made.held_out_worst_factor
    # another deployment is another file (the digest names what the fit depends on)
    other = CostModel.from_catalog("llama-3.1-8b", "h100", tp=2)
    key = (*where, "vllm", cm.model.id, cm.gpu.id, cm.tp, cm.weight_dtype, cm.kv_dtype,
           cm.expert_parallel)  # fmt: skip
    key2 = (*where, "vllm", other.model.id, other.gpu.id, other.tp, other.weight_dtype,
            other.kv_dtype, other.expert_parallel)  # fmt: skip
    assert aic._disk_name(key) != aic._disk_name(key2)
    # a damaged file is not taken
    files[0].write_text("{not json")
    monkeypatch.setattr(aic, "_FITTED", {})
    monkeypatch.setattr(aic, "_fit", lambda key: "refit")
    assert aic.measured_step(cm, "vllm") == "refit"
    # a folder that cannot be made: the fit is still returned
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("KVPOOL_CACHE_DIR", str(blocker))
    monkeypatch.setattr(aic, "_FITTED", {})
    monkeypatch.setattr(aic, "_fit", lambda key: made)
    assert aic.measured_step(cm, "vllm") is made


def test_the_process_asking_for_a_fit_never_imports_the_library(tmp_path):
    """The analysis's process holds the log; the library's data (80 MB and more) is
    loaded only in the process that fits, which ends with the fit."""
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    if isinstance(aic.coverage(cm, "vllm"), str):
        pytest.skip("aiconfigurator-core does not cover the deployment here")
    code = (
        "import sys\n"
        "from analyzer.cost import CostModel\n"
        "from analyzer.cost import aic\n"
        "fit = aic.measured_step(CostModel.from_catalog('llama-3.1-8b', 'h100'), 'vllm')\n"
        "print(type(fit).__name__, 'aiconfigurator_core' in sys.modules)\n"
    )
    env = {**os.environ, "KVPOOL_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["MeasuredStep", "False"]
