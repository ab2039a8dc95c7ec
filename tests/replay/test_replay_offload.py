"""The decision the aggregated replay exists for: a shared-prefix workload whose working
set exceeds HBM but fits host DRAM, served by 8 TP2 servers behind a prefix-aware router.
HBM alone thrashes and collapses; local DRAM offload keeps the prefixes and serves
several times the rate within the SLO; a pool over RDMA, which must carry every hit over
the nodes' NICs, serves less than local DRAM; and `kvpool analyze`, sizing each option by
replaying it, recommends local DRAM offload, not a pool."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from analyzer.cli import app
from tests.helpers.replay import shared_prefix_log

SLO_S = 2.0


# the deployment of both commands: Qwen3-32B on 8 x TP2 H100 (4 instances a node), the
# engines' defaults for the KV pool, 7.6M tokens (about 2 TB) of host DRAM for KV a node
DEPLOYMENT = [
    "--model",
    "qwen3-32b",
    "--gpu",
    "h100",
    "--tp",
    "2",
    "--instances",
    "8",
    "--router",
    "prefix-aware",
    "--dram-capacity-tokens",
    "7600000",
    "--ttft-slo",
    str(SLO_S),
]


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return shared_prefix_log(tmp_path_factory.mktemp("offload") / "shared-prefix.jsonl")


@pytest.fixture(scope="module")
def replayed(log):
    out = log.parent / "replay.json"
    # 450 prefixes of 20,480 tokens: 9.2M tokens, 1.15M per instance once the router
    # keeps each prefix on one instance; HBM holds 328k per instance with the running
    # requests' KV, the node's DRAM (2 TB of KV per node of 4 instances) 1.9M.
    res = CliRunner().invoke(
        app,
        [
            "-q",
            "replay",
            str(log),
            *DEPLOYMENT,
            "--serving",
            "aggregated",
            "--scenarios",
            "local,local+dram,pooled",
            "--workers",
            "1",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())["scenarios"]


@pytest.mark.slow
def test_hbm_alone_collapses_where_dram_offload_meets_the_slo(replayed):
    hbm, dram = replayed["local"], replayed["local+dram"]
    assert hbm["ttft_s"]["p90"] > 10 * SLO_S  # collapsed at the log's own rate
    assert dram["ttft_s"]["p90"] <= SLO_S
    assert dram["hit_rate_by_tier"]["dram"] > 0.5  # the prefixes HBM lost, from DRAM
    assert hbm["hit_rate"] < 0.2


@pytest.mark.slow
def test_dram_offload_serves_several_times_the_rate(replayed):
    hbm = replayed["local"]["max_rate_scale_at_slo"]
    dram = replayed["local+dram"]["max_rate_scale_at_slo"]
    assert dram >= 3 * hbm
    # a pool moves every hit over the NICs: it serves more than HBM alone, less than
    # the DRAM beside each GPU
    assert hbm < replayed["pooled"]["max_rate_scale_at_slo"] < dram


@pytest.mark.slow
def test_the_verdict_is_local_dram_offload_not_a_pool(log):
    """The advisor on the same log and deployment (its default aggregated serving): each
    option sized by replaying it at the busiest load, the cheapest within the SLO wins."""
    out = log.parent / "report"
    res = CliRunner().invoke(
        app, ["-q", "analyze", str(log), *DEPLOYMENT, "-o", str(out), "--force"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"]["verdict"] == "local-offload-only"
    assert doc["verdict"]["scenario"] == "local+dram"
    fleet = doc["fleet"]
    assert all(fleet[k]["status"] == "meets-slo" for k in ("local", "local+dram", "pooled"))
    # the same load within the SLO on well under half the baseline's GPUs
    assert 2 * fleet["local+dram"]["gpus"] < fleet["local"]["gpus"]
    # a pool needs more GPUs than DRAM beside each one and costs more
    assert fleet["pooled"]["gpus"] > fleet["local+dram"]["gpus"]
    assert any("do not pool" in r for r in doc["verdict"]["reasons"])
