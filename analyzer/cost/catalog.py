"""The catalogs: ``models/models.toml`` and ``models/hardware.toml`` loaded once, and
models, GPUs and tiers looked up by id, alias or the names logs and clouds use.

The data files are reviewable, each entry citing its source. A catalog model entry holds
the values of the model's own Hugging Face ``config.json``, so it goes through the very
same parser as a user's (:mod:`analyzer.cost.hf_config`); the specs are
:class:`analyzer.cost.model_spec.ModelSpec` and the GPUs and tiers of
:mod:`analyzer.cost.hardware`.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from analyzer.cost.hardware import GpuSpec, TierSpec
from analyzer.cost.hf_config import spec_from_hf_config
from analyzer.cost.model_spec import ModelSpec
from analyzer.errors import InputError, Location, UsageError
from analyzer.outputs import note_input


def models_dir() -> Path:
    """Where the catalogs and fitted profiles live (``KVPOOL_MODELS_DIR`` overrides)."""
    env = os.environ.get("KVPOOL_MODELS_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "models"


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@dataclass(frozen=True, slots=True)
class _Catalog:
    models: dict[str, ModelSpec]
    gpus: dict[str, GpuSpec]
    tiers: dict[str, TierSpec]
    model_alias: dict[str, str]
    gpu_alias: dict[str, str]
    tier_alias: dict[str, str]


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise InputError(f"catalog file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"catalog file is not valid TOML: {exc}", Location(str(path))) from exc


def _tables(value: object, where: str) -> dict[str, Mapping[str, object]]:
    """A catalog table of entries (``[models."x"]``, ``[gpus.y]``) by key."""
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise InputError("expected a table of tables", Location(where))
    return value


def _text(entry: Mapping[str, object], key: str, default: str, where: str) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise InputError(f"'{key}' must be a string, got {value!r}", Location(where, None, key))
    return value


def _number(entry: Mapping[str, object], key: str, where: str) -> float:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"'{key}' must be a number, got {value!r}", Location(where, None, key))
    return float(value)


def _names(entry: Mapping[str, object], where: str) -> tuple[str, ...]:
    value = entry.get("aliases", ())
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InputError("'aliases' must be a list of strings", Location(where, None, "aliases"))
    return tuple(value)


def _aliases(key: str, names: tuple[str, ...]) -> dict[str, str]:
    out = {_norm(key): key}
    for alias in names:
        out.setdefault(_norm(alias), key)
    return out


@functools.cache
def _load(directory: str) -> _Catalog:
    root = Path(directory)
    mpath = root / "models.toml"
    mdata = _tables(_read_toml(mpath).get("models", {}), f"{mpath} [models]")
    models: dict[str, ModelSpec] = {}
    model_alias: dict[str, str] = {}
    for key, entry in mdata.items():
        where = f'{mpath} [models."{key}"]'
        for field in ("config", "total_params", "active_params", "source"):
            if field not in entry:
                raise InputError(f"catalog entry lacks '{field}'", Location(where, None, field))
        config = entry["config"]
        if not isinstance(config, dict):
            raise InputError("'config' must be a table", Location(where, None, "config"))
        aliases = _names(entry, where)
        repo = _text(entry, "hf_repo", "", where)
        models[key] = spec_from_hf_config(
            key,
            config,
            name=_text(entry, "name", key, where),
            source=_text(entry, "source", "", where),
            total_params=_number(entry, "total_params", where),
            active_params=_number(entry, "active_params", where),
            params_source=_text(entry, "params_source", "", where),
            hf_repo=repo,
            aliases=aliases,
            where=where,
            weight_dtype=_text(entry, "weight_dtype", "bf16", where),
        )
        extra = (repo, repo.split("/")[-1]) if repo else ()
        for alias, target in _aliases(key, (*aliases, *extra)).items():
            model_alias.setdefault(alias, target)
    hpath = root / "hardware.toml"
    hdata = _read_toml(hpath)
    gpus: dict[str, GpuSpec] = {}
    gpu_alias: dict[str, str] = {}
    for key, entry in _tables(hdata.get("gpus", {}), f"{hpath} [gpus]").items():
        where = f"{hpath} [gpus.{key}]"
        gpus[key] = GpuSpec(
            id=key,
            name=_text(entry, "name", key, where),
            vendor=_text(entry, "vendor", "", where),
            bf16_tflops=_number(entry, "bf16_tflops", where),
            fp8_tflops=_number(entry, "fp8_tflops", where) if "fp8_tflops" in entry else None,
            hbm_gib=_number(entry, "hbm_gib", where),
            hbm_tbps=_number(entry, "hbm_tbps", where),
            source=_text(entry, "source", "", where),
            aliases=_names(entry, where),
            fp4_tflops=_number(entry, "fp4_tflops", where) if "fp4_tflops" in entry else None,
            interconnect_gbps=(
                _number(entry, "interconnect_gbps", where) if "interconnect_gbps" in entry else 0.0
            ),
        )
        gpu_alias.update(_aliases(key, _names(entry, where)))
    tiers: dict[str, TierSpec] = {}
    tier_alias: dict[str, str] = {}
    for key, entry in _tables(hdata.get("tiers", {}), f"{hpath} [tiers]").items():
        where = f"{hpath} [tiers.{key}]"
        tiers[key] = TierSpec(
            name=key,
            bandwidth_gbps=_number(entry, "bandwidth_gbps", where),
            latency_s=_number(entry, "latency_s", where),
            kind=_text(entry, "kind", "network", where),
            description=_text(entry, "description", "", where),
            source=_text(entry, "source", "", where),
            aliases=_names(entry, where),
        )
        tier_alias.update(_aliases(key, _names(entry, where)))
    return _Catalog(models, gpus, tiers, model_alias, gpu_alias, tier_alias)


def _catalog() -> _Catalog:
    return _load(str(models_dir()))


def _unknown(kind: str, name: str, names: list[str], listing: str) -> UsageError:
    close = difflib.get_close_matches(_norm(name), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return UsageError(f"unknown {kind} '{name}'", hint=f"{hint}`{listing}` lists them all")


def _suggestions(alias_map: dict[str, str]) -> list[str]:
    return sorted(set(alias_map) | set(alias_map.values()))


# What served names add to a model's name: its variant (-Instruct, -chat) and the
# quantization of the checkpoint, as Hugging Face repositories name them (-FP8,
# -FP8-Dynamic, -AWQ, -GPTQ-Int4, -W8A8, -NVFP4, ...), and a release date (-2507).
_VARIANT_SUFFIXES = ("-instruct", "-it", "-chat", "-hf", "-base")
# suffix -> the weights precision the cost model can price it at (None: kept as the
# catalog's, since the cost model has no integer weight formats)
_QUANT_SUFFIXES: dict[str, str | None] = {
    "-fp8-dynamic": "fp8",
    "-fp8": "fp8",
    "-nvfp4": "fp4",
    "-mxfp4": "fp4",
    "-fp4": "fp4",
    "-bf16": None,
    "-fp16": None,
    "-awq": None,
    "-gptq-int4": None,
    "-gptq-int8": None,
    "-gptq": None,
    "-int4": None,
    "-int8": None,
    "-w8a8": None,
    "-w4a16": None,
    "-gguf": None,
}
_DATE_SUFFIX = re.compile(r"-\d{4}$")


def _suffixes(key: str) -> tuple[str, list[str]]:
    """``key`` without its variant, quantization and date suffixes (any order, any
    number of them), and the quantization suffixes it had."""
    quant: list[str] = []
    while True:
        for suffix in (*_QUANT_SUFFIXES, *_VARIANT_SUFFIXES):
            if key.endswith(suffix) and len(key) > len(suffix):
                if suffix in _QUANT_SUFFIXES:
                    quant.append(suffix)
                key = key[: -len(suffix)]
                break
        else:
            m = _DATE_SUFFIX.search(key)
            if m is None or m.start() == 0:
                return key, quant
            key = key[: m.start()]


def _strip_suffixes(key: str) -> str:
    return _suffixes(key)[0]


def quantization_of(served_name: str) -> str | None:
    """The weights precision a served name's quantization suffix stands for (``fp8`` for
    ``Qwen/Qwen3-32B-FP8``), None when it has none the cost model prices differently."""
    _, quant = _suffixes(_norm(served_name).split("/")[-1])
    for q in quant:
        if _QUANT_SUFFIXES[q] is not None:
            return _QUANT_SUFFIXES[q]
    return None


def model_from_config_file(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` on disk."""
    p = Path(path)
    note_input(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InputError(f"model config not found: {p}") from exc
    except OSError as exc:
        raise InputError(f"cannot read model config {p}: {exc}") from exc
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", Location(str(p), exc.lineno)) from exc
    if not isinstance(cfg, dict):
        raise InputError("a config.json must hold a JSON object", Location(str(p), 1))
    model_id = cfg.get("_name_or_path") or (p.parent.name if p.parent.name else p.stem)
    return spec_from_hf_config(
        _norm(str(model_id).split("/")[-1]) or "custom",
        cfg,
        name=str(model_id),
        source=str(p),  # a profile rebuilds the model from it (CostModel.model_ref)
        where=str(p),
    )


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog model by id or alias (case-insensitive), or a ``config.json`` path."""
    text = str(name_or_path)
    if text.endswith(".json") or Path(text).is_file():
        return model_from_config_file(text)
    if Path(text).is_dir():  # a downloaded model directory
        return model_from_config_file(Path(text) / "config.json")
    cat = _catalog()
    key = _norm(text)
    target = cat.model_alias.get(key) or cat.model_alias.get(_strip_suffixes(key))
    if target is None:
        raise _unknown("model", text, _suggestions(cat.model_alias), "kvpool cost models")
    return cat.models[target]


def recognize_model(served_name: str) -> str | None:
    """The catalog id a served model name stands for, or None.

    Gateway logs name the model as the engine serves it: a Hugging Face repo
    (``meta-llama/Llama-3.1-70B-Instruct``), its last part, a catalog alias or a
    variant with a suffix (``-Instruct``, ``-FP8``). Paths are not names: never read.
    """
    cat = _catalog()
    key = _norm(served_name)
    for k in (key, key.split("/")[-1]):
        target = cat.model_alias.get(k) or cat.model_alias.get(_strip_suffixes(k))
        if target is not None:
            return target
    return None


# Words in a GPU's name that make it another product than the catalog's SXM part of
# the same family (a PCIe card or an NVL board has other memory, clocks and links).
_OTHER_FORM = {"pcie", "nvl", "40gb"}


def recognize_gpu(name: str) -> str | None:
    """The catalog id a GPU name stands for, as vendors and clouds write them: the id or
    an alias (``H100-SXM``, ``h100_sxm``, ``p5.48xlarge``), or a name holding one as a
    word (``NVIDIA H100 80GB HBM3``, ``gpu_8x_h100_sxm5``); None for another form of the
    chip (``H100 PCIe``, ``H100 NVL``) or a GPU the catalog does not hold."""
    cat = _catalog()
    key = _norm(name)
    for k in (key, key.removeprefix("nvidia-"), key.removeprefix("amd-")):
        if k in cat.gpu_alias:
            return cat.gpu_alias[k]
    words = [w for w in re.split(r"[-.]", key) if w]
    if _OTHER_FORM & set(words):
        return None
    found = {cat.gpu_alias[w] for w in words if w in cat.gpu_alias}
    return found.pop() if len(found) == 1 else None


def get_gpu(name: str) -> GpuSpec:
    """A catalog GPU by id or alias (case-insensitive): ``h100``, ``H100-SXM``, ``mi300x``,
    or a name as vendors and clouds write it (:func:`recognize_gpu`)."""
    cat = _catalog()
    target = recognize_gpu(name)
    if target is None:
        raise _unknown("GPU", name, _suggestions(cat.gpu_alias), "kvpool cost gpus")
    return cat.gpus[target]


def get_tier(name: str) -> TierSpec:
    """A catalog tier or link by name or alias: ``rdma-200``, ``pcie-gen5-dram``, ``nvme-gen4``."""
    cat = _catalog()
    target = cat.tier_alias.get(_norm(name))
    if target is None:
        raise _unknown("tier", name, _suggestions(cat.tier_alias), "kvpool cost gpus")
    return cat.tiers[target]


def list_models() -> list[ModelSpec]:
    return [m for _, m in sorted(_catalog().models.items())]


def list_gpus() -> list[GpuSpec]:
    return [g for _, g in sorted(_catalog().gpus.items())]


def list_tiers() -> list[TierSpec]:
    """Tiers in catalog order (fastest local first, as the data file lists them)."""
    return list(_catalog().tiers.values())
