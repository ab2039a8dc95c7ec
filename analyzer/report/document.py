"""The ``kvpool.report/3`` document: the one JSON form of an analysis, and its builder.

:class:`ReportDocument` is made once from the advisor's typed result
(:class:`~analyzer.advisor.pipeline.AnalysisResult`); ``report.json``, ``kvpool analyze
--json`` and the dashboard's download are its :meth:`ReportDocument.to_json`. This module
alone knows the schema's layout: it builds the JSON (:func:`report_document`), rounds it
(:func:`canonical`) and reads it back into
:class:`~analyzer.report.plan_views.ReportView`, a tree of frozen dataclasses whose fields
are the schema's keys (:mod:`analyzer.report.views` and :mod:`analyzer.report.plan_views`
hold them, :mod:`analyzer.report.schema` the reader, :mod:`analyzer.report.assumptions`
the assumptions' rows). The Markdown, HTML and terminal renderers, the summary and the
dashboard read attributes of that view, never keys, and a ``report.json`` loaded back
(:meth:`ReportDocument.load`) gives the same view, so every output prints the same
rounded figures whether it is made fresh or from the file.

Floats are rounded to 6 significant digits and NaN or infinity become ``null``
(:func:`canonical`), so the same input and flags give the same bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from analyzer import __version__
from analyzer.advisor import gates as gates_mod
from analyzer.advisor.economics import economics_json, values
from analyzer.advisor.figures import (
    Undefined,
    Verdict,
)
from analyzer.advisor.plan import PlanStatus
from analyzer.advisor.products import DOCS_CHECKED
from analyzer.advisor.sensitivity import summarize
from analyzer.advisor.served import model_label
from analyzer.errors import InputError, Location
from analyzer.outputs import note_input
from analyzer.replay.config import Scenario
from analyzer.report.assumptions import assumptions
from analyzer.report.plan_views import ReportView
from analyzer.report.schema import SCHEMA, ReportFormatError, not_applicable
from analyzer.report.summary import summary_sentences

if TYPE_CHECKING:
    from analyzer.advisor.pipeline import AnalysisResult, AnalyzeOptions
    from analyzer.advisor.plan import DeploymentPlan


def _or_na(x: float | None, why: Undefined) -> Any:
    """``x``, or the not-applicable form when it is missing or not finite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return not_applicable(why)
    return x


@dataclass(frozen=True, slots=True)
class ReportDocument:
    """One analysis in the report's schema, built once: ``report`` is the typed view of
    the canonical document (rounded floats, keys in the order report.json reads back in),
    its ``summary`` the three opening sentences, written from the rounded figures the
    reader sees."""

    report: ReportView

    @classmethod
    def of(cls, result: AnalysisResult) -> ReportDocument:
        doc: dict[str, Any] = canonical(report_document(result))
        doc["summary"] = []
        # the order a reloaded report.json has, so a fresh and a reloaded view render alike
        doc = json.loads(json.dumps(doc, sort_keys=True))
        view = ReportView.from_json(doc)
        return cls(replace(view, summary=tuple(summary_sentences(view))))

    @classmethod
    def from_json(cls, doc: Any, source: str = "report.json") -> ReportDocument:
        """A document loaded back; a malformed one is an :class:`InputError` naming
        ``source`` and the field."""
        try:
            return cls(ReportView.from_json(doc))
        except ReportFormatError as exc:
            raise InputError(
                exc.message,
                Location(source, field=exc.field or None),
                hint="pass the report.json written by `kvpool analyze -o DIR`",
            ) from None

    @classmethod
    def load(cls, path: str | Path) -> ReportDocument:
        """``report.json`` read back; an unreadable or malformed file is a one-line
        :class:`InputError` naming the file (and the field)."""
        p = Path(path)
        note_input(p)
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise InputError("not a UTF-8 JSON file", Location(str(path))) from None
        except OSError as exc:
            raise InputError(
                f"cannot read report: {exc.strerror or exc}", Location(str(path))
            ) from None
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON: {exc.msg}", Location(str(path), exc.lineno)) from None
        except RecursionError:
            raise InputError("JSON nested too deeply", Location(str(path))) from None
        return cls.from_json(doc, str(path))

    @property
    def summary(self) -> tuple[str, ...]:
        return self.report.summary

    @property
    def verdict(self) -> Verdict:
        return self.report.verdict.verdict

    def to_json(self) -> dict[str, Any]:
        """The document as ``report.json`` holds it (a fresh copy, free to change)."""
        return self.report.to_json()


