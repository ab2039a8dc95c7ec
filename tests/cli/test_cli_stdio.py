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
ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["reuse", "-", "-"], "'-' (stdin) can be given once"),
        (["analyze", "x.jsonl", "-o", "-"], "cannot take a directory of reports"),
        (["convert", "-", "-o", "-", "--keep-previews"], "not with -o - (stdout)"),
        (["reuse", "x.jsonl", "--salt-file", "-"], "--salt-file cannot be '-'"),
        (["analyze", "-", "-o", "r", "--prices", "-"], "'-' (stdin) can be given once"),
        (["synth", "-o", "-", "--truth", "-"], "would both write to stdout"),
        (
            [
                "cost",
                "fit",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100",
                "--load",
                "l.csv",
                "-o",
                "-",
                "--json",
                "-",
            ],
            "would both write to stdout",
        ),
        (["cost", "profile", "-m", "llama-3.1-8b", "-o", "-"], "written beside the profile"),
        (
            ["cost", "profile", "-m", "llama-3.1-8b", "-o", "p.json", "--nvme-dir", "-"],
            "--nvme-dir cannot be '-'",
        ),
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


# --- '-' for every input and output option -------------------------------------------

FIX = ROOT / "tests" / "fixtures" / "cost"


def _json_out(r: subprocess.CompletedProcess[bytes]) -> dict:  # type: ignore[type-arg]
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


@pytest.mark.slow
def test_cost_fit_reads_its_csv_from_stdin_and_writes_the_profile_to_stdout(tmp_path):
    base = ["cost", "fit", "-m", "llama-3.1-8b", "-g", "h100"]
    csv = FIX / "prefill_llama8b_h100.csv"
    f = _run([*base, "--prefill", str(csv), "-o", "p.json"], tmp_path)
    assert f.returncode == 0, f.stderr
    r = _run([*base, "--prefill", "-", "-o", "-"], tmp_path, csv.read_bytes())
    from_stdin, from_file = _json_out(r), json.loads((tmp_path / "p.json").read_text())
    assert from_stdin["prefill"]["source"] == "<stdin>"
    assert from_file["prefill"]["source"] == str(csv)
    from_stdin["prefill"]["source"] = from_file["prefill"]["source"]
    assert from_stdin == from_file
    assert b"wrote <stdout>" in r.stderr and b"kvpool-stdin" not in r.stdout + r.stderr
    # a profile read from stdin: the same figures as from the file
    args = ["cost", "show", "--json", "-", "--profile"]
    shown_stdin = _json_out(_run([*args, "-"], tmp_path, (tmp_path / "p.json").read_bytes()))
    shown_file = _json_out(_run([*args, "p.json"], tmp_path))
    assert shown_stdin["cost_model"]["profile"] == "<stdin>"
    shown_stdin["cost_model"]["profile"] = shown_file["cost_model"]["profile"]
    assert shown_stdin == shown_file
    assert not (tmp_path / "-").exists()


@pytest.mark.slow
def test_cost_ttft_calibration_and_check_table_read_stdin(tmp_path):
    base = ["cost", "ttft", "-m", "llama-3.1-8b", "-g", "h100", "--prompt-tokens", "8192"]
    base += ["--cached-tokens", "4096", "--load-gbps", "25"]
    base += ["--json", "-", "--calibration"]
    cal = FIX / "ttft_calibration.csv"
    assert (
        _json_out(_run([*base, "-"], tmp_path, cal.read_bytes()))["ttft_s"]
        == (_json_out(_run([*base, str(cal)], tmp_path))["ttft_s"])
    )
    table = ROOT / "models" / "measurements.toml"
    check = ["cost", "check", "--json", "-", "--table"]
    from_stdin = _json_out(_run([*check, "-"], tmp_path, table.read_bytes()))
    from_file = _json_out(_run([*check, str(table)], tmp_path))
    assert from_stdin.pop("table") == "<stdin>"
    assert from_file.pop("table") == str(table)
    assert from_stdin == from_file
    assert not (tmp_path / "-").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_replay_config_reads_stdin_in_either_format(logs, fmt):
    text = (
        '[[scenario]]\nname = "big-pool"\npool = true\npool_gbps = 50\n'
        if fmt == "toml"
        else '{"scenario": [{"name": "big-pool", "pool": true, "pool_gbps": 50}]}'
    )
    base = ["replay", "chat.jsonl", "-j", "1", "--no-search", "--scenarios", "local,big-pool"]
    r = _json_out(_run([*base, "--json", "-", "--config", "-"], logs, text.encode()))
    assert list(r["scenarios"]) == ["local", "big-pool"]
    assert r["scenarios"]["big-pool"]["link_gbps"]["pool"] == 50.0
    assert not (logs / "-").exists()


@pytest.mark.slow
def test_analyze_prices_from_stdin_price_the_same(logs, tmp_path):
    prices = ROOT / "models" / "prices.toml"
    base = ["analyze", str(logs / "chat.jsonl"), "-j", "1", "--no-rate-search", "--json", "-"]
    from_stdin = _json_out(_run([*base, "-o", "a", "--prices", "-"], tmp_path, prices.read_bytes()))
    from_file = _json_out(_run([*base, "-o", "b", "--prices", str(prices)], tmp_path))
    # the report names a price file by its file name only
    assert from_stdin["options"]["prices"].pop("prices_file") == "stdin"
    assert from_file["options"]["prices"].pop("prices_file") == "prices.toml"
    assert from_stdin == from_file
    bad = _run([*base, "-o", "c", "--prices", "-"], tmp_path, b"[gpu_hour_usd\n")
    assert bad.returncode == 3 and b"<stdin>" in bad.stderr, bad.stderr
    assert not (tmp_path / "-").exists()


