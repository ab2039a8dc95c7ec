"""Translate a sizing into the settings of the products a team would deploy.

Option names were checked against each product's documentation on the pages listed
in :data:`DOCS_CHECKED` (also in docs/products.md and in every report); the
translator emits only those names. Sizes are written the way each product reads
them: LMCache's ``max_local_cpu_size`` / ``max_local_disk_size`` in GB, Mooncake's
``global_segment_size`` / ``local_buffer_size`` as strings such as ``"80GB"``, vLLM's
``cpu_bytes_to_use`` in bytes, SGLang's ``--hicache-size`` in GB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from analyzer.advisor.sizing import Sizing

GB = 10**9

DOCS_CHECKED: tuple[dict[str, str], ...] = (
    {
        "product": "vLLM",
        "version": "v0.21-v0.28 docs (stable, checked 2026-12)",
        "pages": "https://docs.vllm.ai/en/stable/features/kv_offloading_usage/ ; "
        "https://docs.vllm.ai/en/v0.28.0/features/mooncake_store_connector_usage/ ; "
        "https://docs.vllm.ai/en/v0.15.0/api/vllm/v1/kv_offload/cpu/",
        "options": "--enable-prefix-caching, --block-size, --kv-transfer-config "
        "{kv_connector: OffloadingConnector | LMCacheConnectorV1 | MooncakeStoreConnector, "
        "kv_role: kv_both, kv_connector_extra_config: {block_size, cpu_bytes_to_use}}",
    },
    {
        "product": "LMCache",
        "version": "LMCache main / 0.3.x configuration reference (LMCacheEngineConfig)",
        "pages": "https://docs.lmcache.ai/api_reference/configurations.html ; "
        "https://docs.lmcache.ai (Mooncake backend: remote_url mooncakestore://host:port/, "
        "extra_config) ; https://docs.nvidia.com/dynamo/kv-managers/lm-cache.md",
        "options": "chunk_size, local_cpu, max_local_cpu_size (GB), local_disk, "
        "max_local_disk_size (GB), remote_url, remote_serde (naive | cachegen), "
        "extra_config; env form LMCACHE_<NAME>",
    },
    {
        "product": "Mooncake Store",
        "version": "mooncake-transfer-engine as documented by vLLM v0.21-v0.28",
        "pages": "https://docs.vllm.ai/en/latest/features/mooncake_store_connector_usage/",
        "options": "metadata_server, master_server_address, global_segment_size, "
        "local_buffer_size, protocol (rdma | tcp), device_name",
    },
    {
        "product": "SGLang HiCache",
        "version": "SGLang docs (hicache_best_practices, checked 2026-12)",
        "pages": "https://docs.sglang.io/advanced_features/hicache_best_practices.html",
        "options": "--enable-hierarchical-cache, --hicache-ratio, --hicache-size (GB), "
        "--hicache-write-policy, --hicache-storage-backend, --page-size",
    },
)


@dataclass(frozen=True, slots=True)
class Setting:
    option: str
    value: str
    why: str


@dataclass(frozen=True, slots=True)
class ProductSettings:
    product: str
    mode: str  # "prefix-cache-only" | "local-offload" | "pooled"
    settings: tuple[Setting, ...]
    snippet: str  # ready-to-paste command line or config file
    snippet_lang: str  # "bash" | "yaml" | "json"

    def to_json(self) -> dict:
        return {
            "product": self.product,
            "mode": self.mode,
            "settings": [
                {"option": s.option, "value": s.value, "why": s.why} for s in self.settings
            ],
            "snippet": self.snippet,
            "snippet_lang": self.snippet_lang,
        }


VLLM_BLOCK_SIZES = (8, 16, 32, 64, 128)  # CUDA paged-attention block sizes


def _gb(n_bytes: float) -> float:
    """GB rounded up to 0.1, at least 0.1 (products refuse a zero size)."""
    return max(0.1, -(-round(n_bytes / GB * 10, 6) // 1) / 10)


def _gb_str(n_bytes: float) -> str:
    g = _gb(n_bytes)
    return f"{g:g}GB"


def mode_for(verdict: str) -> str:
    return {
        "deploy-pooled": "pooled",
        "local-offload-only": "local-offload",
    }.get(verdict, "prefix-cache-only")


def vllm_settings(sz: Sizing, mode: str, model: str, tp: int) -> ProductSettings:
    block = sz.block_size_tokens
    why = "KV block size in tokens; the analysis used this size"
    if block not in VLLM_BLOCK_SIZES:
        # e.g. Mooncake traces hash 512-token blocks: vLLM's paged attention takes up to
        # 128 on CUDA, and finer blocks can only add hits to what was measured.
        why = (
            f"vLLM's default; the trace's {block}-token blocks are coarser than vLLM "
            "supports, so the measured hit rates are a lower bound"
        )
        block = 16
    s = [
        Setting("--enable-prefix-caching", "on", "automatic prefix caching in HBM (the baseline)"),
        Setting("--block-size", str(block), why),
    ]
    cmd = [
        f"vllm serve {model}",
        f"--tensor-parallel-size {tp}",
        "--enable-prefix-caching",
        f"--block-size {block}",
    ]
    if mode == "local-offload":
        dram_instance = sz.dram_per_instance_bytes
        cpu_bytes = int(_gb(dram_instance) * GB)
        cfg = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "block_size": sz.chunk_size_tokens,
                "cpu_bytes_to_use": cpu_bytes,
            },
        }
        s.append(
            Setting(
                "--kv-transfer-config",
                json.dumps(cfg, sort_keys=True),
                f"offload KV to {cpu_bytes / GB:g} GB of pinned host DRAM per instance "
                f"({sz.dram_per_node_gb:.1f} GB per node of {sz.instances_per_node} instances)",
            )
        )
        cmd.append(f"--kv-transfer-config '{json.dumps(cfg, sort_keys=True)}'")
    elif mode == "pooled":
        cfg = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        s.append(
            Setting(
                "--kv-transfer-config",
                json.dumps(cfg, sort_keys=True),
                "LMCache connector; LMCache's remote_url points at the pool (see LMCache "
                "and Mooncake Store settings). MooncakeStoreConnector is the alternative "
                "without LMCache.",
            )
        )
        cmd.insert(0, "LMCACHE_CONFIG_FILE=lmcache.yaml")
        cmd.append(f"--kv-transfer-config '{json.dumps(cfg, sort_keys=True)}'")
    return ProductSettings("vLLM", mode, tuple(s), " \\\n  ".join(cmd), "bash")


def lmcache_settings(
    sz: Sizing, mode: str, pool_url: str, master: str = "", protocol: str = "rdma"
) -> ProductSettings:
    dram_instance = sz.dram_per_instance_bytes
    if mode == "pooled":
        # The pool holds the shared KV; a small local CPU buffer keeps hot chunks.
        dram_instance = min(dram_instance, sz.pool_capacity_gb * GB / max(1, sz.instances))
    rows = [
        Setting("chunk_size", str(sz.chunk_size_tokens), sz.block_size_reason),
        Setting(
            "local_cpu",
            "true" if mode != "prefix-cache-only" else "false",
            "keep a host-DRAM copy of KV chunks",
        ),
        Setting(
            "max_local_cpu_size", f"{_gb(dram_instance):g}", "GB of host DRAM per instance for KV"
        ),
    ]
    if mode == "pooled":
        rows += [
            Setting("remote_url", pool_url, "the cluster-wide pool (Mooncake Store master)"),
            Setting(
                "remote_serde",
                "naive",
                "no compression: the pool link is fast enough "
                "(cachegen trades GPU time for bytes on slow links)",
            ),
        ]
    if mode == "prefix-cache-only":
        rows = rows[:1]
        rows.append(Setting("(not deployed)", "-", "the verdict does not call for LMCache"))
    lines = []
    for r in rows:
        if r.option.startswith("("):
            continue
        v = r.value
        if r.option in ("remote_url", "remote_serde"):
            v = f'"{v}"'
        lines.append(f"{r.option}: {v}")
    if mode == "pooled":
        # LMCache's Mooncake backend takes the store's settings under extra_config.
        lines += [
            "extra_config:",
            f'  master_server_address: "{master}"',
            f'  protocol: "{protocol}"',
        ]
    return ProductSettings("LMCache", mode, tuple(rows), "\n".join(lines), "yaml")


def mooncake_settings(sz: Sizing, mode: str, master: str, protocol: str) -> ProductSettings:
    seg = sz.pool_segment_per_node_gb * GB
    # The local transfer buffer holds the KV of the largest loads in flight; 4 GB is the
    # documented default and covers a few 100k-token prefixes of an 8B model.
    buf = max(4 * GB, min(seg, 16 * GB))
    cfg = {
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": master,
        "global_segment_size": _gb_str(seg),
        "local_buffer_size": _gb_str(buf),
        "protocol": protocol,
        "device_name": "",
    }
    rows = (
        Setting(
            "global_segment_size",
            cfg["global_segment_size"],
            f"each node's DRAM contribution: pool {sz.pool_capacity_gb:.1f} GB / {sz.nodes} nodes",
        ),
        Setting("local_buffer_size", cfg["local_buffer_size"], "staging buffer for transfers"),
        Setting(
            "protocol",
            protocol,
            "RDMA when the NICs support it; tcp otherwise"
            if protocol == "rdma"
            else "the chosen link is TCP",
        ),
        Setting("metadata_server", "P2PHANDSHAKE", "peer-to-peer handshake, no etcd needed"),
        Setting("master_server_address", master, "mooncake_master --port 50051"),
    )
    if mode != "pooled":
        rows = (Setting("(not deployed)", "-", "the verdict does not call for a pool"),)
    return ProductSettings(
        "Mooncake Store", mode, rows, json.dumps(cfg, indent=2, sort_keys=True), "json"
    )


def sglang_settings(sz: Sizing, mode: str, model: str, tp: int) -> ProductSettings:
    page = 64 if sz.chunk_size_tokens >= 64 else sz.block_size_tokens
    host_gb = _gb(sz.dram_per_instance_bytes)
    ratio = (sz.dram_per_node_tokens / max(1, sz.instances_per_node)) / max(
        1, sz.hbm_cache_per_instance_tokens
    )
    rows = [Setting("--page-size", str(page), "tokens per page; radix cache with pages")]
    cmd = [
        f"python -m sglang.launch_server --model-path {model}",
        f"--tp {tp}",
        f"--page-size {page}",
    ]
    if mode in ("local-offload", "pooled"):
        rows += [
            Setting("--enable-hierarchical-cache", "on", "HBM + host DRAM (L2) radix cache"),
            Setting(
                "--hicache-size",
                f"{host_gb:g}",
                f"GB of host DRAM per instance (overrides --hicache-ratio; about "
                f"{ratio:.1f}x the HBM cache)",
            ),
            Setting("--hicache-write-policy", "write_through", "copy new KV to host as produced"),
        ]
        cmd += [
            "--enable-hierarchical-cache",
            f"--hicache-size {host_gb:g}",
            "--hicache-write-policy write_through",
        ]
    if mode == "pooled":
        rows.append(
            Setting(
                "--hicache-storage-backend", "mooncake", "L3: the cluster-wide Mooncake Store pool"
            )
        )
        cmd.append("--hicache-storage-backend mooncake")
    return ProductSettings("SGLang HiCache", mode, tuple(rows), " \\\n  ".join(cmd), "bash")


def translate(
    sz: Sizing,
    verdict: str,
    *,
    model: str,
    tp: int,
    master: str = "mooncake-master:50051",
) -> list[ProductSettings]:
    """Settings for every product, for the deployment the verdict calls for."""
    mode = mode_for(verdict)
    if mode == "local-offload" and sz.dram_per_node_tokens == 0:
        mode = "prefix-cache-only"  # HBM holds the working set: no tier to configure
    protocol = "tcp" if sz.nic.startswith("tcp") else "rdma"
    pool_url = f"mooncakestore://{master}/"
    return [
        vllm_settings(sz, mode, model, tp),
        lmcache_settings(sz, mode, pool_url, master, protocol),
        mooncake_settings(sz, mode, master, protocol),
        sglang_settings(sz, mode, model, tp),
    ]
