"""Calibration: fits recover known coefficients, partial fits say what they fitted,
range warnings, bad files give file:line messages (profiles: test_cost_profile_file.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.cost import CostModel
from analyzer.cost import calibrate as cal
from analyzer.errors import InputError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cost"


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.from_catalog("llama-3.1-8b", "h100", mfu=0.5)  # the fixtures are roofline data


def test_prefill_polynomial_fit_recovers_physics(cm):
    data = cal.read_prefill_csv(FIX / "prefill_llama8b_h100.csv")
    assert len(data.rows) == 20 and data.skipped == 2
    assert "prefill_llama8b_h100.csv:6" in data.examples[0] and "not a number" in data.examples[0]
    c = cal.fit_prefill(cm, data)
    assert c.compute_scale == 0.0  # polynomial form
    assert set(c.fitted) == {"overhead_s", "per_token_s", "per_context_token_s", "per_token_sq_s"}
    # fixture: t = 0.015 + 1.6 * analytic; analytic per-token slope = 2N / (peak * mfu)
    rate = 989e12 * 0.5
    assert c.overhead_s == pytest.approx(0.015, rel=0.05)
    assert c.per_token_s == pytest.approx(
        1.6 * 2 * cm.model.active_nonembedding_params / rate, rel=0.05
    )
    d_attn_term = 4 * 32 * 4096 / rate
    assert c.per_context_token_s == pytest.approx(1.6 * d_attn_term, rel=0.1)
    assert c.per_token_sq_s == pytest.approx(1.6 * d_attn_term / 2, rel=0.1)
    assert c.cv_mape is not None and c.cv_mape < 0.03
    fitted = cm.with_prefill(c)
    assert fitted.prefill_time_s(4096, 8192) == pytest.approx(
        0.015 + 1.6 * cm.analytic_compute_s(4096, 8192), rel=0.03
    )
    assert fitted.range_warnings(new_tokens=4096, cached_tokens=8192) == []
    warn = fitted.range_warnings(new_tokens=100_000, cached_tokens=0)
    assert len(warn) == 1 and "outside the calibrated range [256, 8192]" in warn[0]


def test_prefill_few_points_fit_scale_and_overhead_only(cm):
    c = cal.fit_prefill(cm, cal.read_prefill_csv(FIX / "prefill_two_points.csv"))
    assert c.fitted == ("compute_scale", "overhead_s")
    assert c.cv_mape is None  # no spare point to cross-validate
    assert c.compute_scale == pytest.approx(1.6, rel=0.03)
    assert c.per_token_s == 0.0


def test_fit_physical_priorities():
    x = np.array([1.0, 2.0, 3.0])
    cols = {"a": x, "b": np.ones(3), "c": np.zeros(3)}
    fit = cal.fit_physical(cols, 2 * x + 0.5, ["a", "b", "c"], {"a": 1.0, "b": 0.0, "c": 7.0})
    assert fit.fitted == ("a", "b") and fit.from_catalog == ("c",)
    assert fit.coefficients["a"] == pytest.approx(2.0) and fit.coefficients["b"] == pytest.approx(
        0.5
    )
    assert fit.coefficients["c"] == 7.0 and fit.cv_mape == pytest.approx(0.0, abs=1e-9)
    one = cal.fit_physical(
        {"a": x[:1], "b": np.ones(1)}, np.array([3.0]), ["a", "b"], {"a": 1, "b": 1.0}
    )
    assert one.fitted == ("a",) and one.coefficients["a"] == pytest.approx(2.0)
    # identical rows cannot separate a slope from an intercept
    same = cal.fit_physical(
        {"a": np.array([2.0, 2.0]), "b": np.ones(2)},
        np.array([4.0, 4.0]),
        ["a", "b"],
        {"a": 0, "b": 0},
    )
    assert same.fitted == ("a",)


def test_load_fit(cm):
    link = cal.fit_load(cal.read_load_csv(FIX / "load_rdma.csv"))
    assert link.bandwidth_gbps == pytest.approx(18.0, rel=0.02)
    assert link.latency_s == pytest.approx(5e-4, rel=0.2)
    assert link.cv_mape is not None and link.cv_mape < 0.02


def test_ttft_calibration_recovers_scales(cm):
    fitted = cal.calibrate_ttft(cm, FIX / "ttft_calibration.csv")
    f = fitted.ttft_fit
    assert f is not None and f.n_points == 10
    assert f.fitted == ("compute_scale", "overhead_s", "load_scale", "latency_s")
    assert f.compute_scale == pytest.approx(1.4, rel=0.03)
    assert f.load_scale == pytest.approx(1.15, rel=0.05)
    assert f.overhead_s == pytest.approx(0.025, rel=0.15)
    assert f.cv_mape is not None and f.cv_mape < 0.03
    r = fitted.ttft(8192, 4096, 2, 25.0)
    truth = (
        0.026 + 1.15 * 2 * cm.transfer_bytes(4096) / 25e9 + 1.4 * cm.compute_time_s(4096, 4096, 2)
    )
    assert r.ttft_s == pytest.approx(truth, rel=0.05)
    assert r.warnings == ()
    outside = fitted.ttft(65536, 0, 64, 100.0)
    names = " ".join(outside.warnings)
    assert "prompt_tokens=65536" in names and "concurrency=64" in names and "load_gbps=100" in names


def test_ttft_one_point_fits_only_compute_scale(cm):
    f = cal.fit_ttft(cm, cal.read_ttft_csv(FIX / "ttft_one_point.csv"))
    assert f.fitted == ("compute_scale",)
    assert f.overhead_s == cm.prefill.overhead_s and f.load_scale == 1.0
    assert f.cv_mape is None


def test_bad_measurement_files(tmp_path):
    with pytest.raises(InputError) as err:
        cal.read_ttft_csv(FIX / "ttft_missing_column.csv")
    assert "ttft_missing_column.csv:1" in str(err.value) and "ttft_s" in str(err.value)
    with pytest.raises(InputError) as err:
        cal.read_ttft_csv(FIX / "ttft_no_usable_rows.csv")
    msg = str(err.value)
    assert "no usable measurement rows" in msg and "ttft_no_usable_rows.csv:2" in msg
    assert "load_gbps" in msg
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InputError, match="empty file"):
        cal.read_prefill_csv(empty)
    with pytest.raises(InputError, match="not found"):
        cal.read_load_csv(tmp_path / "nope.csv")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00prompt_tokens\n")
    with pytest.raises(InputError, match="not a UTF-8 text CSV"):
        cal.read_prefill_csv(binary)
    odd = tmp_path / "odd.csv"
    odd.write_text("prompt_tokens,cached_tokens,prefill_s,concurrency\n100,200,0.1,1\n100,0,0.1,\n")
    rows = cal.read_prefill_csv(odd)
    assert rows.skipped == 1 and "exceeds prompt_tokens" in rows.examples[0]
    assert rows.rows[0]["concurrency"] == 1.0  # empty optional cell keeps the default
    flat = tmp_path / "flat.csv"
    flat.write_text("bytes,concurrency,seconds\n1000,1,0.5\n2000000000,1,0.5\n")
    with pytest.raises(InputError, match="do not grow"):
        cal.fit_load(cal.read_load_csv(flat))


def test_ttft_calibration_flows_into_prefill_time(cm):
    """The calibrated compute scale and overhead reach every user of the CostModel."""
    fitted = cal.calibrate_ttft(cm, FIX / "ttft_calibration.csv")
    f = fitted.ttft_fit
    for s, p in ((512, 0), (4096, 8192)):
        expect = f.compute_scale * cm.compute_time_s(s, p) + f.overhead_s
        assert fitted.prefill_time_s(s, p) == pytest.approx(expect, rel=1e-12)
    r = fitted.ttft(8192, 4096, 2, 25.0)
    assert r.compute_s == pytest.approx(f.compute_scale * cm.compute_time_s(4096, 4096, 2))
    assert r.overlap_bound_s <= r.ttft_s
    # refitting a calibrated model gives the same coefficients (features are uncalibrated)
    again = cal.calibrate_ttft(fitted, FIX / "ttft_calibration.csv").ttft_fit
    assert again.compute_scale == pytest.approx(f.compute_scale, rel=1e-9)


def test_fitted_link_range_warnings(cm, tmp_path):
    from dataclasses import replace

    link = cal.fit_load(cal.read_load_csv(FIX / "load_rdma.csv"))  # 1e7..4e9 bytes, K 1..8
    linked = replace(cm, link=link)
    ok = linked.ttft(8192, 4096, 1)  # 4096 * 131072 = 0.54 GB: inside
    assert ok.warnings == ()
    far = linked.ttft(65536, 60000, 16)  # 7.9 GB per load, K=16: outside
    text = " ".join(far.warnings)
    assert "load_bytes=" in text and "concurrency=16" in text
    # an explicit --load-gbps does not use the fitted link, so no link warnings
    assert linked.ttft(65536, 60000, 16, 25.0).warnings == ()


@settings(max_examples=25, deadline=None)
@given(
    scale=st.floats(0.5, 3.0),
    overhead=st.floats(0.0, 0.1),
    load_scale=st.floats(0.5, 2.0),
    latency=st.floats(0.0, 0.01),
    seed=st.integers(0, 10_000),
)
def test_ttft_fit_recovers_exact_coefficients(
    scale, overhead, load_scale, latency, seed, tmp_path_factory
):
    """Oracle: noise-free points from known coefficients are fitted back exactly."""
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    rng = np.random.default_rng(seed)
    path = tmp_path_factory.mktemp("fit") / "t.csv"
    lines = [",".join(cal.TTFT_COLUMNS)]
    for i in range(8):
        prompt = int(rng.integers(1000, 30_000))
        # two loads at least: with one, load_scale and latency_s are not separable
        cached = int(rng.integers(1, prompt)) if i < 2 or rng.random() < 0.8 else 0
        k = int(rng.integers(1, 8))
        bw = float(rng.choice([6.5, 12.5, 25.0, 45.0]))
        t = overhead + scale * cm.compute_time_s(prompt - cached, cached, k)
        if cached:
            t += latency + load_scale * k * cm.transfer_bytes(cached) / (bw * 1e9)
        lines.append(f"{prompt},{cached},{k},{bw},{t!r}")
    path.write_text("\n".join(lines) + "\n")
    f = cal.fit_ttft(cm, cal.read_ttft_csv(path))
    assert f.compute_scale == pytest.approx(scale, rel=1e-4)
    if "load_scale" in f.fitted:
        assert f.load_scale == pytest.approx(load_scale, rel=1e-3)
    # (cross-validation may still err: a held-out point can be the only one that
    # separates the overhead from the latency)


def test_ttft_rows_as_typed_measurements(tmp_path):
    """The dashboard reads a TTFT calibration CSV's rows as typed records: each field is
    the CSV's cell, counts as integers."""
    path = tmp_path / "ttft.csv"
    path.write_text(
        "prompt_tokens,cached_tokens,concurrency,load_gbps,ttft_s\n"
        "4096,2048,2,25.5,0.31\n"
        "not,a,row,at,all\n"
        "8192,0,1,12,0.9\n"
    )
    data = cal.read_ttft_csv(path)
    assert data.skipped == 1
    assert cal.ttft_measurements(data) == [
        cal.TtftMeasurement(4096, 2048, 2, 25.5, 0.31),
        cal.TtftMeasurement(8192, 0, 1, 12.0, 0.9),
    ]
