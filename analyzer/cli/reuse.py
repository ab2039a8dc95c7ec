"""``kvpool reuse``: how much prefill is repeated, where it comes from, how much cache it takes.

Start-up exception: the reuse stage (numpy, numba, polars), ingest, the cost catalog and
the advisor's per-model figures are imported inside the command, because ``kvpool
--help`` imports every command module and imports no library module
(analyzer/cli/options.py).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from analyzer.cli import options as o
from analyzer.errors import UsageError, shown
from analyzer.quoting import terminal

if TYPE_CHECKING:
    from analyzer.ingest.options import IngestOptions, LoadedTrace
    from analyzer.reuse.records import ReuseOptions

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}


def register(app: typer.Typer) -> None:
    """Add this command group to the ``kvpool`` app."""
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


@o.ingest_flags
def reuse(
    inputs: o.Inputs,
    *,
    warmup: o.Warmup = 0.5,
    ingest: o.IngestFlags,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model id or config.json, for sizes in GB/GiB (optional)."),
    ] = None,
    kv_dtype: o.KvDtype = "bf16",
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
    shards_above: Annotated[
        int,
        typer.Option(
            "--shards-above",
            help="Block accesses above which the LRU curve is SHARDS-sampled (rate 0.01).",
        ),
    ] = 50_000_000,
    exact_curve: Annotated[
        bool,
        typer.Option("--exact-curve", help="Always compute the exact LRU curve (no sampling)."),
    ] = False,
    top: Annotated[int, typer.Option("--top", help="Shared prefixes to list.")] = 10,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Write the full report as JSON here ('-': stdout).", parser=o.path_or_url
        ),
    ] = None,
    only_model: o.OnlyModel = None,
    isolation: o.Isolation = "shared",
    force: o.Force = False,
    show_previews: o.ShowPreviews = False,
) -> None:
    """Prefix reuse: ceilings, where reuse comes from, and hit rate against cache size."""
    from analyzer.cli.output import console, is_stdio, report_console, write_json
    from analyzer.progress import progress
    from analyzer.reuse.analysis import ReuseOptions, analyze_reuse
    from analyzer.reuse.tables import render_summary

    block_size = ingest.block_size
    if block_size is not None and block_size <= 0:
        raise UsageError("--block-size must be positive")
    if json_out is not None and not is_stdio(json_out):  # fail before the long run
        from analyzer.outputs import check_output

        check_output(json_out, force=force, inputs=inputs)
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
        shards_rate=1.0 if exact_curve else shards_rate,
        shards_threshold_accesses=shards_above,
        jobs=o.machine_jobs(ingest.jobs, say=False),  # said when the logs are read
    )
    if exact_curve and shards_rate is not None:
        raise UsageError("--exact-curve and --shards-rate contradict each other; give one")
    if shards_above < 0:
        raise UsageError(f"--shards-above must be >= 0, got {shards_above}")
    from analyzer.advisor.models import model_warning, models_document, select_model, served_models

    streamed = _streamable(inputs, block_size, only_model, show_previews)
    if streamed is not None:
        _reuse_streamed(streamed, opts, model, kv_dtype, json_out, force, isolation)
        return
    loaded = _load(inputs, ingest.options(previews=show_previews))

    if only_model is not None:
        loaded = select_model(loaded, only_model)
    loaded = loaded.isolated(isolation)
    named = served_models(loaded.table)
    warning = model_warning(named, model)
    if warning:
        console(stderr=True).print(f"[yellow]warning: {terminal(warning)}[/]")
    # Only a multi-model log's per-model figures (--json) read the table's block hashes
    # again: else keep them once, as the trace's dense ids (16 bytes an access held
    # through the analysis otherwise, 190 MB at a 50k long-prompt log).
    once = json_out is None or len(named) < 2
    if once:
        loaded.drop_block_columns()
    trace = loaded.trace
    if once:
        from analyzer.ingest.builder import release_freed_memory

        release_freed_memory()  # numbering the hashes freed about as much as it holds
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
    out = report_console(json_out)
    sources = [shown(p) for p in loaded.sources]
    render_summary(report, out, sources=sources, skipped=str(loaded.skipped))
    for note in loaded.notes:
        out.print(f"note: {note}", markup=False, highlight=False)
    keys = trace.meta.get("hash_keys", "")
    out.print(isolation_line(isolation, keys), markup=False, highlight=False)
    engine = loaded.engine
    if engine is not None:  # a KV-event recording: the engine's own figures
        from dataclasses import replace

        engine = replace(engine, bytes_per_token=bpt)
        for line in engine.lines():
            out.print(line, markup=False, highlight=False)
    if json_out is not None:
        with progress("per-model reuse", None):
            models = models_document(loaded, opts, kv_dtype, warning=warning or None)
        doc = {**report.to_json(), "isolation": isolation, "models": models.to_json()}
        if engine is not None:
            doc["engine_events"] = engine.to_json()
        write_json(json_out, doc, force=force)
        if not is_stdio(json_out):
            out.print(f"wrote {terminal(str(json_out))}")


def _streamable(
    inputs: list[Path], block_size: int | None, only_model: str | None, previews: bool
) -> Path | None:
    """The one canonical file or dataset directory that :func:`analyze_canonical` streams
    (None: read the inputs whole, as every other command does)."""
    if len(inputs) != 1 or only_model is not None or previews:
        return None
    path = inputs[0]
    if path.is_dir():
        return path
    from analyzer.trace import is_canonical, read_metadata

    if not path.is_file() or not is_canonical(path):
        return None
    if block_size is not None:
        import pyarrow.parquet as pq

        if str(block_size) != read_metadata(pq.read_schema(path)).get("block_size", "16"):
            return None
    return path


def _reuse_streamed(
    path: Path,
    opts: ReuseOptions,
    model: str | None,
    kv_dtype: str,
    json_out: Path | None,
    force: bool,
    isolation: str,
) -> None:
    """``kvpool reuse`` of one canonical file or dataset, streamed (analyzer/reuse/streamed.py)."""
    from analyzer.advisor.models import model_warning, models_document, served_models
    from analyzer.cli.output import console, is_stdio, report_console, write_json
    from analyzer.ingest.options import LoadedTrace, SkipSummary
    from analyzer.progress import progress
    from analyzer.reuse.frame import canonical_files, scan_trace
    from analyzer.reuse.streamed import analyze_canonical
    from analyzer.reuse.tables import render_summary

    with progress("reading", None):
        lf, meta = scan_trace(path)
        small = lf.select("model", "prompt_tokens").collect(engine="streaming").to_arrow()
        small = small.replace_schema_metadata({f"kvpool.{k}": v for k, v in meta.items()})
    loaded = LoadedTrace(
        table=small,
        skipped=SkipSummary(),
        sources=[str(f) for f in canonical_files(path)],
        formats=["canonical"],
    )
    warning = model_warning(served_models(small), model)
    if warning:
        console(stderr=True).print(f"[yellow]warning: {terminal(warning)}[/]")
    with progress("analysing reuse", 100) as advance:
        report = analyze_canonical(path, opts, advance=advance, isolation=isolation)
    out = report_console(json_out)
    sources = [shown(p) for p in loaded.sources]
    render_summary(report, out, sources=sources, skipped=str(loaded.skipped))
    keys = meta.get("hash_keys", "")
    out.print(isolation_line(isolation, keys), markup=False, highlight=False)
    if json_out is not None:
        if len(served_models(small)) > 1:
            from analyzer.ingest import open_trace

            # per-model curves read each model's rows whole (ingest's reader)
            loaded = open_trace([str(f) for f in canonical_files(path)]).isolated(isolation)
        with progress("per-model reuse", None):
            models = models_document(loaded, opts, kv_dtype, warning=warning or None)
        doc = {**report.to_json(), "isolation": isolation, "models": models.to_json()}
        write_json(json_out, doc, force=force)
        if not is_stdio(json_out):
            out.print(f"wrote {terminal(str(json_out))}")


def isolation_line(policy: str, hash_keys: str = "") -> str:
    """What the figures above were measured under, in one line (``hash_keys``: the
    trace's own, ``kvpool.hash_keys``: a trace hashed with the tenant key is keyed by
    tenant whatever the policy)."""
    from analyzer.reuse.isolation import describe

    if policy == "shared" and "tenant" in hash_keys.split(","):
        return "isolation: tenant (the trace was hashed with --hash-key tenant): " + describe(
            "tenant"
        )
    return f"isolation: {policy}: {describe(policy)}"


def _load(inputs: list[Path], ingest: IngestOptions) -> LoadedTrace:
    from analyzer.ingest import open_trace
    from analyzer.progress import progress

    with progress("reading", o.input_bytes(inputs), unit="bytes") as advance:
        return open_trace([str(p) for p in inputs], ingest, advance)
