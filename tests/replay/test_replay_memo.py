"""ReplayMemo: a remembered scenario gives exactly what a fresh replay gives, for every
setting its key leaves out (the oracle is ``run_replay`` itself)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from analyzer.replay import STANDARD_SCENARIOS, ClusterConfig, run_replay
from analyzer.replay.memo import NotRemembered, ReplayMemo, scenario_key, unread_fields
from tests.helpers.replay import build_trace, chained_requests

# A value other than the default for every setting some scenario does not read.
CHANGED = {
    "pool_capacity_tokens": 20_000,
    "pool_tier": "tcp",
    "pool_gbps": 3.0,
    "pool_aggregate_gbps": 40.0,
    "pool_latency_s": 2e-3,
    "dram_capacity_tokens": 30_000,
    "dram_scope": "node",
    "dram_capacity_gb": 8.0,
    "dram_tier": "pcie-gen4-dram",
    "dram_gbps": 4.0,
    "dram_latency_s": 5e-4,
    "nvme_capacity_tokens": 50_000,
    "nvme_capacity_gb": 100.0,
    "nvme_tier": "nvme-gen5",
    "nvme_gbps": 1.5,
    "nvme_latency_s": 1e-3,
}


@pytest.fixture(scope="module")
def trace():
    rng = random.Random(7)
    spec = [(rng.randrange(60), rng.randrange(0, 40), rng.randrange(1, 30)) for _ in range(160)]
    blocks = chained_requests(spec)
    arrivals = [0.05 * i for i in range(len(blocks))]
    return build_trace(blocks, block_size=16, arrivals=arrivals)


BASE = ClusterConfig(
    model="llama-3.1-8b",
    gpu="h100",
    instances=4,
    gpus_per_node=2,
    local_capacity_tokens=4_000,
    dram_capacity_tokens=12_000,
)
# Re-pricing a remembered replay's links is the prefill pool's: an aggregated replay's
# admissions and preemptions move with its timing, so it is replayed anew.
PREFILL_POOL = replace(BASE, serving="disaggregated")


def test_every_changed_value_differs_from_the_default() -> None:
    for name, value in CHANGED.items():
        assert getattr(BASE, name) != value, name
    assert set(CHANGED) >= set().union(*(unread_fields(s) for s in STANDARD_SCENARIOS.values()))


@pytest.mark.parametrize("name", list(STANDARD_SCENARIOS))
def test_remembered_scenario_equals_a_fresh_replay(trace, name: str) -> None:
    spec = STANDARD_SCENARIOS[name]
    memo = ReplayMemo()
    first = memo.run(trace, BASE, [name], search_rate=False, trace_key="t").to_json()
    assert memo.runs == 1
    tiers = first["scenarios"][name]["hit_rate_by_tier"]
    assert all(tiers[t] > 0 for t in ("dram", "pool") if t in first["scenarios"][name]["tiers"])
    for field in sorted(unread_fields(spec)):
        other = replace(BASE, **{field: CHANGED[field]})
        assert scenario_key(other, spec) == scenario_key(BASE, spec)
        got = memo.run(trace, other, [name], search_rate=False, trace_key="t").to_json()
        fresh = run_replay(trace, other, scenarios=[name], search_rate=False).to_json()
        assert got == fresh, f"{name} after changing {field}"
    assert memo.runs == 1  # none of those changes re-ran the scenario


def test_a_setting_the_scenario_reads_reruns_it(trace) -> None:
    memo = ReplayMemo()
    first = memo.run(trace, BASE, ["pooled", "local"], search_rate=False, trace_key="t")
    assert memo.runs == 2
    pooled = first.to_json()["scenarios"]["pooled"]
    assert pooled["hit_rate_by_tier"]["pool"] > 0  # the pool is used, so its link matters
    faster = replace(BASE, pool_gbps=3.0)
    got = memo.run(trace, faster, ["pooled", "local"], search_rate=False, trace_key="t")
    assert memo.runs == 3  # only the pool re-ran
    fresh = run_replay(trace, faster, scenarios=["pooled", "local"], search_rate=False)
    assert got.to_json() == fresh.to_json()
    assert got.to_json()["scenarios"]["pooled"]["ttft_s"] != pooled["ttft_s"]
    memo.run(trace, BASE, ["local"], search_rate=False, trace_key="other trace")
    assert memo.runs == 4  # another trace is another key


def test_rate_search_is_keyed_by_the_slo(trace) -> None:
    memo = ReplayMemo()
    a = memo.run(trace, BASE, ["local"], ttft_slo_s=2.0, trace_key="t")
    memo.run(trace, BASE, ["local"], ttft_slo_s=2.0, trace_key="t")
    assert memo.runs == 1
    b = memo.run(trace, BASE, ["local"], ttft_slo_s=0.05, trace_key="t")
    assert (memo.runs, memo.searched_again) == (1, 1)  # the search alone ran again
    assert b.to_json() == run_replay(trace, BASE, ["local"], ttft_slo_s=0.05).to_json()
    assert a.to_json() != b.to_json()
    plain = memo.run(trace, BASE, ["local"], search_rate=False, trace_key="t")
    assert memo.runs == 1  # the searched replay's first run answers it
    assert plain.to_json() == run_replay(trace, BASE, ["local"], search_rate=False).to_json()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["local", "pooled"])
def test_a_new_slo_rereads_the_searches_points(trace, name: str, monkeypatch) -> None:
    """SLO after SLO, the memo's search (earlier points re-read, the rest simulated)
    equals a fresh replay's; the run at the trace's rate is never repeated, and a step
    the points decide is never simulated again."""
    from analyzer.replay import run as run_mod
    from analyzer.replay.memo import NotRemembered

    sims: list[float] = []
    simulate = run_mod.simulate

    def counted(trace, plan, time_scale, *args, **kw):
        sims.append(time_scale)
        return simulate(trace, plan, time_scale, *args, **kw)

    memo = ReplayMemo()
    first = memo.run(trace, BASE, [name], ttft_slo_s=0.2, trace_key="t")
    monkeypatch.setattr(run_mod, "simulate", counted)
    assert first.to_json() == run_replay(trace, BASE, [name], ttft_slo_s=0.2).to_json()
    sims.clear()
    again = memo.run(trace, BASE, [name], ttft_slo_s=0.2, trace_key="t")
    assert again.to_json() == first.to_json() and sims == []
    seen: list[int] = []
    for slo in (0.05, 1.0, 0.12, 0.02, 3.0, 0.2, 0.3):
        sims.clear()
        fresh = run_replay(trace, BASE, [name], ttft_slo_s=slo).to_json()
        fresh_runs = len(sims)
        sims.clear()
        try:
            quick = memo.run(trace, BASE, [name], ttft_slo_s=slo, trace_key="t", only_known=True)
        except NotRemembered:
            quick = None
        assert sims == []  # only_known never simulates
        if quick is not None:
            assert quick.to_json() == fresh, slo
        got = memo.run(trace, BASE, [name], ttft_slo_s=slo, trace_key="t")
        assert got.to_json() == fresh, slo
        assert len(sims) < fresh_runs  # never the run at the trace's rate
        seen.append(len(sims))
    assert memo.runs == 1
    assert 0 in seen  # some SLO was decided by the points alone


def test_memo_is_bounded(trace) -> None:
    memo = ReplayMemo(max_entries=2)
    for n in (1, 2, 3):
        memo.run(trace, replace(BASE, instances=n), ["local"], search_rate=False, trace_key="t")
    assert len(memo._results) == 2


@pytest.mark.slow
def test_worker_processes_do_not_rerun_the_callers_script(tmp_path) -> None:
    """Replay workers are spawned processes; they must not re-run the caller's main
    script (under the dashboard, a Streamlit page: seconds and a flood of warnings)."""
    import subprocess
    import sys
    from pathlib import Path

    marker = tmp_path / "ran.txt"
    script = tmp_path / "caller.py"
    tests = Path(__file__).resolve().parents[1]
    script.write_text(
        f"""
