"""docs/cli.md, the command reference, written from the typer app itself.

Every command, argument and flag with its help text and default, as ``kvpool CMD
--help`` prints them, rendered to Markdown by typer's own documentation generator
(``typer.cli.get_docs_for_click``, what ``typer ... utils docs`` runs). Regenerate after
changing a flag::

    python -m analyzer.cli.reference > docs/cli.md

tests/cli/test_cli_reference.py fails when docs/cli.md is stale.
"""

from __future__ import annotations

import sys

import typer
from typer.cli import get_docs_for_click

from analyzer.cli import app

HEADER = (
    "<!-- Written by `python -m analyzer.cli.reference > docs/cli.md`; do not edit by hand:\n"
    "     tests/cli/test_cli_reference.py fails when this file is stale. -->\n\n"
)


def reference() -> str:
    """The Markdown reference of every ``kvpool`` command."""
    command = typer.main.get_command(app)
    ctx = typer.Context(command)
    body = get_docs_for_click(obj=command, ctx=ctx, name="kvpool", title="`kvpool` reference")
    return HEADER + body.strip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
