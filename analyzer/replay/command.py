"""``kvpool replay``: the trace through private caches and a pooled store, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from analyzer.errors import OutputError, UsageError

_CAPACITY_HELP = "tokens, 1e6 style accepted, or 'unbounded'"


def _fmt_rate(v: float | None, capped: bool) -> str:
    if v is None:
        return "-"
    return (">=" if capped else "") + f"{v:.2f}x"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f}"


def render_table(doc: dict):  # -> rich.table.Table
    """A readable table of the replay JSON: one column per scenario, one row per figure
    (so that it fits a narrow terminal)."""
    from rich.table import Table

    scen = doc["scenarios"]
    table = Table(title="Cluster replay", title_justify="left")
    table.add_column("", no_wrap=True)
    for name in scen:
        table.add_column(name, justify="right", no_wrap=True)

    def ttft(s: dict, key: str) -> str:
        v = s["ttft_s"][key]
        return "-" if v is None else f"{v:.2f}"

    rows: list[tuple[str, object]] = [
        ("hit rate", lambda s: f"{s['hit_rate']:.1%}"),
    ]
    for tier in ("hbm", "dram", "nvme", "pool"):
        if any(s["hit_rate_by_tier"][tier] for s in scen.values()):
            rows.append((f"  from {tier}", lambda s, t=tier: f"{s['hit_rate_by_tier'][t]:.1%}"))
    rows += [
        ("TTFT mean s", lambda s: ttft(s, "mean")),
        ("TTFT p50 s", lambda s: ttft(s, "p50")),
        ("TTFT p90 s", lambda s: ttft(s, "p90")),
        ("TTFT p99 s", lambda s: ttft(s, "p99")),
        ("prefill GPU-s", lambda s: f"{s['prefill_gpu_s']:,.0f}"),
        ("network GB", lambda s: _gb(s["network_bytes"])),
        ("peak link util.", lambda s: f"{s['peak_link_utilisation']:.0%}"),
        ("dup. KV GB (avg)", lambda s: _gb(s["duplicated_kv_bytes"]["time_avg"])),
        (
            "max rate @SLO",
            lambda s: _fmt_rate(
                s["max_rate_scale_at_slo"], bool((s.get("rate_search") or {}).get("capped"))
            ),
        ),
    ]
    for label, fn in rows:
        table.add_row(label, *(fn(s) for s in scen.values()))  # type: ignore[operator]
    return table


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the ``kvpool`` app."""

    @app.command("replay")
    def replay(
        inputs: Annotated[
            list[Path], typer.Argument(help="Request logs, traces or canonical .parquet.")
        ],
        model: str = typer.Option(
            ..., "--model", help="Model name from the catalog or a config.json."
        ),
        gpu: str = typer.Option(..., "--gpu", help="GPU name from the catalog (h100, h200, ...)."),
        instances: int = typer.Option(..., "--instances", help="Prefill instances in the cluster."),
        tp: int = typer.Option(1, "--tp", help="Tensor-parallel GPUs per instance."),
        gpus_per_node: int = typer.Option(
            8, "--gpus-per-node", help="GPUs per host: the instances on one share its DRAM."
        ),
        dram_scope: str = typer.Option(
            "instance",
            "--dram-scope",
            help="instance: each engine process holds a private share of its node's DRAM "
            "(LMCache local CPU, HiCache L2); node: one DRAM cache shared by the node's "
            "instances (a node-local shared store).",
        ),
        router: str = typer.Option(
            "prefix-aware",
            "--router",
            help="round-robin | least-loaded | session | prefix-aware.",
        ),
        scenarios: str = typer.Option(
            "none,local,local+dram,pooled",
            "--scenarios",
            help="Comma-separated scenario names (standard or from --config).",
        ),
        local_capacity: str = typer.Option(
            None,
            "--local-capacity-tokens",
            help=f"HBM prefix cache per instance ({_CAPACITY_HELP}).",
        ),
        dram_capacity: str = typer.Option(
            None,
            "--dram-capacity-tokens",
            help=f"Host DRAM given to KV per node, all its instances together ({_CAPACITY_HELP}).",
        ),
        pool_capacity: str = typer.Option(
            None, "--pool-capacity-tokens", help=f"Whole pooled store ({_CAPACITY_HELP})."
        ),
        pool_gbps: float = typer.Option(
            None, "--pool-gbps", help="Pool link bandwidth per node, GB/s (default: catalog tier)."
        ),
        config: Annotated[
            Path | None,
            typer.Option(
                "--config", help="TOML or JSON file with user-defined [[scenario]] entries."
            ),
        ] = None,
        time_scale: float = typer.Option(
            1.0, "--time-scale", help="Multiply inter-arrival times (0.5 = twice the rate)."
        ),
        ttft_slo: float = typer.Option(2.0, "--ttft-slo", help="p90 TTFT target in seconds."),
        eviction: str = typer.Option("lru", "--eviction", help="lru | fifo."),
        write_policy: str = typer.Option(
            "write-through", "--write-policy", help="write-through | on-evict."
        ),
        block_size: int = typer.Option(
            None, "--block-size", help="Tokens per block (default: the input's own)."
        ),
        tokenizer: str = typer.Option(
            "cl100k",
            "--tokenizer",
            help="cl100k (default), PATH/tokenizer.json, or a Hugging Face model folder (tokenizer.json + tokenizer_config.json): its chat template renders the prompts.",
        ),
        warmup: float = typer.Option(
            0.0, "--warmup", help="Fraction of requests that warm the caches, not measured."
        ),
        search: bool = typer.Option(
            True, "--search/--no-search", help="Search the highest rate meeting the SLO."
        ),
        workers: int = typer.Option(
            0, "--workers", help="Processes running scenarios at once (0: half the CPUs)."
        ),
        json_out: Annotated[
            Path | None, typer.Option("--json", help="Write the full results as JSON.")
        ] = None,
    ) -> None:
        """Replay the trace through a model of the cluster, once per deployment option.

        Compares no cache, per-instance HBM caches, HBM plus host DRAM, and HBM plus a
        pooled store: hit rates by tier, TTFT, prefill GPU-seconds, link traffic,
        duplicated KV and the highest rate meeting the TTFT SLO. Decode is not modelled.
        """
        from rich.console import Console

        from analyzer.ingest import IngestOptions, open_trace
        from analyzer.progress import progress
        from analyzer.replay import (
            ClusterConfig,
            load_scenarios,
            parse_capacity,
            run_replay,
            select_scenarios,
        )
        from analyzer.replay.run import MAX_RUNS

        if block_size is not None and block_size < 1:
            raise UsageError("--block-size must be at least 1")
        caps = {
            "local_capacity_tokens": (local_capacity, "--local-capacity-tokens"),
            "dram_capacity_tokens": (dram_capacity, "--dram-capacity-tokens"),
            "pool_capacity_tokens": (pool_capacity, "--pool-capacity-tokens"),
        }
        cap_values = {k: parse_capacity(v, flag) for k, (v, flag) in caps.items() if v is not None}
        cfg = ClusterConfig(
            model=model,
            gpu=gpu,
            tp=tp,
            instances=instances,
            gpus_per_node=gpus_per_node,
            dram_scope=dram_scope,
            router=router,
            eviction=eviction,
            write_policy=write_policy,
            pool_gbps=pool_gbps,
            time_scale=time_scale,
            warmup_fraction=warmup,
            **cap_values,
        )
        extra = load_scenarios(config) if config is not None else []
        specs = select_scenarios(scenarios, extra)
        # Fail on an unknown model/GPU before reading a large trace.
        from analyzer.cost import CostModel

        CostModel.from_catalog(model, gpu, tp=tp, kv_dtype=cfg.kv_dtype, mfu=cfg.mfu)

        total_bytes = sum(p.stat().st_size for p in inputs if p.is_file())
        with progress("reading", total_bytes or None, unit="bytes") as advance:
            loaded = open_trace(
                inputs, IngestOptions(block_size=block_size, tokenizer=tokenizer), advance=advance
            )
        trace = loaded.trace
        console = Console(stderr=True)
        if loaded.skipped.total:
            console.print(f"[yellow]skipped {loaded.skipped}[/]", highlight=False)
        if trace.count_only:
            console.print(
                "[yellow]this trace has lengths only (no prefix hashes): no request can hit "
                "a cache, so every scenario shows the no-cache timing[/]"
            )
        if workers < 0:
            raise UsageError("--workers must be 0 (auto) or more")
        if workers == 0:
            import os

            workers = max(1, min(len(specs), (os.cpu_count() or 2) // 2))
        runs = 1 + (MAX_RUNS if search else 0)
        with progress(
            "replaying", trace.n_requests * len(specs) * runs or None, unit="requests"
        ) as advance:
            result = run_replay(
                trace,
                cfg,
                scenarios=specs,
                ttft_slo_s=ttft_slo,
                search_rate=search,
                advance=advance,
                workers=workers,
            )
        doc = result.to_json()
        doc["inputs"] = [str(p) for p in inputs]
        doc["skipped"] = loaded.skipped.total
        Console().print(render_table(doc))
        Console().print(
            f"{trace.n_requests:,} requests, block size {trace.block_size}, "
            f"{cfg.instances} x {cfg.tp} {gpu} ({model}); max rate: highest multiple of the "
            f"trace's arrival rate with p90 TTFT <= {ttft_slo:g} s. Decode is not modelled.",
            highlight=False,
        )
        if json_out is not None:
            try:
                json_out.parent.mkdir(parents=True, exist_ok=True)
                json_out.write_text(json.dumps(doc, indent=2) + "\n")
            except OSError as exc:
                raise OutputError(f"cannot write {json_out}: {exc.strerror or exc}") from exc
