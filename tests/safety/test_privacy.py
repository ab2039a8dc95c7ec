"""Private by default: a canary string planted in prompts, system prompts, tenant names,
user and session fields, request ids and the input file's own name appears in no file
any command writes with default flags (docs/security.md).

Every byte written is searched: Parquet (decompressed and read back as values, where
the zstd pages would hide the text), gzip, JSON (also with its escapes undone), the
reports, and the terminal output (where only file names may appear: the user's own
terminal names the files they gave; prompts and tenants never).
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

SECRET = "Zq7canaryXv"  # unlike anything kvpool or a tokenizer would produce


def _log(d: Path) -> Path:
    """An OpenAI chat log whose every private field carries the canary."""
    p = d / f"acme-{SECRET}-gateway.jsonl"
    lines = []
    for i in range(80):
        lines.append(
            json.dumps(
                {
                    "request_id": f"req-{SECRET}-{i}",
                    "timestamp": 1_700_000_000 + i * 3,
                    "tenant": f"tenant-{SECRET}-{i % 3}",
                    "user": f"{SECRET}@example.com",
                    "session_id": f"sess-{SECRET}-{i % 7}",
                    "request": {
                        "model": "llama-3.1-8b",
                        "messages": [
                            {
                                "role": "system",
                                "content": f"You are the {SECRET} assistant. " * 30,
                            },
                            {"role": "user", "content": f"question {i} about {SECRET}"},
                        ],
                    },
                }
            )
        )
    p.write_text("\n".join(lines) + "\n")
    return p


def _texts(path: Path) -> list[str]:
    """What a reader of ``path`` could see in it, in every form it may take."""
    data = path.read_bytes()
    out = [data.decode("latin-1")]
    if data[:2] == b"\x1f\x8b":
        out.append(gzip.decompress(data).decode("latin-1"))
    if data[:4] == b"PAR1":
        t = pq.read_table(path)
        out.append(str(t.schema.metadata))
        out.append(json.dumps(t.to_pylist(), default=str))
    if path.suffix == ".json":
        out.append(json.dumps(json.loads(data), ensure_ascii=False))
    return out


# Loaded by every Python process of a run (the command and its workers) through
# PYTHONPATH: a connection to a network address or a name lookup is written to
# $KVPOOL_TEST_NET_LOG and refused, so a command that tries one fails and says where.
NET_GUARD = """
import os
import socket

