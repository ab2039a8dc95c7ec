"""docs/cli.md is the typer app's own reference, current and complete."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.core import TyperGroup, TyperOption

from analyzer.cli import app
from analyzer.cli.reference import reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_current():
    assert DOC.read_text(encoding="utf-8") == reference(), (
        "docs/cli.md is stale: run `python -m analyzer.cli.reference > docs/cli.md`"
    )


def _commands(cmd, path: tuple[str, ...] = ()):
    yield path, cmd
    if isinstance(cmd, TyperGroup):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


def test_every_flag_of_every_command_is_in_the_reference():
    text = DOC.read_text(encoding="utf-8")
    seen = 0
    for path, cmd in _commands(typer.main.get_command(app)):
        if path:
            assert f"## `kvpool {' '.join(path)}`" in text, path
        for param in cmd.params:
            if isinstance(param, TyperOption) and not param.hidden:
                for flag in param.opts:
                    assert f"`{flag}" in text or f" {flag}" in text, (path, flag)
                    seen += 1
    assert seen > 200  # the reference covers the whole app, not one command
