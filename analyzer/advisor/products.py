"""Translate a sizing into the settings of the products a team would deploy.

Option names and config keys were checked against each product's source and
documentation at the versions in :data:`DOCS_CHECKED` (also in docs/products.md, in
every report and in every file of the report's ``deploy/`` folder); the translator
emits only those names. Every size comes from :func:`analyzer.advisor.sizing.unit_sizes`
(one sizing record, split per process the way each product allocates it) and is
written the way the product reads it:

* Mooncake ``global_segment_size`` / ``local_buffer_size``: integer bytes. Mooncake,
  vLLM and SGLang all parse a ``"GB"`` suffix as 2^30 bytes, and SGLang only takes a
  whole number before it, so a plain byte count is the one form every loader reads
  the same way.
* LMCache ``max_local_cpu_size``: GiB (LMCache allocates ``size * 1024**3`` bytes),
  per GPU rank.
* vLLM ``cpu_bytes_to_use``: bytes, per instance (the offloading spec divides it over
  the instance's workers).
* SGLang ``--hicache-size``: a whole number of GB (10^9 bytes) per rank.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from analyzer.advisor.figures import DeployOption, Verdict
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import GB, STAGING_PER_RANK_BYTES, Sizing, unit_sizes
from analyzer.advisor.words import count
from analyzer.quoting import shell

# Products' versions and the sources the names and semantics were checked against.
DOCS_CHECKED: tuple[dict[str, str], ...] = (
    {
        "product": "vLLM",
        "version": "v0.28 to main of 2026-12 (docs of v0.21, v0.28 and latest; main source; "
        "before v0.28 the Mooncake config has no `mode`: embedded only)",
        "pages": "https://docs.vllm.ai/en/latest/features/mooncake_store_connector_usage/ ; "
        "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py "
        "(MooncakeStoreConfig.from_file) ; vllm/v1/kv_offload/cpu/spec.py "
        "(CPUOffloadingSpec: cpu_bytes_to_use required, divided over world_size) ; "
        "https://docs.vllm.ai/en/stable/features/kv_offloading_usage/",
        "options": "--enable-prefix-caching, --block-size, --tensor-parallel-size, "
        "--kv-transfer-config {kv_connector: OffloadingConnector | LMCacheConnectorV1 | "
        "MooncakeStoreConnector, kv_role: kv_both, kv_connector_extra_config: {block_size, "
        "cpu_bytes_to_use}}, MOONCAKE_CONFIG_PATH, LMCACHE_CONFIG_FILE",
    },
    {
        "product": "LMCache",
        "version": "0.3.9 to 0.5.6 (source of 0.5.6: lmcache/v1/config.py, "
        "v1/storage_backend/connector/mooncakestore_connector.py; 0.3.9.post2 reads "
        "local_hostname, metadata_server, master_server_address without a default)",
        "pages": "https://docs.lmcache.ai/api_reference/configurations.html ; "
        "https://docs.lmcache.ai/kv_cache/storage_backends/mooncake.html ; "
        "https://github.com/LMCache/LMCache/issues/2901 (max_local_cpu_size is per TP rank)",
        "options": "chunk_size, local_cpu, max_local_cpu_size (GiB per rank), remote_url "
        "(mooncakestore://host:port/), remote_serde, extra_config {local_hostname, "
        "metadata_server, master_server_address, global_segment_size, local_buffer_size, "
        "protocol, device_name}; env form LMCACHE_<KEY>, LMCACHE_EXTRA_CONFIG (JSON)",
    },
    {
        "product": "Mooncake Store",
        "version": "mooncake-transfer-engine 0.3.13.post1 (mooncake/mooncake_config.py)",
        "pages": "https://github.com/kvcache-ai/Mooncake (mooncake_config.py: MooncakeConfig, "
        "required local_hostname, metadata_server, master_server_address) ; "
        "https://docs.vllm.ai/en/latest/features/mooncake_store_connector_usage/",
        "options": "local_hostname, metadata_server, master_server_address, "
        "global_segment_size, local_buffer_size, protocol (rdma | tcp), device_name, mode "
        "(embedded | standalone-store); mooncake_master --rpc_port",
    },
    {
        "product": "SGLang HiCache",
        "version": "sglang 0.5.23 (srt/mem_cache/storage/mooncake_store/mooncake_store.py, "
        "srt/arg_groups/fields/memory.py; earlier releases not checked)",
        "pages": "https://docs.sglang.io/advanced_features/hicache_best_practices.html ; "
        "https://docs.sglang.io/advanced_features/hicache_storage_runtime_attach_detach.html",
        "options": "--page-size, --tp, --enable-hierarchical-cache, --hicache-ratio, "
        "--hicache-size (int GB per rank), --hicache-write-policy, --hicache-storage-backend, "
        "--hicache-storage-backend-extra-config {master_server_address, metadata_server, "
        "global_segment_size, protocol, device_name}; MOONCAKE_LOCAL_HOSTNAME",
    },
)

VLLM_BLOCK_SIZES = (8, 16, 32, 64, 128)  # CUDA paged-attention block sizes

# Placeholder each node replaces with its own address before start-up (launch.sh does it
# with sed; the Kubernetes form takes the pod IP): Mooncake needs a reachable hostname.
NODE_IP = "@NODE_IP@"
# A folder on the node's local NVMe, filled in the same way (NVME_DIR).
NVME_DIR = "@NVME_DIR@"


@dataclass(frozen=True, slots=True)
class Wiring:
    """Where the pool lives and how nodes reach it (the same for every product)."""

    master: str = "mooncake-master:50051"
    protocol: str = "rdma"
    metadata_server: str = "P2PHANDSHAKE"  # peer-to-peer handshake: no etcd/HTTP needed
    device_name: str = ""  # RDMA devices auto-detected; pin NICs by naming them

    @property
    def pool_url(self) -> str:
        return f"mooncakestore://{self.master}/"


@dataclass(frozen=True, slots=True)
class Setting:
    option: str
    value: str
    why: str


@dataclass(frozen=True, slots=True)
class ProductSettings:
    product: str
    mode: DeployOption
    settings: tuple[Setting, ...]
    snippet: str  # ready-to-paste command line or config file
    snippet_lang: str  # "bash" | "yaml" | "json"

    def to_json(self) -> dict[str, object]:
        return {
            "product": self.product,
            "mode": self.mode,
            "settings": [
                {"option": s.option, "value": s.value, "why": s.why} for s in self.settings
            ],
            "snippet": self.snippet,
            "snippet_lang": self.snippet_lang,
        }


def mode_for(verdict: str) -> DeployOption:
    modes: dict[str, DeployOption] = {
        Verdict.DEPLOY_POOLED: DeployOption.POOLED,
        Verdict.LOCAL_OFFLOAD_ONLY: DeployOption.LOCAL_OFFLOAD,
    }
    return modes.get(verdict, DeployOption.PREFIX_CACHE_ONLY)


def runner_up(mode: DeployOption) -> DeployOption:
    """The option next in line: what to deploy if the recommended one is turned down
    (the pool -> a DRAM tier per node; a DRAM tier -> the pool; the HBM prefix cache
    alone -> a DRAM tier, the cheaper step)."""
    return {
        DeployOption.POOLED: DeployOption.LOCAL_OFFLOAD,
        DeployOption.LOCAL_OFFLOAD: DeployOption.POOLED,
    }.get(mode, DeployOption.LOCAL_OFFLOAD)


def _unit(sz: Sizing, mode: DeployOption, key: str) -> int:
    return next(u for u in unit_sizes(sz, mode) if u.key == key).written_bytes


def _gib_text(n_bytes: int) -> str:
    """GiB for LMCache, exact to the MiB (k / 1024 prints exactly)."""
    mib = -(-n_bytes // 2**20)
    return repr(max(1, mib) / 1024)


def _fmt(n_bytes: float) -> str:
    return f"{n_bytes / GB:.3g} GB"


# -- the product configs (the files in deploy/ and the report's snippets) ------------------


class MooncakeStoreConfig(TypedDict):
    """vLLM MooncakeStoreConnector's ``MOONCAKE_CONFIG_PATH`` file."""

    mode: Literal["standalone-store", "embedded"]
    local_hostname: str
    metadata_server: str
    master_server_address: str
    global_segment_size: int  # bytes
    local_buffer_size: int  # bytes
    protocol: str
    device_name: str


