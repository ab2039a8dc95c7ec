"""Replay speed: the four standard scenarios on the Mooncake conversation trace with 8
instances (SLO search included), prefill-only and aggregated side by side, and a
generated trace of 1M requests per scenario.

    .venv/bin/python bench/replay.py [--requests 1000000] [--skip-mooncake] [--skip-large]
                                     [--scenarios none,local,local+dram,pooled] [--workers 1]
                                     [--large-serving disaggregated] [--mooncake-limit N]

Prints wall time, events/s and peak memory (max RSS of the process, so the figure for
a later case includes the earlier ones). Targets: the Mooncake case under 30 s
including the SLO search, 1M requests under 10 min per scenario (issue 6); the
aggregated engine's Mooncake case in at most 2x the wall time of the prefill-only replay
measured beside it, and at least 1,000 requests/s per scenario for a single replay
(issue 35). The ``none`` scenario (no cache lookups) measures each event loop alone.
``--mooncake-limit N`` replays the trace's first N requests only (a smaller case for a
busy machine: its ratios are comparable, its times are not the whole trace's);
``--large-serving`` picks the engine of the generated case (the 1M-request target is the
prefill pool's). Each figure is printed in wall time and in this process's CPU time: on a
shared machine wall time also counts other jobs, CPU time does not.

Issue 35 compares the aggregated replay with *today's* prefill-only replay, the one before
the aggregated engine: that code (``--baseline REF``, default the commit before
``--serving aggregated`` entered the history, extracted with ``git archive``) replays
the same search in a process of its own, and the ratio against it is the target's.
The ratio against this tree's ``--serving disaggregated`` is printed beside it: the
engines share the block caches, so a faster cache moves both sides of that one.
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.replay import ClusterConfig, run_replay  # noqa: E402
from analyzer.replay.config import select_scenarios  # noqa: E402
from analyzer.replay.engine import simulate  # noqa: E402
from analyzer.replay.run import resolve  # noqa: E402
from analyzer.trace import BlockTrace  # noqa: E402

MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


def cpu_s() -> float:
    """User + system CPU seconds of this process and its finished children (wall time
    on a shared box also counts waiting for other jobs)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generated_trace(n: int, seed: int = 7) -> BlockTrace:
    """A chat-like trace built directly as arrays: sessions of growing prompts sharing
    one of a few system prompts, Poisson arrivals at 50 req/s, 512-token blocks."""
    rng = np.random.default_rng(seed)
    block = 512
    n_sys = 20
    sys_blocks = rng.integers(1, 5, n_sys)
    # each request continues a session (turn > 0) or starts one
    session = np.empty(n, dtype=np.int32)
    new_session = rng.random(n) < 0.3
    new_session[0] = True
    session_ids = np.cumsum(new_session) - 1
    # continuing requests pick a recent session
    recent = np.maximum(session_ids - rng.integers(0, 50, n), 0)
    session[:] = np.where(new_session, session_ids, recent)
    n_sessions = int(session_ids[-1]) + 1
    sess_sys = rng.integers(0, n_sys, n_sessions)
    grow = rng.integers(1, 4, n)  # blocks added per turn
    counts = np.zeros(n, dtype=np.int64)
    length = np.zeros(n_sessions, dtype=np.int64)
    for i in range(n):  # session lengths grow turn by turn (cheap: one int per request)
        s = session[i]
        if length[s] == 0:
            length[s] = sys_blocks[sess_sys[s]]
        length[s] = min(length[s] + grow[i], 64)
        counts[i] = length[s]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    # block id at position k of session s: system-prompt blocks are shared by all
    # sessions using that prompt; the rest belong to the session (chained by position)
    req = np.repeat(np.arange(n), counts)
    pos = np.arange(offsets[-1]) - offsets[req]
    s = session[req]
    sp = sess_sys[s]
    shared = pos < sys_blocks[sp]
    sys_base = np.concatenate([[0], np.cumsum(sys_blocks)])
    raw = np.where(shared, sys_base[sp] + pos, sys_base[-1] + s.astype(np.int64) * 64 + pos)
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    block_ids = rank[inverse].astype(np.int64)
    prompts = counts * block + rng.integers(1, block, n)
    arrivals = np.cumsum(rng.exponential(1 / 50, n))
    arrivals -= arrivals[0]
    return BlockTrace(
        block_size=block,
        arrival_s=arrivals,
        prompt_tokens=prompts.astype(np.int64),
        output_tokens=np.full(n, 200, dtype=np.int64),
        session=session,
        tenant=np.full(n, -1, dtype=np.int32),
        offsets=offsets,
        block_ids=block_ids,
        block_hashes=np.arange(order.size, dtype=np.uint64),
        request_ids=[],
        session_names=[f"s{k}" for k in range(n_sessions)],
        tenant_names=[],
    )


