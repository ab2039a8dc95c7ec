"""``open_trace``: any supported input (or a canonical Parquet) -> a canonical trace.

One pass per file, in file order: each row is parsed, rendered and tokenized (through
the part memo), hashed (continuing the memoized chain state of its longest known
prefix) and inserted into a token radix tree; no prompt text is kept beyond an 80-char
preview per message-start block. Per file, the timestamp unit is resolved at the end;
then all rows of all files are stably sorted by arrival, out-of-order rows counted, and
``token_lcp_prev`` read off the radix tree in arrival order (:class:`ArrivalLCP`), so
memory holds the canonical output plus the bounded memos and the radix tree (skip it
with ``exact=False`` / ``--no-exact`` on huge logs).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer import limits
from analyzer.blocks import BlockHasher, id_hashes, load_salt, salt_id
from analyzer.cache.token_radix import ArrivalLCP
from analyzer.errors import InputError, Location, UsageError, shown
from analyzer.ingest.detect import (
    FORMATS,
    PRODUCT_FORMATS,
    Format,
    resolve_format,
    unknown_format,
)
from analyzer.ingest.io import check_readable
from analyzer.ingest.options import HASH_KEYS, TIME_UNITS, IngestOptions, LoadedTrace, SkipSummary
from analyzer.ingest.readers import (
    NATIVE_BLOCK,
    NATIVE_UNIT,
    PARSERS,
    FileContext,
    Raw,
    RowError,
    named_field,
    records,
)
from analyzer.ingest.spool import DistinctCounter, RowSpool, list_array, sorted_unique
from analyzer.ingest.timeparse import ABSOLUTE_MIN_S, numeric_seconds, timestamp_outliers
from analyzer.ingest.vector import BULK, read_bulk
from analyzer.progress import Advance
from analyzer.tokenize import Part, Previews, RenderError
from analyzer.trace import (
    CANONICAL_SCHEMA,
    WindowedWriter,
    coarse_positions,
    read_canonical,
    read_metadata,
    write_canonical,
)
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


def previews_path(out: str | Path) -> Path:
    """Where ``--keep-previews`` writes the preview sidecar of canonical file ``out``."""
    p = Path(out)
    return p.with_name(p.stem + ".previews.parquet")


def _validate(opts: IngestOptions) -> None:
    from analyzer.tokenize import TEMPLATES, TOOLS_POSITIONS

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


class _Builder:
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
            from analyzer.tokenize import PromptRenderer, load_tokenizer
            from analyzer.tokenize.template import (
                ChatTemplateRenderer,
                is_model_folder,
                load_model_folder,
            )

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
        self.lcp = ArrivalLCP(reserve) if opts.exact and has_content and not per_tenant else None
        self.rows = RowSpool()
        self.notes: list[str] = []
        if opts.exact and has_content and per_tenant:
            self.notes.append(
                "token-exact prefix lengths not computed under --hash-key tenant (they are "
                "measured across tenants); reuse figures use the block-level ceilings"
            )
        # 8 bytes per row with a request id of its own, to count duplicates at the end.
        self._id_hashes = array("Q")
        self.piece_stats = (0, 0, 0, 0)  # what parallel workers counted (see parallel.py)
        self.exact_wanted = False  # in a worker: record the tree's operations
        self.previews = Previews()
        # Per-run state of the readers; "inputs": a Langfuse observation whose session
        # is on its trace's row looks in every Langfuse input for it.
        self.shared: dict[str, Any] = {"inputs": tuple(zip(paths, fmts, strict=True))}
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
        node: Any = state.anchor
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
            self._drop_exact()

    def _drop_exact(self, after_rows: int | None = None) -> None:
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
        self._id_hashes.append(int.from_bytes(h.digest(), "little"))

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
        roots = self.shared.setdefault("bailian_roots", {}) if fmt == Format.BAILIAN else None
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
        scratch._id_hashes = array("Q")
        scratch.skipped = SkipSummary(max_examples=0)
        scratch.previews = Previews()
        scratch.hasher = BlockHasher(self.block_size, self.salt, self.opts.token_ratio)
        ctx = FileContext(path, fmt, self.opts, shared={})
        try:
            _, lines = scratch.read_rows(ctx, records(path, fmt, None), first_only=True)
        finally:
            scratch.rows.close()
        return (lines[0] if lines else None), ctx.timed, ctx.time_name

    def read_rows(self, ctx: FileContext, recs, first_only: bool = False):  # type: ignore[no-untyped-def]
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

    def _named_fields(self, raw: Raw, rec: dict[str, Any]) -> None:
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
        if self._id_hashes:
            ids = np.frombuffer(self._id_hashes, dtype=np.uint64)
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
        if self.lcp is not None and len(self.lcp):
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


def _list_array(offsets: np.ndarray, flat: np.ndarray, mask=None) -> pa.Array:  # type: ignore[no-untyped-def]
    if offsets[-1] >= 2**31:
        raise InputError(
            f"{offsets[-1]:,} blocks do not fit in one canonical file",
            hint="convert the log in parts, or with a larger --block-size",
        )
    return list_array(offsets, flat, mask)


def _read_previews(path: Path) -> dict[int, str]:
    side = previews_path(path)
    if not side.exists():
        return {}
    import pyarrow.parquet as pq

    try:
        t = pq.read_table(side)
        return dict(
            zip(
                (int(h) for h in t.column("block_hash").to_pylist()),
                t.column("preview").to_pylist(),
                strict=True,
            )
        )
    except (OSError, pa.ArrowInvalid, KeyError):
        return {}


def coarsen_table(table: pa.Table, factor: int) -> pa.Table:
    """The canonical table at ``factor`` times its block size, from chained hashes alone.

    Coarse block ``j`` is the fine hash at position ``factor * j + factor - 1`` (it names
    the whole prefix). Content hashes cannot be derived without the tokens: null.
    """
    meta = read_metadata(table)
    fine = int(meta.get("block_size") or 16)
    col = table.column("block_hashes").combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    flat = col.values.to_numpy(zero_copy_only=False)
    new_off, fine_pos = coarse_positions(offsets, factor)
    coarse = flat[fine_pos]
    i = table.column_names.index("block_hashes")
    table = table.set_column(i, "block_hashes", _list_array(new_off, coarse))
    j = table.column_names.index("content_hashes")
    table = table.set_column(j, "content_hashes", pa.nulls(table.num_rows, pa.list_(pa.uint64())))
    new_meta = {**meta, "block_size": str(fine * factor)}
    new_meta.pop("schema_version", None)
    return table.cast(CANONICAL_SCHEMA).replace_schema_metadata(make_metadata(**new_meta))


# Metadata that decides what a block hash means: files that differ in one of these can
# never share a block, so merging them would report no reuse between them, wrongly.
# (key, what it is, whether an empty value is compatible with any: pre-hashed traces
# have no tokenizer or template; files from before salt ids have none).
_HASHING_KEYS = (
    ("salt_id", "salts", True),
    ("tokenizer", "tokenizers", True),
    ("template", "chat templates", True),
    ("hash_keys", "hash keys", False),
)


def _check_same_hashing(paths: list[str], metas: list[dict[str, str]]) -> None:
    for key, what, empty_ok in _HASHING_KEYS:
        seen = {(m.get(key) or "") for m in metas}
        if empty_ok:
            seen.discard("")
        if len(seen) > 1:
            raise InputError(
                f"canonical traces converted with different {what} cannot be merged (their "
                "blocks could never match): "
                + ", ".join(
                    f"{p} ({m.get(key) or 'none'})" for p, m in zip(paths, metas, strict=True)
                ),
                hint="convert the raw logs again with the same salt file and flags",
            )


def _open_canonical(
    paths: list[str], block_size: int | None = None, previews_wanted: bool = False
) -> LoadedTrace:
    tables = [read_canonical(p) for p in paths]
    sizes = {read_metadata(t).get("block_size") for t in tables}
    if len(sizes) > 1:
        raise InputError(
            "canonical traces with different block sizes cannot be merged: "
            + ", ".join(
                f"{p} ({read_metadata(t).get('block_size')})"
                for p, t in zip(paths, tables, strict=True)
            )
        )
    _check_same_hashing(paths, [read_metadata(t) for t in tables])
    table = tables[0]
    if len(tables) > 1:
        # Each file's arrival_s counts from its own first request: put them on one clock.
        t0s = [read_metadata(t).get("t0_epoch_s", "") for t in tables]
        if len({bool(t0) for t0 in t0s}) > 1:
            raise InputError(
                "cannot merge canonical traces with absolute and relative timestamps: "
                + ", ".join(
                    f"{p} ({'absolute' if t0 else 'relative'})"
                    for p, t0 in zip(paths, t0s, strict=True)
                )
            )
        meta = dict(tables[0].schema.metadata)
        if t0s[0]:
            start = min(float(t0) for t0 in t0s)
            tables = [
                t.set_column(
                    t.column_names.index("arrival_s"),
                    "arrival_s",
                    pa.array(t.column("arrival_s").to_numpy() + (float(t0) - start)),
                )
                for t, t0 in zip(tables, t0s, strict=True)
            ]
            meta[b"kvpool.t0_epoch_s"] = repr(start).encode()
        table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
        order = np.lexsort((np.arange(table.num_rows), table.column("arrival_s").to_numpy()))
        table = table.take(pa.array(order)).replace_schema_metadata(meta)
    fine = int(read_metadata(table).get("block_size") or 16)
    if block_size is not None and block_size != fine:
        if block_size % fine:
            raise UsageError(
                f"the canonical trace has {fine}-token blocks; --block-size {block_size} is "
                "not a multiple of it",
                hint="convert the raw log again to get finer blocks",
            )
        table = coarsen_table(table, block_size // fine)
    previews: dict[int, str] = {}
    for p in paths if previews_wanted else ():
        previews.update(_read_previews(Path(p)))
    return LoadedTrace(
        table=table,
        skipped=SkipSummary(),
        sources=list(paths),
        formats=[Format.CANONICAL] * len(paths),
        previews=previews,
    )


def _read_raw(
    paths: str | Path | Sequence[str | Path],
    opts: IngestOptions | None,
    advance: Callable[[float], None] | None,
) -> tuple[list[str], _Builder | LoadedTrace]:
    """Every row of the inputs read, hashed and spooled; canonical inputs come back loaded."""
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
        return plist, _open_canonical(plist, opts.block_size, opts.previews)
    if Format.CANONICAL in fmts:
        raise UsageError("canonical traces cannot be mixed with raw logs in one run")
    if Format.KV_EVENTS in fmts:
        if any(f != Format.KV_EVENTS for f in fmts):
            raise UsageError("KV-event recordings cannot be mixed with logs in one run")
        from analyzer.ingest.kvevents import open_recordings

        return plist, open_recordings(plist, opts, opts.block_size)
    jobs = _jobs_for(plist, opts)
    started = None
    if jobs > 1 and opts.ray_address is None:
        from analyzer.ingest.parallel import start
        from analyzer.tokenize.tokenizer import CL100K_NAMES

        # The workers start now, importing and loading the tokenizer beside the parent
        # (the bundled one, which tiktoken keeps loaded for the worker's reader).
        text = opts.tokenizer in CL100K_NAMES and any(f in TEXT_FORMATS for f in fmts)
        started = start(plist, fmts, opts.tokenizer if text else None, jobs, advance is not None)
    try:
        b = _Builder(plist, fmts, opts, advance, processes=jobs if opts.ray_address is None else 1)
    except BaseException:
        if started is not None:
            started.stop()
        raise
    from analyzer.ingest.readers import SplitMisaligned

    try:
        if opts.ray_address is not None:
            from analyzer.ingest.cluster import read_ray

            read_ray(b, opts.ray_address)
        elif started is not None:
            from analyzer.ingest.parallel import read_parallel

            read_parallel(b, jobs, started)
        else:
            for p, f in zip(plist, fmts, strict=True):
                b.read_file(p, f)
    except SplitMisaligned:
        # A CSV whose byte ranges did not fall between records (a quote open across a
        # cut, a broken quote): read again in one process, the output by definition.
        b.rows.close()
        b = _Builder(plist, fmts, opts, advance)
        for p, f in zip(plist, fmts, strict=True):
            b.read_file(p, f)
    if not len(b.rows):
        raise InputError(
            "no usable requests in "
            + ", ".join(map(shown, plist))
            + (f"; {b.skipped}" if b.skipped.total else ""),
            hint="check --format and the column flags (see docs/formats.md)",
        )
    return plist, b


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


def _loaded(b: _Builder, plist: list[str], table: pa.Table | None) -> LoadedTrace:
    stats = {}
    w = b.piece_stats
    if b.renderer is not None:
        stats = {
            "parts_seen": b.renderer.parts_seen + w[0],
            "parts_tokenized": b.renderer.parts_tokenized + w[1],
            "tokens_encoded": b.renderer.tokens_encoded + w[2],
        }
    stats["blocks_hashed"] = b.hasher.blocks_hashed + w[3]
    return LoadedTrace(
        table=table if table is not None else CANONICAL_SCHEMA.empty_table(),
        skipped=b.skipped,
        sources=plist,
        formats=b.fmts,
        reordered=b.reordered,
        untimed_files=b.untimed,
        mixed_unit_files=b.mixed_units,
        previews=b.previews,
        stats=stats,
        notes=b.notes,
    )


def open_trace(
    paths: str | Path | Sequence[str | Path],
    opts: IngestOptions | None = None,
    advance: Callable[[float], None] | None = None,
) -> LoadedTrace:
    """Read inputs of any supported format (or canonical Parquet) into a canonical trace.

    ``advance(n)`` is called with input bytes consumed, for a progress bar whose total is
    the sum of the input file sizes. Raises InputError when nothing usable is found.
    """
    plist, b = _read_raw(paths, opts, advance)
    if isinstance(b, LoadedTrace):
        return b
    meta, batches = b.finish()
    table = pa.Table.from_batches(list(batches), schema=CANONICAL_SCHEMA)
    loaded = _loaded(b, plist, table.replace_schema_metadata(meta))
    text = b.needs_text
    del b, batches
    # Only prompt text builds the memos and token tree worth a collection: the cycle
    # collector's pass over everything imported costs 0.1 s, a tenth of reading a
    # 12k-request pre-hashed trace (Mooncake) and running `reuse` on it.
    release_freed_memory(collect=text)
    return loaded


def release_freed_memory(collect: bool = True) -> None:
    """Hand the heap the reading freed (memos, token tree) back to the system, so the
    analysis that follows does not peak on top of it: the cycle collector frees what
    only it can (objects that refer to each other; skipped unless ``collect``), then
    glibc's ``malloc_trim`` returns the pages (elsewhere nothing), and Arrow's allocator
    (mimalloc) the pages it kept of freed buffers (1.3 GB after a million-request
    canonical file is read and its trace built)."""
    import ctypes
    import gc

    if collect:
        gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    pa.default_memory_pool().release_unused()


@dataclass(frozen=True, slots=True)
class Written:
    """What :func:`convert_trace` wrote: the figures of ``kvpool convert``'s summary."""

    requests: int
    prompt_tokens: int
    blocks: int
    distinct_blocks: int  # estimated when distinct_sample_rate < 1
    distinct_sample_rate: float
    block_size: int
    count_only: bool
    span_s: float = 0.0  # first to last arrival


