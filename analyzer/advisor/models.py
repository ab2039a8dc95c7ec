"""Several models in one log: which models it names, the figures of each, one of them.

Gateway logs carry a ``model`` per request, as the engine serves it
(``meta-llama/Llama-3.1-70B-Instruct``, ``Qwen/Qwen2.5-32B-Instruct``, a catalog alias).
Engines never share KV across models, and ingest puts the model in the block key by
default (:class:`analyzer.ingest.IngestOptions.hash_keys`), so no block of one model
ever matches a block of another: each model's reuse is its own. What a pool shared by
several models gains is capacity (one store sized for all of them, each model's
working set in it), never hits across models.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from analyzer.errors import UsageError
from analyzer.trace import read_metadata

if TYPE_CHECKING:
    from analyzer.reuse.records import CurvePoint

SHARED_POOL_NOTE = (
    "Blocks of different models never match (each model's KV is its own), so a pool shared "
    "by several models adds capacity, not hits: one store holds every model's working set, "
    "sized for all of them together."
)


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model a log names, with its share of the traffic."""

    name: str  # as the log names it
    catalog_id: str | None  # the cost catalog's id, when recognized
    requests: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class ModelReplay:
    """One model of a multi-model log replayed on instances of its own
    (:func:`per_model_replay`)."""

    model: str  # the catalog model it was priced as
    tp: int
    instances: int
    pool_share: float  # of the one store shared by every model
    pool_capacity_tokens: int | None  # None: unbounded
    local_hit_rate: float
    pooled_hit_rate: float
    local_ttft_mean_s: float | None
    pooled_ttft_mean_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True)
class ModelNotReplayed:
    """A model of a multi-model log that fits on none of the GPU's TP degrees."""

    model: str
    skipped: str  # why

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "skipped": self.skipped}


@dataclass(frozen=True, slots=True)
class ModelReuse:
    """The reuse figures of one model of a multi-model log, measured on its requests."""

    measurable: bool
    ceiling_hit_rate: float
    cold_ceiling_hit_rate: float
    distinct_blocks: int
    footprint_tokens: int
    kv_bytes_per_token: int | None  # None: not a catalog model
    footprint_gb: float | None  # its working set in GB (catalog models)
    # the exact LRU curve, as the reuse stage serializes it (``curves.lru``)
    hit_ratio_curve: tuple[CurvePoint, ...]


@dataclass(frozen=True, slots=True)
class ModelFigures:
    """One model a log names: its traffic and, when the log names several, its own
    reuse and replay (a log naming one model has the overall figures only)."""

    served: ServedModel
    reuse: ModelReuse | None = None  # None: the log's only model (same as overall)
    replay: ModelReplay | ModelNotReplayed | None = None

    def to_json(self) -> dict[str, Any]:
        m = self.served
        out: dict[str, Any] = {
            "model": m.name,
            "catalog_id": m.catalog_id,
            "requests": m.requests,
            "prompt_tokens": m.prompt_tokens,
        }
        if self.reuse is None:
            return {**out, "same_as_overall": True}
        r = self.reuse
        out.update(
            measurable=r.measurable,
            ceiling_hit_rate=r.ceiling_hit_rate,
            cold_ceiling_hit_rate=r.cold_ceiling_hit_rate,
            distinct_blocks=r.distinct_blocks,
            footprint_tokens=r.footprint_tokens,
            kv_bytes_per_token=r.kv_bytes_per_token,
            footprint_gb=r.footprint_gb,
            hit_ratio_curve=[p.to_json() for p in r.hit_ratio_curve],
        )
        if self.replay is not None:
            out["replay"] = self.replay.to_json()
        return out


# How the per-model replay is set up, as the report says it.
PER_MODEL_REPLAY = (
    "each model on {instances} instances of its own (its catalog model's cost "
    "and HBM, at the smallest tensor parallelism it fits at), local and pooled "
    "scenarios on its requests alone, the pool one store sized for all models, "
    "shared in proportion to each model's working set in bytes"
)


@dataclass(frozen=True, slots=True)
class ModelsFigures:
    """The models a log names (the ``models`` section of ``report.json`` and of
    ``kvpool reuse --json``)."""

    count: int
    block_key_includes_model: bool
    per_model: tuple[ModelFigures, ...]
    per_model_replay: str | None = None  # how the models were replayed, when they were
    warning: str | None = None  # --model names none of the log's models

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "count": self.count,
            "block_key_includes_model": self.block_key_includes_model,
            "per_model": [m.to_json() for m in self.per_model],
        }
        if self.count > 1:
            doc["shared_pool_note"] = SHARED_POOL_NOTE
        if self.per_model_replay is not None:
            doc["per_model_replay"] = self.per_model_replay
        if self.warning is not None:
            doc["warning"] = self.warning
        return doc


