"""Where the cache salt must reach, and which product versions carry it there.

A per-tenant salt keeps tenants apart only if every tier that holds KV keys its blocks
by it: the engine's own prefix cache, its host-memory tier, the pooled store behind its
connector, and the router that scores prefix matches. Public reports show tiers whose
keys dropped the salt, so that a tenant read another tenant's KV; :data:`SALT_PATHS`
records, per product and path, the first version whose keys carry the salt (None: no
release does) and the public sources that say so. The deploy bundle emits settings for a
stack under ``--isolation tenant|user`` only when every path it uses carries the salt
at the versions it targets (``analyzer.advisor.products.DOCS_CHECKED``), and otherwise
says that this version would share blocks across tenants and what fixes it.

The salt itself is set by the gateway, never by the client: a value derived from the
authenticated tenant (or user), written over whatever the request carried. The examples
derive it as ``HMAC-SHA256(secret, tenant)``, so that salts seen in logs, metrics or KV
events neither name a tenant nor can be recomputed by anyone without the secret.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from analyzer.advisor.figures import DeployOption


@dataclass(frozen=True, slots=True)
class SaltPath:
    """One place a product keeps or looks up KV, and whether its keys carry the salt."""

    id: str
    product: str  # the package whose version decides
    path: str  # what holds the blocks, as its product names it
    keyed_since: str | None  # first version whose keys carry the salt; None: none does
    checked: str  # how it was checked
    sources: tuple[str, ...]
    note: str = ""

    @property
    def keyed(self) -> bool:
        return self.keyed_since is not None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "product": self.product,
            "path": self.path,
            "keyed_since": self.keyed_since,
            "checked": self.checked,
            "sources": list(self.sources),
            "note": self.note,
        }


VLLM = "https://github.com/vllm-project/vllm"
SGLANG = "https://github.com/sgl-project/sglang"
LMCACHE = "https://github.com/LMCache/LMCache"

SALT_PATHS: tuple[SaltPath, ...] = (
    SaltPath(
        "vllm-hbm",
        "vLLM",
        "automatic prefix cache (HBM): cache_salt request field, mixed into the first "
        "block's hash and chained to every later block",
        "0.9.0",
        "vllm/v1/core/kv_cache_utils.py (generate_block_hash_extra_keys: cache_salt_keys)",
        (
            f"{VLLM}/pull/17045",
            f"{VLLM}/security/advisories/GHSA-4qjh-9fv9-r85r (CVE-2025-46570)",
        ),
        "a salt equal to a LoRA adapter's name shares that adapter's blocks "
        f"({VLLM}/issues/44701): derive salts, never use names",
    ),
    SaltPath(
        "vllm-offload",
        "vLLM",
        "CPU offload (OffloadingConnector): stores and looks up blocks by the request's "
        "own block hashes, salt included",
        "0.9.0",
        "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py "
        "(_get_block_hashes: req.block_hashes)",
        (f"{VLLM}/blob/main/vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py",),
    ),
    SaltPath(
        "vllm-mooncake",
        "vLLM",
        "Mooncake Store (MooncakeStoreConnector): keys chunks by the request's own block "
        "hashes, salt included",
        "0.9.0",
        "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/scheduler.py "
        "(lookup and save with request.block_hashes)",
        (
            f"{VLLM}/blob/main/vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/scheduler.py",
            f"{VLLM}/pull/45767 (cache_prefix: a namespace per deployment, not per tenant)",
        ),
    ),
    SaltPath(
        "vllm-hf3fs",
        "vLLM",
        "3FS (HF3FSKVConnector): recomputes its own key chain from the prompt's token ids",
        None,
        "not emitted by kvpool; listed because teams pair it with vLLM",
        (
            f"{VLLM}/security/advisories/GHSA-qj2w-6f36-hc5w",
            f"{VLLM}/pull/51748 (open)",
        ),
        "no vLLM release keys HF3FS by the salt: engines sharing one 3FS metadata "
        "service share blocks across salts",
    ),
    SaltPath(
        "lmcache-vllm-inprocess",
        "LMCache",
        "vLLM's in-process LMCache connector (LMCacheConnectorV1: local CPU, disk and "
        "remote backends such as Mooncake Store)",
        None,
        "lmcache 0.5.4, 0.5.5, 0.5.6 wheels: integration/vllm/vllm_v1_adapter.py never "
        "reads cache_salt",
        (
            f"{LMCACHE}/issues/2878",
            f"{LMCACHE}/pull/2880 (open)",
            f"{LMCACHE}/pull/3008 (closed unmerged)",
        ),
        "through 0.5.6 two requests with the same prompt and different salts share one "
        "LMCache entry; LMCache's multi-process mode (lmcache server with "
        "LMCacheMPConnector) keys by the salt",
    ),
    SaltPath(
        "lmcache-vllm-mp",
        "LMCache",
        "LMCache multi-process mode with vLLM (lmcache server + LMCacheMPConnector): "
        "object keys carry cache_salt",
        "0.5.4",
        "lmcache 0.5.4 and 0.5.6 wheels: integration/vllm/lmcache_mp_metadata.py, "
        "vllm_multi_process_adapter.py",
        (f"{LMCACHE}/issues/4825 (the vLLM integration populates ObjectKey.cache_salt)",),
        "earlier releases not checked",
    ),
    SaltPath(
        "sglang-radix",
        "SGLang",
        "radix prefix cache (HBM) and HiCache host tier: extra_key and cache_salt "
        "namespace the tree",
        "0.5.20",
        "sglang 0.5.19 to 0.5.23 wheels: srt/mem_cache/radix_cache.py (RadixKey)",
        (
            f"{SGLANG}/pull/23300 (salt reaches the scheduler)",
            f"{SGLANG}/pull/30827 (cache_salt beside extra_key)",
        ),
        "earlier releases not checked (before PR 23300 the salt did not reach the tree)",
    ),
    SaltPath(
        "sglang-hicache-storage",
        "SGLang",
        "HiCache L3 storage (Mooncake Store, file, 3FS backends): page keys seeded with the "
        "request's extra_key and cache_salt",
        "0.5.20",
        "sglang 0.5.19 (no storage_namespace_seed) and 0.5.20 (seeded) wheels: "
        "srt/mem_cache/utils.py",
        (
            f"{SGLANG}/issues/26747",
            f"{SGLANG}/pull/38577",
        ),
        "up to 0.5.19 the storage keys were token-only: a salted tenant shared L3 pages "
        "with every other tenant",
    ),
    SaltPath(
        "sglang-lmcache",
        "SGLang",
        "SGLang with LMCache as its storage (--enable-lmcache): the salt handed to "
        "LMCache's object keys",
        "0.5.21 with lmcache 0.5.6",
        "sglang 0.5.20 (lookup_kv without the salt) and 0.5.21 (build_cache_salt) wheels; "
        "lmcache 0.5.5 (no salt in integration/sglang) and 0.5.6 (unified connector)",
        (
            f"{SGLANG}/issues/37160",
            f"{LMCACHE}/issues/4825",
            f"{LMCACHE}/pull/4842",
        ),
        "both sides must be new enough: sglang >= 0.5.21 and lmcache >= 0.5.6",
    ),
    SaltPath(
        "trtllm",
        "TensorRT-LLM",
        "KV cache manager: cache_salt_id mixed into the root block key",
        "PR 7106 (V1 manager); PR 13793 (V2 manager)",
        "not emitted by kvpool",
        ("https://github.com/NVIDIA/TensorRT-LLM/pull/13793",),
    ),
)

# Routers that score prefix matches must hash the salt too, or they pin a request to the
# instance holding another tenant's prefix (a hit the engine will not serve).
ROUTERS: tuple[SaltPath, ...] = (
    SaltPath(
        "gie-prefix",
        "Gateway API Inference Extension",
        "prefix-cache-aware scorer: cache_salt hashed into the first block",
        "PR 1646 (2025-09)",
        "issue and pull request",
        ("https://github.com/kubernetes-sigs/gateway-api-inference-extension/pull/1646",),
    ),
    SaltPath(
        "llm-d",
        "llm-d router",
        "approximate prefix scorer: salted; precise prefix-cache scorer: salted after the "
        "fix of issue 1389",
        "the fix of llm-d-router issue 1389 (2026-06)",
        "issue thread",
        ("https://github.com/llm-d/llm-d-router/issues/1389",),
    ),
    SaltPath(
        "dynamo",
        "NVIDIA Dynamo",
        "KV router: salt from the x-tenant-id header, nvext.cache_salt or cache_salt",
        "PR 8197",
        "pull request",
        ("https://github.com/ai-dynamo/dynamo/pull/8197",),
    ),
    SaltPath(
        "sgl-model-gateway",
        "SGLang Model Gateway",
        "cache_aware policy: keyed worker affinity on the prompt alone",
        None,
        "issue (closed; check the release you run)",
        ("https://github.com/smg-project/smg/issues/2420",),
        "until your release hashes cache_salt / extra_key, cache_aware routes a salted "
        "request to the instance holding another tenant's prefix (no leak: the engine "
        "misses; lost affinity)",
    ),
)

PATHS = {p.id: p for p in SALT_PATHS}

# The salt paths each stack the bundle writes uses, per option (deploy.py's stacks).
STACK_PATHS: dict[tuple[DeployOption, str], tuple[str, ...]] = {
    # The master keeps what the engines' connectors put, under the keys they choose.
    (DeployOption.POOLED, "Mooncake Store master"): (),
    (DeployOption.POOLED, "vLLM + Mooncake Store"): ("vllm-hbm", "vllm-mooncake"),
    (DeployOption.POOLED, "vLLM + LMCache (Mooncake remote)"): (
        "vllm-hbm",
        "lmcache-vllm-inprocess",
    ),
    (DeployOption.POOLED, "SGLang HiCache (Mooncake L3)"): (
        "sglang-radix",
        "sglang-hicache-storage",
    ),
    (DeployOption.LOCAL_OFFLOAD, "vLLM OffloadingConnector"): ("vllm-hbm", "vllm-offload"),
    (DeployOption.LOCAL_OFFLOAD, "vLLM + LMCache (local CPU)"): (
        "vllm-hbm",
        "lmcache-vllm-inprocess",
    ),
    (DeployOption.LOCAL_OFFLOAD, "SGLang HiCache (host L2)"): ("sglang-radix",),
    (DeployOption.LOCAL_OFFLOAD_NVME, "vLLM + LMCache (local CPU + local disk)"): (
        "vllm-hbm",
        "lmcache-vllm-inprocess",
    ),
    (DeployOption.LOCAL_OFFLOAD_NVME, "SGLang HiCache (host L2 + file storage)"): (
        "sglang-radix",
        "sglang-hicache-storage",
    ),
    (DeployOption.PREFIX_CACHE_ONLY, "vLLM"): ("vllm-hbm",),
    (DeployOption.PREFIX_CACHE_ONLY, "SGLang"): ("sglang-radix",),
}


@dataclass(frozen=True, slots=True)
class StackSalt:
    """Whether one stack of the bundle keeps tenants apart at the versions it targets."""

    option: DeployOption
    stack: str
    paths: tuple[SaltPath, ...]

    @property
    def holds(self) -> bool:
        return all(p.keyed for p in self.paths)

    @property
    def needs(self) -> str:
        """The versions the stack needs for the salt to hold, in words."""
        parts = [f"{p.product} {p.keyed_since} or later" for p in self.paths if p.keyed_since]
        return ", ".join(dict.fromkeys(parts))

    @property
    def leaks(self) -> tuple[SaltPath, ...]:
        return tuple(p for p in self.paths if not p.keyed)

    def to_json(self) -> dict[str, object]:
        return {
            "option": self.option,
            "stack": self.stack,
            "holds": self.holds,
            "needs": self.needs,
            "paths": [p.id for p in self.paths],
            "leaks": [p.id for p in self.leaks],
            "refusal": None if self.holds else refusal(self),
        }


def stack_salt(option: DeployOption, stack: str) -> StackSalt | None:
    """The salt paths of a stack the bundle writes (None: a stack this table lacks)."""
    ids = STACK_PATHS.get((option, stack))
    if ids is None:
        return None
    return StackSalt(option, stack, tuple(PATHS[i] for i in ids))


def bundle_stacks(stacks: Iterable[tuple[DeployOption, str]]) -> tuple[StackSalt, ...]:
    """The salt status of each stack a bundle writes (its files' option and stack, in
    order, each once); the bundle's index and gateway files, and a stack that keeps no KV
    itself (the Mooncake master), have no salt paths and are left out."""
    out: dict[tuple[DeployOption, str], StackSalt] = {}
    for option, stack in stacks:
        status = stack_salt(option, stack)
        if status is not None and status.paths:
            out.setdefault((option, stack), status)
    return tuple(out.values())


def refusal(s: StackSalt) -> str:
    """The plain words a bundle puts in place of a stack whose salt does not hold."""
    lines = []
    for p in s.leaks:
        note = p.note or "its keys do not carry the salt"
        lines.append(
            f"{p.product}: {p.path}. {note[:1].upper()}{note[1:]}. Sources: {'; '.join(p.sources)}."
        )
    return (
        f"With this version, {s.stack} would share KV blocks across tenants whatever "
        "salt the gateway sets, so no settings are written for it under isolation. "
        + " ".join(lines)
    )


# -- the files the bundle adds under deploy/isolation/ -----------------------------------

SECRET_ENV = "KVPOOL_CACHE_SALT_SECRET"


def _owner_expr(policy: str) -> str:
    """The LiteLLM hook's expression for the salt's owner under ``policy``."""
    if policy == "user":
        return (
            "f\"{key.team_id}/{data.get('user') or key.end_user_id or key.user_id}\""
            " if key.team_id else None"
        )
    return "key.team_id"


def litellm_hook(policy: str, field: str = "cache_salt") -> str:
    """A LiteLLM proxy pre-call hook that writes the salt into every forwarded request."""
    owner = _owner_expr(policy)
    who = "end user within each team" if policy == "user" else "team (tenant)"
    return f'''"""kvpool deploy: a cache salt per {who}, set by the LiteLLM proxy.