def test_synth_ground_truth_to_stdout_beside_the_log_in_a_file(logs, tmp_path):
    base = ["synth", "--profile", "chat", "-n", "60"]
    f = _run([*base, "-o", "f.jsonl", "--truth", "truth.json"], tmp_path)
    assert f.returncode == 0, f.stderr
    r = _run([*base, "-o", "g.jsonl", "--truth", "-"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (tmp_path / "truth.json").read_bytes()
    assert (tmp_path / "g.jsonl").read_bytes() == (logs / "chat.jsonl").read_bytes()
    assert not (tmp_path / "-").exists()


# -- pipes given as input paths ------------------------------------------------------------


@pytest.mark.slow
def test_a_pipe_reads_like_the_file(logs):
    """`kvpool reuse <(zcat log.gz)`: the shell passes /dev/fd/N, a pipe read once; it is
    copied like stdin (compression found by its bytes) and gives the file's figures."""
    import os
    import threading

    args = ["reuse", "--json", "-", "-j", "1", "--warmup", "0.2"]
    from_file = _reuse_json(_run([*args, "chat.jsonl"], logs))
    r, w = os.pipe()

    def write() -> None:
        with os.fdopen(w, "wb") as f:
            f.write(gzip.compress((logs / "chat.jsonl").read_bytes()))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        got = subprocess.run(
            [*KVPOOL, "-q", *args, f"/dev/fd/{r}"],
            cwd=logs,
            capture_output=True,
            timeout=300,
            pass_fds=[r],
        )
    finally:
        os.close(r)
        writer.join()
    assert _reuse_json(got) == from_file


@pytest.mark.slow
def test_a_fifo_written_late_is_waited_for_and_named_as_given(logs, tmp_path):
    """The writer starts only once kvpool has said what it waits for, however long its
    start-up takes on a loaded machine (the order is what is tested, not a delay)."""
    import os
    import threading

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    args = ["reuse", "--json", "-", "-j", "1", "--warmup", "0.2"]
    from_file = _reuse_json(_run([*args, "chat.jsonl"], logs))
    proc = subprocess.Popen(
        [*KVPOOL, "-q", *args, str(fifo)], cwd=logs, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    err: list[bytes] = []
    said = threading.Event()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            if b"to be written" in line:
                said.set()
        said.set()  # kvpool ended without saying it: the assertion below names it

    reader = threading.Thread(target=read_stderr)
    reader.start()
    try:
        assert said.wait(300)
        if proc.poll() is None:  # it waits: write (it ended early: the asserts say why)
            fifo.write_bytes((logs / "chat.jsonl").read_bytes())
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        reader.join()
    stderr = b"".join(err)
    got = subprocess.CompletedProcess(proc.args, proc.returncode, out, stderr)
    assert f"waiting for {fifo} to be written" in stderr.decode()
    assert _reuse_json(got) == from_file


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stopped_command_removes_its_copy_of_a_pipe(tmp_path, how):
    """Stopped while it waits on a FIFO nobody writes to (`kill`, `timeout`, a closed
    terminal, Ctrl-C): exit 130 as after Ctrl-C, no traceback, and no private copy left
    in the temp folder (before, SIGTERM and SIGHUP killed it where it stood)."""
    import os
    import signal
    import time

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [*KVPOOL, "-q", "reuse", str(fifo)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("kvpool-spill-*/*.stdin-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(tmp.glob("kvpool-spill-*/*.stdin-*")), "the copy's folder was never made"
        proc.send_signal(getattr(signal, how))
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "Traceback" not in err.decode()
    assert not list(tmp.glob("kvpool-spill-*/*.stdin-*"))


def test_a_pipe_that_cannot_be_opened_is_a_one_line_error(tmp_path, monkeypatch):
    import errno
    import os

    from analyzer.cli import stdio
    from analyzer.errors import InputError

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)

    real = os.open

    def refused(path: object, *args: object, **kwargs: object) -> int:
        if str(path) == str(fifo):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(stdio.os, "open", refused)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the copy goes
    said = r"log\.fifo.*cannot read the pipe: Permission denied"
    with pytest.raises(InputError, match=said), stdio.stdin_inputs([fifo]):
        pass
    assert not list(tmp_path.glob("kvpool-spill-*/*.stdin-*"))


@pytest.mark.slow
def test_a_command_started_under_nohup_outlives_a_closed_terminal(tmp_path):
    """nohup starts the command with SIGHUP ignored: it stays ignored (a closed terminal
    must not stop a run left to finish), while SIGTERM still stops it cleanly."""
    import os
    import signal
    import time

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [*KVPOOL, "-q", "reuse", str(fifo)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # as nohup does
    )
    try:
        time.sleep(4)  # started and waiting on the pipe
        proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err.decode()
