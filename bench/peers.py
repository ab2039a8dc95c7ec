"""kvpool beside its peers, on the same inputs in one run: whole-process time and memory.

    .venv/bin/python bench/peers.py [--dir DIR] [--requests 50000] [--long-requests 50000]
        [--repeat 2] [--skip-gateway] [--skip-long] [--skip-mooncake] [--smoke]

``--smoke`` is a quick check that the bench runs (2,000-request logs, one run each);
its figures say nothing about the targets.

The peers are installed from PyPI into the bench's own environment
(``bench/.peers-venv``, made on first use; never dependencies of kvpool):
``llmtrafficlens==0.13.4`` and ``kvcache-simulator==0.1.3``.

* Gateway CSV (``kvpool synth --profile chat --format gateway-csv -n N --seed 1``, kept
  in ``--dir``): ``kvpool reuse LOG`` against ``llmtrafficlens profile LOG`` (which
  counts characters / 4 and does not tokenize: it reads the same CSV and profiles prefix
  reuse). Target: kvpool at most 0.7x its wall time and at most 1 GB peak RSS.
* Long-prompt gateway CSV (``bench/longlog.py -n N --seed 1``, kept in ``--dir``: long
  system prompts, tool definitions and retrieved documents in every request, about 17 KB
  a request, 856 MB at 50,000): the same two commands. Target: kvpool at most 0.6x the
  peer's wall time and at most 1 GB peak RSS.
* Mooncake conversation trace (the public FAST'25 trace beside the project):
  ``kvpool reuse --model llama-3.1-8b --capacity-gib 1,...,64 --policies lru,optimal``
  against ``kvcache-simulator run`` with LRU and optimal at the same seven budgets.
  Target: kvpool at most 0.5x its wall time. Beside it, the start-up floor: the same
  Python importing numpy, pyarrow and numba and loading one cached kernel, no work;
  and kvpool's work alone: the command run a second time in the same process.

Each command runs ``--repeat`` times, interleaved; the fastest wall time of each counts
(other work on a shared machine only ever adds time) and its largest peak RSS, summed
over the process and its workers (bench/measure.py). Prints wall, CPU, peak RSS and
kvpool / peer ratios.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from longlog import VERSION as LONGLOG_VERSION
from longlog import write_log
from measure import Run, mib, run

ROOT = Path(__file__).resolve().parents[1]
KVPOOL = str(Path(sys.executable).with_name("kvpool"))
PEERS = ("llmtrafficlens==0.13.4", "kvcache-simulator==0.1.3")
VENV = Path(__file__).resolve().parent / ".peers-venv"
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
BUDGETS_GIB = "1,2,4,8,16,32,64"
# What any kvpool command that runs a compiled kernel pays before its work: Python,
# numpy, pyarrow, numba, and one kernel loaded from numba's on-disk cache (hashing three
# ids). Printed beside the Mooncake ratio, whose target it bounds from below.
FLOOR = (
    "import numpy, pyarrow, pyarrow.json\n"
    "from analyzer.blocks import id_hashes\n"
    "id_hashes(b'm', numpy.arange(3), b'salt')\n"
)
# kvpool's own work on the trace: the command run twice in one process, the second
# run timed (every module imported and every kernel loaded by the first).
WORK = """
import contextlib, io, sys, time
from analyzer.cli import main

def once():
    sys.argv = ["kvpool", *sys.argv[1:]]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
        except SystemExit as exc:
            if exc.code:
                raise

args = list(sys.argv)
once()
sys.argv = args
t = time.perf_counter()
once()
print(f"{time.perf_counter() - t:.4f}")
"""


def peers_env() -> Path:
    """The bench's own virtual environment with the pinned peers (made once)."""
    bindir = VENV / "bin"
    if not (bindir / "kvcache-simulator").exists() or not (bindir / "llmtrafficlens").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(bindir / "pip"), "install", "-q", *PEERS], check=True)
    return bindir


