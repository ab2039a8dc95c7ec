"""The ``kvpool.report/2`` document: the one JSON form of an analysis.

:class:`ReportDocument` is made once from the advisor's typed result
(:class:`~analyzer.advisor.pipeline.AnalysisResult`); ``report.json``, ``kvpool analyze
--json`` and the dashboard's download are its :meth:`ReportDocument.to_json`, and the
Markdown, HTML and terminal renderers read that same document. This module alone knows
the schema's layout; the stages hand it objects, never dictionaries.

Floats are rounded to 6 significant digits and NaN or infinity become ``null``
(:func:`canonical`), so the same input and flags give the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from analyzer import __version__
from analyzer.advisor import gates as gates_mod
from analyzer.advisor.economics import economics_json
from analyzer.advisor.figures import VERDICT_SCENARIO, Objective
from analyzer.advisor.products import DOCS_CHECKED
from analyzer.advisor.sensitivity import summarize

if TYPE_CHECKING:
    from analyzer.advisor.pipeline import AnalysisResult, AnalyzeOptions

SCHEMA = "kvpool.report/2"


@dataclass(frozen=True, slots=True)
class ReportDocument:
    """One analysis in the report's schema, built once from the advisor's ``result``:
    ``json`` is the canonical document (rounded floats), ``summary`` its three opening
    sentences, written from the rounded figures the reader sees."""

    result: AnalysisResult = field(repr=False)
    json: dict[str, Any] = field(repr=False)
    summary: tuple[str, ...]

    @classmethod
    def of(cls, result: AnalysisResult) -> ReportDocument:
        from analyzer.advisor.summary import summary_sentences

        doc: dict[str, Any] = canonical(report_document(result))
        summary = tuple(summary_sentences(doc))
        doc["summary"] = list(summary)
        return cls(result=result, json=doc, summary=summary)

    @property
    def verdict(self) -> str:
        return self.result.decision.verdict

    def to_json(self) -> dict[str, Any]:
        """The document as ``report.json`` holds it (a fresh copy, free to change)."""
        import copy

        return copy.deepcopy(self.json)


def report_json(result: AnalysisResult) -> dict[str, Any]:
    """``ReportDocument.of(result).to_json()``: the analysis as ``report.json`` holds it."""
    return ReportDocument.of(result).json


def _round(x: float) -> float | None:
    if not math.isfinite(x):
        return None
    if x == 0:
        return 0.0
    return float(f"{x:.6g}")


def canonical(obj: Any) -> Any:
    """Rounded floats (6 significant digits), no NaN/inf, plain types: stable bytes."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        return _round(float(obj))
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [canonical(v) for v in obj]
    return str(obj)


def _options_json(o: AnalyzeOptions) -> dict[str, Any]:
    """The report's ``options`` section (flat, as ``kvpool.report/1`` has it). Ingest
    settings that could name a file or a tenant (salt file, columns) stay out."""
    c, i = o.cluster, o.ingest
    return {
        "model": c.model,
        "gpu": c.gpu,
        "tp": c.tp,
        "instances": c.instances,
        "gpus_per_node": c.gpus_per_node,
        "dram_scope": c.dram_scope,
        "kv_dtype": c.kv_dtype,
        "mfu": c.mfu,
        "pool_gbps": c.pool_gbps,
        "pool_tier": c.pool_tier,
        "dram_tier": c.dram_tier,
        "local_capacity_tokens": c.local_capacity_tokens,
        "dram_capacity_tokens": c.dram_capacity_tokens,
        "pool_capacity_tokens": c.pool_capacity_tokens,
        "router": c.router,
        "ttft_slo_s": o.ttft_slo_s,
        "warmup": c.warmup_fraction,
        "block_size": i.block_size,
        "fmt": i.fmt,
        "template": i.template,
        "tokenizer": i.tokenizer,
        "only_model": o.only_model,
        "current_instances": o.current_instances,
        "current_router": o.current_router,
        "current_local_capacity_tokens": o.current_local_capacity_tokens,
        "search_rate": o.search_rate,
        "sensitivity_replays": o.sensitivity_replays,
        "knee_fraction": o.knee_fraction,
        "thresholds": asdict(o.thresholds),
        "peak_window_s": o.peak_window_s,
        "prices": {
            **asdict(o.prices),
            # a path: keep the file's name only
            "prices_file": None
            if o.prices.prices_file is None
            else Path(o.prices.prices_file).name,
        },
    }