# The prefill-only replay issue 35 calls today's: the code before the aggregated engine.
TODAYS_PREFILL_ONLY = "2b2ef9c^"

# Run with the baseline tree first on sys.path: the same search as bench_mooncake's
# prefill-only side, through the API that tree has. argv: trace, scenarios, workers,
# limit (0: all).
_BASELINE_SEARCH = """
import itertools, resource, sys, tempfile, time
from pathlib import Path
from analyzer.ingest import IngestOptions, open_trace
from analyzer.replay import ClusterConfig, run_replay
from analyzer.replay.config import select_scenarios
from analyzer.replay.engine import simulate
from analyzer.replay.run import resolve
path, scenarios, workers, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if limit:
    tmp = tempfile.mkdtemp()
    head = Path(tmp) / "head.jsonl"
    with path.open() as src, head.open("w") as dst:
        dst.writelines(itertools.islice(src, limit))
    path = head
trace = open_trace([path], IngestOptions()).trace
cfg = ClusterConfig(model="llama-3.1-8b", gpu="h100", tp=1, instances=8, warmup_fraction=0.0)
simulate(trace, resolve(cfg, select_scenarios("none")[0], trace.block_size).plan, 1.0)
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
t0, c0 = time.perf_counter(), cpu()
run_replay(trace, cfg, scenarios=scenarios, ttft_slo_s=2.0, search_rate=True, workers=workers)
print(time.perf_counter() - t0, cpu() - c0)
"""


