"""Tenant isolation (analyzer/reuse/isolation.py): the re-keyed trace is the salted one.

Two oracles on generated multi-tenant logs whose tenants share prompts (one product's
system prompt and tools, common documents):

* ingest's own ``--hash-key tenant``, which hashes every block with the tenant in its key:
  the trace re-keyed by tenant has the same block ids, content ids and reuse report;
* a dictionary keyed by ``(group name, chained hash)``, numbered in order of first sight:
  the obviously right re-keying, for every policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.ingest import IngestOptions, open_trace
from analyzer.reuse import ReuseOptions, analyze_reuse
from analyzer.reuse.isolation import (
    POLICIES,
    groups,
    isolate,
    shares_across_groups,
)
from analyzer.trace import BlockTrace

SALT = b"isolation-tests"
PRODUCT = (
    "You are the assistant of Acme Helpdesk, a support product used by many companies. "
    "Answer politely, cite the knowledge base, and never reveal internal notes. " * 6
)
DOCS = tuple(
    f"Knowledge base article {i}: " + ("how to reset a password and configure SSO. " * (8 + i))
    for i in range(4)
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_kb",
            "description": "Search the knowledge base",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


@st.composite
def saas_log(draw: st.DrawFn) -> list[dict]:
    """Requests of several customer organisations on one product: each a system prompt
    (the product's, or sometimes the organisation's own), optional tools, an optional
    common document, then the user's question; sessions resend their history."""
    n = draw(st.integers(1, 24))
    tenants = draw(
        st.lists(st.sampled_from(["org-a", "org-b", "org-c", None]), min_size=n, max_size=n)
    )
    rows = []
    history: dict[str, list[dict]] = {}
    for i, tenant in enumerate(tenants):
        own = draw(st.booleans()) and tenant is not None and draw(st.booleans())
        system = f"You are the private assistant of {tenant}. " * 8 if own else PRODUCT
        session = draw(st.sampled_from([None, "s1", "s2", "s3"]))
        user = draw(st.sampled_from([None, "u1", "u2"]))
        key = f"{tenant}/{session}"
        if session is not None and key in history:
            messages = history[key] + [{"role": "assistant", "content": f"answer {i}"}]
        else:
            messages = [{"role": "system", "content": system}]
            doc = draw(st.sampled_from([None, *range(len(DOCS))]))
            if doc is not None:
                messages.append({"role": "user", "content": DOCS[doc]})
        messages = [*messages, {"role": "user", "content": f"question {draw(st.integers(0, 3))}"}]
        if session is not None:
            history[key] = messages
        body: dict = {"model": "llama-3.1-8b", "messages": messages}
        if draw(st.booleans()):
            body["tools"] = TOOLS
        meta = {}
        if tenant is not None:
            meta["tenant"] = tenant
        if session is not None:
            meta["session_id"] = f"{tenant}-{session}"
        if user is not None:
            body["user"] = f"{tenant}-{user}"
        if meta:
            body["metadata"] = meta
        rows.append({"request_id": f"r{i}", "timestamp": 1_700_000_000 + i, "request": body})
    return rows


def _write(tmp: Path, rows: list[dict]) -> Path:
    p = tmp / "log.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _read(path: Path, **kw: object) -> BlockTrace:
    return open_trace([str(path)], IngestOptions(salt=SALT, **kw)).trace


def _without_hashes(doc: object) -> object:
    """A report's JSON less the block hashes themselves (the salted and the re-keyed trace
    name the same blocks by different 64-bit values)."""
    if isinstance(doc, dict):
        return {k: _without_hashes(v) for k, v in doc.items() if k != "hash"}
    if isinstance(doc, list):
        return [_without_hashes(v) for v in doc]
    return doc


