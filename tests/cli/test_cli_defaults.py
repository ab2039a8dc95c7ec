"""Every shared flag has one definition: the same default and help text in every command
that takes it, equal to the library's own default and to the dashboard's starting value.

Found by a user: the same trace and flags gave a 53.2% hit rate in `kvpool analyze` and
48.6% in `kvpool replay`, because `--warmup` defaulted to 0.5 in one and 0.0 in the other.
"""

from __future__ import annotations

import dataclasses

import pytest
import typer
from typer.core import TyperOption

from analyzer.advisor import AnalyzeOptions
from analyzer.cli import app
from analyzer.cli.options import (
    CLUSTER_FLAG_NAMES,
    DEFAULTS,
    INGEST_FLAG_NAMES,
    ClusterFlags,
    IngestFlags,
    hash_keys,
)
from analyzer.ingest import IngestOptions
from analyzer.replay import ClusterConfig

INPUT_COMMANDS = ("convert", "reuse", "replay", "analyze")
CLUSTER_COMMANDS = ("replay", "analyze")
# Flags that mean something else in one command, said here so that no other can drift:
# `reuse --model` only converts capacities to bytes, so it has no default model;
# `synth --format` is the format it writes, not the one it reads.
OWN_MEANING = {("reuse", "--model"), ("synth", "--format"), ("probe", "--model")}


def _commands() -> dict:
    return dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _options(cmd) -> dict[str, TyperOption]:  # type: ignore[no-untyped-def]
    return {
        name: p
        for p in cmd.params
        if isinstance(p, TyperOption)
        for name in p.opts
        if name.startswith("--")
    }


def _library_defaults() -> dict[str, object]:
    from analyzer.ingest.parallel import default_jobs, resolve_jobs

    i, c, a = IngestOptions(), ClusterConfig(), AnalyzeOptions()
    # The library runs one process unless told; the command line's default (None) is
    # every core.
    assert i.jobs == 1 and resolve_jobs(None) == default_jobs()
    return {
        "--format": i.fmt,
        "--block-size": i.block_size,
        "--template": i.template,
        "--tools-position": i.tools_position,
        "--tokenizer": i.tokenizer,
        "--token-ratio": i.token_ratio,
        "--salt-file": i.salt_file,
        # None stands for the library's own keys (the model): checked below
        "--hash-key": None if hash_keys(None) == i.hash_keys else list(i.hash_keys),
        "--time-field": i.time_field,
        "--time-unit": i.time_unit,
        "--prompt-column": i.prompt_column,
        "--time-column": i.time_column,
        "--session-column": i.session_column,
        "--tenant-field": i.tenant_field,
        "--user-field": i.user_field,
        "--strict": i.strict,
        "--no-exact": not i.exact,
        "--exact-max-mib": i.exact_max_bytes >> 20,
        "--jobs": None,
        "--ray": i.ray_address,
        # None: each model the log names, as itself, at the smallest TP that holds it
        # (`kvpool analyze` plans them so; ClusterConfig's model and TP are what a log
        # naming no model, or `ClusterFlags().config()`, gets)
        "--model": None,
        "--gpu": c.gpu,
        "--tp": None,
        "--instances": c.instances,
        "--gpus-per-node": c.gpus_per_node,
        "--dram-scope": c.dram_scope,
        "--kv-dtype": c.kv_dtype,
        "--router": c.router,
        "--eviction": c.eviction,
        "--weights-dtype": c.weights_dtype,
        "--write-policy": c.write_policy,
        "--pool-gbps": c.pool_gbps,
        "--local-capacity-tokens": c.local_capacity_tokens,
        "--dram-capacity-tokens": c.dram_capacity_tokens,
        "--pool-capacity-tokens": c.pool_capacity_tokens,
        "--warmup": c.warmup_fraction,
        "--serving": c.serving,
        "--max-num-batched-tokens": c.max_num_batched_tokens,
        "--max-num-seqs": c.max_num_seqs,
        "--gpu-memory-utilization": c.gpu_memory_utilization,
        "--connector": c.connector,
        "--hicache-ratio": c.hicache_ratio,
        "--hicache-size": c.hicache_size_gb,
        "--ttft-slo": a.ttft_slo_s,
        "--isolation": a.isolation,
    }


def test_the_declared_defaults_are_the_librarys():
    assert _library_defaults() == DEFAULTS
    # AnalyzeOptions composes the two, so it cannot disagree with either.
    a = AnalyzeOptions()
    assert a.cluster == ClusterConfig() and a.ingest == IngestOptions()


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_each_shared_flag_has_one_default_and_one_help(name):
    seen = {}
    for cmd_name, cmd in _commands().items():
        opt = _options(cmd).get(name)
        if opt is None or (cmd_name, name) in OWN_MEANING:
            continue
        default = opt.default
        if isinstance(default, tuple):  # click keeps multiple=True defaults as tuples
            default = list(default) or None
        assert default == DEFAULTS[name], f"kvpool {cmd_name} {name} defaults to {default!r}"
        seen[cmd_name] = opt.help
    assert seen, f"no command takes {name}"
    assert len(set(seen.values())) == 1, f"{name} has different help texts: {seen}"


