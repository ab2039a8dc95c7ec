"""Where the commands write: ``-`` is stdout, tables are not cut at 80 columns when piped.

With ``--json -`` stdout carries the JSON document only, so that it can be piped into
``jq``; the tables and notes then go to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.cli.stdio import is_stdio as is_stdio  # re-exported: commands import it from here
from analyzer.quoting import json_text

if TYPE_CHECKING:
    from rich.console import Console

# Piped or captured output gets this width instead of rich's 80 columns, so that a
# table written to a file or a pager keeps one row per line.
PIPE_WIDTH = 160


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr); not wrapped at 80 columns when piped."""
    from rich.console import Console

    out = Console(stderr=stderr, highlight=False)
    if not out.is_terminal:
        out = Console(stderr=stderr, highlight=False, width=PIPE_WIDTH)
    return out


def report_console(json_out: Path | str | None) -> Console:
    """The console for a command's tables: stderr when its JSON goes to stdout."""
    return console(stderr=is_stdio(json_out))


def write_json(
    path: Path | str, doc: object, *, ensure_ascii: bool = False, force: bool = False
) -> None:
    """Write ``doc`` as JSON to ``path`` (``-``: stdout); errors name the file."""
    write_text(path, json_text(doc, indent=2, ensure_ascii=ensure_ascii) + "\n", force=force)


def write_text(path: Path | str, text: str, *, force: bool = False) -> None:
    """Write ``text`` to ``path`` atomically (:func:`analyzer.outputs.write_text`), or to
    stdout for ``-``."""
    if is_stdio(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from analyzer.outputs import write_text as write_atomic
    from analyzer.storage import is_url, staged_output

    if is_url(path):  # written whole here, then uploaded whole
        with staged_output(str(path)) as local:
            write_atomic(local, text)
        return

    write_atomic(path, text, force=force)