def naive_isolate(trace: BlockTrace, policy: str) -> tuple[list[int], list[int] | None]:
    """Block ids (and content ids) re-keyed by a dictionary over (group, block), where a
    request's group is spelled out from its names as the policy says."""

    def group(i: int) -> tuple:
        t = int(trace.tenant[i])
        tenant = trace.tenant_names[t] if t >= 0 else None
        if policy == "tenant":
            return ("tenant", tenant)
        u = -1 if trace.user is None else int(trace.user[i])
        if u >= 0:
            return ("user", tenant, trace.user_names[u])
        s = int(trace.session[i])
        if s >= 0:
            return ("session", tenant, trace.session_names[s])
        return ("tenant", tenant)

    def renumber(ids: np.ndarray) -> list[int]:
        seen: dict[tuple, int] = {}
        out = []
        for i in range(trace.n_requests):
            g = group(i)
            for b in ids[trace.offsets[i] : trace.offsets[i + 1]]:
                out.append(seen.setdefault((g, int(b)), len(seen)))
        return out

    content = None if trace.content_ids is None else renumber(trace.content_ids)
    return renumber(trace.block_ids), content


@pytest.mark.slow
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=saas_log(), warmup=st.sampled_from([0.0, 0.5]))
def test_keyed_by_tenant_is_what_ingest_hashes_with_the_tenant_key(tmp_path, rows, warmup):
    log = _write(tmp_path, rows)
    shared = _read(log)
    salted = _read(log, hash_keys=("model", "tenant"))
    rekeyed = isolate(shared, "tenant")
    assert np.array_equal(rekeyed.offsets, salted.offsets)
    assert np.array_equal(rekeyed.block_ids, salted.block_ids)
    assert rekeyed.content_ids is not None and salted.content_ids is not None
    assert np.array_equal(rekeyed.content_ids, salted.content_ids)
    assert rekeyed.n_blocks == salted.n_blocks
    assert salted.token_lcp_prev is None and rekeyed.token_lcp_prev is None
    assert rekeyed.meta["hash_keys"] == salted.meta["hash_keys"] == "model,tenant"
    opts = ReuseOptions(warmup=warmup)
    got = analyze_reuse(rekeyed, opts).to_json()
    want = analyze_reuse(salted, opts).to_json()
    assert _without_hashes(got) == _without_hashes(want)
    # Nothing crosses tenants any more; the shared trace never hits less.
    if got["measurable"]:
        assert got["sources"]["tokens"]["cross_tenant"] == 0
        assert analyze_reuse(shared, opts).hit_tokens >= int(got["ceiling"]["hit_tokens"])


@pytest.mark.slow
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=saas_log(), policy=st.sampled_from(POLICIES))
def test_rekeying_equals_a_dictionary_over_group_and_block(tmp_path, rows, policy):
    trace = _read(_write(tmp_path, rows))
    got = isolate(trace, policy)
    ids, content = naive_isolate(trace, policy) if policy != "shared" else (None, None)
    if policy == "shared":
        assert got is trace
        assert not shares_across_groups(trace, policy)
        return
    assert got.block_ids.tolist() == ids
    assert got.content_ids is not None and got.content_ids.tolist() == content
    # Each new block keeps its old hash plus its group's: equal hashes, equal blocks.
    assert np.unique(got.block_hashes).size == got.n_blocks
    assert shares_across_groups(trace, policy) == (got.n_blocks > trace.n_blocks)
    grp = groups(trace, policy)
    assert grp.by_user + grp.by_session + grp.by_tenant == trace.n_requests


def test_user_policy_never_shares_more_than_tenant_policy(tmp_path):
    rows = [
        {
            "request_id": f"r{i}",
            "timestamp": 1_700_000_000 + i,
            "request": {
                "model": "m",
                "user": f"u{i % 3}",
                "messages": [
                    {"role": "system", "content": PRODUCT},
                    {"role": "user", "content": "hello"},
                ],
                "metadata": {"tenant": f"t{i % 2}"},
            },
        }
        for i in range(30)
    ]
    trace = _read(_write(tmp_path, rows))
    cold = ReuseOptions(warmup=0.0)
    rates = {p: analyze_reuse(isolate(trace, p), cold).ceiling_hit_rate for p in POLICIES}
    assert rates["shared"] > rates["tenant"] > rates["user"] > 0
    grp = groups(trace, "user")
    assert (grp.by_user, grp.by_session, grp.by_tenant) == (30, 0, 0)
    assert grp.n_groups == 6  # three users in each of two tenants
    assert trace.user_names and all(u.startswith("u-") for u in trace.user_names)


