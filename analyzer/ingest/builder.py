"""The ingest builder: one :class:`TraceBuilder` reads a run's input files into the rows of
a canonical trace.

One pass per file, in file order: each row is parsed (:mod:`analyzer.ingest.registry`),
rendered and tokenized (through the part memo), hashed (continuing the memoized chain
state of its longest known prefix) and inserted into a token radix tree; no prompt text
is kept beyond an 80-char preview per message-start block. Per file, the timestamp unit
is resolved at the end (:meth:`TraceBuilder.settle_times`); then all rows of all files
are stably sorted by arrival, out-of-order rows counted, and ``token_lcp_prev`` read off
the radix tree in arrival order (:class:`ArrivalLCP`, :meth:`TraceBuilder.finish`), so
memory holds the canonical output plus the bounded memos and the radix tree (skip it
with ``exact=False`` / ``--no-exact`` on huge logs).

The builder is the one state a read fills, whoever drives it: :mod:`analyzer.ingest.load`
file by file in one process, :mod:`analyzer.ingest.parallel` adopting the pieces worker
processes read with builders of their own, :mod:`analyzer.ingest.cluster` the pieces Ray
actors read. It imports none of them.
"""

from __future__ import annotations

import copy
import hashlib
import os
from array import array
from collections.abc import Iterable, Iterator
from typing import Protocol, cast

import numpy as np
import pyarrow as pa

from analyzer import limits
from analyzer.blocks import BlockHasher, id_hashes, load_salt, salt_id
from analyzer.cache.token_radix import ArrivalLCP
from analyzer.errors import InputError, Location, UsageError, shown
from analyzer.heap import release_freed_memory as release_freed_memory
from analyzer.ingest.detect import PRODUCT_FORMATS, Format
from analyzer.ingest.fields import (
    NATIVE_BLOCK,
    NATIVE_UNIT,
    FileContext,
    Raw,
    Record,
    RowError,
    RunState,
    named_field,
)
from analyzer.ingest.options import IngestOptions, LoadedTrace, SkipSummary
from analyzer.ingest.registry import PARSERS, records
from analyzer.ingest.spool import RowSpool, sorted_unique
from analyzer.ingest.timeparse import ABSOLUTE_MIN_S, numeric_seconds, timestamp_outliers
from analyzer.ingest.vector import BULK, read_bulk
from analyzer.jsontypes import JSONObject
from analyzer.progress import Advance
from analyzer.tokenize import Part, Previews, PromptRenderer, RenderError, load_tokenizer
from analyzer.tokenize.template import ChatTemplateRenderer, is_model_folder, load_model_folder
from analyzer.trace import CANONICAL_SCHEMA
from analyzer.trace import trace_metadata as make_metadata

TEXT_FORMATS = {
    *PRODUCT_FORMATS,
    Format.OPENAI,
    Format.OPENAI_BATCH,
    Format.GATEWAY_CSV,
    Format.GATEWAY_PARQUET,
    Format.GENERIC_CSV,
    Format.GENERIC_JSONL,
    Format.GENERIC_PARQUET,
}
UNTIMED_SPACING_S = 1.0
# The memos' bounds, shared by the processes reading at once (``--jobs``), so their
# memory does not grow with the cores. At a sixteenth of the bounds this replaced (16M
# tokens and 4M hashes a process, 200 MiB of each process at 50,000 requests) a
# 50,000-request chat log tokenized 13 more of 84,933 parts and hashed the same
# blocks; 10k agent and RAG logs, at an eighth, under 0.1% more work: repeats sit close
# together in a log, and a prompt repeated far apart stays in the LRU by its repeats.
MEMO_TOKENS = 4_000_000
MEMO_HASHES = 1_000_000


