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
        str, typer.Option("--tokenizer", help="cl100k or PATH/tokenizer.json")
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
        bool,
        typer.Option(
            "--keep-previews", help="Also write 80-char prompt previews beside OUT (mode 0600)."
        ),
    ] = False,
    keep_names: Annotated[
        bool,
        typer.Option(
            "--keep-names",
            help="Store tenant names, request ids and file names as they are (default: "
            "salted pseudonyms).",
        ),
    ] = False,
    no_exact: Annotated[
        bool, typer.Option("--no-exact", help="Skip the token-exact LCP (for huge logs).")
    ] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Write through a symlinked output path."),
    ] = False,
) -> None:
    """Convert request logs or public traces to the canonical trace (or an export)."""
    from rich.console import Console

    from analyzer.errors import UsageError, printable
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
        hash_keys=tuple(hash_key or ()),
        time_field=time_field,
        time_unit=time_unit,
        prompt_column=prompt_column,
        time_column=time_column,
        session_column=session_column,
        exact=not no_exact,
        previews=keep_previews,
        keep_names=keep_names,
    )
    from analyzer.outputs import atomic_path, check_output

    check_output(out, force=force, inputs=inputs)  # fail before the long run, not after it
    if keep_previews:
        check_output(previews_path(out), force=force, inputs=inputs)
    total = sum(p.stat().st_size for p in inputs if p.is_file())
    with progress("reading", total, unit="bytes") as advance:
        loaded = open_trace([str(p) for p in inputs], opts, advance=advance)
    if to == "canonical":
        write_canonical(loaded.table, out, force=force)
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
            # Prompt text: readable by its owner only, like the salt.
            with atomic_path(previews_path(out), force=force, private=True) as tmp:
                pq.write_table(side, tmp, compression="zstd")
    elif to == "mooncake":
        from analyzer.ingest.export import export_mooncake

        export_mooncake(loaded.table, out, force=force)
    else:
        from analyzer.ingest.export import export_bailian

        export_bailian(loaded.table, out, force=force)
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        printable(summary(loaded, out)), markup=False
    )


def summary(loaded, out: Path) -> str:  # type: ignore[no-untyped-def]
    """The end-of-run summary: requests, tokens, blocks, skipped rows with examples."""
    import numpy as np
    import pyarrow.compute as pc

    from analyzer.trace import read_metadata

    t = loaded.table
    flat = t.column("block_hashes").combine_chunks().values.to_numpy(zero_copy_only=False)
    count_only = t.num_rows > 0 and bool(pc.all(t.column("count_only")).as_py())
    lines = [
        f"wrote {out}",
        f"  requests: {t.num_rows:,}   formats: {', '.join(sorted(set(loaded.formats)))}",
        f"  prompt tokens: {int(pc.sum(t.column('prompt_tokens')).as_py() or 0):,}"
        + ("   (count-only: lengths, no content)" if count_only else ""),
        f"  blocks: {flat.size:,} ({np.unique(flat).size:,} distinct) of "
        f"{read_metadata(t).get('block_size')} tokens",
    ]
    span = float(pc.max(t.column("arrival_s")).as_py() or 0.0) if t.num_rows else 0.0
    lines.append(f"  time span: {span:,.1f} s from the first request to the last")
    if loaded.reordered:
        lines.append(f"  out-of-order rows: {loaded.reordered:,} (sorted by arrival)")
    for f in loaded.untimed_files:
        lines.append(f"  no timestamps in {f}: requests spaced 1 s apart in file order")
    for note in loaded.mixed_unit_files:
        lines.append(f"  {note}")
    if loaded.skipped.total:
        lines.append("  " + str(loaded.skipped).replace("\n", "\n  "))
    else:
        lines.append("  skipped: none")
    return "\n".join(lines)