def test_every_command_reading_logs_takes_every_ingest_flag():
    """The group is declared once (IngestFlags): every command reading logs takes all of
    it, and the flags' defaults give the library's own IngestOptions."""
    assert len(INGEST_FLAG_NAMES) == 20
    for name in INPUT_COMMANDS:
        missing = set(INGEST_FLAG_NAMES) - set(_options(_commands()[name]))
        assert not missing, f"kvpool {name} lacks {sorted(missing)}"
    convert = set(_options(_commands()["convert"]))
    assert convert & set(DEFAULTS) == set(INGEST_FLAG_NAMES)
    assert dataclasses.replace(IngestFlags().options(), jobs=1) == IngestOptions()


def test_the_ingest_group_reaches_the_command(tmp_path, monkeypatch):
    """A flag given on the command line arrives in the options the command reads with."""
    from typer.testing import CliRunner

    seen = {}

    def spy(paths, out, opts, advance=None, force=False, window_s=None):  # type: ignore[no-untyped-def]
        seen["opts"], seen["window_s"] = opts, window_s
        raise SystemExit(0)

    log = tmp_path / "a.jsonl"
    log.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    import analyzer.ingest.convert as convert

    monkeypatch.setattr(convert, "convert_trace", spy)
    r = CliRunner().invoke(
        app,
        [
            "convert",
            str(log),
            "-o",
            str(tmp_path / "o.parquet"),
            "--time-unit",
            "ms",
            "--exact-max-mib",
            "7",
            "--hash-key",
            "tenant",
            "-j",
            "1",
            "--format",
            "openai",
            "--ray",
            "auto",
        ],
    )
    assert r.exit_code == 0, r.output
    opts = seen["opts"]
    assert (opts.time_unit, opts.exact_max_bytes, opts.hash_keys, opts.jobs, opts.fmt) == (
        "ms",
        7 << 20,
        ("model", "tenant"),
        1,
        "openai",
    )
    # On Ray, convert writes a dataset partitioned by hour.
    assert (opts.ray_address, seen["window_s"]) == ("auto", 3600)


def test_every_replaying_command_takes_every_cluster_flag():
    """The group is declared once (ClusterFlags): every command that replays takes all of
    it, and its defaults build the library's own ClusterConfig."""
    assert len(CLUSTER_FLAG_NAMES) == 23
    for name in CLUSTER_COMMANDS:
        options = _options(_commands()[name])
        missing = set(CLUSTER_FLAG_NAMES) - set(options)
        assert not missing, f"kvpool {name} lacks {sorted(missing)}"
        assert "--ttft-slo" in options
    assert ClusterFlags().config() == ClusterConfig()


def _built_by_commands(tmp_path, monkeypatch, flags: list[str]):  # type: ignore[no-untyped-def]
    """The ClusterConfig `kvpool replay` and the AnalyzeOptions `kvpool analyze` build
    from the same ``flags`` (each stopped before its long run)."""
    from typer.testing import CliRunner

    import analyzer.advisor.pipeline as pipeline
    import analyzer.replay as replay

    seen = {}

    def spy_replay(trace, cfg, **kw):  # type: ignore[no-untyped-def]
        seen["replay"] = (cfg, kw["ttft_slo_s"])
        raise SystemExit(0)

    def spy_analysis(paths, opts, *a, **kw):  # type: ignore[no-untyped-def]
        seen["analyze"] = opts
        raise SystemExit(0)

    monkeypatch.setattr(replay, "run_replay", spy_replay)
    monkeypatch.setattr(pipeline, "run_analysis", spy_analysis)
    log = tmp_path / "a.jsonl"
    log.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    for cmd, extra in (("replay", ["--no-search"]), ("analyze", ["-o", str(tmp_path / "r")])):
        r = CliRunner().invoke(app, [cmd, str(log), *extra, *flags])
        assert r.exit_code == 0, r.output
    return seen["replay"], seen["analyze"]


# The dashboard's sidebar fields for each flag, and a value away from its default.
_SIDEBAR = [
    ("--model", "model", "llama-3.1-70b"),
    ("--gpu", "gpu", "h200"),
    ("--tp", "tp", 2),
    ("--instances", "instances", 8),
    ("--gpus-per-node", "gpus_per_node", 4),
    ("--dram-scope", "dram_scope", "node"),
    ("--kv-dtype", "kv_dtype", "fp8"),
    ("--router", "router", "session"),
    ("--eviction", "eviction", "fifo"),
    ("--pool-gbps", "pool_gbps", 50.0),
    ("--warmup", "warmup", 0.25),
    ("--ttft-slo", "ttft_slo_s", 1.5),
]


