"""User-facing errors and the exit codes the CLI documents.

A user's mistake (a malformed line, an unknown model, an unwritable path) raises a
:class:`KvpoolError` subclass whose message names the input and how to fix it; the
CLI prints it without a traceback and exits with the error's code.
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.quoting import scrub

# Exit codes, documented in docs/conventions.md.
EXIT_OK = 0
EXIT_USAGE = 2  # bad flags or values (typer uses 2 for its own usage errors too)
EXIT_INPUT = 3  # input data unreadable, invalid under --strict, or nothing usable
EXIT_OUTPUT = 4  # output could not be written
EXIT_GATES = 5  # `kvpool validate`: at least one pilot gate failed


def printable(text: str) -> str:
    """``text`` with terminal control characters (ANSI escapes, bells, carriage returns,
    C1 codes, bidirectional overrides) made '?', its lines kept.

    Field names, file names and values from a hostile file reach the terminal through
    error messages and summaries; an escape sequence there could rewrite the screen.
    The one rule for every output is :func:`analyzer.quoting.scrub`.
    """
    return scrub(text, lines=True)


class KvpoolError(Exception):
    """An error the user can fix; printed without a traceback."""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(KvpoolError):
    """A flag or value that cannot work (unknown model, negative bandwidth, ...)."""

    exit_code = EXIT_USAGE


# Inputs read from a copy under another name (stdin, spooled to a private file): the
# copy's path -> the name messages give it.
_SHOWN: dict[str, str] = {}


def show_as(path: str, name: str) -> None:
    """From now on, messages name the input at ``path`` ``name`` (``<stdin>``)."""
    _SHOWN[path] = name


def shown(path: str) -> str:
    """The name messages give the input at ``path``."""
    return _SHOWN.get(str(path), str(path))


@dataclass(frozen=True, slots=True)
class Location:
    """Where in the user's input a problem sits."""

    file: str
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        out = shown(self.file)
        if self.line is not None:
            out += f":{self.line}"
        if self.field:
            out += f" (field '{self.field}')"
        return out


class InputError(KvpoolError):
    """The input data is unreadable or invalid; names file, line and field."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, location: Location | None = None, *, hint: str | None = None):
        self.location = location
        full = f"{location}: {message}" if location else message
        super().__init__(full, hint=hint)


class OutputError(KvpoolError):
    """An output path cannot be written."""

    exit_code = EXIT_OUTPUT
