"""``kvpool dashboard``: start the Streamlit what-if dashboard on this machine.

The dashboard is a separate ``streamlit run`` process (Streamlit owns its event loop and
web server); this command picks the input, sets the server flags that keep it local and
quiet (headless, bound to 127.0.0.1, no usage statistics, no file watcher), prints the
address, and stops the server cleanly on Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from analyzer.errors import InputError, Location, UsageError

APP_DIR = Path(__file__).resolve().parent
ENTRYPOINT = APP_DIR / "streamlit_app.py"
SERVER = APP_DIR / "server.py"  # ENTRYPOINT behind the Host header allow-list
# The Host headers the server answers (app/server.py), besides the one --host names.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")

# Environment read by the app (see app/state.py).
ENV_INPUT = "KVPOOL_DASHBOARD_INPUT"
ENV_MAX_UPLOAD_MB = "KVPOOL_MAX_UPLOAD_MB"
ENV_SCRATCH = "KVPOOL_DASHBOARD_SCRATCH"  # the server's temporary folder, removed on exit
ENV_ROOTS = "KVPOOL_DASHBOARD_ROOTS"  # folders the path box may open (os.pathsep list)
ENV_HOSTS = "KVPOOL_DASHBOARD_HOSTS"  # host names besides loopback the page answers to
# The Tenants control's first value, and the fields tenants and users are read from
# (kvpool dashboard --isolation, --tenant-field, --user-field).
ENV_ISOLATION = "KVPOOL_DASHBOARD_ISOLATION"
# analyzer.reuse.isolation.POLICIES, as analyzer.cli.options.IsolationName spells them
# (importing that module from here would register the CLI while this one loads; the
# flags' help texts below are theirs, word for word: tests/cli/test_cli_defaults.py).
Policy = Literal["shared", "tenant", "user"]
ENV_TENANT_FIELD = "KVPOOL_DASHBOARD_TENANT_FIELD"
ENV_USER_FIELD = "KVPOOL_DASHBOARD_USER_FIELD"
DEFAULT_MAX_UPLOAD_MB = 200


def allowed_roots() -> list[Path]:
    """Folders whose files the path box opens: the bundled samples, and those listed in
    ``KVPOOL_DASHBOARD_ROOTS`` (``kvpool dashboard`` lists the folder of the trace it
    was given and every ``--data-dir``). Never the server's working directory, which is
    ``$HOME`` when started there: anyone who can reach the page could otherwise read the
    first line of any file the server's user can (``~/.ssh/id_ed25519``, ``/etc/shadow``
    as root) through the format error."""
    roots = [APP_DIR.parent / "traces"]
    roots += [Path(r) for r in os.environ.get(ENV_ROOTS, "").split(os.pathsep) if r.strip()]
    return [r.expanduser().resolve() for r in roots]


# a DNS name, an IPv4 address or a bracketed IPv6 one, as a Host header carries it
_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]")


def max_upload_mb() -> int:
    """The upload limit in MB (decimal), from ``KVPOOL_MAX_UPLOAD_MB``."""
    raw = os.environ.get(ENV_MAX_UPLOAD_MB, "").strip()
    if not raw:
        return DEFAULT_MAX_UPLOAD_MB
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(
            f"{ENV_MAX_UPLOAD_MB}={raw!r} is not a whole number of megabytes"
        ) from None
    if value < 1:
        raise UsageError(f"{ENV_MAX_UPLOAD_MB} must be at least 1 (got {value})")
    return value


def start_isolation(default: str = "shared") -> str:
    """The Tenants control's first value: ``--isolation`` (``default`` when not given)."""
    from analyzer.reuse.isolation import POLICIES

    given = os.environ.get(ENV_ISOLATION, "").strip()
    if not given:
        return default
    if given not in POLICIES:
        raise UsageError(f"{ENV_ISOLATION}={given!r} must be one of {', '.join(POLICIES)}")
    return given


def start_fields() -> tuple[str | None, str | None]:
    """The tenant and user fields ``--tenant-field`` / ``--user-field`` named (None: the
    format's own)."""
    tenant = os.environ.get(ENV_TENANT_FIELD, "").strip()
    user = os.environ.get(ENV_USER_FIELD, "").strip()
    return tenant or None, user or None


def check_trace_path(path: Path, *, confined: bool = False) -> None:
    """A trace path given by hand (command line, load page) names a file that exists;
    ``confined`` (the page's path box) also requires it under :func:`allowed_roots`."""
    if confined:
        real = path.expanduser().resolve()
        roots = allowed_roots()
        if not any(real.is_relative_to(r) for r in roots):
            raise InputError(
                "outside the folders this dashboard opens files from",
                Location(str(path)),
                hint="start kvpool dashboard with --data-dir naming the data's folder",
            )
    if path.is_dir():
        raise InputError("is a directory: give one of its files", Location(str(path)))
    if path.is_fifo():
        raise InputError(
            "is a pipe: the dashboard opens its trace again on later pages",
            Location(str(path)),
            hint="write it to a file first, or `kvpool convert` it to a canonical trace",
        )
    if not path.is_file():
        raise InputError("no such file", Location(str(path)))


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def streamlit_command(port: int, upload_mb: int) -> list[str]:
    """The ``streamlit run`` command line the dashboard uses."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(SERVER),
        "--server.headless=true",
        "--server.address=127.0.0.1",
        f"--server.port={port}",
        f"--server.maxUploadSize={upload_mb}",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
        "--browser.gatherUsageStats=false",
        "--browser.serverAddress=127.0.0.1",
        f"--browser.serverPort={port}",
        "--global.developmentMode=false",
        "--client.toolbarMode=minimal",
        # Streamlit runs a full collection (gc.collect(2)) after every script run: it
        # walks every object the server holds, the remembered replays' cache nodes among
        # them, 0.15 to 0.2 s on two cores on the bundled sample, after every what-if
        # and every half-second poll of a background replay (docs/dashboard.md).
        # Python's own generational collector still frees cycles.
        "--runner.postScriptGC=false",
        # Streamlit's own info lines are about its internals (a half-second poll that
        # arrives after the page it belonged to was redrawn), not the user's actions;
        # its warnings and errors still show.
        "--logger.level=warning",
    ]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server: a terminal's Ctrl-C reached it too; otherwise ask, then insist."""
    for signal_it, wait_s in ((None, 1.0), (proc.terminate, 10.0), (proc.kill, None)):
        if signal_it is not None:
            signal_it()
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:
            continue


