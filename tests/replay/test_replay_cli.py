"""`kvpool replay` end to end, with the real catalogs and the real ingest."""

from __future__ import annotations

import inspect
import json

import pytest
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.cost import CostModel
from analyzer.replay import STANDARD_SCENARIOS, ClusterConfig, resolve
from analyzer.replay.capacity import kv_pool_tokens

runner = CliRunner()


@pytest.fixture
def mooncake_file(tmp_path):
    """A small Mooncake-format trace: 3 conversations growing turn by turn."""
    lines = []
    fresh = 100
    convs = [[0, 1], [0, 2], [3]]
    for turn in range(6):
        for c, chain in enumerate(convs):
            chain.extend(range(fresh, fresh + 2))
            fresh += 2
            lines.append(
                {
                    "timestamp": 1000 * (3 * turn + c),
                    "input_length": 512 * len(chain) - 100,
                    "output_length": 50,
                    "hash_ids": list(chain),
                }
            )
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_replay_command_json_and_table(mooncake_file, tmp_path):
    out = tmp_path / "replay.json"
    cfg_file = tmp_path / "scen.toml"
    cfg_file.write_text('[[scenario]]\nname = "big-pool"\npool = true\npool_gbps = 50\n')
    result = runner.invoke(
        app,
        [
            "replay",
            str(mooncake_file),
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--instances",
            "2",
            "--router",
            "session",
            "--config",
            str(cfg_file),
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    for name in ("none", "local", "local+dram", "pooled", "big-pool"):
        assert name in result.output
    doc = json.loads(out.read_text())
    assert list(doc["scenarios"]) == ["none", "local", "local+dram", "pooled", "big-pool"]
    for s in doc["scenarios"].values():
        assert {"hit_rate", "hit_rate_by_tier", "ttft_s", "prefill_gpu_s", "network_bytes"} <= set(
            s
        )
        assert {"mean", "p50", "p90", "p99"} <= set(s["ttft_s"])
        assert "max_rate_scale_at_slo" in s
    assert doc["scenarios"]["big-pool"]["link_gbps"]["pool"] == 50.0
    assert doc["scenarios"]["local"]["hit_rate"] > 0
    assert doc["cluster"]["router"] == "session"
    # aggregated by default: each instance's continuous batch, its KV pool the engine's
    assert doc["cluster"]["serving"] == "aggregated"
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    pool_tokens = kv_pool_tokens(cm, 0.9, 8192)  # vLLM's defaults on an H100
    for s in doc["scenarios"].values():
        serving = s["serving"]
        assert serving["mode"] == "aggregated" and "decode_pool" not in s
        assert (serving["max_num_batched_tokens"], serving["max_num_seqs"]) == (8192, 1024)
        assert serving["kv_pool_tokens_per_instance"] == pool_tokens
        assert 0 < serving["tpot_s"]["p50"] <= serving["tpot_s"]["p90"]
    assert doc["scenarios"]["local"]["capacity_tokens"]["local_per_instance"] == pool_tokens
    assert "TPOT p90 ms" in result.output and "Aggregated serving" in result.output
    # the TTFTs carry the cost model's measured error (docs/cost-model.md section 3c)
    from analyzer.cost.uncertainty import prefill_band

    with open(mooncake_file) as fh:
        longest = max(json.loads(line)["input_length"] for line in fh)
    band = prefill_band(cm, int(longest))
    assert doc["error_band"]["high_ratio"] == pytest.approx(band.high)
    assert "may be off by the cost model's measured error" in result.output
    assert f"{1 / band.high:.2f}x and {1 / band.low:.2f}x" in result.output


def test_the_nvme_offload_option_replays_under_its_one_name(mooncake_file, tmp_path):
    """`local+dram+nvme`, an option analyze plans and the report names, is a standard
    scenario of `kvpool replay` too, with the same description, and its NVMe tier is
    replayed (a DRAM tier too small for the histories leaves their hits to NVMe)."""
    from analyzer.advisor.price import DESCRIPTIONS

    out = tmp_path / "replay.json"
    result = runner.invoke(
        app,
        [
            "replay",
            str(mooncake_file),
            "--model",
            "llama-3.1-8b",
            "--instances",
            "1",
            "--local-capacity-tokens",
            "2048",
            "--dram-capacity-tokens",
            "1024",
            "--scenarios",
            "local,local+dram,local+dram+nvme",
            "--no-search",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert list(doc["scenarios"]) == ["local", "local+dram", "local+dram+nvme"]
    nvme = doc["scenarios"]["local+dram+nvme"]
    assert nvme["hit_rate_by_tier"]["nvme"] > 0
    assert nvme["hit_rate"] > doc["scenarios"]["local+dram"]["hit_rate"]
    assert STANDARD_SCENARIOS["local+dram+nvme"].description == DESCRIPTIONS["local+dram+nvme"]
    # asked for by name: the default run and the dashboard's default picks stay the four
    from analyzer.cli.replay import replay as replay_command
    from analyzer.replay import DEFAULT_SCENARIOS

    default = inspect.signature(replay_command).parameters["scenarios"].default
    assert default == ",".join(DEFAULT_SCENARIOS) == "none,local,local+dram,pooled"


def test_replay_command_disaggregated(mooncake_file, tmp_path):
    # --serving disaggregated: a prefill pool replayed alone, a decode pool of the same
    # GPUs sized beside it, HBM as the prefill instances' prefix cache
    out = tmp_path / "replay.json"
    args = ["replay", str(mooncake_file), "--model", "llama-3.1-8b", "--gpu", "h100"]
    args += ["--instances", "2", "--serving", "disaggregated", "--json", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["cluster"]["serving"] == "disaggregated"
    for s in doc["scenarios"].values():
        assert "serving" not in s
        pool = s["decode_pool"]
        assert pool["instances"] >= 1 and pool["gpus"] == pool["instances"] * doc["cluster"]["tp"]
        assert 0 < pool["batch"] <= pool["max_batch"] and pool["tpot_s"] > 0
    assert "decode GPUs" in result.output and "Disaggregated serving" in result.output
    cm = CostModel.from_catalog("llama-3.1-8b", "h100")
    assert doc["scenarios"]["local"]["capacity_tokens"]["local_per_instance"] == (
        cm.hbm_kv_capacity_tokens(0.1)
    )


def test_replay_command_is_deterministic(mooncake_file, tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"r{k}.json"
        args = ["replay", str(mooncake_file), "--model", "llama-3.1-8b", "--gpu", "h100"]
        args += ["--instances", "2", "--time-scale", "0.01", "--json", str(out)]
        assert runner.invoke(app, args).exit_code == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--scenarios", "local,magic"], "unknown scenario"),
        (["--local-capacity-tokens", "lots"], "--local-capacity-tokens"),
        (["--time-scale", "0"], "--time-scale"),
    ],
)
def test_replay_command_usage_errors(mooncake_file, flags, message):
    from analyzer.errors import UsageError

    args = ["replay", str(mooncake_file), "--model", "llama-3.1-8b", "--gpu", "h100"]
    result = runner.invoke(app, [*args, "--instances", "2", *flags])
    assert result.exit_code != 0
    assert isinstance(result.exception, UsageError)
    assert message in str(result.exception)


def test_replay_command_unknown_model(mooncake_file):
    result = runner.invoke(
        app,
        ["replay", str(mooncake_file), "--model", "nope-1b", "--gpu", "h100", "--instances", "1"],
    )
    assert result.exit_code != 0 and result.exception is not None


def test_catalog_defaults_resolve():
    cfg = ClusterConfig(model="llama-3.1-70b", gpu="h100", tp=4, instances=4)
    cm = CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)
    r = resolve(cfg, STANDARD_SCENARIOS["local+dram"], 16, cost=cm)
    assert r.dram_gbps == cm.tier_link("pcie-gen5-dram").bandwidth_gbps  # 4 PCIe links
    assert r.dram_capacity_tokens == int(512e9 // cm.bytes_per_token)
    p = resolve(cfg, STANDARD_SCENARIOS["pooled"], 16, cost=cm)
    assert p.pool_gbps == cm.tier_link("rdma-200").bandwidth_gbps
    # default pool: the nodes' DRAM summed (4 instances of 4 GPUs = 2 nodes of 8)
    assert p.pool_capacity_tokens == 2 * int(512e9 // cm.bytes_per_token)


def test_replay_above_the_miniature_size_says_so_and_full_replay_replays_all(
    mooncake_file, tmp_path, monkeypatch
):
    from analyzer.replay import miniature

    # this trace's 138 block accesses count as large: replayed at rate 1/2
    monkeypatch.setattr(miniature, "MIN_ACCESSES", 100)
    monkeypatch.setattr(miniature, "TARGET_ACCESSES", 80)
    out = tmp_path / "mini.json"
    args = ["replay", str(mooncake_file), "--no-search", "--scenarios", "local", "--workers", "1"]
    result = runner.invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    m = doc["miniature"]
    assert m["sampling_rate"] == 0.5 and m["block_accesses"] == 138
    assert m["measured_error"] == miniature.measured_error()
    text = " ".join(result.output.split())
    assert f"{m['sampled_requests']} of 18 requests" in text and "--full-replay" in text
    result = runner.invoke(app, [*args, "--full-replay", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "miniature" not in json.loads(out.read_text())
    assert "Miniature replay" not in result.output
