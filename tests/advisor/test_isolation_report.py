"""The issue's "Done when" for tenant isolation, end to end through `kvpool analyze`.

A SaaS log whose twelve customer organisations share the product's system prompt, tools
and documents (`kvpool synth --profile saas`):

* the isolated ceiling is below the shared one and equals `kvpool reuse --hash-key
  tenant`;
* report.json carries the isolation section, with money for both policies;
* the shared report names cache_salt / extra_key;
* the isolated run's deploy/ carries the per-tenant salt settings, or the stated refusal
  for a product version that would leak.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.advisor.words import OPTION_NAME, usd
from analyzer.cli import app
from analyzer.report.document import ReportDocument

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("isolation")
    log = d / "saas.jsonl"
    run = CliRunner().invoke
    r = run(app, ["synth", "--profile", "saas", "-n", "600", "--seed", "7", "-o", str(log)])
    assert r.exit_code == 0, r.output
    salt = ["--salt-file", str(d / "salt")]
    out = {"log": log, "salt": d / "salt"}
    for policy in ("shared", "tenant"):
        report = d / policy
        report.mkdir()
        r = run(
            app,
            ["-q", "analyze", str(log), *salt, "-o", str(report), "--isolation", policy],
        )
        assert r.exit_code == 0, r.output
        out[policy] = report
    return out


def _doc(report: Path) -> dict:
    return json.loads((report / "report.json").read_text())


def test_the_isolated_ceiling_is_below_the_shared_one_and_the_tenant_hash_keys(runs):
    iso = _doc(runs["tenant"])["isolation"]
    r = CliRunner().invoke(
        app,
        ["-q", "reuse", str(runs["log"]), "--salt-file", str(runs["salt"]),
         "--hash-key", "tenant", "--json", str(runs["log"].with_suffix(".reuse.json"))],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    hashed = json.loads(runs["log"].with_suffix(".reuse.json").read_text())["ceiling"]
    assert iso["ceiling"]["tenant"] == hashed["hit_rate"]
    assert iso["ceiling"]["tenant"] < iso["ceiling"]["shared"]
    # The tenant-keyed analysis's own reuse is that ceiling, with no cross-tenant hits.
    own = _doc(runs["tenant"])["reuse"]["analysis"]
    assert own["ceiling"]["hit_rate"] == hashed["hit_rate"]
    assert own["sources"]["tokens"]["cross_tenant"] == 0


def test_report_json_carries_the_section_with_money_for_both_policies(runs):
    for policy in ("shared", "tenant"):
        doc = _doc(runs[policy])
        view = ReportDocument.from_json(doc).report.isolation
        assert view is not None and view.policy == policy
        assert view.tenants == 12 and view.shares_across_tenants
        assert {"shared", "tenant", "user"} <= set(view.policies)  # the log names users
        pooled = view.options["pooled"]
        for p in ("shared", "tenant"):
            figures = pooled.policies[p]
            assert figures.total_usd_month and figures.total_usd_month > 0
            assert figures.gpus and figures.hit_rate is not None
        assert pooled.policies["tenant"].hit_rate < pooled.policies["shared"].hit_rate
        assert pooled.isolating_usd_month["tenant"] is not None
        # Most of a shared pool's hits come from another tenant's copy of the product's
        # prompts, but each tenant re-warms its own: isolating loses far fewer hits.
        shared_reuse = _doc(runs["shared"])["reuse"]["analysis"]["sources"]["share_of_hits"]
        assert view.cross_tenant_hit_share == shared_reuse["cross_tenant"] > 0.3
        assert pooled.hits_lost_share is not None
        assert 0 < pooled.hits_lost_share < view.cross_tenant_hit_share
        # Each option's own share, from its replay at size: shared, some of its hits are
        # another tenant's blocks; salted, none is.
        for o in view.options.values():
            own = o.policies["shared"].cross_tenant_hit_share
            assert own is not None and 0 < own <= 1
            for p in ("tenant", "user"):
                assert o.policies[p].cross_tenant_hit_share == 0
        # The sentence speaks of the pool's own share.
        share = f"{pooled.policies['shared'].cross_tenant_hit_share:.0%}"
        assert view.sentence.startswith(f"a pool shared across 12 tenants serves {share} of ")
        assert "another tenant's prompts; isolat" in view.sentence and view.material
        # The sentence prices the verdict's option; the pool's price beside any other.
        chosen = doc["verdict"]["scenario"]
        assert doc["isolation"]["recommended_option"] == chosen
        if chosen != "pooled":
            local = usd(view.options[chosen].isolating_usd_month["tenant"])
            assert f"isolating the recommended {OPTION_NAME[chosen]} costs {local}/month" in (
                view.sentence
            )
            pool = usd(pooled.isolating_usd_month["tenant"])
            assert view.sentence.endswith(f"; isolating a pooled KV store costs {pool}/month")
    # Both runs plan the same options under the same policies: the same figures.
    a, b = (_doc(runs[p])["isolation"]["options"] for p in ("shared", "tenant"))
    assert a == b


def test_the_shared_report_names_the_salt_and_says_the_pool_is_shared(runs):
    md = (runs["shared"] / "report.md").read_text()
    section = md[md.index("## Tenant isolation") :]
    assert "cache_salt" in section and "extra_key" in section
    assert "shared across the log's 12 tenants" in section
    assert "| Hits from another tenant |" in section
    index = (runs["shared"] / "deploy" / "README.md").read_text()
    assert "This pool is shared across all 12 tenants" in index and "cache_salt" in index
    assert not (runs["shared"] / "deploy" / "isolation").exists()
    # The share is material (a SaaS's prompts), so the summary names isolation.
    last = _doc(runs["shared"])["summary"][-1]
    assert "another tenant's prompts" in last and "cache_salt" in last and "extra_key" in last
    # tenant names never appear without --keep-names
    assert "org-0" not in md and "org-0" not in (runs["shared"] / "report.json").read_text()


def test_the_isolated_bundle_sets_the_salt_or_refuses(runs):
    deploy = runs["tenant"] / "deploy"
    assert (deploy / "isolation" / "litellm" / "cache_salt_hook.py").is_file()
    readme = (deploy / "isolation" / "README.md").read_text()
    assert "HMAC-SHA256" in readme and "kvpool probe" in readme
    written = {p.relative_to(deploy).as_posix() for p in deploy.rglob("*") if p.is_file()}
    lmcache = [p for p in written if "lmcache" in p]
    assert lmcache and all(p.endswith("ISOLATION.md") for p in lmcache)
    refusal = (deploy / lmcache[0]).read_text()
    assert "would share KV blocks across tenants" in refusal
    assert any(p.endswith("launch.sh") for p in written)  # the stacks that hold are kept
    doc = _doc(runs["tenant"])
    assert "Every figure is with a cache salt per tenant" in doc["summary"][-1]
    gates = {g["id"] for g in doc["gates"]["plan"]}
    assert "isolation" in gates


def test_the_section_says_which_stacks_of_the_bundle_a_salt_holds_on(runs):
    """`isolation.products`: each stack of the bundle, whether every tier keys by the salt
    at the versions it targets; the isolated bundle writes exactly those that hold and a
    refusal, in the report's words, for the others; the shared report says it already."""
    for policy in ("shared", "tenant"):
        doc = _doc(runs[policy])
        products = doc["isolation"]["products"]
        stacks = {(f["option"], f["stack"]) for f in doc["deploy"]["files"]}
        assert products and {(p["option"], p["stack"]) for p in products} <= stacks
        # vLLM's in-process LMCache connector drops the salt in every release the bundle
        # targets; every other stack keys every tier by it.
        refused = [p for p in products if not p["holds"]]
        assert refused and all("LMCache" in p["stack"] for p in refused)
        for p in products:
            assert (p["refusal"] is None) is p["holds"] is (not p["leaks"])
            assert p["leaks"] == (["lmcache-vllm-inprocess"] if "LMCache" in p["stack"] else [])
        md = (runs[policy] / "report.md").read_text()
        section = md[md.index("## Tenant isolation") :]
        assert "| deploy/ folder | Stack | Keys every tier by the salt | Needs |" in section
        assert "would share KV blocks across tenants" in section
    deploy = _doc(runs["tenant"])["deploy"]["files"]
    for p in _doc(runs["tenant"])["isolation"]["products"]:
        written = [f for f in deploy if (f["option"], f["stack"]) == (p["option"], p["stack"])]
        if p["holds"]:
            assert any(f["path"].endswith("launch.sh") for f in written)
        else:
            [refusal] = written
            assert refusal["path"].endswith("ISOLATION.md")
            assert p["refusal"] in refusal["text"].replace("\\", "")