class PrefixTree(Protocol):
    """What the builder asks of its token tree: :class:`ArrivalLCP` in the process that
    writes the trace, a recorder of the same calls in a ``--jobs`` worker
    (:class:`~analyzer.ingest.parallel.LcpRecorder`). Nodes are int handles, 0 the root."""

    def __len__(self) -> int: ...
    def memory_bytes(self) -> int: ...
    def extend(self, at: int | None, tokens: np.ndarray) -> int: ...
    def end(self, node: int) -> int: ...
    def add(self, tokens: np.ndarray) -> int: ...


class TraceBuilder:
    """The rows of one run's inputs, read, hashed and spooled, and the run's counts.

    Build one per run with the input ``paths``, their resolved ``fmts`` and the
    ``opts``; ``advance(n)`` hears the input bytes read. :meth:`read_file` reads a file
    whole; a driver reading a file in pieces calls :meth:`read_rows` (or
    :meth:`bulk_rows`) per piece and :meth:`settle_times` once the file's last piece is
    in. :meth:`finish` gives the canonical file's metadata and its rows in arrival
    order; :meth:`loaded` the :class:`LoadedTrace` around them. ``processes`` is how
    many builders read at once (``--jobs``), which share the memos' bounds.

    What a driver reads or fills: ``rows`` (the spool), ``skipped``, ``previews``,
    ``notes``, ``lcp`` (the token tree, None once dropped or not computed),
    ``request_id_hashes`` (8 bytes a row with a request id of its own), ``piece_stats``
    (what worker builders counted) and ``exact_wanted`` (in a worker: record the tree's
    operations).
    """

    def __init__(
        self,
        paths: list[str],
        fmts: list[str],
        opts: IngestOptions,
        advance: Advance | None,
        processes: int = 1,
    ) -> None:
        self.paths, self.fmts, self.opts = paths, fmts, opts
        self.advance = advance
        self.skipped = SkipSummary(max_examples=opts.max_examples)
        self.block_size = self._block_size()
        self.salt = opts.salt if opts.salt is not None else load_salt(opts.salt_file)
        self.hasher = BlockHasher(
            self.block_size, self.salt, opts.token_ratio, memo_max_hashes=MEMO_HASHES // processes
        )
        self.needs_text = any(f in TEXT_FORMATS for f in fmts)
        self.renderer: PromptRenderer | ChatTemplateRenderer | None = None
        if self.needs_text:
            if is_model_folder(opts.tokenizer):  # the served model's own chat template
                self.renderer = ChatTemplateRenderer(load_model_folder(opts.tokenizer))
            else:
                self.renderer = PromptRenderer(
                    load_tokenizer(opts.tokenizer),
                    opts.template,
                    opts.tools_position,
                    opts.image_tokens,
                    memo_max_tokens=MEMO_TOKENS // processes,
                    memo=opts.memo,
                )
        has_content = any(f in TEXT_FORMATS or f == Format.RAGPULSE for f in fmts)
        # Room for the bound's tokens reserved: a tree near its bound never grows by a copy.
        reserve = opts.exact_max_bytes // 4
        # The token tree holds every tenant's prompts in one tree: under the tenant hash key
        # its prefix lengths would be shared across tenants while the blocks are not.
        per_tenant = "tenant" in opts.hash_keys
        self.lcp: PrefixTree | None = (
            ArrivalLCP(reserve) if opts.exact and has_content and not per_tenant else None
        )
        self.rows = RowSpool()
        self.notes: list[str] = []
        if opts.exact and has_content and per_tenant:
            self.notes.append(
                "token-exact prefix lengths not computed under --hash-key tenant (they are "
                "measured across tenants); reuse figures use the block-level ceilings"
            )
        # 8 bytes per row with a request id of its own, to count duplicates at the end.
        self.request_id_hashes = array("Q")
        self.piece_stats: tuple[int, int, int, int] = (
            0,
            0,
            0,
            0,
        )  # what parallel workers counted (see parallel.py)
        self.exact_wanted = False  # in a worker: record the tree's operations
        self.previews = Previews()
        self.shared = RunState(inputs=tuple(zip(paths, fmts, strict=True)))  # the readers'
        self.file_abs: list[tuple[str, bool]] = []  # (file, absolute times?) per file read
        self.reordered = 0
        self.untimed: list[str] = []
        self.mixed_units: list[str] = []
        self.dropped: list[int] = []  # rows (in input order) whose timestamp is an outlier
        self._sessions: dict[tuple[str, str], str] = {}

    def _block_size(self) -> int:
        natives = {NATIVE_BLOCK[f] for f in self.fmts if f in NATIVE_BLOCK}
        bs = self.opts.block_size
        if bs is None:
            if len(natives) > 1:
                raise UsageError(
                    "inputs have different native block sizes "
                    f"({', '.join(map(str, sorted(natives)))}); pass --block-size"
                )
            return natives.pop() if natives else 16
        for n in natives:
            if bs % n:
                raise UsageError(
                    f"--block-size {bs} is not a multiple of the trace's own {n}-token blocks",
                    hint=f"use {n} or a multiple of it",
                )
        return bs

    # -- per row ------------------------------------------------------------------------

    def _extra(self, raw: Raw) -> bytes:
        if not self.opts.hash_keys:
            return b""
        parts = []
        v: str | None
        for k in self.opts.hash_keys:
            if k == "model":
                if raw.model is None:  # unknown: nothing to keep apart
                    continue
                v = raw.model
            else:
                v = raw.tenant or raw.model
            parts.append(f"{k}={v or ''}")
        return ("\x00".join(parts)).encode("utf-8", "surrogatepass")

    def _hash_content(self, raw: Raw) -> tuple[int, np.ndarray, np.ndarray, int]:
        """(prompt tokens served, chained hashes, content hashes, lcp index or -1)."""
        hasher, extra, lcp = self.hasher, self._extra(raw), self.lcp
        if raw.tokens is not None:
            st = hasher.hash_tokens(raw.tokens, extra)
            idx = lcp.add(raw.tokens) if lcp is not None else -1
            return hasher.served_tokens(st.n_tokens), st.hashes, st.contents, idx
        assert self.renderer is not None
        if raw.body is not None:
            parts, gen = self.renderer.render(raw.body)
        else:
            assert raw.text is not None
            parts, gen = self.renderer.render_text(raw.text), []
        if not self.opts.memo:
            return self._hash_parts_in_full(parts, gen, extra)
        # Prefix keys name "parts 0..i under these hash keys" by the parts' content digests
        # (an in-memory memo key, never persisted). The memo holds the chain state after
        # the first parts (system prompt) and after all messages of each request, each
        # with the radix node where that prefix ends: only new tokens are hashed and
        # inserted.
        ks = tuple(p.key for p in parts)
        state, start = None, 0
        for i in range(len(ks), 0, -1):
            state = hasher.recall((extra, ks[:i]))
            if state is not None:
                start = i
                break
        if state is None:
            state = hasher.empty()
        node = cast("int | None", state.anchor)  # the tree's node, or None (no tree)
        start_tokens = state.n_tokens  # counted tokens of parts[:start]
        last = len(parts) - 1
        j = start
        while j <= last and j <= 1:  # the system prompt's state is shared across sessions
            tokens = parts[j].tokens
            if lcp is not None:
                node = lcp.extend(node, tokens)
            state = hasher.extend(state, tokens, extra).at(node)
            hasher.remember((extra, ks[: j + 1]), state)
            j += 1
        gen_tokens = _joined([g.tokens for g in gen])
        if j <= last:  # this turn's new messages and the generation prompt, in one pass
            head = _joined([p.tokens for p in parts[j:]])
            mid, state = hasher.extend_split(state, head, gen_tokens, extra)
            if lcp is not None:
                node = lcp.extend(node, head)
            hasher.remember((extra, ks), mid.at(node))
        elif gen_tokens.size:
            state = hasher.extend(state, gen_tokens, extra)
        idx = -1
        if lcp is not None:
            idx = lcp.end(lcp.extend(node, gen_tokens))
        self._take_previews(parts, start, start_tokens, state.hashes)
        return hasher.served_tokens(state.n_tokens), state.hashes, state.contents, idx

    def _hash_parts_in_full(
        self, parts: list[Part], gen: list[Part], extra: bytes
    ) -> tuple[int, np.ndarray, np.ndarray, int]:
        """``_hash_content`` with the memos off: every token hashed and inserted."""
        tokens = _joined([p.tokens for p in parts] + [g.tokens for g in gen])
        state = self.hasher.extend(self.hasher.empty(), tokens, extra)
        idx = self.lcp.add(tokens) if self.lcp is not None else -1
        self._take_previews(parts, 0, 0, state.hashes)
        return self.hasher.served_tokens(state.n_tokens), state.hashes, state.contents, idx

    def _take_previews(self, parts: list[Part], start: int, pos: int, hashes: np.ndarray) -> None:
        """A preview per message-start block of ``parts[start:]`` (starting at token ``pos``).

        Parts of a recalled prefix had their previews taken when first hashed.
        """
        if not self.opts.previews or len(self.previews) >= self.opts.max_previews:
            return
        for p in parts[start:]:
            if p.role is not None:
                k = self.hasher.served_tokens(pos) // self.block_size
                if k < hashes.size:
                    h = int(hashes[k])
                    if h not in self.previews:
                        self.previews.put(h, p.role, p.text)
            pos += p.tokens.size

    def _add(self, raw: Raw, ctx: FileContext, line: int, t: float) -> None:
        # One row claiming 10^12 tokens would keep the replay's prefill loop busy for hours;
        # 10^9 cached tokens would be a measured hit rate of millions of percent.
        for field, name, value in (
            ("prompt_tokens", "prompt_tokens", raw.prompt_tokens),
            ("output_tokens", "output_tokens", raw.output_tokens),
            ("usage.prompt_tokens_details.cached_tokens", "cached_tokens", raw.cached_tokens),
            ("usage.prompt_tokens", "prompt_tokens", raw.engine_prompt_tokens),
        ):
            if value is not None and (why := limits.reason(value, name)):
                raise RowError(why, field)
        contents: np.ndarray | None = None
        idx = -1
        approx = raw.approx or (self.hasher.ratio != 1 and raw.block_ids is None)
        if raw.count_only:
            assert raw.prompt_tokens is not None
            n_prompt, hashes = raw.prompt_tokens, np.empty(0, dtype=np.uint64)
            approx = raw.approx
        elif raw.block_ids is not None:
            assert raw.prompt_tokens is not None
            native = NATIVE_BLOCK[ctx.fmt]
            m = self.block_size // native
            n_blocks = raw.prompt_tokens // self.block_size
            ns = ctx.fmt.encode() + self._extra(raw)
            ids = np.asarray(raw.block_ids[m - 1 : m * n_blocks : m], dtype=np.int64)
            hashes = id_hashes(ns, ids, self.salt)
            n_prompt = raw.prompt_tokens
        else:
            n_prompt, hashes, contents, idx = self._hash_content(raw)
        out = raw.output_tokens
        if out is None and raw.output_text is not None and self.renderer is not None:
            out = self.hasher.served_tokens(int(self.renderer.tok.encode(raw.output_text).size))
        rid = raw.request_id or f"{ctx.name}:{line}"
        if raw.request_id:
            self._count_id(rid)
        named = self.opts.keep_names
        tenant = raw.tenant or raw.model
        self.rows.append(
            request_id=rid if named else self._pseudonym(rid, "r-") or rid,
            time=t,
            session=self._pseudonym(raw.session),
            tenant=tenant if named or tenant == raw.model else self._pseudonym(tenant, "t-"),
            model=raw.model,
            prompt_tokens=int(n_prompt),
            output_tokens=out,
            hashes=hashes,
            contents=contents,
            lcp_index=idx,
            parent=raw.parent if named else self._pseudonym(raw.parent, "r-"),
            turn=raw.turn,
            count_only=raw.count_only,
            approx=bool(approx),
            cached_tokens=raw.cached_tokens,
            engine_prompt_tokens=raw.engine_prompt_tokens,
            user=raw.user if named else self._pseudonym(raw.user, "u-"),
        )
        if self.lcp is not None and self.lcp.memory_bytes() > self.opts.exact_max_bytes:
            self.drop_exact()

    def drop_exact(self, after_rows: int | None = None) -> None:
        """The token tree outgrew its bound: token-exact LCPs are not computed (see notes)."""
        assert self.lcp is not None
        n = len(self.rows) if after_rows is None else after_rows
        self.notes.append(
            f"token-exact prefix lengths not computed: the token tree passed "
            f"{self.opts.exact_max_bytes / 2**20:,.0f} MiB after {n:,} requests "
            "(--exact-max-mib); reuse figures use the block-level ceilings"
        )
        self.lcp = None
        self.hasher.forget()  # the memo's states hold tree nodes (their anchors)
        release_freed_memory()  # the tree held up to the bound: return it now, not at exit

    def _count_id(self, request_id: str) -> None:
        """Keep 8 bytes of a row's own request id, to count duplicates at the end."""
        h = hashlib.blake2b(request_id.encode("utf-8", "surrogatepass"), digest_size=8)
        self.request_id_hashes.append(int.from_bytes(h.digest(), "little"))

    def _pseudonym(self, value: str | None, prefix: str = "s-") -> str | None:
        """Session ids (often user names or emails) leave only as salted pseudonyms, and so
        do tenant names and request ids unless ``keep_names``: the same value gives the
        same pseudonym under the same salt, so sessions, tenants and parent links still
        group and join, but nothing in the file names a customer."""
        if value is None:
            return None
        # Sessions hash the bare value (as they always have); the others are namespaced.
        key = value if prefix == "s-" else prefix + value
        hit = self._sessions.get((prefix, value))
        if hit is None:
            if len(self._sessions) >= 200_000:  # a cache of a pure function: bound it
                self._sessions.clear()
            d = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8, key=self.salt)
            hit = prefix + d.hexdigest()
            self._sessions[(prefix, value)] = hit
        return hit

    def _bad(self, err: RowError, ctx: FileContext, line: int) -> None:
        if self.opts.strict:
            raise InputError(err.reason, Location(ctx.path, line, err.field))
        self.skipped.add(err.reason, ctx.path, line, err.field)

    # -- per file -----------------------------------------------------------------------

    def read_file(self, path: str, fmt: str) -> None:
        ctx = FileContext(path, fmt, self.opts, shared=self.shared)
        first = len(self.rows)
        if (bulk := self.bulk_rows(path, fmt)) is not None:
            self.settle_times(path, fmt, True, first, *bulk)
            return
        iso, lines = self.read_rows(ctx, records(path, fmt, self.advance))
        self.settle_times(
            path, fmt, ctx.timed, first, np.asarray(iso, dtype=bool), np.asarray(lines, np.int64)
        )

    def bulk_rows(self, path: str, fmt: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The file's rows appended, read in columns where it can be, with (whether each
        row's time was an ISO string, its line), or None: nothing appended, read it by
        line."""
        opts = self.opts
        if fmt not in BULK or opts.time_field or opts.time_column or opts.tenant_field:
            return None
        first = len(self.rows)
        iso = self._read_bulk(path, fmt)
        if iso is None:
            return None
        n = len(self.rows) - first
        line1 = 2 if fmt == Format.AZURE else 1  # below a CSV's header
        return np.full(n, iso, bool), np.arange(line1, n + line1, dtype=np.int64)

    def _read_bulk(self, path: str, fmt: str) -> bool | None:
        """A clean public trace, read whole (:mod:`analyzer.ingest.vector`): whether its
        times are ISO strings, or None when the line reader must read it."""
        if fmt == Format.BAILIAN and set(self.opts.hash_keys) - {"model"}:
            return None  # keyed by each row's tenant: the line reader's namespaces
        roots = self.shared.bailian_roots if fmt == Format.BAILIAN else None
        ns = fmt.encode() + self._extra(Raw())
        got = read_bulk(path, fmt, self.block_size, self.salt, ns, roots)
        if got is None:
            return None
        table = got.table
        if got.own_ids:  # counted for duplicates, as _add counts them
            for r in table.column("request_id").to_pylist():
                self._count_id(r)
        # Sessions always leave as pseudonyms; the rest unless keep_names (as in _add).
        named = self.opts.keep_names
        for i, name, prefix in (
            (0, "request_id", "r-"),
            (1, "session_id", "s-"),
            (2, "tenant", "t-"),
            (8, "parent_request_id", "r-"),
            (14, "user_id", "u-"),
        ):
            col = table.column(i)
            if col.null_count == len(col) or (named and prefix != "s-"):
                continue
            values = [self._pseudonym(v, prefix) for v in col.to_pylist()]
            table = table.set_column(i, name, pa.array(values, type=pa.string()))
        self.rows.append_table(table, got.times)
        if self.advance is not None:
            self.advance(os.path.getsize(path))
        return got.iso

    def first_timing(self, path: str, fmt: str) -> tuple[int | None, bool | None, str | None]:
        """(line of the file's first kept row, whether the file is timed, its time field),
        read from the top with nothing kept (a scratch builder sharing only the
        tokenizer memo, which is a pure cache)."""
        scratch = copy.copy(self)
        scratch.rows, scratch.lcp, scratch.notes = RowSpool(), None, []
        scratch.request_id_hashes = array("Q")
        scratch.skipped = SkipSummary(max_examples=0)
        scratch.previews = Previews()
        scratch.hasher = BlockHasher(self.block_size, self.salt, self.opts.token_ratio)
        ctx = FileContext(path, fmt, self.opts, shared=RunState())
        try:
            _, lines = scratch.read_rows(ctx, records(path, fmt, None), first_only=True)
        finally:
            scratch.rows.close()
        return (lines[0] if lines else None), ctx.timed, ctx.time_name

    def read_rows(
        self, ctx: FileContext, recs: Iterable[Record], first_only: bool = False
    ) -> tuple[bytearray, array[int]]:
        """Rows of ``recs`` added; returns (per kept row: ISO time?, per kept row: its
        line). ``first_only`` stops after the first kept row (a file's timing)."""
        parse = PARSERS[ctx.fmt]
        named = self.opts.tenant_field is not None or self.opts.user_field is not None
        # Held for every row of the file or piece: 9 bytes a row here, where lists of
        # Python ints and bools took 48.
        iso_flags = bytearray()
        lines = array("q")  # the line of each row added from this file
        seq = 0
        for line, rec in recs:
            if isinstance(rec, RowError):
                self._bad(rec, ctx, line)
                if rec.fatal:
                    break
                continue
            timed = ctx.timed  # a skipped row must not decide whether the file has times
            try:
                raw = parse(rec, ctx)
                if named:
                    self._named_fields(raw, rec)
                if ctx.timed is False:
                    t, iso = seq * UNTIMED_SPACING_S, False
                else:
                    assert raw.time is not None
                    t, iso = raw.time, raw.time_iso
                self._add(raw, ctx, line, t)
                lines.append(line)
            except (RowError, RenderError, RecursionError) as err:
                ctx.timed = timed
                if isinstance(err, RenderError):
                    err = RowError(err.reason, err.field)
                elif isinstance(err, RecursionError):
                    err = RowError("JSON nested too deeply")
                self._bad(err, ctx, line)
                continue
            iso_flags.append(iso)
            seq += 1
            if first_only:
                break
        return iso_flags, lines

    def _named_fields(self, raw: Raw, rec: JSONObject) -> None:
        """The tenant and user from the fields ``--tenant-field`` / ``--user-field`` name
        (a row without the field has none: the model stands in for its tenant)."""
        if self.opts.tenant_field is not None:
            raw.tenant = named_field(rec, self.opts.tenant_field)
        if self.opts.user_field is not None:
            raw.user = named_field(rec, self.opts.user_field)

    def settle_times(
        self,
        path: str,
        fmt: str,
        timed: bool | None,
        first: int,
        iso: np.ndarray,
        lines: np.ndarray,
    ) -> None:
        """Times of the file's rows ``first:`` in seconds, once the whole file is read:
        outliers dropped, the numeric unit resolved on all of them, then absolute vs
        relative. ``lines`` holds each of those rows' line in the file."""
        ctx = FileContext(path, fmt, self.opts)
        last = len(self.rows)
        if last == first:
            return
        times = np.frombuffer(self.rows.time, dtype=np.float64)[first:last].copy()
        if timed is False:
            self.untimed.append(path)
            absolute = False
            times = np.arange(last - first, dtype=np.float64) * UNTIMED_SPACING_S
        else:
            forced = None if self.opts.time_unit == "auto" else self.opts.time_unit
            forced = forced or NATIVE_UNIT.get(fmt)
            numeric = ~iso
            # Outliers first (in the file's raw numbers, then among ISO times): one value
            # of 0 or 1e308 must neither pick the unit nor stretch the trace's span.
            out = np.zeros(times.size, dtype=bool)
            out[numeric] = timestamp_outliers(times[numeric])
            out[iso] = timestamp_outliers(times[iso])
            for i in np.flatnonzero(out):
                self._bad(
                    RowError("timestamp far outside the file's others (outlier)", "timestamp"),
                    ctx,
                    int(lines[i]),
                )
                self.dropped.append(first + int(i))
            numeric &= ~out
            if numeric.any():
                times[numeric], units = numeric_seconds(times[numeric], forced)
                if len(units) > 1:
                    self.mixed_units.append(_units_note(path, units))
            times[out] = np.nan  # dropped in finish(); NaN keeps them out of min/max here
            kept = times[~out]
            absolute = bool(kept.min() >= ABSOLUTE_MIN_S)
        self.rows.time[first:last] = array("d", times.tobytes())
        # Out of order: a row earlier than the row before it in its file.
        kept = times[~np.isnan(times)]
        self.reordered += int(np.count_nonzero(kept[1:] < kept[:-1]))
        self.file_abs.append((path, absolute))

    # -- assembling ---------------------------------------------------------------------

    def finish(self) -> tuple[dict[bytes, bytes], Iterator[pa.RecordBatch]]:
        """The canonical file's metadata, and its rows in arrival order, a batch at a time."""
        rows = self.rows
        n = len(rows)
        if self.request_id_hashes:
            ids = np.frombuffer(self.request_id_hashes, dtype=np.uint64)
            dup = int(ids.size - sorted_unique(ids).size)
            if dup:
                self.notes.append(
                    f"duplicate request ids: {dup:,} rows repeat an earlier row's id "
                    "(all kept; a log written twice, or retries, would count double)"
                )
        times = np.frombuffer(rows.time, dtype=np.float64)
        if len({a for _, a in self.file_abs}) > 1:
            kinds = [f"{shown(p)} ({'absolute' if a else 'relative'})" for p, a in self.file_abs]
            raise InputError(
                "cannot merge files with absolute and relative timestamps: " + ", ".join(kinds)
            )
        # Outlier rows have NaN times: they sort last (after every kept row, so they take
        # no part in the token LCP of the others) and are cut off the table at the end.
        n_kept = n - len(self.dropped)
        t0 = float(np.nanmin(times))
        absolute = bool(self.file_abs and self.file_abs[0][1])
        order = np.lexsort((np.arange(n), times))
        arrival = times[order] - t0
        lcp_sorted: np.ndarray | None = None
        has_sorted: np.ndarray | None = None
        if isinstance(self.lcp, ArrivalLCP) and len(self.lcp):
            lcp_idx = np.frombuffer(rows.lcp_index, dtype=np.int64)
            has = lcp_idx >= 0
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n)
            sub_rank = np.empty(len(self.lcp), dtype=np.int64)
            sub_rank[lcp_idx[has]] = rank[has]
            lcp_by_idx = self.lcp.finish(sub_rank)
            self.lcp = None  # the tree is not needed past this point
            vals = np.zeros(n, dtype=np.int64)
            vals[has] = lcp_by_idx[lcp_idx[has]]
            served = (vals * self.hasher.ratio.numerator) // self.hasher.ratio.denominator
            prompt = np.frombuffer(rows.prompt_tokens, dtype=np.int64)
            lcp_sorted = np.minimum(served, prompt)[order][:n_kept]
            has_sorted = has[order][:n_kept]
        order, arrival = order[:n_kept], arrival[:n_kept]
        opts = self.opts
        tok_name = self.renderer.tok.name if self.renderer is not None else ""
        if opts.token_ratio != 1 and tok_name:
            tok_name += f"*{opts.token_ratio:g}"
        meta = make_metadata(
            block_size=self.block_size,
            tokenizer=tok_name,
            template=self.renderer.template if self.renderer is not None else "",
            hash_keys=",".join(opts.hash_keys),
            source=",".join(
                f"{f}:{os.path.basename(p)}" if opts.keep_names else f
                for p, f in zip(self.paths, self.fmts, strict=True)
            ),
            t0_epoch_s=repr(t0) if absolute else "",
            salt_id=salt_id(self.salt),
        )

        def batches() -> Iterator[pa.RecordBatch]:
            a = 0
            for part in rows.batches(order):
                b = a + part.num_rows
                if lcp_sorted is not None and has_sorted is not None:
                    lcp = pa.array(lcp_sorted[a:b], type=pa.int64(), mask=~has_sorted[a:b])
                else:
                    lcp = pa.nulls(b - a, type=pa.int64())
                cols = {name: part.column(name) for name in part.schema.names}
                cols["arrival_s"] = pa.array(arrival[a:b], pa.float64())
                cols["token_lcp_prev"] = lcp
                yield pa.RecordBatch.from_arrays(
                    [cols[f.name] for f in CANONICAL_SCHEMA], schema=CANONICAL_SCHEMA
                )
                a = b
            rows.close()

        return meta, batches()

    def loaded(self, table: pa.Table | None) -> LoadedTrace:
        """The :class:`LoadedTrace` of this read around ``table`` (None: an empty table,
        the rows having gone to a file), with its skips, notes, previews and counts."""
        stats = {}
        w = self.piece_stats
        if self.renderer is not None:
            stats = {
                "parts_seen": self.renderer.parts_seen + w[0],
                "parts_tokenized": self.renderer.parts_tokenized + w[1],
                "tokens_encoded": self.renderer.tokens_encoded + w[2],
            }
        stats["blocks_hashed"] = self.hasher.blocks_hashed + w[3]
        return LoadedTrace(
            table=table if table is not None else CANONICAL_SCHEMA.empty_table(),
            skipped=self.skipped,
            sources=self.paths,
            formats=self.fmts,
            reordered=self.reordered,
            untimed_files=self.untimed,
            mixed_unit_files=self.mixed_units,
            previews=self.previews,
            stats=stats,
            notes=self.notes,
        )


def _units_note(path: str, units: dict[str, int]) -> str:
    """``f.jsonl: timestamps in s (4,880) and ms (120), each read in its own unit``."""
    order = sorted(units.items(), key=lambda kv: -kv[1])
    listed = " and ".join(f"{u} ({n:,})" for u, n in order)
    return f"{shown(path)}: timestamps in {listed}, each read in its own unit"


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """Token arrays end to end (no copy for one)."""
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=np.uint32)