class LMCacheMooncake(TypedDict):
    """LMCache's ``extra_config`` for its Mooncake remote."""

    local_hostname: str
    metadata_server: str
    master_server_address: str
    global_segment_size: int  # bytes
    local_buffer_size: int  # bytes
    protocol: str
    device_name: str


class LMCacheConfig(TypedDict):
    """LMCache's engine config (``LMCACHE_CONFIG_FILE``): the remote keys when pooled,
    the disk keys with an NVMe tier."""

    chunk_size: int
    local_cpu: bool
    max_local_cpu_size: float  # GiB per GPU rank
    remote_url: NotRequired[str]
    remote_serde: NotRequired[str]
    extra_config: NotRequired[LMCacheMooncake]
    local_disk: NotRequired[str]
    max_local_disk_size: NotRequired[float]  # GiB per GPU rank


class SGLangMooncake(TypedDict):
    """SGLang's ``--hicache-storage-backend-extra-config`` for the Mooncake backend."""

    master_server_address: str
    metadata_server: str
    global_segment_size: int  # bytes per server
    protocol: str
    device_name: str


class OffloadingExtra(TypedDict):
    block_size: int
    cpu_bytes_to_use: int


class OffloadingConfig(TypedDict):
    """vLLM's ``--kv-transfer-config`` for its OffloadingConnector."""

    kv_connector: str
    kv_role: str
    kv_connector_extra_config: OffloadingExtra


