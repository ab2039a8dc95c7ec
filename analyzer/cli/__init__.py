"""The ``kvpool`` command: a thin layer that parses flags and calls into analyzer/.

One module per command group (``analyzer/cli/<group>.py``, each with ``register(app)``);
flags that several commands share are declared once in :mod:`analyzer.cli.options`. This
module only assembles them and turns user errors into messages and exit codes. The stage
packages below are library code and never import this layer.
"""

from __future__ import annotations

import logging
import signal
import sys

import typer

from analyzer import __version__
from analyzer.errors import EXIT_INPUT, KvpoolError

app = typer.Typer(
    name="kvpool",
    help="Should we pool KV cache, and how? Answers from your own request logs, offline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # help text is plain: [[scenario]] prints as written
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvpool {__version__}")
        raise typer.Exit()


class _Stderr(logging.Handler):
    """Log records to whatever sys.stderr is when they are written (a StreamHandler
    keeps the stream it was made with, which a test runner may have closed since)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    quiet: bool = typer.Option(
        False, "-q", "--quiet", help="Only warnings and errors on stderr (no progress bars)."
    ),
    verbose: bool = typer.Option(
        False, "-v", "--verbose", help="Also log each stage and how long it took (stderr)."
    ),
) -> None:
    """kvpool: KV-cache pooling-readiness advisor."""
    from analyzer.outputs import reset_inputs

    reset_inputs()  # inputs noted by an earlier command in this process are not ours

    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    log = logging.getLogger("kvpool")
    log.setLevel(level)
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("kvpool: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def _register_all() -> None:
    # Each command module imports its heavy dependencies (numpy, pyarrow, numba) inside
    # the command bodies, so that `import analyzer.cli` and `kvpool --help` stay cheap.
    from analyzer.cli import analyze, cost, ingest, probe, record, replay, reuse, synth

    for module in (ingest, record, synth, reuse, cost, replay, analyze, probe):
        module.register(app)

    from app import command as app_cmd

    app_cmd.register(app)


_register_all()


def only(command: str | None) -> typer.Typer:
    """The app with only ``command`` registered, or the whole app if it names none.

    Typer builds every registered command's options before it runs one (about 230
    parameters, 0.08 s of ``kvpool reuse`` on the Mooncake trace); the command's own
    options, help and errors are the same either way.
    """
    import copy

    from typer.main import get_command_name

    commands = [
        c
        for c in app.registered_commands
        if (c.name or get_command_name(getattr(c.callback, "__name__", ""))) == command
    ]
    groups = [g for g in app.registered_groups if g.name == command]
    if command is None or len(commands) + len(groups) != 1:
        return app
    solo = copy.copy(app)
    solo.registered_commands = commands
    solo.registered_groups = groups
    return solo


def _error(message: str, code: int) -> None:
    from rich.console import Console
    from rich.markup import escape

    from analyzer.errors import printable

    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(printable(message))}", highlight=False, markup=True
    )
    sys.exit(code)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_like_ctrl_c() -> None:
    """SIGTERM (``kill``, ``timeout``, a scheduler) and SIGHUP (a closed terminal) stop
    the command as Ctrl-C does: what it made on the way is removed (a copy of stdin or of
    a pipe holding prompt text, spooled rows, an output not yet complete) and it exits
    with 130. By default Python dies at once on either, leaving them behind. A signal
    the command was started ignoring stays ignored (``nohup`` ignores SIGHUP), as Python
    leaves SIGINT ignored when it starts so."""
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _interrupt)


def main() -> None:
    """Console entry point: user errors print a message, never a traceback.

    Running out of memory or stack (a compression bomb, JSON nested a million deep) is
    reported in one line too: the limits that should prevent it are in docs/security.md.
    """
    from analyzer.cli.options import bare_ray
    from analyzer.cli.startup import trim

    sys.argv[1:] = bare_ray(sys.argv[1:])
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    trim(command)
    stop_like_ctrl_c()
    try:
        from analyzer import spill

        spill.owner(claim=True)  # worker processes name this one as their spill folders' owner
        spill.sweep()  # what a SIGKILLed command left (docs/security.md)
        only(command)()
    except KvpoolError as exc:
        _error(str(exc), exc.exit_code)
    except MemoryError:
        _error(
            "out of memory: the input is too large for this machine's memory or limit "
            "(see docs/security.md for the size limits and how to raise them)",
            EXIT_INPUT,
        )
    except RecursionError:
        _error(
            "input nested too deeply to read (JSON or TOML deeper than Python's stack)", EXIT_INPUT
        )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    finally:
        from analyzer import spill

        spill.tidy()


if __name__ == "__main__":
    main()
