"""`kvpool analyze` (log -> verdict and reports) and `kvpool validate` (pilot results
against the report's gates)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from analyzer.errors import EXIT_GATES


def _capacity(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    from analyzer.replay import parse_capacity

    return parse_capacity(value, flag)


def analyze(
    inputs: Annotated[
        list[Path],
        typer.Argument(help="Request logs or traces (any format `kvpool convert` reads)."),
    ],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="Directory for report.html, report.md, report.json.")
    ],
    model: Annotated[
        str, typer.Option("--model", help="Catalog model id or a config.json path.")
    ] = "llama-3.1-8b",
    gpu: Annotated[str, typer.Option("--gpu", help="Catalog GPU id.")] = "h100",
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs per instance.")] = 1,
    instances: Annotated[
        int, typer.Option("--instances", help="Prefill instances in the cluster.")
    ] = 4,
    gpus_per_node: Annotated[
        int, typer.Option("--gpus-per-node", help="GPUs sharing one host (DRAM, NIC).")
    ] = 8,
    dram_scope: Annotated[
        str,
        typer.Option(
            "--dram-scope",
            help="instance: each engine process holds a private share of its node's DRAM "
            "(LMCache local CPU, HiCache L2); node: one DRAM cache shared by the node's "
            "instances (a node-local shared store).",
        ),
    ] = "instance",
    pool_gbps: Annotated[
        float, typer.Option("--pool-gbps", help="Per-node link to the pool, GB/s (1e9 B/s).")
    ] = 25.0,
    local_capacity_tokens: Annotated[
        str | None,
        typer.Option(
            "--local-capacity-tokens",
            help="HBM prefix cache per instance (default: from the model and GPU).",
        ),
    ] = None,
    dram_capacity_tokens: Annotated[
        str | None,
        typer.Option(
            "--dram-capacity-tokens",
            help="Host DRAM given to KV per node, all its instances together "
            "(default: 512 GB of KV).",
        ),
    ] = None,
    pool_capacity_tokens: Annotated[
        str | None,
        typer.Option(
            "--pool-capacity-tokens",
            help="Whole pool (default: the nodes' DRAM, summed); 'unbounded' allowed.",
        ),
    ] = None,
    router: Annotated[
        str, typer.Option("--router", help="round-robin | least-loaded | session | prefix-aware")
    ] = "prefix-aware",
    ttft_slo: Annotated[
        float, typer.Option("--ttft-slo", help="p90 TTFT SLO in seconds for the rate search.")
    ] = 2.0,
    warmup: Annotated[
        float, typer.Option("--warmup", help="Fraction of requests that only warm the caches.")
    ] = 0.5,
    block_size: Annotated[
        int | None,
        typer.Option("--block-size", help="Block size in tokens (default: 16 for text logs)."),
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="Input format (default: detected per file).")
    ] = None,
    kv_dtype: Annotated[
        str, typer.Option("--kv-dtype", help="KV cache dtype: bf16 | fp8.")
    ] = "bf16",
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer",
            help="cl100k (default), PATH/tokenizer.json, or a Hugging Face model folder (tokenizer.json + tokenizer_config.json): its chat template renders the prompts.",
        ),
    ] = "cl100k",
    no_rate_search: Annotated[
        bool, typer.Option("--no-rate-search", help="Skip the SLO rate search (faster).")
    ] = False,
    pdf: Annotated[
        bool,
        typer.Option("--pdf", help="Also print report.pdf with headless Chromium, if installed."),
    ] = False,
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
        typer.Option("--prices", help="A price file in the layout of models/prices.toml."),
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
) -> None:
    """Log to decision: reuse, break-even, replay, verdict, sized settings and pilot gates."""
    from rich.console import Console

    from analyzer.advisor.figures import Thresholds
    from analyzer.advisor.pipeline import AnalyzeOptions, run_analysis
    from analyzer.cost.prices import PriceOverrides
    from analyzer.progress import progress
    from analyzer.report import write_reports

    opts = AnalyzeOptions(
        model=model,
        gpu=gpu,
        tp=tp,
        instances=instances,
        gpus_per_node=gpus_per_node,
        dram_scope=dram_scope,
        kv_dtype=kv_dtype,
        pool_gbps=pool_gbps,
        local_capacity_tokens=_capacity(local_capacity_tokens, "--local-capacity-tokens"),
        dram_capacity_tokens=_capacity(dram_capacity_tokens, "--dram-capacity-tokens"),
        pool_capacity_tokens=_capacity(pool_capacity_tokens, "--pool-capacity-tokens"),
        router=router,
        ttft_slo_s=ttft_slo,
        warmup=warmup,
        block_size=block_size,
        fmt=fmt,
        tokenizer=tokenizer,
        search_rate=not no_rate_search,
        thresholds=Thresholds(objective=objective, min_pool_saving=pool_margin),
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
    # Each stage shows its own progress bar (rich allows one live display at a time).
    doc = run_analysis([str(p) for p in inputs], opts).to_json()
    with progress("writing reports", None):
        paths = write_reports(doc, out, pdf=pdf)
    console = Console()
    print_summary(console, doc, paths)
    if pdf and "pdf" not in paths:
        console.print("[yellow]no PDF: Chromium is not installed (/usr/bin/chromium)[/]")


def print_summary(console, doc: dict, paths: dict) -> None:
    from rich.table import Table

    from analyzer.advisor.summary import economics_table, summary_sentences
    from analyzer.report.render import VERDICT_TEXT, gbps, key_figures, num

    for sentence in doc.get("summary") or summary_sentences(doc):
        console.print(sentence, highlight=False, markup=False)
    console.print()
    v = doc["verdict"]
    color = {"deploy-pooled": "green", "local-offload-only": "blue", "not-worth-it": "yellow"}.get(
        v["verdict"], "white"
    )
    console.print(
        f"[bold {color}]{v['verdict']}[/]  {VERDICT_TEXT.get(v['verdict'], '')}", highlight=False
    )
    for r in v["reasons"]:
        console.print(f"  - {r}", highlight=False, markup=False)
    console.print(f"  {v['confidence_statement']}", highlight=False, markup=False)
    kf = key_figures(doc)
    t = Table(*kf.header, box=None, pad_edge=False)
    for row in kf.rows:
        t.add_row(*row)
    console.print(t)
    et = economics_table(doc)
    if et:
        header, rows = et
        keep = [0, 1, 2, 6, 7]  # option, GPUs (mean, busiest), total, net
        t = Table(*[header[i] for i in keep], box=None, pad_edge=False)
        for row in rows:
            t.add_row(*[row[i] for i in keep])
        console.print(t)
    sz = doc.get("sizing")
    if sz:
        console.print(
            f"Sizing: pool {num(sz['pool_capacity_gb'])} GB, host DRAM {num(sz['dram_per_node_gb'])} "
            f"GB/node, network {gbps(sz['network_per_node_gbps'])} per node ({sz['nic']}), block "
            f"{sz['block_size_tokens']}, chunk {sz['chunk_size_tokens']}, router {sz['router']}, "
            f"eviction {sz['eviction']}",
            highlight=False,
            markup=False,
        )
    flips = [r for r in (doc.get("sensitivity") or {}).get("rows", []) if r["flips"]]
    if flips:
        console.print(
            "Flips: "
            + "; ".join(f"{r['dimension']} {r['value']} -> {r['verdict']}" for r in flips[:6]),
            highlight=False,
            markup=False,
        )
    console.print("Reports: " + ", ".join(str(p) for p in paths.values()), highlight=False)


def validate(
    results: Annotated[
        list[str],
        typer.Argument(
            help="Benchmark results: vLLM `bench serve --save-result` JSON or CSV; ROLE=PATH to name the role "
            "(baseline, candidate, stability).",
        ),
    ],
    report: Annotated[
        Path, typer.Option("--report", help="The report.json written by `kvpool analyze`.")
    ],
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the validation as JSON here.")
    ] = None,
) -> None:
    """Compare measured pilot results with the projection and the gates (exit 5 if a gate fails)."""
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from analyzer.advisor.validate import validate as run_validate
    from analyzer.errors import OutputError

    v = run_validate(list(results), str(report))
    console = Console()
    console.print(f"Report verdict: [bold]{v.verdict}[/]", highlight=False)
    for m in v.measured:
        console.print(f"  {m.role}: {m.path} ({m.fmt})", highlight=False, markup=False)
    t = Table("Gate", "Status", "Criterion", "Result", "Measured", "Threshold")
    style = {"pass": "green", "fail": "red", "partial": "yellow", "not-run": "dim"}
    for g in v.gates:
        for i, r in enumerate(g.results):
            res = {True: "pass", False: "FAIL", None: "not measured"}[r.passed]
            t.add_row(
                g.gate.name if i == 0 else "",
                f"[{style[g.status]}]{g.status}[/]" if i == 0 else "",
                escape(r.criterion.text),
                escape(res),
                "-" if r.measured is None else f"{r.measured:.4g}",
                f"{r.criterion.op} {r.criterion.threshold:g}",
            )
    console.print(t)
    for c in v.comparisons:
        console.print(
            f"  {c['metric']}: measured {c['measured']:.4g} vs projected {c['projected']:.4g}",
            highlight=False,
        )
    if json_out is not None:
        try:
            json_out.write_text(
                json.dumps(v.to_json(), sort_keys=True, indent=2) + "\n", encoding="utf-8"
            )
        except OSError as exc:
            raise OutputError(f"cannot write {json_out}: {exc.strerror or exc}") from exc
    if v.failed:
        failed = ", ".join(g.gate.name for g in v.gates if g.status == "fail")
        console.print(f"[bold red]gate failed:[/] {failed}", highlight=False)
        raise typer.Exit(EXIT_GATES)
    console.print("[bold green]no gate failed[/] (gates without measurements are not run)")


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the ``kvpool`` app."""
    app.command("analyze")(analyze)
    app.command("validate")(validate)
