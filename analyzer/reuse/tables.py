"""The terminal summary of a reuse report, as rich tables; ``--json`` writes
:meth:`~analyzer.reuse.result.ReuseReport.to_json` (analyzer/cli/reuse.py)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from analyzer.cache.policies import label as policy_label
from analyzer.quoting import terminal
from analyzer.reuse.records import GB, GIB, HourRow, TenantRow, models_words, tenants_words
from analyzer.reuse.result import ReuseReport


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def tokens(n: float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _size(report: ReuseReport, capacity_tokens: int) -> str:
    out = f"{tokens(capacity_tokens)} tok"
    if report.bytes_per_token:
        n_bytes = capacity_tokens * report.bytes_per_token
        out += f" ({n_bytes / GB:,.1f} GB, {n_bytes / GIB:,.1f} GiB)"
    return out


def render_summary(
    report: ReuseReport,
    console: Console,
    sources: list[str] | None = None,
    skipped: str | None = None,
) -> None:
    """A readable summary: headline, granularity, sources, capacity table, top prefixes."""
    where = ", ".join(terminal(s) for s in sources or []) or "trace"
    console.print(
        f"[bold]Prefix reuse[/] in {where}: {report.n_requests:,} requests, "
        f"{report.block_size}-token blocks, {report.n_accesses:,} block accesses, "
        f"{report.n_blocks:,} distinct blocks"
    )
    if skipped and not skipped.startswith("no rows"):
        console.print(f"[yellow]{terminal(skipped)}[/]")
    if not report.measurable:
        console.print(f"[bold yellow]Reuse cannot be measured:[/] {terminal(report.reason or '')}")
        return
    console.print(
        f"Ceiling (unlimited cache, perfect routing): [bold]{pct(report.ceiling_hit_rate)}[/] "
        f"of prompt tokens steady state (first {report.warmup:.0%} of requests warm the "
        f"cache), {pct(report.cold_ceiling_hit_rate)} cold. The last prompt token of every "
        "request is always recomputed."
    )
    _granularity(report, console)
    _sources(report, console)
    _capacities(report, console)
    _distances(report, console)
    _breakdowns(report, console)
    _prefixes(report, console)
    npx = report.non_prefix
    if npx.available:
        console.print(
            f"Beyond prefixes: {pct(npx.content_seen_rate)} of prompt tokens were seen "
            f"before at some position, {pct(npx.prefix_rate)} as a prefix; the other "
            f"[bold]{pct(npx.hit_rate)}[/] is reusable only position-independently "
            "(CacheBlend-style), which today's pooling products cannot use."
        )
    else:
        console.print(f"Beyond prefixes: {terminal(npx.reason or 'not available')}.")


def _granularity(report: ReuseReport, console: Console) -> None:
    g = report.granularity
    table = Table(title="Ceiling by cache granularity", title_justify="left")
    table.add_column("granularity")
    table.add_column("steady", justify="right")
    table.add_column("cold", justify="right")
    if g is None:
        return
    exact = g.token_exact
    if exact.available:
        table.add_row("token-exact", pct(exact.hit_rate), pct(exact.cold_hit_rate))
    else:
        table.add_row("token-exact", "unknown", "unknown")
    for row in g.blocks:
        label = f"{row.block_size_tokens}-token blocks"
        if row.available:
            table.add_row(label, pct(row.hit_rate), pct(row.cold_hit_rate))
        else:
            table.add_row(label, "n/a", "n/a")
    console.print(table)
    missing = [r for r in g.blocks if not r.available]
    if missing:
        console.print(f"  n/a: {terminal(missing[0].reason or '')}")


def _sources(report: ReuseReport, console: Console) -> None:
    s = report.sources
    if s is None or (not s.sessions_known and not s.tenants_known):
        console.print(
            "Sources: the trace names no sessions or tenants, so reuse cannot be split by source."
        )
        return
    table = Table(title="Where reused tokens come from (last holder)", title_justify="left")
    for col in ("source", "share of hits", "share of prompt tokens"):
        table.add_column(col, justify="left" if col == "source" else "right")
    labels = {
        "same_session": "same session, earlier turn",
        "same_tenant": "other session, same tenant",
        "cross_tenant": "other tenant",
        "unattributed": ("other session, tenant unknown" if s.sessions_known else "unknown"),
    }
    for key, label in labels.items():
        table.add_row(label, pct(s.share_of_hits[key]), pct(s.share_of_prompt[key]))
    console.print(table)


def _capacities(report: ReuseReport, console: Console) -> None:
    method = "exact, one pass" if report.curve_method == "exact" else "SHARDS-sampled"
    policies = list(report.policy_points)
    table = Table(title=f"Steady hit rate against cache size (LRU {method})", title_justify="left")
    table.add_column("capacity")
    table.add_column("LRU", justify="right")
    for p in policies:
        table.add_column(policy_label(p), justify="right")
    for cap in report.capacities_tokens:
        row = [_size(report, cap), pct(report.hit_rate_at(cap))]
        points = dict(report.policy_points.items())
        row += [pct(dict(points[p]).get(cap)) for p in policies]
        table.add_row(*row)
    console.print(table)
    knees = ", ".join(
        f"{int(f * 100)}% of the ceiling at {_size(report, report.knee_tokens(f))}"
        for f in (0.5, 0.9)
    )
    console.print(
        f"LRU reaches {knees}; the whole reusable working set is "
        f"{_size(report, report.footprint_tokens)}."
    )
    if report.shards:
        sh = report.shards
        console.print(
            f"  sampled at rate {sh['rate']:g}; measured error against the exact curve on the "
            f"first {sh['checked_accesses']:,} accesses: max {pct(sh['max_abs_error'])}, "
            f"mean {pct(sh['mean_abs_error'])} (absolute)."
        )
    for note in report.policy_notes:
        console.print(f"  {terminal(note)}")


def _distances(report: ReuseReport, console: Console) -> None:
    d, t, ws = report.reuse_distance, report.reuse_time, report.working_set
    if d is None or t is None or ws is None:
        return
    dt = d["tokens"]
    console.print(
        f"Reuse distance (distinct tokens in between) p50 {tokens(dt['p50'])}, "
        f"p90 {tokens(dt['p90'])}, p99 {tokens(dt['p99'])}; reuse time p50 "
        f"{seconds(t['p50'])}, p90 {seconds(t['p90'])}, p99 {seconds(t['p99'])}. "
        f"Working set: peak {tokens(ws['peak_distinct_tokens'])} distinct tokens per "
        f"{seconds(ws['window_s'])} window."
    )


def _spread(rows: Sequence[TenantRow | HourRow]) -> str:
    rates = [r["hit_rate"] for r in rows if r["prompt_tokens"]]
    return f"{pct(min(rates))} to {pct(max(rates))}" if rates else "n/a"


def _breakdowns(report: ReuseReport, console: Console) -> None:
    b = report.breakdowns
    if not b:
        return
    tenants = [r for r in b["by_tenant"] if r["tenant"] is not None]
    hours = b["by_hour"]
    parts = []
    if len(tenants) > 1:
        parts.append(f"per tenant {_spread(tenants)} over {len(tenants):,} tenants")
    if len(hours) > 1:
        parts.append(f"per hour {_spread(hours)} over {len(hours):,} hours")
    if parts:
        console.print("Steady ceiling " + "; ".join(parts) + " (breakdowns in --json).")


def _prefixes(report: ReuseReport, console: Console) -> None:
    entries = report.top_prefixes.by_volume
    if not entries:
        return
    table = Table(title="Top shared prefixes by reused tokens", title_justify="left")
    cols = ["prefix", "requests", "reused", "tenants", "models"]
    previews = any(e.preview for e in entries)
    for col in cols + (["text"] if previews else []):
        table.add_column(col, justify="right" if col in ("requests", "reused") else "left")
    for e in entries:
        row = [
            f"{tokens(e.prefix_tokens)} tok",
            f"{e.requests:,}",
            tokens(e.reused_tokens),
            tenants_words(e.tenants),
            terminal(models_words(e.models)),
        ]
        table.add_row(*row, *([terminal(e.preview or "-")] if previews else []))
    console.print(table)
