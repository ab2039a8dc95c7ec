"""Several models in one log: never a block shared across models, per-model figures in
`kvpool reuse --json` and report.json, each model planned as itself, --model with
--only-model, unknown models a one-line error, served and vendor names matched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

from analyzer.advisor.models import select_model, served_models
from analyzer.cli import app
from analyzer.cost import recognize_model
from analyzer.errors import UsageError
from analyzer.ingest import IngestOptions, open_trace
from analyzer.report.document import report_json
from analyzer.reuse import ReuseOptions, analyze_reuse

ROOT = Path(__file__).resolve().parents[2]
SALT = b"s" * 32
# Three ways a gateway names three models: a Hugging Face repo, another, an alias.
MODELS = ("meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "llama3.1-8b")


def _chat_lines(n: int) -> list[str]:
    with open(ROOT / "traces" / "chat.jsonl.zst", "rb") as fh:
        return zstandard.ZstdDecompressor().stream_reader(fh).read().decode().splitlines()[:n]


def three_model_log(tmp_path: Path, n: int = 240) -> tuple[Path, list[Path]]:
    """Chat requests dealt to three models by session, each request also sent to the
    next model (so the same prompts reach two models); plus one file per model."""
    rows: list[list[dict]] = [[], [], []]
    everything = []
    for k, line in enumerate(_chat_lines(n)):
        rec = json.loads(line)
        sess = rec["request"].get("metadata", {}).get("session_id") or rec["request_id"]
        m = sum(map(ord, sess)) % 3
        for j in (m, (m + 1) % 3):
            r = json.loads(line)
            r["request_id"] = f"{rec['request_id']}-{j}"
            r["request"]["model"] = MODELS[j]
            r["timestamp"] = rec["timestamp"] + 1e-3 * j
            rows[j].append(r)
            everything.append((k, j, r))
    log = tmp_path / "three.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for _, _, r in everything))
    parts = []
    for j in range(3):
        p = tmp_path / f"model{j}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows[j]))
        parts.append(p)
    return log, parts


def test_served_names_are_recognized_against_the_catalog():
    assert [recognize_model(m) for m in MODELS] == ["llama-3.1-70b", "qwen2.5-32b", "llama-3.1-8b"]
    assert recognize_model("Llama-3.1-8B-Instruct-FP8") == "llama-3.1-8b"
    assert recognize_model("gpt-4o") is None


@pytest.mark.slow
def test_no_block_is_shared_across_models(tmp_path):
    log, _ = three_model_log(tmp_path)
    table = open_trace([log], IngestOptions(salt=SALT)).table
    blocks: dict[str, set[int]] = {}
    for name, hashes in zip(
        table.column("model").to_pylist(), table.column("block_hashes").to_pylist(), strict=True
    ):
        blocks.setdefault(name, set()).update(hashes)
    assert set(blocks) == set(MODELS)
    a, b, c = (blocks[m] for m in MODELS)
    assert a and b and c and not (a & b) and not (b & c) and not (a & c)
    # without the model in the key the same prompts would share: the test can fail
    shared = open_trace([log], IngestOptions(salt=SALT, hash_keys=())).table
    flat: dict[str, set[int]] = {}
    for name, hashes in zip(
        shared.column("model").to_pylist(), shared.column("block_hashes").to_pylist(), strict=True
    ):
        flat.setdefault(name, set()).update(hashes)
    assert flat[MODELS[0]] & flat[MODELS[1]]


@pytest.mark.slow
def test_reuse_json_has_per_model_figures_equal_to_each_model_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log, parts = three_model_log(tmp_path)
    out = tmp_path / "reuse.json"
    r = CliRunner().invoke(app, ["reuse", str(log), "--json", str(out), "--model", "mistral-7b"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    md = doc["models"]
    assert md["count"] == 3 and md["block_key_includes_model"] is True
    # a fourth model named by --model: a warning naming both
    assert "mistral-7b" in md["warning"] and all(m in md["warning"] for m in MODELS)
    assert "capacity, not hits" in md["shared_pool_note"]
    per = {m["model"]: m for m in md["per_model"]}
    assert set(per) == set(MODELS)
    for j, name in enumerate(MODELS):
        alone = analyze_reuse(open_trace([parts[j]], IngestOptions()).trace, ReuseOptions())
        m = per[name]
        assert m["requests"] == alone.n_requests
        assert m["ceiling_hit_rate"] == pytest.approx(alone.ceiling_hit_rate, abs=1e-6)
        assert m["cold_ceiling_hit_rate"] == pytest.approx(alone.cold_ceiling_hit_rate, abs=1e-6)
        curve = [(p["capacity_tokens"], p["hit_rate"]) for p in m["hit_ratio_curve"]]
        assert curve == [(p.capacity_tokens, round(p.hit_rate, 6)) for p in alone.curves()["lru"]]
        assert m["catalog_id"] == recognize_model(name)
        assert m["kv_bytes_per_token"] > 0
        assert m["footprint_gb"] == pytest.approx(
            alone.footprint_tokens * m["kv_bytes_per_token"] / 1e9, rel=1e-6
        )
    assert sum(m["requests"] for m in per.values()) == doc["trace"]["requests"]
    # no warning when --model is one of the log's (an alias of the served name)
    out2 = tmp_path / "reuse2.json"
    r = CliRunner().invoke(app, ["reuse", str(log), "--json", str(out2), "--model", "qwen2.5-32b"])
    assert r.exit_code == 0 and "warning" not in json.loads(out2.read_text())["models"]


@pytest.mark.slow
def test_only_model_keeps_one_model(tmp_path):
    log, parts = three_model_log(tmp_path)
    loaded = open_trace([log], IngestOptions(salt=SALT))
    one = select_model(loaded, "qwen2.5-32b")  # a catalog id for Qwen/Qwen2.5-32B-Instruct
    assert [m.name for m in served_models(one.table)] == [MODELS[1]]
    alone = open_trace([parts[1]], IngestOptions(salt=SALT))
    assert one.trace.n_requests == alone.trace.n_requests
    assert (
        one.table.column("prompt_tokens").to_pylist()
        == alone.table.column("prompt_tokens").to_pylist()
    )
    with pytest.raises(UsageError, match="names no such model"):
        select_model(loaded, "mistral-7b")


@pytest.mark.slow
def test_the_logs_models_are_planned_as_themselves_by_default(tmp_path):
    """No --model: each model the log names is planned on GPUs of its own, at the
    smallest tensor parallelism that holds it with a working KV budget, and the fleet is
    the sum of its plans."""
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.advisor.price import fit_tp, working_kv_tokens

    log, parts = three_model_log(tmp_path)
    r = run_analysis([str(log)], AnalyzeOptions(sensitivity_replays=False))
    doc = report_json(r)
    plans = [p for p in doc["plans"] if p["option"] == "local"]
    assert {p["served_as"] for p in plans} == set(MODELS)
    for p in plans:
        alone = open_trace([parts[MODELS.index(p["served_as"])]], IngestOptions()).trace
        fit = fit_tp(p["model"], "h100", "bf16", None, working_kv_tokens(alone))
        assert fit is not None and p["tp"] == fit[1]
        if p["status"] == "meets-slo":
            assert p["gpus"] == p["instances"] * p["tp"]
    tp = {p["model"]: p["tp"] for p in plans}
    assert tp["llama-3.1-8b"] == 1 and tp["llama-3.1-70b"] >= 2  # 141 GB of weights
    for option, f in doc["fleet"].items():
        mine = [p for p in doc["plans"] if p["option"] == option]
        if f["gpus"] is not None:
            assert f["gpus"] == sum(p["gpus"] for p in mine)
            assert f["instances"] == sum(p["instances"] for p in mine)
            assert f["money"]["total_usd_month"] == pytest.approx(
                sum(p["money"]["total_usd_month"] for p in mine), rel=1e-5
            )
    assert doc["warnings"] == []


@pytest.mark.slow
def test_model_flag_on_a_log_of_several_needs_only_model(tmp_path):
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.replay import ClusterConfig

    log, _ = three_model_log(tmp_path)
    forced = AnalyzeOptions(
        cluster=ClusterConfig(model="mistral-7b"), model_given=True, size_search=False
    )
    with pytest.raises(UsageError, match="--model mistral-7b names one model, but the log names 3"):
        run_analysis([str(log)], forced)
    only = report_json(
        run_analysis(
            [str(log)],
            AnalyzeOptions(
                cluster=ClusterConfig(model="mistral-7b"),
                model_given=True,
                only_model="llama3.1-8b",
                size_search=False,
            ),
        )
    )
    assert [m["model"] for m in only["models"]["per_model"]] == [MODELS[2]]
    assert only["options"]["model"] == "mistral-7b"


def test_an_unknown_model_is_one_line_naming_it_with_the_way_out(tmp_path):
    log, _ = three_model_log(tmp_path, n=60)
    text = log.read_text().replace("Qwen/Qwen2.5-32B-Instruct", "acme/house-model-13b")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    res = CliRunner().invoke(app, ["analyze", str(bad), "-o", str(tmp_path)])
    assert res.exit_code != 0
    assert isinstance(res.exception, UsageError)  # exit 2 at the command line
    first, hint = str(res.exception).split("\n", 1)
    assert "acme/house-model-13b" in first  # one line naming it
    assert "hint:" in hint and "--model path/to/config.json" in hint


def test_quantized_and_vendor_names_are_matched():
    from analyzer.cost import get_gpu
    from analyzer.cost.catalog import quantization_of

    assert recognize_model("Qwen/Qwen2.5-32B-Instruct-AWQ") == "qwen2.5-32b"
    assert recognize_model("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic") == "llama-3.1-8b"
    assert quantization_of("Qwen/Qwen3-32B-FP8") == "fp8"
    assert quantization_of("Qwen/Qwen2.5-32B-Instruct-AWQ") is None
    for name in ("H100-SXM", "H100 80GB HBM3", "h100_sxm", "NVIDIA H100 80GB HBM3", "p5.48xlarge"):
        assert get_gpu(name).id == "h100", name
    assert get_gpu("L40S").id == "l40s"
    with pytest.raises(UsageError):
        get_gpu("H100 PCIe")  # another product: not planned as the SXM part


@pytest.mark.slow
def test_the_report_shows_each_models_figures(tmp_path):
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.report.document import ReportDocument
    from analyzer.report.outline import sections

    log, _ = three_model_log(tmp_path)
    doc = ReportDocument.of(run_analysis([str(log)], AnalyzeOptions(sensitivity_replays=False)))
    (ms,) = [s for s in sections(doc.report) if s.id == "models"]
    (table,) = ms.tables
    assert all(len(row) == len(table.header) for row in table.rows)
    assert {row[0] for row in table.rows} == set(MODELS)
    assert any("capacity, not hits" in p for p in ms.paragraphs)
