"""`kvpool dashboard`: its flags, the server command line it builds, and its errors."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from analyzer.cli import app as cli
from analyzer.errors import EXIT_INPUT, EXIT_USAGE, InputError, UsageError
from app import command

runner = CliRunner()


def test_server_flags_keep_it_local_and_quiet() -> None:
    cmd = command.streamlit_command(8765, 50)
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert cmd[4] == str(command.SERVER) and command.SERVER.is_file()
    flags = set(cmd[5:])
    assert {
        "--server.headless=true",
        "--server.address=127.0.0.1",
        "--server.port=8765",
        "--server.maxUploadSize=50",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
        "--runner.postScriptGC=false",
    } <= flags


def test_server_flags_are_options_streamlit_knows() -> None:
    """A misspelt or renamed option would be refused, or worse ignored, by the server."""
    from streamlit import config

    known = config.get_config_options()
    for flag in command.streamlit_command(8765, 50)[5:]:
        name, _, value = flag.removeprefix("--").partition("=")
        assert name in known, flag
        assert value, flag


def test_upload_limit_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(command.ENV_MAX_UPLOAD_MB, raising=False)
    assert command.max_upload_mb() == command.DEFAULT_MAX_UPLOAD_MB
    monkeypatch.setenv(command.ENV_MAX_UPLOAD_MB, "12")
    assert command.max_upload_mb() == 12
    for bad in ("twelve", "0"):
        monkeypatch.setenv(command.ENV_MAX_UPLOAD_MB, bad)
        try:
            command.max_upload_mb()
        except UsageError as exc:
            assert command.ENV_MAX_UPLOAD_MB in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")


def _run(args: list[str]):
    """Invoke the CLI in-process; user errors surface as KvpoolError (main() prints them)."""
    return runner.invoke(cli, args, catch_exceptions=True)


def test_missing_input_is_an_input_error(tmp_path) -> None:
    res = _run(["dashboard", str(tmp_path / "nope.jsonl")])
    assert isinstance(res.exception, InputError)
    assert "no such file" in str(res.exception)
    assert res.exception.exit_code == EXIT_INPUT
    folder = _run(["dashboard", str(tmp_path)])
    assert isinstance(folder.exception, InputError)
    assert "is a directory" in str(folder.exception)
    import os

    os.mkfifo(tmp_path / "log.fifo")  # `kvpool dashboard <(zcat log.gz)`: read once, not again
    pipe = _run(["dashboard", str(tmp_path / "log.fifo")])
    assert isinstance(pipe.exception, InputError)
    assert "is a pipe" in str(pipe.exception)


def test_port_in_use_is_a_usage_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = _run(["dashboard", "--port", str(port)])
    assert isinstance(res.exception, UsageError)
    assert f"port {port}" in str(res.exception)
    assert res.exception.exit_code == EXIT_USAGE


def test_bad_port_is_a_usage_error() -> None:
    res = _run(["dashboard", "--port", "70000"])
    assert isinstance(res.exception, UsageError)


def test_cli_prints_errors_without_traceback(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "dashboard", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == EXIT_INPUT
    text = " ".join(proc.stderr.split())  # rich wraps long lines
    assert "no such file" in text and "Traceback" not in text


def test_isolation_and_the_tenant_fields_reach_the_page(monkeypatch) -> None:
    """`--isolation`, `--tenant-field` and `--user-field` travel to the server in its
    environment, where the page's first Tenants value and ingest fields read them."""
    seen: dict[str, str] = {}

    class Server:
        def __init__(self, cmd, env, preexec_fn) -> None:
            seen.update(env)

    monkeypatch.setattr(command.subprocess, "Popen", Server)
    monkeypatch.setattr(command, "_serve", lambda proc: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["dashboard", "--port", str(port), "--isolation", "tenant"]
    res = _run([*args, "--tenant-field", "account.slug", "--user-field", "caller"])
    assert res.exit_code == 0, res.output
    assert seen[command.ENV_ISOLATION] == "tenant"
    assert (seen[command.ENV_TENANT_FIELD], seen[command.ENV_USER_FIELD]) == (
        "account.slug",
        "caller",
    )
    for name in (command.ENV_ISOLATION, command.ENV_TENANT_FIELD, command.ENV_USER_FIELD):
        monkeypatch.setenv(name, seen[name])
    assert command.start_isolation() == "tenant"
    assert command.start_fields() == ("account.slug", "caller")
    monkeypatch.setenv(command.ENV_ISOLATION, "")
    monkeypatch.setenv(command.ENV_TENANT_FIELD, "")
    assert command.start_isolation() == "shared" and command.start_fields()[0] is None
    monkeypatch.setenv(command.ENV_ISOLATION, "everyone")
    with pytest.raises(UsageError, match="KVPOOL_DASHBOARD_ISOLATION='everyone'"):
        command.start_isolation()
    bad = _run(["dashboard", "--port", str(port), "--isolation", "everyone"])
    assert bad.exit_code == EXIT_USAGE
    from typing import get_args

    from analyzer.reuse.isolation import POLICIES

    assert get_args(command.Policy) == POLICIES
