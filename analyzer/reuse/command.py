"""``kvpool reuse``: how much prefill is repeated, where it comes from, how much cache it takes."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated

import typer

from analyzer.errors import UsageError

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the ``kvpool`` app."""
    app.command("reuse")(reuse)


def parse_tokens_list(text: str | None) -> tuple[int, ...]:
    """'1M,4M,250k' -> (1000000, 4000000, 250000); decimal suffixes K, M, G."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", part)
        if not m:
            raise UsageError(
                f"cannot read capacity '{part.strip()}'", hint="use e.g. 500k,1M,4M (tokens)"
            )
        out.append(round(float(m.group(1)) * _SUFFIX[m.group(2).upper()]))
    return tuple(out)


def parse_float_list(text: str | None, flag: str) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise UsageError(f"{flag} takes numbers separated by commas, got '{text}'") from None
    if not all(0 < v < math.inf for v in values):  # nan and inf too
        raise UsageError(f"{flag} values must be positive and finite")
    return values


def model_bytes_per_token(model: str, kv_dtype: str) -> int:
    """KV bytes per token of ``model`` from the cost stage's catalog."""
    try:
        from analyzer.cost import get_model
    except ImportError as exc:  # the cost stage is optional for this command
        raise UsageError(
            f"--model needs the cost catalog, which failed to load ({exc})",
            hint="use --capacity-tokens instead of --capacity-gib",
        ) from None
    return int(get_model(model).kv_bytes_per_token(dtype=kv_dtype))


def reuse(
    inputs: Annotated[
        list[Path], typer.Argument(help="Logs, public traces or a canonical .parquet.")
    ],
    warmup: Annotated[
        float,
        typer.Option(
            "--warmup", help="Fraction of requests that fill the cache uncounted (0 = cold)."
        ),
    ] = 0.5,
    block_size: Annotated[
        int | None,
        typer.Option("--block-size", help="Tokens per block (default: the input's; 16 for logs)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model id or config.json, for sizes in GB/GiB.")
    ] = None,
    kv_dtype: Annotated[
        str, typer.Option("--kv-dtype", help="KV cache dtype: bf16 | fp8")
    ] = "bf16",
    capacity_tokens: Annotated[
        str | None,
        typer.Option("--capacity-tokens", help="Capacities to compare policies at: 1M,4M,..."),
    ] = None,
    capacity_gib: Annotated[
        str | None, typer.Option("--capacity-gib", help="Capacities in GiB (needs --model): 8,32")
    ] = None,
    policies: Annotated[
        str, typer.Option("--policies", help="lru,fifo,s3fifo,optimal (LRU is always exact).")
    ] = "lru,fifo,s3fifo,optimal",
    shards_rate: Annotated[
        float | None,
        typer.Option(
            "--shards-rate",
            help="Sample the LRU curve (SHARDS) at this rate (auto beyond 50M accesses).",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", help="Shared prefixes to list.")] = 10,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the full report as JSON here.")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="Input format; detected if omitted.")
    ] = None,
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer",
            help="cl100k (default), PATH/tokenizer.json, or a Hugging Face model folder (tokenizer.json + tokenizer_config.json): its chat template renders the prompts.",
        ),
    ] = "cl100k",
) -> None:
    """Prefix reuse: ceilings, where reuse comes from, and hit rate against cache size."""
    from rich.console import Console

    from analyzer.progress import progress
    from analyzer.reuse.analysis import ReuseOptions, analyze_reuse
    from analyzer.reuse.render import render_summary, write_json

    if block_size is not None and block_size <= 0:
        raise UsageError("--block-size must be positive")
    caps = list(parse_tokens_list(capacity_tokens))
    gibs = parse_float_list(capacity_gib, "--capacity-gib")
    if not model and kv_dtype != "bf16":
        raise UsageError(
            f"--kv-dtype {kv_dtype} needs --model (it only converts capacities to bytes)"
        )
    bpt = model_bytes_per_token(model, kv_dtype) if model else None
    if gibs:
        if bpt is None:
            raise UsageError(
                "--capacity-gib needs --model (bytes per token)",
                hint="e.g. --model llama-3.1-8b, or give --capacity-tokens",
            )
        caps += [int(g * 2**30) // bpt for g in gibs]
    opts = ReuseOptions(
        warmup=warmup,
        capacities_tokens=tuple(caps),
        bytes_per_token=bpt,
        policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
        top_n=top,
        shards_rate=shards_rate,
    )
    loaded = _load(inputs, block_size, fmt, tokenizer)
    trace = loaded.trace
    if block_size is not None and block_size != trace.block_size:
        if block_size % trace.block_size:
            raise UsageError(
                f"--block-size {block_size} is not a multiple of the trace's block size "
                f"{trace.block_size}",
                hint="re-convert the raw logs with this --block-size",
            )
        trace = trace.coarsen(block_size // trace.block_size)
    with progress("analysing reuse", 100) as advance:
        report = analyze_reuse(trace, opts, advance=advance)
    console = Console()
    render_summary(report, console, sources=loaded.sources, skipped=str(loaded.skipped))
    for note in loaded.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    if json_out is not None:
        write_json(report, json_out)
        console.print(f"wrote {json_out}")


def _load(inputs: list[Path], block_size: int | None, fmt: str | None, tokenizer: str = "cl100k"):  # type: ignore[no-untyped-def]
    from analyzer.ingest import IngestOptions, open_trace
    from analyzer.progress import progress

    total = sum(p.stat().st_size for p in inputs if p.is_file())
    with progress("reading", total, unit="bytes") as advance:
        return open_trace(
            [str(p) for p in inputs],
            IngestOptions(block_size=block_size, fmt=fmt, tokenizer=tokenizer),
            advance,
        )
