"""`kvpool analyze` of the Mooncake conversation trace with every option planned by
replaying at size, side by side with the code before the plans (one rate search per
scenario, its GPUs extrapolated), whole process as a user runs it.

    .venv/bin/python bench/analyze.py [--baseline REF] [--jobs 2] [--repeat 1] [--dir DIR]

Both sides run ``kvpool analyze conversation_trace.jsonl --instances 8 --gpus-per-node
1 --jobs J`` (every option, the default router and SLO, the sensitivity table and the
other GPUs and models included), one after the other, each in a fresh process. The
baseline is ``--baseline REF`` extracted with ``git archive`` (default: the commit
before ``analyzer/advisor/plan.py`` entered the history, the last code extrapolating
GPUs from a rate search), run with the same interpreter (``PYTHONPATH`` pointing at it).

Prints per side wall time, CPU seconds of the process tree and its peak RSS
(bench/measure.py), the plan's replays (counts searched per option), and the ratio of
the wall times. The baseline replayed a prefill pool (``--serving disaggregated``, the
default then); this tree runs with its default (the aggregated engine) and once more
with ``--serving disaggregated``, whose ratio is the search's own cost apart from the
engine's. The sides run interleaved, ``--repeat`` rounds, the fastest of each kept. Target (issue 34): this tree at most 1.5x the baseline's wall time on
2 cores. On a shared machine wall time includes waiting for the CPU (the CPU seconds do
not): take the figure on a quiet machine, and say which.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import mib, run, user_env

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
FLAGS = ["--instances", "8", "--gpus-per-node", "1"]


def before_the_plans() -> str:
    """The commit before analyzer/advisor/plan.py was added (the baseline by default)."""
    out = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "log",
            "--diff-filter=A",
            "--format=%H",
            "--",
            "analyzer/advisor/plan.py",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not out:
        sys.exit("analyzer/advisor/plan.py is not in this tree's history: pass --baseline REF")
    return out[-1] + "^"


def side_env(src: Path) -> dict[str, str]:
    env = user_env()
    env["PYTHONPATH"] = str(src)
    return env


def analyze(
    src: Path, log: Path, out: Path, jobs: int, extra: tuple[str, ...] = ()
) -> dict[str, object]:
    argv = [PY, "-m", "analyzer.cli", "analyze", str(log), "-o", str(out), "--force"]
    r = run([*argv, *FLAGS, "--jobs", str(jobs), *extra], env=side_env(src), cwd="/")
    if r.returncode:
        sys.exit(f"analyze failed ({src}): {r.stderr[-2000:]}")
    doc = json.loads((out / "report.json").read_text())
    plans = {
        p["option"]: [t["instances"] for t in p["search"]["tried"]] for p in doc.get("plans", ())
    }
    return {
        "wall_s": r.wall_s,
        "cpu_s": r.cpu_s,
        "rss": r.peak_rss_bytes,
        "verdict": doc["verdict"]["verdict"],
        "plans": plans,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=None, help="git commit to compare with")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs per side (the fastest is kept)")
    ap.add_argument("--log", default=str(MOONCAKE))
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    log = Path(args.log).resolve()
    if not log.is_file():
        sys.exit(f"no trace at {log}")
    ref = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", args.baseline or before_the_plans()],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(args.dir or tmp)
        d.mkdir(parents=True, exist_ok=True)
        base = d / "baseline"
        base.mkdir(exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        # The baseline replayed the prefill pool (--serving disaggregated was the default
        # until the aggregated engine became it, with issue 35's own speed budget): this
        # tree is run both ways, so the search's cost and the engine's are told apart.
        sides: dict[str, tuple[Path, tuple[str, ...]]] = {
            f"baseline {ref[:9]}": (base, ()),
            "this tree": (ROOT, ()),
            "this tree, disagg": (ROOT, ("--serving", "disaggregated")),
        }
        print(f"kvpool analyze {log.name} {' '.join(FLAGS)} --jobs {args.jobs}, whole process:")
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in sides}
        for k in range(args.repeat):  # the sides interleaved: a busy spell hits them alike
            for name, (src, extra) in sides.items():
                out = d / f"rep-{k}-{name.replace(' ', '_').replace(',', '')}"
                runs[name].append(analyze(src, log, out, args.jobs, extra))
        got: dict[str, dict[str, object]] = {}
        for name, rs in runs.items():
            best = min(rs, key=lambda r: float(r["wall_s"]))  # type: ignore[arg-type]
            got[name] = best
            print(
                f"  {name:18s} wall {best['wall_s']:7.1f} s  CPU {best['cpu_s']:7.1f} s  "
                f"peak RSS {mib(int(best['rss']))}  verdict {best['verdict']}"  # type: ignore[call-overload]
            )
            for option, tried in dict(best["plans"]).items():  # type: ignore[call-overload]
                print(f"    {option:16s} counts replayed {tried}")
        a, b, c = (float(g["wall_s"]) for g in got.values())  # type: ignore[arg-type]
        print(f"  this tree / baseline wall time: {b / a:.2f}x (target at most 1.5x on 2 cores)")
        print(
            f"  this tree with the baseline's engine (--serving disaggregated) / baseline: "
            f"{c / a:.2f}x (the search's own cost)"
        )


if __name__ == "__main__":
    main()
