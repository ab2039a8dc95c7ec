"""``kvpool replay``: the trace through private caches and a pooled store, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from analyzer.cli import options as o
from analyzer.cli.stdio import stdin_options
from analyzer.errors import UsageError
from analyzer.quoting import scrub, terminal

if TYPE_CHECKING:
    from rich.table import Table


def _fmt_rate(v: float | None, capped: bool) -> str:
    if v is None:
        return "-"
    return (">=" if capped else "") + f"{v:.2f}x"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f}"


def render_table(doc: dict[str, Any]) -> Table:
    """A readable table of the replay JSON: one column per scenario, one row per figure
    (so that it fits a narrow terminal)."""
    from rich.table import Table

    scen = doc["scenarios"]
    table = Table(title="Cluster replay", title_justify="left")
    table.add_column("", no_wrap=True)
    for name in scen:  # a --config file names its scenarios
        table.add_column(terminal(name), justify="right", no_wrap=True)

    def ttft(s: dict[str, Any], key: str) -> str:
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
    ]
    if any("serving" in s for s in scen.values()):

        def tpot(s: dict[str, Any], key: str) -> str:
            v = (s.get("serving") or {}).get("tpot_s", {}).get(key)
            return "-" if v is None else f"{v * 1e3:.1f}"

        rows += [
            ("TPOT p50 ms", lambda s: tpot(s, "p50")),
            ("TPOT p90 ms", lambda s: tpot(s, "p90")),
            ("preemptions", lambda s: f"{(s.get('serving') or {}).get('preemptions', 0):,}"),
        ]
    if any("decode_pool" in s for s in scen.values()):

        def decode(s: dict[str, Any], key: str, unit: float, fmt: str) -> str:
            v = (s.get("decode_pool") or {}).get(key)
            return "-" if v is None else format(v * unit, fmt)

        rows += [
            ("decode GPUs", lambda s: decode(s, "gpus", 1, ",")),
            ("decode TPOT ms", lambda s: decode(s, "tpot_s", 1e3, ".1f")),
        ]
    rows += [
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


def _serving_line(doc: dict[str, Any]) -> str:
    """How the instances served, as the table's footnote says it."""
    first: dict[str, Any] = next(iter(doc["scenarios"].values()), {})
    serving = first.get("serving")
    if serving is None:
        if "decode_pool" not in first:
            return "Decode is not modelled (a disaggregated prefill pool)."
        return (
            "Disaggregated serving: the instances replayed prefill only; decode runs on a "
            "separate pool of the same GPUs and TP (decode GPUs), the fewest instances that "
            "generate the log's output tokens at its arrival rate within their KV pools "
            "(decode TPOT at that batch)."
        )
    drawn = serving["outputs_drawn"]
    return (
        "Aggregated serving: prefill and decode share each instance's continuous batch "
        f"(steps of up to {serving['max_num_batched_tokens']:,} tokens, up to "
        f"{serving['max_num_seqs']:,} requests running, "
        f"a KV pool of {serving['kv_pool_tokens_per_instance']:,} tokens "
        f"per instance); step times from {serving['step_model']}"
        + (f"; {drawn:,} output lengths not in the log were drawn." if drawn else ".")
    )


def register(app: typer.Typer) -> None:
    """Add this command group to the ``kvpool`` app."""
    app.command("replay")(replay)


