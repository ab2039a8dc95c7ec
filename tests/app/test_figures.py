"""The chart tables (analyzer.report.figures), on a hand-built trace whose numbers are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.advisor.words import OPTION_DESCRIPTION
from analyzer.report import figures
from analyzer.trace import BlockTrace, table_from_rows


def _trace(rows: list[dict], block_size: int = 16) -> BlockTrace:
    full = [
        {"request_id": f"r{i}", **r, "prompt_tokens": len(r["block_hashes"]) * block_size}
        for i, r in enumerate(rows)
    ]
    return BlockTrace.from_table(table_from_rows(full, block_size=block_size))


@pytest.fixture
def tree_trace() -> BlockTrace:
    # Six requests: four share block 100 (two of them then share 200), one starts with
    # 900, one has no full block at all.
    rows = [
        {"arrival_s": 0.0, "block_hashes": [100, 200, 300], "session_id": "a", "tenant": "t1"},
        {"arrival_s": 1.0, "block_hashes": [100, 200, 301], "session_id": "a", "tenant": "t1"},
        {"arrival_s": 2.0, "block_hashes": [100, 210], "session_id": "b", "tenant": "t2"},
        {"arrival_s": 3.0, "block_hashes": [100], "session_id": "c", "tenant": "t2"},
        {"arrival_s": 4.0, "block_hashes": [900, 901], "tenant": "t2"},
        {"arrival_s": 5.0, "block_hashes": []},
    ]
    return _trace(rows)


def test_prefix_tree_widths_count_requests(tree_trace: BlockTrace) -> None:
    frame = figures.prefix_tree_frame(tree_trace, levels=3, min_share=0.0)
    level0 = frame[frame.level == 0].sort_values("x0")
    assert level0.requests.tolist() == [4, 1]  # the shared root first, then 900
    assert level0.x0.tolist() == pytest.approx([0.0, 4 / 6])
    assert level0.x1.tolist() == pytest.approx([4 / 6, 5 / 6])  # last request: a gap
    level1 = frame[frame.level == 1].sort_values("x0")
    # Under 100: 200 (two requests), then 210. The one request under 900 goes on to 901,
    # so 900's rectangle grows down to 32 tokens instead of getting a child.
    assert level1.requests.tolist() == [2, 1]
    assert level1.x0.tolist() == pytest.approx([0.0, 2 / 6])
    assert level0.y1_tokens.tolist() == [16, 32]
    level2 = frame[frame.level == 2]
    assert sorted(level2.requests.tolist()) == [1, 1]
    assert set(frame.tokens[frame.level == 2]) == {"32-48"}
    # 210's single request ends there: nothing below it.
    assert frame[(frame.level == 1)].y1_tokens.tolist() == [32, 32]
    # Every child lies inside its parent's span, so the icicle nests.
    assert (frame.x1 <= 1.0 + 1e-12).all()


def test_prefix_tree_merges_small_prefixes(tree_trace: BlockTrace) -> None:
    frame = figures.prefix_tree_frame(tree_trace, levels=3, min_share=0.5)
    level0 = frame[frame.level == 0].sort_values("x0")
    assert level0.requests.tolist() == [4, 1]
    assert level0.label.iloc[1].startswith("other (1 requests")
    # Only the big node is expanded; its children are all below half, so merged.
    level1 = frame[frame.level == 1]
    assert level1.requests.tolist() == [3]
    assert frame[frame.level == 2].empty


def test_arrivals_bins_in_round_steps(tree_trace: BlockTrace) -> None:
    frame = figures.arrivals_frame(tree_trace, max_bins=3)
    # Span 5 s in at most 3 bins: 2 s bins, 3 of them: [0,2) [2,4) [4,6).
    assert frame.time_s.tolist() == [0.0, 2.0, 4.0]
    assert frame.requests_per_s.tolist() == [1.0, 1.0, 1.0]
    assert frame.prompt_tokens_per_s.sum() * 2 == tree_trace.prompt_tokens.sum()


def test_log2_histogram() -> None:
    frame = figures.log2_histogram_frame(np.array([0, 1, 2, 3, 4, 1000, -1]), "x")
    assert frame.x.tolist()[:4] == ["0", "1", "2-3", "4-7"]
    assert frame.requests.tolist()[:4] == [1, 1, 2, 1]
    assert frame.requests.sum() == 6  # unknown (-1) left out
    assert frame.x.tolist()[-1] == "512-1,023"


def test_sessions_and_tenants(tree_trace: BlockTrace) -> None:
    sessions = figures.sessions_frame(tree_trace)
    assert dict(zip(sessions.requests_in_session, sessions.sessions, strict=True)) == {
        "1": 2,
        "2-3": 1,
    }
    assert figures.requests_in_multi_request_sessions(tree_trace) == 2
    tenants = figures.tenants_frame(tree_trace, top=1)
    assert tenants.tenant.tolist() == ["t1", "other (2)"]
    assert tenants.requests.tolist() == [2, 4]
    assert tenants.prompt_tokens.sum() == tree_trace.prompt_tokens.sum()


def test_prefix_tree_marks_merged_slices_as_other(tree_trace: BlockTrace) -> None:
    # At 20% (2 of 6 requests) the request starting with 900 and the one branching to 210
    # are merged: drawn as "other", grey, never as a distinct shared prefix.
    frame = figures.prefix_tree_frame(tree_trace, levels=2, min_share=0.2)
    other = frame[frame.kind == "other"]
    assert other.requests.tolist() == [1, 1]
    assert other.level.tolist() == [0, 1]
    assert set(frame[frame.kind == "prefix"].requests.tolist()) == {4, 2}


@pytest.fixture(scope="module")
def replayed():
    """A small real replay (local and pooled, with the rate search) on two nodes."""
    from analyzer.replay import ClusterConfig, run_replay
    from tests.helpers.replay import AnalyticCost, build_trace, chained_requests

    spec = [(k * 7, k % 5, 1 + k % 4) for k in range(80)]
    trace = build_trace(chained_requests(spec), block_size=4)
    # round-robin over two nodes with a small HBM cache: the pool serves some hits
    cfg = ClusterConfig(
        serving="disaggregated",  # the analytic cost prices a prefill pool
        model="test-model",
        gpu="test-gpu",
        instances=2,
        gpus_per_node=1,
        router="round-robin",
        local_capacity_tokens=32,
        warmup_fraction=0.0,
    )
    return run_replay(trace, cfg, ["local", "pooled"], cost=AnalyticCost()).scenarios


def test_scenarios_frame_reads_the_replay_records(replayed) -> None:
    frame = figures.scenarios_frame(replayed)
    assert frame.scenario.tolist() == ["local", "pooled"]
    for row, s in zip(frame.to_dict("records"), replayed.values(), strict=True):
        doc = s.to_json()  # the same figures as `kvpool replay --json` prints
        assert row["hit_rate"] == doc["hit_rate"]
        assert row["ttft_p90_s"] == doc["ttft_s"]["p90"]
        assert row["ttft_mean_s"] == doc["ttft_s"]["mean"]
        assert row["prefill_gpu_s"] == pytest.approx(doc["prefill_gpu_s"])
        assert row["network_gb"] == pytest.approx(doc["network_bytes"] / 1e9)
        assert row["peak_link_use"] == doc["peak_link_utilisation"]
        assert row["max_rate_scale"] == doc["max_rate_scale_at_slo"]
        assert row["max_rate_capped"] == doc["rate_search"]["capped"]
        # what the option deploys, in the report's words (the options table's)
        assert row["description"] == OPTION_DESCRIPTION[row["scenario"]]
    assert frame.network_gb.iloc[0] == 0.0 and frame.network_gb.iloc[1] > 0
    tiers = figures.tier_hits_frame(replayed)
    for name, s in replayed.items():
        got = tiers[tiers.scenario == name].set_index("tier").hit_rate.to_dict()
        assert got == {t: r for t, r in s.to_json()["hit_rate_by_tier"].items() if r}


SCENARIO_ROWS = pd.DataFrame(
    [
        {
            "scenario": "local",
            "label": figures.scenario_label("local"),
            "hit_rate": 0.5,
            "ttft_mean_s": 0.2,
            "ttft_p50_s": 0.1,
            "ttft_p90_s": 0.4,
            "ttft_p99_s": 1.5,
            "prefill_gpu_s": 12.0,
            "network_gb": 0.0,
            "peak_link_use": None,
            "max_rate_scale": 16.0,
            "max_rate_capped": False,
            "description": "",
        },
        {
            "scenario": "pooled",
            "label": figures.scenario_label("pooled"),
            "hit_rate": 0.6,
            "ttft_mean_s": 0.15,
            "ttft_p50_s": 0.08,
            "ttft_p90_s": 0.3,
            "ttft_p99_s": 1.0,
            "prefill_gpu_s": 10.0,
            "network_gb": 3.0,
            "peak_link_use": 0.25,
            "max_rate_scale": 32.0,
            "max_rate_capped": True,
            "description": "",
        },
    ]
)


def test_scenarios_table_says_units() -> None:
    table = figures.scenarios_table(SCENARIO_ROWS)
    row = table.iloc[1].to_dict()
    assert row["option"] == "pooled KV store"
    assert row["prompt tokens from cache"] == "60.0%"
    assert row["TTFT p90"] == "300 ms"
    assert row["TTFT p99"] == "1,000 ms"  # the report's unit, whatever the size
    assert row["highest rate under the SLO"] == ">= x32"
    assert row["busiest link, peak"] == "25%"
    assert table.iloc[0]["busiest link, peak"] == "-"
    assert not any("_" in c for c in table.columns)  # words, not key names


def test_scenario_charts_have_marks(replayed) -> None:
    from app import charts

    frame = figures.scenarios_frame(replayed)
    spec = charts.scenario_bar_chart(
        frame, "max_rate_scale", "capacity", "x", ".3g", ["local", "pooled"]
    ).to_dict()
    values = next(iter(spec["datasets"].values()))
    # The capacity chart draws this column: numbers, not "x16" strings (an empty chart).
    assert [v["max_rate_scale"] for v in values] == [
        s.max_rate_scale_at_slo for s in replayed.values()
    ]
    assert all(isinstance(v["max_rate_scale"], float) for v in values)
    hits = charts.tier_hits_chart(figures.tier_hits_frame(replayed), ["local", "pooled"])
    legend = hits.to_dict()["encoding"]["color"]
    assert legend["scale"]["domain"] == ["GPU HBM", "pool (network)"]
