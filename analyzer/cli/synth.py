"""``kvpool synth``: write a realistic synthetic request log with known structure."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from analyzer.quoting import terminal


def register(app: typer.Typer) -> None:
    """Add this command group to the ``kvpool`` app."""
    app.command("synth")(synth)


def synth(
    output: Annotated[
        Path,
        typer.Option(
            "-o",
            "--out",
            "--output",
            help="Log to write (.gz: gzip, .zst: zstd, compressed; '-': stdout, plain).",
        ),
    ],
    profile: Annotated[
        str, typer.Option("--profile", help="chat | agent | rag | api | mixed | saas.")
    ] = "mixed",
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests to write.")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same bytes.")] = 0,
    fmt: Annotated[
        str, typer.Option("--format", help="openai (JSONL) | gateway-csv | mooncake.")
    ] = "openai",
    arrival: Annotated[
        str, typer.Option("--arrival", help="poisson | bursty | diurnal.")
    ] = "poisson",
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Mean requests per second (default: per profile)."),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option("--duration", help="Seconds the log spans (sets the rate; not with --rate)."),
    ] = None,
    shared_templates: Annotated[
        int,
        typer.Option(
            "--shared-templates", help="api: few-shot templates shared by requests (0: none)."
        ),
    ] = 4,
    documents: Annotated[int, typer.Option("--documents", help="rag: document pool size.")] = 2000,
    truth: Annotated[
        Path | None,
        typer.Option(
            "--truth",
            help="Also write a JSON ground truth (sessions, who resent what; '-': stdout).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Write through a symlinked output path.")
    ] = False,
) -> None:
    """Write a synthetic OpenAI chat-completions log (or gateway CSV, or Mooncake trace)."""
    from rich.console import Console

    from analyzer.errors import UsageError
    from analyzer.progress import progress
    from analyzer.synth import SynthConfig, generate

    config = SynthConfig(
        profile=profile,
        requests=requests,
        seed=seed,
        arrival=arrival,
        rate_rps=rate,
        duration_s=duration,
        shared_templates=shared_templates,
        documents=documents,
    )
    from contextlib import nullcontext

    from analyzer.cli.stdio import is_stdio, output_file

    if is_stdio(truth) and is_stdio(output):
        raise UsageError("-o - and --truth - would both write to stdout: give one a file")
    truth_out = nullcontext(None) if truth is None else output_file(truth, what="ground truth")
    # stdout is streamed as the log is made (`synth -o - | head` stops when head does);
    # a file is written whole, then renamed into place
    stream = sys.stdout.buffer if is_stdio(output) else None
    with (
        nullcontext(Path("stdout")) if stream is not None else output_file(output) as target,
        truth_out as truth_target,
        progress("synth", config.requests, unit="requests") as advance,
    ):
        try:
            stats = generate(
                config,
                target,
                fmt=fmt,
                truth_path=truth_target,
                advance=advance,
                force=force,
                stream=stream,
            )
        except BrokenPipeError:  # the reader of stdout stopped (`| head`): done, exit 0
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
    where = "<stdout>" if is_stdio(output) else stats.path
    console = Console(stderr=True)
    console.print(
        f"wrote {stats.requests:,} requests ({stats.sessions:,} sessions, "
        f"{stats.bytes_written / 1e6:,.1f} MB uncompressed, {stats.span_s:,.0f} s) "
        f"to {terminal(str(where))}",
        highlight=False,
        soft_wrap=True,
    )
    if stats.truth_path:
        shown = "<stdout>" if is_stdio(truth) else stats.truth_path
        console.print(f"ground truth: {terminal(str(shown))}", highlight=False, soft_wrap=True)
