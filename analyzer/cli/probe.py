"""``kvpool probe``: the pilot's paired isolation check against live engines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add this command group to the ``kvpool`` app."""
    app.command("probe")(probe)


def probe(
    urls: Annotated[
        list[str],
        typer.Argument(
            help="Engine base URLs (http://HOST:PORT), the first one warmed; give two "
            "engines sharing the pool to test the pool too."
        ),
    ],
    model: Annotated[str, typer.Option("--model", help="The model name the engines serve.")],
    salt_field: Annotated[
        str,
        typer.Option(
            "--salt-field",
            help="Request field carrying the salt: cache_salt (vLLM, SGLang), or extra_key "
            "(SGLang releases without cache_salt).",
        ),
    ] = "cache_salt",
    prefix_words: Annotated[
        int, typer.Option("--prefix-words", help="Words of the shared prompt (about tokens).")
    ] = 2048,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for each answer.")
    ] = 60.0,
    out: Annotated[
        Path | None,
        typer.Option(
            "-o", "--out", help="Write the results as JSON here, for `kvpool validate isolation=`."
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Write through a symlinked output path.")
    ] = False,
) -> None:
    """Send one prefix under two cache salts (and none) and check that no salt reads
    another's KV: exit 5 when one does (docs/security.md)."""
    import math

    from analyzer.advisor.probe import run_probe
    from analyzer.cli.output import is_stdio, report_console, write_json
    from analyzer.errors import UsageError

    if not (math.isfinite(timeout) and 0 < timeout <= 3600):
        raise UsageError(f"--timeout must be above 0 and at most 3600 s, got {timeout}")
    if out is not None and not is_stdio(out):  # fail before the requests are sent
        from analyzer.outputs import check_output

        check_output(out, force=force)
    result = run_probe(urls, model, salt_field=salt_field, words=prefix_words, timeout_s=timeout)
    con = report_console(out)  # stderr when the JSON goes to stdout
    for line in result.lines():
        con.print(line, markup=False, highlight=False)
    if out is not None:
        write_json(out, result.to_json(), force=force)
        if not is_stdio(out):
            con.print(f"wrote {out}", markup=False, highlight=False)
    if result.passed is False:
        raise typer.Exit(5)