def test_the_summary_names_isolation_only_when_it_matters(runs):
    """Under `shared` a small cross-tenant share leaves the summary at three sentences; a
    material one, or an isolated analysis, adds the fourth."""
    from dataclasses import replace

    from analyzer.report.summary import summary_sentences

    shared = ReportDocument.from_json(_doc(runs["shared"])).report
    assert shared.isolation is not None and shared.isolation.material
    assert len(summary_sentences(shared)) == 4
    small = replace(shared, isolation=replace(shared.isolation, material=False))
    assert len(summary_sentences(small)) == 3
    isolated = ReportDocument.from_json(_doc(runs["tenant"])).report
    assert isolated.isolation is not None
    keyed = replace(isolated, isolation=replace(isolated.isolation, material=False))
    assert summary_sentences(keyed)[-1].startswith("Every figure is with a cache salt per tenant")


def test_without_a_size_search_the_section_carries_the_ceilings(runs, tmp_path):
    """Nothing sized (`--no-size-search`): the section still measures every policy's
    ceiling and the cross-tenant share, says isolating is not priced, and plans nothing."""
    r = CliRunner().invoke(
        app,
        ["-q", "analyze", str(runs["log"]), "--salt-file", str(runs["salt"]),
         "--isolation", "tenant", "--no-size-search", "-o", str(tmp_path / "out")],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    iso = _doc(tmp_path / "out")["isolation"]
    full = _doc(runs["tenant"])["isolation"]
    assert iso["ceiling"] == full["ceiling"] and iso["options"] == {}
    assert iso["cross_tenant_hit_share"] == full["cross_tenant_hit_share"] > 0.3
    assert iso["sentence"].endswith("no pooled option was sized, so the price of isolating it "
                                    "is not known")  # fmt: skip
