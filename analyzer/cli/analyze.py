"""`kvpool analyze` (log -> verdict and reports) and `kvpool validate` (pilot results
against the report's gates)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from analyzer.cli import options as o
from analyzer.cli.stdio import stdin_options
from analyzer.errors import EXIT_GATES
from analyzer.quoting import scrub, terminal

if TYPE_CHECKING:
    from rich.console import Console

    from analyzer.advisor.engine_metrics import EngineMeasurement
    from analyzer.report.document import ReportDocument
    from analyzer.report.plan_views import ReportView


@o.ingest_flags
@o.cluster_flags
@stdin_options("prices", "profile")
def analyze(
    inputs: o.Inputs,
    *,
    out: Annotated[
        Path,
        typer.Option(
            "-o",
            "--out",
            help="Directory for report.html, report.md, report.json (s3://, gs://, az://: a "
            "prefix in object storage).",
            parser=o.path_or_url,
        ),
    ],
    cluster: o.ClusterFlags,
    ttft_slo: o.TtftSlo = 2.0,
    profile: o.CostProfile = None,
    only_model: o.OnlyModel = None,
    isolation: o.Isolation = "shared",
    current_instances: Annotated[
        int | None,
        typer.Option(
            "--current-instances",
            help="Today's deployment, replayed beside the hits its log measured "
            "(cached_tokens): instances (default: --instances).",
        ),
    ] = None,
    current_router: Annotated[
        str | None,
        typer.Option("--current-router", help="Today's router (default: --router)."),
    ] = None,
    current_local_capacity_tokens: Annotated[
        str | None,
        typer.Option(
            "--current-local-capacity-tokens",
            help="Today's HBM prefix cache per instance, tokens (default: as "
            "--local-capacity-tokens).",
        ),
    ] = None,
    no_size_search: Annotated[
        bool,
        typer.Option(
            "--no-size-search",
            "--no-rate-search",
            help="Do not size the options by replaying (faster; nothing is sized or priced).",
        ),
    ] = False,
    max_gpus: Annotated[
        int | None,
        typer.Option(
            "--max-gpus",
            help="The most GPUs a plan may use (default: 64 x the GPUs of --instances); "
            "above it an option cannot meet the SLO.",
        ),
    ] = None,
    full_replay: o.FullReplay = False,
    pdf: Annotated[
        bool,
        typer.Option("--pdf", help="Also print report.pdf with headless Chromium, if installed."),
    ] = False,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Also write report.json's document here ('-': stdout, alone).",
            parser=o.path_or_url,
        ),
    ] = None,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="cost: the cheapest option serving the load within the SLO; ttft: the "
            "lowest mean TTFT.",
        ),
    ] = "cost",
    pool_margin: Annotated[
        float,
        typer.Option(
            "--pool-margin",
            help="How much cheaper than the best local option a pool must be, as a fraction "
            "of the baseline's monthly cost (its operational risk).",
        ),
    ] = 0.05,
    peak_window: Annotated[
        float,
        typer.Option(
            "--peak-window", help="Window (s) of the busiest load the GPUs are sized for."
        ),
    ] = 300.0,
    prices: Annotated[
        Path | None,
        typer.Option(
            "--prices", help="A price file in the layout of models/prices.toml ('-': stdin)."
        ),
    ] = None,
    gpu_hour_usd: Annotated[
        float | None, typer.Option("--gpu-hour-usd", help="Price of one GPU-hour (USD).")
    ] = None,
    dram_gb_month_usd: Annotated[
        float | None,
        typer.Option("--dram-gb-month-usd", help="Host DRAM, USD per GB-month (0: bundled)."),
    ] = None,
    nvme_tb_month_usd: Annotated[
        float | None, typer.Option("--nvme-tb-month-usd", help="NVMe, USD per TB-month.")
    ] = None,
    nic_node_month_usd: Annotated[
        float | None,
        typer.Option("--nic-node-month-usd", help="A pool NIC, USD per node-month."),
    ] = None,
    store_month_usd: Annotated[
        float | None,
        typer.Option(
            "--store-month-usd", help="The KV store's own servers (master, metadata), USD/month."
        ),
    ] = None,
    ingest: o.IngestFlags,
    force: o.Force = False,
    show_previews: o.ShowPreviews = False,
    keep_names: o.KeepNames = False,
) -> None:
    """Log to decision: reuse, break-even, replay, verdict, sized settings and pilot gates."""

    from analyzer.advisor.figures import Objective, Thresholds
    from analyzer.advisor.pipeline import AnalyzeOptions, run_analysis
    from analyzer.advisor.replay import LocalReplayer
    from analyzer.cost.prices import PriceOverrides
    from analyzer.cost.reference import warm_default_check
    from analyzer.outputs import report_dir
    from analyzer.storage import free_prefix, is_url

    remote: tuple[str, str | None] | None = None  # (prefix, note) in object storage
    if is_url(out):  # fail before the long run, not after it
        remote = free_prefix(str(out), force=force)
    else:
        report_dir(out, force=force, create=False)
    if profile is not None:
        from analyzer.cost.calibrate import load_profile

        # the profile's model, GPU and TP are used; any given away from the defaults
        # must agree with them
        default = o.ClusterFlags()
        load_profile(
            profile,
            model=cluster.model,
            gpu=None if cluster.gpu == default.gpu else cluster.gpu,
            tp=cluster.tp,
        )
    opts = AnalyzeOptions(
        ingest=ingest.options(previews=show_previews, keep_names=keep_names),
        cluster=cluster.config(),
        ttft_slo_s=ttft_slo,
        only_model=only_model,
        isolation=isolation,
        current_instances=current_instances,
        current_router=current_router,
        current_local_capacity_tokens=o.capacity(
            current_local_capacity_tokens, "--current-local-capacity-tokens"
        ),
        profile=profile,
        size_search=not no_size_search,
        max_gpus=max_gpus,
        model_given=cluster.model is not None,
        tp_given=cluster.tp is not None,
        full_replay=full_replay,
        thresholds=Thresholds(objective=Objective.parse(objective), min_pool_saving=pool_margin),
        peak_window_s=peak_window,
        prices=PriceOverrides(
            prices_file=None if prices is None else str(prices),
            gpu_hour_usd=gpu_hour_usd,
            dram_gb_month_usd=dram_gb_month_usd,
            nvme_tb_month_usd=nvme_tb_month_usd,
            nic_node_month_usd=nic_node_month_usd,
            store_month_usd=store_month_usd,
        ),
    )
    # The replays' workers start now, so that their imports, and then the decision's
    # error band, run beside this process's import of the report and its read of the log.
    replayer = LocalReplayer(opts.ingest.jobs)
    if opts.size_search:
        replayer.start()
        if replayer.workers is not None:
            warm_default_check(replayer.workers)
    from analyzer.cli.output import report_console, write_text
    from analyzer.progress import progress
    from analyzer.report import ReportDocument, render_json, write_reports

    # Each stage shows its own progress bar (rich allows one live display at a time).
    document = ReportDocument.of(run_analysis([str(p) for p in inputs], opts, replayer=replayer))
    paths: Mapping[str, Path | str]
    written: dict[str, Path] = {}
    with progress("writing reports", None):
        if remote is not None:
            paths = _write_remote_reports(document, remote[0], pdf=pdf)
        else:
            paths = written = write_reports(document, out, pdf=pdf, force=force)
    console = report_console(json_out)
    if remote is not None:
        if remote[1] is not None:
            console.print(f"[yellow]{terminal(remote[1])} (--force overwrites)[/]", highlight=False)
    elif written["json"].parent != out:
        console.print(
            f"[yellow]{terminal(str(out))} already holds files; wrote to "
            f"{terminal(str(written['json'].parent))} instead (--force overwrites)[/]",
            highlight=False,
        )
    print_summary(console, document.report, paths)
    if json_out is not None:
        write_text(json_out, render_json(document), force=force)
    if pdf and "pdf" not in paths:
        console.print("[yellow]no PDF: Chromium is not installed (/usr/bin/chromium)[/]")


def _write_remote_reports(document: ReportDocument, url: str, *, pdf: bool) -> dict[str, str]:
    """The reports written into a private local folder, then uploaded under ``url`` all
    together (each file to a temporary key first; analyzer/storage.py)."""
    from analyzer.report import write_reports
    from analyzer.storage import public, staged_output

    with staged_output(url, reports=True) as local:
        local.mkdir()
        written = write_reports(document, local, pdf=pdf, force=True)
    return {k: f"{public(url)}/{Path(v).relative_to(local).as_posix()}" for k, v in written.items()}


def print_summary(console: Console, doc: ReportView, paths: Mapping[str, Path | str]) -> None:
    from rich.table import Table

    from analyzer.advisor.figures import Verdict
    from analyzer.advisor.words import listed
    from analyzer.cli.output import console as make_console
    from analyzer.report.cells import gbps, num
    from analyzer.report.figures import VERDICT_TEXT
    from analyzer.report.log_sections import key_figures
    from analyzer.report.summary import economics_table, summary_sentences, undefined_notes

    for sentence in doc.summary or summary_sentences(doc):
        console.print(sentence, highlight=False, markup=False)
    console.print()
    v = doc.verdict
    color = {
        Verdict.DEPLOY_POOLED: "green",
        Verdict.LOCAL_OFFLOAD_ONLY: "blue",
        Verdict.NOT_WORTH_IT: "yellow",
        Verdict.CANNOT_MEET_SLO: "red",
    }.get(v.verdict, "white")
    console.print(
        f"[bold {color}]{v.verdict}[/]  {VERDICT_TEXT.get(v.verdict, '')}", highlight=False
    )
    for r in v.reasons:
        console.print(f"  - {r}", highlight=False, markup=False)
    console.print(f"  {v.confidence_statement}", highlight=False, markup=False)
    # Warnings are whole sentences on stderr, never cut by the tables' width.
    err = make_console(stderr=True)
    for w in doc.warnings:
        err.print(f"warning: {scrub(w)}", highlight=False, markup=False, soft_wrap=True)
    mini = doc.replay.miniature if doc.replay is not None else None
    if mini:
        from analyzer.replay.miniature import describe

        console.print(describe(dict(mini)), highlight=False, markup=False)
    kf = key_figures(doc)
    t = Table(*kf.header, box=None, pad_edge=False)
    for row in kf.rows:
        t.add_row(*map(terminal, row))
    console.print(t)
    et = economics_table(doc)
    if et:
        header, rows = et
        keep = [0, 1, 2, 3, 6, 7]  # option, GPUs, nodes, TTFT, total, net
        t = Table(*[header[i] for i in keep], box=None, pad_edge=False)
        for row in rows:
            t.add_row(*[terminal(row[i]) for i in keep])
        console.print(t)
        for note in undefined_notes(doc, side_by_side=False):  # the table shown
            console.print(f"  {note}", highlight=False, markup=False)
    sz = doc.sizing
    if sz is not None:
        mine = [p for p in doc.plans if p.option == doc.verdict.scenario]
        # a log of several models: the sizing is its most requested's (the first plan)
        of = f" of {mine[0].model}" if len(mine) > 1 else ""
        console.print(
            f"Sizing{of}: {sz.instances} instance{'' if sz.instances == 1 else 's'} on "
            f"{sz.nodes} node{'' if sz.nodes == 1 else 's'}, pool {num(sz.pool_capacity_gb)} GB, "
            f"host DRAM {num(sz.dram_per_node_gb)} GB per node, network "
            f"{gbps(sz.network_per_node_gbps)} per node ({sz.nic}), block {sz.block_size_tokens}, "
            f"chunk {sz.chunk_size_tokens}, router {sz.router}, eviction {sz.eviction}",
            highlight=False,
            markup=False,
        )
    iso = doc.isolation
    if iso is not None:
        said = iso.sentence[:1].upper() + iso.sentence[1:]
        keyed = "shared across tenants" if iso.policy == "shared" else f"keyed by {iso.policy}"
        console.print(f"Tenant isolation ({keyed}): {said}.", highlight=False, markup=False)
    flips = [r for r in doc.sensitivity.rows if r.flips]
    if flips:
        console.print(
            "Flips: "
            + listed([f"{r.dimension} {r.value} gives {r.verdict}" for r in flips], most=6),
            highlight=False,
            markup=False,
        )
    console.print(
        "Reports: " + ", ".join(terminal(str(p)) for p in paths.values()), highlight=False
    )


def validate(
    results: Annotated[
        list[str] | None,
        typer.Argument(
            help="Benchmark results: vLLM `bench serve --save-result` JSON or CSV; ROLE=PATH to name the role "
            "(baseline, candidate, stability), and `kvpool probe -o` results for the "
            "isolation gate; '-' reads one from stdin.",
        ),
    ] = None,
    *,
    report: Annotated[
        Path,
        typer.Option(
            "--report",
            help="The report.json written by `kvpool analyze` ('-': stdin; s3://... ok).",
            parser=o.path_or_url,
        ),
    ],
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Write the validation as JSON here ('-': stdout).", parser=o.path_or_url
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Write through a symlinked output path.")
    ] = False,
    prometheus: Annotated[
        list[str] | None,
        typer.Option(
            "--prometheus",
            metavar="[ROLE=]URL|FILE",
            help="Engine counters (vLLM, SGLang, LMCache) as measured truth: a Prometheus "
            "server (http://HOST:9090, queried over --window), an engine's /metrics URL or a "
            "saved exposition (one: the engines' lifetime; two for a role: before and "
            "after). ROLE: candidate (default), baseline, or isolation (two snapshots around "
            "`kvpool probe`'s other-salt requests). Repeatable.",
        ),
    ] = None,
    window: Annotated[
        str | None,
        typer.Option(
            "--window",
            help="The window queried from a Prometheus server (300, 15m, 1h; default 1h), or "
            "the time between two saved expositions (for request throughput).",
        ),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="End of the Prometheus window: Unix seconds or ISO 8601 (default: now).",
        ),
    ] = None,
) -> None:
    """Compare measured pilot results with the projection and the gates (exit 5 if a gate fails)."""
    import json

    from rich.table import Table

    from analyzer.advisor.engine_metrics import is_http, parse_duration
    from analyzer.advisor.validate import validate as run_validate
    from analyzer.cli.output import is_stdio, report_console, write_text
    from analyzer.cli.stdio import stdin_inputs
    from analyzer.errors import shown
    from analyzer.outputs import check_output

    results = list(results or [])
    engine_sources = _engine_sources(prometheus or [])
    window_s = None if window is None else parse_duration(window)
    paths = [o.path_or_url(r.split("=", 1)[-1]) for r in results]
    files = [o.path_or_url(src) for _, src in engine_sources if not is_http(src)]
    if json_out is not None and not is_stdio(json_out):
        check_output(json_out, force=force, inputs=[report, *paths, *files])
    with stdin_inputs([report, *paths, *files]) as (report, *copies):  # '-': stdin
        results = [
            r[: len(r) - len(str(p))] + str(c)
            for r, p, c in zip(results, paths, copies[: len(paths)], strict=True)
        ]
        local = iter(copies[len(paths) :])
        engine = _engine_windows(
            engine_sources,
            {src: str(next(local)) for _, src in engine_sources if not is_http(src)},
            str(report),
            window_s,
            _at(at),
        )
        v = run_validate(list(results), str(report), engine[0], engine[1])
    console = report_console(json_out)
    console.print(f"Report verdict: [bold]{terminal(v.verdict)}[/]", highlight=False)
    for m in v.measured:
        console.print(f"  {m.role}: {terminal(shown(m.path))} ({m.fmt})", highlight=False)
    t = Table("Gate", "Status", "Criterion", "Result", "Measured", "Threshold")
    style = {"pass": "green", "fail": "red", "partial": "yellow", "not-run": "dim"}
    for g in v.gates:
        for i, r in enumerate(g.results):
            res = {True: "pass", False: "FAIL", None: "not measured"}[r.passed]
            t.add_row(
                terminal(g.gate.name) if i == 0 else "",
                f"[{style[g.status]}]{g.status}[/]" if i == 0 else "",
                terminal(r.criterion.text),
                res,
                "-" if r.measured is None else f"{r.measured:.4g}",
                f"{r.criterion.op} {r.criterion.threshold:g}",
            )
    console.print(t)
    for c in v.comparisons:
        console.print(
            f"  {terminal(c.metric)}: measured {c.measured:.4g} vs projected {c.projected:.4g}",
            highlight=False,
        )
    if v.engine:
        _print_engine(console, v.engine)
    if json_out is not None:
        write_text(json_out, json.dumps(v.to_json(), sort_keys=True, indent=2) + "\n", force=force)
    if v.failed:
        failed = ", ".join(terminal(g.gate.name) for g in v.gates if g.status == "fail")
        console.print(f"[bold red]gate failed:[/] {failed}", highlight=False)
        raise typer.Exit(EXIT_GATES)
    console.print("[bold green]no gate failed[/] (gates without measurements are not run)")


ENGINE_ROLES = ("candidate", "baseline", "stability", "isolation")


def _engine_sources(values: list[str]) -> list[tuple[str, str]]:
    """``[ROLE=]SOURCE`` -> (role, source); the role is ``candidate`` unless named."""
    from analyzer.errors import UsageError

    out = []
    for v in values:
        head, sep, tail = v.partition("=")
        if sep and head in ENGINE_ROLES:
            if not tail.strip():
                raise UsageError(f"--prometheus {v!r} names no source: write {head}=URL|FILE")
            out.append((head, tail))
        else:
            out.append(("candidate", v))
    return out


def _at(value: str | None) -> float | None:
    """``--at``: Unix seconds or an ISO 8601 time (UTC unless it says)."""
    if value is None:
        return None
    import datetime as dt

    from analyzer.errors import UsageError

    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"--at {value!r}: expected Unix seconds or an ISO 8601 time") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def _engine_windows(
    sources: list[tuple[str, str]],
    local: dict[str, str],
    report: str,
    window_s: float | None,
    at: float | None,
) -> tuple[tuple[EngineMeasurement, ...], float]:
    """Each role's engine window compared with the report's projection, and the
    tolerance of the comparisons (the report's own)."""
    if not sources:
        return (), 0.05
    from analyzer.advisor.engine_metrics import (
        EngineMeasurement,
        EngineProjection,
        compare,
        read_window,
    )
    from analyzer.report.document import ReportDocument
    from analyzer.report.projection import engine_projection
    from analyzer.storage import public

    # The isolation role tests no projection: every hit in its window is a leak.
    if all(r == "isolation" for r, _ in sources):
        projection = EngineProjection(None, None)
    else:
        projection = engine_projection(ReportDocument.load(report).report)
    out = []
    for role in ENGINE_ROLES:
        mine = [(local.get(src, src), public(src)) for r, src in sources if r == role]
        if not mine:
            continue
        w = read_window(mine, window_s, at)
        checks, criteria = compare(role, w, projection)
        out.append(EngineMeasurement(role, w, checks, criteria))
    return tuple(out), projection.tolerance


def _print_engine(console: Console, engine: tuple[EngineMeasurement, ...]) -> None:
    from rich.table import Table

    for e in engine:
        w = e.window
        if w.kind == "prometheus":
            span = f"the last {w.window_s or 0:g} s"
        elif w.kind == "window":
            span = "between the two snapshots"
        else:
            span = "the engines' lifetime (one snapshot)"
        console.print(
            f"Engine counters ({e.role}): {terminal(w.source)}, {len(w.instances)} instance(s), "
            f"{span}",
            highlight=False,
        )
        t = Table("Instance", "Engine", "Figure", "Measured", "Projected", "Decides")
        for c in e.checks:
            fmt = "{:.4g}" if "TTFT" in c.metric else "{:.1%}"
            t.add_row(
                terminal(c.instance),
                terminal(c.engine),
                terminal(c.metric),
                "-" if c.measured is None else fmt.format(c.measured),
                "-" if c.projected is None else fmt.format(c.projected),
                c.gate or "",
            )
        console.print(t)


def register(app: typer.Typer) -> None:
    """Add this command group to the ``kvpool`` app."""
    app.command("analyze")(analyze)
    app.command("validate")(validate)
