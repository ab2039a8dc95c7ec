"""Reuse measured on a canonical file or dataset directory, streaming: the lazy frame of
:mod:`analyzer.reuse.frame` answers the reuse figures' questions
(:class:`FrameInput`), and the figures are computed as for a trace in memory
(:func:`analyzer.reuse.assemble.measure`).

The questions keyed by block are polars queries over hash parts
(:mod:`analyzer.reuse.hash_parts`); the LRU curve comes from the compiled one-pass scan
over dense block ids, or, above ``opts.shards_threshold_accesses`` accesses (or with
``opts.shards_rate``), from a SHARDS sample taken while scanning, so only the sample is
held. The in-memory reading is the oracle (``tests/reuse/test_reuse_frame.py``): the same
report, figure for figure.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from analyzer.cache.stack import reuse_scan, sampled_histogram_sparse
from analyzer.progress import Advance
from analyzer.reuse.analysis import analyze_reuse, shards_error
from analyzer.reuse.assemble import measure
from analyzer.reuse.facts import (
    CountedHits,
    LruHistograms,
    PrefixCandidates,
    PrefixHolders,
    RequestColumns,
    SampledHistogram,
    ScanPlan,
    prefix_holders,
)
from analyzer.reuse.frame import (
    Requests,
    canonical_files,
    check_rows,
    collect,
    n_distinct_blocks,
    read_requests,
    scan_trace,
)
from analyzer.reuse.hash_parts import (
    ROWS_PER_PART,
    HitFacts,
    Parts,
    content_seen_tokens,
    dense_ids,
    hit_facts,
    leading_runs,
    run_tokens,
    shards_sample,
)
from analyzer.reuse.isolation import isolate, isolate_frame
from analyzer.reuse.records import TIME_EDGES, ReuseOptions, ShardsCheck
from analyzer.reuse.result import ReuseReport, TraceShape
from analyzer.spill import new_dir, remove
from analyzer.trace import BlockTrace, read_canonical


def analyze_canonical(
    source: str | Path,
    opts: ReuseOptions | None = None,
    advance: Advance | None = None,
    rows_per_part: int = ROWS_PER_PART,
    isolation: str = "shared",
) -> ReuseReport:
    """:func:`~analyzer.reuse.analysis.analyze_reuse` of a canonical file or dataset,
    streaming. Above ``rows_per_part`` block accesses the block-keyed queries run on hash
    parts of that size (:class:`~analyzer.reuse.hash_parts.Parts`), spilled to a
    temporary directory. A file whose rows are not in arrival order is read whole and
    sorted (:func:`~analyzer.reuse.analysis.analyze_reuse`). ``isolation`` keys every
    block by its request's salt group first
    (:func:`analyzer.reuse.isolation.isolate_frame`).
    """
    opts = opts or ReuseOptions()
    lf, meta = scan_trace(source)
    lf = isolate_frame(lf, isolation)
    bs = int(meta.get("block_size") or 16)
    req = read_requests(lf)
    check_rows(req, bs, str(source))
    t = req.arrival_s
    if t.size > 1 and bool(np.any(t[1:] < t[:-1])):
        tables = [read_canonical(f) for f in canonical_files(source)]
        table = pa.concat_tables(tables, promote_options="default")
        return analyze_reuse(isolate(BlockTrace.from_table(table), isolation), opts, advance)
    tmp = new_dir("reuse")
    try:
        return measure(FrameInput(lf, meta, req, tmp, rows_per_part), opts, advance)
    finally:
        remove(tmp)


class FrameInput:
    """The :class:`~analyzer.reuse.facts.ReuseInput` of a canonical trace read as a lazy
    frame (module docstring). Rows must be in arrival order. The hash parts are written
    (under ``tmp``) on the first question that needs them, and each answer is kept."""

    def __init__(
        self,
        lf: pl.LazyFrame,
        meta: dict[str, str],
        req: Requests,
        tmp: Path,
        rows_per_part: int = ROWS_PER_PART,
    ) -> None:
        self.lf, self.meta, self.req = lf, meta, req
        self.block_size = int(meta.get("block_size") or 16)
        self.tmp = tmp
        self.rows_per_part = rows_per_part
        self.n_accesses = int(req.n_blocks.sum())
        self._parts: Parts | None = None
        self._runs: dict[int, np.ndarray] | None = None
        self._facts: HitFacts | None = None
        self._dense: BlockTrace | None = None

    @property
    def shape(self) -> TraceShape:
        return TraceShape(
            block_size=self.block_size,
            n_requests=self.req.n,
            n_accesses=self.n_accesses,
            all_prompt_tokens=int(self.req.prompt_tokens.sum()),
        )

    @property
    def requests(self) -> RequestColumns:
        r = self.req
        return RequestColumns(r.arrival_s, r.prompt_tokens, r.session, r.tenant, r.token_lcp_prev)

    @property
    def count_only(self) -> bool:
        return self.req.count_only

    def distinct_blocks(self) -> int:
        return n_distinct_blocks(self.lf) if self.n_accesses else 0

    def _block_parts(self) -> Parts:
        if self._parts is None:
            self._parts = self._split("block_hashes")
        return self._parts

    def _split(self, column: str) -> Parts:
        return Parts(self.lf, column, self.req.offsets, self.rows_per_part, self.tmp)

    def _leading_runs(self, plan: ScanPlan) -> dict[int, np.ndarray]:
        if self._runs is None:
            self._runs = leading_runs(self._block_parts(), self.req, plan.factors)
        return self._runs

    def _hit_facts(self, plan: ScanPlan) -> HitFacts:
        if self._facts is None:
            self._facts = hit_facts(
                self._block_parts(),
                self.req,
                self._leading_runs(plan)[1],
                self.block_size,
                plan.first,
                plan.window_s,
                plan.n_windows,
                TIME_EDGES,
                plan.top_n,
                self.tmp,
            )
        return self._facts

    def counted_hits(self, plan: ScanPlan) -> CountedHits:
        facts = self._hit_facts(plan)
        top = facts.top
        return CountedHits(
            source_tokens=facts.source_tokens,
            time_count=facts.time_count,
            working_set=facts.working_set,
            n_distinct=facts.n_distinct,
            prefixes=PrefixCandidates(
                block_id=top["id"].to_numpy().astype(np.int64),
                hash=top["h"].to_numpy().astype(np.uint64),
                blocks=top["blocks"].to_numpy().astype(np.int64),
                requests=top["hits"].to_numpy().astype(np.int64),
                any_hit=int(facts.time_count.sum()) > 0,
                holders=self._holders(top),
            ),
        )

    def _holders(self, top: pl.DataFrame) -> Callable[[np.ndarray], dict[int, PrefixHolders]]:
        """Who holds the listed prefixes: their accesses read from the hash parts."""
        ids = top["id"].to_numpy().astype(np.int64)
        hashes = top["h"].to_numpy().astype(np.uint64)

        def holders(listed: np.ndarray) -> dict[int, PrefixHolders]:
            want = hashes[np.isin(ids, listed)].tolist()
            acc = collect(
                pl.concat(
                    [
                        f.filter(pl.col("h").is_in(want)).select("h", "r")
                        for f in self._block_parts().frames
                    ]
                )
            )
            id_of = dict(zip(hashes.tolist(), ids.tolist(), strict=True))
            block = np.array([id_of[h] for h in acc["h"].to_list()], dtype=np.int64)
            r = self.req
            return prefix_holders(
                listed,
                block,
                acc["r"].to_numpy().astype(np.int64),
                r.tenant,
                r.model,
                r.model_names,
            )

        return holders

    def prefix_hits(self, plan: ScanPlan, factor: int) -> np.ndarray:
        run = self._leading_runs(plan)[factor]
        return run_tokens(run, self.req, self.block_size * factor)

    def content_seen(self) -> np.ndarray | None:
        if not self.req.content_ok:
            return None
        return content_seen_tokens(self._split("content_hashes"), self.req, self.block_size)

    def dense_trace(self, plan: ScanPlan) -> BlockTrace:
        if self._dense is None:
            facts = self._hit_facts(plan)
            r = self.req
            self._dense = BlockTrace(
                block_size=self.block_size,
                arrival_s=r.arrival_s,
                prompt_tokens=r.prompt_tokens,
                output_tokens=np.full(r.n, -1, dtype=np.int64),
                session=r.session,
                tenant=r.tenant,
                offsets=r.offsets,
                block_ids=dense_ids(self._block_parts(), facts.first_pos, self.n_accesses),
                block_hashes=np.zeros(facts.n_distinct, dtype=np.uint64),  # not used here
                request_ids=[],
                session_names=[],
                tenant_names=[],
            )
        return self._dense

    def lru_histograms(self, plan: ScanPlan) -> LruHistograms:
        trace = self.dense_trace(plan)
        r = self.req
        scan = reuse_scan(
            trace.block_ids,
            trace.offsets,
            r.prompt_tokens,
            r.arrival_s,
            r.session,
            r.tenant,
            self.block_size,
            plan.first,
            trace.n_blocks,
            plan.window_s,
            plan.n_windows,
            TIME_EDGES,
            True,
        )
        return LruHistograms(counted=scan[1], every=scan[0], distances=scan[2])

    def sampled_histogram(self, plan: ScanPlan) -> SampledHistogram:
        assert plan.shards_rate is not None
        n_distinct = self._hit_facts(plan).n_distinct
        bs, r = self.block_size, self.req
        sample = shards_sample(self.lf, self._block_parts(), r, bs, plan.shards_rate, n_distinct)
        hist = sampled_histogram_sparse(
            sample.ids,
            sample.offsets,
            sample.weights,
            sample.id_weight,
            sample.unit,
            plan.first,
            max(n_distinct, 1),
        )
        counted_tokens = int(run_tokens(r.n_blocks, r, bs)[plan.first :].sum())
        return SampledHistogram(hist, counted_tokens)

    def shards_check(self, plan: ScanPlan, warmup: float, n_accesses: int) -> ShardsCheck:
        """:func:`~analyzer.reuse.analysis.shards_error` on the requests within
        ``n_accesses``, read alone (exact and sampled curves of that prefix, compared)."""
        assert plan.shards_rate is not None
        n_req = int(np.searchsorted(self.req.offsets, n_accesses, side="right")) - 1
        n_req = min(max(n_req, 0), self.req.n)
        table = collect(self.lf.head(n_req)).to_arrow()
        table = table.replace_schema_metadata({f"kvpool.{k}": v for k, v in self.meta.items()})
        return shards_error(BlockTrace.from_table(table), plan.shards_rate, warmup, n_accesses)
