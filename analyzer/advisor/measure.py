"""The measure stage: what the log holds, before any model or price enters.

It reads the logs (or takes the caller's already loaded trace), names the inputs as
the report names them (by position, size and hash unless ``--keep-names``), measures
prefix reuse (:func:`analyzer.reuse.analyze_reuse`), the models the log names with each
one's reuse (:mod:`analyzer.advisor.models`), and how its arrivals are spaced
(:class:`Arrivals`): coarse timestamps or bursts change the GPUs a load needs, and the
report says so with the size the plan would have without them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analyzer.advisor.figures import AnalyzedInput, ReuseFigures, SkippedRows, TraceFigures
from analyzer.advisor.models import choose_models, models_document, select_model, served_models
from analyzer.cost import get_model
from analyzer.errors import shown
from analyzer.ingest import open_trace
from analyzer.ingest.builder import release_freed_memory
from analyzer.progress import progress
from analyzer.reuse import ReuseOptions, analyze_reuse
from analyzer.reuse.analysis import first_counted_request, prefix_hit_tokens
from analyzer.reuse.isolation import keyings
from analyzer.trace import BlockTrace

if TYPE_CHECKING:
    from analyzer.advisor.models import ModelChoice, ModelsFigures
    from analyzer.advisor.options import AnalyzeOptions
    from analyzer.ingest import LoadedTrace
    from analyzer.reuse import ReuseReport

# Arrival times shared by at least this share of the requests make a log's timestamps
# "coarse": requests logged at the same instant reach the engines as one burst.
COARSE_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Arrivals:
    """How the log's requests are spaced in time.

    ``groups`` distinct arrival times hold the ``requests``; ``shared`` of the requests
    arrive at the same instant as another one (a burst, or a timestamp too coarse to
    tell them apart). ``step_s`` is the median gap between distinct arrival times;
    ``gap_cv`` the coefficient of variation of the gaps between requests (1 for Poisson
    arrivals, above 1 burstier)."""

    requests: int
    groups: int
    largest_group: int
    shared: float
    step_s: float
    gap_cv: float

    @property
    def mean_group(self) -> float:
        return self.requests / self.groups if self.groups else 0.0

    @property
    def coarse(self) -> bool:
        return self.requests >= 2 and self.shared >= COARSE_SHARE

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "distinct_times": self.groups,
            "largest_group": self.largest_group,
            "mean_group": self.mean_group,
            "shared_share": self.shared,
            "step_s": self.step_s,
            "gap_cv": self.gap_cv,
            "coarse": self.coarse,
        }


def arrivals(arrival_s: np.ndarray) -> Arrivals:
    t = np.sort(np.asarray(arrival_s, dtype=np.float64))
    n = int(t.size)
    if n < 2:
        return Arrivals(n, n, n, 0.0, 0.0, 0.0)
    times, counts = np.unique(t, return_counts=True)
    shared = float(counts[counts > 1].sum()) / n
    step = float(np.median(np.diff(times))) if times.size > 1 else 0.0
    gaps = np.diff(t)
    mean = float(gaps.mean())
    cv = float(gaps.std() / mean) if mean > 0 else 0.0
    return Arrivals(n, int(times.size), int(counts.max()), shared, step, cv)


def spread(trace: BlockTrace, step_s: float) -> BlockTrace:
    """``trace`` with the requests that share an arrival time spread evenly over the
    time until the next distinct one (at most ``step_s``), in their order: what the
    load looks like when the timestamps' coarseness, not the clients, made the bursts."""

    t = trace.arrival_s
    if t.size < 2:
        return trace
    times, first, counts = np.unique(t, return_index=True, return_counts=True)
    nxt = np.append(times[1:], times[-1] + step_s)
    width = np.minimum(nxt - times, step_s)
    group = np.repeat(np.arange(times.size), counts)
    pos = np.arange(t.size) - np.repeat(first, counts)
    out = t + width[group] * pos / counts[group]
    return replace(trace, arrival_s=out)


