"""Options of an ingest run, the skip summary, and what :func:`open_trace` returns.

Imported where it is used, for start-up time: :mod:`analyzer.reuse.isolation` (it loads
polars, which a run that keeps every tenant's blocks together never needs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.errors import printable, shown
from analyzer.reuse.isolation import isolate
from analyzer.trace import HASH_COLUMNS, BlockTrace

if TYPE_CHECKING:
    from analyzer.ingest.kvrebuild import EngineEvents

HASH_KEYS = ("model", "tenant")
TIME_UNITS = ("auto", "s", "ms", "us", "ns")


@dataclass(frozen=True, slots=True)
class IngestOptions:
    """How to read and hash the inputs; every field has a sensible default.

    ``block_size=None`` means 16 for logs with text, the trace's own block size for
    Mooncake (512) and Bailian (16), and the file's for canonical Parquet.
    """

    block_size: int | None = None
    fmt: str | None = None  # None: detect per file (see detect_format)
    template: str = "chatml"  # chatml | llama3
    tools_position: str = "in-system"  # in-system | after-system | before-system
    tokenizer: str = "cl100k"  # or a path to a Hugging Face tokenizer.json
    token_ratio: float = 1.0  # served-model tokens per counted token (cl100k)
    strict: bool = False
    salt_file: str | Path | None = None  # None: ./.kvpool-salt
    salt: bytes | None = None  # takes precedence over salt_file (library callers, tests)
    # Subset of HASH_KEYS. The model is in the block key by default: engines never share
    # KV across models, so two models' identical prompts are different blocks (a
    # request whose log names no model adds nothing to its key).
    hash_keys: tuple[str, ...] = ("model",)
    time_field: str | None = None  # dotted path in JSON records
    time_unit: str = "auto"
    prompt_column: str | None = None
    time_column: str | None = None
    session_column: str | None = None
    # Where the tenant and the end user are read from, overriding each format's own
    # fields (docs/formats.md): a key or column, or a dotted path into JSON records.
    tenant_field: str | None = None
    user_field: str | None = None
    exact: bool = True  # compute token_lcp_prev with a token radix tree
    # Past this estimated size of the token tree, token_lcp_prev is left null (with a
    # note): the tree holds every distinct token of the log, the one part of a
    # conversion whose memory would otherwise grow with it.
    exact_max_bytes: int = 320 << 20
    image_tokens: int = 765
    # Worker processes (see parallel.py); the CLI's default is every core. A script that
    # asks for more than one must start under ``if __name__ == "__main__":`` (workers are
    # started with multiprocessing's "spawn", which imports the main module again).
    jobs: int = 1
    parallel_min_bytes: int = 32 << 20  # smaller inputs are read in one process
    # Read on a Ray cluster instead (see cluster.py): "auto", "ray://host:10001", a GCS
    # address, or "local" (start one on this machine). None: not on Ray.
    ray_address: str | None = None
    memo: bool = True  # memoize tokenization and prefix hashing (off only to benchmark)
    max_examples: int = 5
    max_previews: int = 200_000
    # Private by default (docs/security.md): prompt-text previews are collected only when
    # asked (--show-previews, --keep-previews), and tenant names, request ids and input
    # file names are stored as salted pseudonyms unless --keep-names.
    previews: bool = False
    keep_names: bool = False


@dataclass(slots=True)
class SkipSummary:
    """Rows skipped, by reason, with the first few ``file:line: reason`` examples."""

    max_examples: int = 5
    total: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, reason: str, file: str, line: int | None, field_name: str | None) -> None:
        self.total += 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if len(self.examples) < self.max_examples:
            where = f"{shown(file)}:{line}" if line is not None else shown(file)
            what = f"{reason} (field '{field_name}')" if field_name else reason
            self.examples.append(f"{where}: {what}")

    def __str__(self) -> str:
        if not self.total:
            return "no rows skipped"
        parts = ", ".join(f"{n} {r}" for r, n in sorted(self.by_reason.items()))
        lines = [f"skipped {self.total} rows: {parts}"]
        lines += [f"  {e}" for e in self.examples]
        # Field names and file names come from the input: no terminal escapes through them.
        return "\n".join(printable(line) for line in lines)


@dataclass(eq=False)
class LoadedTrace:
    """What :func:`open_trace` returns. ``trace`` (the compact :class:`BlockTrace`) is
    built from ``table`` on first access, so a plain conversion never pays for it."""

    table: pa.Table
    skipped: SkipSummary
    sources: list[str]
    formats: list[str] = field(default_factory=list)
    reordered: int = 0  # rows that arrived out of time order in their file (now sorted)
    untimed_files: list[str] = field(default_factory=list)  # spaced 1 s apart in file order
    # One note per file whose epoch timestamps came in several units (each read in its own)
    mixed_unit_files: list[str] = field(default_factory=list)
    # chained hash -> text preview (a plain dict, or ingest's lazily formatted Previews)
    previews: Mapping[int, str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # caveats to show (a bound was hit, ...)
    engine: EngineEvents | None = None  # what KV-event recordings showed of the engine
    # Who may share blocks (analyzer/reuse/isolation.py): the trace and its model parts
    # are keyed by each request's salt group under it.
    isolation: str = "shared"
    _trace: BlockTrace | None = field(default=None, repr=False)
    _parts: dict[str, BlockTrace] = field(default_factory=dict, repr=False)
    # The trace as read, before any keying (``_trace`` itself under ``shared``): a keyed
    # copy takes its model parts from it once the table's block hashes are dropped.
    _read: BlockTrace | None = field(default=None, repr=False)

    @property
    def trace(self) -> BlockTrace:
        if self._trace is None:
            self._trace = self._keyed(self._as_read())
        return self._trace

    def _as_read(self) -> BlockTrace:
        if self._read is None:
            if self.isolation == "shared" and self._trace is not None:
                self._read = self._trace
            else:
                self._read = BlockTrace.from_table(self.table, self.previews or None)
        return self._read

    def _keyed(self, trace: BlockTrace) -> BlockTrace:
        if self.isolation == "shared":
            return trace

        return isolate(trace, self.isolation)

    def isolated(self, policy: str) -> LoadedTrace:
        """This trace as an engine salted under ``policy`` sees it (the same table; its
        trace and model parts keyed by salt group). Keys only a shared trace."""
        assert self.isolation == "shared", "isolate the shared trace, not a keyed one"
        if policy == "shared":
            return self

        keyed = None if self._trace is None else isolate(self._trace, policy)
        return dataclasses.replace(
            self, isolation=policy, _trace=keyed, _parts={}, _read=self._trace
        )

    def model_part(self, model: str) -> BlockTrace:
        """The requests of one model of a multi-model log (its ``model`` column equal to
        ``model``) as the plan replays them, keyed as this trace is, built once (an
        analysis re-read with other settings, the dashboard's what-ifs, reuses it). It
        has no content ids: only the reuse analysis reads them, of :meth:`read_part`
        (8 bytes an access, 95 MB at the 50k long-prompt log's 11.9 M)."""
        if model not in self._parts:
            self._parts[model] = self._keyed(self.read_part(model, content=False))
        return self._parts[model]

    def read_part(self, model: str, *, content: bool = True) -> BlockTrace:
        """The requests of one model as read (not keyed), as :meth:`BlockTrace.from_table`
        builds them from the model's rows: from those rows while the table has its block
        hashes, else taken from the trace (:meth:`BlockTrace.requests`). ``content``:
        with their content ids (when the log has them)."""
        keep = pc.fill_null(pc.equal(self.table.column("model"), model), False)
        if "block_hashes" in self.table.column_names:
            part = BlockTrace.from_table(self.table.filter(keep))
            return part if content else dataclasses.replace(part, content_ids=None)
        rows = self.table.filter(keep)
        # the trace's rows are the table's in a stable sort by arrival
        order = np.argsort(self.table.column("arrival_s").to_numpy(), kind="stable")
        at = np.flatnonzero(keep.to_numpy(zero_copy_only=False)[order])
        lcp = None
        if "token_lcp_prev" in rows.column_names and rows.column("token_lcp_prev").null_count == 0:
            column = self.table.column("token_lcp_prev").to_numpy(zero_copy_only=False)
            lcp = column[order][at].astype(np.int64)
        count_only = bool(rows.num_rows) and bool(pc.all(rows.column("count_only")).as_py())
        return self._as_read().requests(
            at, count_only=count_only, token_lcp_prev=lcp, content=content
        )

    def drop_content_ids(self) -> None:
        """In place: this trace (and the trace as read) without content ids, for the
        owner of a trace whose reuse is measured already and will not be again (only
        the reuse analysis reads them: 8 bytes an access, 95 MB at the 50k long-prompt
        log). Model parts have none (:meth:`model_part`)."""
        if self._trace is not None:
            self._trace = dataclasses.replace(self._trace, content_ids=None)
        if self._read is not None:
            shared = self.isolation == "shared" and self._trace is not None
            self._read = (
                self._trace if shared else dataclasses.replace(self._read, content_ids=None)
            )

    @property
    def parts_without_hashes(self) -> bool:
        """Whether :meth:`read_part` gives the same parts once the block hashes are
        dropped: not when some rows have content hashes and others none (a part could
        have them all, which the trace's content ids, kept only for a whole log, cannot
        tell)."""
        if "content_hashes" not in self.table.column_names:
            return True
        nulls = self.table.column("content_hashes").null_count
        return nulls in (0, self.table.num_rows)

    def drop_block_columns(self) -> None:
        """In place: build the compact :attr:`trace` and drop the table's per-access
        columns (block and content hashes: a log's largest, 16 bytes an access, 1.3 GB
        at a million chat requests), each as soon as its ids are numbered, so the two are
        never held twice. Model parts are then taken from the trace (:meth:`read_part`),
        the same when :attr:`parts_without_hashes`."""
        if self._trace is not None:
            self._as_read()  # a keyed trace's parts come from the trace as read
        table = self.table
        drop = [c for c in HASH_COLUMNS if c in table.column_names]
        self.table = table.drop_columns(drop)
        if self._trace is None:
            hashes = {c: table.column(c) for c in drop}
            del table
            trace = BlockTrace.from_table(self.table, self.previews or None, hashes=hashes)
            self._read = trace
            self._trace = self._keyed(trace)