def report_json(result: AnalysisResult) -> dict[str, Any]:
    """``ReportDocument.of(result).to_json()``: the analysis as ``report.json`` holds it."""
    return ReportDocument.of(result).to_json()


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
        # a config.json or a model folder: its folder's name, never its path
        "model": model_label(c.model),
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
        # a tokenizer folder: keep the name only
        "tokenizer": i.tokenizer
        if i.tokenizer in ("cl100k", "cl100k_base")
        else Path(i.tokenizer).name,
        "only_model": o.only_model,
        "current_instances": o.current_instances,
        "current_router": o.current_router,
        "current_local_capacity_tokens": o.current_local_capacity_tokens,
        "size_search": o.size_search,
        "max_gpus": o.max_gpus,
        "model_given": o.model_given,
        "tp_given": o.tp_given,
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
    """The analysis in the schema's layout; a ``--model`` given as a config or a folder
    is named by the folder's name wherever a stage echoes the flag (no path leaves)."""
    doc = _report_document(r)
    flag = r.options.model
    return doc if model_label(flag) == flag else _renamed(doc, flag, model_label(flag))


def _renamed(x: Any, old: str, new: str) -> Any:
    if isinstance(x, str):
        return new if x == old else x
    if isinstance(x, dict):
        return {k: _renamed(v, old, new) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_renamed(v, old, new) for v in x]
    return x


def _report_document(r: AnalysisResult) -> dict[str, Any]:
    d = r.decision
    opts = _options_json(r.options)
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
        "inputs": [i.to_json() for i in r.inputs],
        "options": opts,
        "trace": {
            **asdict(r.trace),
            "skipped": r.skipped.to_json(),
            "tokenization": r.tokenization.to_json(),
        },
        "models": {} if r.models is None else r.models.to_json(),
        "warnings": list(r.warnings),
        "measured_vs_projected": None if r.measured is None else r.measured.to_json(),
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
            "scenario": d.scenario,
            "objective": r.options.thresholds.objective,
        },
        "reuse": {"figures": _reuse_figures_json(r), "analysis": r.reuse_report.to_json()},
        "bandwidth": _bandwidth_json(r),
        "cost": None if r.cost is None else r.cost.to_json(),
        "uncertainty": _uncertainty_json(r),
        "replay": _replay_json(r),
        "sizing": sizing,
        "settings": [p.to_json() for p in r.settings],
        "products_checked": list(DOCS_CHECKED),
        "sensitivity": {"rows": flips, "summary": summarize(r.flips)},
        "gates": {"plan": [gates_mod.gate_to_json(g) for g in r.gates]},
        "pilot": {"commands": [c.to_json() for c in r.pilot]},
        "deploy": {
            "files": [f.to_json() for f in r.deploy],
            "per_process": [p.to_json() for p in r.per_process],
        },
        "assumptions": assumptions(r),
        "economics": _economics_json(r),
        "side_by_side": _side_by_side_json(r),
        "plans": [_plan_json(p) for p in r.plans],
        "fleet": _fleet_json(r),
        "arrivals": _arrivals_json(r),
        # only for a KV-event recording: other inputs' reports keep their bytes
        **({} if r.engine_events is None else {"engine_events": r.engine_events.to_json()}),
        "isolation": None if r.isolation is None else r.isolation.to_json(),
    }


def _load_json(load: dict[str, Any], mean_rps: float) -> dict[str, Any]:
    """A load's figures; a log whose requests share one timestamp has no request rate."""
    if not mean_rps > 0:
        for key in ("mean_rps", "peak_rps", "peak_factor", "sizing_rate_multiple"):
            if key in load:
                load[key] = not_applicable(Undefined.NO_REQUEST_RATE)
    return load


# The reason a plan has no size, by how its search ended.
_UNSIZED = {
    PlanStatus.ABOVE_CAP: Undefined.ABOVE_CAP,
    PlanStatus.CANNOT_MEET: Undefined.SLO_NEVER_MET,
    PlanStatus.PREFILL_BOUND: Undefined.PREFILL_BOUND,
}


