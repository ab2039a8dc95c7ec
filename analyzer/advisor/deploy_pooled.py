"""The pooled option's files of the deployment bundle: the Mooncake Store master's start
script, the engines connected to the store (vLLM through its Mooncake Store connector or
through LMCache, SGLang through HiCache) and the Kubernetes form of the LMCache stack.

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
    _json_text,
    _node_ip,
    _serve_loop,
    _sglang_args,
    _sh,
    _vllm_args,
    lmcache_env,
    mooncake_env,
)
from analyzer.advisor.figures import DeployOption
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import Sizing
from analyzer.quoting import comment, shell


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
