"""The dashboard's promises (docs/security.md): the path box opens files only from the
folders it was started for, uploads do not outlive the server, and the server dies with
``kvpool dashboard`` even when that is killed with SIGKILL. The last two start the real
server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyzer.errors import InputError
from app import command


def test_path_box_is_confined_to_the_allowed_folders(tmp_path, monkeypatch) -> None:
    inside = tmp_path / "data" / "log.jsonl"
    inside.parent.mkdir()
    inside.write_text("{}\n")
    monkeypatch.chdir(inside.parent)
    monkeypatch.delenv(command.ENV_ROOTS, raising=False)
    command.check_trace_path(inside, confined=True)
    for outside in (Path("/etc/passwd"), inside.parent / ".." / "x.jsonl"):
        with pytest.raises(InputError, match="outside the folders"):
            command.check_trace_path(outside, confined=True)
    link = inside.parent / "sneaky.jsonl"
    link.symlink_to("/etc/passwd")
    with pytest.raises(InputError, match="outside the folders"):
        command.check_trace_path(link, confined=True)
    monkeypatch.setenv(command.ENV_ROOTS, "/etc")
    command.check_trace_path(Path("/etc/passwd"), confined=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return False


def _scratch_dirs(tmp: Path) -> set[str]:
    return {p.name for p in tmp.glob("kvpool-spill-*/*.dashboard-*")}


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_server_stops_with_its_parent_and_leaves_no_scratch(tmp_path, how) -> None:
    port = _free_port()
    # A temporary folder of its own: other tests (and other runs) start dashboards too.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = _scratch_dirs(tmp)
    parent = subprocess.Popen(
        [sys.executable, "-m", "analyzer.cli", "dashboard", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1", "TMPDIR": str(tmp)},
    )
    try:
        assert _wait(lambda: _listening(port), 60), "the dashboard never started"
        made = _scratch_dirs(tmp) - before
        assert len(made) == 1
        parent.send_signal(how)
        parent.wait(timeout=30)
        assert _wait(lambda: not _listening(port), 30), "the server outlived its parent"
        if how == signal.SIGTERM:  # SIGKILL gives the parent no chance to clean up
            assert not (_scratch_dirs(tmp) & made)
    finally:
        if parent.poll() is None:
            parent.kill()
