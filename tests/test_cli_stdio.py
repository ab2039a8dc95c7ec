"""`-` on the command line is stdin for an input and stdout for an output, never a file.

Run as a user would, in a real process with a real pipe: stdin may be plain, gzip or
zstd (recognised by magic bytes), JSON lines or CSV (recognised by content), and what
is read from it gives the same figures as the same bytes read from a file; messages
call it `<stdin>`.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from analyzer.errors import UsageError

KVPOOL = [sys.executable, "-m", "analyzer.cli"]
ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*KVPOOL, "-q", *args], input=stdin, cwd=cwd, capture_output=True, timeout=300
    )


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("stdio")
    for fmt, name in (("openai", "chat.jsonl"), ("gateway-csv", "gw.csv")):
        r = _run(["synth", "--profile", "chat", "-n", "60", "--format", fmt, "-o", name], d)
        assert r.returncode == 0, r.stderr
    return d


def _reuse_json(r: subprocess.CompletedProcess[bytes]) -> dict:  # type: ignore[type-arg]
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


@pytest.mark.parametrize(
    ("name", "pack"),
    [
        ("chat.jsonl", lambda b: b),
        ("chat.jsonl", gzip.compress),
        ("chat.jsonl", lambda b: zstandard.ZstdCompressor().compress(b)),
        ("gw.csv", gzip.compress),
    ],
    ids=["jsonl", "jsonl-gzip", "jsonl-zstd", "csv-gzip"],
)
def test_stdin_reads_like_the_file(logs, name, pack):
    args = ["reuse", "--json", "-", "-j", "1", "--warmup", "0.2"]
    from_file = _reuse_json(_run([*args, name], logs))
    from_stdin = _reuse_json(_run([*args, "-"], logs, pack((logs / name).read_bytes())))
    assert from_stdin == from_file
    assert from_stdin["trace"]["requests"] == 60
    assert not (logs / "-").exists()


def test_stdin_errors_and_skips_name_stdin(tmp_path):
    bad = (
        b'{"messages": [{"role": "user", "content": "hi"}], "timestamp": 1}\n'
        b'{"messages": 5, "timestamp": 2}\n'
        b"not json\n"
    )
    r = _run(["reuse", "-", "-j", "1"], tmp_path, bad)
    assert r.returncode == 0, r.stderr
    said = r.stdout.decode() + r.stderr.decode()
    assert "Prefix reuse in <stdin>" in said
    assert "<stdin>:2: mistyped field (field 'messages')" in said
    assert "<stdin>:3: malformed JSON" in said
    assert "kvpool-stdin" not in said  # the private copy is not named
    r = _run(["reuse", "-", "--strict"], tmp_path, bad)
    assert r.returncode == 3
    assert r.stderr.decode().startswith("error: <stdin>:2 (field 'messages'): mistyped field")


def test_convert_stdin_to_stdout_is_the_file_conversion(logs, tmp_path):
    raw = (logs / "chat.jsonl").read_bytes()
    salt = ["--salt-file", str(tmp_path / "salt")]
    r = _run(["convert", "-", "-o", "-", *salt], tmp_path, gzip.compress(raw))
    assert r.returncode == 0, r.stderr
    assert b"wrote <stdout>" in r.stderr
    f = _run(["convert", str(logs / "chat.jsonl"), "-o", "f.parquet", *salt], tmp_path)
    assert f.returncode == 0, f.stderr
    assert r.stdout == (tmp_path / "f.parquet").read_bytes()
    assert not (tmp_path / "-").exists()


def test_synth_to_stdout_is_the_file(logs, tmp_path):
    r = _run(["synth", "--profile", "chat", "-n", "60", "-o", "-"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (logs / "chat.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["reuse", "-", "-"], "'-' (stdin) can be given once"),
        (["analyze", "x.jsonl", "-o", "-"], "cannot take a directory of reports"),
        (["convert", "-", "-o", "-", "--keep-previews"], "not with -o - (stdout)"),
    ],
)
def test_dash_where_it_cannot_be_is_a_usage_error(tmp_path, args, says):
    r = _run(args, tmp_path, b'{"prompt": "hi"}\n')
    assert r.returncode == 2
    assert says in r.stderr.decode()
    assert not (tmp_path / "-").exists()


def test_the_library_never_opens_a_file_named_dash(tmp_path, monkeypatch):
    from analyzer.ingest import open_trace
    from analyzer.outputs import check_output

    monkeypatch.chdir(tmp_path)
    Path("-").write_text('{"prompt": "hi"}\n')
    with pytest.raises(UsageError):
        open_trace(["-"])
    with pytest.raises(UsageError):
        check_output("-")
