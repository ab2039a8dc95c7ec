"""The local options' files of the deployment bundle: host-DRAM offload (vLLM's own
offloading, LMCache on CPU, SGLang HiCache), DRAM plus local NVMe (LMCache on disk,
HiCache's file tier) and the engines' HBM prefix cache alone (vLLM, SGLang).

Every size comes from the one sizing record (:mod:`analyzer.advisor.sizing`) and the
product configs of :mod:`analyzer.advisor.products`; :mod:`analyzer.advisor.deploy`
places these files in the bundle.
"""

from __future__ import annotations

from analyzer.advisor import products as P
from analyzer.advisor.deploy_text import (
    ROOT,
    DeployFile,
    _checked,
    _env_text,
    _serve_loop,
    _sglang_args,
    _sh,
    _vllm_args,
    lmcache_env,
)
from analyzer.advisor.figures import DeployOption
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import Sizing
from analyzer.quoting import shell


def _local(sz: Sizing, model: ServedModel, role: str) -> list[DeployFile]:
    d = f"{ROOT}/{DeployOption.LOCAL_OFFLOAD}"
    out: list[DeployFile] = []
    ck = _checked("vLLM")
    kv = P._kv(P.vllm_offload_config(sz))
    out.append(
        DeployFile(
            f"{d}/vllm-offloading/launch.sh",
            DeployOption.LOCAL_OFFLOAD,
            role,
            "vLLM OffloadingConnector",
            "bash",
            ck,
            _sh(
                "vLLM with its CPU OffloadingConnector (host DRAM tier per instance)",
                ck,
                "Run on every serving node.",
                'cd "$(dirname "$0")"\n'
                + _serve_loop(
                    sz, model, _vllm_args(sz, model, [f"--kv-transfer-config {shell(kv)}"]), 8000
                ),
            ),
        )
    )
    ck = _checked("vLLM", "LMCache")
    lm = P.lmcache_config(sz, DeployOption.LOCAL_OFFLOAD, P.Wiring())
    kv = P._kv({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
    out.append(
        DeployFile(
            f"{d}/vllm-lmcache-cpu/lmcache.yaml",
            DeployOption.LOCAL_OFFLOAD,
            role,
            "vLLM + LMCache (local CPU)",
            "yaml",
            ck,
            f"# kvpool deploy: LMCache engine config, local CPU tier\n# Checked against: {ck}\n"
            + P.to_yaml(lm),
        )
    )
    out.append(
        DeployFile(
            f"{d}/vllm-lmcache-cpu/lmcache.env",
            DeployOption.LOCAL_OFFLOAD,
            role,
            "vLLM + LMCache (local CPU)",
            "env",
            ck,
            _env_text(
                "LMCache as environment variables (instead of lmcache.yaml)", ck, lmcache_env(lm)
            ),
        )
    )
    out.append(
        DeployFile(
            f"{d}/vllm-lmcache-cpu/launch.sh",
            DeployOption.LOCAL_OFFLOAD,
            role,
            "vLLM + LMCache (local CPU)",
            "bash",
            ck,
            _sh(
                "vLLM + LMCache local CPU tier",
                ck,
                "Run on every serving node.",
                'cd "$(dirname "$0")"\n'
                + 'export LMCACHE_CONFIG_FILE="$PWD/lmcache.yaml"\n'
                + _serve_loop(
                    sz, model, _vllm_args(sz, model, [f"--kv-transfer-config {shell(kv)}"]), 8000
                ),
            ),
        )
    )
    ck = _checked("SGLang HiCache")
    args = [
        "--enable-hierarchical-cache",
        f"--hicache-size {P.sglang_host_gb(sz, DeployOption.LOCAL_OFFLOAD)}",
        "--hicache-write-policy write_through",
    ]
    out.append(
        DeployFile(
            f"{d}/sglang-hicache/launch.sh",
            DeployOption.LOCAL_OFFLOAD,
            role,
            "SGLang HiCache (host L2)",
            "bash",
            ck,
            _sh(
                "SGLang HiCache with a host DRAM (L2) tier",
                ck,
                "Run on every serving node.",
                'cd "$(dirname "$0")"\n'
                + _serve_loop(sz, model, _sglang_args(sz, model, args), 30000),
            ),
        )
    )
    return out


def _nvme_dir() -> str:
    return (
        'NVME_DIR="${NVME_DIR:?set NVME_DIR to a folder on this node\'s local NVMe}"\n'
        'cd "$(dirname "$0")"\n'
    )


def _local_nvme(sz: Sizing, model: ServedModel, role: str) -> list[DeployFile]:
    """Host DRAM and local NVMe tiers on each node: LMCache's local CPU and local disk
    backends under vLLM, and SGLang HiCache's host pool with its file storage backend.
    vLLM's own OffloadingConnector is written here for host DRAM only."""
    d = f"{ROOT}/{DeployOption.LOCAL_OFFLOAD_NVME}"
    mode = DeployOption.LOCAL_OFFLOAD_NVME
    out: list[DeployFile] = []
    ck = _checked("vLLM", "LMCache")
    lm = P.lmcache_config(sz, mode, P.Wiring())
    kv = P._kv({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
    out.append(
        DeployFile(
            f"{d}/vllm-lmcache-disk/lmcache.yaml",
            mode,
            role,
            "vLLM + LMCache (local CPU + local disk)",
            "yaml",
            ck,
            "# kvpool deploy: LMCache engine config, local CPU and local disk tiers\n"
            f"# Checked against: {ck}\n# @NVME_DIR@ is a folder on the node's NVMe "
            "(launch.sh fills it in).\n" + P.to_yaml(lm),
        )
    )
    out.append(
        DeployFile(
            f"{d}/vllm-lmcache-disk/launch.sh",
            mode,
            role,
            "vLLM + LMCache (local CPU + local disk)",
            "bash",
            ck,
            _sh(
                "vLLM + LMCache with host DRAM and local NVMe tiers",
                ck,
                "Run on every serving node; NVME_DIR is a folder on the node's local NVMe.",
                _nvme_dir()
                + 'mkdir -p "$NVME_DIR/lmcache"\n'
                + 'sed "s|@NVME_DIR@|${NVME_DIR}|" lmcache.yaml > lmcache.node.yaml\n'
                + 'export LMCACHE_CONFIG_FILE="$PWD/lmcache.node.yaml"\n'
                + _serve_loop(
                    sz, model, _vllm_args(sz, model, [f"--kv-transfer-config {shell(kv)}"]), 8000
                ),
            ),
        )
    )
    ck = _checked("SGLang HiCache")
    env = P.sglang_file_env(sz)
    exports = "".join(
        f'export {k}="{v.replace(P.NVME_DIR, "${NVME_DIR}")}"\n' for k, v in env.items()
    )
    args = [
        "--enable-hierarchical-cache",
        f"--hicache-size {P.sglang_host_gb(sz, mode)}",
        "--hicache-write-policy write_through",
        "--hicache-storage-backend file",
    ]
    out.append(
        DeployFile(
            f"{d}/sglang-hicache-file/launch.sh",
            mode,
            role,
            "SGLang HiCache (host L2 + file storage)",
            "bash",
            ck,
            _sh(
                "SGLang HiCache with a host DRAM (L2) tier and file storage on local NVMe",
                ck,
                "Run on every serving node; NVME_DIR is a folder on the node's local NVMe.",
                _nvme_dir()
                + 'mkdir -p "$NVME_DIR/hicache"\n'
                + exports
                + _serve_loop(sz, model, _sglang_args(sz, model, args), 30000),
            ),
        )
    )
    return out


def _prefix_only(sz: Sizing, model: ServedModel, role: str) -> list[DeployFile]:
    d = f"{ROOT}/{DeployOption.PREFIX_CACHE_ONLY}"
    return [
        DeployFile(
            f"{d}/vllm/launch.sh",
            DeployOption.PREFIX_CACHE_ONLY,
            role,
            "vLLM",
            "bash",
            _checked("vLLM"),
            _sh(
                "vLLM with its HBM prefix cache only",
                _checked("vLLM"),
                "Run on every serving node.",
                _serve_loop(sz, model, _vllm_args(sz, model, []), 8000),
            ),
        ),
        DeployFile(
            f"{d}/sglang/launch.sh",
            DeployOption.PREFIX_CACHE_ONLY,
            role,
            "SGLang",
            "bash",
            _checked("SGLang HiCache"),
            _sh(
                "SGLang with its radix (HBM) prefix cache only",
                _checked("SGLang HiCache"),
                "Run on every serving node.",
                _serve_loop(sz, model, _sglang_args(sz, model, []), 30000),
            ),
        ),
    ]