@dataclass(frozen=True, slots=True)
class Measured:
    """What the log holds: the loaded trace, its inputs as the report names them, the
    skipped rows, the trace's and reuse figures, the models it names and its arrivals."""

    loaded: LoadedTrace
    inputs: tuple[AnalyzedInput, ...]
    trace_figures: TraceFigures
    reuse: ReuseFigures
    reuse_report: ReuseReport
    skipped: SkippedRows
    models: ModelsFigures
    arrivals: Arrivals
    choices: tuple[ModelChoice, ...]
    read_here: bool
    # The log as read, before its blocks were keyed by ``--isolation`` (``loaded`` itself
    # under ``shared``): the isolation stage keys it under the other policies.
    shared: LoadedTrace | None = None

    @property
    def trace(self) -> BlockTrace:
        return self.loaded.trace


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def reusable_prefix_percentiles(trace: BlockTrace, warmup: float) -> tuple[int, int]:
    """Token-weighted 50th and 25th percentiles of the reusable prefix per request.

    A request's reusable prefix is its leading run of blocks seen in any earlier
    request, capped at ``prompt - 1`` (the last token is always recomputed): its prefix
    hits with unlimited capacity (:func:`analyzer.reuse.analysis.prefix_hit_tokens`).
    Each request is weighted by its reusable tokens, so the figure is the prefix length
    at which half of the reusable tokens sit.
    """
    n = trace.n_requests
    if n == 0 or trace.n_accesses == 0:
        return 0, 0

    hit = prefix_hit_tokens(trace)
    start = first_counted_request(n, warmup)
    h = hit[start:]
    h = h[h > 0]
    if h.size == 0:
        return 0, 0
    order = np.sort(h)
    cum = np.cumsum(order)
    total = cum[-1]

    def q(f: float) -> int:
        return int(order[int(np.searchsorted(cum, f * total, side="left"))])

    return q(0.5), q(0.25)


def trace_figures(loaded: LoadedTrace) -> TraceFigures:
    t: BlockTrace = loaded.trace
    n = t.n_requests
    approx = False
    if "approx_lengths" in loaded.table.column_names and loaded.table.num_rows:
        import pyarrow.compute as pc

        approx = bool(pc.any(loaded.table.column("approx_lengths")).as_py())
    total = int(t.prompt_tokens.sum()) if n else 0
    return TraceFigures(
        n_requests=n,
        count_only=bool(t.count_only),
        duration_s=float(t.arrival_s[-1] - t.arrival_s[0]) if n else 0.0,
        prompt_tokens_total=total,
        mean_prompt_tokens=total / n if n else 0.0,
        block_size=t.block_size,
        approx_lengths=approx,
        skipped_lines=int(loaded.skipped.total),
        sessions_known=bool((t.session >= 0).any()) if n else False,
        tenants_known=bool((t.tenant >= 0).any()) if n else False,
    )


def reuse_figures(
    rep: ReuseReport, trace: BlockTrace, warmup: float, knee_fraction: float
) -> ReuseFigures:
    if not rep.measurable:
        return ReuseFigures(measurable=False, warmup=warmup, reason=rep.reason)
    med, p25 = reusable_prefix_percentiles(trace, warmup)
    src = rep.sources.share_of_hits if rep.sources is not None else {}
    return ReuseFigures(
        measurable=True,
        ceiling_hit_rate=float(rep.ceiling_hit_rate),
        cold_ceiling_hit_rate=float(rep.cold_ceiling_hit_rate),
        warmup=warmup,
        knee_tokens=int(rep.knee_tokens(knee_fraction)),
        knee_fraction=knee_fraction,
        footprint_tokens=int(rep.footprint_tokens),
        median_prefix_tokens=med,
        p25_prefix_tokens=p25,
        same_session_share=float(src.get("same_session", 0.0)),
        same_tenant_share=float(src.get("same_tenant", 0.0)),
        cross_tenant_share=float(src.get("cross_tenant", 0.0)),
    )


def _private_example(example: str, names: dict[str, str]) -> str:
    """A skip example ``path:line: reason`` with the path as the report names it."""
    for path, name in names.items():
        if example.startswith(path + ":"):
            return name + example[len(path) :]
    return example


