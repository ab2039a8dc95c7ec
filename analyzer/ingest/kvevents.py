"""KV-event recordings -> the canonical trace and what the events show of the engine's cache.

The engines' wire format is read by :mod:`analyzer.ingest.kvwire`, recorded by ``kvpool
record`` (:mod:`analyzer.ingest.kvrecord`) into kvpool's recording file
(:mod:`analyzer.ingest.kvfile`), and rebuilt into requests and cache figures by
:mod:`analyzer.ingest.kvrebuild`. :func:`open_recordings` turns recordings into the
canonical trace (each request a chain of stored blocks) and
:class:`~analyzer.ingest.kvrebuild.EngineEvents`, what the events show of the engine's
own cache: its occupancy per medium over time, stores, evictions, clears, and the prefix
hits its requests got.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from analyzer.blocks import id_hashes, load_salt, salt_id
from analyzer.errors import InputError, UsageError, shown
from analyzer.ingest.canonical import coarsen_table
from analyzer.ingest.kvfile import read_recording
from analyzer.ingest.kvrebuild import Rebuilder, rebuild
from analyzer.ingest.options import IngestOptions, LoadedTrace, SkipSummary
from analyzer.ingest.spool import list_array
from analyzer.trace import CANONICAL_SCHEMA, trace_metadata


def canonical_table(rb: Rebuilder, salt: bytes, source: str) -> tuple[pa.Table, dict[str, int]]:
    """The rebuilt requests as a canonical table (docs/schema.md), and what it left out."""
    reqs = rb.requests
    bs = rb.block_size or 16

    def pseudonym(value: str) -> str:
        # as ingest writes every session id: a salted pseudonym, never the value
        d = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8, key=salt)
        return "s-" + d.hexdigest()

    first = reqs[0].arrival if reqs else 0.0
    lengths = np.fromiter((len(r.chain) for r in reqs), dtype=np.int64, count=len(reqs))
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise InputError(
            f"{offsets[-1]:,} blocks do not fit in one canonical file",
            hint="record a shorter window, or convert the recordings one at a time",
        )
    flat = np.fromiter((h for r in reqs for h in r.chain), dtype=np.uint64, count=int(offsets[-1]))
    # The engine's hashes, keyed with the salt as pre-hashed traces' ids are: equal
    # blocks stay equal, and nothing in the file can be matched to the engine's own.
    hashes = id_hashes(b"kv-events", flat.view(np.int64), salt)
    tokens = lengths * bs
    n = len(reqs)

    def strings(values: list[str | None]) -> pa.Array:
        return pa.array(values, type=pa.string())

    cols = {
        "request_id": strings([f"e{r.endpoint}-{i}" for i, r in enumerate(reqs)]),
        "arrival_s": pa.array([r.arrival - first for r in reqs], type=pa.float64()),
        "session_id": strings([pseudonym(r.session) for r in reqs]),
        "tenant": strings([r.model for r in reqs]),
        "model": strings([r.model for r in reqs]),
        "prompt_tokens": pa.array(tokens, type=pa.int64()),
        "output_tokens": pa.nulls(n, pa.int64()),
        "block_hashes": list_array(offsets, hashes),
        "content_hashes": pa.nulls(n, pa.list_(pa.uint64())),
        "token_lcp_prev": pa.nulls(n, pa.int64()),
        "parent_request_id": pa.nulls(n, pa.string()),
        "turn": pa.nulls(n, pa.int64()),
        "count_only": pa.array(np.zeros(n, dtype=bool)),
        "approx_lengths": pa.array([r.prefix_unseen for r in reqs], type=pa.bool_()),
        "cached_tokens": pa.array([r.hit_blocks * bs for r in reqs], type=pa.int64()),
        "engine_prompt_tokens": pa.array(tokens, type=pa.int64()),
    }
    for f in CANONICAL_SCHEMA:  # what the events cannot say (a user, ...): null
        if f.name not in cols:
            assert f.nullable, f"the events give no {f.name}"
            cols[f.name] = pa.nulls(n, f.type)
    meta = trace_metadata(
        block_size=bs,
        tokenizer="",
        template="",
        hash_keys="",
        source=source,
        t0_epoch_s=repr(first) if reqs else "",
        salt_id=salt_id(salt),
    )
    table = pa.Table.from_pydict(cols, schema=CANONICAL_SCHEMA).replace_schema_metadata(meta)
    return table, dict(rb.skipped)


def open_recordings(
    paths: list[str], opts: IngestOptions, block_size: int | None = None
) -> LoadedTrace:
    """KV-event recordings as a :class:`~analyzer.ingest.options.LoadedTrace` (its
    ``engine`` the :class:`~analyzer.ingest.kvrebuild.EngineEvents`); ``block_size`` coarsens the trace to a
    multiple of the engine's blocks."""
    recs = [read_recording(p) for p in paths]
    rb = rebuild(recs)
    salt = opts.salt if opts.salt is not None else load_salt(opts.salt_file)
    source = ",".join(
        f"kv-events:{Path(p).name}" if opts.keep_names else "kv-events" for p in paths
    )
    table, left_out = canonical_table(rb, salt, source)
    engine = rb.figures(recs)
    if not table.num_rows:
        raise InputError(
            "no requests in "
            + ", ".join(map(shown, paths))
            + f": {engine.batches:,} batches, {engine.events:,} events, none a store of the "
            "engine's own (GPU) cache",
            hint="record while the engine serves requests (kvpool record --duration S)",
        )
    fine = engine.block_size
    if block_size is not None and block_size != fine:
        if block_size % fine:
            raise UsageError(
                f"the engine's blocks are {fine} tokens; --block-size {block_size} is not a "
                "multiple of it",
                hint=f"use {fine} or a multiple of it",
            )
        table = coarsen_table(table, block_size // fine)
    # What the wire or the file held that could not be read, and stores left out of
    # the requests, are the recording's skipped "rows" (counted; the engine figures
    # keep them apart under ``malformed``).
    skipped = SkipSummary(max_examples=opts.max_examples)
    for r in recs:
        for reason, n in sorted(r.malformed.items()):
            for _ in range(min(n, opts.max_examples)):
                skipped.add(reason, r.path, None, None)
            skipped.total += n - min(n, opts.max_examples)
            skipped.by_reason[reason] += n - min(n, opts.max_examples)
    for reason, n in sorted(left_out.items()):
        skipped.total += n
        skipped.by_reason[reason] = skipped.by_reason.get(reason, 0) + n
    notes = []
    if engine.requests_prefix_unseen:
        notes.append(
            f"{engine.requests_prefix_unseen:,} requests extend a prefix the engine cached "
            "before the recording began: their prompts count from that prefix's last block "
            "(approx_lengths)"
        )
    if engine.lost_batches:
        notes.append(
            f"{engine.lost_batches:,} event batches were lost in {engine.gaps:,} sequence "
            "gap(s) and not replayed (give --replay to kvpool record): requests and "
            "occupancy miss what they held"
        )
    if not engine.complete:
        notes.append("a recording ends without its trailer (cut short): read up to the cut")
    return LoadedTrace(
        table=table,
        skipped=skipped,
        sources=list(paths),
        formats=["kv-events"] * len(paths),
        notes=notes,
        engine=engine,
    )
