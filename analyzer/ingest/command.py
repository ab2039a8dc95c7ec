"""``kvpool convert``: request logs or public traces -> canonical Parquet (or an export)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the ``kvpool`` app."""
    app.command("convert")(convert)


def convert(
    inputs: Annotated[list[Path], typer.Argument(help="Log files or traces (gzip/zstd ok).")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output file.")],
    fmt: Annotated[
        str | None, typer.Option("--format", help="Input format; detected if omitted.")
    ] = None,
    to: Annotated[str, typer.Option("--to", help="canonical | mooncake | bailian")] = "canonical",
    block_size: Annotated[
        int | None,
        typer.Option("--block-size", help="Tokens per block (default 16; 512 for Mooncake)."),
    ] = None,
    template: Annotated[str, typer.Option("--template", help="chatml | llama3")] = "chatml",
    tools_position: Annotated[
        str, typer.Option("--tools-position", help="in-system | after-system | before-system")
    ] = "in-system",
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer",
            help="cl100k (default), PATH/tokenizer.json, or a Hugging Face model folder (tokenizer.json + tokenizer_config.json): its chat template renders the prompts.",
        ),
    ] = "cl100k",
    token_ratio: Annotated[
        float,
        typer.Option("--token-ratio", help="Served-model tokens per counted token (e.g. 1.12)."),
    ] = 1.0,
    salt_file: Annotated[
        Path | None,
        typer.Option("--salt-file", help="Hashing salt, made on first use [./.kvpool-salt]."),
    ] = None,
    hash_key: Annotated[
        list[str] | None,
        typer.Option("--hash-key", help="Extra hash key so these never share KV: model, tenant."),
    ] = None,
    time_field: Annotated[
        str | None, typer.Option("--time-field", help="Timestamp field (a.b.c).")
    ] = None,
    time_unit: Annotated[str, typer.Option("--time-unit", help="auto | s | ms | us | ns")] = "auto",
    prompt_column: Annotated[str | None, typer.Option("--prompt-column")] = None,
    time_column: Annotated[str | None, typer.Option("--time-column")] = None,
    session_column: Annotated[str | None, typer.Option("--session-column")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Stop at the first bad row.")] = False,
    keep_previews: Annotated[
        bool, typer.Option("--keep-previews", help="Also write 80-char text previews beside OUT.")
    ] = False,
    no_exact: Annotated[
        bool, typer.Option("--no-exact", help="Skip the token-exact LCP (for huge logs).")
    ] = False,
    exact_max_mib: Annotated[
        int,
        typer.Option(
            "--exact-max-mib", help="Memory bound of the token-exact LCP tree; past it, skipped."
        ),
    ] = 512,
) -> None:
    """Convert request logs or public traces to the canonical trace (or an export)."""
    from rich.console import Console

    from analyzer.errors import UsageError
    from analyzer.ingest import IngestOptions, open_trace, previews_path
    from analyzer.ingest.pipeline import convert_trace
    from analyzer.progress import progress

    if to not in ("canonical", "mooncake", "bailian"):
        raise UsageError(f"unknown --to '{to}'", hint="canonical, mooncake or bailian")
    opts = IngestOptions(
        block_size=block_size,
        fmt=fmt,
        template=template,
        tools_position=tools_position,
        tokenizer=tokenizer,
        token_ratio=token_ratio,
        strict=strict,
        salt_file=salt_file,
        hash_keys=tuple(hash_key or ()),
        time_field=time_field,
        time_unit=time_unit,
        prompt_column=prompt_column,
        time_column=time_column,
        session_column=session_column,
        exact=not no_exact,
        exact_max_bytes=exact_max_mib << 20,
    )
    if exact_max_mib < 1:
        raise UsageError(f"--exact-max-mib must be at least 1, got {exact_max_mib}")
    total = sum(p.stat().st_size for p in inputs if p.is_file())
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if to == "canonical":
        with progress("reading", total, unit="bytes") as advance:
            loaded, written = convert_trace([str(p) for p in inputs], out, opts, advance=advance)
        if keep_previews and loaded.previews:
            import pyarrow as pa
            import pyarrow.parquet as pq

            items = sorted(loaded.previews.items())
            side = pa.table(
                {
                    "block_hash": pa.array([h for h, _ in items], pa.uint64()),
                    "preview": pa.array([t for _, t in items], pa.string()),
                }
            )
            pq.write_table(side, previews_path(out), compression="zstd")
        console.print(summary(loaded, written, out), markup=False)
        return
    from analyzer.ingest.pipeline import table_figures

    with progress("reading", total, unit="bytes") as advance:
        loaded = open_trace([str(p) for p in inputs], opts, advance=advance)
    if to == "mooncake":
        from analyzer.ingest.export import export_mooncake

        export_mooncake(loaded.table, out)
    else:
        from analyzer.ingest.export import export_bailian

        export_bailian(loaded.table, out)
    console.print(summary(loaded, table_figures(loaded.table), out), markup=False)


def summary(loaded, written, out: Path) -> str:  # type: ignore[no-untyped-def]
    """The end-of-run summary: requests, tokens, blocks, skipped rows with examples."""
    w = written
    if w.distinct_sample_rate < 1:
        distinct = (
            f"about {w.distinct_blocks:,} distinct, counted on a 1/"
            f"{round(1 / w.distinct_sample_rate):,} sample of hash values"
        )
    else:
        distinct = f"{w.distinct_blocks:,} distinct"
    lines = [
        f"wrote {out}",
        f"  requests: {w.requests:,}   formats: {', '.join(sorted(set(loaded.formats)))}",
        f"  prompt tokens: {w.prompt_tokens:,}"
        + ("   (count-only: lengths, no content)" if w.count_only else ""),
        f"  blocks: {w.blocks:,} ({distinct}) of {w.block_size} tokens",
    ]
    if loaded.reordered:
        lines.append(f"  out-of-order rows: {loaded.reordered:,} (sorted by arrival)")
    for f in loaded.untimed_files:
        lines.append(f"  no timestamps in {f}: requests spaced 1 s apart in file order")
    for note in loaded.mixed_unit_files:
        lines.append(f"  {note}")
    for note in loaded.notes:
        lines.append(f"  {note}")
    if loaded.skipped.total:
        lines.append("  " + str(loaded.skipped).replace("\n", "\n  "))
    else:
        lines.append("  skipped: none")
    return "\n".join(lines)
