"""The step model: what measured step times cost, and how fast a replay can ask for one.

    .venv/bin/python bench/step_model.py [--deployments llama-3.1-8b:h100:1,...]
                                         [--calls 200000] [--backend vllm]

Prints, each in a fresh process where it is a start-up figure:

* ``import aiconfigurator_core`` (and its SDK), wall seconds: what the first step model
  of a process pays (``kvpool --help`` never does: the import is lazy);
* per deployment: the wall seconds to build its step model (compile the library's
  engine, sample the fit grid and the held-out grid, fit), the fit's median and worst
  error against the library on both grids, and the source the step model names;
* ``step_seconds`` per call: plain Python on a float64 array, and compiled with
  ``numba.njit`` (the replay's hot loop), nanoseconds per call over ``--calls`` calls.

The installed size of the library is printed too (``du`` of its package folder). Take the
timings on a quiet machine; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT = "llama-3.1-8b:h100:1,llama-3.1-70b:h100:4,qwen3-30b-a3b:h200:1,deepseek-r1:h200:8"


def _fresh(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return out.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployments", default=DEFAULT)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--backend", default="vllm")
    args = ap.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")

    import aiconfigurator_core

    pkg = Path(aiconfigurator_core.__file__).parent
    size = sum(p.stat().st_size for p in pkg.rglob("*") if p.is_file())
    print(f"aiconfigurator-core installed size: {size / 1e6:.1f} MB ({pkg})")
    took = _fresh(
        "import time; t = time.perf_counter(); import aiconfigurator_core, "
        "aiconfigurator_core.sdk.rust_engine_step; print(time.perf_counter() - t)"
    )
    print(f"import aiconfigurator_core (fresh process): {float(took):.3f} s")

    for spec in args.deployments.split(","):
        model, gpu, tp = spec.split(":")
        code = (
            "import time; t = time.perf_counter()\n"
            "from analyzer.cost import CostModel\n"
            "from analyzer.cost.aic import measured_step\n"
            f"cm = CostModel.from_catalog({model!r}, {gpu!r}, tp={int(tp)})\n"
            f"m = measured_step(cm, {args.backend!r})\n"
            "dt = time.perf_counter() - t\n"
            "if isinstance(m, str): print(f'{dt:.2f} s | engine model: {m}')\n"
            "else: print(f'{dt:.2f} s | fit median {m.fit_median_error:.1%} worst "
            "{m.fit_worst_factor:.2f}x | held out median {m.held_out_median_error:.1%} worst "
            "{m.held_out_worst_factor:.2f}x | {m.source}')\n"
        )
        print(f"{spec}: {_fresh(code)}")

    import numba
    import numpy as np

    from analyzer.cost import CostModel
    from analyzer.cost.step import chunk_attn, engine_step_model, step_seconds

    c = engine_step_model(CostModel.from_catalog("llama-3.1-70b", "h100", tp=4)).coefficients
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 8192, args.calls)
    a = np.array([chunk_attn(x, 4096.0) for x in t])
    d = rng.uniform(0, 256, args.calls)
    kv = d * 4096.0
    start = time.perf_counter()
    for i in range(args.calls):
        step_seconds(c, t[i], a[i], d[i], kv[i])
    py = (time.perf_counter() - start) / args.calls
    fast = numba.njit(step_seconds)

    @numba.njit
    def loop(c: np.ndarray, t: np.ndarray, a: np.ndarray, d: np.ndarray, kv: np.ndarray) -> float:
        total = 0.0
        for i in range(t.shape[0]):
            total += fast(c, t[i], a[i], d[i], kv[i])
        return total

    loop(c, t[:10], a[:10], d[:10], kv[:10])
    start = time.perf_counter()
    loop(c, t, a, d, kv)
    jit = (time.perf_counter() - start) / args.calls
    print(f"step_seconds per call: Python {py * 1e9:,.0f} ns, numba.njit {jit * 1e9:,.1f} ns")


if __name__ == "__main__":
    main()