_log = os.environ.get("KVPOOL_TEST_NET_LOG")
if _log:
    def _refuse(what):
        with open(_log, "a") as f:
            f.write(f"{os.getpid()} {what}\\n")
        raise OSError(f"the offline test refuses {what}")

    _connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _refuse(f"connect {address!r}")
        return _connect(self, address)

    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _refuse(f"connect {address!r}")
        return _connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        _refuse(f"lookup {host!r}")

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.getaddrinfo = getaddrinfo
"""


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    guard = cwd / "net-guard"
    if not guard.is_dir():
        guard.mkdir()
        (guard / "sitecustomize.py").write_text(NET_GUARD)
    path = os.pathsep.join(p for p in (str(guard), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "analyzer.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={
            **os.environ,
            "KVPOOL_NO_PROGRESS": "1",
            "COLUMNS": "200",
            "PYTHONPATH": path,
            "KVPOOL_TEST_NET_LOG": str(cwd / "net.log"),
        },
    )


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> tuple[Path, list[subprocess.CompletedProcess]]:
    d = tmp_path_factory.mktemp("canary")
    log = _log(d).name
    # A model is named by its config (or its folder): that name is the user's to choose.
    model = d / "config.json"
    model.write_text(
        json.dumps(
            {
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "vocab_size": 128256,
            }
        )
    )
    (d / "out").mkdir()
    runs = [
        _run("convert", str(d / log), "-o", "out/t.parquet", cwd=d),
        _run("convert", log, "--to", "mooncake", "-o", "out/m.jsonl.gz", cwd=d),
        _run("convert", log, "--to", "bailian", "-o", "out/b.jsonl", cwd=d),
        _run("reuse", log, "--json", "out/reuse.json", cwd=d),
        _run("reuse", "out/t.parquet", "--json", "out/reuse2.json", cwd=d),
        _run(
            "replay",
            log,
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--instances",
            "2",
            "--json",
            "out/replay.json",
            cwd=d,
        ),
        _run("analyze", str(d / log), "-o", "out/report", "--no-rate-search", cwd=d),
        _run(
            "cost", "show", "--model", str(model), "--gpu", "h100", "--json", "out/cost.json", cwd=d
        ),
    ]
    bench = d / "bench.csv"
    bench.write_text("metric,value\nmean_ttft_s,0.4\np99_ttft_ms,1500\n")
    runs.append(
        _run(
            "validate",
            "bench.csv",
            "--report",
            "out/report/report.json",
            "--json",
            "out/validate.json",
            cwd=d,
        )
    )
    return d / "out", runs


@pytest.mark.slow
def test_every_command_ran(outputs) -> None:
    _, runs = outputs
    for r in runs:
        assert r.returncode in (0, 5), (r.args, r.stderr[-2000:])


def test_no_command_opened_a_network_connection(outputs) -> None:
    """Offline (docs/security.md, 1): every command above, its worker processes
    included, ran without connecting to a network address or looking up a name."""
    out, _ = outputs
    net_log = out.parent / "net.log"
    assert not net_log.exists(), net_log.read_text()
    guarded = out.parent / "net-guard" / "sitecustomize.py"
    assert guarded.is_file()
    # the guard is live: a run that does connect is caught
    probe = subprocess.run(
        [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9))"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPATH": str(guarded.parent),
            "KVPOOL_TEST_NET_LOG": str(out.parent / "probe-net.log"),
        },
    )
    assert probe.returncode != 0 and "the offline test refuses" in probe.stderr
    assert (out.parent / "probe-net.log").read_text().strip()


def test_no_output_file_carries_the_canary(outputs) -> None:
    out, _ = outputs
    files = [p for p in out.rglob("*") if p.is_file()]
    names = {p.relative_to(out).as_posix() for p in files}
    assert {"t.parquet", "m.jsonl.gz", "b.jsonl", "reuse.json", "replay.json"} <= names
    assert {"report/report.json", "report/report.md", "report/report.html"} <= names
    for p in files:
        for text in _texts(p):
            assert SECRET not in text, f"{p.name} carries the canary"
            assert str(out.parent) not in text, f"{p.name} carries a path"


def test_terminal_output_carries_no_prompt_or_tenant(outputs) -> None:
    _, runs = outputs
    for r in runs:
        for stream in (r.stdout, r.stderr):
            # The file name may be echoed ("wrote ..."); nothing else may.
            cleaned = stream.replace(f"acme-{SECRET}-gateway.jsonl", "LOG")
            assert SECRET not in cleaned, (r.args, stream[-1500:])


@pytest.mark.slow
def test_asking_for_names_and_previews_shows_them(tmp_path) -> None:
    log = _log(tmp_path).name
    (tmp_path / "o").mkdir()
    r = _run("convert", log, "-o", "o/t.parquet", "--keep-names", "--keep-previews", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    t = pq.read_table(tmp_path / "o" / "t.parquet")
    assert any(SECRET in str(v) for v in t.column("tenant").to_pylist())
    side = tmp_path / "o" / "t.previews.parquet"
    assert any(SECRET in v for v in pq.read_table(side).column("preview").to_pylist())
    assert stat.S_IMODE(side.stat().st_mode) == 0o600  # prompt text: owner only, like the salt
    r = _run("reuse", log, "--show-previews", "--json", "o/r.json", cwd=tmp_path)
    assert r.returncode == 0 and SECRET in (tmp_path / "o" / "r.json").read_text()
