"""`kvpool cost` commands through the real app: outputs, JSON files, errors and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.cost import CostModel
from analyzer.errors import EXIT_INPUT, EXIT_USAGE, InputError, UsageError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cost"
ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["cost", *args])


def test_models_and_gpus_listing(tmp_path):
    out = tmp_path / "models.json"
    r = _run("models", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "llama-3.1-70b" in r.output and "327,680" in r.output
    data = json.loads(out.read_text())
    by_id = {m["id"]: m for m in data["models"]}
    assert by_id["deepseek-v3"]["kv_bytes_per_token"] == {"bf16": 70_272, "fp8": 35_136}
    assert by_id["qwen3-next-80b-a3b"]["linear_state_bytes_per_request"] == 39_518_208
    r = _run("gpus", "--json", str(tmp_path / "gpus.json"))
    assert r.exit_code == 0, r.output
    assert "mi325x" in r.output and "rdma-200" in r.output
    hw = json.loads((tmp_path / "gpus.json").read_text())
    assert {g["id"] for g in hw["gpus"]} >= {"a100", "h100", "h200", "b200", "mi300x", "mi325x"}


def test_show(tmp_path):
    out = tmp_path / "show.json"
    args = ["show", "--model", "Llama-3.1-70B", "--gpu", "H100", "--tp", "4", "--json", str(out)]
    r = _run(*args)
    assert r.exit_code == 0, r.output
    assert "327,680 stored" in r.output and "break-even" in r.output.lower()
    data = json.loads(out.read_text())
    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    assert data["bytes_per_token"] == 327_680
    assert data["hbm_kv_capacity_tokens"] == cm.hbm_kv_capacity_tokens()
    p4096 = next(p for p in data["prefixes"] if p["prefix_tokens"] == 4096)
    assert p4096["break_even_gbps"] == pytest.approx(cm.break_even_bandwidth_gbps(4096))
    tiers = {t["tier"]: t["break_even_prefix_tokens"] for t in data["tiers"]}
    assert tiers["tcp"] == cm.break_even_prefix_tokens(2.0, 5e-4)
    assert len(data["break_even_table"]) == 4 * len(data["tiers"])
    # deterministic bytes
    out2 = tmp_path / "show2.json"
    assert _run(*args[:-1], str(out2)).exit_code == 0
    assert out.read_bytes() == out2.read_bytes()
    # JSON to stdout stays parseable
    r = _run("show", "-m", "gpt-oss-120b", "-g", "h200", "--json", "-")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["model"]["sliding_window_layers"] == 18


def test_ttft_json_fields(tmp_path):
    out = tmp_path / "ttft.json"
    r = _run(
        "ttft",
        "-m",
        "llama-3.1-8b",
        "-g",
        "h100",
        "--prompt-tokens",
        "8192",
        "--cached-tokens",
        "6000",
        "--concurrency",
        "4",
        "--load-gbps",
        "25",
        "--load-latency-ms",
        "2",
        "--json",
        str(out),
    )
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    expect = cm.ttft(8192, 6000, 4, 25.0, 2e-3)
    for key in ("ttft_s", "load_s", "compute_s", "overhead_s"):
        assert data[key] == pytest.approx(getattr(expect, key))
    assert data["ttft_s"] == pytest.approx(data["load_s"] + data["compute_s"] + data["overhead_s"])
    scatter = 4 * 6000 * 131_072 / (3.35e12 * cm.engine.hbm_eff)  # into the paged KV cache
    assert data["load_s"] == pytest.approx(2e-3 + 4 * 6000 * 131_072 / 25e9 + scatter)


def test_ttft_with_calibration_and_warning(tmp_path):
    out = tmp_path / "t.json"
    base = ["ttft", "-m", "llama-3.1-8b", "-g", "h100", "--load-gbps", "25", "--mfu", "0.5"]
    r = _run(
        *base,
        "--prompt-tokens",
        "8192",
        "--cached-tokens",
        "4096",
        "--calibration",
        str(FIX / "ttft_calibration.csv"),
        "--json",
        str(out),
    )
    assert r.exit_code == 0, r.output
    assert "fitted compute_scale, overhead_s, load_scale, latency_s on 10 points" in r.output
    data = json.loads(out.read_text())
    assert data["cost_model"]["ttft_calibration"]["compute_scale"] == pytest.approx(1.4, rel=0.03)
    assert data["warnings"] == []
    r = _run(
        *base,
        "--prompt-tokens",
        "100000",
        "--calibration",
        str(FIX / "ttft_one_point.csv"),
    )
    assert r.exit_code == 0, r.output
    assert "kept from the catalog: overhead_s, load_scale, latency_s" in r.output
    assert "outside the calibrated range" in r.output


def test_fit_then_profile(tmp_path):
    prof = tmp_path / "models" / "h100-llama8b.json"
    prof.parent.mkdir()
    r = _run(
        "fit",
        "-m",
        "llama-3.1-8b",
        "-g",
        "h100",
        "--prefill",
        str(FIX / "prefill_llama8b_h100.csv"),
        "--load",
        str(FIX / "load_rdma.csv"),
        "-o",
        str(prof),
        "--json",
        str(tmp_path / "fit.json"),
    )
    assert r.exit_code == 0, r.output
    assert "2 skipped" in r.output and "cross-validated MAPE" in r.output
    saved = json.loads(prof.read_text())
    assert saved["prefill"]["form"] == "polynomial"
    assert saved["load"]["bandwidth_gbps"] == pytest.approx(18.0, rel=0.02)
    summary = json.loads((tmp_path / "fit.json").read_text())
    assert summary["prefill_rows"] == {"usable": 20, "skipped": 2}
    r = _run("show", "--profile", str(prof), "--json", str(tmp_path / "s.json"))
    assert r.exit_code == 0, r.output
    tiers = {t["tier"] for t in json.loads((tmp_path / "s.json").read_text())["tiers"]}
    assert "fitted" in tiers
    r = _run("ttft", "--profile", str(prof), "--prompt-tokens", "8192", "--cached-tokens", "4096")
    assert r.exit_code == 0, r.output
    assert "18.0" in r.output  # the fitted link's bandwidth
    r = _run("show", "--profile", str(prof), "--model", "qwen3-8b")
    assert isinstance(r.exception, UsageError) and "fitted for model" in str(r.exception)


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        (["show", "-m", "llama-3.1-7b", "-g", "h100"], UsageError, "did you mean"),
        (["show", "-m", "llama-3.1-8b", "-g", "h1000"], UsageError, "h100"),
        (["show", "-m", "llama-3.1-70b", "-g", "h100", "--tp", "3"], UsageError, "does not divide"),
        (["show", "-m", "llama-3.1-8b", "-g", "h100", "--tp", "0"], UsageError, "at least 1"),
        (
            [
                "show",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100",
                "--link-gbps",
                "5",
                "--link-latency-ms",
                "nan",
            ],
            UsageError,
            ">= 0",
        ),
        (
            [
                "ttft",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100",
                "--prompt-tokens",
                "10",
                "--load-gbps",
                "5",
                "--load-latency-ms",
                "inf",
            ],
            UsageError,
            ">= 0",
        ),
        (["show", "-m", "llama-3.1-8b", "-g", "h100", "--kv-dtype", "int3"], UsageError, "dtype"),
        (["show", "-m", "llama-3.1-8b"], UsageError, "--gpu"),
        (
            [
                "ttft",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100",
                "--prompt-tokens",
                "10",
                "--load-gbps",
                "0",
            ],
            UsageError,
            "positive",
        ),
        (
            [
                "ttft",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100",
                "--prompt-tokens",
                "10",
                "--load-gbps",
                "-3",
            ],
            UsageError,
            "positive",
        ),
        (
            [
                "ttft",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100",
                "--prompt-tokens",
                "10",
                "--cached-tokens",
                "20",
                "--load-gbps",
                "5",
            ],
            UsageError,
            "exceed",
        ),
        (
            [
                "ttft",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100",
                "--prompt-tokens",
                "10",
                "--load-gbps",
                "5",
                "--calibration",
                str(FIX / "ttft_missing_column.csv"),
            ],
            InputError,
            "ttft_missing_column.csv:1",
        ),
        (
            [
                "ttft",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100",
                "--prompt-tokens",
                "10",
                "--load-gbps",
                "5",
                "--calibration",
                str(FIX / "ttft_no_usable_rows.csv"),
            ],
            InputError,
            "no usable measurement rows",
        ),
        (["fit", "-m", "llama-3.1-8b", "-g", "h100", "-o", "x.json"], UsageError, "at least one"),
    ],
)
def test_bad_input_messages(args, error, needle):
    r = _run(*args)
    assert isinstance(r.exception, error), r.output
    assert needle in str(r.exception)
    assert r.exception.exit_code == (EXIT_USAGE if error is UsageError else EXIT_INPUT)


def test_user_config_path(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "num_hidden_layers": 16,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 2048,
                "intermediate_size": 8192,
                "vocab_size": 128256,
            }
        )
    )
    r = _run("show", "-m", str(cfg), "-g", "h100", "--json", str(tmp_path / "o.json"))
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "o.json").read_text())["bytes_per_token"] == 32_768


def test_real_process_exit_code_and_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "cost", "show", "-m", "lama-70b", "-g", "h100"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == EXIT_USAGE
    assert "unknown model 'lama-70b'" in proc.stderr and "Traceback" not in proc.stderr


def test_show_custom_link(tmp_path):
    out = tmp_path / "s.json"
    r = _run(
        "show",
        "-m",
        "llama-3.1-8b",
        "-g",
        "h100",
        "--tier",
        "rdma",
        "--link-gbps",
        "3",
        "--link-latency-ms",
        "1",
        "--json",
        str(out),
    )
    assert r.exit_code == 0, r.output
    tiers = {t["tier"]: t for t in json.loads(out.read_text())["tiers"]}
    assert set(tiers) == {"rdma-200", "custom"}
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    assert tiers["custom"]["break_even_prefix_tokens"] == cm.break_even_prefix_tokens(3.0, 1e-3)
    r = _run("show", "-m", "llama-3.1-8b", "-g", "h100", "--link-gbps", "0")
    assert isinstance(r.exception, UsageError) and "positive" in str(r.exception)


def test_ttft_measured_names_the_step_model(tmp_path):
    """--measured prices the compute with the deployment's step model and says which:
    on an H20 (no aiconfigurator-core data) the engine model, so the same TTFT."""
    out = tmp_path / "t.json"
    args = ["cost", "ttft", "-m", "llama-3.1-8b", "-g", "h20", "--prompt-tokens", "8192"]
    args += ["--cached-tokens", "6000", "--load-gbps", "25", "--json", str(out)]
    r = runner.invoke(app, [*args, "--measured", "vllm"])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    step = data["step_model"]
    assert step["source"].startswith("kvpool engine model")
    assert "no kernel data for NVIDIA H20" in step["source"]
    assert step["ttft_s"] == pytest.approx(data["ttft_s"], rel=1e-9)
    bad = runner.invoke(app, [*args, "--measured", "tgi"])
    assert isinstance(bad.exception, UsageError) and bad.exception.exit_code == EXIT_USAGE
    assert "--measured must be one of vllm, sglang, trtllm" in str(bad.exception)