def _unsized(status: str | None) -> Undefined:
    """Why a plan (or a fleet) has no instances, and so no GPUs, TTFT or money."""
    return _UNSIZED.get(
        PlanStatus(status) if status else PlanStatus.CANNOT_MEET, Undefined.SLO_NEVER_MET
    )


def _money_json(money: dict[str, Any], sized: bool, status: str) -> dict[str, Any]:
    why = Undefined.NOT_PRICED if sized else _unsized(status)
    for key in ("gpu_usd_month", "total_usd_month"):
        money[key] = _or_na(money[key], why)
    return money


def _sized_json(out: dict[str, Any]) -> dict[str, Any]:
    """A plan's or a fleet's counts, TTFT, hit rate and money: each one it has no value
    for (no count within the cap meets the SLO) in its not-applicable form."""
    sized = out["instances"] is not None
    why = _unsized(out["status"])
    for key in ("instances", "gpus", "nodes", "ttft_s", "hit_rate"):
        out[key] = _or_na(out[key], why)
    out["money"] = _money_json(out["money"], sized, out["status"])
    return out


def _plan_json(p: DeploymentPlan) -> dict[str, Any]:
    out = _sized_json(p.to_json())
    out["load"] = _load_json(out["load"], p.load.mean_rps)
    return out


def _fleet_json(r: AnalysisResult) -> dict[str, Any]:
    """``fleet``: each option for the whole log, with its money against the baseline's
    (a figure it has none for says why: its own size's reason, the baseline's, no GPU
    price, no saving)."""
    worth = values(r.fleets, r.prices)
    base = next((f for f in r.fleets if f.option == Scenario.LOCAL), None)
    base_why = Undefined.SLO_NEVER_MET if base is None else _unsized(base.status)
    out = {}
    for f in r.fleets:
        v = worth[f.option]
        own = _unsized(f.status)
        priced = r.prices.gpu_month_usd(f.plans[0].gpu) is not None if f.plans else False
        saved_why = own if f.gpus is None else base_why
        saving_why = saved_why if v.gpus_saved is None or priced else Undefined.NOT_PRICED
        net_why = (
            (own if f.gpus is None else Undefined.NOT_PRICED)
            if f.money.total_usd_month is None
            else base_why
            if base is None or base.gpus is None
            else Undefined.NOT_PRICED
        )
        pilot_why = own if f.gpus is None else Undefined.NOT_PRICED
        if f.option == Scenario.LOCAL:
            payback_why = Undefined.BASELINE
        elif v.net_usd_month is None:
            payback_why = net_why
        elif v.net_usd_month <= 0:
            payback_why = Undefined.NO_NET_SAVING
        else:
            payback_why = pilot_why
        row = {**_sized_json(f.to_json()), **v.to_json()}
        row["gpus_saved"] = _or_na(row["gpus_saved"], saved_why)
        row["gpu_saving_usd_month"] = _or_na(row["gpu_saving_usd_month"], saving_why)
        row["net_usd_month"] = _or_na(row["net_usd_month"], net_why)
        row["pilot_usd"] = _or_na(row["pilot_usd"], pilot_why)
        row["payback_months"] = _or_na(row["payback_months"], payback_why)
        out[f.option] = row
    return out


def _replay_json(r: AnalysisResult) -> dict[str, Any] | None:
    """``replay``: each option's replay at its planned size and the busiest load (the
    replay of the primary model's requests; ``kvpool replay --instances N`` gives the
    same figures at the log's own rate)."""
    runs = {p.option: p for p in r.plans if p.run is not None and p.model == r.plans[0].model}
    if not runs:
        return None
    first = next(iter(runs.values()))
    assert first.run is not None
    c = r.cluster if r.cluster is not None else first.run.resolved.cluster
    ran = replace(c, instances=first.instances or c.instances)
    cluster = {
        **asdict(ran),
        # a plan no size met has no nodes of its own: the cluster it was replayed on has
        "nodes": first.nodes if first.nodes is not None else ran.nodes,
        "instances_per_node": first.instances_per_node or ran.instances_per_node,
        "dram_caches_per_node": c.dram_sharers,
        "bytes_per_token": first.capacities.bytes_per_token,
        "block_size": first.run.resolved.block_size,
        "requests": r.trace.n_requests,
        "ttft_slo_s": r.options.ttft_slo_s,
        "slo_quantile": 0.9,
        "sizing_rate_multiple": first.load.peak_factor,
    }
    for k in (
        "local_capacity_tokens",
        "dram_capacity_tokens",
        "nvme_capacity_tokens",
        "pool_capacity_tokens",
    ):
        v = cluster[k]
        cluster[k] = "unbounded" if v is not None and v >= 2**62 else v
    scenarios = {}
    for name, p in runs.items():
        assert p.run is not None
        run = p.run.to_json()
        for key in ("max_rate_scale_at_slo", "rate_search"):  # a plan is sized by count
            run.pop(key, None)
        scenarios[name] = {
            **run,
            "instances": p.instances if p.instances is not None else p.instances_above_cap,
        }
    out: dict[str, Any] = {
        "schema": "kvpool.replay/1",
        "cluster": cluster,
        "scenarios": scenarios,
    }
    mini = next((x for x in r.miniatures if x is not None), None)
    if mini is not None:
        out["miniature"] = mini.to_json()
    return out


