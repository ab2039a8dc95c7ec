"""The deployment bundle: the files a team copies into its deployment, per product and
per option (the recommended one and the runner-up), written to ``deploy/`` in the
report directory.

Every size comes from the one sizing record through
:func:`analyzer.advisor.sizing.unit_sizes` and the product configs of
:mod:`analyzer.advisor.products`, so the bundle, the report's settings table and the
dashboard cannot disagree. Every file says which product versions it was checked
against (a comment; in JSON, the ``_checked_against`` key, which the products' loaders
ignore). ``@NODE_IP@`` marks the one value each node fills in (its own address): the
launch scripts do it with ``sed``, the Kubernetes form takes the pod IP.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from analyzer.advisor import products as P
from analyzer.advisor import salting
from analyzer.advisor.figures import DeployOption
from analyzer.advisor.pilot import PilotCommand
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import STAGING_PER_RANK_BYTES, Sizing, unit_sizes
from analyzer.advisor.words import option_name
from analyzer.quoting import comment, env_line, md_code, md_text, shell

ROOT = "deploy"


@dataclass(frozen=True, slots=True)
class DeployFile:
    path: str  # relative to the report directory, e.g. "deploy/pooled/.../mooncake.json"
    option: DeployOption
    role: str  # "recommended" | "runner-up" | "index" | "isolation" (the gateway side)
    stack: str  # e.g. "vLLM + Mooncake Store"
    kind: str  # "json" | "yaml" | "bash" | "env" | "markdown" | "python"
    checked: str  # the product versions this file was checked against
    text: str

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "option": self.option,
            "role": self.role,
            "stack": self.stack,
            "kind": self.kind,
            "checked": self.checked,
            "text": self.text,
        }


def _checked(*names: str) -> str:
    by = {d["product"]: d["version"] for d in P.DOCS_CHECKED}
    return "; ".join(f"{n} {by[n]}" for n in names)


def checked_all() -> str:
    """Every product version the bundle was checked against."""
    return "; ".join(f"{d['product']} {d['version']}" for d in P.DOCS_CHECKED)


def _json_text(cfg: Mapping[str, object], checked: str) -> str:
    return json.dumps({"_checked_against": checked, **cfg}, indent=2) + "\n"


def _header(title: str, checked: str, run: str) -> str:
    return f"# kvpool deploy: {title}\n# Checked against: {checked}\n# {run}\n"


def _serve_loop(sz: Sizing, model: ServedModel, body: list[str], port0: int) -> str:
    """One server per instance on this node, each on its own GPUs and port (a local
    model folder's path comes from ``MODEL``: the script stops until it is set)."""
    tp = max(1, sz.tp)
    lines = [
        *(
            [f"# {model.setup}", 'MODEL="${MODEL:?set MODEL to the model folder (see above)}"']
            if model.setup
            else []
        ),
        f"# {sz.instances_per_node} instance(s) on this node, {tp} GPU(s) each.",
        f"for i in $(seq 0 {sz.instances_per_node - 1}); do",
        f"  gpus=$(seq -s, $((i * {tp})) $((i * {tp} + {tp - 1})))",
        '  CUDA_VISIBLE_DEVICES="$gpus" \\',
    ]
    lines += ["    " + b + " \\" for b in body[:-1]]
    lines.append("    " + body[-1].replace("PORT", f"$(({port0} + i))") + " &")
    lines += ["done", "wait", ""]
    return "\n".join(lines)


def _node_ip() -> str:
    return 'NODE_IP="${NODE_IP:?set NODE_IP to the address of this node}"\ncd "$(dirname "$0")"\n'


def _vllm_args(sz: Sizing, model: ServedModel, extra: list[str]) -> list[str]:
    block, _ = P.vllm_block(sz)
    return [
        f"vllm serve {model.arg}",
        f"--tensor-parallel-size {max(1, sz.tp)}",
        "--enable-prefix-caching",
        f"--block-size {block}",
        *extra,
        "--port PORT",
    ]


def _sglang_args(sz: Sizing, model: ServedModel, extra: list[str]) -> list[str]:
    return [
        f"python -m sglang.launch_server --model-path {model.arg}",
        f"--tp {max(1, sz.tp)}",
        f"--page-size {P.sglang_page(sz)}",
        *extra,
        "--host 0.0.0.0 --port PORT",
    ]


def _env_text(title: str, checked: str, env: dict[str, str]) -> str:
    """KEY='value' lines: ``set -a; . FILE; set +a`` in bash, or a systemd EnvironmentFile."""
    lines = [
        f"# kvpool deploy: {title}",
        f"# Checked against: {checked}",
        "# Load with: set -a; . ./THIS_FILE; set +a",
    ]
    lines += [env_line(k, v) for k, v in env.items()]
    return "\n".join(lines) + "\n"


def lmcache_env(lm: P.LMCacheConfig, local_hostname: str = P.NODE_IP) -> dict[str, str]:
    """LMCache's environment form of ``lm`` (read only when no config file is given)."""
    env = {
        "LMCACHE_CHUNK_SIZE": str(lm["chunk_size"]),
        "LMCACHE_LOCAL_CPU": "True" if lm["local_cpu"] else "False",
        "LMCACHE_MAX_LOCAL_CPU_SIZE": repr(lm["max_local_cpu_size"]),
    }
    if "remote_url" in lm:
        env["LMCACHE_REMOTE_URL"] = lm["remote_url"]
        env["LMCACHE_REMOTE_SERDE"] = lm["remote_serde"]
    if "extra_config" in lm:
        extra = {**lm["extra_config"], "local_hostname": local_hostname}
        env["LMCACHE_EXTRA_CONFIG"] = json.dumps(extra, sort_keys=True)
    return env


def mooncake_env(sz: Sizing, net: P.Wiring) -> dict[str, str]:
    """The MOONCAKE_* variables SGLang's HiCache backend (and Mooncake's own
    ``MooncakeConfig.load_from_env``) read when no extra config names a master."""
    extra = P.sglang_extra_config(sz, net)
    return {
        "MOONCAKE_MASTER": net.master,
        "MOONCAKE_LOCAL_HOSTNAME": P.NODE_IP,
        "MOONCAKE_TE_META_DATA_SERVER": net.metadata_server,
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(extra["global_segment_size"]),
        "MOONCAKE_PROTOCOL": net.protocol,
        "MOONCAKE_DEVICE": net.device_name,
    }


def _sh(title: str, checked: str, run: str, body: str) -> str:
    return "#!/usr/bin/env bash\n" + _header(title, checked, run) + "set -euo pipefail\n" + body


# -- per option -------------------------------------------------------------------------


def _pooled(sz: Sizing, model: ServedModel, net: P.Wiring, role: str) -> list[DeployFile]:
    d = f"{ROOT}/{DeployOption.POOLED}"
    out: list[DeployFile] = []
    host, _, port = net.master.rpartition(":")
    mc_checked = _checked("Mooncake Store")
    out.append(
        DeployFile(
            f"{d}/mooncake-master/start.sh",
            DeployOption.POOLED,
            role,
            "Mooncake Store master",
            "bash",
            mc_checked,
            _sh(
                "Mooncake Store master (one per cluster)",
                mc_checked,
                f"Run on the host named {host!r} in master_server_address, before any engine.",
                "# metadata_server is P2PHANDSHAKE in every config here: peers exchange\n"
                "# transfer metadata directly, so no etcd or HTTP metadata server is needed.\n"
                "# To use one instead, add --enable_http_metadata_server=true\n"
                "# --http_metadata_server_port=8080 and set metadata_server to\n"
                f'# "http://{host}:8080/metadata" in every config.\n'
                "# Extra flags (e.g. --metrics_port=9003) pass through.\n"
                f'exec mooncake_master --rpc_port={port} "$@"\n',
            ),
        )
    )
    # vLLM + Mooncake Store (MooncakeStoreConnector, embedded)
    ck = _checked("vLLM", "Mooncake Store")
    sub = f"{d}/vllm-mooncake-store"
    kv = P._kv({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"})
    out.append(
        DeployFile(
            f"{sub}/mooncake.json",
            DeployOption.POOLED,
            role,
            "vLLM + Mooncake Store",
            "json",
            ck,
            _json_text(P.mooncake_store_config(sz, net), ck),
        )
    )
    out.append(
        DeployFile(
            f"{sub}/launch.sh",
            DeployOption.POOLED,
            role,
            "vLLM + Mooncake Store",
            "bash",
            ck,
            _sh(
                "vLLM + Mooncake Store (MooncakeStoreConnector, embedded mode)",
                ck,
                "Run on every serving node after mooncake-master/start.sh; NODE_IP is the address of the node.",
                _node_ip()
                + 'sed "s/@NODE_IP@/${NODE_IP}/" mooncake.json > mooncake.node.json\n'
                + 'export MOONCAKE_CONFIG_PATH="$PWD/mooncake.node.json"\n'
                + "# The same PYTHONHASHSEED on every instance keeps block hashes equal\n"
                + "# across processes (vLLM's Mooncake Store page).\n"
                + "export PYTHONHASHSEED=0\n"
                + _serve_loop(
                    sz, model, _vllm_args(sz, model, [f"--kv-transfer-config {shell(kv)}"]), 8000
                ),
            ),
        )
    )
    # vLLM + LMCache with the Mooncake remote backend
    ck = _checked("vLLM", "LMCache", "Mooncake Store")
    sub = f"{d}/vllm-lmcache-mooncake"
    lm = P.lmcache_config(sz, DeployOption.POOLED, net)
    kv = P._kv({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
    out.append(
        DeployFile(
            f"{sub}/lmcache.yaml",
            DeployOption.POOLED,
            role,
            "vLLM + LMCache (Mooncake remote)",
            "yaml",
            ck,
            f"# kvpool deploy: LMCache engine config, Mooncake Store remote\n# Checked against: {ck}\n"
            + P.to_yaml(lm),
        )
    )
    out.append(
        DeployFile(
            f"{sub}/lmcache.env",
            DeployOption.POOLED,
            role,
            "vLLM + LMCache (Mooncake remote)",
            "env",
            ck,
            _env_text(
                "LMCache as environment variables (instead of lmcache.yaml; @NODE_IP@ is the "
                "address of this node)",
                ck,
                lmcache_env(lm),
            ),
        )
    )
    out.append(
        DeployFile(
            f"{sub}/launch.sh",
            DeployOption.POOLED,
            role,
            "vLLM + LMCache (Mooncake remote)",
            "bash",
            ck,
            _sh(
                "vLLM + LMCache (Mooncake Store remote)",
                ck,
                "Run on every serving node after mooncake-master/start.sh; NODE_IP is the address of the node.",
                _node_ip()
                + 'sed "s/@NODE_IP@/${NODE_IP}/" lmcache.yaml > lmcache.node.yaml\n'
                + 'export LMCACHE_CONFIG_FILE="$PWD/lmcache.node.yaml"\n'
                + "export PYTHONHASHSEED=0\n"
                + _serve_loop(
                    sz, model, _vllm_args(sz, model, [f"--kv-transfer-config {shell(kv)}"]), 8000
                ),
            ),
        )
    )
    out.append(
        DeployFile(
            f"{d}/kubernetes/vllm-lmcache-mooncake.yaml",
            DeployOption.POOLED,
            role,
            "vLLM + LMCache (Mooncake remote)",
            "yaml",
            ck,
            _kubernetes(sz, model, net, lm, ck),
        )
    )
    # SGLang HiCache with the Mooncake L3 backend
    ck = _checked("SGLang HiCache", "Mooncake Store")
    sub = f"{d}/sglang-hicache-mooncake"
    extra = P.sglang_extra_config(sz, net)
    out.append(
        DeployFile(
            f"{sub}/hicache-mooncake.json",
            DeployOption.POOLED,
            role,
            "SGLang HiCache (Mooncake L3)",
            "json",
            ck,
            _json_text(extra, ck),
        )
    )
    out.append(
        DeployFile(
            f"{sub}/mooncake.env",
            DeployOption.POOLED,
            role,
            "SGLang HiCache (Mooncake L3)",
            "env",
            ck,
            _env_text(
                "Mooncake for SGLang HiCache as environment variables (read when "
                "--hicache-storage-backend-extra-config is left out)",
                ck,
                mooncake_env(sz, net),
            ),
        )
    )
    host_gb = P.sglang_host_gb(sz, DeployOption.POOLED)
    args = [
        "--enable-hierarchical-cache",
        f"--hicache-size {host_gb}",
        "--hicache-write-policy write_through",
        "--hicache-storage-backend mooncake",
        '--hicache-storage-backend-extra-config "$(cat hicache-mooncake.json)"',
    ]
    out.append(
        DeployFile(
            f"{sub}/launch.sh",
            DeployOption.POOLED,
            role,
            "SGLang HiCache (Mooncake L3)",
            "bash",
            ck,
            _sh(
                "SGLang HiCache with Mooncake Store as L3",
                ck,
                "Run on every serving node after mooncake-master/start.sh; NODE_IP is the address of the node.",
                _node_ip()
                + "# SGLang reads the node's own address from the environment first.\n"
                + 'export MOONCAKE_LOCAL_HOSTNAME="$NODE_IP"\n'
                + _serve_loop(sz, model, _sglang_args(sz, model, args), 30000),
            ),
        )
    )
    return out


def _kubernetes(
    sz: Sizing, model: ServedModel, net: P.Wiring, lm: P.LMCacheConfig, checked: str
) -> str:
    """ConfigMap, master Deployment + Service, and the vLLM + LMCache Deployment. LMCache
    reads its settings from LMCACHE_* variables here (no file), so the pod IP can enter
    extra_config through Kubernetes' $(VAR) expansion."""
    import yaml

    host, _, port = net.master.rpartition(":")
    env_all = lmcache_env(lm, local_hostname="$(POD_IP)")
    extra_json = env_all.pop("LMCACHE_EXTRA_CONFIG")
    env_cfg = {**env_all, "PYTHONHASHSEED": "0"}
    block, _ = P.vllm_block(sz)
    kv = P._kv({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
    tp = max(1, sz.tp)
    docs = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kvpool-lmcache"},
            "data": env_cfg,
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": host},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": host}},
                "template": {
                    "metadata": {"labels": {"app": host}},
                    "spec": {
                        "containers": [
                            {
                                "name": "master",
                                "image": "MOONCAKE_IMAGE",
                                "command": ["mooncake_master", f"--rpc_port={port}"],
                                "ports": [{"containerPort": int(port)}],
                            }
                        ]
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": host},
            "spec": {
                "selector": {"app": host},
                "ports": [{"port": int(port), "targetPort": int(port)}],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "vllm-lmcache"},
            "spec": {
                "replicas": sz.instances,
                "selector": {"matchLabels": {"app": "vllm-lmcache"}},
                "template": {
                    "metadata": {"labels": {"app": "vllm-lmcache"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "vllm",
                                "image": "VLLM_LMCACHE_IMAGE",
                                "command": ["vllm", "serve", model.k8s_arg],
                                "args": [
                                    "--tensor-parallel-size",
                                    str(tp),
                                    "--enable-prefix-caching",
                                    "--block-size",
                                    str(block),
                                    "--kv-transfer-config",
                                    kv,
                                    "--port",
                                    "8000",
                                ],
                                "envFrom": [{"configMapRef": {"name": "kvpool-lmcache"}}],
                                "env": [
                                    *(
                                        []
                                        if model.repo
                                        else [{"name": "MODEL", "value": "MODEL_FOLDER"}]
                                    ),
                                    {
                                        "name": "POD_IP",
                                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                    },
                                    {
                                        "name": "LMCACHE_EXTRA_CONFIG",
                                        "value": extra_json,
                                    },
                                ],
                                "ports": [{"containerPort": 8000}],
                                "resources": {"limits": {"nvidia.com/gpu": tp}},
                            }
                        ]
                    },
                },
            },
        },
    ]
    head = (
        "# kvpool deploy: vLLM + LMCache + Mooncake Store on Kubernetes\n"
        f"# Checked against: {checked}\n"
        "# Replace MOONCAKE_IMAGE and VLLM_LMCACHE_IMAGE with your images"
        + (
            ""
            if model.repo
            else ", and MODEL_FOLDER with the path the model folder\n# "
            + comment(repr(model.folder))
            + " is mounted at in the pod"
        )
        + ". One pod per\n"
        f"# instance ({tp} GPU(s) each); LMCache runs one engine per GPU rank, so each pod\n"
        f"# adds {tp} x {lm['extra_config']['global_segment_size']} bytes to the pool and\n"
        "# needs that much host memory plus the staging buffers.\n"
    )
    body: str = yaml.safe_dump_all(docs, sort_keys=False, width=1000)
    return head + body


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


# The option each folder of deploy/ holds, by its one name (analyzer.advisor.words).
_OPTION_OF = {
    DeployOption.PREFIX_CACHE_ONLY: "local",
    DeployOption.LOCAL_OFFLOAD: "local+dram",
    DeployOption.LOCAL_OFFLOAD_NVME: "local+dram+nvme",
    DeployOption.POOLED: "pooled",
}


def _named(mode: DeployOption) -> str:
    return option_name(_OPTION_OF[mode])


def _index(
    files: list[DeployFile],
    sizings: dict[DeployOption, Sizing],
    recommended: DeployOption,
    pilot: Sequence[PilotCommand],
    model: ServedModel,
    isolation: str = "shared",
    tenants: int = 0,
    root: str = ROOT,
) -> DeployFile:
    lines = [
        "# Deployment bundle",
        "",
        f"Recommended option: **{_named(recommended)}** (`{recommended}`)."
        + "".join(
            f" Runner-up (the next option meeting the SLO, if this one is turned down): "
            f"**{_named(m)}** (`{m}`)."
            for m in sizings
            if m != recommended
        ),
        "",
    ]
    for mode, sz in sizings.items():
        lines.append(
            f"- `{mode}`: {sz.instances} instance{'' if sz.instances == 1 else 's'} of "
            f"{sz.tp} GPU{'' if sz.tp == 1 else 's'}, {sz.instances_per_node} per node, on "
            f"{sz.nodes} node{'' if sz.nodes == 1 else 's'}."
        )
    lines += [
        "",
        "Each file names the product versions it was checked against.",
    ]
    if any(f.option == DeployOption.POOLED for f in files):
        lines += [
            "`@NODE_IP@` is the one value each node fills in (its own address; the launch",
            "scripts take `NODE_IP` from the environment).",
            "",
            "Start order for the pooled option: `mooncake-master/start.sh` once, then one",
            "stack's `launch.sh` on every serving node.",
        ]
    if any(f.option == DeployOption.LOCAL_OFFLOAD_NVME for f in files):
        lines += [
            "`@NVME_DIR@` is a folder on each node's local NVMe (the launch scripts take",
            "`NVME_DIR` from the environment).",
        ]
    lines.append("")
    if model.setup:
        lines += [
            "The model is served from a local folder: set `MODEL` to its path before "
            f"running a script or a pilot command ({md_text(model.setup)}).",
            "",
        ]
    if isolation == "shared":
        lines += [salting.shared_paragraph(tenants), ""]
    else:
        lines += [
            f"**Tenant isolation ({isolation})**: every request must carry a cache salt "
            "set by the gateway; `isolation/README.md` says how, which stacks key every "
            "tier by it, and how to test it. Stacks that would share blocks across "
            "tenants at these versions are not written (their folder holds ISOLATION.md).",
            "",
        ]
    for mode, sz in sizings.items():
        units = unit_sizes(sz, mode)
        if not units:
            continue
        lines += [
            f"## Sizes per process: {mode}",
            "",
            "| stack | setting | per | bytes each | units (per node) | total |",
            "|---|---|---|---|---|---|",
        ]
        for u in units:
            lines.append(
                f"| {u.product} | `{u.setting}` | {u.unit} | {u.written_bytes:,} | "
                f"{u.units} ({u.units_per_node}) | {u.total} {u.total_bytes:,} B |"
            )
        if mode == DeployOption.POOLED:
            lines.append(
                f"\nBeside the pool, each GPU rank keeps {STAGING_PER_RANK_BYTES:,} bytes of "
                "transfer staging (Mooncake `local_buffer_size`, LMCache's CPU buffer, "
                "HiCache's host pool in front of L3)."
            )
        lines.append("")
    lines += ["## Files", ""]
    lines += [f"- `{f.path.removeprefix(root + '/')}` ({f.role}, {f.stack})" for f in files]
    if pilot:
        lines += ["", "## Pilot commands", ""]
        for c in pilot:
            lines += [
                f"{c.tool}: {c.purpose}",
                "",
                md_code(f"# {comment(c.note)}\n{c.command}", "bash"),
                "",
            ]
    return DeployFile(
        f"{root}/README.md",
        recommended,
        "index",
        "all",
        "markdown",
        checked_all(),
        "\n".join(lines).rstrip() + "\n",
    )


def bundle(
    sizings: dict[DeployOption, Sizing],
    recommended: DeployOption | None,
    *,
    model: ServedModel,
    master: str = "mooncake-master:50051",
    pilot: Sequence[PilotCommand] = (),
    isolation: str = "shared",
    tenants: int = 0,
    folder: str = "",
    why: str = "",
) -> tuple[DeployFile, ...]:
    """The bundle for each option in ``sizings`` (recommended first, then the
    runner-up), plus ``deploy/README.md`` indexing them; under ``deploy/FOLDER/`` for one
    model of several. Under ``isolation`` tenant or user, :func:`salted` keeps the stacks
    that key every tier by the cache salt and adds ``isolation/``; ``tenants``: how many
    the log has (for the shared note). No sizing (nothing to deploy): the README alone,
    saying ``why``."""
    root = f"{ROOT}/{folder}" if folder else ROOT
    if not sizings or recommended is None:
        text = "# Deployment bundle\n\n" + md_text(why or "Nothing to deploy.") + "\n"
        return (
            DeployFile(
                f"{root}/README.md",
                DeployOption.PREFIX_CACHE_ONLY,
                "index",
                "all",
                "markdown",
                checked_all(),
                text,
            ),
        )
    files: list[DeployFile] = []
    for mode, sz in sizings.items():
        role = "recommended" if mode == recommended else "runner-up"
        net = P.wiring_for(sz, master)
        if mode == DeployOption.POOLED:
            files += _pooled(sz, model, net, role)
        elif mode == DeployOption.LOCAL_OFFLOAD:
            files += _local(sz, model, role)
        elif mode == DeployOption.LOCAL_OFFLOAD_NVME:
            files += _local_nvme(sz, model, role)
        else:
            files += _prefix_only(sz, model, role)
    if isolation != "shared":
        probe = next((c for c in pilot if c.purpose.startswith("tenant isolation")), None)
        files = salted(files, isolation, recommended, probe)
    if folder:
        files = [replace(f, path=root + f.path.removeprefix(ROOT)) for f in files]
    return (
        _index(files, sizings, recommended, pilot, model, isolation, tenants, root),
        *files,
    )


def salted(
    files: list[DeployFile],
    isolation: str,
    recommended: DeployOption,
    probe: PilotCommand | None = None,
) -> list[DeployFile]:
    """The bundle under a cache salt per tenant or user: each stack whose every tier keys
    by the salt at the versions the bundle targets is kept; each other one is replaced by
    an ``ISOLATION.md`` saying that it would share blocks across tenants and what fixes
    it (analyzer/advisor/salting.py); ``deploy/isolation/`` holds the gateway side."""
    by_stack: dict[tuple[DeployOption, str], list[DeployFile]] = {}
    for f in files:
        by_stack.setdefault((f.option, f.stack), []).append(f)
    out: list[DeployFile] = []
    stacks = list(salting.bundle_stacks(by_stack))
    for (option, stack), group in by_stack.items():
        status = salting.stack_salt(option, stack)
        assert status is not None, f"no salt paths for {option} {stack}"
        if status.holds:
            out += group
            continue
        folder = group[0].path.rsplit("/", 1)[0]
        text = (
            f"# {md_text(stack)}: not written under tenant isolation\n\n"
            f"{md_text(salting.refusal(status))}\n\nSee ../../isolation/README.md.\n"
        )
        out.append(
            DeployFile(f"{folder}/ISOLATION.md", option, group[0].role, stack, "markdown",
                       group[0].checked, text)
        )  # fmt: skip
    d = f"{ROOT}/isolation"
    checked = _checked("vLLM", "SGLang HiCache")
    run = (
        probe.command
        if probe is not None
        else "kvpool probe http://ENGINE_A:8000 http://ENGINE_B:8000 --model MODEL"
    )

    def add(path: str, kind: str, text: str) -> None:
        out.append(
            DeployFile(f"{d}/{path}", recommended, "isolation", "gateway", kind, checked, text)
        )

    add("README.md", "markdown", salting.isolation_readme(isolation, stacks, run, md_text, md_code))
    hook = salting.litellm_hook(isolation)
    add("litellm/cache_salt_hook.py", "python", f"# Checked against: {comment(checked)}\n{hook}")
    add(
        "litellm/config.yaml",
        "yaml",
        f"# Checked against: {comment(checked)}\n{salting.litellm_config()}",
    )
    add(
        "envoy/cache-salt-filter.yaml",
        "yaml",
        f"# Checked against: {comment(checked)}\n{salting.envoy_filter()}",
    )
    client = salting.client_example(isolation)
    add("client/cache_salt_client.py", "python", f"# Checked against: {comment(checked)}\n{client}")
    return out


def deploy_sizings(
    sizing: Sizing, verdict: str, resize: Callable[[bool], Sizing]
) -> dict[DeployOption, Sizing]:
    """The sized options to write, recommended first: ``{mode: sizing}``. ``resize(pool)``
    sizes the runner-up when it needs the other kind of sizing (with or without a pool)."""
    rec = P.deployed_mode(sizing, P.mode_for(verdict))
    out = {rec: sizing}
    alt_mode = P.runner_up(rec)
    alt = (
        sizing
        if (alt_mode == DeployOption.POOLED) == sizing.pool
        else resize(alt_mode == DeployOption.POOLED)
    )
    alt_mode = P.deployed_mode(alt, alt_mode)
    out.setdefault(alt_mode, alt)
    return out


@dataclass(frozen=True, slots=True)
class PerProcessRow:
    """One product setting's size per process: what the setting holds
    (``bytes_each``, as written), how many processes hold one, and the total they add
    up to (``total_bytes`` of the ``total``, "pool" or "node DRAM")."""

    option: DeployOption
    stack: str
    setting: str
    per: str
    bytes_each: int
    units: int
    units_per_node: int
    total: str
    total_bytes: int

    def to_json(self) -> dict[str, object]:
        return {
            "option": self.option,
            "stack": self.stack,
            "setting": self.setting,
            "per": self.per,
            "bytes_each": self.bytes_each,
            "units": self.units,
            "units_per_node": self.units_per_node,
            "total": self.total,
            "total_bytes": self.total_bytes,
        }


def per_process(sizings: dict[DeployOption, Sizing]) -> tuple[PerProcessRow, ...]:
    """Every product's size per process, for the report: what each setting holds, how
    many processes hold one, and the total they add up to."""
    return tuple(
        PerProcessRow(
            option=mode,
            stack=u.product,
            setting=u.setting,
            per=u.unit,
            bytes_each=u.written_bytes,
            units=u.units,
            units_per_node=u.units_per_node,
            total=u.total,
            total_bytes=u.total_bytes,
        )
        for mode, sz in sizings.items()
        for u in unit_sizes(sz, mode)
    )
