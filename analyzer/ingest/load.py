"""``open_trace``: any supported input (or a canonical Parquet) -> a canonical trace.

The options are checked, each input's format resolved, and the inputs read by the
one reader that fits them: canonical files merged (:mod:`analyzer.ingest.canonical`),
KV-event recordings rebuilt (:mod:`analyzer.ingest.kvevents`), and logs read into a
:class:`~analyzer.ingest.builder.TraceBuilder` in this process, over worker processes
(``--jobs``, :mod:`analyzer.ingest.parallel`) or on a Ray cluster (``--ray``,
:mod:`analyzer.ingest.cluster`), each giving the rows of a one-process read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa

from analyzer import limits
from analyzer.errors import InputError, UsageError, shown
from analyzer.ingest.builder import TEXT_FORMATS, TraceBuilder, release_freed_memory
from analyzer.ingest.canonical import open_canonical
from analyzer.ingest.cluster import read_ray
from analyzer.ingest.detect import FORMATS, Format, resolve_format, unknown_format
from analyzer.ingest.io import check_readable
from analyzer.ingest.kvevents import open_recordings
from analyzer.ingest.options import HASH_KEYS, TIME_UNITS, IngestOptions, LoadedTrace
from analyzer.ingest.parallel import read_parallel, start
from analyzer.ingest.streams import SplitMisaligned
from analyzer.tokenize import TEMPLATES, TOOLS_POSITIONS
from analyzer.tokenize.tokenizer import CL100K_NAMES
from analyzer.trace import CANONICAL_SCHEMA


def _validate(opts: IngestOptions) -> None:
    if opts.block_size is not None and opts.block_size < 1:
        raise UsageError(f"block size must be at least 1, got {opts.block_size}")
    if opts.fmt is not None and opts.fmt not in FORMATS:
        raise UsageError(unknown_format(opts.fmt))
    if opts.template not in TEMPLATES:
        raise UsageError(f"unknown template '{opts.template}'", hint="chatml or llama3")
    if opts.tools_position not in TOOLS_POSITIONS:
        raise UsageError(
            f"unknown tools position '{opts.tools_position}'", hint=", ".join(TOOLS_POSITIONS)
        )
    if not opts.token_ratio > 0:
        raise UsageError(f"--token-ratio must be positive, got {opts.token_ratio}")
    limits.check(opts.token_ratio, "token_ratio", "--token-ratio")
    if opts.block_size is not None:
        limits.check(opts.block_size, "block_size", "--block-size")
    bad = set(opts.hash_keys) - set(HASH_KEYS)
    if bad:
        raise UsageError(f"unknown hash key(s) {sorted(bad)}", hint="model and/or tenant")
    if opts.time_unit not in TIME_UNITS:
        raise UsageError(f"unknown time unit '{opts.time_unit}'", hint=", ".join(TIME_UNITS))


def read_inputs(
    paths: str | Path | Sequence[str | Path],
    opts: IngestOptions | None,
    advance: Callable[[float], None] | None,
) -> TraceBuilder | LoadedTrace:
    """Every row of the inputs read, hashed and spooled into a builder (its ``paths``
    the inputs); canonical inputs and KV-event recordings come back loaded."""
    opts = opts or IngestOptions()
    _validate(opts)
    if isinstance(paths, str | Path):
        paths = [paths]
    plist = [str(p) for p in paths]
    if not plist:
        raise UsageError("no input files given")
    for p in plist:
        check_readable(p)
    fmts = [resolve_format(opts.fmt, p) for p in plist]
    if all(f == Format.CANONICAL for f in fmts):
        return open_canonical(plist, opts.block_size, opts.previews)
    if Format.CANONICAL in fmts:
        raise UsageError("canonical traces cannot be mixed with raw logs in one run")
    if Format.KV_EVENTS in fmts:
        if any(f != Format.KV_EVENTS for f in fmts):
            raise UsageError("KV-event recordings cannot be mixed with logs in one run")
        return open_recordings(plist, opts, opts.block_size)
    jobs = _jobs_for(plist, opts)
    started = None
    if jobs > 1 and opts.ray_address is None:
        # The workers start now, importing and loading the tokenizer beside the parent
        # (the bundled one, which tiktoken keeps loaded for the worker's reader).
        text = opts.tokenizer in CL100K_NAMES and any(f in TEXT_FORMATS for f in fmts)
        started = start(plist, fmts, opts.tokenizer if text else None, jobs, advance is not None)
    try:
        b = TraceBuilder(
            plist, fmts, opts, advance, processes=jobs if opts.ray_address is None else 1
        )
    except BaseException:
        if started is not None:
            started.stop()
        raise
    try:
        if opts.ray_address is not None:
            read_ray(b, opts.ray_address)
        elif started is not None:
            read_parallel(b, jobs, started)
        else:
            for p, f in zip(plist, fmts, strict=True):
                b.read_file(p, f)
    except SplitMisaligned:
        # A CSV whose byte ranges did not fall between records (a quote open across a
        # cut, a broken quote): read again in one process, the output by definition.
        b.rows.close()
        b = TraceBuilder(plist, fmts, opts, advance)
        for p, f in zip(plist, fmts, strict=True):
            b.read_file(p, f)
    if not len(b.rows):
        raise InputError(
            "no usable requests in "
            + ", ".join(map(shown, plist))
            + (f"; {b.skipped}" if b.skipped.total else ""),
            hint="check --format and the column flags (see docs/formats.md)",
        )
    return b


def _jobs_for(paths: list[str], opts: IngestOptions) -> int:
    """Worker processes for this run: one when the inputs are too small to gain from more
    (starting a worker costs about a second) and under --strict (the first bad row in
    input order must be the one reported)."""
    jobs = opts.jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    if opts.strict or sum(os.path.getsize(p) for p in paths) < opts.parallel_min_bytes:
        return 1
    return jobs


def open_trace(
    paths: str | Path | Sequence[str | Path],
    opts: IngestOptions | None = None,
    advance: Callable[[float], None] | None = None,
) -> LoadedTrace:
    """Read inputs of any supported format (or canonical Parquet) into a canonical trace.

    ``advance(n)`` is called with input bytes consumed, for a progress bar whose total is
    the sum of the input file sizes. Raises InputError when nothing usable is found.
    """
    b = read_inputs(paths, opts, advance)
    if isinstance(b, LoadedTrace):
        return b
    meta, batches = b.finish()
    table = pa.Table.from_batches(list(batches), schema=CANONICAL_SCHEMA)
    loaded = b.loaded(table.replace_schema_metadata(meta))
    text = b.needs_text
    del b, batches
    # Only prompt text builds the memos and token tree worth a collection: the cycle
    # collector's pass over everything imported costs 0.1 s, a tenth of reading a
    # 12k-request pre-hashed trace (Mooncake) and running `reuse` on it.
    release_freed_memory(collect=text)
    return loaded