@o.ingest_flags
@o.cluster_flags
@stdin_options("config")
def replay(
    inputs: o.Inputs,
    *,
    cluster: o.ClusterFlags,
    scenarios: Annotated[
        str,
        typer.Option(
            "--scenarios", help="Comma-separated scenario names (standard or from --config)."
        ),
    ] = "none,local,local+dram,pooled",
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="TOML or JSON file with user-defined [[scenario]] entries ('-': stdin).",
        ),
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option("--time-scale", help="Multiply inter-arrival times (0.5 = twice the rate)."),
    ] = 1.0,
    ttft_slo: o.TtftSlo = 2.0,
    full_replay: o.FullReplay = False,
    search: Annotated[
        bool, typer.Option("--search/--no-search", help="Search the highest rate meeting the SLO.")
    ] = True,
    workers: Annotated[
        int,
        typer.Option("--workers", help="Processes running scenarios at once (0: half the CPUs)."),
    ] = 0,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Write the full results as JSON here ('-': stdout).",
            parser=o.path_or_url,
        ),
    ] = None,
    ingest: o.IngestFlags,
    isolation: o.Isolation = "shared",
    force: o.Force = False,
    keep_names: o.KeepNames = False,
) -> None:
    """Replay the trace through a model of the cluster, once per deployment option.

    Compares no cache, per-instance HBM caches, HBM plus host DRAM, and HBM plus a
    pooled store: hit rates by tier, TTFT, prefill GPU-seconds, link traffic,
    duplicated KV and the highest rate meeting the TTFT SLO. Each instance runs prefill
    and decode in one continuous batch, as vLLM and SGLang serve (TPOT is reported too);
    --serving disaggregated replays a prefill pool alone and sizes its decode pool.
    """
    from rich.console import Console

    from analyzer.cli.output import is_stdio, report_console, write_json
    from analyzer.ingest import open_trace
    from analyzer.progress import progress
    from analyzer.replay import load_scenarios, run_replay, select_scenarios
    from analyzer.replay.run import MAX_RUNS

    if ingest.block_size is not None and ingest.block_size < 1:
        raise UsageError("--block-size must be at least 1")
    if json_out is not None and not is_stdio(json_out):  # fail before the long run
        from analyzer.outputs import check_output

        check_output(json_out, force=force, inputs=[*inputs, *([config] if config else [])])
    cfg = cluster.config(time_scale=time_scale)
    extra = load_scenarios(config) if config is not None else []
    specs = select_scenarios(scenarios, extra)
    # Fail on an unknown model/GPU, or a bad --workers, before reading a large trace.
    cm = cfg.cost_model()
    if workers < 0:
        raise UsageError("--workers must be 0 (auto) or more")
    if workers == 0:  # half the cores this process may use (a container's limit too)
        from analyzer.ingest.parallel import default_jobs

        workers = max(1, min(len(specs), default_jobs() // 2))

    with progress("reading", o.input_bytes(inputs) or None, unit="bytes") as advance:
        loaded = open_trace(inputs, ingest.options(keep_names=keep_names), advance=advance)
    # Every scenario replays the trace as the engines salted under --isolation see it.
    loaded = loaded.isolated(isolation)
    trace = loaded.trace
    console = Console(stderr=True)
    if cluster.model is None or cluster.tp is None:
        from analyzer.advisor.price import log_cluster

        cfg, note = log_cluster(
            cfg, loaded, model_given=cluster.model is not None, tp_given=cluster.tp is not None
        )
        cm = cfg.cost_model()
        if note:
            console.print(scrub(note), highlight=False, markup=False)
    if loaded.skipped.total:
        console.print(f"[yellow]skipped {terminal(str(loaded.skipped))}[/]", highlight=False)
    if trace.count_only:
        console.print(
            "[yellow]this trace has lengths only (no prefix hashes): no request can hit "
            "a cache, so every scenario shows the no-cache timing[/]"
        )
    runs = 1 + (MAX_RUNS if search else 0)
    with progress(
        "replaying", trace.n_requests * len(specs) * runs or None, unit="requests"
    ) as advance:
        result = run_replay(
            trace,
            cfg,
            cost=cm,
            scenarios=specs,
            ttft_slo_s=ttft_slo,
            search_rate=search,
            advance=advance,
            workers=workers,
            full_replay=full_replay,
        )
    from analyzer.cost.uncertainty import prefill_band
    from analyzer.errors import shown

    band = prefill_band(cm, int(trace.prompt_tokens.max()) if trace.n_requests else None)
    doc = result.to_json()
    doc["inputs"] = [
        shown(str(p)) if keep_names else f"input-{i + 1}" for i, p in enumerate(inputs)
    ]
    doc["skipped"] = loaded.skipped.total
    doc["error_band"] = band.to_json()
    doc["isolation"] = isolation
    out = report_console(json_out)
    out.print(render_table(doc))
    out.print(
        f"{trace.n_requests:,} requests, block size {trace.block_size}, "
        f"{cfg.instances} x {cfg.tp} {cfg.gpu} ({cfg.model}); max rate: highest multiple of the "
        f"trace's arrival rate with p90 TTFT <= {ttft_slo:g} s. " + _serving_line(doc),
    )
    out.print(
        f"The prefill inside every TTFT may be off by the cost model's measured error: "
        f"{band.describe()}; the true prefill time lies between {1 / band.high:.2f}x and "
        f"{1 / band.low:.2f}x of the modelled one.",
        highlight=False,
    )
    from analyzer.cli.reuse import isolation_line

    keys = trace.meta.get("hash_keys", "")
    out.print(isolation_line(isolation, keys), highlight=False, markup=False)
    if result.miniature is not None:
        out.print(result.miniature.describe(), highlight=False, markup=False)
    if json_out is not None:
        write_json(json_out, doc, ensure_ascii=True, force=force)
