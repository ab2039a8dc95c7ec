"""The deployment bundle's file record and the text every file of it shares: the header
naming the product versions it was checked against, the JSON, env and bash shapes, the
engines' serve arguments and the LMCache and Mooncake environments.

:mod:`analyzer.advisor.deploy` assembles the bundle from these; the per-option files
(:mod:`analyzer.advisor.deploy_pooled`, :mod:`analyzer.advisor.deploy_local`) write
through them, so every file states its versions and its one ``@NODE_IP@`` the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from analyzer.advisor import products as P
from analyzer.advisor.figures import DeployOption
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import Sizing
from analyzer.quoting import env_line

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