def vllm_block(sz: Sizing) -> tuple[int, str]:
    block = sz.block_size_tokens
    if block in VLLM_BLOCK_SIZES:
        return block, "KV block size in tokens; the analysis used this size"
    # e.g. Mooncake traces hash 512-token blocks: vLLM's paged attention takes up to
    # 128 on CUDA, and finer blocks can only add hits to what was measured.
    return 16, (
        f"vLLM's default; the trace's {block}-token blocks are coarser than vLLM "
        "supports, so the measured hit rates are a lower bound"
    )


def mooncake_store_config(
    sz: Sizing, net: Wiring, *, standalone: bool = False
) -> MooncakeStoreConfig:
    """vLLM MooncakeStoreConnector's JSON (``MOONCAKE_CONFIG_PATH``); with
    ``local_hostname`` it also passes Mooncake's own ``MooncakeConfig.from_file``."""
    return {
        "mode": "standalone-store" if standalone else "embedded",
        "local_hostname": NODE_IP,
        "metadata_server": net.metadata_server,
        "master_server_address": net.master,
        "global_segment_size": 0
        if standalone
        else _unit(sz, DeployOption.POOLED, "vllm-mooncake-embedded"),
        "local_buffer_size": STAGING_PER_RANK_BYTES,
        "protocol": net.protocol,
        "device_name": net.device_name,
    }


def lmcache_config(sz: Sizing, mode: DeployOption, net: Wiring) -> LMCacheConfig:
    """LMCache's engine config (``LMCACHE_CONFIG_FILE``), Mooncake remote when pooled."""
    if mode == DeployOption.POOLED:
        # The pool is the DRAM tier: LMCache keeps no second copy (local_cpu false) and
        # its CPU buffer only stages transfers.
        cfg: LMCacheConfig = {
            "chunk_size": sz.chunk_size_tokens,
            "local_cpu": False,
            "max_local_cpu_size": float(_gib_text(STAGING_PER_RANK_BYTES)),
        }
        cfg["remote_url"] = net.pool_url
        cfg["remote_serde"] = "naive"
        cfg["extra_config"] = {
            "local_hostname": NODE_IP,
            "metadata_server": net.metadata_server,
            "master_server_address": net.master,
            "global_segment_size": _unit(sz, DeployOption.POOLED, "lmcache-mooncake"),
            "local_buffer_size": STAGING_PER_RANK_BYTES,
            "protocol": net.protocol,
            "device_name": net.device_name,
        }
    elif mode == DeployOption.LOCAL_OFFLOAD_NVME:
        # A host DRAM tier in front of the node's NVMe (LMCache's local disk backend):
        # each GPU rank's engine keeps its own share of both.
        cfg = {
            "chunk_size": sz.chunk_size_tokens,
            "local_cpu": True,
            "max_local_cpu_size": float(_gib_text(_unit(sz, mode, "lmcache-cpu"))),
        }
        cfg["local_disk"] = f"file://{NVME_DIR}/lmcache/"
        cfg["max_local_disk_size"] = float(_gib_text(_unit(sz, mode, "lmcache-disk")))
    else:
        cfg = {
            "chunk_size": sz.chunk_size_tokens,
            "local_cpu": True,
            "max_local_cpu_size": float(
                _gib_text(_unit(sz, DeployOption.LOCAL_OFFLOAD, "lmcache-cpu"))
            ),
        }
    return cfg