@pytest.mark.slow
def test_fields_named_on_the_command_line_give_tenant_and_user(tmp_path):
    rows = [
        {
            "ts": 1_700_000_000 + i,
            "request_json": json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "hi " * 40}]}
            ),
            "org": {"slug": f"org{i % 2}"},
            "caller": f"person{i % 4}",
        }
        for i in range(8)
    ]
    log = _write(tmp_path, rows)
    trace = _read(
        log, tenant_field="org.slug", user_field="caller", time_field="ts", keep_names=True
    )
    assert sorted(trace.tenant_names) == ["org0", "org1"]
    assert trace.user is not None and len(trace.user_names) == 4
    # A path into a cell holding JSON text, and a field some rows lack.
    trace = _read(log, tenant_field="request_json.model", user_field="nobody", time_field="ts")
    assert trace.tenant_names == ["m"] and trace.user is None


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["tenant", "user"])
def test_a_one_tenant_log_loses_nothing(tmp_path, policy):
    rows = [
        {
            "request_id": f"r{i}",
            "timestamp": 1_700_000_000 + i,
            "request": {
                "model": "m",
                "messages": [
                    {"role": "system", "content": PRODUCT},
                    {"role": "user", "content": f"q{i}"},
                ],
            },
        }
        for i in range(10)
    ]
    trace = _read(_write(tmp_path, rows))
    assert not shares_across_groups(trace, policy)
    got = isolate(trace, policy)
    assert np.array_equal(got.block_ids, trace.block_ids)
    assert analyze_reuse(got).ceiling_hit_rate == analyze_reuse(trace).ceiling_hit_rate


@pytest.mark.slow
def test_a_saas_log_isolated_by_tenant_hits_less_exactly_as_the_tenant_hash_key(tmp_path):
    """The issue's "Done when": a log whose customer organisations share the product's
    system prompt, tools and documents (`kvpool synth --profile saas`) has an isolated
    ceiling below the shared one, equal to `kvpool reuse --hash-key tenant`."""
    from typer.testing import CliRunner

    from analyzer.cli import app

    log = tmp_path / "saas.jsonl"
    run = CliRunner().invoke
    r = run(app, ["synth", "--profile", "saas", "-n", "800", "--seed", "3", "-o", str(log)])
    assert r.exit_code == 0, r.output
    docs = {}
    for name, flags in {
        "shared": [],
        "tenant": ["--isolation", "tenant"],
        "hash-key": ["--hash-key", "tenant"],
        "user": ["--isolation", "user"],
    }.items():
        out = tmp_path / f"{name}.json"
        r = run(app, ["-q", "reuse", str(log), "--salt-file", str(tmp_path / "salt"), *flags,
                      "--json", str(out)])  # fmt: skip
        assert r.exit_code == 0, r.output
        docs[name] = json.loads(out.read_text())
    ceiling = {k: d["ceiling"] for k, d in docs.items()}
    assert ceiling["tenant"] == ceiling["hash-key"]
    assert (
        ceiling["user"]["hit_rate"] < ceiling["tenant"]["hit_rate"] < ceiling["shared"]["hit_rate"]
    )
    assert docs["shared"]["sources"]["share_of_hits"]["cross_tenant"] > 0.3
    assert docs["tenant"]["sources"]["share_of_hits"]["cross_tenant"] == 0
    assert _without_hashes(docs["tenant"]["curves"]) == _without_hashes(docs["hash-key"]["curves"])
    assert docs["tenant"]["isolation"] == "tenant"


@pytest.mark.slow
def test_the_replay_of_the_rekeyed_trace_is_the_replay_of_the_salted_one(tmp_path):
    """Replay runs under the policy by replaying the re-keyed trace: with the same block
    ids as ingest's --hash-key tenant, every scenario's figures are the same."""
    from analyzer.replay import ClusterConfig, run_replay

    log = tmp_path / "saas.jsonl"
    from analyzer.synth import SynthConfig, generate

    generate(SynthConfig(profile="saas", requests=300, seed=5), log)
    shared = _read(log)
    salted = _read(log, hash_keys=("model", "tenant"))
    rekeyed = isolate(shared, "tenant")
    assert np.array_equal(rekeyed.block_ids, salted.block_ids)
    cfg = ClusterConfig(instances=2, local_capacity_tokens=40_000, pool_capacity_tokens=200_000)
    got = run_replay(rekeyed, cfg, scenarios=("local", "pooled"), search_rate=False)
    want = run_replay(salted, cfg, scenarios=("local", "pooled"), search_rate=False)
    assert got.to_json()["scenarios"] == want.to_json()["scenarios"]
    plain = run_replay(shared, cfg, scenarios=("pooled",), search_rate=False)
    assert plain.scenarios["pooled"].hit_rate > got.scenarios["pooled"].hit_rate


