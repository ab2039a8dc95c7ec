"""``kvpool convert``: request logs or public traces -> canonical Parquet (or an export)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the ``kvpool`` app."""
    app.command("convert")(convert)


def convert(
    inputs: list[Path] = typer.Argument(..., help="Log files or traces (gzip/zstd ok)."),
    out: Path = typer.Option(..., "-o", "--out", help="Output file."),
    fmt: str | None = typer.Option(None, "--format", help="Input format; detected if omitted."),
    to: str = typer.Option("canonical", "--to", help="canonical | mooncake | bailian"),
    block_size: int | None = typer.Option(
        None, "--block-size", help="Tokens per block [default: 16; 512 for Mooncake traces]."
    ),
    template: str = typer.Option("chatml", "--template", help="chatml | llama3"),
    tools_position: str = typer.Option(
        "in-system", "--tools-position", help="in-system | after-system | before-system"
    ),
    tokenizer: str = typer.Option("cl100k", "--tokenizer", help="cl100k or PATH/tokenizer.json"),
    token_ratio: float = typer.Option(
        1.0, "--token-ratio", help="Served-model tokens per counted token (e.g. 1.12)."
    ),
    salt_file: Path | None = typer.Option(
        None, "--salt-file", help="Hashing salt, created on first use [default: ./.kvpool-salt]."
    ),
    hash_key: list[str] = typer.Option(
        [], "--hash-key", help="Extra hash key so these never share KV: model, tenant."
    ),
    time_field: str | None = typer.Option(None, "--time-field", help="Timestamp field (a.b.c)."),
    time_unit: str = typer.Option("auto", "--time-unit", help="auto | s | ms | us | ns"),
    prompt_column: str | None = typer.Option(None, "--prompt-column"),
    time_column: str | None = typer.Option(None, "--time-column"),
    session_column: str | None = typer.Option(None, "--session-column"),
    strict: bool = typer.Option(False, "--strict", help="Stop at the first bad row."),
    keep_previews: bool = typer.Option(
        False, "--keep-previews", help="Also write 80-char text previews beside the output."
    ),
    no_exact: bool = typer.Option(
        False, "--no-exact", help="Skip the token-exact LCP (saves memory on huge logs)."
    ),
) -> None:
    """Convert request logs or public traces to the canonical trace (or an export)."""
    from rich.console import Console

    from analyzer.errors import UsageError
    from analyzer.ingest import IngestOptions, open_trace, previews_path
    from analyzer.progress import progress
    from analyzer.trace import write_canonical

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
        hash_keys=tuple(hash_key),
        time_field=time_field,
        time_unit=time_unit,
        prompt_column=prompt_column,
        time_column=time_column,
        session_column=session_column,
        exact=not no_exact,
    )
    total = sum(p.stat().st_size for p in inputs if p.is_file())
    with progress("reading", total, unit="bytes") as advance:
        loaded = open_trace([str(p) for p in inputs], opts, advance=advance)
    if to == "canonical":
        write_canonical(loaded.table, out)
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
    elif to == "mooncake":
        from analyzer.ingest.export import export_mooncake

        export_mooncake(loaded.table, out)
    else:
        from analyzer.ingest.export import export_bailian

        export_bailian(loaded.table, out)
    Console(stderr=True, highlight=False).print(summary(loaded, out))


def summary(loaded, out: Path) -> str:  # type: ignore[no-untyped-def]
    """The end-of-run summary: requests, tokens, blocks, skipped rows with examples."""
    t = loaded.trace
    lines = [
        f"wrote {out}",
        f"  requests: {t.n_requests:,}   formats: {', '.join(sorted(set(loaded.formats)))}",
        f"  prompt tokens: {int(t.prompt_tokens.sum()):,}"
        + ("   (count-only: lengths, no content)" if t.count_only else ""),
        f"  blocks: {t.n_accesses:,} ({t.n_blocks:,} distinct) of {t.block_size} tokens",
    ]
    if loaded.reordered:
        lines.append(f"  out-of-order rows: {loaded.reordered:,} (sorted by arrival)")
    for f in loaded.untimed_files:
        lines.append(f"  no timestamps in {f}: requests spaced 1 s apart in file order")
    if loaded.skipped.total:
        lines.append("  " + str(loaded.skipped).replace("\n", "\n  "))
    else:
        lines.append("  skipped: none")
    return "\n".join(lines)