def best(argv: list[str], repeat: int, cwd: str | None = None) -> Run:
    runs = []
    for _ in range(repeat):
        r = run(argv, cwd=cwd)
        if r.returncode:
            sys.exit(f"{argv[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
        runs.append(r)
    fast = min(runs, key=lambda r: r.wall_s)
    return Run(
        fast.wall_s,
        fast.cpu_s,
        max(r.peak_rss_bytes for r in runs),
        max(r.maxrss_bytes for r in runs),
        0,
        fast.stdout,
        fast.stderr,
    )


def show(name: str, r: Run) -> None:
    print(
        f"  {name:<34} wall {r.wall_s:7.2f} s  CPU {r.cpu_s:7.2f} s  peak RSS {mib(r.peak_rss_bytes)}"
    )


def ratios(ours: Run, peer: Run, target: float) -> None:
    w = ours.wall_s / peer.wall_s
    m = ours.peak_rss_bytes / peer.peak_rss_bytes
    verdict = "meets" if w <= target else "misses"
    print(
        f"  kvpool / peer: {w:.2f}x wall time ({verdict} the {target}x target), {m:.2f}x peak RSS"
    )


def side_by_side(log: Path, what: str, bindir: Path, d: Path, repeat: int, target: float) -> None:
    """``kvpool reuse LOG`` and ``llmtrafficlens profile LOG``, whole process, with the
    ratios against the targets (wall ``target`` times the peer's, peak RSS 1 GB)."""
    print(f"{what}, {log.stat().st_size / 1e6:,.0f} MB:")
    work = tempfile.mkdtemp(dir=d)
    ours = best([KVPOOL, "reuse", str(log)], repeat, cwd=work)
    peer = best(
        [
            str(bindir / "llmtrafficlens"),
            "profile",
            str(log),
            "-o",
            f"{work}/ltl",
            "--salt-file",
            f"{work}/salt",
        ],
        repeat,
    )
    show("kvpool reuse", ours)
    show("llmtrafficlens profile", peer)
    ratios(ours, peer, target)
    gb = ours.peak_rss_bytes / 1e9
    verdict = "meets" if gb <= 1 else "misses"
    print(f"  kvpool peak RSS {gb:.2f} GB ({verdict} the target of at most 1 GB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50_000, help="gateway CSV size")
    ap.add_argument(
        "--long-requests", type=int, default=50_000, help="long-prompt gateway CSV size"
    )
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where the generated CSV is kept")
    ap.add_argument("--skip-gateway", action="store_true")
    ap.add_argument("--skip-long", action="store_true")
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument(
        "--smoke", action="store_true", help="2,000-request logs, one run: does the bench run?"
    )
    ap.add_argument("--mooncake", type=Path, default=MOONCAKE, help="the conversation trace")
    args = ap.parse_args()
    if args.smoke:
        args.requests = args.long_requests = 2000
        args.repeat = 1
    bindir = peers_env()
    tmp = tempfile.TemporaryDirectory()
    d = Path(args.dir) if args.dir else Path(tmp.name)
    d.mkdir(parents=True, exist_ok=True)
    if not args.skip_gateway:
        log = d / f"gateway-{args.requests}.csv"
        if not log.exists():
            part = log.with_suffix(".part")
            r = run(
                [
                    KVPOOL,
                    "synth",
                    "--profile",
                    "chat",
                    "--format",
                    "gateway-csv",
                    "-n",
                    str(args.requests),
                    "--seed",
                    "1",
                    "-o",
                    str(part),
                ]
            )
            if r.returncode:
                sys.exit(f"kvpool synth failed: {r.stderr}")
            part.rename(log)
        what = f"gateway CSV, {args.requests:,} chat requests"
        side_by_side(log, what, bindir, d, args.repeat, 0.7)
    if not args.skip_long:
        log = d / f"long-{args.long_requests}-{LONGLOG_VERSION}.csv"
        if not log.exists():
            write_log(log, args.long_requests, seed=1)
        what = f"long-prompt gateway CSV, {args.long_requests:,} requests"
        side_by_side(log, what, bindir, d, args.repeat, 0.6)
    if not args.skip_mooncake:
        moon = args.mooncake
        if not moon.exists():
            print(f"Mooncake trace not found at {moon}: skipped")
        else:
            print(
                f"Mooncake conversation trace, LRU + optimal at {BUDGETS_GIB} GiB (llama-3.1-8b):"
            )
            argv = [
                "reuse",
                str(moon),
                "--model",
                "llama-3.1-8b",
                "--capacity-gib",
                BUDGETS_GIB,
                "--policies",
                "lru,optimal",
            ]
            ours = best([KVPOOL, *argv], args.repeat)
            peer = best(
                [
                    str(bindir / "kvcache-simulator"),
                    "run",
                    "--trace",
                    str(moon),
                    "--model",
                    "llama-3.1-8b",
                    "--block-size",
                    "512",
                    "--budgets-gib",
                    BUDGETS_GIB,
                    "--policies",
                    "lru,optimal",
                    "--no-progress",
                    "--format",
                    "json",
                    "-o",
                    str(d / "kvcache-simulator.json"),
                ],
                args.repeat,
            )
            floor = best([sys.executable, "-c", FLOOR], args.repeat, cwd=str(ROOT))
            work = min(
                float(
                    best([sys.executable, "-c", WORK, *argv], 1, cwd=str(ROOT)).stdout.split()[-1]
                )
                for _ in range(args.repeat)
            )
            show("kvpool reuse", ours)
            show("kvcache-simulator run", peer)
            ratios(ours, peer, 0.5)
            print(
                f"  start-up floor (Python, numpy, pyarrow, numba, one cached kernel; no work): "
                f"{floor.wall_s:.2f} s = {floor.wall_s / peer.wall_s:.2f}x the peer's run"
            )
            print(
                f"  kvpool's work alone (the command again in the same process): "
                f"{work:.2f} s = {work / peer.wall_s:.2f}x the peer's run"
            )
    tmp.cleanup()


if __name__ == "__main__":
    main()
