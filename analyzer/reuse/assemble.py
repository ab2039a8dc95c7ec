"""The one place a measured :class:`~analyzer.reuse.result.ReuseReport` is put together:
every figure from the answers of a :class:`~analyzer.reuse.facts.ReuseInput`, whichever
way the trace was read.

The counted hits are asked for first (in memory, one compiled pass also gives the
prefix hits and, on an exact run, the LRU histograms), then the prefix hits at coarser
blocks and the content seen before, and last the LRU curve and the other policies, which
may need the whole trace as dense block ids (the lazy frame builds them then, and keeps
them to the end). Progress adds up to 100 points.
"""

from __future__ import annotations

from analyzer.progress import Advance
from analyzer.reuse.ceilings import breakdowns, granularity_table, non_prefix_figures, token_rates
from analyzer.reuse.curves import (
    SAMPLED_BY,
    compare_policies,
    exact_curve,
    shards_adjusted_curve,
)
from analyzer.reuse.facts import ReuseInput, ScanPlan
from analyzer.reuse.hit_stats import (
    reuse_distance,
    reuse_sources,
    reuse_time,
    top_prefixes,
    working_set,
)
from analyzer.reuse.records import ReuseOptions, ShardsRun
from analyzer.reuse.result import ReuseReport, shape_fields, unmeasurable

COUNT_ONLY = (
    "this trace has token counts only (no prompt content or block hashes), so "
    "prefix reuse cannot be measured from it; use logs with prompts or block hashes"
)
NO_REQUESTS = "the trace has no requests"


def measure(inp: ReuseInput, opts: ReuseOptions, advance: Advance | None = None) -> ReuseReport:
    """The reuse report of the trace ``inp`` reads; ``advance`` receives percentage
    points (100 in all)."""
    step = advance or (lambda _n: None)
    shape = inp.shape
    if inp.count_only:
        return unmeasurable(opts, shape, inp.distinct_blocks(), COUNT_ONLY)
    if shape.n_requests == 0:
        return unmeasurable(opts, shape, inp.distinct_blocks(), NO_REQUESTS)
    req = inp.requests
    bs = shape.block_size
    plan = ScanPlan.of(opts, shape, req.arrival_s)
    first = plan.first
    counted = inp.counted_hits(plan)
    hit = inp.prefix_hits(plan, 1)
    step(40)
    prompt = req.prompt_tokens
    steady, cold = token_rates(hit, prompt, first)
    den = int(prompt[first:].sum())
    granularity = granularity_table(
        prompt,
        req.token_lcp_prev,
        first,
        opts.granularities,
        bs,
        lambda factor: inp.prefix_hits(plan, factor),
    )
    step(5)
    non_prefix = non_prefix_figures(inp.content_seen(), prompt, first, hit)
    step(5)

    cold_curve = None
    distances = None
    shards: ShardsRun | None = None
    if plan.shards_rate is None:
        lru = inp.lru_histograms(plan)
        assert int(lru.counted[:-1].sum()) == int(hit[first:].sum())
        curve = exact_curve(lru.counted, den)
        cold_curve = exact_curve(lru.every, int(prompt.sum()))
        distances = lru.distances
    else:
        sample = inp.sampled_histogram(plan)
        curve = shards_adjusted_curve(sample.counted, sample.counted_tokens, den)
        check = inp.shards_check(plan, opts.warmup, opts.shards_error_accesses)
        shards = {
            "rate": plan.shards_rate,
            "sampled_by": SAMPLED_BY,
            "checked_requests": check["checked_requests"],
            "checked_accesses": check["checked_accesses"],
            "max_abs_error": check["max_abs_error"],
            "mean_abs_error": check["mean_abs_error"],
        }
    step(10)

    policies = compare_policies(
        opts, curve, shape.n_accesses, bs, first, den, lambda: inp.dense_trace(plan), step
    )
    tops = top_prefixes(counted.prefixes, bs, opts.top_n)
    hit_accesses = int(counted.time_count.sum())
    return ReuseReport(
        measurable=True,
        reason=None,
        **shape_fields(opts, shape),
        n_blocks=counted.n_distinct,
        prompt_tokens=den,
        hit_tokens=int(hit[first:].sum()),
        ceiling_hit_rate=steady,
        cold_ceiling_hit_rate=cold,
        curve=curve,
        cold_curve=cold_curve,
        curve_method="exact" if plan.exact else "shards",
        shards=shards,
        policy_points=policies.points,
        policy_notes=policies.notes,
        capacities_tokens=policies.capacities_tokens,
        sources=reuse_sources(
            counted.source_tokens,
            den,
            bool((req.session >= 0).any()),
            bool((req.tenant >= 0).any()),
        ),
        top_prefixes=tops,
        granularity=granularity,
        non_prefix=non_prefix,
        reuse_distance=reuse_distance(distances, None if plan.exact else curve, hit_accesses, bs),
        reuse_time=reuse_time(counted.time_count),
        working_set=working_set(
            counted.working_set, float(req.arrival_s[0]), plan.window_s, counted.n_distinct, bs
        ),
        breakdowns=breakdowns(hit, prompt, req.tenant, req.arrival_s, first),
    )
