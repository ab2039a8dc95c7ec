"""``kvpool cost``: catalogs, recompute-vs-load break-even, TTFT what-ifs and fits.

Imported on first use, inside the command bodies, not at the top (``kvpool --help`` must
stay under 0.3 s, tests/cli/test_cli_startup.py): the cost stage (``analyzer.cost.*``, which
loads numpy; scikit-learn, SciPy and PyTorch load later still, inside it) and
``rich.table``. Everything else is imported here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from analyzer.cli import options as o
from analyzer.cli.output import console as make_console
from analyzer.cli.output import report_console, write_text
from analyzer.cli.stdio import is_stdio, no_stdio, output_file, stdin_options
from analyzer.errors import UsageError
from analyzer.quoting import terminal

if TYPE_CHECKING:
    from rich.console import Console

    from analyzer.cost.hardware import TierSpec
    from analyzer.cost.model import CostModel

cost_app = typer.Typer(
    name="cost",
    help="Cost model: KV bytes, prefill speed, load time and the recompute-vs-load break-even.",
    no_args_is_help=True,
)

DEFAULT_PREFIXES = "1024,4096,16384,65536"

_JSON_HELP = "Also write the result as JSON to FILE ('-' for stdout)."


def register(app: typer.Typer) -> None:
    """Add this command group to the ``kvpool`` app."""
    app.add_typer(cost_app, name="cost")


# ---------------------------------------------------------------------------------------
# helpers


def _clean(value: object) -> object:
    """JSON-safe: infinities and NaN become null (never valid JSON numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _write_json(path: str | None, payload: Mapping[str, object]) -> None:
    if not path:
        return
    write_text(path, json.dumps(_clean(payload), indent=2, sort_keys=True, allow_nan=False) + "\n")


def _console(json_path: str | None) -> Console:
    """Tables on stdout, or on stderr when ``--json -`` puts the JSON there."""
    return report_console(json_path)


def _parse_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError as exc:
        raise UsageError(f"{flag} takes comma-separated integers, got '{text}'") from exc
    if not values or any(v <= 0 for v in values):
        raise UsageError(f"{flag} needs positive integers, got '{text}'")
    return values


def _cost_model(
    model: str | None,
    gpu: str | None,
    tp: int | None,
    kv_dtype: str | None,
    mfu: float | None,
    profile: str | None,
    weights_dtype: str | None = None,
) -> CostModel:
    from analyzer.cost.model import CostModel
    from analyzer.cost.profile_file import load_profile

    if profile:
        return load_profile(
            profile,
            model=model,
            gpu=gpu,
            tp=tp,
            kv_dtype=kv_dtype,
            mfu=mfu,
            weight_dtype=weights_dtype,
        )
    if not model or not gpu:
        raise UsageError("--model and --gpu are required (or --profile FILE)")
    return CostModel.from_catalog(
        model,
        gpu,
        tp=1 if tp is None else tp,
        kv_dtype=kv_dtype or "bf16",
        mfu=mfu,
        weight_dtype=o.weights_dtype(weights_dtype),
    )


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _fmt_s(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    return f"{t * 1e3:.2f} ms"


def _fmt_gbps(v: float | None) -> str:
    return "never" if v is None or not math.isfinite(v) else f"{v:.2f} GB/s"


def _fit_notes(fitted: tuple[str, ...], all_names: list[str], cv: float | None, n: int) -> str:
    kept = [c for c in all_names if c not in fitted]
    out = f"fitted {', '.join(fitted)} on {n} points"
    if kept:
        out += f"; kept from the catalog: {', '.join(kept)} (too few or too similar points)"
    out += "; cross-validated MAPE " + (f"{cv:.1%}" if cv is not None else "n/a (no spare point)")
    return out


# Typer option declarations shared by several commands.
_MODEL = typer.Option(None, "--model", "-m", help="Catalog id (e.g. llama-3.1-70b) or config.json.")
_GPU = typer.Option(None, "--gpu", "-g", help="Catalog GPU (a100, h100, h200, b200, mi300x, ...).")
_TP = typer.Option(None, "--tp", help="Tensor-parallel degree of one instance (default 1).")
_KV = typer.Option(None, "--kv-dtype", help="KV cache dtype: bf16 (default) or fp8.")
_WDT = typer.Option(
    None,
    "--weights-dtype",
    help="Deployment precision of the weights: bf16, fp8 or fp4 (default: the checkpoint's). "
    "GEMMs run at it where the GPU has tensor cores for it.",
)
_MFU = typer.Option(
    None,
    "--mfu",
    help="Price prefill with the plain roofline at this utilisation instead of the engine "
    "model fitted on models/measurements.toml.",
)
_PROFILE = typer.Option(
    None, "--profile", help="Fitted profile JSON from `kvpool cost fit` ('-': stdin)."
)
_JSON = typer.Option(None, "--json", help=_JSON_HELP)
_TIERS = typer.Option(
    None, "--tier", help="Tiers for the break-even (repeatable; default: all but hbm)."
)


# ---------------------------------------------------------------------------------------
# catalogs


@cost_app.command("models")
def models_cmd(json_path: str | None = _JSON) -> None:
    """List the model catalog: KV geometry and bytes per token (bf16 / fp8)."""
    from rich.table import Table

    from analyzer.cost.catalog import list_models

    models = list_models()
    table = Table(title="Model catalog (models/models.toml)")
    for col in ("id", "layers", "attention", "q/kv heads", "head dim", "KV B/token bf16"):
        table.add_column(col, justify="left" if col in ("id", "attention") else "right")
    table.add_column("fp8", justify="right")
    table.add_column("window / state", justify="left")
    table.add_column("params total/active", justify="right")
    for m in models:
        kinds = "MLA" if m.is_mla else ("MHA" if m.num_kv_heads == m.num_q_heads else "GQA")
        if m.linear_layers:
            kinds += "+linear"
        if m.is_moe:
            kinds += f" MoE {m.experts_per_token}/{m.num_experts}"
        extra = ""
        if m.sliding_layers:
            extra = f"{m.sliding_layers} x {m.sliding_window_tokens}-tok window, +{m.kv_window_bytes_per_token():,} B/tok"
        if m.linear_layers:
            extra = f"{m.linear_layers} linear, {_fmt_bytes(m.linear_state_bytes())}/request"
        table.add_row(
            m.id,
            str(m.num_layers),
            kinds,
            f"{m.num_q_heads}/{m.num_kv_heads}",
            f"latent {m.kv_lora_rank}+{m.qk_rope_head_dim}" if m.is_mla else str(m.head_dim),
            f"{m.kv_bytes_per_token('bf16'):,}",
            f"{m.kv_bytes_per_token('fp8'):,}",
            extra,
            f"{m.total_params / 1e9:.1f}B / {m.active_params / 1e9:.1f}B",
        )
    _console(json_path).print(table)
    _write_json(json_path, {"models": [m.to_json() for m in models]})


@cost_app.command("gpus")
def gpus_cmd(json_path: str | None = _JSON) -> None:
    """List the GPU catalog and the storage tiers / links with their defaults."""
    from rich.table import Table

    from analyzer.cost.catalog import list_gpus, list_tiers

    console = _console(json_path)
    gt = Table(title="GPUs (dense peak; models/hardware.toml)")
    for col in ("id", "name", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GiB", "HBM TB/s"):
        gt.add_column(col, justify="left" if col in ("id", "name") else "right")
    for g in list_gpus():
        gt.add_row(
            g.id,
            g.name,
            f"{g.bf16_tflops:g}",
            "-" if g.fp8_tflops is None else f"{g.fp8_tflops:g}",
            f"{g.hbm_gib:g}",
            f"{g.hbm_tbps:g}",
        )
    console.print(gt)
    tt = Table(title="Tiers and links (effective, defaults you can override)")
    for col in ("name", "kind", "GB/s", "first byte", "description"):
        tt.add_column(col, justify="right" if col in ("GB/s", "first byte") else "left")
    for t in list_tiers():
        tt.add_row(t.name, t.kind, f"{t.bandwidth_gbps:g}", _fmt_s(t.latency_s), t.description)
    console.print(tt)
    _write_json(
        json_path,
        {"gpus": [g.to_json() for g in list_gpus()], "tiers": [t.to_json() for t in list_tiers()]},
    )


# ---------------------------------------------------------------------------------------
# show


@cost_app.command("show")
@stdin_options("profile")
def show_cmd(
    model: str | None = _MODEL,
    gpu: str | None = _GPU,
    tp: int | None = _TP,
    kv_dtype: str | None = _KV,
    weights_dtype: str | None = _WDT,
    mfu: float | None = _MFU,
    profile: str | None = _PROFILE,
    prefixes: str = typer.Option(
        DEFAULT_PREFIXES, "--prefix-tokens", help="Prefix lengths to tabulate (comma-separated)."
    ),
    tiers: list[str] | None = _TIERS,
    link_gbps: float | None = typer.Option(
        None, "--link-gbps", help="Add your own link (GB/s, per instance) to the tier tables."
    ),
    link_latency_ms: float = typer.Option(
        0.0, "--link-latency-ms", help="First-byte latency of --link-gbps (ms)."
    ),
    json_path: str | None = _JSON,
) -> None:
    """Bytes per token, prefill speed, break-even bandwidth and per-tier break-even prefixes."""
    from rich.table import Table

    from analyzer.cost import uncertainty as unc
    from analyzer.cost.catalog import get_tier, list_tiers
    from analyzer.cost.hardware import TierSpec, check_bandwidth

    cm = _cost_model(model, gpu, tp, kv_dtype, mfu, profile, weights_dtype)
    plist = _parse_ints(prefixes, "--prefix-tokens")
    tier_names: list[str | TierSpec] = [get_tier(t).name for t in tiers] if tiers else []
    tier_names = tier_names or [t.name for t in list_tiers() if t.kind != "gpu"]
    if cm.link is not None:
        tier_names = [*tier_names, "fitted"]
    if link_gbps is not None:
        check_bandwidth(link_gbps, "--link-gbps")
        if not 0 <= link_latency_ms < math.inf:  # also refuses nan
            raise UsageError(f"--link-latency-ms must be >= 0, got {link_latency_ms}")
        custom = TierSpec("custom", float(link_gbps), link_latency_ms / 1e3, "custom")
        tier_names = [*tier_names, custom]
    console = _console(json_path)
    m = cm.model
    console.print(
        f"[bold]{terminal(m.name)}[/] on {cm.tp} x {cm.gpu.name}, KV {cm.kv_dtype}, "
        f"weights {cm.weight_dtype} (GEMMs in {cm.compute_dtype}), {cm.prefill_model_label}"
        + (f", profile {terminal(cm.profile_source)}" if cm.profile_source else "")
    )
    console.print(
        f"KV bytes per token: {cm.bytes_per_token:,} stored, "
        f"{cm.bytes_per_token_per_rank:,} per rank, {cm.transfer_bytes_per_token:,} moved per instance"
    )
    if m.sliding_layers:
        console.print(
            f"  + {m.kv_window_bytes_per_token(cm.kv_dtype):,} B/token in {m.sliding_layers} "
            f"sliding-window layers, for at most {m.sliding_window_tokens} tokens"
        )
    if m.linear_layers:
        console.print(
            f"  + {_fmt_bytes(m.linear_state_bytes())} fixed state per request in "
            f"{m.linear_layers} linear-attention layers"
        )
    capacity = cm.hbm_kv_capacity_tokens()
    console.print(
        f"HBM KV capacity per instance: {capacity:,} tokens"
        + ("  (weights do not fit: raise --tp)" if capacity == 0 else "")
    )
    pt = Table(title="Recompute vs load by prefix length (ranges: the model's measured error)")
    for col in ("prefix", "KV bytes", "recompute (marginal)", "prefill tok/s", "break-even BW"):
        pt.add_column(col, justify="right")
    per_prefix: list[dict[str, object]] = []
    warnings: set[str] = set()
    bands = []
    for p in plist:
        saving = cm.recompute_saving_s(p)
        be = cm.break_even_bandwidth_gbps(p)
        rate = cm.prefill_tokens_per_s(p)
        band = unc.prefill_band(cm, p)
        bands.append(band)
        rate_r = unc.rate_range(rate, band)
        be_r = unc.break_even_range(be, band)
        outside = cm.range_warnings(new_tokens=p, cached_tokens=0)
        warnings.update(outside)
        per_prefix.append(
            {
                "prefix_tokens": p,
                "kv_bytes": cm.kv_bytes(p),
                "transfer_bytes": cm.transfer_bytes(p),
                "recompute_s": saving,
                "prefill_time_s": cm.prefill_time_s(p, 0),
                "prefill_tokens_per_s": rate,
                "break_even_gbps": be,
                "prefill_tokens_per_s_range": rate_r.to_json(),
                "break_even_gbps_range": be_r.to_json(),
                "error_band": band.to_json(),
                "warnings": outside,
            }
        )
        be_text = _fmt_gbps(be)
        if math.isfinite(be):
            be_text += f" ({be_r.low:.3g}-{be_r.high:.3g})"
        pt.add_row(
            f"{p:,}",
            _fmt_bytes(cm.kv_bytes(p)),
            _fmt_s(saving),
            f"{rate:,.0f} ({rate_r.low:,.0f}-{rate_r.high:,.0f})",
            be_text,
        )
    console.print(pt)
    for text in sorted({b.describe() for b in bands}):
        console.print(f"ranges: {terminal(text)}")
    tiers_be = cm.tier_break_even(tier_names)
    tt = Table(title="Per tier: loading pays above this prefix length")
    for col in ("tier", "GB/s (instance)", "first byte", "break-even prefix"):
        tt.add_column(col, justify="left" if col == "tier" else "right")
    for row in tiers_be:
        shortest = row["break_even_prefix_tokens"]
        tt.add_row(
            row["tier"],
            f"{row['bandwidth_gbps']:g}",
            _fmt_s(row["latency_s"]),
            "never (<2M tokens)" if shortest is None else f"{shortest:,} tokens",
        )
    console.print(tt)
    for w in sorted(warnings):
        console.print(f"[yellow]warning:[/] {terminal(w)}")
    _write_json(
        json_path,
        {
            "cost_model": cm.describe(),
            "model": m.to_json(),
            "gpu": cm.gpu.to_json(),
            "bytes_per_token": cm.bytes_per_token,
            "bytes_per_token_per_rank": cm.bytes_per_token_per_rank,
            "transfer_bytes_per_token": cm.transfer_bytes_per_token,
            "hbm_kv_capacity_tokens": capacity,
            "prefixes": per_prefix,
            "tiers": tiers_be,
            "break_even_table": [r.to_json() for r in cm.break_even_table(plist, tier_names)],
        },
    )


# ---------------------------------------------------------------------------------------
# ttft


@cost_app.command("ttft")
@stdin_options("calibration", "profile")
def ttft_cmd(
    model: str | None = _MODEL,
    gpu: str | None = _GPU,
    prompt_tokens: int = typer.Option(..., "--prompt-tokens", help="Prompt length N (tokens)."),
    cached_tokens: int = typer.Option(0, "--cached-tokens", help="Cached prefix C (tokens)."),
    concurrency: int = typer.Option(1, "--concurrency", "-k", help="K identical requests at once."),
    load_gbps: float | None = typer.Option(
        None, "--load-gbps", help="Link bandwidth B, GB/s decimal, shared by all K loads."
    ),
    load_latency_ms: float | None = typer.Option(
        None, "--load-latency-ms", help="First-byte latency of the load (ms, default 0)."
    ),
    tp: int | None = _TP,
    kv_dtype: str | None = _KV,
    weights_dtype: str | None = _WDT,
    mfu: float | None = _MFU,
    calibration: str | None = typer.Option(
        None,
        "--calibration",
        help="CSV prompt_tokens,cached_tokens,concurrency,load_gbps,ttft_s measured on your "
        "system ('-': stdin).",
    ),
    profile: str | None = _PROFILE,
    measured: str | None = typer.Option(
        None,
        "--measured",
        help="Also price the compute with the deployment's step model for this back end "
        "(vllm, sglang, trtllm): aiconfigurator-core's measured kernel data where it covers "
        "the deployment (a few seconds), else the engine model, named in the output.",
    ),
    json_path: str | None = _JSON,
) -> None:
    """Mean TTFT of K identical requests arriving together.

    Their C cached tokens are read over one link of B GB/s shared by all K; then the K
    remaining suffixes are prefilled on the GPU as one batch.
    """
    from analyzer.cost import uncertainty as unc
    from analyzer.cost.calibrate import calibrate_ttft
    from analyzer.cost.hardware import check_bandwidth
    from analyzer.cost.step import BACKENDS, chunk_attn, step_model

    cm = _cost_model(model, gpu, tp, kv_dtype, mfu, profile, weights_dtype)
    if measured is not None and measured not in BACKENDS:
        raise UsageError(f"--measured must be one of {', '.join(BACKENDS)}, got {measured!r}")
    latency_s = None if load_latency_ms is None else load_latency_ms / 1e3
    if load_latency_ms is not None and not 0 <= load_latency_ms < math.inf:  # nan too
        raise UsageError(f"--load-latency-ms must be >= 0, got {load_latency_ms}")
    if load_gbps is not None:
        check_bandwidth(load_gbps, "--load-gbps")
    if calibration:
        cm = calibrate_ttft(cm, calibration, latency_s or 0.0)
    r = cm.ttft(prompt_tokens, cached_tokens, concurrency, load_gbps, latency_s)
    console = _console(json_path)
    console.print(
        f"[bold]{terminal(cm.model.name)}[/] on {cm.tp} x {cm.gpu.name}: {r.concurrency} request(s) of "
        f"{r.prompt_tokens:,} tokens, {r.cached_tokens:,} cached, over {r.load_gbps:g} GB/s"
    )
    band = unc.prefill_band(cm, r.prompt_tokens)
    ttft_r = unc.ttft_range(r.ttft_s, band)
    recompute_r = unc.ttft_range(r.recompute_ttft_s, band)
    console.print(
        f"TTFT {_fmt_s(r.ttft_s)} = load {_fmt_s(r.load_s)} + compute {_fmt_s(r.compute_s)} "
        f"+ overhead {_fmt_s(r.overhead_s)}; between {_fmt_s(ttft_r.low)} and "
        f"{_fmt_s(ttft_r.high)} by the model's measured error"
    )
    console.print(
        f"recompute everything: {_fmt_s(r.recompute_ttft_s)} ({_fmt_s(recompute_r.low)}-"
        f"{_fmt_s(recompute_r.high)}); overlapped load+compute bound: {_fmt_s(r.overlap_bound_s)}"
    )
    console.print(f"ranges: {terminal(band.describe())}")
    step_out = None
    if measured is not None:
        sm = step_model(cm, measured)
        k = r.concurrency
        compute = sm.step_s(k * r.new_tokens, k * chunk_attn(r.new_tokens, r.cached_tokens), 0, 0)
        ttft = r.load_s + compute + sm.request_overhead_s
        console.print(
            f"by {sm.source}: compute {_fmt_s(compute)}, TTFT {_fmt_s(ttft)} "
            f"(the engine model's: {_fmt_s(r.ttft_s)})"
        )
        step_out = {"source": sm.source, "compute_s": compute, "ttft_s": ttft}
    if cm.ttft_fit is not None:
        f = cm.ttft_fit
        names = ["compute_scale", "overhead_s", "load_scale", "latency_s"]
        console.print("calibration: " + _fit_notes(f.fitted, names, f.cv_mape, f.n_points))
    for w in r.warnings:
        console.print(f"[yellow]warning:[/] {terminal(w)}")
    out = r.to_json()
    out["cost_model"] = cm.describe()
    out["ttft_range"] = ttft_r.to_json()
    out["recompute_ttft_range"] = recompute_r.to_json()
    out["error_band"] = band.to_json()
    if step_out is not None:
        out["step_model"] = step_out
    _write_json(json_path, out)


# ---------------------------------------------------------------------------------------
# fit


@cost_app.command("fit")
@stdin_options("prefill", "load", "ttft")
def fit_cmd(
    prefill: str | None = typer.Option(
        None,
        "--prefill",
        help="CSV prompt_tokens,cached_tokens,prefill_s|ttft_s[,concurrency] ('-': stdin).",
    ),
    load: str | None = typer.Option(
        None, "--load", help="CSV bytes,concurrency,seconds ('-': stdin)."
    ),
    ttft: str | None = typer.Option(
        None,
        "--ttft",
        help="CSV prompt_tokens,cached_tokens,concurrency,load_gbps,ttft_s ('-': stdin).",
    ),
    output: str = typer.Option(
        ..., "--output", "-o", help="Profile to write, e.g. models/mine.json ('-': stdout)."
    ),
    model: str | None = _MODEL,
    gpu: str | None = _GPU,
    tp: int | None = _TP,
    kv_dtype: str | None = _KV,
    weights_dtype: str | None = _WDT,
    mfu: float | None = _MFU,
    json_path: str | None = _JSON,
) -> None:
    """Fit prefill and/or load coefficients to your measurements; save them as JSON."""
    from analyzer.cost import calibrate as cal
    from analyzer.cost.profile_file import profile_json, save_profile

    if not (prefill or load or ttft):
        raise UsageError("give at least one of --prefill CSV, --load CSV or --ttft CSV")
    if not is_stdio(output) and not output.endswith(".json"):
        raise UsageError(f"--output must be a .json file or '-' (stdout), got '{output}'")
    if is_stdio(output) and is_stdio(json_path):
        raise UsageError("-o - and --json - would both write to stdout: give one a file")
    cm = _cost_model(model, gpu, tp, kv_dtype, mfu, None, weights_dtype)
    console = make_console(stderr=is_stdio(json_path) or is_stdio(output))
    summary: dict[str, object] = {}
    if prefill:
        data = cal.read_prefill_csv(prefill)
        coeffs = cal.fit_prefill(cm, data)
        cm = cm.with_prefill(coeffs)
        names = (
            ["overhead_s", "per_token_s", "per_context_token_s", "per_token_sq_s"]
            if coeffs.compute_scale == 0
            else ["compute_scale", "overhead_s"]
        )
        form = "polynomial in S, P*S, S^2" if coeffs.compute_scale == 0 else "scaled analytic"
        console.print(f"prefill ({form}): {terminal(data.summary())}")
        console.print("  " + _fit_notes(coeffs.fitted, names, coeffs.cv_mape, coeffs.n_points))
        summary["prefill_rows"] = {"usable": len(data.rows), "skipped": data.skipped}
        summary["prefill_skipped_examples"] = data.examples
    if load:
        data = cal.read_load_csv(load)
        link = cal.fit_load(data)
        cm = replace(cm, link=link)
        console.print(f"load: {terminal(data.summary())}")
        console.print(
            f"  bandwidth {link.bandwidth_gbps:.3f} GB/s, first byte {_fmt_s(link.latency_s)}; "
            + _fit_notes(link.fitted, ["bandwidth_gbps", "latency_s"], link.cv_mape, link.n_points)
        )
        summary["load_rows"] = {"usable": len(data.rows), "skipped": data.skipped}
        summary["load_skipped_examples"] = data.examples
    if ttft:
        data = cal.read_ttft_csv(ttft)
        fit = cal.fit_ttft(cm, data)
        cm = replace(cm, ttft_fit=fit)
        console.print(f"ttft: {terminal(data.summary())}")
        names = ["compute_scale", "overhead_s", "load_scale", "latency_s"]
        console.print("  " + _fit_notes(fit.fitted, names, fit.cv_mape, fit.n_points))
        summary["ttft_rows"] = {"usable": len(data.rows), "skipped": data.skipped}
        summary["ttft_skipped_examples"] = data.examples
    with output_file(Path(output), what="profile") as target:
        written = save_profile(cm, target)
    path = "<stdout>" if is_stdio(output) else str(written)
    console.print(
        f"wrote {path} (use it with --profile FILE)"
        if is_stdio(output)
        else f"wrote {terminal(path)} (use it with --profile {terminal(path)})"
    )
    _write_json(json_path, {"profile": profile_json(cm), "path": path, **summary})


# ---------------------------------------------------------------------------------------
# check


@cost_app.command("check")
@stdin_options("table")
def check_cmd(
    table: str | None = typer.Option(
        None,
        "--table",
        help="Reference table (default: models/measurements.toml; '-': stdin).",
    ),
    engine_only: bool = typer.Option(
        False,
        "--engine-only",
        help="Leave out aiconfigurator-core's measured step times (a few seconds per "
        "deployment it covers).",
    ),
    json_path: str | None = _JSON,
) -> None:
    """The model against published measurements: prediction, measurement, ratio per row.

    The engine model's free constants are fitted on the prefill rows not held out; each
    fitted row's leave-one-out ratio comes from constants fitted on all the other rows.
    Beside it, aiconfigurator-core's measured step times where they cover the row. A row
    whose measurement includes the server's per-request overhead is predicted with it.
    """
    from rich.table import Table

    from analyzer.cost.reference import check

    r = check(table, measured=not engine_only)
    console = _console(json_path)
    pt = Table(title=f"Prefill: model vs published measurements ({r.path})")
    for col in ("row", "engine", "deployment", "prompt x batch", "measured", "predicted"):
        left = col in ("row", "engine", "deployment")
        pt.add_column(col, justify="left" if left else "right", overflow="fold")
    pt.add_column("ratio", justify="right")
    pt.add_column("leave-one-out", justify="right")
    if not engine_only:
        pt.add_column("aiconfigurator", justify="right")
    pt.add_column("old roofline", justify="right")
    for c in r.rows:
        row = c.row
        unit = _fmt_s if row.quantity == "ttft_s" else (lambda v: f"{v:,.0f} tok/s")
        cached = f" ({row.cached_tokens:,} cached" + (
            f" from {row.load_tier})" if row.load_tier else ")"
        )
        cells = [
            row.id,
            f"{row.engine} {row.engine_version.split(' ')[0]}",
            f"{row.model} {row.tp}x{row.gpu} {row.parallelism} {row.weights_dtype}",
            f"{row.prompt_tokens:,}{cached if row.cached_tokens else ''} x {row.batch}",
            unit(row.value) + (" +oh" if row.includes_overhead else ""),
            unit(c.predicted),
            f"{c.ratio:.2f}",
            "held out" if row.held_out else f"{c.loo_ratio:.2f}",
        ]
        if not engine_only:
            cells.append("—" if c.measured_ratio is None else f"{c.measured_ratio:.2f}")
        cells.append(f"{c.roofline_ratio:.2f}")
        pt.add_row(*cells)
    console.print(pt)
    console.print(
        "ratio = predicted / measured time (throughput rows: measured / predicted rate); "
        "above 1 the model is too slow. +oh: the measurement includes the server's "
        "per-request overhead, and so does the prediction (10 ms). held out: in no fit. "
        "aiconfigurator: aiconfigurator-core's measured step times, where they cover the "
        "row (— : not covered). old roofline: bf16 peak x MFU 0.5 dense / 0.35 MoE + 10 ms, "
        "the model this one replaced."
    )
    within = sum(1 for c in r.rows if 1 / 1.5 <= c.loo_ratio <= 1.5)
    console.print(
        f"engine model, leave-one-out (held-out rows: their ratio) over {len(r.rows)} rows: "
        f"median error {r.loo_median_error:.1%}, worst factor {r.loo_worst_factor:.2f}x, "
        f"{within}/{len(r.rows)} rows within 1.5x"
    )
    if not engine_only:
        measured = [c.measured_ratio for c in r.rows if c.measured_ratio is not None]
        if measured:
            factor = max(max(x, 1 / x) for x in measured)
            inside = sum(1 for x in measured if 1 / 1.5 <= x <= 1.5)
            console.print(
                f"aiconfigurator-core covers {len(measured)}/{len(r.rows)} rows: worst factor "
                f"{factor:.2f}x, {inside}/{len(measured)} within 1.5x"
            )
        reasons = sorted({c.measured_source for c in r.rows if c.measured_ratio is None})
        for reason in reasons:
            console.print(f"  not covered: {reason}")
    f = r.fitted
    console.print(
        "fitted on every row: "
        + ", ".join(f"{n} {getattr(f, n):.4g}" for n in ("gemm_eff_bf16", "gemm_eff_fp8"))
        + f", gemm_half_tokens {f.gemm_half_tokens:.4g}, layer_step_s {f.layer_step_s:.4g}, "
        f"moe_eff {f.moe_eff:.4g} (fixed: attn_eff {f.attn_eff:g}, hbm_eff {f.hbm_eff:g}, "
        f"link_eff {f.link_eff:g})"
    )
    if r.links:
        lt = Table(title="Links: catalog tier x links vs published bandwidth")
        for col in ("row", "tier x links", "measured", "predicted", "ratio"):
            lt.add_column(col, justify="left" if col in ("row", "tier x links") else "right")
        for link in r.links:
            lt.add_row(
                link.id,
                f"{link.tier} x {link.links}",
                _fmt_gbps(link.measured_gbps),
                _fmt_gbps(link.predicted_gbps),
                f"{link.predicted_gbps / link.measured_gbps:.2f}",
            )
        console.print(lt)
        worst = max(r.links, key=lambda x: abs(math.log(x.predicted_gbps / x.measured_gbps)))
        console.print(
            f"links have no fitted constant; worst: {worst.id} "
            f"({worst.predicted_gbps / worst.measured_gbps:.2f}x)"
        )
    _write_json(json_path, r.to_json())


# ---------------------------------------------------------------------------------------
# profile


@cost_app.command("profile")
def profile_cmd(
    output: str = typer.Option(
        ..., "--output", "-o", help="Profile to write, e.g. models/mine.json."
    ),
    model: str | None = _MODEL,
    gpu: str | None = _GPU,
    tp: int | None = _TP,
    kv_dtype: str | None = _KV,
    prompts: str = typer.Option(
        "512,1024,2048,4096", "--prompt-tokens", help="Prompt lengths to time (comma-separated)."
    ),
    batches: str = typer.Option("1,4", "--batch", help="Batch sizes to time (comma-separated)."),
    repeats: int = typer.Option(3, "--repeats", help="Timed runs per point (the fastest counts)."),
    device: str = typer.Option("auto", "--device", help="auto | cuda | cpu."),
    nvme_dir: str | None = typer.Option(
        None, "--nvme-dir", help="Also time reads of a fresh file in DIR (an NVMe mount)."
    ),
    json_path: str | None = _JSON,
) -> None:
    """Measure prefill and copy bandwidth on this machine's GPU; write a --profile file.

    Needs PyTorch (pip install 'kvpool-advisor[profile]'). Random weights in the model's
    shapes: nothing is downloaded. The raw points go beside the profile as CSV.
    """
    from analyzer.cost import calibrate as cal
    from analyzer.cost import profiler
    from analyzer.cost.coefficients import fit_json
    from analyzer.cost.profile_file import profile_json, save_profile

    no_stdio(output, "-o", "the raw measurements are written beside the profile")
    no_stdio(nvme_dir, "--nvme-dir", "it names a folder on the NVMe mount to time reads in")
    if not output.endswith(".json"):
        raise UsageError(f"--output must be a .json file, got '{output}'")
    cm = _cost_model(model, gpu, tp, kv_dtype, None, None, None)
    console = _console(json_path)
    run = profiler.measure(
        cm,
        output,
        device=device,
        prompts=tuple(_parse_ints(prompts, "--prompt-tokens")),
        batches=tuple(_parse_ints(batches, "--batch")),
        repeats=repeats,
        nvme_dir=nvme_dir,
    )
    console.print(f"measured on {run.device}, {run.dtype} weights, {run.points} points")
    if run.device.startswith("cpu"):
        console.print(
            "[yellow]warning:[/] no GPU: these figures describe this CPU, not a GPU; run "
            "`kvpool cost profile` on the GPU machine for a profile of your GPUs"
        )
    data = cal.read_prefill_csv(run.csv["prefill"])
    coeffs = cal.fit_prefill(cm, data)
    cm = replace(cm.with_prefill(coeffs), profile_source=output)
    names = (
        ["overhead_s", "per_token_s", "per_context_token_s", "per_token_sq_s"]
        if coeffs.compute_scale == 0
        else ["compute_scale", "overhead_s"]
    )
    console.print("prefill: " + _fit_notes(coeffs.fitted, names, coeffs.cv_mape, coeffs.n_points))
    links = {}
    for kind in ("h2d", "d2h", "nvme"):
        if kind in run.csv:
            links[kind] = cal.fit_load(cal.read_load_csv(run.csv[kind]))
            console.print(
                f"{kind}: {links[kind].bandwidth_gbps:.2f} GB/s, first byte "
                f"{_fmt_s(links[kind].latency_s)}"
            )
    if "h2d" in links:
        cm = replace(cm, link=links["h2d"])  # loading KV from host DRAM is host-to-device
    else:
        console.print("no CUDA device: host<->device copy bandwidth not measured")
    extra = {
        "device": run.device,
        "dtype": run.dtype,
        "layer_shape": {
            "hidden": run.shape.hidden,
            "q_heads": run.shape.q_heads,
            "kv_heads": run.shape.kv_heads,
            "head_dim": run.shape.head_dim,
            "mlp_width": run.shape.mlp_width,
            "layers": run.shape.layers,
            "vocab": run.shape.vocab,
        },
        "raw": {k: Path(v).name for k, v in run.csv.items()},  # beside the profile
        "links": {k: fit_json(v, provenance=True) for k, v in links.items()},
    }
    path = save_profile(cm, output, measured=extra)
    console.print(f"wrote {terminal(str(path))} (use it with --profile {terminal(str(path))})")
    _write_json(json_path, {"profile": profile_json(cm, measured=extra), "path": str(path)})