def convert_trace(
    paths: str | Path | Sequence[str | Path],
    out: str | Path,
    opts: IngestOptions | None = None,
    advance: Callable[[float], None] | None = None,
    *,
    force: bool = False,
    window_s: int | None = None,
) -> tuple[LoadedTrace, Written]:
    """Convert inputs to a canonical Parquet file at ``out``, streaming its rows; with
    ``window_s``, to a dataset folder partitioned by ``window_s`` seconds of arrival
    (:class:`~analyzer.trace.WindowedWriter`).

    Memory holds the bounded memos and tree, 24 bytes a request and one batch of output
    rows (:mod:`analyzer.ingest.spool`), not the trace. The returned LoadedTrace has an
    empty table (its other fields as :func:`open_trace` gives them). The file is written
    atomically (analyzer/outputs.py), never over an input.
    """
    from analyzer.outputs import check_dataset_output, check_output

    inputs = [paths] if isinstance(paths, str | Path) else list(paths)
    # Before the long run, not after it.
    if window_s is not None:
        if window_s < 1:
            raise UsageError(f"--window-s must be at least 1, got {window_s}")
        check_dataset_output(out, inputs=inputs)
    else:
        check_output(out, force=force, inputs=inputs)
    plist, b = _read_raw(paths, opts, advance)
    if isinstance(b, LoadedTrace):  # canonical in: written through (maybe coarsened)
        if window_s is None:
            write_canonical(b.table, out, force=force)
            return b, table_figures(b.table)
        meta = b.table.schema.metadata
        batches: Iterator[pa.RecordBatch] = iter(b.table.cast(CANONICAL_SCHEMA).to_batches())
        written = _write(batches, meta, Path(out), force, window_s)
        return b, replace(written, block_size=int(read_metadata(b.table).get("block_size") or 16))
    meta, batches = b.finish()
    written = _write(batches, meta, Path(out), force, window_s)
    return _loaded(b, plist, None), replace(written, block_size=b.block_size)