def sglang_file_env(sz: Sizing) -> dict[str, str]:
    """SGLang HiCache's file storage backend (``--hicache-storage-backend file``): its
    folder and each rank's cap on the files it keeps, in bytes."""
    return {
        "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": f"{NVME_DIR}/hicache",
        "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": str(
            _unit(sz, DeployOption.LOCAL_OFFLOAD_NVME, "sglang-file")
        ),
    }


def sglang_extra_config(sz: Sizing, net: Wiring) -> SGLangMooncake:
    """``--hicache-storage-backend-extra-config`` for the Mooncake L3 backend."""
    return {
        "master_server_address": net.master,
        "metadata_server": net.metadata_server,
        "global_segment_size": _unit(sz, DeployOption.POOLED, "sglang-mooncake"),
        "protocol": net.protocol,
        "device_name": net.device_name,
    }


def sglang_host_gb(sz: Sizing, mode: DeployOption) -> int:
    """``--hicache-size``: whole GB per rank (the pool's staging when pooled)."""
    if mode == DeployOption.POOLED:
        return -(-STAGING_PER_RANK_BYTES // GB)
    return _unit(sz, mode, "sglang-hicache") // GB


def sglang_page(sz: Sizing) -> int:
    return 64 if sz.chunk_size_tokens >= 64 else sz.block_size_tokens


def vllm_offload_config(sz: Sizing) -> OffloadingConfig:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "block_size": sz.chunk_size_tokens,
            "cpu_bytes_to_use": _unit(sz, DeployOption.LOCAL_OFFLOAD, "vllm-offloading"),
        },
    }


def _kv(cfg: Mapping[str, object]) -> str:
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


# -- settings tables for the report -------------------------------------------------------


def vllm_settings(sz: Sizing, mode: DeployOption, model: ServedModel, tp: int) -> ProductSettings:
    block, why = vllm_block(sz)
    s = [
        Setting("--enable-prefix-caching", "on", "automatic prefix caching in HBM (the baseline)"),
        Setting("--block-size", str(block), why),
    ]
    cmd = [
        f"vllm serve {model.arg}",
        f"--tensor-parallel-size {tp}",
        "--enable-prefix-caching",
        f"--block-size {block}",
    ]
    if mode == DeployOption.LOCAL_OFFLOAD:
        cfg = vllm_offload_config(sz)
        cpu = cfg["kv_connector_extra_config"]["cpu_bytes_to_use"]
        s.append(
            Setting(
                "--kv-transfer-config",
                _kv(cfg),
                f"offload KV to {_fmt(cpu)} of pinned host DRAM per instance "
                f"({sz.dram_per_node_gb:.3g} GB per node of {count(sz.instances_per_node, 'instance')})",
            )
        )
        cmd.append(f"--kv-transfer-config {shell(_kv(cfg))}")
    elif mode == DeployOption.LOCAL_OFFLOAD_NVME:
        connector = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        s += [
            Setting(
                "LMCACHE_CONFIG_FILE",
                "lmcache.yaml",
                "LMCache holds the host DRAM and NVMe tiers (see LMCache below); vLLM's own "
                "OffloadingConnector is written for host DRAM only here",
            ),
            Setting("--kv-transfer-config", _kv(connector), "LMCache as the offload connector"),
        ]
        cmd.insert(0, "LMCACHE_CONFIG_FILE=lmcache.yaml")
        cmd.append(f"--kv-transfer-config {shell(_kv(connector))}")
    elif mode == DeployOption.POOLED:
        connector = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
        s += [
            Setting(
                "MOONCAKE_CONFIG_PATH",
                "mooncake.json",
                "the connector reads the sized Mooncake Store config from this file "
                "(required; see Mooncake Store below)",
            ),
            Setting(
                "--kv-transfer-config",
                _kv(connector),
                "Mooncake Store as the shared pool; LMCacheConnectorV1 with LMCache's "
                "Mooncake remote is the alternative (deploy/pooled/vllm-lmcache-mooncake)",
            ),
        ]
        cmd.insert(0, "MOONCAKE_CONFIG_PATH=mooncake.json")
        cmd.append(f"--kv-transfer-config {shell(_kv(connector))}")
    return ProductSettings("vLLM", mode, tuple(s), " \\\n  ".join(cmd), "bash")


