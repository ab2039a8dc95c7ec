"""Host DRAM tiers are private to each engine process (LMCache local CPU, HiCache L2):
the replay gives every instance its own share of the node's DRAM by default, keeps one
node-shared DRAM cache as an option, and a pool shares across instances on one node."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.errors import InputError, UsageError
from analyzer.replay import ClusterConfig, ScenarioSpec, load_scenarios, resolve, run_replay
from analyzer.replay.engine import Simulation
from tests.helpers.replay import AnalyticCost, build_trace, chained_requests

ROOT = Path(__file__).resolve().parents[2]
COST = AnalyticCost()
DRAM_ONLY = ScenarioSpec("dram-only", local=False, dram=True)


def cfg(**kw) -> ClusterConfig:
    # Cold start unless a test says otherwise: the oracles count every request. The
    # analytic cost's figures are a prefill pool's (no engine to take a KV pool from).
    base = dict(
        model="test-model",
        gpu="test-gpu",
        instances=1,
        free_loads=True,
        warmup_fraction=0.0,
        serving="disaggregated",
    )
    base.update(kw)
    return ClusterConfig(**base)


def _private_lru_oracle(blocks, prompts, block_size, n_inst, cap_blocks):
    """Round-robin over ``n_inst`` instances, each with its own LRU of ``cap_blocks``
    touched tail-first (block 0 last, so a prefix outlives its tail, as in
    ``test_replay_helpers.lru_oracle``): hit tokens counted the obvious way."""
    caches = [OrderedDict() for _ in range(n_inst)]
    hit = 0
    for k, (b, p) in enumerate(zip(blocks, prompts, strict=True)):
        c = caches[k % n_inst]
        m = 0
        while m < len(b) and b[m] in c:
            m += 1
        hit += min(m * block_size, max(p - 1, 0))
        for x in reversed(b):
            c[x] = True
            c.move_to_end(x)
        while len(c) > cap_blocks:
            c.popitem(last=False)
    return hit


def test_default_scope_splits_the_node_dram_into_private_caches():
    c = cfg(instances=8, gpus_per_node=8, dram_capacity_tokens=8_000_000)
    assert c.dram_scope == "instance" and c.dram_sharers == 8
    r = resolve(c, ScenarioSpec("local+dram", dram=True), block_size=16, cost=COST)
    assert r.dram_capacity_tokens == 8_000_000  # the node's, all instances together
    assert r.dram_per_cache_tokens == 1_000_000
    sim = Simulation(build_trace([[1]], block_size=16), r.plan, 1.0)
    drams = [inst.lower[0].cache for inst in sim.instances]
    assert len({id(d) for d in drams}) == 8  # eight separate caches
    assert {d.capacity_blocks for d in drams} == {1_000_000 // 16}
    # the node scope keeps one cache of the node's whole DRAM, shared by its instances
    n = resolve(
        cfg(instances=8, gpus_per_node=8, dram_capacity_tokens=8_000_000, dram_scope="node"),
        ScenarioSpec("local+dram", dram=True),
        block_size=16,
        cost=COST,
    )
    sim = Simulation(build_trace([[1]], block_size=16), n.plan, 1.0)
    drams = [inst.lower[0].cache for inst in sim.instances]
    assert len({id(d) for d in drams}) == 1 and drams[0].capacity_blocks == 8_000_000 // 16


def test_partly_filled_node_and_two_nodes_share_alike():
    # 4 instances of tp=2 on 8-GPU nodes: 4 per node, one node; 12 of tp=1: 8 + 4
    c = cfg(instances=4, tp=2, gpus_per_node=8, dram_capacity_tokens=4000)
    assert c.dram_sharers == 4
    c = cfg(instances=12, gpus_per_node=8, dram_capacity_tokens=8000)
    assert c.dram_sharers == 8 and c.nodes == 2
    r = resolve(c, ScenarioSpec("d", dram=True), block_size=4, cost=COST)
    sim = Simulation(build_trace([[1]], block_size=4), r.plan, 1.0)
    assert [i.lower[0].cache.capacity_blocks for i in sim.instances] == [250] * 12


@pytest.mark.parametrize("cap_blocks", [1, 3, 6, 10_000])
def test_private_dram_equals_one_lru_per_instance(cap_blocks):
    spec = [(k * 7, k % 5, 1 + k % 4) for k in range(60)]
    blocks = chained_requests(spec)
    trace = build_trace(blocks, block_size=4)
    prompts = trace.prompt_tokens.tolist()
    c = cfg(
        instances=3,
        gpus_per_node=3,
        router="round-robin",
        dram_capacity_tokens=3 * cap_blocks * 4,
    )
    doc = run_replay(trace, c, [DRAM_ONLY], search_rate=False, cost=COST).to_json()
    s = doc["scenarios"]["dram-only"]
    assert s["capacity_tokens"]["dram_per_instance"] == cap_blocks * 4
    assert s["hit_tokens_by_tier"]["dram"] == _private_lru_oracle(blocks, prompts, 4, 3, cap_blocks)
    # one node-shared cache of the same total is one LRU seen by every request
    shared = run_replay(trace, _node(c), [DRAM_ONLY], search_rate=False, cost=COST)
    shared = shared.to_json()["scenarios"]["dram-only"]
    assert shared["capacity_tokens"]["dram_per_instance"] is None
    assert shared["dram_scope"] == "node"
    assert shared["hit_tokens_by_tier"]["dram"] == _private_lru_oracle(
        blocks, prompts, 4, 1, 3 * cap_blocks
    )


def _node(c: ClusterConfig) -> ClusterConfig:
    return replace(c, dram_scope="node")


@pytest.mark.slow
def test_chat_on_one_node_of_eight_instances_pools_above_private_dram():
    """The issue's case: one 8-GPU node, 8 single-GPU instances behind round-robin, a
    chat log. Each instance's DRAM holds only what it computed; the pool is shared."""
    from analyzer.cost import CostModel
    from analyzer.ingest import IngestOptions, open_trace

    trace = open_trace([ROOT / "traces" / "chat.jsonl.zst"], IngestOptions()).trace
    c = ClusterConfig(
        model="llama-3.1-8b",
        gpu="h100",
        instances=8,
        gpus_per_node=8,
        router="round-robin",
        warmup_fraction=0.5,
    )
    assert c.nodes == 1
    doc = run_replay(trace, c, ["local", "local+dram", "pooled"], search_rate=False).to_json()
    sc = doc["scenarios"]
    # The per-instance DRAM the replay used: 512 GB of KV per node (the default), at
    # llama-3.1-8b's bf16 KV of 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes,
    # split eight ways.
    bpt = 32 * 8 * 128 * 2 * 2
    assert CostModel.from_catalog("llama-3.1-8b", "h100").bytes_per_token == bpt
    assert sc["local+dram"]["capacity_tokens"]["dram_per_node"] == 512 * 10**9 // bpt
    assert sc["local+dram"]["capacity_tokens"]["dram_per_instance"] == 512 * 10**9 // bpt // 8
    assert sc["local+dram"]["dram_scope"] == "instance"
    assert doc["cluster"]["dram_caches_per_node"] == 8
    assert sc["pooled"]["hit_rate"] > sc["local+dram"]["hit_rate"] + 0.05
    assert sc["local+dram"]["hit_rate"] >= sc["local"]["hit_rate"]
    # with a node-shared DRAM (a node-local store) the DRAM tier reaches the pool's hits
    node = run_replay(trace, _node(c), ["local+dram"], search_rate=False).to_json()["scenarios"][
        "local+dram"
    ]
    assert node["hit_rate"] == pytest.approx(sc["pooled"]["hit_rate"], abs=0.01)


def test_scope_is_validated_and_read_from_scenario_files(tmp_path):
    with pytest.raises(UsageError, match="DRAM scope"):
        cfg(dram_scope="rack")
    p = tmp_path / "s.toml"
    p.write_text('[[scenario]]\nname = "shared"\ndram = true\ndram_scope = "node"\n')
    (spec,) = load_scenarios(p)
    assert spec.applied_to(cfg()).dram_scope == "node"
    p.write_text('[[scenario]]\nname = "x"\ndram = true\ndram_scope = "rack"\n')
    with pytest.raises(InputError, match="dram_scope"):
        load_scenarios(p)