def _write(
    batches: Iterator[pa.RecordBatch],
    meta: dict[bytes, bytes],
    out: Path,
    force: bool,
    window_s: int | None,
) -> Written:
    """The canonical rows written to ``out`` (one file, or a dataset folder), with the
    figures of the summary counted on the way.

    Each batch is written on a thread while the next is taken from the spool and the
    figures are counted here (Arrow's writer and NumPy's sort release the GIL): 1.0 s of
    writing 100k requests became 0.8 to 0.9 s. One batch is written at a time, in order,
    and at most one more is held meanwhile."""
    from concurrent.futures import Future, ThreadPoolExecutor

    import pyarrow.parquet as pq

    from analyzer.outputs import atomic_dir, atomic_path

    schema = CANONICAL_SCHEMA.with_metadata(meta)
    kw: dict[str, Any] = {
        "compression": "zstd",
        # Hashes are all distinct values: a dictionary per row group only costs memory.
        "use_dictionary": ["request_id", "session_id", "tenant", "model", "parent_request_id"],
    }
    distinct = DistinctCounter()
    n_rows = n_blocks = tokens = 0
    span_s = 0.0
    count_only = True
    with contextlib.ExitStack() as stack:
        writer: Any
        if window_s is None:
            tmp = stack.enter_context(atomic_path(out, force=force))
            writer = stack.enter_context(pq.ParquetWriter(tmp, schema, **kw))
        else:
            folder = stack.enter_context(atomic_dir(out))
            writer = stack.enter_context(WindowedWriter(folder, schema, window_s, **kw))
        # Entered last, so left first: a write in flight ends before the file is closed.
        pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="kvpool-write"))
        writing: Future[None] | None = None
        for batch in batches:
            if writing is not None:
                writing.result()  # the previous batch is written (or its error raised)
            writing = pool.submit(writer.write_batch, batch)
            flat = batch.column("block_hashes").values.to_numpy(zero_copy_only=False)
            distinct.add(flat)
            n_rows += batch.num_rows
            n_blocks += flat.size
            tokens += int(np.asarray(batch.column("prompt_tokens")).sum())
            count_only = count_only and bool(np.asarray(batch.column("count_only")).all())
            if batch.num_rows:
                span_s = float(batch.column("arrival_s")[-1].as_py())  # rows are sorted
        if writing is not None:
            writing.result()
    return Written(
        requests=n_rows,
        prompt_tokens=tokens,
        blocks=n_blocks,
        distinct_blocks=distinct.estimate(),
        distinct_sample_rate=distinct.sample_rate,
        block_size=0,  # the caller's
        count_only=count_only,
        span_s=span_s,
    )


def table_figures(t: pa.Table) -> Written:
    """:class:`Written`'s figures of a canonical table in memory."""
    import pyarrow.compute as pc

    flat = t.column("block_hashes").combine_chunks().values.to_numpy(zero_copy_only=False)
    distinct = DistinctCounter()
    distinct.add(flat)
    n_rows, n_blocks = t.num_rows, flat.size
    return Written(
        requests=n_rows,
        prompt_tokens=int(pc.sum(t.column("prompt_tokens")).as_py() or 0),
        blocks=n_blocks,
        distinct_blocks=distinct.estimate(),
        distinct_sample_rate=distinct.sample_rate,
        block_size=int(read_metadata(t).get("block_size") or 16),
        count_only=n_rows > 0 and bool(pc.all(t.column("count_only")).as_py()),
        span_s=float(pc.max(t.column("arrival_s")).as_py() or 0.0) if n_rows else 0.0,
    )