def lmcache_settings(sz: Sizing, mode: DeployOption, net: Wiring) -> ProductSettings:
    if mode == DeployOption.PREFIX_CACHE_ONLY:
        chunk_only = (
            Setting("chunk_size", str(sz.chunk_size_tokens), sz.block_size_reason),
            Setting("(not deployed)", "-", "the verdict does not call for LMCache"),
        )
        return ProductSettings(
            "LMCache", mode, chunk_only, f"chunk_size: {sz.chunk_size_tokens}", "yaml"
        )
    cfg = lmcache_config(sz, mode, net)
    rows = [Setting("chunk_size", str(cfg["chunk_size"]), sz.block_size_reason)]
    if mode == DeployOption.POOLED:
        seg = cfg["extra_config"]["global_segment_size"]
        rows += [
            Setting("local_cpu", "false", "the pool is the DRAM tier: no second copy per rank"),
            Setting(
                "max_local_cpu_size",
                f"{cfg['max_local_cpu_size']:g}",
                "GiB per GPU rank: LMCache's CPU buffer stages pool transfers",
            ),
            Setting("remote_url", cfg["remote_url"], "the cluster-wide pool (Mooncake Store)"),
            Setting(
                "remote_serde",
                "naive",
                "no compression: the pool link is fast enough "
                "(cachegen trades GPU time for bytes on slow links)",
            ),
            Setting(
                "extra_config.global_segment_size",
                str(seg),
                f"bytes each GPU rank adds to the pool ({_fmt(seg)}; pool "
                f"{sz.pool_capacity_gb:.3g} GB / {sz.ranks} ranks)",
            ),
            Setting(
                "extra_config.local_hostname",
                NODE_IP,
                "each node's own address (read without a default by LMCache before 0.5)",
            ),
            Setting("extra_config.master_server_address", net.master, "mooncake_master's RPC port"),
        ]
    else:
        rows += [
            Setting("local_cpu", "true", "keep a host-DRAM copy of KV chunks"),
            Setting(
                "max_local_cpu_size",
                f"{cfg['max_local_cpu_size']:g}",
                f"GiB of host DRAM per GPU rank ({sz.dram_per_node_gb:.3g} GB per node / "
                f"{sz.ranks_per_node} ranks)",
            ),
        ]
        if mode == DeployOption.LOCAL_OFFLOAD_NVME:
            rows += [
                Setting(
                    "local_disk",
                    cfg["local_disk"],
                    "a folder on the node's NVMe (each rank writes its own shard)",
                ),
                Setting(
                    "max_local_disk_size",
                    f"{cfg['max_local_disk_size']:g}",
                    f"GiB of NVMe per GPU rank ({sz.nvme_per_node_gb:.3g} GB per node / "
                    f"{sz.ranks_per_node} ranks)",
                ),
            ]
    return ProductSettings("LMCache", mode, tuple(rows), to_yaml(cfg), "yaml")


def mooncake_settings(sz: Sizing, mode: DeployOption, net: Wiring) -> ProductSettings:
    if mode != DeployOption.POOLED:
        idle = (Setting("(not deployed)", "-", "the verdict does not call for a pool"),)
        return ProductSettings("Mooncake Store", mode, idle, "", "json")
    cfg = mooncake_store_config(sz, net)
    seg = cfg["global_segment_size"]
    rows = (
        Setting(
            "global_segment_size",
            str(seg),
            f"bytes each GPU rank contributes in embedded mode ({_fmt(seg)}: pool "
            f"{sz.pool_capacity_gb:.3g} GB / {sz.ranks} ranks, {sz.ranks_per_node} per node)",
        ),
        Setting(
            "local_buffer_size",
            str(cfg["local_buffer_size"]),
            "staging buffer per GPU rank (4 GiB, vLLM's documented value)",
        ),
        Setting(
            "protocol",
            net.protocol,
            "RDMA when the NICs support it; tcp otherwise"
            if net.protocol == "rdma"
            else "the chosen link is TCP",
        ),
        Setting("metadata_server", net.metadata_server, "peer-to-peer handshake, no etcd needed"),
        Setting("master_server_address", net.master, "mooncake_master --rpc_port 50051"),
        Setting("mode", "embedded", "each rank holds its segment in-process"),
    )
    return ProductSettings(
        "Mooncake Store", mode, rows, json.dumps(cfg, indent=2, sort_keys=True), "json"
    )


