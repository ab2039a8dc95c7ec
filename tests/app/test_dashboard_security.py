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
    # the server's working directory (often $HOME) is not a root
    monkeypatch.chdir(inside.parent)
    monkeypatch.delenv(command.ENV_ROOTS, raising=False)
    with pytest.raises(InputError, match="outside the folders"):
        command.check_trace_path(inside, confined=True)
    command.check_trace_path(command.APP_DIR.parent / "traces" / "chat.jsonl.zst", confined=True)
    monkeypatch.setenv(command.ENV_ROOTS, str(inside.parent))  # --data-dir, INPUT's folder
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


@pytest.mark.slow
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


def _status(port: int, host: str, websocket: bool = False) -> int:
    """The status of a plain GET (or a WebSocket handshake) with this Host header."""
    import base64

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = [
            f"GET {'/_stcore/stream' if websocket else '/_stcore/health'} HTTP/1.1",
            f"Host: {host}",
            "Connection: " + ("Upgrade" if websocket else "close"),
        ]
        if websocket:
            key = base64.b64encode(os.urandom(16)).decode()
            head += [
                "Upgrade: websocket",
                f"Sec-WebSocket-Key: {key}",
                "Sec-WebSocket-Version: 13",
                f"Origin: http://{host}",
            ]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        return int(s.recv(4096).split(b"\r\n", 1)[0].split()[1])


@pytest.mark.slow
def test_the_server_answers_only_loopback_and_the_given_host_names(tmp_path) -> None:
    """DNS rebinding: a page of the attacker's, whose name resolves to 127.0.0.1, reaches
    the server with its own name in Host. The real server, started by the command,
    refuses it on HTTP and on the WebSocket the page talks through."""
    port = _free_port()
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "analyzer.cli",
            "dashboard",
            "--port",
            str(port),
            "--host",
            "dash.internal.example",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1"},
    )
    try:
        assert _wait(lambda: _listening(port), 90), "the dashboard never started"
        assert _wait(lambda: _status(port, f"127.0.0.1:{port}") == 200, 60)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
            assert _status(port, host) == 200, host
            assert _status(port, host, websocket=True) == 101, host
        assert _status(port, f"dash.internal.example:{port}") == 200
        for host in (f"rebind.attacker.example:{port}", "127.0.0.1.attacker.example", "", "[::2]"):
            assert _status(port, host) == 400, host
            assert _status(port, host, websocket=True) == 400, host
    finally:
        parent.terminate()
        parent.wait(timeout=30)


def test_bad_dashboard_flags_are_usage_errors(tmp_path) -> None:
    for flags, msg in (
        (["--host", "evil host"], "--host"),
        (["--data-dir", str(tmp_path / "missing")], "--data-dir"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "analyzer.cli", "dashboard", *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


# a file name (so no "/") that is a link, raw HTML, math, a Streamlit colour directive and
# rich markup
MARKUP_NAME = "[x](https:attacker.example) <img src=x onerror=alert(1)> $x^2$ :red[y] [b]z"


def _markup(md: str) -> list[str]:
    """The inline markup CommonMark finds in ``md`` (Streamlit's Markdown is CommonMark
    with math: a ``$`` not escaped would open a formula)."""
    from markdown_it import MarkdownIt

    tokens = [t for b in MarkdownIt("commonmark").parse(md) for t in b.children or []]
    found = [t.type for t in tokens if t.type in ("link_open", "html_inline", "image")]
    return found + ["math"] * md.replace("\\$", "").count("$")


def test_file_names_and_messages_are_text_on_the_dashboard(tmp_path, monkeypatch) -> None:
    """Streamlit writes captions, headers and error boxes as Markdown: a file's name and an
    error naming one reach them as text (quoting.st_text), never as a link, an image,
    HTML or a formula."""
    from streamlit.testing.v1 import AppTest

    from analyzer.quoting import st_text
    from analyzer.synth import SynthConfig, generate

    log = tmp_path / f"{MARKUP_NAME}.jsonl"
    generate(SynthConfig(profile="chat", requests=60, seed=1), log, fmt="openai")
    monkeypatch.setenv(command.ENV_INPUT, str(log))
    monkeypatch.delenv(command.ENV_ROOTS, raising=False)
    at = AppTest.from_file(str(command.APP_DIR / "streamlit_app.py"), default_timeout=180)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.subheader[0].value == f"Loaded: {st_text(log.name)}"
    named = [e.value for e in (*at.subheader, *at.caption) if "attacker" in e.value]
    assert len(named) >= 3, named  # the header, the sidebar's trace, the files read
    for text in named:
        assert not _markup(text), text
    # an error that names a file: the path box given a missing one
    at.radio(key="load.how").set_value("Path on this machine").run()
    at.text_input(key="load.path").input(str(log.with_name(f"gone {MARKUP_NAME}.jsonl")))
    at.button(key="load.open_path").click().run()
    assert not at.exception
    errors = [e.value for e in at.error if "attacker" in e.value]
    assert errors, [e.value for e in at.error]
    for text in errors:
        assert not _markup(text), text


def test_a_calibration_upload_is_named_as_uploaded_and_shown_as_text(tmp_path, monkeypatch) -> None:
    """The Cost page's fit summary names a calibration CSV by its upload's name (not the
    server's temporary copy), and that name and a skipped row's value reach the page as
    text."""
    from streamlit.testing.v1 import AppTest

    from analyzer.synth import SynthConfig, generate
    from app import state

    log = tmp_path / "chat.jsonl"
    generate(SynthConfig(profile="chat", requests=60, seed=1), log, fmt="openai")
    monkeypatch.setenv(command.ENV_INPUT, str(log))
    monkeypatch.delenv(command.ENV_ROOTS, raising=False)
    fixture = command.APP_DIR.parent / "tests" / "fixtures" / "cost" / "ttft_calibration.csv"
    bad_row = f"1,0,1,25,{MARKUP_NAME.replace(',', ' ')}\n"
    at = AppTest.from_file(str(command.APP_DIR / "streamlit_app.py"), default_timeout=180)
    at.run()
    at.switch_page("views/cost.py").run()
    at.file_uploader(key="cost.calibration").upload(
        f"{MARKUP_NAME}.csv", fixture.read_bytes() + bad_row.encode(), "text/csv"
    )
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.checkbox(key="cost.use_fit").check().run()
    shown = [e.value for e in (*at.markdown, *at.caption, *at.warning) if "attacker" in e.value]
    assert len(shown) >= 2, shown  # the fit's summary, the caption naming the model's CSV
    for text in shown:
        assert not _markup(text), text
        assert str(state.scratch_dir()) not in text and "kvpool-spill" not in text, text
