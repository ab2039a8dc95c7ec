"""What a SIGKILLed command leaves in TMPDIR (an OOM kill is one): its spill folders only,
readable by its user alone, and gone when the next kvpool command starts.

Each command that spills prompt text (a copy of stdin, a copy of a pipe, the row
spools and the token spill of the LCP tree of a parallel read) is killed with SIGKILL
in the middle of its work; TMPDIR then holds nothing but the private spill root, and
after any other kvpool command, nothing at all.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyzer import spill

KVPOOL = [sys.executable, "-m", "analyzer.cli"]


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp), "KVPOOL_NO_PROGRESS": "1"}


def _spilled(tmp: Path, kind: str) -> list[Path]:
    return list(tmp.glob(f"kvpool-spill-{os.getuid()}/*.{kind}-*"))


def _wait(cond, timeout: float = 120) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _kill_and_check(proc: subprocess.Popen, tmp: Path, kind: str) -> None:
    """SIGKILL the command (and its workers), then: only the private root is left, and
    the next command removes what the dead one left."""
    assert _wait(lambda: bool(_spilled(tmp, kind))), f"no {kind} spill was made"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    left = list(tmp.iterdir())
    root = tmp / f"kvpool-spill-{os.getuid()}"
    assert left == [root], left  # nothing outside the root
    st = root.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in root.iterdir())
    r = subprocess.run([*KVPOOL, "cost", "gpus"], env=_env(tmp), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert list(tmp.iterdir()) == [], list(tmp.rglob("*"))


def _start(args: list[str], tmp: Path, cwd: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*KVPOOL, *args],
        cwd=cwd,
        env=_env(tmp),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        **kw,
    )


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    d = tmp_path / "tmp"
    d.mkdir()
    return d


def test_a_killed_read_of_stdin_leaves_its_copy_only_until_the_next_command(tmp_path, tmp):
    r, w = os.pipe()
    proc = _start(["reuse", "-"], tmp, tmp_path, stdin=r)
    os.close(r)
    try:
        os.write(w, b'{"timestamp": 1, "messages": [{"role": "user", "content": "secret"}]}\n')
        _kill_and_check(proc, tmp, "stdin")
    finally:
        os.close(w)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_copy_of_a_pipe_is_swept(tmp_path, tmp):
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    proc = _start(["reuse", str(fifo)], tmp, tmp_path)
    try:
        with open(fifo, "wb") as w:  # held open: the copy never ends
            w.write(b'{"timestamp": 1, "messages": [{"role": "user", "content": "secret"}]}\n')
            w.flush()
            _kill_and_check(proc, tmp, "stdin")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_parallel_read_leaves_no_token_spill(tmp_path, tmp):
    """The token spill of the LCP tree decodes back to the prompts: a parallel convert
    killed while its workers read leaves it to the next command's sweep."""
    log = tmp_path / "chat.jsonl"  # above the 32 MB that --jobs needs to split a log
    made = subprocess.run(
        [*KVPOOL, "synth", "--profile", "chat", "-n", "6000", "--seed", "3", "-o", str(log)],
        capture_output=True,
        env=_env(tmp_path),
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    proc = _start(
        ["convert", str(log), "-o", str(tmp_path / "t.parquet"), "-j", "2"], tmp, tmp_path
    )
    try:
        _kill_and_check(proc, tmp, "lcp")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_sweep_keeps_live_owners_and_refuses_a_foreign_root(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spill, "_swept", False)
    root = spill.root()
    live = root / f"{os.getppid()}-0.stdin-x"  # a running process (pytest's parent)
    dead = root / "999999999-1.rows-y"
    live.mkdir()
    dead.mkdir()
    (dead / "rows.arrow").write_bytes(b"prompt text")
    assert spill.sweep() == [dead]
    assert live.is_dir() and not dead.exists()
    mine = spill.new_dir("lcp")
    assert mine.parent == root and mine.name.startswith(spill.owner() + ".lcp-")
    # a root that is a symlink (someone else's folder planted there) is refused
    for p in (mine, live):
        p.rmdir()
    root.rmdir()
    (tmp_path / "elsewhere").mkdir()
    root.symlink_to(tmp_path / "elsewhere")
    from analyzer.errors import OutputError

    with pytest.raises(OutputError, match="not a folder of this user's"):
        spill.new_dir("stdin")