def sglang_settings(
    sz: Sizing, mode: DeployOption, model: ServedModel, tp: int, net: Wiring
) -> ProductSettings:
    page = sglang_page(sz)
    rows = [Setting("--page-size", str(page), "tokens per page; radix cache with pages")]
    cmd = [
        f"python -m sglang.launch_server --model-path {model.arg}",
        f"--tp {tp}",
        f"--page-size {page}",
    ]
    if mode in (DeployOption.LOCAL_OFFLOAD, DeployOption.LOCAL_OFFLOAD_NVME, DeployOption.POOLED):
        host = sglang_host_gb(sz, mode)
        why = (
            "GB of host DRAM per GPU rank, staging for the L3 pool"
            if mode == DeployOption.POOLED
            else f"GB of host DRAM per GPU rank ({sz.dram_per_node_gb:.3g} GB per node / "
            f"{sz.ranks_per_node} ranks; a whole number, rounded up; overrides --hicache-ratio)"
        )
        rows += [
            Setting("--enable-hierarchical-cache", "on", "HBM + host DRAM (L2) radix cache"),
            Setting("--hicache-size", str(host), why),
            Setting("--hicache-write-policy", "write_through", "copy new KV to host as produced"),
        ]
        cmd += [
            "--enable-hierarchical-cache",
            f"--hicache-size {host}",
            "--hicache-write-policy write_through",
        ]
    if mode == DeployOption.LOCAL_OFFLOAD_NVME:
        env = sglang_file_env(sz)
        rows += [
            Setting("--hicache-storage-backend", "file", "L3: files on the node's local NVMe"),
            *(
                Setting(
                    k,
                    v,
                    "the folder on NVMe"
                    if k.endswith("_DIR")
                    else "bytes of NVMe "
                    f"each GPU rank keeps ({sz.nvme_per_node_gb:.3g} GB per node / "
                    f"{sz.ranks_per_node} ranks), least recently used evicted first",
                )
                for k, v in env.items()
            ),
        ]
        cmd = [f"{k}={v}" for k, v in env.items()] + cmd + ["--hicache-storage-backend file"]
    if mode == DeployOption.POOLED:
        extra = sglang_extra_config(sz, net)
        rows += [
            Setting(
                "--hicache-storage-backend", "mooncake", "L3: the cluster-wide Mooncake Store pool"
            ),
            Setting(
                "--hicache-storage-backend-extra-config",
                _kv(extra),
                f"master address and the bytes each server adds to the pool "
                f"({_fmt(extra['global_segment_size'])}: pool / {sz.instances} servers; "
                "SGLang divides it over the server's tp x pp ranks)",
            ),
            Setting("MOONCAKE_LOCAL_HOSTNAME", NODE_IP, "each node's own address"),
        ]
        cmd.insert(0, f"MOONCAKE_LOCAL_HOSTNAME={NODE_IP}")
        cmd += [
            "--hicache-storage-backend mooncake",
            f"--hicache-storage-backend-extra-config {shell(_kv(extra))}",
        ]
    return ProductSettings("SGLang HiCache", mode, tuple(rows), " \\\n  ".join(cmd), "bash")


def to_yaml(obj: Mapping[str, object]) -> str:
    import yaml

    text: str = yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=1000)
    return text


def wiring_for(sz: Sizing, master: str = "mooncake-master:50051") -> Wiring:
    return Wiring(master=master, protocol="tcp" if sz.nic.startswith("tcp") else "rdma")


def deployed_mode(sz: Sizing, mode: DeployOption) -> DeployOption:
    if mode == DeployOption.LOCAL_OFFLOAD_NVME and sz.nvme_per_node_tokens == 0:
        return (
            DeployOption.LOCAL_OFFLOAD
            if sz.dram_per_node_tokens
            else DeployOption.PREFIX_CACHE_ONLY
        )
    if mode == DeployOption.LOCAL_OFFLOAD and sz.dram_per_node_tokens == 0:
        return DeployOption.PREFIX_CACHE_ONLY  # HBM holds the working set: no tier to configure
    if mode == DeployOption.POOLED and sz.pool_capacity_tokens == 0:
        return DeployOption.PREFIX_CACHE_ONLY
    return mode


def translate(
    sz: Sizing,
    verdict: str,
    *,
    model: ServedModel,
    tp: int,
    master: str = "mooncake-master:50051",
    mode: DeployOption | None = None,
) -> list[ProductSettings]:
    """Settings for every product, for the deployment the verdict calls for (``mode``:
    that option's, when the verdict alone does not say which tier)."""
    mode = deployed_mode(sz, mode or mode_for(verdict))
    net = wiring_for(sz, master)
    return [
        vllm_settings(sz, mode, model, tp),
        lmcache_settings(sz, mode, net),
        mooncake_settings(sz, mode, net),
        sglang_settings(sz, mode, model, tp, net),
    ]
