"""Replay at scale: the four-scenario replay with the SLO rate search on the bundled
``mixed`` sample, the miniature replay's measured error on a large chat log, and
``kvpool analyze`` of that log, each against a baseline commit in the same run.

    .venv/bin/python bench/replay_scale.py [--baseline REF] [--jobs 2] [--log FILE]
        [--requests 50000] [--long] [--skip-mixed] [--skip-error] [--skip-analyze] [--dir DIR]

``--baseline REF`` (a git commit, default ``main``) is extracted with ``git archive``
and run with the same interpreter (``PYTHONPATH`` pointing at it), so both sides run on
the same machine at the same time of day.

1. mixed: ``run_replay`` of none / local / local+dram / pooled with the rate search,
   ``--jobs`` worker processes, timed in a fresh process per side (trace read first,
   not timed; the replay includes starting the workers). Target: under 8 s on 2 cores.
   Both sides must give the same ``max_rate_scale_at_slo``.
2. error (``--log``, made with ``kvpool synth --profile chat -n N --seed 1`` when not
   given): the same four scenarios at the trace's own rate, full against miniature,
   printing per scenario the hit rate and TTFT p50 / p90 / p99 of each and the largest
   differences, the figures models/replay-miniature.toml keeps (``--error-search``: also
   the highest rate at the SLO of each, a full rate search on the whole log: slow).
3. analyze: ``kvpool analyze LOG --jobs J`` whole process per side (wall, CPU, peak RSS
   of the process tree; bench/measure.py). Targets: under 3 min, under 1.5 GB. With
   ``--long`` the log is the long-prompt gateway CSV of ``--requests`` requests
   (bench/longlog.py, as bench/peers.py measures it; 856 MB at 50,000), kept in
   ``--dir``, whose peak must also stay under 1.5 GB.

The figures are of the machine it runs on: on a shared machine wall time includes
waiting for the CPU (the CPU seconds do not), so say so when recording them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from longlog import VERSION as LONGLOG_VERSION
from longlog import write_log
from measure import mib, run, user_env

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
KVPOOL = str(Path(PY).with_name("kvpool"))
SCENARIOS = ("none", "local", "local+dram", "pooled")

MIXED = """
import json, sys, time
from analyzer.ingest import IngestOptions, open_trace
from analyzer.replay import ClusterConfig, run_replay
trace = open_trace([sys.argv[1]], IngestOptions()).trace
t0 = time.perf_counter(); c0 = time.process_time()
res = run_replay(trace, ClusterConfig(), scenarios=SCENARIOS, ttft_slo_s=2.0, search_rate=True,
                 workers=int(sys.argv[2]))
wall = time.perf_counter() - t0
doc = res.to_json()["scenarios"]
print(json.dumps({"wall_s": wall, "rates": {k: v["max_rate_scale_at_slo"] for k, v in doc.items()},
                  "runs": {k: (v.get("rate_search") or {}).get("runs") for k, v in doc.items()}}))
""".replace("SCENARIOS", repr(SCENARIOS))

ERROR = """
import json, sys
from analyzer.ingest import IngestOptions, open_trace
from analyzer.replay import ClusterConfig, run_replay
trace = open_trace([sys.argv[1]], IngestOptions(jobs=int(sys.argv[2]))).trace
out = {"requests": trace.n_requests, "accesses": trace.n_accesses}
for full in (False, True):
    res = run_replay(trace, ClusterConfig(), scenarios=SCENARIOS,
                     search_rate=sys.argv[3] == "1", workers=int(sys.argv[2]), full_replay=full)
    doc = res.to_json()
    out["full" if full else "mini"] = {
        k: {"hit_rate": v["hit_rate"], "rate": v["max_rate_scale_at_slo"],
            **{q: v["ttft_s"][q] for q in ("p50", "p90", "p99")}}
        for k, v in doc["scenarios"].items()}
    if not full:
        out["miniature"] = doc.get("miniature")