def register(app: typer.Typer) -> None:
    """Add ``kvpool dashboard`` to the ``kvpool`` app."""

    @app.command("dashboard")
    def dashboard(
        input: Annotated[
            Path | None,
            typer.Argument(
                help="Trace to open first (any format `convert` reads). Default: a bundled sample.",
                show_default=False,
            ),
        ] = None,
        port: Annotated[
            int, typer.Option("--port", "-p", help="Port on 127.0.0.1 to serve on.")
        ] = 8501,
        data_dir: Annotated[
            list[Path] | None,
            typer.Option(
                "--data-dir",
                help="A folder the page's path box may open files from (repeatable; the "
                "bundled samples and INPUT's folder always).",
            ),
        ] = None,
        host: Annotated[
            str | None,
            typer.Option(
                "--host",
                help="A host name the page also answers to, besides localhost, 127.0.0.1 "
                "and [::1] (an SSH tunnel's or a reverse proxy's); the server still "
                "listens on 127.0.0.1 only.",
            ),
        ] = None,
        isolation: Annotated[
            Policy,
            typer.Option(
                "--isolation",
                help="Who may share KV blocks: shared (everyone, no cache salt), tenant (a "
                "cache_salt / extra_key per tenant), user (per end user, else per session); "
                "every figure is measured under it (docs/security.md).",
            ),
        ] = "shared",
        tenant_field: Annotated[
            str | None,
            typer.Option(
                "--tenant-field",
                help="Field or column holding the tenant (a.b.c in JSON records), in place "
                "of the format's own (docs/formats.md).",
            ),
        ] = None,
        user_field: Annotated[
            str | None,
            typer.Option(
                "--user-field",
                help="Field or column holding the end user (a.b.c in JSON records), in "
                "place of the format's own (docs/formats.md).",
            ),
        ] = None,
    ) -> None:
        """Start the what-if dashboard (Streamlit) on http://127.0.0.1:PORT."""
        if not 1 <= port <= 65535:
            raise UsageError(f"--port must be between 1 and 65535 (got {port})")
        dirs = [d.expanduser() for d in data_dir or []]
        for d in dirs:
            if not d.is_dir():
                raise UsageError(f"--data-dir {d}: not a folder")
        if host is not None and not _HOST_NAME.fullmatch(host):
            raise UsageError(
                f"--host {host!r} is not a host name or address",
                hint="e.g. --host dash.internal.example or --host 10.0.0.7",
            )
        env = dict(os.environ)
        if input is not None:
            check_trace_path(input)
            env[ENV_INPUT] = str(input.resolve())
        upload_mb = max_upload_mb()
        if not _port_free(port):
            raise UsageError(
                f"port {port} on 127.0.0.1 is already in use",
                hint="pick another one with --port",
            )
        env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
        env["STREAMLIT_SERVER_HEADLESS"] = "true"
        env[ENV_MAX_UPLOAD_MB] = str(upload_mb)
        env.setdefault("KVPOOL_NO_PROGRESS", "1")  # the page shows progress, not the terminal

        address = f"http://127.0.0.1:{port}"
        typer.echo(f"kvpool dashboard: {address}  (Ctrl-C to stop)", err=False)
        sys.stdout.flush()
        import shutil

        from analyzer.spill import new_dir

        scratch = str(new_dir("dashboard"))  # uploaded logs: swept if we are SIGKILLed
        env[ENV_SCRATCH] = scratch
        env[ENV_ROOTS] = os.pathsep.join(
            [*([str(input.resolve().parent)] if input is not None else [])]
            + [str(d.resolve()) for d in dirs]
            + [r for r in os.environ.get(ENV_ROOTS, "").split(os.pathsep) if r]
        )
        env[ENV_HOSTS] = host or ""
        env[ENV_ISOLATION] = isolation
        env[ENV_TENANT_FIELD] = tenant_field or ""
        env[ENV_USER_FIELD] = user_field or ""
        try:
            proc = subprocess.Popen(
                streamlit_command(port, upload_mb), env=env, preexec_fn=_die_with_parent
            )
            _serve(proc)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # uploaded logs do not outlive us


def _die_with_parent() -> None:
    """In the server's process: get SIGTERM when ``kvpool dashboard`` dies, even by
    SIGKILL, so no server keeps listening with nobody to stop it (Linux ``prctl``)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: Ctrl-C and SIGTERM still stop it
        pass


def _serve(proc: subprocess.Popen[bytes]) -> None:
    """Wait for the server; Ctrl-C, SIGTERM or SIGHUP stop it cleanly (the command line
    makes SIGTERM and SIGHUP act as Ctrl-C for every command: analyzer.cli.main), so it
    is never left running without us."""
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        typer.echo("kvpool dashboard: stopped")
        return
    if code != 0:
        raise typer.Exit(code)