def _arrivals_json(r: AnalysisResult) -> dict[str, Any] | None:
    if r.arrivals is None:
        return None
    out: dict[str, Any] = dict(r.arrivals.to_json())
    out["effect"] = None if r.arrivals_effect is None else r.arrivals_effect.to_json()
    return out


# -- figures the model leaves undefined, in their not-applicable form ------------------------


def _reuse_figures_json(r: AnalysisResult) -> dict[str, Any]:
    """``reuse.figures``: the median reusable prefix of a log that reuses none is no
    length at all (the median of nothing)."""
    out = asdict(r.reuse)
    if r.reuse.measurable and not r.reuse.median_prefix_tokens:
        out["median_prefix_tokens"] = not_applicable(Undefined.NO_REUSE)
    return out


def _bandwidth_json(r: AnalysisResult) -> dict[str, Any] | None:
    """``bandwidth``: where a prefix's prefill saves less than placing its loaded KV
    costs, the break-even is never reached (the cost model's infinity)."""
    if r.bandwidth is None:
        return None
    never = Undefined.LOADING_NEVER_PAYS
    return {
        **asdict(r.bandwidth),
        "break_even_gbps": _or_na(r.bandwidth.break_even_gbps, never),
        "prefill_tokens_per_s": _or_na(
            r.bandwidth.prefill_tokens_per_s, Undefined.NO_PREFILL_SAVING
        ),
        "curve": [
            {**p.to_json(), "break_even_gbps": _or_na(p.break_even_gbps, never)}
            for p in r.break_even_curve
        ],
    }


def _uncertainty_json(r: AnalysisResult) -> dict[str, Any] | None:
    """``uncertainty``: a range around an undefined figure is undefined too."""
    if r.uncertainty is None:
        return None
    u = r.uncertainty
    out = u.to_json()
    for key, figure, why in (
        ("break_even_gbps", u.break_even_gbps, Undefined.LOADING_NEVER_PAYS),
        ("prefill_tokens_per_s", u.prefill_tokens_per_s, Undefined.NO_PREFILL_SAVING),
    ):
        if not math.isfinite(figure.value):
            out[key] = not_applicable(why)
    return out


def _economics_json(r: AnalysisResult) -> dict[str, Any] | None:
    """``economics``: the load, the prices, the constants; a log whose requests share one
    timestamp has no request rate."""
    gpu = r.plans[0].gpu if r.plans else r.prices.gpu
    tp = r.plans[0].tp if r.plans else r.options.tp
    out = economics_json(r.load, r.prices, gpu, tp)
    if not r.load.mean_rps > 0:
        for key in ("mean_rps", "peak_rps", "peak_factor"):
            out["load"][key] = not_applicable(Undefined.NO_REQUEST_RATE)
    return out


def _side_by_side_json(r: AnalysisResult) -> list[dict[str, Any]]:
    """``side_by_side``: an option without a size there says why (its search's end); one
    sized on a GPU without a price has no cost."""
    out = []
    for c in r.side_by_side:
        row = c.to_json()
        for o in row["options"].values():
            sized = o["gpus_at_peak_load"] is not None
            why = _unsized(o.get("status"))
            for key in ("ttft_mean_s", "ttft_p90_s", "gpus_at_peak_load"):
                o[key] = _or_na(o[key], why)
            o["total_usd_month"] = _or_na(
                o["total_usd_month"], Undefined.NOT_PRICED if sized else why
            )
        out.append(row)
    return out