print(json.dumps(out))
""".replace("SCENARIOS", repr(SCENARIOS))


def side_env(src: Path | None) -> dict[str, str]:
    env = user_env()
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return env


def python(code: str, args: list[str], src: Path | None) -> dict:
    r = subprocess.run(
        [PY, "-c", code, *args], capture_output=True, text=True, env=side_env(src), cwd="/"
    )
    if r.returncode:
        sys.exit(f"failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_mixed(sides: dict[str, Path | None], jobs: int) -> None:
    mixed = str(ROOT / "traces" / "mixed.jsonl.zst")
    print(f"mixed sample, 4 scenarios with the SLO rate search, {jobs} worker process(es):")
    got = {}
    for name, src in sides.items():
        got[name] = r = python(MIXED, [mixed, str(jobs)], src)
        print(f"  {name:9s} replay {r['wall_s']:6.1f} s   runs per scenario {r['runs']}")
    if len(got) == 2:
        a, b = got.values()
        print(f"  speed-up {a['wall_s'] / b['wall_s']:.2f}x; target < 8 s on 2 cores")
        print(f"  same max rate at the SLO on both sides: {a['rates'] == b['rates']} {b['rates']}")


def bench_error(log: str, jobs: int, search: bool) -> None:
    r = python(ERROR, [log, str(jobs), "1" if search else "0"], None)
    m = r["miniature"]
    print(f"miniature error: {r['requests']:,} requests, {r['accesses']:,} block accesses")
    if not m:
        print("  below the miniature's size: replayed in full")
        return
    print(
        f"  sampling rate 1/{round(1 / m['sampling_rate'])}: {m['sampled_requests']:,} requests, "
        f"{m['sampled_block_accesses']:,} accesses"
    )
    worst = {"hit_rate_abs_error": 0.0, "ttft_p50_rel_error": 0.0}
    worst |= {"ttft_p90_rel_error": 0.0, "ttft_p99_rel_error": 0.0}
    for k in SCENARIOS:
        f, s = r["full"][k], r["mini"][k]
        line = f"  {k:11s} hit {f['hit_rate']:.4f} / {s['hit_rate']:.4f}"
        worst["hit_rate_abs_error"] = max(
            worst["hit_rate_abs_error"], abs(f["hit_rate"] - s["hit_rate"])
        )
        for q in ("p50", "p90", "p99"):
            rel = abs(s[q] - f[q]) / f[q] if f[q] else 0.0
            key = f"ttft_{q}_rel_error"
            worst[key] = max(worst[key], rel)
            line += f"  {q} {f[q]:.3f} / {s[q]:.3f} s"
        if search:
            line += f"  max rate {f['rate']:.3g} / {s['rate']:.3g}x"
        print(line + "   (full / miniature)")
    print("  largest: " + ", ".join(f"{k} = {v:.4f}" for k, v in worst.items()))


def bench_analyze(sides: dict[str, Path | None], log: str, jobs: int, d: Path) -> None:
    print(f"kvpool analyze {Path(log).name} --jobs {jobs}, whole process:")
    for name, src in sides.items():
        argv = [PY, "-m", "analyzer.cli", "analyze", log, "-o", str(d / f"rep-{name}")]
        r = run([*argv, "--force", "--jobs", str(jobs)], env=side_env(src), cwd="/")
        if r.returncode:
            sys.exit(f"analyze failed: {r.stderr[-2000:]}")
        gb = r.peak_rss_bytes / 1e9
        print(
            f"  {name:9s} wall {r.wall_s:7.1f} s  CPU {r.cpu_s:7.1f} s  "
            f"peak RSS {mib(r.peak_rss_bytes)} = {gb:.2f} GB; targets < 180 s, < 1.5 GB "
            f"({'meets' if r.wall_s < 180 and gb < 1.5 else 'misses'})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="main", help="git commit to compare with ('' none)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--log", default=None)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument(
        "--long", action="store_true", help="the long-prompt gateway CSV (bench/longlog.py)"
    )
    ap.add_argument("--dir", default=None)
    ap.add_argument("--skip-mixed", action="store_true")
    ap.add_argument("--skip-error", action="store_true")
    ap.add_argument("--skip-analyze", action="store_true")
    ap.add_argument(
        "--error-search", action="store_true", help="also compare the rate at the SLO (slow)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(args.dir or tmp)
        d.mkdir(parents=True, exist_ok=True)
        sides: dict[str, Path | None] = {}
        if args.baseline:
            base = d / "baseline"
            base.mkdir(exist_ok=True)
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline], capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            sides[f"baseline {args.baseline}"[:9]] = base
        sides["this tree"] = ROOT
        if not args.skip_mixed:
            bench_mixed(sides, args.jobs)
        log = None if args.log is None else str(Path(args.log).resolve())
        if log is None and args.long and not (args.skip_error and args.skip_analyze):
            log = str(d / f"long-{args.requests}-{LONGLOG_VERSION}.csv")
            if not Path(log).exists():
                write_log(log, args.requests, seed=1)
        if log is None and not (args.skip_error and args.skip_analyze):
            log = str(d / f"chat-{args.requests}.jsonl")
            if not Path(log).exists():
                cmd = [KVPOOL, "synth", "--profile", "chat", "-n", str(args.requests)]
                subprocess.run([*cmd, "--seed", "1", "-o", log], check=True, capture_output=True)
        if not args.skip_error and log:
            bench_error(log, args.jobs, args.error_search)
        if not args.skip_analyze and log:
            bench_analyze(sides, log, args.jobs, d)


if __name__ == "__main__":
    main()
