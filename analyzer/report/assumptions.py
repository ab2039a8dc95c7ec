"""The report's "Assumptions and sources" rows: what each figure of an analysis assumed,
its value for this run (warm-up, thresholds, objective, KPIs, catalogs, replay) and
where it comes from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from analyzer.advisor.figures import (
    Objective,
)
from analyzer.advisor.served import model_label

if TYPE_CHECKING:
    from analyzer.advisor.pipeline import AnalysisResult


def assumptions(r: AnalysisResult) -> list[dict[str, Any]]:
    o = r.options
    th = o.thresholds
    out = [
        {
            "what": "Steady-state reuse",
            "value": f"first {100 * o.warmup:.0f}% of requests warm the cache uncounted",
            "source": "warm-up excluded from hit rates, as cache simulators do (e.g. "
            "libCacheSim, github.com/1a1a11a/libCacheSim); docs/reuse.md",
        },
        {
            "what": "Reuse guideline",
            "value": f"{100 * th.min_reuse:.0f}% steady-state prefix reuse",
            "source": "kvpool default threshold (docs/advisor.md, overridable)",
        },
        {
            "what": "Objective",
            "value": (
                "lowest monthly cost serving the peak load within the TTFT SLO; a pool must "
                f"save {100 * th.min_pool_saving:.0f}% of the baseline's monthly cost more than "
                "the best local option"
                if th.objective == Objective.COST
                else "lowest mean TTFT without lowering the rate served within the SLO; a "
                f"pool must beat local DRAM offload by {100 * th.min_pool_advantage:.0f}%"
            ),
            "source": "--objective, --pool-margin (docs/advisor.md)",
        },
        {
            "what": "Pilot KPIs",
            "value": f"at least {100 * th.pilot_fraction:.0f}% of the projected TTFT reduction "
            "and throughput gain, p90 TTFT within the SLO, 72 h stability",
            "source": "gated pilot derived from the projection (docs/advisor.md)",
        },
        {
            "what": "Break-even bandwidth",
            "value": "bytes/token x prefill tokens/s of the prefix's marginal tokens",
            "source": "Mooncake (Qin et al., FAST'25): load KV when faster than recomputing "
            "it; docs/cost-model.md",
        },
        {
            "what": "Model and GPU",
            "value": f"{model_label(o.model)} on {o.tp} x {o.gpu}, KV {o.kv_dtype}",
            "source": "kvpool catalogs models/models.toml, models/hardware.toml (model "
            "config.json files and vendor datasheets)",
        },
        {
            "what": "Pool link",
            "value": (
                f"{o.pool_gbps:g} GB/s per node ({8 * o.pool_gbps:g} Gb/s)"
                if o.pool_gbps
                else o.pool_tier
            ),
            "source": "--pool-gbps (default: the pool tier's catalog figure, models/hardware.toml; RDMA at "
            "about 87% of line rate, as Mooncake's Transfer Engine reaches)",
        },
        {
            "what": "Replay",
            "value": (
                f"{o.instances} instances, router {o.router}, prefill and decode in one "
                "continuous batch per instance (aggregated serving)"
                if o.cluster.serving == "aggregated"
                else f"{o.instances} prefill instances, router {o.router}, decode not modelled"
            )
            + f", TTFT SLO {1000 * o.ttft_slo_s:,.0f} ms (p90)",
            "source": "kvpool replay (docs/replay.md)",
        },
        {
            "what": "GPUs needed",
            "value": "each option's fewest instances whose replay keeps p90 TTFT within the "
            f"SLO at the busiest {o.peak_window_s:g} s window's load, x TP; "
            + (
                "whole serving GPUs (prefill and decode together)"
                if o.cluster.serving == "aggregated"
                else "prefill GPUs only (a disaggregated prefill pool, as in Mooncake)"
            ),
            "source": "kvpool size search, replaying each option at size (docs/advisor.md)",
        },
        {
            "what": "Knee",
            "value": f"{100 * o.knee_fraction:.0f}% of the LRU ceiling",
            "source": "kvpool reuse LRU curve (exact stack distances, Mattson et al., 1970)",
        },
    ]
    if r.cost is not None and r.cost.mfu is not None:
        out.append(
            {
                "what": "Prefill utilisation (MFU)",
                "value": f"{100 * r.cost.mfu:.0f}% of peak FLOP/s",
                "source": "--mfu: the plain roofline instead of the engine model (MFU as "
                "defined by Chowdhery et al., PaLM, 2022)",
            }
        )
    elif r.cost is not None:
        out.append(
            {
                "what": "Prefill speed",
                "value": f"engine model, weights in {r.cost.weight_dtype}",
                "source": "fitted on published measurements, models/measurements.toml "
                "(kvpool cost check; docs/cost-model.md)",
            }
        )
    if r.plans:
        for p in r.prices.used():
            price = "not priced" if p.usd is None else f"${p.usd:,.4g} per {p.unit}"
            out.append(
                {
                    "what": f"Price: {p.what}",
                    "value": price,
                    "source": p.source + (f" (read {p.date})" if p.date else ""),
                }
            )
    return out
