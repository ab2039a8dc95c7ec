"""Which stacks keep tenants apart (analyzer/advisor/salting.py), and the gateway
examples the bundle writes under isolation."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import sys
import types

import pytest
import yaml

from analyzer.advisor import salting
from analyzer.advisor.deploy import bundle
from analyzer.advisor.figures import DeployOption
from analyzer.advisor.served import ServedModel
from tests.helpers.advisor import deploy_sizing


@pytest.mark.parametrize("pool", [True, False])
def test_every_stack_the_bundle_writes_has_its_salt_paths(pool):
    sz = deploy_sizing(pool)
    rec = DeployOption.POOLED if pool else DeployOption.LOCAL_OFFLOAD
    alt = DeployOption.LOCAL_OFFLOAD if pool else DeployOption.PREFIX_CACHE_ONLY
    files = bundle({rec: sz, alt: deploy_sizing(False)}, rec, model=ServedModel(repo="org/m"))
    stacks = {(f.option, f.stack) for f in files if f.role != "index"}
    missing = [s for s in stacks if salting.stack_salt(*s) is None]
    assert not missing, f"add {missing} to salting.STACK_PATHS"


def test_the_matrix_says_what_holds_and_names_its_sources():
    pooled = {
        s: salting.stack_salt(DeployOption.POOLED, s)
        for s in (
            "vLLM + Mooncake Store",
            "vLLM + LMCache (Mooncake remote)",
            "SGLang HiCache (Mooncake L3)",
        )
    }
    assert pooled["vLLM + Mooncake Store"].holds
    assert pooled["SGLang HiCache (Mooncake L3)"].holds
    assert "SGLang 0.5.20 or later" in pooled["SGLang HiCache (Mooncake L3)"].needs
    lm = pooled["vLLM + LMCache (Mooncake remote)"]
    assert not lm.holds and [p.id for p in lm.leaks] == ["lmcache-vllm-inprocess"]
    words = salting.refusal(lm)
    assert "would share KV blocks across tenants" in words
    assert "LMCache/LMCache/issues/2878" in words and "multi-process" in words
    for p in salting.SALT_PATHS + salting.ROUTERS:
        assert p.sources and all(s.startswith("https://") for s in p.sources), p.id


def _load_hook(source: str, monkeypatch: pytest.MonkeyPatch) -> object:
    """The generated LiteLLM hook module, with LiteLLM's and FastAPI's classes stood in
    for (the proxy supplies them)."""

    class HTTPException(Exception):
        def __init__(self, status_code: int, detail: str) -> None:
            super().__init__(detail)
            self.status_code = status_code

    fastapi = types.ModuleType("fastapi")
    fastapi.HTTPException = HTTPException  # type: ignore[attr-defined]
    custom_logger = types.ModuleType("litellm.integrations.custom_logger")
    custom_logger.CustomLogger = type("CustomLogger", (), {})  # type: ignore[attr-defined]
    for name, mod in {
        "fastapi": fastapi,
        "litellm": types.ModuleType("litellm"),
        "litellm.integrations": types.ModuleType("litellm.integrations"),
        "litellm.integrations.custom_logger": custom_logger,
    }.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv(salting.SECRET_ENV, "s3cret")
    module = types.ModuleType("cache_salt_hook")
    exec(compile(source, "cache_salt_hook.py", "exec"), module.__dict__)
    return module


def _key(team: str | None, user: str | None = None) -> object:
    return types.SimpleNamespace(team_id=team, user_id=user, end_user_id=None)


def _salt(owner: str) -> str:
    return hmac.new(b"s3cret", owner.encode(), hashlib.sha256).hexdigest()


def test_the_litellm_hook_salts_by_team_over_what_the_client_sent(monkeypatch):
    mod = _load_hook(salting.litellm_hook("tenant"), monkeypatch)
    hook = mod.proxy_handler_instance.async_pre_call_hook  # type: ignore[attr-defined]
    data = {"messages": [], "cache_salt": "chosen-by-client", "extra_body": {"x": 1}}
    out = asyncio.run(hook(_key("team-a"), None, data, "completion"))
    assert "cache_salt" not in out
    assert out["extra_body"] == {"x": 1, "cache_salt": _salt("team-a")}
    with pytest.raises(Exception, match="no team") as err:
        asyncio.run(hook(_key(None), None, {"messages": []}, "completion"))
    assert err.value.status_code == 403  # type: ignore[attr-defined]


def test_the_litellm_hook_salts_by_user_within_the_team(monkeypatch):
    mod = _load_hook(salting.litellm_hook("user", "extra_key"), monkeypatch)
    hook = mod.proxy_handler_instance.async_pre_call_hook  # type: ignore[attr-defined]
    out = asyncio.run(hook(_key("team-a"), None, {"user": "u7"}, "completion"))
    assert out["extra_body"] == {"extra_key": _salt("team-a/u7")}
    other = asyncio.run(hook(_key("team-b"), None, {"user": "u7"}, "completion"))
    assert other["extra_body"]["extra_key"] != out["extra_body"]["extra_key"]


def test_the_envoy_filter_is_a_filter_entry_that_refuses_client_salts():
    doc = yaml.safe_load(salting.envoy_filter())
    assert isinstance(doc, list) and doc[0]["name"] == "envoy.filters.http.lua"
    lua = doc[0]["typed_config"]["default_source_code"]["inline_string"]
    assert "function envoy_on_request(request_handle)" in lua
    assert '"cache_salt"' in lua and "setBytes" in lua and '"403"' in lua


def test_the_client_example_is_python():
    import ast

    tree = ast.parse(salting.client_example("tenant"))
    assert any(isinstance(n, ast.FunctionDef) and n.name == "cache_salt" for n in tree.body)


def _bundle(isolation: str) -> dict[str, object]:
    from analyzer.advisor.pilot import pilot_commands

    model = ServedModel(repo="org/m")
    pilot = pilot_commands(
        inputs=["log.jsonl"],
        model=model,
        rate_rps=2.0,
        duration_s=60,
        n_requests=120,
        mean_input_tokens=500,
        mean_output_tokens=50,
        tokenizer="cl100k_base",
        sessions=True,
    )
    sizings = {
        DeployOption.POOLED: deploy_sizing(True),
        DeployOption.LOCAL_OFFLOAD: deploy_sizing(False),
    }
    files = bundle(
        sizings, DeployOption.POOLED, model=model, pilot=pilot, isolation=isolation, tenants=12
    )
    return {f.path: f for f in files}


def test_a_shared_bundle_says_the_pool_is_shared_and_names_the_salt():
    files = _bundle("shared")
    index = files["deploy/README.md"].text  # type: ignore[attr-defined]
    assert "shared across all 12 tenants" in index
    assert "cache_salt" in index and "extra_key" in index
    assert not any(p.startswith("deploy/isolation/") for p in files)
    assert "deploy/pooled/vllm-lmcache-mooncake/launch.sh" in files


@pytest.mark.parametrize("policy", ["tenant", "user"])
def test_an_isolated_bundle_salts_what_holds_and_refuses_what_leaks(policy, tmp_path):
    files = _bundle(policy)
    # vLLM + Mooncake Store and SGLang HiCache key every tier by the salt: written.
    assert "deploy/pooled/vllm-mooncake-store/launch.sh" in files
    assert "deploy/pooled/sglang-hicache-mooncake/launch.sh" in files
    # LMCache's in-process connector drops it through 0.5.6: no settings, a refusal.
    lm = [p for p in files if "lmcache" in p]
    assert lm == [
        "deploy/pooled/vllm-lmcache-mooncake/ISOLATION.md",
        "deploy/local-offload/vllm-lmcache-cpu/ISOLATION.md",
    ]
    refusal = files[lm[0]].text  # type: ignore[attr-defined]
    assert "would share KV blocks across tenants" in refusal and "2878" in refusal
    assert not any("kubernetes/vllm-lmcache" in p for p in files)
    readme = files["deploy/isolation/README.md"].text  # type: ignore[attr-defined]
    assert "kvpool probe" in readme and "SGLang 0.5.20 or later" in readme
    hook = files["deploy/isolation/litellm/cache_salt_hook.py"].text  # type: ignore[attr-defined]
    import ast

    ast.parse(hook)
    assert ("/{data.get('user')" in hook) is (policy == "user")
    for name in ("litellm/config.yaml", "envoy/cache-salt-filter.yaml"):
        yaml.safe_load(files[f"deploy/isolation/{name}"].text)  # type: ignore[attr-defined]
    index = files["deploy/README.md"].text  # type: ignore[attr-defined]
    assert f"Tenant isolation ({policy})" in index and "isolation/README.md" in index
