"""`kvpool cost profile` on CPU (PyTorch, a tiny model config), and its profile in use.

No GPU is available to the test suite: these runs time PyTorch on the CPU, which checks
the whole path (shapes, timing, CSVs, fit, profile, --profile) but says nothing about a
GPU's speed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.cost import get_model
from analyzer.cost.profiler import LayerShape
from analyzer.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)

runner = CliRunner()
TINY = {
    "_name_or_path": "tiny-llama",
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("profile")
    cfg = d / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(TINY), encoding="utf-8")
    out = d / "tiny.json"
    args = ["cost", "profile", "-m", str(cfg), "-g", "h100", "-o", str(out), "--device", "cpu"]
    r = runner.invoke(app, [*args, "--prompt-tokens", "32,64,128", "--batch", "1,2"])
    assert r.exit_code == 0, r.output
    return d, cfg, out, r.output


@pytest.mark.slow
def test_profile_writes_raw_points_and_a_fitted_profile(profiled):
    d, cfg, out, output = profiled
    doc = json.loads(out.read_text())
    assert doc["schema"] == "kvpool.cost-profile/1" and doc["model"] == str(cfg)
    assert doc["measured"]["device"].startswith("cpu")
    assert "no GPU: these figures describe this CPU" in output
    shape = doc["measured"]["layer_shape"]
    assert (shape["hidden"], shape["q_heads"], shape["kv_heads"], shape["mlp_width"]) == (
        64,
        4,
        2,
        172,
    )
    raw = (d / doc["measured"]["raw"]["prefill"]).read_text().splitlines()
    assert raw[0] == "prompt_tokens,cached_tokens,concurrency,prefill_s"
    assert len(raw) == 1 + 3 * 2 * 2  # lengths x batches x (from scratch, after a prefix)
    p = doc["prefill"]
    assert p["form"] == "polynomial" and p["n_points"] == 12
    assert set(p["fitted"]) == {
        "overhead_s",
        "per_token_s",
        "per_context_token_s",
        "per_token_sq_s",
    }
    assert doc["load"] is None  # no CUDA device: no copy bandwidth


def test_cost_ttft_uses_the_profile(profiled, tmp_path):
    _, _, out, _ = profiled
    doc = json.loads(out.read_text())
    c = doc["prefill"]
    j = tmp_path / "t.json"
    args = ["--prompt-tokens", "200", "--cached-tokens", "100", "--load-gbps", "10"]
    r = runner.invoke(app, ["cost", "ttft", "--profile", str(out), *args, "--json", str(j)])
    assert r.exit_code == 0, r.output
    t = json.loads(j.read_text())
    s, p = 100, 100
    # the step form prices a chunk's attention over its own tokens as the causal half
    # (p * s + s^2 / 2) and cannot go below it: a quadratic term a CPU's noisy fit puts
    # under half the context one is held there (CostModel._calibrated_coefficients)
    ctx, sq = c["per_context_token_s"], c["per_token_sq_s"]
    want = c["per_token_s"] * s + ctx * (p * s + s * s / 2) + max(sq - ctx / 2, 0.0) * s * s
    assert t["compute_s"] == pytest.approx(want, rel=1e-9)
    assert t["overhead_s"] == pytest.approx(c["overhead_s"], rel=1e-9)
    assert "measured on a CPU, not a GPU" in t["cost_model"]["profile"]
    assert t["error_band"]["basis"].startswith("cross-validated error of the calibration")
    assert t["error_band"]["high_ratio"] == pytest.approx(1 + c["cv_mape"])


@pytest.mark.slow
def test_analyze_uses_the_profile(profiled, tmp_path):
    _, _, out, _ = profiled
    log = make_logs.high_reuse(tmp_path / "high.jsonl.gz")
    rep = tmp_path / "rep"
    args = ["analyze", str(log), "--profile", str(out), "--no-rate-search", "-o", str(rep)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads((rep / "report.json").read_text())
    assert doc["cost"]["model"] == "tiny-llama"
    assert doc["cost"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # K+V, layers, kv heads, dim
    band = doc["uncertainty"]["band"]
    assert band["kind"] == "your measurements"
    assert band["high_ratio"] == pytest.approx(  # the report rounds to 6 digits
        1 + json.loads(out.read_text())["prefill"]["cv_mape"], rel=1e-5
    )
    # a --model that disagrees with the profile is refused
    bad = runner.invoke(app, [*args[:-2], "--model", "llama-3.1-70b", "-o", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "was fitted for model" in str(bad.exception)


def test_layer_shape_matches_real_models():
    """Oracle: the MLP width rebuilt from the parameter count is the config's."""
    for name, width in (("llama-3.1-8b", 14336), ("llama-3.1-70b", 28672), ("qwen3-8b", 12288)):
        shape = LayerShape.of(get_model(name), 1)
        assert shape.mlp_width == pytest.approx(width, rel=0.01)
    s8 = LayerShape.of(get_model("llama-3.1-70b"), 8)
    assert (s8.q_heads, s8.kv_heads) == (8, 1)


def test_bad_flags_are_one_line_errors(profiled, tmp_path, monkeypatch):
    _, cfg, _, _ = profiled
    r = runner.invoke(app, ["cost", "profile", "-m", str(cfg), "-g", "h100", "-o", "p.txt"])
    assert isinstance(r.exception, UsageError) and "must be a .json file" in str(r.exception)
    o = str(tmp_path / "p.json")
    r = runner.invoke(
        app, ["cost", "profile", "-m", str(cfg), "-g", "h100", "-o", o, "--device", "tpu"]
    )
    assert isinstance(r.exception, UsageError) and "--device must be" in str(r.exception)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if PyTorch were not installed
    r = runner.invoke(app, ["cost", "profile", "-m", str(cfg), "-g", "h100", "-o", o])
    assert isinstance(r.exception, UsageError) and "needs PyTorch" in str(r.exception)
    assert not Path(o).exists()