@pytest.mark.slow
def test_golden_ragpulse_keyed_by_user(shared_traces):
    """RAGPulse names sessions but no tenants: keyed by tenant nothing changes; keyed by
    user (a session standing in for its owner) the ceiling falls from 31.4% to 11.5%:
    most of its reuse is retrieved passages and system prompts shared across users."""
    from analyzer.ingest import open_trace

    trace = open_trace([str(shared_traces / "ragpulse" / "0_trace.jsonl")]).trace
    opts = ReuseOptions(policies=("lru",))
    got = {p: analyze_reuse(isolate(trace, p), opts) for p in POLICIES}
    assert got["shared"].ceiling_hit_rate == pytest.approx(0.313634, abs=1e-6)
    assert got["tenant"].ceiling_hit_rate == got["shared"].ceiling_hit_rate
    assert got["user"].ceiling_hit_rate == pytest.approx(0.114736, abs=1e-6)
    assert (got["shared"].n_blocks, got["user"].n_blocks) == (893_022, 1_151_968)
    assert not shares_across_groups(trace, "tenant") and shares_across_groups(trace, "user")


def test_the_isolation_sentence_states_the_share_the_price_and_both_hit_rates():
    from analyzer.advisor.isolation import OptionIsolation, PolicyFigures, sentence

    def fig(hit: float, usd: float | None) -> PolicyFigures:
        return PolicyFigures(hit, 0.1, 0.2, 2, usd, True)

    pooled = OptionIsolation(
        "pooled",
        {"shared": fig(0.6, 1000.0), "tenant": fig(0.5, 1250.4), "user": fig(0.3, 900.0)},
        1 - 0.5 / 0.6,
        {"tenant": 250.4, "user": -100.0},
    )
    assert sentence(12, 0.4, pooled) == (
        "a pool shared across 12 tenants serves 40% of its hits from another tenant's "
        "prompts; isolating costs $250/month and takes its hit rate from 60.0% to 50.0%"
    )
    assert sentence(12, 0.4, pooled, "user").endswith(
        "; per end user, it saves $100/month and takes its hit rate from 60.0% to 30.0%"
    )
    assert sentence(1, 0.0, pooled).startswith(
        "a pool shared across 1 tenant serves none of its hits"
    )
    unpriced = OptionIsolation("pooled", {"shared": fig(0.6, None), "tenant": fig(0.5, None)},
                               None, {"tenant": None})  # fmt: skip
    assert "isolating has no monthly price (the option is not priced)" in sentence(3, 0.1, unpriced)
    assert sentence(3, 0.1, None).endswith("no pooled option was sized, so the price of "
                                           "isolating it is not known")  # fmt: skip
    # The verdict deploys the HBM prefix cache: its price of isolating, the pool's beside.
    local = OptionIsolation(
        "local",
        {"shared": fig(0.55, 800.0), "tenant": fig(0.45, 800.0), "user": fig(0.25, 800.0)},
        1 - 0.45 / 0.55,
        {"tenant": 0.0, "user": 0.0},
    )
    assert sentence(12, 0.4, pooled, "shared", local) == (
        "a pool shared across 12 tenants serves 40% of its hits from another tenant's "
        "prompts; isolating the recommended HBM prefix cache only costs $0/month and takes "
        "its hit rate from 55.0% to 45.0%; isolating a pooled KV store costs $250/month"
    )
    assert sentence(12, 0.4, pooled, "user", local).endswith(
        "; per end user, it costs $0/month and takes its hit rate from 55.0% to 25.0%; "
        "isolating a pooled KV store costs $250/month (per end user, it saves $100/month)"
    )
    assert sentence(12, 0.4, None, "shared", local).endswith("from 55.0% to 45.0%")
    assert sentence(12, 0.4, pooled, "shared", pooled) == sentence(12, 0.4, pooled)
