"""One resolver per setting: a link (tier, bandwidth, latency) is read by resolve_link
wherever it is used (the replay, the advisor's break-even figures, the dashboard), None is
the only "the catalog's figure", and ClusterConfig.from_settings is the one place user
settings become a cluster (the command line's flags and the dashboard's sidebar)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analyzer.advisor.price import bandwidth
from analyzer.cli.options import ClusterFlags
from analyzer.cost import CostModel, get_tier
from analyzer.errors import UsageError
from analyzer.replay import (
    UNBOUNDED,
    ClusterConfig,
    LinkSettings,
    ScenarioSpec,
    resolve,
    resolve_link,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.from_catalog("llama-3.1-8b", "h100", tp=2)


def test_a_link_left_to_the_catalog_is_the_tier(cm):
    for tier in ("pcie-gen5-dram", "nvme-gen4", "rdma-200"):
        assert resolve_link(LinkSettings(tier)) == get_tier(tier)
        assert resolve_link(LinkSettings(tier), cm) == cm.tier_link(tier)
    # host DRAM is one PCIe link per GPU: a TP-2 instance sees two
    dram = get_tier("pcie-gen5-dram")
    assert resolve_link(LinkSettings("pcie-gen5-dram"), cm).bandwidth_gbps == pytest.approx(
        2 * dram.bandwidth_gbps
    )


def test_a_set_figure_replaces_the_tiers_and_names_the_link(cm):
    rdma = get_tier("rdma-200")
    fast = resolve_link(LinkSettings("rdma-200", gbps=50.0), cm)
    assert (fast.bandwidth_gbps, fast.latency_s) == (50.0, rdma.latency_s)
    assert fast.name == "rdma-200 link at 50 GB/s"
    far = resolve_link(LinkSettings("rdma-200", latency_s=2e-3))
    assert (far.bandwidth_gbps, far.latency_s) == (rdma.bandwidth_gbps, 2e-3)
    assert far.name == "rdma-200 link at 2000 µs to the first byte"
    both = resolve_link(LinkSettings("pcie-gen5-dram", gbps=7.0, latency_s=0.0), cm)
    assert (both.bandwidth_gbps, both.latency_s) == (7.0, 0.0)  # 0 s is a value, not "unset"
    assert both.kind == get_tier("pcie-gen5-dram").kind
    with pytest.raises(UsageError):
        resolve_link(LinkSettings("no-such-tier"))


@pytest.mark.parametrize(
    "links",
    [
        {},
        {"pool_gbps": 3.0, "pool_latency_s": 1e-3},
        {"dram_gbps": 11.0, "nvme_gbps": 2.5, "nvme_latency_s": 1e-4, "dram_latency_s": 0.0},
    ],
)
def test_the_replay_and_the_advisor_read_each_link_alike(cm, links):
    """The figures the replay moves blocks at are the ones the report prints beside the
    break-even bandwidth (the advisor once read the DRAM and NVMe links from the catalog
    whatever was set)."""
    cfg = ClusterConfig(model="llama-3.1-8b", gpu="h100", tp=2, **links)
    every = ScenarioSpec("every-tier", dram=True, nvme=True, pool=True)
    got = resolve(cfg, every, 16, cost=cm)
    tiers = {t.role: t for t in bandwidth(cm, cfg, 4096).tiers}
    assert tiers["dram"].bandwidth_gbps == pytest.approx(got.dram_gbps)
    assert tiers["nvme"].bandwidth_gbps == pytest.approx(got.nvme_gbps)
    assert tiers["pool"].bandwidth_gbps == pytest.approx(got.pool_gbps)
    assert tiers["pool"].latency_s == pytest.approx(got.pool_latency_s)
    assert got.plan.dram is not None and got.plan.nvme is not None
    assert tiers["dram"].latency_s == pytest.approx(got.plan.dram.latency_s)
    assert tiers["nvme"].latency_s == pytest.approx(got.plan.nvme.latency_s)
    for role, link in (("dram", cfg.dram_link), ("nvme", cfg.nvme_link), ("pool", cfg.pool_link)):
        assert tiers[role].tier == resolve_link(link, cm).name
        assert (tiers[role].tier == link.tier) is not link.overridden


def test_a_cluster_reads_its_links_whole():
    cfg = ClusterConfig(pool_tier="rdma-400", pool_gbps=9.0, dram_latency_s=1e-6)
    assert cfg.pool_link == LinkSettings("rdma-400", 9.0, None)
    assert cfg.dram_link == LinkSettings(cfg.dram_tier, None, 1e-6)
    assert cfg.nvme_link == LinkSettings(cfg.nvme_tier) and not cfg.nvme_link.overridden
    with pytest.raises(UsageError, match="pool-gbps"):
        ClusterConfig(pool_gbps=0.0)  # 0 is not "the catalog's": None is


def test_from_settings_is_what_the_flags_build():
    assert ClusterConfig.from_settings() == ClusterConfig() == ClusterFlags().config()
    flags = ClusterFlags(
        model="llama-3.1-70b",
        tp=4,
        weights_dtype="FP16",
        pool_gbps=12.0,
        local_capacity_tokens="2e6",
        pool_capacity_tokens="unbounded",
        warmup=0.25,
        hicache_size=3.0,
    )
    cfg = flags.config(time_scale=0.5)
    assert cfg == ClusterConfig.from_settings(
        model="llama-3.1-70b",
        tp=4,
        weights_dtype="fp16",
        pool_gbps=12.0,
        local_capacity_tokens=2_000_000,
        pool_capacity_tokens="unbounded",
        warmup=0.25,
        hicache_size=3.0,
        time_scale=0.5,
    )
    assert (cfg.weights_dtype, cfg.local_capacity_tokens) == ("bf16", 2_000_000)
    assert (cfg.pool_capacity_tokens, cfg.warmup_fraction, cfg.hicache_size_gb) == (
        UNBOUNDED,
        0.25,
        3.0,
    )


def test_from_settings_takes_a_link_whole_and_once():
    link = LinkSettings("rdma-400", gbps=30.0, latency_s=5e-5)
    cfg = ClusterConfig.from_settings(pool=link, dram=LinkSettings("pcie-gen4-dram"))
    assert cfg.pool_link == link and cfg.dram_link == LinkSettings("pcie-gen4-dram")
    assert (cfg.pool_tier, cfg.pool_gbps, cfg.pool_latency_s) == ("rdma-400", 30.0, 5e-5)
    with pytest.raises(UsageError, match="pool_gbps"):
        ClusterConfig.from_settings(pool=link, pool_gbps=1.0)
    with pytest.raises(UsageError, match="--pool-capacity-tokens"):
        ClusterConfig.from_settings(pool_capacity_tokens="lots")
    with pytest.raises(UsageError, match="--weights-dtype"):
        ClusterConfig.from_settings(weights_dtype="int3")


def test_the_dashboard_builds_its_cluster_without_the_command_line():
    users = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "analyzer.cli" or n.startswith("analyzer.cli.") for n in names):
                users.append(str(path.relative_to(ROOT)))
    assert users == []


def test_the_break_even_tables_take_a_resolved_link_as_it_is(cm):
    """The dashboard's break-even tables price each link as the replay moves blocks over
    it: a host DRAM bandwidth set for a TP-2 instance is the instance's (docs/replay.md),
    not doubled again as the catalog's per-GPU figure is."""
    set_dram = resolve_link(LinkSettings("pcie-gen5-dram", gbps=10.0), cm)
    row = cm.break_even_table([4096], [set_dram], as_seen=True)[0]
    assert (row.tier, row.bandwidth_gbps) == ("pcie-gen5-dram link at 10 GB/s", 10.0)
    assert cm.break_even_table([4096], [set_dram])[0].bandwidth_gbps == 20.0  # seen twice
    (tier,) = cm.tier_break_even([set_dram], as_seen=True)
    assert tier["bandwidth_gbps"] == 10.0
    # a catalog tier, by name or resolved, is the same row either way
    catalog = resolve_link(LinkSettings("pcie-gen5-dram"), cm)
    assert cm.break_even_table([4096], [catalog], as_seen=True) == cm.break_even_table(
        [4096], ["pcie-gen5-dram"]
    )
    assert cm.tier_break_even(["pcie-gen5-dram"], as_seen=True) == cm.tier_break_even(
        ["pcie-gen5-dram"]
    )
