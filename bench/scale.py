"""``kvpool convert`` and ``kvpool reuse`` on 100k- and 1M-request chat logs, whole process.

    .venv/bin/python bench/scale.py [--sizes 100000,1000000] [--jobs 1,2] [--dir DIR]
                                    [--ray ADDRESS] [--pairs K]

Generates each log with ``kvpool synth --profile chat -n N --seed 1`` (kept in ``--dir``
for the next run), then for each size and each ``--jobs`` value runs, as separate
processes, ``kvpool convert LOG -o T.parquet --jobs J`` and ``kvpool reuse T.parquet``
(the canonical trace: reuse's own work, not a second ingest), and prints wall and CPU
seconds, MB/s and requests/s of log, and peak RSS summed over the process and its
workers (bench/measure.py). Then the ratio of throughput at ``--jobs 2`` to ``--jobs 1``
(target >= 1.7x on convert), convert + reuse time at the largest size (target < 20 min
at 1M on 2 cores) and the ratio of peak RSS at the largest size to the smallest (target
<= 1.5x), of the largest run at each size and command by command, and checks that every
``--jobs`` value wrote the same file.

With ``--ray ADDRESS`` (``local``: a Ray instance the convert process starts and stops,
whose processes are then counted in the peak RSS, but not in the CPU seconds, which
``wait4`` only has for processes the command reaps; a running cluster's are in neither),
each size is also converted with ``kvpool convert --ray ADDRESS`` to a
partitioned dataset, timed the same way, and its rows are compared with the ``--jobs``
output's (all columns but ``token_lcp_prev``, which Ray does not compute).

With ``--pairs K``, the smallest log is then converted K more times at ``--jobs 1`` and
``--jobs 2`` one right after the other (the order swapped from pair to pair), and each
pair's throughput ratio is printed with their median: a machine whose speed drifts
between runs minutes apart (the one these figures come from moved by up to half) moves
both runs of a pair alike.

The figures are of the machine it runs on: on a shared machine wall time includes
waiting for the CPU (the CPU seconds do not), so say so when recording them.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import Run, mib, run

ROOT = Path(__file__).resolve().parents[1]
KVPOOL = str(Path(sys.executable).with_name("kvpool"))


def make_log(d: Path, n: int) -> Path:
    log = d / f"chat-{n}.jsonl"
    if not log.exists():
        tmp = log.with_suffix(".part")
        r = run([KVPOOL, "synth", "--profile", "chat", "-n", str(n), "--seed", "1", "-o", str(tmp)])
        if r.returncode:
            sys.exit(f"kvpool synth failed: {r.stderr}")
        tmp.rename(log)
    return log


def line(what: str, r: Run, mb: float, n: int) -> str:
    return (
        f"  {what:<22} wall {r.wall_s:8.1f} s  CPU {r.cpu_s:8.1f} s  "
        f"{mb / r.wall_s:6.1f} MB/s  {n / r.wall_s:8,.0f} req/s  peak RSS {mib(r.peak_rss_bytes)}"
        f" (largest process {mib(r.maxrss_bytes)})"
    )


def same_rows(a: Path, b: Path) -> bool:
    sys.path.insert(0, str(ROOT))
    from analyzer.trace import read_canonical

    ta, tb = (read_canonical(p).drop_columns(["token_lcp_prev"]) for p in (a, b))
    return ta.equals(tb) and ta.schema.metadata == tb.schema.metadata


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--ray", default=None, help="also convert on this Ray cluster (or local)")
    ap.add_argument("--dir", default=None, help="where logs are kept [a temporary directory]")
    ap.add_argument("--pairs", type=int, default=0, help="--jobs 1 / 2 pairs on the smallest log")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    jobs = [int(x) for x in args.jobs.split(",")]
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory()
        d = Path(tmp.name)
    else:
        d = Path(args.dir)
        d.mkdir(parents=True, exist_ok=True)
    salt = d / "salt"
    peak: dict[int, int] = {}
    by_command: dict[tuple[str, int], int] = {}  # (command, size) -> peak RSS
    total: dict[int, float] = {}
    conv: dict[tuple[int, int], Run] = {}
    for n in sizes:
        log = make_log(d, n)
        mb = log.stat().st_size / 1e6
        print(f"{n:,}-request chat log (kvpool synth --profile chat --seed 1): {mb:,.0f} MB")
        digests = set()
        for j in jobs:
            out = d / f"chat-{n}-j{j}.parquet"
            c = run(
                [
                    KVPOOL,
                    "convert",
                    str(log),
                    "-o",
                    str(out),
                    "--salt-file",
                    str(salt),
                    "--jobs",
                    str(j),
                ]
            )
            if c.returncode:
                sys.exit(f"convert failed: {c.stderr}")
            conv[(n, j)] = c
            print(line(f"convert --jobs {j}", c, mb, n))
            notes = [x.strip() for x in c.stderr.splitlines() if "not computed" in x]
            for x in notes:
                print(f"    {x}")
            digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
            r = run([KVPOOL, "reuse", str(out)])
            if r.returncode:
                sys.exit(f"reuse failed: {r.stderr}")
            print(line("reuse (canonical)", r, mb, n))
            peak[n] = max(peak.get(n, 0), c.peak_rss_bytes, r.peak_rss_bytes)
            by_command[(f"convert --jobs {j}", n)] = c.peak_rss_bytes
            by_command[(f"reuse of the --jobs {j} file", n)] = r.peak_rss_bytes
            total[n] = min(total.get(n, float("inf")), c.wall_s + r.wall_s)
        print(f"  same output at every --jobs: {len(digests) == 1}")
        if args.ray:
            ray_out = d / f"chat-{n}-ray"
            argv = [KVPOOL, "convert", str(log), "-o", str(ray_out), "--salt-file", str(salt)]
            c = run([*argv, "--ray", args.ray])
            if c.returncode:
                sys.exit(f"convert --ray failed: {c.stderr}")
            print(line(f"convert --ray {args.ray}", c, mb, n))
            print(f"    same rows as --jobs (token_lcp_prev aside): {same_rows(ray_out, out)}")
        if 1 in jobs and 2 in jobs:
            a, b = conv[(n, 1)], conv[(n, 2)]
            print(f"  convert --jobs 2 / --jobs 1 throughput: {a.wall_s / b.wall_s:.2f}x (wall)")
    big, small = max(sizes), min(sizes)
    print(f"convert + reuse at {big:,} requests: {total[big] / 60:.1f} min (fastest --jobs)")
    if big != small:
        print(
            f"peak RSS at {big:,} / at {small:,} requests: {peak[big] / peak[small]:.2f}x "
            f"({mib(peak[big])} / {mib(peak[small])})"
        )
        print("  by command (target at most 1.5x each):")
        for command in dict.fromkeys(c for c, _ in by_command):
            a, b = by_command[(command, big)], by_command[(command, small)]
            print(f"    {command:<28} {a / b:.2f}x ({mib(a)} / {mib(b)})")
    if args.pairs > 0:
        pairs(d / f"chat-{small}.jsonl", d / "pair.parquet", salt, small, args.pairs)
    if tmp is not None:
        tmp.cleanup()


def pairs(log: Path, out: Path, salt: Path, n: int, k: int) -> None:
    """``k`` runs of ``convert --jobs 1`` and ``--jobs 2`` back to back, the order swapped
    from pair to pair; each pair's wall-time ratio and their median."""
    print(f"{k} pairs of convert --jobs 1 / --jobs 2 on the {n:,}-request log, back to back:")
    ratios = []
    for i in range(k):
        walls: dict[int, Run] = {}
        for j in (1, 2) if i % 2 == 0 else (2, 1):
            argv = [KVPOOL, "convert", str(log), "-o", str(out), "--salt-file", str(salt)]
            c = run([*argv, "--force", "--jobs", str(j)])
            if c.returncode:
                sys.exit(f"convert failed: {c.stderr}")
            walls[j] = c
        a, b = walls[1], walls[2]
        ratios.append(a.wall_s / b.wall_s)
        print(
            f"  pair {i + 1}: --jobs 1 {a.wall_s:.1f} s (CPU {a.cpu_s:.1f} s), --jobs 2 "
            f"{b.wall_s:.1f} s (CPU {b.cpu_s:.1f} s): {ratios[-1]:.2f}x"
        )
    print(
        f"  median --jobs 2 / --jobs 1 throughput over {k} pairs: {statistics.median(ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