@pytest.mark.parametrize("changed", [False, True], ids=["defaults", "changed"])
def test_commands_and_dashboard_build_the_same_cluster(tmp_path, monkeypatch, changed):
    """`kvpool replay`, `kvpool analyze` and the dashboard, given the same settings (none,
    or every one the sidebar has, away from its default), replay the same cluster with
    the same SLO: any difference in a default or in how one of them builds the
    ClusterConfig fails here."""
    from app import compute, controls, replays

    compute.control_defaults.clear()
    flags = [str(a) for f, _, v in _SIDEBAR for a in (f, v)] if changed else []
    (replay_cfg, replay_slo), analyze_opts = _built_by_commands(tmp_path, monkeypatch, flags)
    w = controls.default_whatif()
    if changed:
        w = dataclasses.replace(w, **{field: v for _, field, v in _SIDEBAR})
    dashboard = replays.analyze_options(w, w.warmup)
    assert replay_cfg == analyze_opts.cluster == dashboard.cluster
    assert replay_slo == analyze_opts.ttft_slo_s == dashboard.ttft_slo_s
    assert dataclasses.replace(analyze_opts, ingest=dashboard.ingest) == dashboard
    if not changed:
        assert replay_cfg == ClusterConfig() and dashboard == AnalyzeOptions()
    else:
        assert replay_cfg.instances == 8 and replay_cfg.warmup_fraction == 0.25


def test_the_dashboard_starts_from_the_same_defaults():
    from app import compute, controls, replays

    compute.control_defaults.clear()
    d = compute.control_defaults()
    w = controls.default_whatif()
    c = ClusterConfig()
    # "" and 0 in the sidebar are the log's own models at the smallest TP that holds
    # them, as --model and --tp left out
    assert (d.model, d.tp) == ("", 0) and DEFAULTS["--model"] is None is DEFAULTS["--tp"]
    assert (d.gpu, d.kv_dtype, d.instances, d.router, d.eviction) == (
        c.gpu,
        c.kv_dtype,
        c.instances,
        c.router,
        c.eviction,
    )
    assert (d.gpus_per_node, d.dram_scope) == (c.gpus_per_node, c.dram_scope)
    assert d.warmup == DEFAULTS["--warmup"]
    assert d.ttft_slo_s == DEFAULTS["--ttft-slo"]
    # None is "the tier's catalog figure" in the sidebar, in ClusterConfig and on the
    # command line alike.
    assert w.pool_gbps is None and DEFAULTS["--pool-gbps"] is None
    assert (w.dram_gbps, w.dram_latency_us, w.pool_latency_us) == (None, None, None)
    assert (w.dram_tier, w.pool_tier) == (c.dram_tier, c.pool_tier)
    # The options the dashboard's recommendation page builds, at the starting controls,
    # are those of `kvpool analyze` without flags (the block size comes from the trace).
    opts = replays.analyze_options(w, d.warmup)
    assert dataclasses.replace(opts, ingest=IngestOptions()) == AnalyzeOptions()


def test_hash_keys_keep_the_model_unless_none():
    assert hash_keys(None) == IngestOptions().hash_keys == ("model",)
    assert hash_keys(["tenant"]) == ("model", "tenant")
    assert hash_keys(["none"]) == ()
    assert hash_keys(["none", "tenant"]) == ("tenant",)


def test_closed_choices_are_the_owning_stages():
    """The choices --help lists and the parser checks are the ones the library accepts."""
    from analyzer.cli.options import CHOICES
    from analyzer.cost.dtypes import KV_DTYPES
    from analyzer.ingest.detect import FORMATS
    from analyzer.ingest.options import TIME_UNITS
    from analyzer.replay.config import DRAM_SCOPES, ROUTERS, WRITE_POLICIES
    from analyzer.reuse.isolation import POLICIES
    from analyzer.tokenize.render import TEMPLATES, TOOLS_POSITIONS

    assert CHOICES == {
        "--format": FORMATS,
        "--template": TEMPLATES,
        "--tools-position": TOOLS_POSITIONS,
        "--time-unit": TIME_UNITS,
        "--router": ROUTERS,
        "--dram-scope": DRAM_SCOPES,
        "--kv-dtype": KV_DTYPES,
        "--write-policy": WRITE_POLICIES,
        "--isolation": POLICIES,
    }


def test_a_value_outside_the_choices_is_a_usage_error():
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, ["replay", "x.jsonl", "--router", "random"])
    assert r.exit_code == 2
    assert "'--router'" in r.output and "prefix-aware" in r.output