def baseline_search(
    ref: str, scenarios: str, workers: int, limit: int | None
) -> tuple[float, float] | None:
    """Wall and CPU seconds of the prefill-only search with the code at ``ref``."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=False
        )
        if archive.returncode:
            print(f"  baseline {ref}: {archive.stderr.decode().strip()}")
            return None
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _BASELINE_SEARCH,
                str(MOONCAKE),
                scenarios,
                str(workers),
                str(limit or 0),
            ],
            env={**os.environ, "PYTHONPATH": tmp},
            cwd=tmp,  # `-c` puts the working directory first on sys.path
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            print(f"  baseline {ref}: {done.stderr.strip().splitlines()[-1:]}")
            return None
        wall, cpu = (float(x) for x in done.stdout.split()[-2:])
        return wall, cpu


def bench_mooncake(
    scenarios: str, workers: int, limit: int | None = None, baseline: str = TODAYS_PREFILL_ONLY
) -> None:
    """The Mooncake conversation trace on 8 instances, every scenario with its rate
    search: today's prefill-pool replay (``--serving disaggregated``) and the aggregated
    engine side by side in one process, with the issue-35 targets: the aggregated replay
    in at most 2x the wall time of the prefill-only one, and at least 1,000 requests/s per
    scenario for a single replay."""
    from analyzer.ingest import IngestOptions, open_trace

    if not MOONCAKE.is_file():
        print(f"mooncake: {MOONCAKE} not found, skipped")
        return
    t0 = time.perf_counter()
    if limit is None:
        trace = open_trace([MOONCAKE], IngestOptions()).trace
    else:  # the first ``limit`` lines, as a log of their own
        with tempfile.TemporaryDirectory() as tmp:
            head = Path(tmp) / "head.jsonl"
            with MOONCAKE.open() as src, head.open("w") as dst:
                dst.writelines(itertools.islice(src, limit))
            trace = open_trace([head], IngestOptions()).trace
    t_load = time.perf_counter() - t0
    print(
        f"mooncake conversation: {trace.n_requests:,} requests, {trace.n_accesses:,} block "
        f"accesses, block {trace.block_size}; llama-3.1-8b on 8 x h100, read in {t_load:.1f} s"
    )
    walls: dict[str, float] = {}
    cpus: dict[str, float] = {}
    for serving in ("disaggregated", "aggregated"):
        cfg = ClusterConfig(
            model="llama-3.1-8b",
            gpu="h100",
            tp=1,
            instances=8,
            warmup_fraction=0.0,
            serving=serving,
        )
        # compiled kernels and the step model's fit are paid once per process, first
        simulate(trace, resolve(cfg, select_scenarios("none")[0], trace.block_size).plan, 1.0)
        t0 = time.perf_counter()
        c0 = cpu_s()
        res = run_replay(
            trace, cfg, scenarios=scenarios, ttft_slo_s=2.0, search_rate=True, workers=workers
        )
        wall = walls[serving] = time.perf_counter() - t0
        cpu = cpus[serving] = cpu_s() - c0
        doc = res.to_json()
        runs = sum(1 + s.search.runs for s in res.scenarios.values() if s.search)
        print(
            f"  --serving {serving}: all scenarios with SLO search, {workers} process(es): "
            f"{wall:.1f} s ({runs} simulations), CPU time {cpu:.1f} s"
        )
        for name, s in doc["scenarios"].items():
            t = s["ttft_s"]
            print(
                f"    {name:11s} hit {s['hit_rate']:.3f}  p90 TTFT {t['p90']:.2f} s  "
                f"prefill {s['prefill_gpu_s']:,.0f} GPU-s  net {s['network_bytes'] / 1e9:,.0f} GB"
                f"  max rate {s['max_rate_scale_at_slo']:.3f}x"
            )
        for spec in select_scenarios(scenarios):
            r = resolve(cfg, spec, trace.block_size)
            t0 = time.perf_counter()
            c0 = time.process_time()
            st = simulate(trace, r.plan, 1.0)
            dt = time.perf_counter() - t0
            dc = time.process_time() - c0
            print(
                f"    {spec.name:11s} one run {dt:.2f} s, {trace.n_requests / dt:,.0f} requests/s "
                f"(target >= 1,000), {st.events / dt:,.0f} events/s; CPU {dc:.2f} s, "
                f"{trace.n_requests / dc:,.0f} requests/s of CPU"
            )
    base = baseline_search(baseline, scenarios, workers, limit) if baseline else None
    if base is not None:
        print(
            f"  today's prefill-only replay ({baseline}), same search: {base[0]:.1f} s, "
            f"CPU time {base[1]:.1f} s"
        )
        ratio = walls["aggregated"] / base[0]
        print(f"  aggregated / today's prefill-only wall time: {ratio:.2f}x (target <= 2x)")
        ratio = cpus["aggregated"] / base[1]
        print(f"  aggregated / today's prefill-only CPU time: {ratio:.2f}x (less other jobs' load)")
    ratio = walls["aggregated"] / walls["disaggregated"]
    print(f"  aggregated / this tree's prefill-only wall time: {ratio:.2f}x")
    ratio = cpus["aggregated"] / cpus["disaggregated"]
    print(f"  aggregated / this tree's prefill-only CPU time: {ratio:.2f}x")
    print(f"  load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  peak memory {peak_rss_mib():,.0f} MiB")


def bench_large(n: int, scenarios: str, serving: str) -> None:
    t0 = time.perf_counter()
    trace = generated_trace(n)
    print(
        f"generated: {n:,} requests, {trace.n_accesses:,} block accesses, "
        f"{trace.n_blocks:,} distinct blocks, built in {time.perf_counter() - t0:.1f} s"
    )
    cfg = ClusterConfig(
        model="llama-3.1-8b",
        gpu="h100",
        tp=1,
        instances=64,
        warmup_fraction=0.0,
        serving=serving,
    )
    print(f"  --serving {serving}")
    for spec in select_scenarios(scenarios):
        r = resolve(cfg, spec, trace.block_size)
        t0 = time.perf_counter()
        st = simulate(trace, r.plan, 1.0)
        dt = time.perf_counter() - t0
        hit = sum(st.hit_tokens_by_tier) / st.prompt_tokens
        print(
            f"  {spec.name:11s} {dt:7.1f} s  {st.events / dt:>9,.0f} events/s  "
            f"{n / dt:>8,.0f} req/s  hit {hit:.3f}  p90 TTFT {np.percentile(st.ttft_s, 90):.2f} s  "
            f"peak memory {peak_rss_mib():,.0f} MiB  (target < 600 s)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--scenarios", default="none,local,local+dram,pooled")
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--workers", type=int, default=1, help="processes for the Mooncake case")
    ap.add_argument(
        "--large-serving",
        choices=("disaggregated", "aggregated"),
        default="disaggregated",
        help="engine of the generated case",
    )
    ap.add_argument(
        "--mooncake-limit", type=int, default=None, help="replay only the first N requests"
    )
    ap.add_argument(
        "--baseline",
        default=TODAYS_PREFILL_ONLY,
        help="git commit of today's prefill-only replay ('': none)",
    )
    args = ap.parse_args()
    if not args.skip_mooncake:
        bench_mooncake(args.scenarios, args.workers, args.mooncake_limit, args.baseline)
    if not args.skip_large:
        bench_large(args.requests, args.scenarios, args.large_serving)


if __name__ == "__main__":
    main()
