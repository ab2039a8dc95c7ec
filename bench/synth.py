"""Throughput of `kvpool synth`: MB/s and requests/s per profile and format, on one core.

    .venv/bin/python bench/synth.py                 # ~200 MB of mixed JSONL, plus the others
    .venv/bin/python bench/synth.py --mb 50 --quick

Prints, per run, uncompressed MB written per second and requests per second, with the
ratio to the 20 MB/s target (a 1 GB log in under a minute). The figure that counts is the
plain-JSONL one; the .gz run shows what gzip (level 6, single-threaded) costs on top.
Mooncake lines are short (no text), so their MB/s is low by nature: read req/s there.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyzer.synth import SynthConfig, generate

TARGET_MBPS = 20.0
# Rough uncompressed bytes per request, to size each run (measured once, only for sizing).
BYTES_PER_REQUEST = {"chat": 6500, "agent": 32000, "rag": 14000, "api": 8500, "mixed": 9000}


def run(profile: str, mb: float, fmt: str, suffix: str, out_dir: Path) -> None:
    n = max(100, int(mb * 1e6 / BYTES_PER_REQUEST[profile]))
    path = out_dir / f"{profile}{suffix}"
    t, c = time.perf_counter(), time.process_time()
    stats = generate(SynthConfig(profile=profile, requests=n, seed=1), path, fmt=fmt)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    mb = stats.bytes_written / 1e6
    # CPU-time rate too: on a shared machine the wall-clock one measures the neighbours.
    print(
        f"{profile:6s} {fmt:12s} {suffix:9s} {stats.requests:>8,} req {mb:>7.1f} MB "
        f"wall {dt:>6.2f} s {mb / dt:>6.1f} MB/s {stats.requests / dt:>7,.0f} req/s "
        f"x{mb / dt / TARGET_MBPS:.2f} | cpu {dc:>6.2f} s {mb / dc:>6.1f} MB/s "
        f"x{mb / dc / TARGET_MBPS:.2f} of target",
        flush=True,
    )
    path.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the main (mixed) run")
    ap.add_argument("--quick", action="store_true", help="main run only")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    print(f"target {TARGET_MBPS:.0f} MB/s uncompressed on one core")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        run("mixed", args.mb, "openai", ".jsonl", out)
        if args.quick:
            return
        small = max(20.0, args.mb / 10)
        for profile in ("chat", "agent", "rag", "api"):
            run(profile, small, "openai", ".jsonl", out)
        run("mixed", small, "openai", ".jsonl.gz", out)
        run("mixed", small, "gateway-csv", ".csv", out)
        run("mixed", small, "mooncake", ".jsonl", out)


if __name__ == "__main__":
    main()
