"""``kvpool convert``: request logs or public traces -> canonical Parquet (or an export)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from analyzer.cli import options as o


def register(app: typer.Typer) -> None:
    """Add this command group to the ``kvpool`` app."""
    app.command("convert")(convert)


@o.ingest_flags
def convert(
    inputs: o.Inputs,
    *,
    out: Annotated[
        Path,
        typer.Option(
            "-o",
            "--out",
            help="Output file ('-': stdout; a folder with --ray, --window-s; s3://, gs://, "
            "az:// to object storage).",
            parser=o.path_or_url,
        ),
    ],
    ingest: o.IngestFlags,
    to: Annotated[
        Literal["canonical", "mooncake", "bailian"],
        typer.Option("--to", help="What to write: the canonical trace or an export."),
    ] = "canonical",
    keep_previews: Annotated[
        bool,
        typer.Option(
            "--keep-previews", help="Also write 80-char prompt previews beside OUT (mode 0600)."
        ),
    ] = False,
    window_s: Annotated[
        int | None,
        typer.Option(
            "--window-s",
            help="Write OUT as a dataset folder, one Parquet file per this many seconds of "
            "arrival (window_start_s=N/; the default with --ray: 3600).",
        ),
    ] = None,
    force: o.Force = False,
    keep_names: o.KeepNames = False,
) -> None:
    """Convert request logs or public traces to the canonical trace (or an export)."""
    from analyzer.cli.stdio import is_stdio, output_file
    from analyzer.errors import UsageError
    from analyzer.storage import is_url, public

    if to not in ("canonical", "mooncake", "bailian"):
        raise UsageError(f"unknown --to '{to}'", hint="canonical, mooncake or bailian")
    opts = ingest.options(previews=keep_previews, keep_names=keep_names)
    if is_stdio(out) and keep_previews:
        raise UsageError("--keep-previews writes a file beside -o FILE; not with -o - (stdout)")
    if is_url(out) and keep_previews:
        raise UsageError(
            "--keep-previews writes prompt text to a private (0600) file beside -o FILE; "
            "not to object storage, whose access is the bucket's"
        )
    if ingest.ray is not None and window_s is None and to == "canonical" and not is_stdio(out):
        window_s = 3600  # a cluster's output: a dataset partitioned by hour
    if window_s is not None:
        if to != "canonical" or is_stdio(out):
            raise UsageError(
                "--window-s writes the canonical trace as a folder: not with --to or -o - (stdout)"
            )
        if window_s < 1:
            raise UsageError(f"--window-s must be at least 1, got {window_s}")
    with output_file(out) as target:
        name = "<stdout>" if is_stdio(out) else public(str(out)) if is_url(out) else str(out)
        _convert(inputs, target, name, to, opts, force, window_s)


def _convert(  # type: ignore[no-untyped-def]
    inputs: list[Path], out: Path, name: str, to: str, opts, force: bool, window_s: int | None
) -> None:
    """``convert`` into the file ``out`` (a temporary one for stdout), called ``name``;
    with ``window_s``, into the dataset folder ``out``."""
    from rich.console import Console

    from analyzer.errors import printable
    from analyzer.ingest import open_trace, previews_path
    from analyzer.ingest.convert import convert_trace
    from analyzer.outputs import atomic_path, check_dataset_output, check_output
    from analyzer.progress import progress

    keep_previews = opts.previews
    # Fail before the long run, not after it.
    if window_s is not None:
        check_dataset_output(out, inputs=inputs)
    else:
        check_output(out, force=force, inputs=inputs)
    if keep_previews:
        check_output(previews_path(out), force=force, inputs=inputs)
    total = o.input_bytes(inputs)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if to == "canonical":
        with progress("reading", total, unit="bytes") as advance:
            loaded, written = convert_trace(
                [str(p) for p in inputs], out, opts, advance=advance, force=force, window_s=window_s
            )
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
        console.print(printable(summary(loaded, written, name)), markup=False)
        return
    from analyzer.ingest.convert import table_figures

    with progress("reading", total, unit="bytes") as advance:
        loaded = open_trace([str(p) for p in inputs], opts, advance=advance)
    if to == "mooncake":
        from analyzer.ingest.export import export_mooncake

        export_mooncake(loaded.table, out, force=force)
    else:
        from analyzer.ingest.export import export_bailian

        export_bailian(loaded.table, out, force=force)
    text = summary(loaded, table_figures(loaded.table), name)
    console.print(printable(text + "\n" + export_note(loaded.table, to)), markup=False)


def export_note(table, to: str) -> str:  # type: ignore[no-untyped-def]
    """What an export's lengths count and what it keeps of conversations."""
    import pyarrow.compute as pc

    from analyzer.trace import read_metadata

    tok = read_metadata(table).get("tokenizer") or ""
    unit = (
        f"{tok} tokens (set --tokenizer to the served model's tokenizer for its counts)"
        if tok
        else "tokens as the source trace counted them"
    )
    lines = [f"  input_length / output_length: {unit}"]
    n = int(pc.count_distinct(table.column("session_id")).as_py() or 0)
    if to == "mooncake":
        lines.append(
            f"  sessions: {n:,} kept as session_id + delay (AIPerf mooncake_trace multi-turn)"
            if n
            else "  sessions: none in the log (each request replays on its own)"
        )
    return "\n".join(lines)


def summary(loaded, written, out: Path | str) -> str:  # type: ignore[no-untyped-def]
    """The end-of-run summary: requests, tokens, blocks, skipped rows with examples."""
    from analyzer.errors import shown

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
    lines.append(f"  time span: {w.span_s:,.1f} s from the first request to the last")
    if loaded.reordered:
        lines.append(f"  out-of-order rows: {loaded.reordered:,} (sorted by arrival)")
    for f in loaded.untimed_files:
        lines.append(f"  no timestamps in {shown(f)}: requests spaced 1 s apart in file order")
    for note in loaded.mixed_unit_files:
        lines.append(f"  {note}")
    for note in loaded.notes:
        lines.append(f"  {note}")
    if loaded.skipped.total:
        lines.append("  " + str(loaded.skipped).replace("\n", "\n  "))
    else:
        lines.append("  skipped: none")
    return "\n".join(lines)