def choices_of(loaded: LoadedTrace, opts: AnalyzeOptions) -> tuple[ModelChoice, ...]:
    """The models the analysis plans (:func:`analyzer.advisor.models.choose_models`)."""

    return choose_models(
        served_models(loaded.table),
        model=opts.model,
        model_given=opts.model_given or opts.profile is not None,
        only_model=opts.only_model,
        weights_dtype=opts.weights_dtype,
    )


def primary_bytes_per_token(choices: tuple[ModelChoice, ...], kv_dtype: str) -> int:
    """KV bytes per token of the model with the most requests: what the reuse figures
    in GB are counted in."""

    return int(get_model(choices[0].model).kv_bytes_per_token(dtype=kv_dtype))


def measure(
    paths: list[str],
    opts: AnalyzeOptions,
    *,
    loaded: LoadedTrace | None = None,
    reuse: ReuseReport | None = None,
    models: ModelsFigures | None = None,
) -> Measured:
    """Read the logs (unless ``loaded`` is given), name the models to plan, and measure
    the log. ``reuse`` and ``models`` are the caller's remembered reuse report (with this
    warm-up and :func:`primary_bytes_per_token`) and models document, when it has them."""

    read_here = loaded is None
    if loaded is None:
        with progress(
            "reading logs",
            sum(Path(p).stat().st_size for p in paths if Path(p).is_file()) or None,
            unit="bytes",
        ) as adv:
            loaded = open_trace(paths, opts.ingest, advance=adv)
    if opts.only_model is not None:
        loaded = select_model(loaded, opts.only_model)
    named = served_models(loaded.table)
    choices = choices_of(loaded, opts)
    bytes_per_token = primary_bytes_per_token(choices, opts.kv_dtype)
    if read_here and (len(named) < 2 or loaded.parts_without_hashes):
        # Nothing below reads the table's block hashes again (a multi-model log's
        # per-model parts are taken from the trace): keep them once, as its dense ids.
        loaded.drop_block_columns()
    trace = loaded.trace
    if read_here:  # not on a caller's trace (the dashboard's what-ifs): built already
        release_freed_memory()  # building the trace's ids freed as much as they hold
    # Every figure below is measured with the blocks keyed as --isolation says
    # (analyzer/reuse/isolation.py); the log as read is kept for the isolation stage.
    shared = loaded
    loaded = loaded.isolated(opts.isolation)
    trace = loaded.trace
    # Reports are made to be shared: inputs are named by position, size and hash unless
    # --keep-names (a file name can carry a customer's name).
    names = {
        # shown: a copy of stdin or of an object keeps the name it was given by
        p: Path(shown(p)).name if opts.ingest.keep_names else f"input-{i + 1}"
        for i, p in enumerate(paths)
    }
    inputs = tuple(AnalyzedInput(names[p], Path(p).stat().st_size, _sha256(p)) for p in paths)
    if reuse is None:
        with progress("reuse analysis", 100) as adv:
            reuse = analyze_reuse(
                trace,
                ReuseOptions(
                    warmup=opts.warmup, bytes_per_token=bytes_per_token, jobs=opts.ingest.jobs
                ),
                advance=adv,
            )
    if models is None:
        models = models_document(loaded, ReuseOptions(warmup=opts.warmup), opts.kv_dtype)
    if read_here and not keyings(shared.trace, opts.isolation).measured_again(opts.isolation):
        # Reuse is measured, and the isolation stage measures it under no other keying:
        # nothing reads the content ids again.
        for owner in {id(shared): shared, id(loaded): loaded}.values():
            owner.drop_content_ids()
    return Measured(
        loaded=loaded,
        inputs=inputs,
        trace_figures=trace_figures(loaded),
        reuse=reuse_figures(reuse, trace, opts.warmup, opts.knee_fraction),
        reuse_report=reuse,
        skipped=SkippedRows(
            total=int(loaded.skipped.total),
            by_reason=tuple(sorted(loaded.skipped.by_reason.items())),
            examples=tuple(_private_example(e, names) for e in loaded.skipped.examples),
        ),
        models=models,
        arrivals=arrivals(trace.arrival_s),
        choices=choices,
        read_here=read_here,
        shared=shared,
    )