def report_document(r: AnalysisResult) -> dict[str, Any]:
    d = r.decision
    opts = _options_json(r.options)
    if opts["model"].lower().endswith(".json"):  # a config.json path: keep the name only
        opts["model"] = Path(opts["model"]).name
    if opts["tokenizer"] not in ("cl100k", "cl100k_base"):  # a path: keep the name only
        opts["tokenizer"] = Path(opts["tokenizer"]).name
    sizing = None
    if r.sizing is not None:
        s = r.sizing
        sizing = {
            **asdict(s),
            "pool_capacity_gb": s.pool_capacity_gb,
            "pool_capacity_gib": s.gib(s.pool_capacity_tokens),
            "dram_per_node_gb": s.dram_per_node_gb,
            "dram_per_node_gib": s.gib(s.dram_per_node_tokens),
            "pool_segment_per_node_gb": s.pool_segment_per_node_gb,
            "hbm_cache_per_instance_gb": s.gb(s.hbm_cache_per_instance_tokens),
            "knee_fraction": r.reuse.knee_fraction,
        }
    flips = [f.to_json() for f in r.flips]
    return {
        "schema": SCHEMA,
        "kvpool_version": __version__,
        "inputs": r.inputs,
        "options": opts,
        "trace": {**asdict(r.trace), "skipped": r.skipped, "tokenization": r.tokenization},
        "models": r.models,
        "warnings": list(r.warnings),
        "measured_vs_projected": r.measured,
        "verdict": {
            "verdict": d.verdict,
            "reasons": list(d.reasons),
            "confidence": d.confidence,
            "confidence_statement": d.confidence_statement,
            "missing": list(d.missing),
            "checks": [asdict(c) for c in d.checks],
            "projection": asdict(d.projection),
            "reason_facts": [[asdict(f) for f in facts] for facts in d.facts],
            "figures": dict(d.derived),
            "scenario": VERDICT_SCENARIO.get(d.verdict),
            "objective": r.options.thresholds.objective,
        },
        "reuse": {"figures": asdict(r.reuse), "analysis": r.reuse_json},
        "bandwidth": (
            None if r.bandwidth is None else {**asdict(r.bandwidth), "curve": r.break_even_curve}
        ),
        "cost": r.cost_json,
        "uncertainty": r.uncertainty,
        "replay": None if r.replay_result is None else r.replay_result.to_json(),
        "sizing": sizing,
        "settings": [p.to_json() for p in r.settings],
        "products_checked": list(DOCS_CHECKED),
        "sensitivity": {"rows": flips, "summary": summarize(r.flips)},
        "gates": {"plan": [gates_mod.gate_to_json(g) for g in r.gates]},
        "pilot": {"commands": [c.to_json() for c in r.pilot]},
        "deploy": {"files": [f.to_json() for f in r.deploy], "per_process": r.per_process},
        "assumptions": assumptions(r),
        "economics": economics_json(r.replay, r.economics),
        "side_by_side": r.side_by_side,
    }


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
            "value": f"{o.model} on {o.tp} x {o.gpu}, KV {o.kv_dtype}",
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
            "value": f"{o.instances} prefill instances, router {o.router}, decode not "
            f"modelled, TTFT SLO {1000 * o.ttft_slo_s:,.0f} ms (p90)",
            "source": "kvpool replay (docs/replay.md)",
        },
        {
            "what": "GPUs needed",
            "value": "instances x load / (highest rate multiple within the SLO), at the mean "
            f"and at the busiest {o.peak_window_s:g} s window; prefill GPUs only (a "
            "disaggregated prefill pool, as in Mooncake)",
            "source": "kvpool replay rate search; docs/advisor.md",
        },
        {
            "what": "Knee",
            "value": f"{100 * o.knee_fraction:.0f}% of the LRU ceiling",
            "source": "kvpool reuse LRU curve (exact stack distances, Mattson et al., 1970)",
        },
    ]
    if r.cost_json and r.cost_json.get("mfu") is not None:
        out.append(
            {
                "what": "Prefill utilisation (MFU)",
                "value": f"{100 * r.cost_json['mfu']:.0f}% of peak FLOP/s",
                "source": "--mfu: the plain roofline instead of the engine model (MFU as "
                "defined by Chowdhery et al., PaLM, 2022)",
            }
        )
    elif r.cost_json:
        out.append(
            {
                "what": "Prefill speed",
                "value": f"engine model, weights in {r.cost_json.get('weight_dtype', 'bf16')}",
                "source": "fitted on published measurements, models/measurements.toml "
                "(kvpool cost check; docs/cost-model.md)",
            }
        )
    if r.economics is not None:
        for p in r.economics.prices.used():
            price = "not priced" if p["usd"] is None else f"${p['usd']:,.4g} per {p['unit']}"
            out.append(
                {
                    "what": f"Price: {p['what']}",
                    "value": price,
                    "source": p["source"] + (f" (read {p['date']})" if p["date"] else ""),
                }
            )
    return out