Every request the proxy forwards to vLLM or SGLang carries
{field} = HMAC-SHA256(secret, owner), written over whatever the client sent, so a
tenant's KV blocks are reachable by its own requests only. The owner is the virtual
key's team{" and the request's end user (OpenAI `user`, vouched for by the team's key)" if policy == "user" else ""};
a key without a team is refused rather than sent unsalted. The secret is read from
{SECRET_ENV} (keep it in your secret store: a new secret empties every tenant's
cache once, an exposed one lets anyone compute a tenant's salt).

Register it in the proxy's config.yaml, this file beside it:

    litellm_settings:
      callbacks: cache_salt_hook.proxy_handler_instance

Docs: https://docs.litellm.ai/docs/proxy/call_hooks
"""

import hashlib
import hmac
import os

from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

_SECRET = os.environ["{SECRET_ENV}"].encode()
_FIELD = "{field}"


class CacheSalt(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        key = user_api_key_dict
        owner = {owner}
        if not owner:
            raise HTTPException(status_code=403, detail="no team on this key: no cache salt")
        salt = hmac.new(_SECRET, owner.encode(), hashlib.sha256).hexdigest()
        data.pop(_FIELD, None)  # a client never chooses its own salt
        extra = dict(data.get("extra_body") or {{}})
        extra[_FIELD] = salt
        data["extra_body"] = extra
        return data


proxy_handler_instance = CacheSalt()
'''


def envoy_filter(field: str = "cache_salt") -> str:
    """An Envoy HTTP filter chain fragment: the salt from a header the authenticated
    identity sets, put first in the JSON body; a client-sent salt is refused."""
    return f"""# kvpool deploy: the cache salt set by Envoy in front of vLLM / SGLang.
# The salt comes from the authenticated identity, never from the client: here the
# jwt_authn filter (configured before this one) copies the token's `cache_salt` claim,
# a random value your identity provider keeps per tenant (or per user), into the
# x-cache-salt header, and the route's request_headers_to_remove drops any x-cache-salt
# a client sent. A request without it is refused; so is a body that already names a
# salt. Docs: https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/lua_filter
#
# Add under your HttpConnectionManager's http_filters, before envoy.filters.http.router:
- name: envoy.filters.http.lua
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
    default_source_code:
      inline_string: |
        function envoy_on_request(request_handle)
          local salt = request_handle:headers():get("x-cache-salt")
          if salt == nil or not string.match(salt, "^[A-Za-z0-9_-]+$") or #salt > 128 then
            request_handle:respond({{[":status"] = "403"}}, "no cache salt for this caller")
            return
          end
          local body = request_handle:body()
          local text = body:getBytes(0, body:length())
          if string.find(text, '"{field}"', 1, true) or string.find(text, '"extra_key"', 1, true) then
            request_handle:respond({{[":status"] = "400"}}, "clients may not set a cache salt")
            return
          end
          local salted, n = string.gsub(text, "^%s*{{", '{{"{field}":"' .. salt .. '",', 1)
          if n ~= 1 then
            request_handle:respond({{[":status"] = "400"}}, "expected a JSON object")
            return
          end
          body:setBytes(salted)
          request_handle:headers():replace("content-length", tostring(#salted))
        end
"""


def client_example(policy: str, field: str = "cache_salt") -> str:
    """A client that sets the salt itself (a team's own backend in front of the engines)."""
    unit = "user" if policy == "user" else "tenant"
    return f'''"""kvpool deploy: the cache salt set by your own backend, per {unit}.

Where no gateway sits in front of the engines, the service that authenticates the
{unit} sets the salt on each request (OpenAI SDK: extra_body). The salt is
HMAC-SHA256(secret, {unit} id): stable, so a {unit}'s requests share their prefixes, and
not guessable, so nobody computes another {unit}'s salt. Never take it from the caller.
"""

import hashlib
import hmac
import os

from openai import OpenAI

_SECRET = os.environ["{SECRET_ENV}"].encode()


def cache_salt(owner: str) -> str:
    return hmac.new(_SECRET, owner.encode(), hashlib.sha256).hexdigest()


def complete(client: OpenAI, model: str, owner: str, messages: list[dict]) -> str:
    answer = client.chat.completions.create(
        model=model,
        messages=messages,
        extra_body={{"{field}": cache_salt(owner)}},
    )
    return answer.choices[0].message.content or ""
'''


def litellm_config() -> str:
    """The proxy config lines that load the hook (beside the team's own model_list)."""
    return (
        "# kvpool deploy: load the cache-salt hook in the LiteLLM proxy (add to your\n"
        "# config.yaml; cache_salt_hook.py sits beside it, KVPOOL_CACHE_SALT_SECRET in the\n"
        "# proxy's environment). Docs: https://docs.litellm.ai/docs/proxy/call_hooks\n"
        "litellm_settings:\n"
        "  callbacks: cache_salt_hook.proxy_handler_instance\n"
    )


def isolation_readme(
    policy: str,
    stacks: list[StackSalt],
    probe: str,
    md_text: Callable[[str], str],
    md_code: Callable[[str, str], str],
) -> str:
    """``deploy/isolation/README.md``: the salt end to end for the bundle's stacks.
    ``md_text`` / ``md_code`` are the Markdown sink's quoting functions."""
    unit = "end user within each tenant" if policy == "user" else "tenant"
    lines = [
        f"# Tenant isolation: a cache salt per {unit}",
        "",
        f"`kvpool analyze --isolation {policy}` measured every figure of this report with "
        f"each block keyed by {unit}, as a salt does. The salt holds only if every "
        "request carries it and every tier keys by it:",
        "",
        "1. **The gateway sets it, never the client**, from the authenticated identity, "
        "written over whatever the request carried. The request field is `cache_salt` "
        "(vLLM; SGLang beside `extra_key`, which older SGLang releases take instead). "
        "Derive it as HMAC-SHA256(secret, "
        + ("tenant/user" if policy == "user" else "tenant")
        + "): stable within the owner, never a name, never computable without the secret.",
        "   - LiteLLM proxy: `litellm/cache_salt_hook.py` with `litellm/config.yaml`;",
        "   - Envoy: `envoy/cache-salt-filter.yaml` (a Lua filter taking the salt from a "
        "header your identity layer sets);",
        "   - your own backend: `client/cache_salt_client.py`.",
        "2. **Every tier keys by it**, at the versions below (analyzer/advisor/salting.py "
        "keeps the sources):",
        "",
        "| option | stack | keys every tier by the salt | needs |",
        "|---|---|---|---|",
    ]
    for s in stacks:
        if s.holds:
            holds, needs = "yes", s.needs or "-"
        else:
            holds = "**no: not written under isolation**"
            needs = "no release of " + ", ".join(dict.fromkeys(p.product for p in s.leaks))
        lines.append(f"| {s.option} | {md_text(s.stack)} | {holds} | {md_text(needs)} |")
    refused = [s for s in stacks if not s.holds]
    if refused:
        lines += ["", "Stacks this bundle leaves out under isolation:", ""]
        lines += [f"- **{md_text(s.stack)}** ({s.option}): {md_text(refusal(s))}" for s in refused]
    lines += [
        "",
        "3. **The router hashes it too** when it scores prefix matches, or it pins a "
        "request to the instance holding another tenant's prefix (no leak: the engine "
        "misses; lost affinity):",
        "",
    ]
    for r in ROUTERS:
        state = f"since {r.keyed_since}" if r.keyed_since else f"not in every release ({r.note})"
        lines.append(f"- {md_text(r.product)}: {md_text(r.path)}; {md_text(state)}; {r.sources[0]}")
    lines += [
        "",
        "4. **Test it** on the pilot, idle, before tenants share the pool: the same prefix "
        "under two salts must not hit (the isolation gate of the report's pilot plan).",
        "",
        md_code(probe, "bash"),
        "",
        "Every path kvpool knows, with the version that first keys it and its sources:",
        "",
        "| product | path | keyed since | sources |",
        "|---|---|---|---|",
    ]
    for p in SALT_PATHS:
        since = p.keyed_since or "no release"
        lines.append(
            f"| {md_text(p.product)} | {md_text(p.path)} | {md_text(since)} | "
            + "; ".join(p.sources)
            + " |"
        )
    return "\n".join(lines) + "\n"


def shared_paragraph(tenants: int) -> str:
    """What the bundle's index says under ``--isolation shared``."""
    who = f"all {tenants} tenants of the log" if tenants > 1 else "every tenant"
    return (
        f"**This pool is shared across {who}**: no request carries a cache salt, so any "
        "tenant's request can hit (and time) another tenant's cached prompts "
        "(docs/security.md). To keep tenants apart, the gateway sets `cache_salt` (vLLM, "
        "SGLang) or `extra_key` (older SGLang) per tenant on every request; `kvpool "
        "analyze --isolation tenant` prices that and writes the salted bundle, and the "
        "report's isolation section says what it costs."
    )
