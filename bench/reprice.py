"""Re-pricing a replay for another link bandwidth, against replaying it: speed, the cost
of recording, and the error where the re-pricing is not exact.

    .venv/bin/python bench/reprice.py [--traces mixed,chat,agent] [--gbps 10,40,50]
                                      [--repeat 3]

For each bundled trace (the dashboard's defaults: `kvpool analyze`'s cluster, the
``pooled`` scenario with its SLO rate search):

* the recording's cost: the run at the trace's rate with and without ``record``
  (best of ``--repeat``, alternated), in CPU seconds and as a ratio;
* per pool bandwidth: the re-pricing's seconds against a full replay's at that
  bandwidth, whether it was exact (checked, see analyzer/replay/reprice.py), the
  requests that completed in another slot or would have been routed elsewhere, and its
  error against the replay: the highest rate under the SLO (re-priced vs replayed),
  p90 and mean TTFT (relative), hit rate (absolute).

Timings are CPU-bound Python on one core; on a shared machine read them with the load
average printed beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.advisor import AnalyzeOptions  # noqa: E402
from analyzer.ingest import IngestOptions, open_trace  # noqa: E402
from analyzer.replay import resolve, run_replay  # noqa: E402
from analyzer.replay.config import select_scenarios  # noqa: E402
from analyzer.replay.engine import simulate  # noqa: E402
from analyzer.replay.reprice import Unrepriceable, reprice_scenario  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="mixed,chat,agent")
    ap.add_argument("--gbps", default="10,40,50")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} (1 / 5 min): "
        "timings on a shared box are noisy"
    )
    opts = AnalyzeOptions()
    (spec,) = select_scenarios(["pooled"])
    for name in args.traces.split(","):
        trace = open_trace([str(ROOT / "traces" / f"{name}.jsonl.zst")], IngestOptions()).trace
        cfg = opts.cluster
        res = resolve(cfg, spec, trace.block_size)
        plain = rec = float("inf")
        for _ in range(args.repeat):  # alternated, so that load drifts hit both alike
            t0 = time.process_time()  # CPU seconds: less moved by other jobs than wall time
            simulate(trace, res.plan, cfg.time_scale)
            t1 = time.process_time()
            simulate(trace, res.plan, cfg.time_scale, record=True)
            t2 = time.process_time()
            plain, rec = min(plain, t1 - t0), min(rec, t2 - t1)
        print(
            f"\n{name}: {trace.n_requests} requests; run at the trace's rate: "
            f"{plain:.3f} s plain, {rec:.3f} s recording ({rec / plain - 1:+.1%}; CPU seconds, "
            f"best of {args.repeat})"
        )
        t0 = time.perf_counter()
        old = run_replay(trace, cfg, scenarios=[spec], ttft_slo_s=opts.ttft_slo_s, record=True)
        old_s = time.perf_counter() - t0
        base = old.scenarios["pooled"]
        print(
            f"  recorded replay (pooled + rate search) at {res.pool_gbps:g} GB/s: {old_s:.2f} s, "
            f"max rate x{base.max_rate_scale_at_slo:.3g}"
        )
        print(
            f"  {'GB/s':>6} {'re-priced s':>11} {'replay s':>9} {'exact':>5} {'moved':>6} "
            f"{'rerouted':>8} {'max rate re-priced/replayed':>28} {'p90 err':>8} "
            f"{'mean err':>8} {'hit err':>8}"
        )
        for gbps in (float(g) for g in args.gbps.split(",")):
            new_cfg = replace(cfg, pool_gbps=gbps)
            new = resolve(new_cfg, spec, trace.block_size)
            t0 = time.perf_counter()
            try:
                got = reprice_scenario(trace, base, new, opts.ttft_slo_s, True)
            except Unrepriceable as exc:
                got = None
                why = str(exc)
            rp_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            want = run_replay(trace, new_cfg, scenarios=[spec], ttft_slo_s=opts.ttft_slo_s)
            want = want.scenarios["pooled"]
            full_s = time.perf_counter() - t0
            if got is None:
                print(f"  {gbps:>6g} {rp_s:>11.3f} {full_s:>9.2f}  not re-priced: {why}")
                continue
            g = got.result
            p90 = abs(g.ttft.p90_s - want.ttft.p90_s) / want.ttft.p90_s
            mean = abs(g.ttft.mean_s - want.ttft.mean_s) / want.ttft.mean_s
            hit = abs(g.hit_rate - want.hit_rate)
            rates = f"x{g.max_rate_scale_at_slo:.3g} / x{want.max_rate_scale_at_slo:.3g}"
            print(
                f"  {gbps:>6g} {rp_s:>11.3f} {full_s:>9.2f} {got.exact!s:>5} "
                f"{got.reordered:>6} {got.rerouted:>8} {rates:>28} {p90:>8.3%} "
                f"{mean:>8.3%} {hit:>8.3%}"
            )


if __name__ == "__main__":
    main()
