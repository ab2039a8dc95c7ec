"""The products' own config loaders, and schemas written from the products' source
where the loader cannot be installed without a GPU stack.

Loaders (installed by ``.ci/run`` from ``tests/product-loaders.txt`` with ``--no-deps``):

* Mooncake: ``mooncake/mooncake_config.py`` (``MooncakeConfig.from_file``) of
  mooncake-transfer-engine-non-cuda 0.3.13.post1; standard library only.
* LMCache: ``lmcache/v1/config.py`` (``LMCacheEngineConfig.from_file`` /
  ``from_env``) of lmcache 0.5.6; needs PyYAML and requests.
* SGLang: ``sglang/srt/arg_groups/arg_utils.py`` (``add_cli_args_from_dataclass``, the
  builder of SGLang's own argparse options) over the ``Memory`` and ``Parallel`` field
  groups of sglang 0.5.23; needs msgspec.

Each is loaded by file with its parent packages as bare namespace modules: the
packages' ``__init__`` import torch (and LMCache's and SGLang's Mooncake config classes
live in modules that import torch at the top), the config modules do not.

Schemas (``VLLM_*``, ``SGLANG_MOONCAKE``, ``LMCACHE_039_MOONCAKE``, ``AIPERF_MOONCAKE``)
restate what a loader reads, at the version named, for the loaders that import torch or
a large runtime (vLLM, SGLang's Mooncake store, AIPerf's dataset models).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

# In CI the loaders must be there: a missing install is a failure, not a skip.
REQUIRED = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _package_dir(name: str) -> Path | None:
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__kvpool_stub__", False):
        return Path(loaded.__path__[0])
    spec = importlib.util.find_spec(name)  # finds without importing the package
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def load(module: str):  # type: ignore[no-untyped-def]
    """Import ``module`` with each parent package as a bare namespace (no ``__init__``)."""
    if module in sys.modules:
        return sys.modules[module]
    top = module.split(".")[0]
    root = _package_dir(top)
    if root is None:
        msg = f"{top} is not installed (pip install --no-deps -r tests/product-loaders.txt)"
        if REQUIRED:
            pytest.fail(msg)
        pytest.skip(msg)
    parts = module.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name in sys.modules:
            continue
        stub = types.ModuleType(name)
        stub.__path__ = [str(root.joinpath(*parts[1:i]))]
        stub.__kvpool_stub__ = True  # type: ignore[attr-defined]
        sys.modules[name] = stub
    return importlib.import_module(module)


def mooncake_config():  # type: ignore[no-untyped-def]
    return load("mooncake.mooncake_config").MooncakeConfig


def lmcache_engine_config():  # type: ignore[no-untyped-def]
    return load("lmcache.v1.config").LMCacheEngineConfig


def sglang_parser():  # type: ignore[no-untyped-def]
    """SGLang 0.5.23's argparse options for the memory (HiCache) and parallel groups,
    built by SGLang's own ``add_cli_args_from_dataclass``."""
    import argparse

    utils = load("sglang.srt.arg_groups.arg_utils")
    memory = load("sglang.srt.arg_groups.fields.memory").Memory
    parallel = load("sglang.srt.arg_groups.fields.parallel").Parallel
    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    utils.add_cli_args_from_dataclass(parser, memory)
    utils.add_cli_args_from_dataclass(parser, parallel)
    return parser


# -- schemas written from the products' source ---------------------------------------------


class SchemaError(ValueError):
    pass


# vLLM main (2026-12), vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/
# worker.py, MooncakeStoreConfig.from_file and __post_init__: every key has a default in
# from_file, but metadata_server and master_server_address default to "" (no store to
# reach), mode must be embedded | standalone-store, local_buffer_size > 0, and
# global_segment_size > 0 in embedded mode and == 0 in standalone-store mode. Sizes are
# ints or "<number>[gb|mb|kb|b]" with GB = 2^30.
VLLM_MOONCAKE_STORE = {
    "needs_non_empty": ("metadata_server", "master_server_address"),
    "modes": ("embedded", "standalone-store"),
}


def vllm_size(value: object) -> int:
    if isinstance(value, bool):
        raise SchemaError(f"size {value!r} is a bool")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise SchemaError(f"size {value!r} is neither an int nor a string")
    import re

    m = re.fullmatch(r"\s*([\d.]+)\s*(gb|mb|kb|b)?\s*", value.strip().lower())
    if not m:
        raise SchemaError(f"invalid size {value!r}")
    mult = {"gb": 2**30, "mb": 2**20, "kb": 2**10, "b": 1}[m.group(2) or "b"]
    return int(float(m.group(1)) * mult)


def check_vllm_mooncake_store(cfg: dict) -> dict:
    for k in VLLM_MOONCAKE_STORE["needs_non_empty"]:
        if not str(cfg.get(k, "")).strip():
            raise SchemaError(f"vLLM MooncakeStoreConfig: {k} missing or empty")
    mode = cfg.get("mode", "embedded")
    if mode not in VLLM_MOONCAKE_STORE["modes"]:
        raise SchemaError(f"unknown Mooncake mode {mode!r}")
    seg = vllm_size(cfg.get("global_segment_size", 4 * 2**30))
    buf = vllm_size(cfg.get("local_buffer_size", 4 * 2**30))
    if buf <= 0:
        raise SchemaError("local_buffer_size must be > 0")
    if mode == "embedded" and seg == 0:
        raise SchemaError("embedded mode requires global_segment_size > 0")
    if mode == "standalone-store" and seg != 0:
        raise SchemaError("standalone-store mode requires global_segment_size == 0")
    return {"mode": mode, "global_segment_size": seg, "local_buffer_size": buf}