def _recognize(name: str) -> str | None:
    from analyzer.cost import recognize_model

    return recognize_model(name)


def served_models(table: pa.Table) -> list[ServedModel]:
    """The models a canonical table names, most requests first (ties by name)."""
    if "model" not in table.column_names or table.num_rows == 0:
        return []
    names = table.column("model").to_pylist()
    prompts = table.column("prompt_tokens").to_pylist()
    reqs = Counter(n for n in names if n is not None)
    toks: Counter[str] = Counter()
    for n, p in zip(names, prompts, strict=True):
        if n is not None:
            toks[n] += int(p)
    return [
        ServedModel(n, _recognize(n), reqs[n], toks[n])
        for n in sorted(reqs, key=lambda n: (-reqs[n], n))
    ]


def _matches(m: ServedModel, wanted: str) -> bool:
    w = wanted.strip().lower()
    if m.name.lower() == w or m.name.lower().split("/")[-1] == w.split("/")[-1]:
        return True
    target = _recognize(wanted)
    return target is not None and m.catalog_id == target


def model_warning(models: list[ServedModel], model_flag: str | None) -> str | None:
    """A warning when ``--model`` names a model the log does not (None when it does, or
    when the log names none)."""
    if not model_flag or not models or model_flag.lower().endswith(".json"):
        return None
    if any(_matches(m, model_flag) for m in models):
        return None
    names = ", ".join(m.name for m in models)
    return (
        f"--model {model_flag} is not a model this log names ({names}): the figures are "
        f"priced for {model_flag}; pass --model for the served model, or --only-model NAME "
        "to analyze one of the log's"
    )


def select_model(loaded: Any, wanted: str) -> Any:  # LoadedTrace -> LoadedTrace
    """Only the requests of one model (``--only-model``): its served name, the name
    without its organisation, or anything naming the same catalog model."""
    models = served_models(loaded.table)
    keep = [m.name for m in models if _matches(m, wanted)]
    if not keep:
        names = ", ".join(m.name for m in models) or "none"
        raise UsageError(
            f"--only-model {wanted}: the log names no such model", hint=f"it names: {names}"
        )
    import pyarrow.compute as pc

    mask = pc.is_in(loaded.table.column("model"), value_set=pa.array(keep, pa.string()))
    table = loaded.table.filter(pc.fill_null(mask, False))
    return dataclasses.replace(loaded, table=table, _trace=None)


def per_model_reuse(loaded: Any, opts: Any, kv_dtype: str = "bf16") -> list[ModelFigures]:
    """Per model the log names: requests, tokens, reuse ceilings, the exact LRU hit-ratio
    curve and, for a catalog model, its KV bytes per token and working set in GB.

    ``opts`` is the :class:`analyzer.reuse.ReuseOptions` of the whole run (its
    ``bytes_per_token`` is replaced by each model's own)."""
    import pyarrow.compute as pc

    from analyzer.cost import get_model
    from analyzer.reuse import analyze_reuse
    from analyzer.trace import BlockTrace

    out: list[ModelFigures] = []
    names = loaded.table.column("model")
    for m in served_models(loaded.table):
        table = loaded.table.filter(pc.fill_null(pc.equal(names, m.name), False))
        trace = BlockTrace.from_table(table)
        bpt = (
            int(get_model(m.catalog_id).kv_bytes_per_token(dtype=kv_dtype))
            if m.catalog_id
            else None
        )
        rep = analyze_reuse(trace, dataclasses.replace(opts, bytes_per_token=bpt))
        out.append(
            ModelFigures(
                m,
                ModelReuse(
                    measurable=rep.measurable,
                    ceiling_hit_rate=round(float(rep.ceiling_hit_rate), 6),
                    cold_ceiling_hit_rate=round(float(rep.cold_ceiling_hit_rate), 6),
                    distinct_blocks=int(trace.n_blocks),
                    footprint_tokens=int(rep.footprint_tokens) if rep.measurable else 0,
                    kv_bytes_per_token=bpt,
                    footprint_gb=(
                        round(rep.footprint_tokens * bpt / 1e9, 6)
                        if bpt and rep.measurable
                        else None
                    ),
                    hit_ratio_curve=rep.curves().get("lru", ()),
                ),
            )
        )
    return out


def models_document(
    loaded: Any, opts: Any, kv_dtype: str = "bf16", warning: str | None = None
) -> ModelsFigures:
    """The models the log names, with per-model reuse when it names several (the
    ``models`` section of ``kvpool reuse --json`` and ``report.json``)."""
    models = served_models(loaded.table)
    per_model = (
        per_model_reuse(loaded, opts, kv_dtype)
        if len(models) > 1
        else [ModelFigures(m) for m in models[:1]]
    )
    return ModelsFigures(
        count=len(models),
        block_key_includes_model="model"
        in read_metadata(loaded.table).get("hash_keys", "").split(","),
        per_model=tuple(per_model),
        warning=warning,
    )


