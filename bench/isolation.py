"""Keying a trace by tenant: re-keying the built trace against reading the log again.

    .venv/bin/python bench/isolation.py [--requests 20000] [--seed 1] [--log FILE]
        [--analyze 2000 [--baseline REF]]

`--isolation tenant` re-keys the block ids of the trace already read
(analyzer/reuse/isolation.py); the alternative is to read and hash the log again with
the tenant in every block's key (`--hash-key tenant`). Both give the same blocks
(tests/advisor/test_isolation.py). Prints, on a `kvpool synth --profile saas` log (twelve
customer organisations of one product; written once to a temporary folder unless
`--log`):

* in one process: reading the log (`open_trace`) and building its trace, once without
  and once with the tenant key, against `isolate(trace, "tenant")` on the trace
  already built: the time an analysis adds to measure a second policy each way;
* whole processes as a user runs them: `kvpool reuse LOG --isolation tenant` against
  `kvpool reuse LOG --hash-key tenant` (wall, CPU, peak memory of the tree), with their
  ceilings, which must be equal;
* with `--analyze N`: `kvpool analyze` of a saas log of N requests (the same seed; the
  `--log` given instead, whole), whole process, `--jobs 2`, this tree against the commit
  before the report's isolation section (analyzer/advisor/isolation.py) entered the
  history (`--baseline REF` to choose), extracted with `git archive`; the fastest of
  `--repeat` runs each (a fresh tree compiles its kernels on its first run): what
  planning every option again keyed by tenant and by user adds to an analysis of a log
  that names its tenants and users.

Take the figures on a quiet machine: `nproc` and the load average are printed beside
them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import run  # noqa: E402

KVPOOL = str(Path(sys.executable).with_name("kvpool"))


def _in_process(log: Path, salt: Path) -> None:
    from analyzer.ingest import IngestOptions, open_trace
    from analyzer.reuse.isolation import isolate

    def read(**kw: object) -> tuple[float, object]:
        t0 = time.perf_counter()
        trace = open_trace([str(log)], IngestOptions(salt_file=salt, jobs=1, **kw)).trace
        return time.perf_counter() - t0, trace

    read()  # the tokenizer and the compiled kernels load once, outside the timings
    t_shared, shared = read()
    t_salted, salted = read(hash_keys=("model", "tenant"))
    t0 = time.perf_counter()
    keyed = isolate(shared, "tenant")  # type: ignore[arg-type]
    t_rekey = time.perf_counter() - t0
    same = bool((keyed.block_ids == salted.block_ids).all())  # type: ignore[attr-defined]
    print(f"trace: {shared.n_requests:,} requests, {shared.n_accesses:,} block accesses")  # type: ignore[attr-defined]
    print(f"  read + hash, shared keys:      {t_shared:8.2f} s")
    print(f"  read + hash, tenant in key:    {t_salted:8.2f} s")
    print(f"  re-key the shared trace:       {t_rekey:8.2f} s   same blocks: {same}")
    print(f"  re-keying is {t_salted / t_rekey:,.0f}x faster than reading the log again")


def _whole(log: Path, salt: Path, out: Path) -> None:
    rows = []
    for name, flags in (
        ("--isolation tenant", ["--isolation", "tenant"]),
        ("--hash-key tenant", ["--hash-key", "tenant"]),
    ):
        js = out / f"{name.split()[0].strip('-')}.json"
        r = run(
            [
                KVPOOL,
                "-q",
                "reuse",
                str(log),
                "--salt-file",
                str(salt),
                *flags,
                "--jobs",
                "1",
                "--json",
                str(js),
            ]
        )
        if r.returncode:
            sys.exit(f"kvpool reuse {name} failed: {r.stderr.strip()[-400:]}")
        ceiling = json.loads(js.read_text())["ceiling"]["hit_rate"]
        rows.append((name, r, ceiling))
    print("kvpool reuse (whole process, one job):")
    for name, r, ceiling in rows:
        print(
            f"  {name:<20} wall {r.wall_s:7.2f} s  cpu {r.cpu_s:7.2f} s  "
            f"peak {r.peak_rss_bytes / 2**20:7.0f} MiB  ceiling {ceiling:.4f}"
        )
    print(f"  equal ceilings: {rows[0][2] == rows[1][2]}")


def before_the_section() -> str:
    """The commit before analyzer/advisor/isolation.py was added."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H", "--",
         "analyzer/advisor/isolation.py"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not out:
        sys.exit("analyzer/advisor/isolation.py is not in this tree's history: pass --baseline")
    return out[-1] + "^"


def _analyze(log: Path, salt: Path, out: Path, ref: str, repeat: int) -> None:
    from analyze import side_env

    base = out / "baseline"
    base.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True,
                             check=True)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    print(f"kvpool analyze {log.name}, --jobs 2, whole process:")
    for name, src in ((f"baseline {ref[:9]}", base), ("this tree", ROOT)):
        report = out / f"report-{name.split()[0]}"
        argv = [sys.executable, "-m", "analyzer.cli", "-q", "analyze", str(log), "-o",
                str(report), "--salt-file", str(salt), "--jobs", "2"]  # fmt: skip
        # The first run of a fresh tree also compiles its kernels (a cache per tree): the
        # fastest of `repeat` runs is kept.
        runs = [run([*argv, "--force"], env=side_env(src), cwd="/") for _ in range(repeat)]
        r = min(runs, key=lambda x: x.wall_s)
        if r.returncode:
            sys.exit(f"kvpool analyze failed ({name}): {r.stderr.strip()[-400:]}")
        iso = json.loads((report / "report.json").read_text()).get("isolation") or {}
        planned = ", ".join(iso.get("policies", ())) or "no isolation section"
        print(
            f"  {name:<18} wall {r.wall_s:7.2f} s  cpu {r.cpu_s:7.2f} s  "
            f"peak {r.peak_rss_bytes / 2**20:7.0f} MiB  ({planned})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", type=Path, default=None, help="a log to use instead of synth's")
    ap.add_argument("--analyze", type=int, default=0, help="also time kvpool analyze of N requests")
    ap.add_argument("--baseline", default=None, help="git commit to compare analyze with")
    ap.add_argument("--repeat", type=int, default=2, help="analyze runs per side (fastest kept)")
    args = ap.parse_args()
    print(f"nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-iso-") as tmp:
        out = Path(tmp)
        salt = out / "salt"
        log = args.log
        if log is None:
            log = out / "saas.jsonl.zst"
            from analyzer.synth import SynthConfig, generate

            generate(SynthConfig(profile="saas", requests=args.requests, seed=args.seed), log)
        _in_process(log, salt)
        _whole(log, salt, out)
        if args.analyze:
            small = args.log
            if small is None:
                from analyzer.synth import SynthConfig, generate

                small = out / f"saas-{args.analyze}.jsonl"
                generate(SynthConfig(profile="saas", requests=args.analyze, seed=args.seed), small)
            _analyze(small, salt, out, args.baseline or before_the_section(), args.repeat)


if __name__ == "__main__":
    main()