import sys
sys.path.insert(0, {str(tests.parent)!r})
with open({str(marker)!r}, "a") as f:
    f.write("ran\\n")
if __name__ == "__main__":
    from tests.helpers.replay import build_trace
    from analyzer.replay import ClusterConfig, run_replay
    trace = build_trace([[1, 2, 3], [1, 2, 4], [1, 5]] * 20, block_size=16)
    cfg = ClusterConfig(model="llama-3.1-8b", gpu="h100", instances=2)
    res = run_replay(trace, cfg, ["local", "pooled"], search_rate=False, workers=2)
    assert set(res.scenarios) == {{"local", "pooled"}}
"""
    )
    root = tests.parent
    subprocess.run([sys.executable, str(script)], check=True, cwd=root, timeout=300)
    assert marker.read_text().splitlines() == ["ran"]


@pytest.mark.slow
def test_a_warm_pool_gives_a_fresh_replays_results_and_stays_up(trace) -> None:
    """A server keeps its worker processes across replays (``pool``): the results are
    the in-process replay's, byte for byte, for replay after replay, with the rate
    search and with remembered scenarios mixed in."""
    from analyzer.replay.run import start_workers, worker_pool

    with worker_pool(2, nice=5) as pool:
        start_workers(pool, 2)
        memo = ReplayMemo()
        for n in (2, 3):
            cfg = replace(BASE, instances=n)
            got = memo.run(trace, cfg, STANDARD_SCENARIOS, trace_key="t", pool=pool)
            fresh = run_replay(trace, cfg, STANDARD_SCENARIOS)
            assert got.to_json() == fresh.to_json()
        pooled = replace(BASE, instances=3, pool_gbps=7.0)  # only `pooled` re-runs
        got = memo.run(trace, pooled, STANDARD_SCENARIOS, trace_key="t", pool=pool)
        assert got.to_json() == run_replay(trace, pooled, STANDARD_SCENARIOS).to_json()
        again = run_replay(trace, BASE, ["local"], search_rate=False, pool=pool)
        assert again.to_json() == run_replay(trace, BASE, ["local"], search_rate=False).to_json()


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        {"pool_gbps": 3.0},
        {"pool_gbps": 60.0, "pool_latency_s": 2e-3},
        {"dram_gbps": 4.0},
        {"pool_tier": "tcp"},
    ],
)
def test_a_link_speed_is_repriced_from_a_remembered_replay(trace, change) -> None:
    """``only_known`` with ``repriced``: the scenarios a link speed reaches come back
    re-priced from the remembered replay (nothing simulated, nothing remembered as a
    replay), and where the re-pricing says it is exact they equal a fresh replay."""
    from analyzer.replay.memo import Repriced

    memo = ReplayMemo(record=True)
    memo.run(trace, PREFILL_POOL, trace_key="t", ttft_slo_s=0.5)
    runs = memo.runs
    cfg = replace(PREFILL_POOL, **change)
    notes: list[Repriced] = []
    got = memo.run(trace, cfg, trace_key="t", ttft_slo_s=0.5, only_known=True, repriced=notes)
    assert memo.runs == runs and notes and memo.repriced == len(notes)
    moved = {t for n in notes for t, a, b in n.link_gbps if a != b}
    assert moved <= {"pool", "dram"} and (moved or "pool_tier" in change)
    fresh = run_replay(trace, cfg, ttft_slo_s=0.5)
    for note in notes:
        name = note.scenario
        if note.exact:
            assert got.scenarios[name].to_json() == fresh.scenarios[name].to_json()
        else:
            assert note.reordered + note.rerouted > 0
    # Not remembered as replays: asked without re-pricing, the memo still has to replay.
    with pytest.raises(NotRemembered):
        memo.run(trace, cfg, trace_key="t", ttft_slo_s=0.5, only_known=True)


def test_an_aggregated_replay_is_replayed_not_repriced(trace) -> None:
    memo = ReplayMemo(record=True)
    memo.run(trace, BASE, trace_key="t", ttft_slo_s=0.5)
    notes: list = []
    with pytest.raises(NotRemembered):
        memo.run(
            trace,
            replace(BASE, pool_gbps=3.0),
            trace_key="t",
            ttft_slo_s=0.5,
            only_known=True,
            repriced=notes,
        )
    assert notes == [] and memo.repriced == 0


def test_settings_other_than_link_speeds_are_not_repriced(trace) -> None:
    memo = ReplayMemo(record=True)
    memo.run(trace, BASE, trace_key="t", search_rate=False)
    for change in ({"instances": 3}, {"pool_capacity_tokens": 20_000}):
        with pytest.raises(NotRemembered):
            memo.run(
                trace,
                replace(BASE, **change),
                trace_key="t",
                search_rate=False,
                only_known=True,
                repriced=[],
            )


@pytest.mark.slow
def test_only_the_most_recent_results_keep_their_recordings(trace, monkeypatch) -> None:
    """Recordings are kept on the newest results up to a budget of recorded requests."""
    from analyzer.replay import memo as memo_mod

    per_result = 0
    memo = ReplayMemo(record=True)
    for n in range(6):
        memo.run(
            trace,
            replace(PREFILL_POOL, pool_gbps=1.0 + n),
            scenarios=["pooled"],
            trace_key="t",
            ttft_slo_s=0.5,
        )
        if n == 0:
            got, points = next(iter(memo._searched.values()))
            per_result = sum(
                len(r.picks) for r in {id(r): r for r in memo_mod._recordings(got, points)}.values()
            )
            monkeypatch.setattr(memo_mod, "RECORDED_REQUESTS", 3 * per_result)
    kept = [got.stats.recording is not None for got, _ in memo._searched.values()]
    assert per_result > 0 and kept == [False] * 3 + [True] * 3
    for _, points in list(memo._searched.values())[:3]:
        assert all(p.recording is None for p in points)
    results = list(memo._results.values())
    assert sum(r.stats.recording is not None for r in results) == 2 * 3
    for r in results:
        if r.stats.recording is None and r.search is not None:
            assert all(p.recording is None for p in r.search.points)
