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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from analyzer.advisor.words import listed
from analyzer.cost import get_model, recognize_model
from analyzer.cost.catalog import quantization_of
from analyzer.errors import UsageError
from analyzer.reuse import analyze_reuse
from analyzer.trace import read_metadata

if TYPE_CHECKING:
    from analyzer.ingest.options import LoadedTrace
    from analyzer.reuse.records import CurvePoint, ReuseOptions

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
    knee_tokens: int = 0  # smallest LRU capacity reaching 90 % of its ceiling


@dataclass(frozen=True, slots=True)
class ModelFigures:
    """One model a log names: its traffic and, when the log names several, its own
    reuse and replay (a log naming one model has the overall figures only)."""

    served: ServedModel
    reuse: ModelReuse | None = None  # None: the log's only model (same as overall)

    def to_json(self) -> dict[str, object]:
        m = self.served
        out: dict[str, object] = {
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
            knee_tokens=r.knee_tokens,
            hit_ratio_curve=[p.to_json() for p in r.hit_ratio_curve],
        )
        return out


@dataclass(frozen=True, slots=True)
class ModelsFigures:
    """The models a log names (the ``models`` section of ``report.json`` and of
    ``kvpool reuse --json``)."""

    count: int
    block_key_includes_model: bool
    per_model: tuple[ModelFigures, ...]
    warning: str | None = None  # --model names none of the log's models

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "count": self.count,
            "block_key_includes_model": self.block_key_includes_model,
            "per_model": [m.to_json() for m in self.per_model],
        }
        if self.count > 1:
            doc["shared_pool_note"] = SHARED_POOL_NOTE
        if self.warning is not None:
            doc["warning"] = self.warning
        return doc


def _recognize(name: str) -> str | None:

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


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """One model the analysis plans: the log's name for it (``""`` when the log names
    none), the catalog model or ``config.json`` it is priced as, its share of the log,
    and why this model (``how``)."""

    served_as: str
    model: str
    requests: int
    prompt_tokens: int
    how: str  # "named by the log", "--model", "the default: the log names no model"
    weights_dtype: str | None = None  # from a quantization suffix of the served name

    def to_json(self) -> dict[str, object]:
        return {
            "served_as": self.served_as,
            "model": _shown_model(self.model),
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "how": self.how,
            "weights_dtype": self.weights_dtype,
        }


def _shown_model(model: str) -> str:
    """A model as outputs name it: a config.json by its folder's name, never its path."""

    if model.lower().endswith(".json"):
        p = Path(model)
        return p.parent.name or p.stem
    return model


def choose_models(
    named: list[ServedModel],
    *,
    model: str,
    model_given: bool,
    only_model: str | None,
    weights_dtype: str | None = None,
) -> tuple[ModelChoice, ...]:
    """The models to plan, most requests first: each model the log names as itself
    (matched to the catalog by alias, served name and quantization suffix), unless
    ``--model`` names one (allowed for a log naming at most one model, or with
    ``--only-model``); a log naming none is planned as ``model``.

    A model the catalog does not know is a usage error naming every such model, with
    the way to give its config."""

    if model_given:
        if len(named) > 1 and only_model is None:
            raise UsageError(
                f"--model {_shown_model(model)} names one model, but the log names "
                f"{len(named)}: {listed([m.name for m in named])}",
                hint="add --only-model NAME to plan one of them as --model, or leave "
                "--model out to plan each as itself",
            )
        m = named[0] if named else None
        return (
            ModelChoice(
                m.name if m else "",
                model,
                m.requests if m else 0,
                m.prompt_tokens if m else 0,
                "--model",
                weights_dtype,
            ),
        )
    if not named:
        return (ModelChoice("", model, 0, 0, "the default: the log names no model", weights_dtype),)
    unknown = [m.name for m in named if m.catalog_id is None]
    if unknown:
        raise UsageError(
            f"the log names {'a model' if len(unknown) == 1 else 'models'} kvpool's catalog "
            f"does not know: {listed(unknown)}",
            hint="give its Hugging Face config with --model path/to/config.json (with "
            "--only-model NAME when the log names several), or see `kvpool cost models`",
        )
    return tuple(
        ModelChoice(
            m.name,
            m.catalog_id or model,
            m.requests,
            m.prompt_tokens,
            "named by the log",
            weights_dtype or quantization_of(m.name),
        )
        for m in named
    )


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


def select_model(loaded: LoadedTrace, wanted: str) -> LoadedTrace:
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
    return dataclasses.replace(loaded, table=table, _trace=None, _read=None, _parts={})


def per_model_reuse(
    loaded: LoadedTrace, opts: ReuseOptions, kv_dtype: str = "bf16"
) -> list[ModelFigures]:
    """Per model the log names: requests, tokens, reuse ceilings, the exact LRU hit-ratio
    curve and, for a catalog model, its KV bytes per token and working set in GB.

    ``opts`` is the :class:`analyzer.reuse.ReuseOptions` of the whole run (its
    ``bytes_per_token`` is replaced by each model's own)."""
    out: list[ModelFigures] = []
    for m in served_models(loaded.table):
        trace = loaded.read_part(m.name)  # as read, not keyed by --isolation
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
                    knee_tokens=int(rep.knee_tokens(0.9)) if rep.measurable else 0,
                ),
            )
        )
    return out


def models_document(
    loaded: LoadedTrace, opts: ReuseOptions, kv_dtype: str = "bf16", warning: str | None = None
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
