"""Outputs never destroy data: atomic writes, never over an input, a symlink or a device.

Each test is a reproducer from the hostile-input review (docs/security.md): before the
fix, the command exited 0 (or 4) having replaced or deleted what was at the path.
"""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.cli import app
from analyzer.errors import OutputError
from analyzer.outputs import atomic_path, check_output, note_input, report_dir, write_files

SYNTH = ["synth", "--profile", "chat", "-n", "60", "--seed", "3"]


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("log")
    p = d / "in.jsonl"
    r = CliRunner().invoke(app, [*SYNTH, "-o", str(p)])
    assert r.exit_code == 0, r.output
    return p


def _copy(log: Path, d: Path) -> tuple[Path, bytes]:
    p = d / "in.jsonl"
    data = log.read_bytes()
    p.write_bytes(data)
    return p, data


def _no_temps(d: Path) -> None:
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "args",
    [
        ["convert", "{in}", "-o", "{in}"],
        ["convert", "{in}", "--to", "mooncake", "-o", "{in}"],
        ["reuse", "{in}", "--json", "{in}"],
        [
            "replay",
            "{in}",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--instances",
            "2",
            "--scenarios",
            "none",
            "--json",
            "{in}",
        ],
    ],
    ids=["convert", "mooncake", "reuse", "replay"],
)
def test_output_equal_to_an_input_is_refused(log, tmp_path, args):
    src, before = _copy(log, tmp_path)
    r = CliRunner().invoke(app, [a.replace("{in}", str(src)) for a in args])
    assert isinstance(r.exception, OutputError), r.output
    assert "also an input" in str(r.exception)
    assert src.read_bytes() == before
    _no_temps(tmp_path)


def test_output_equal_to_an_input_through_another_name_is_refused(log, tmp_path):
    src, before = _copy(log, tmp_path)
    hard = tmp_path / "hard.jsonl"
    os.link(src, hard)
    r = CliRunner().invoke(app, ["convert", str(src), "-o", str(hard)])
    assert isinstance(r.exception, OutputError)
    r = CliRunner().invoke(app, ["convert", f"{tmp_path}/./in.jsonl", "-o", str(src)])
    assert isinstance(r.exception, OutputError)
    assert src.read_bytes() == before


def test_validate_json_over_its_report_is_refused(tmp_path):
    report = tmp_path / "r.json"
    report.write_text('{"schema": "kvpool.report/1"}\n')
    before = report.read_bytes()
    bench = tmp_path / "b.csv"
    bench.write_text("metric,value\nttft_p90_s,1\n")
    r = CliRunner().invoke(
        app, ["validate", str(bench), "--report", str(report), "--json", str(report)]
    )
    assert isinstance(r.exception, OutputError)
    assert report.read_bytes() == before


def test_a_device_node_is_refused_and_left_alone(log, tmp_path):
    # pyarrow deletes its target when a write fails: on a device path (as root, /dev/full
    # itself) that deleted the device node. A FIFO stands in for it without privileges.
    fifo = tmp_path / "myfull"
    os.mkfifo(fifo)
    r = CliRunner().invoke(app, ["convert", str(log), "-o", str(fifo)])
    assert isinstance(r.exception, OutputError) and "not a regular file" in str(r.exception)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(OutputError, match="not a regular file"):
        check_output("/dev/null")


def test_a_symlink_target_needs_force(log, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "out.parquet"
    link.symlink_to(victim)
    r = CliRunner().invoke(app, ["convert", str(log), "-o", str(link)])
    assert isinstance(r.exception, OutputError) and "symbolic link" in str(r.exception)
    assert victim.read_text() == "keep me\n"
    r = CliRunner().invoke(app, ["convert", str(log), "-o", str(link), "--force"])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and victim.read_bytes()[:4] == b"PAR1"


def test_no_directories_are_created_from_scratch(log, tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    for args in (
        ["reuse", str(log), "--json", str(missing / "x.json")],
        ["convert", str(log), "-o", str(missing / "t.parquet")],
        [*SYNTH, "-o", str(missing / "s.jsonl")],
        ["analyze", str(log), "-o", str(missing / "report")],
    ):
        r = CliRunner().invoke(app, args)
        assert isinstance(r.exception, OutputError), (args, r.output)
        assert "does not exist" in str(r.exception)
    assert not (tmp_path / "no").exists()


def test_an_existing_report_directory_gets_a_new_name(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    chosen, note = report_dir(out)
    assert chosen == tmp_path / "report-2" and chosen.is_dir()
    assert note and "report-2" in note
    assert report_dir(out)[0] == tmp_path / "report-3"
    assert report_dir(out, force=True) == (out, None)
    assert (out / "notes.txt").read_text() == "mine\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report_dir(empty) == (empty, None)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError, match="not a directory"):
        report_dir(tmp_path / "afile")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("renderer failed")
    assert target.read_text() == "old\n"
    _no_temps(tmp_path)
    # Several files: none is replaced unless all were written.
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A\n")
    note_input(tmp_path / "unrelated")
    write_files({a: "A2\n", b: b"B2\n"})
    assert (a.read_text(), b.read_text()) == ("A2\n", "B2\n")
    assert oct(stat.S_IMODE(a.stat().st_mode)) == oct(0o666 & ~_umask())


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def _limit_file_size() -> None:
    # A full disk, as the process sees it: writes past 4 KiB fail (EFBIG), not killed.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 10, 4 << 10))


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["convert", "{in}", "-o", "{d}/t.parquet"],
        ["convert", "{in}", "--to", "mooncake", "-o", "{d}/m.jsonl"],
        ["synth", "--profile", "chat", "-n", "300", "-o", "{d}/s.jsonl"],
    ],
    ids=["parquet", "jsonl", "synth"],
)
def test_disk_full_leaves_no_partial_output(log, tmp_path, args):
    src, before = _copy(log, tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    cmd = [a.replace("{in}", str(src)).replace("{d}", str(out)) for a in args]
    r = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", *cmd],
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size,
        timeout=120,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1"},
        cwd=tmp_path,
    )
    assert r.returncode == 4, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("error:")
    assert list(out.iterdir()) == []
    assert src.read_bytes() == before