# vLLM main (2026-12), vllm/v1/kv_offload/cpu/spec.py, CPUOffloadingSpec:
# kv_connector_extra_config.cpu_bytes_to_use is required (no default; a falsy value
# raises) and is divided by the KV bytes of an offloaded block over all world_size
# workers, so it is the instance's total. block_size (optional) is the offloaded block
# in tokens, a multiple of the engine's --block-size.
def check_vllm_offloading(kv: dict, engine_block: int) -> dict:
    if kv.get("kv_connector") != "OffloadingConnector":
        raise SchemaError("kv_connector is not OffloadingConnector")
    extra = kv.get("kv_connector_extra_config") or {}
    cpu = extra.get("cpu_bytes_to_use")
    if not cpu:
        raise SchemaError("cpu_bytes_to_use must be specified in kv_connector_extra_config")
    block = int(extra.get("block_size", engine_block))
    if block % engine_block:
        raise SchemaError(f"offloaded block {block} is not a multiple of {engine_block}")
    return {"cpu_bytes_to_use": int(cpu), "block_size": block}


# LMCache 0.3.9.post2, lmcache/v1/storage_backend/connector/mooncakestore_connector.py,
# MooncakeStoreConfig.load_from_lmcache_config: extra_config["local_hostname"],
# ["metadata_server"] and ["master_server_address"] are read without a default (KeyError
# at start-up); global_segment_size and local_buffer_size go to Mooncake's positional
# setup() as they are, so they must be integers (bytes).
LMCACHE_039_MOONCAKE = {
    "required": ("local_hostname", "metadata_server", "master_server_address"),
    "int_sizes": ("global_segment_size", "local_buffer_size"),
}


def check_lmcache_039_mooncake(extra: dict | None) -> None:
    if extra is None:
        raise SchemaError("The extra config is not set.")
    for k in LMCACHE_039_MOONCAKE["required"]:
        if k not in extra:
            raise SchemaError(f"extra_config[{k!r}]: KeyError in LMCache 0.3.9")
    for k in LMCACHE_039_MOONCAKE["int_sizes"]:
        if k in extra and (isinstance(extra[k], bool) or not isinstance(extra[k], int)):
            raise SchemaError(f"extra_config[{k!r}] must be an integer byte count")


# SGLang 0.5.23, python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py,
# MooncakeStoreConfig.load_from_extra_config: master_server_address (or
# client_server_address) is required; global_segment_size is an int or "<int>gb"
# (GiB; a decimal before "gb" fails int()), and MooncakeStore divides it by the
# server's tp_size * pp_size per rank. local_hostname comes from MOONCAKE_LOCAL_HOSTNAME
# or LOCAL_HOSTNAME first (default "localhost").
def sglang_segment(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        s = value.strip().lower()
        if s.endswith("gb"):
            return int(s[:-2].strip()) * 2**30
        return int(s)
    raise SchemaError(f"global_segment_size {value!r}")


def check_sglang_mooncake(extra: dict) -> dict:
    if "master_server_address" not in extra and "client_server_address" not in extra:
        raise SchemaError(
            "Either master_server_address or client_server_address is required in extra_config"
        )
    try:
        seg = sglang_segment(extra.get("global_segment_size", "4gb"))
    except ValueError as exc:
        raise SchemaError(str(exc)) from exc
    return {"global_segment_size": seg}


# AIPerf 0.13.0, aiperf/dataset/loader/models.py, MooncakeTrace: exactly one of
# input_length | text_input | messages | payload; hash_ids only with input_length;
# optional output_length (int), hash_ids (list of int), timestamp and delay (ms, int or
# float), session_id (str: pydantic 2 does not turn an int into a str), extra (dict).
# AIPerfBaseModel allows unknown keys.
AIPERF_MOONCAKE = {
    "modes": ("input_length", "text_input", "messages", "payload"),
    "types": {
        "input_length": (int,),
        "text_input": (str,),
        "messages": (list,),
        "payload": (dict,),
        "output_length": (int,),
        "hash_ids": (list,),
        "timestamp": (int, float),
        "delay": (int, float),
        "session_id": (str,),
        "extra": (dict,),
        "tools": (list,),
        "type": (str,),
    },
}


def check_aiperf_mooncake(rec: dict) -> None:
    types_ = AIPERF_MOONCAKE["types"]
    for k, v in rec.items():
        if k not in types_ or v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, types_[k]):
            raise SchemaError(f"{k}: {v!r} is not {types_[k]}")
    modes = [m for m in AIPERF_MOONCAKE["modes"] if rec.get(m) is not None]
    if len(modes) != 1:
        raise SchemaError(f"exactly one input mode required, got {modes}")
    if rec.get("hash_ids") is not None:
        if rec.get("input_length") is None:
            raise SchemaError("'hash_ids' is only allowed with 'input_length'")
        if not all(isinstance(h, int) and not isinstance(h, bool) for h in rec["hash_ids"]):
            raise SchemaError("hash_ids must be integers")