def per_model_replay(
    loaded: Any,
    cfg: Any,
    models: ModelsFigures,
    fits: Any,
    replayer: Any = None,
) -> ModelsFigures:
    """Each model of a multi-model log replayed on its own instances: ``models`` with
    each model's ``replay`` (those measured on their own by :func:`per_model_reuse`;
    ``models`` itself when fewer than two were).

    Engines serve one model each, so each model gets ``cfg.instances`` instances of its
    own (its catalog model's cost and HBM, at the smallest tensor parallelism it fits
    at; a model the catalog does not know is priced as ``cfg.model``), and the
    ``local`` and ``pooled`` scenarios are replayed on its requests alone. The pool is
    one store sized for all models (the DRAM of the nodes all their instances fill, or
    ``cfg.pool_capacity_tokens`` of ``cfg.model``'s KV), each model holding a share in
    proportion to its working set in bytes: blocks of different models never match, so
    what each model gains from the shared store is that capacity, never another model's
    hits. ``fits(model, gpu, kv_dtype)`` gives ``(cost model, tp)`` or None.

    ``replayer`` replaces :func:`analyzer.replay.run_replay` as in
    :func:`analyzer.advisor.run_analysis`, and is also given ``part``, the model's name
    in the log: the requests it replays are that model's alone (a caller remembering
    replays keys them by it).
    """
    from analyzer.cost import get_model
    from analyzer.replay import UNBOUNDED, run_replay
    from analyzer.replay.config import Scenario

    per_model = [m for m in models.per_model if m.reuse is not None]
    if len(per_model) < 2:
        return models
    n_models = len(per_model)
    per_node = max(1, cfg.gpus_per_node // cfg.tp)
    nodes = -(-cfg.instances * n_models // per_node)
    base_bpt = int(get_model(cfg.model).kv_bytes_per_token(dtype=cfg.kv_dtype))
    if cfg.pool_capacity_tokens is not None and cfg.pool_capacity_tokens < UNBOUNDED:
        pool_bytes = float(cfg.pool_capacity_tokens) * base_bpt
    elif cfg.pool_capacity_tokens is None:
        per_node_bytes = (
            cfg.dram_capacity_tokens * base_bpt
            if cfg.dram_capacity_tokens is not None and cfg.dram_capacity_tokens < UNBOUNDED
            else cfg.dram_capacity_gb * 1e9
        )
        pool_bytes = per_node_bytes * nodes
    else:
        pool_bytes = math.inf
    sets = [float((m.reuse and m.reuse.footprint_gb) or 0.0) for m in per_model]
    total = sum(sets)
    replays: dict[str, ModelReplay | ModelNotReplayed] = {}
    for m, ws in zip(per_model, sets, strict=True):
        name = m.served.name
        model = m.served.catalog_id or cfg.model
        fit = fits(model, cfg.gpu, cfg.kv_dtype)
        if fit is None:
            replays[name] = ModelNotReplayed(model, f"{model} does not fit on {cfg.gpu}")
            continue
        cost, tp = fit
        bpt = int(cost.bytes_per_token)
        share = ws / total if total > 0 else 1.0 / n_models
        pool_tokens = UNBOUNDED if math.isinf(pool_bytes) else int(pool_bytes * share // bpt)
        c = dataclasses.replace(
            cfg,
            model=model,
            tp=tp,
            local_capacity_tokens=None,
            pool_capacity_tokens=pool_tokens,
            dram_capacity_tokens=None,
        )
        trace = loaded.model_part(name)
        run = run_replay if replayer is None else partial(replayer, part=name)
        sc = run(
            trace, c, scenarios=(Scenario.LOCAL, Scenario.POOLED), search_rate=False, cost=cost
        ).scenarios
        replays[name] = ModelReplay(
            model=model,
            tp=tp,
            instances=c.instances,
            pool_share=round(share, 6),
            pool_capacity_tokens=None if math.isinf(pool_bytes) else pool_tokens,
            local_hit_rate=sc[Scenario.LOCAL].hit_rate,
            pooled_hit_rate=sc[Scenario.POOLED].hit_rate,
            local_ttft_mean_s=sc[Scenario.LOCAL].ttft.mean_s,
            pooled_ttft_mean_s=sc[Scenario.POOLED].ttft.mean_s,
        )
    return dataclasses.replace(
        models,
        per_model=tuple(
            dataclasses.replace(m, replay=replays.get(m.served.name, m.replay))
            for m in models.per_model
        ),
        per_model_replay=PER_MODEL_REPLAY.format(instances=cfg.instances),
    )
