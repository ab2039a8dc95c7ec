"""Ranges from the cost model's measured error, and the verdict's flip wording."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from analyzer.advisor import AnalyzeOptions, run_analysis
from analyzer.cost import CostModel
from analyzer.cost import uncertainty as unc
from analyzer.cost.catalog import get_gpu
from analyzer.cost.reference import default_check
from analyzer.replay.config import ClusterConfig
from analyzer.report import render_markdown
from analyzer.report.document import report_json

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)


def _kind_rows(is_moe: bool, fp8: bool):
    return [
        c
        for c in default_check().rows
        if c.row.is_moe == is_moe
        and (get_gpu(c.row.gpu).compute_dtype_for(c.row.weights_dtype) != "bf16") == fp8
    ]


def test_band_is_the_loo_spread_of_the_same_kind():
    cm = CostModel.from_catalog("llama-3.1-8b", "h100", weight_dtype="fp8")
    band = unc.prefill_band(cm, 2048)
    rows = _kind_rows(is_moe=False, fp8=True)
    assert band.kind == "dense, fp8 GEMMs" and band.rows == len(rows)
    assert band.low == pytest.approx(min(1.0, *(c.loo_ratio for c in rows)))
    assert band.high == pytest.approx(max(1.0, *(c.loo_ratio for c in rows)))
    assert not band.extrapolated


def test_thin_kinds_fall_back_and_long_prompts_are_extrapolated():
    # the MoE rows are one deployment (SGLang EP32): too little to stand alone
    ds = unc.prefill_band(CostModel.from_catalog("deepseek-v3", "h200", tp=8), 2048)
    every = default_check().rows
    assert ds.kind == "every row" and ds.rows == len(every)
    far = unc.prefill_band(CostModel.from_catalog("llama-3.1-8b", "h100"), 200_000)
    assert far.extrapolated and "may be too narrow" in far.describe()


def test_calibrated_models_carry_their_own_error():
    from analyzer.cost.coefficients import PrefillCoefficients

    cm = CostModel.from_catalog("llama-3.1-8b", "h100").with_prefill(
        PrefillCoefficients(
            compute_scale=1.2, fitted=("compute_scale",), cv_mape=0.04, n_points=9, source="p.csv"
        )
    )
    band = unc.prefill_band(cm, 2048)
    assert (band.low, band.high, band.rows) == (pytest.approx(0.96), pytest.approx(1.04), 9)
    assert "p.csv" in band.basis


def test_range_arithmetic():
    band = unc.ErrorBand(0.8, 1.25, "k", 5, "b")
    t = unc.time_range(1.0, band)
    assert (t.low, t.high) == (pytest.approx(0.8), pytest.approx(1.25))
    r = unc.rate_range(1000.0, band)
    assert (r.low, r.high) == (pytest.approx(800), pytest.approx(1250))
    be = unc.break_even_range(10.0, band)
    assert (be.low, be.high) == (pytest.approx(8.0), pytest.approx(12.5))


def test_flip_wording_inside_and_outside_the_range():
    band = unc.ErrorBand(0.8, 1.25, "dense, fp8 GEMMs", 6, "leave-one-out error on 6 rows")
    f = unc.bandwidth_flip(10.0, 4096, [("the pool link", 11.0), ("host DRAM", 90.0)], band)
    assert f.inside and f.tiers == ("the pool link",)
    assert "between 8 and 12.5 GB/s" in f.statement
    assert "A flip of the verdict lies inside that range" in f.statement
    assert "the pool link (11 GB/s) passes now, but fails if your GPUs prefill more than 10%" in (
        f.statement
    )
    assert "`kvpool cost profile`" in f.statement and "`kvpool cost fit --prefill`" in f.statement
    g = unc.bandwidth_flip(10.0, 4096, [("the pool link", 9.0)], band)
    assert g.inside and "fails now, but passes if your GPUs prefill more than 10% slower" in (
        g.statement
    )
    h = unc.bandwidth_flip(10.0, 4096, [("the pool link", 20.0)], band)
    assert not h.inside and "No tier's bandwidth check flips inside that range." in h.statement


@pytest.mark.slow
def test_report_states_ranges_and_a_flip_inside_them(tmp_path):
    """End to end: a pool link just above break-even makes the verdict uncertain."""
    log = make_logs.high_reuse(tmp_path / "high.jsonl.gz")
    fast = dict(size_search=False, sensitivity_replays=False)
    first = run_analysis([str(log)], AnalyzeOptions(**fast))
    be = first.bandwidth.break_even_gbps
    # local NVMe far from break-even, so the pool link alone is near it
    near = run_analysis(
        [str(log)],
        AnalyzeOptions(cluster=ClusterConfig(pool_gbps=be * 1.05, nvme_gbps=be * 50), **fast),
    )
    d = near.decision
    statement = d.confidence_statement
    assert "A flip of the verdict lies inside that range" in statement
    assert "passes now, but fails if your GPUs prefill more than 5% faster" in statement
    assert near.uncertainty is not None and near.uncertainty.flip.inside is True
    assert near.uncertainty.to_json()["flip"]["flip_inside_range"] is True
    # the confidence is lowered one level from what the same analysis says far from it
    far = run_analysis(
        [str(log)],
        AnalyzeOptions(cluster=ClusterConfig(pool_gbps=be * 50, nvme_gbps=be * 50), **fast),
    )
    assert "No tier's bandwidth check flips inside that range." in far.decision.confidence_statement
    order = ["low", "medium", "high"]
    assert order.index(d.confidence) == max(order.index(far.decision.confidence) - 1, 0)
    doc = report_json(near)
    u = doc["uncertainty"]
    assert u["break_even_gbps"]["low"] < be < u["break_even_gbps"]["high"]
    md = render_markdown(doc)
    verdict = md.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "A flip of the verdict lies inside that range" in verdict
    lo, hi = u["break_even_gbps"]["low"], u["break_even_gbps"]["high"]
    assert f"between {lo:.3g} and {hi:.3g} GB/s" in verdict
