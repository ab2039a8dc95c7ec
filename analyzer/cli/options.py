"""Flags that several commands share, each declared once: one name, one default, one help.

A command lists the aliases it takes (``block_size: BlockSize = None``); the default
written beside an alias is the one given here in ``DEFAULTS``, and
``tests/test_cli_defaults.py`` checks that these equal the library's own defaults
(:class:`~analyzer.ingest.IngestOptions`, :class:`~analyzer.replay.ClusterConfig`,
:class:`~analyzer.advisor.AnalyzeOptions`) and the dashboard's starting controls, so that
the same trace and flags give the same figures in every command.

Only typer and the standard library are imported here: ``kvpool --help`` must not pay
for numpy, pyarrow or numba.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import typer

# The one default of every shared flag (flag name -> value), as the commands use them.
DEFAULTS: dict[str, Any] = {
    # ingest (IngestOptions)
    "--format": None,
    "--block-size": None,
    "--template": "chatml",
    "--tools-position": "in-system",
    "--tokenizer": "cl100k",
    "--token-ratio": 1.0,
    "--salt-file": None,
    "--hash-key": None,  # None: IngestOptions' own keys (the model)
    "--time-field": None,
    "--time-unit": "auto",
    "--prompt-column": None,
    "--time-column": None,
    "--session-column": None,
    "--strict": False,
    "--no-exact": False,
    "--exact-max-mib": 512,
    # cluster (ClusterConfig)
    "--model": "llama-3.1-8b",
    "--gpu": "h100",
    "--tp": 1,
    "--instances": 4,
    "--gpus-per-node": 8,
    "--dram-scope": "instance",
    "--kv-dtype": "bf16",
    "--router": "prefix-aware",
    "--eviction": "lru",
    "--pool-gbps": None,
    "--local-capacity-tokens": None,
    "--dram-capacity-tokens": None,
    "--pool-capacity-tokens": None,
    "--warmup": 0.5,
    "--ttft-slo": 2.0,
}

_CAPACITY = "tokens (1e6 style accepted) or 'unbounded'"

# Closed sets of names, checked by the parser and listed in --help. Written out here so
# that `kvpool --help` imports no library module; tests/test_cli_defaults.py checks each
# against the tuple its owning stage validates with.
TemplateName = Literal["chatml", "llama3"]  # tokenize.render.TEMPLATES
ToolsPositionName = Literal["in-system", "after-system", "before-system"]  # TOOLS_POSITIONS
TimeUnitName = Literal["auto", "s", "ms", "us", "ns"]  # ingest.options.TIME_UNITS
RouterName = Literal["round-robin", "least-loaded", "session", "prefix-aware"]  # ROUTERS
DramScopeName = Literal["instance", "node"]  # replay.config.DRAM_SCOPES
KvDtypeName = Literal["bf16", "fp16", "fp8"]  # cost.catalog.KV_DTYPES
WritePolicyName = Literal["write-through", "on-evict"]  # replay.config.WRITE_POLICIES
CHOICES = {
    "--template": get_args(TemplateName),
    "--tools-position": get_args(ToolsPositionName),
    "--time-unit": get_args(TimeUnitName),
    "--router": get_args(RouterName),
    "--dram-scope": get_args(DramScopeName),
    "--kv-dtype": get_args(KvDtypeName),
    "--write-policy": get_args(WritePolicyName),
}

# --- inputs ------------------------------------------------------------------------------

Inputs = Annotated[
    list[Path],
    typer.Argument(
        help="Request logs, public traces or canonical .parquet (gzip/zstd ok; "
        "any format `kvpool convert` reads)."
    ),
]

# --- ingest: how the inputs are read and hashed (IngestOptions) ------------------------

Format = Annotated[
    str | None, typer.Option("--format", help="Input format; detected per file if omitted.")
]
BlockSize = Annotated[
    int | None,
    typer.Option(
        "--block-size",
        help="Tokens per block (default: the input's own; 16 for text logs, 512 for Mooncake).",
    ),
]
Template = Annotated[TemplateName, typer.Option("--template", help="Prompt framing.")]
ToolsPosition = Annotated[
    ToolsPositionName,
    typer.Option("--tools-position", help="Where tool definitions go in the prompt."),
]
Tokenizer = Annotated[
    str,
    typer.Option(
        "--tokenizer",
        help="cl100k, PATH/tokenizer.json, or a Hugging Face model folder (tokenizer.json + "
        "tokenizer_config.json): the served model's own tokenizer and chat template.",
    ),
]
TokenRatio = Annotated[
    float,
    typer.Option("--token-ratio", help="Served-model tokens per counted token (e.g. 1.12)."),
]
SaltFile = Annotated[
    Path | None,
    typer.Option("--salt-file", help="Hashing salt, made on first use (default ./.kvpool-salt)."),
]
HashKey = Annotated[
    list[str] | None,
    typer.Option(
        "--hash-key",
        help="Keys in the block hash, so these never share KV: the model always, tenant too "
        "when given; 'none' lets every model share.",
    ),
]
TimeField = Annotated[
    str | None, typer.Option("--time-field", help="Timestamp field in JSON records (a.b.c).")
]
TimeUnit = Annotated[TimeUnitName, typer.Option("--time-unit", help="Unit of numeric timestamps.")]
PromptColumn = Annotated[
    str | None, typer.Option("--prompt-column", help="CSV column holding the prompt.")
]
TimeColumn = Annotated[
    str | None, typer.Option("--time-column", help="CSV column holding the timestamp.")
]
SessionColumn = Annotated[
    str | None, typer.Option("--session-column", help="CSV column holding the session id.")
]
Strict = Annotated[bool, typer.Option("--strict", help="Stop at the first bad row.")]
# Outputs and privacy (docs/security.md).
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Write through a symlinked output path; overwrite reports in an existing directory.",
    ),
]
ShowPreviews = Annotated[
    bool,
    typer.Option(
        "--show-previews",
        help="Show ~80 characters of prompt text for the top shared prefixes (default: "
        "hashes only; outputs are made to be shared).",
    ),
]
KeepNames = Annotated[
    bool,
    typer.Option(
        "--keep-names",
        help="Keep tenant names, request ids and input file names as they are (default: "
        "salted pseudonyms and input-N).",
    ),
]
NoExact = Annotated[
    bool, typer.Option("--no-exact", help="Skip the token-exact LCP (for huge logs).")
]
Jobs = Annotated[
    int | None,
    typer.Option(
        "--jobs", "-j", help="Processes reading the logs (default: every core); same output."
    ),
]
Ray = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="[ADDRESS]",
        help="Read and hash the logs on a Ray cluster: auto, ray://HOST:10001 or HOST:6379; "
        "alone, a Ray instance started on this machine (pip install 'kvpool-advisor[ray]'). "
        "Same rows; only hashes and counts cross the network, so the token-exact LCP is "
        "not computed (docs/scale.md).",
    ),
]
ExactMaxMib = Annotated[
    int,
    typer.Option(
        "--exact-max-mib", help="Memory bound of the token-exact LCP tree; past it, skipped."
    ),
]

# --- cluster: what the trace is replayed on (ClusterConfig) ----------------------------

Model = Annotated[
    str, typer.Option("--model", help="Catalog model id (e.g. llama-3.1-70b) or a config.json.")
]
Gpu = Annotated[str, typer.Option("--gpu", help="Catalog GPU id (a100, h100, h200, b200, ...).")]
Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs per instance.")]
Instances = Annotated[int, typer.Option("--instances", help="Prefill instances in the cluster.")]
GpusPerNode = Annotated[
    int, typer.Option("--gpus-per-node", help="GPUs sharing one host (its DRAM, NVMe and NIC).")
]
DramScope = Annotated[
    DramScopeName,
    typer.Option(
        "--dram-scope",
        help="instance: each engine process holds a private share of its node's DRAM "
        "(LMCache local CPU, HiCache L2); node: one DRAM cache shared by the node's "
        "instances (a node-local shared store).",
    ),
]
KvDtype = Annotated[KvDtypeName, typer.Option("--kv-dtype", help="KV cache dtype.")]
WeightsDtype = Annotated[
    str | None,
    typer.Option(
        "--weights-dtype",
        help="Deployment precision of the weights: bf16 | fp8 | fp4 (default: the "
        "checkpoint's); GEMMs run at it where the GPU has tensor cores for it.",
    ),
]
CostProfile = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="Measured profile (`kvpool cost profile` or `kvpool cost fit`): its model, GPU, "
        "TP and fitted prefill replace the catalog's.",
    ),
]
Router = Annotated[
    RouterName, typer.Option("--router", help="How requests are spread over instances.")
]
WritePolicy = Annotated[
    WritePolicyName,
    typer.Option("--write-policy", help="When a tier writes blocks to the next one down."),
]
Eviction = Annotated[
    str,
    typer.Option(
        "--eviction",
        help="Eviction policy: lru | fifo, or one registered in analyzer/cache/policies.py.",
    ),
]
PoolGbps = Annotated[
    float | None,
    typer.Option(
        "--pool-gbps",
        help="Per-node link to the pool, GB/s (1e9 B/s; default: the pool tier's catalog "
        "figure, rdma-200).",
    ),
]
LocalCapacity = Annotated[
    str | None,
    typer.Option(
        "--local-capacity-tokens",
        help=f"HBM prefix cache per instance, {_CAPACITY} (default: from the model and GPU).",
    ),
]
DramCapacity = Annotated[
    str | None,
    typer.Option(
        "--dram-capacity-tokens",
        help=f"Host DRAM given to KV per node, all its instances together, {_CAPACITY} "
        "(default: 512 GB of KV).",
    ),
]
PoolCapacity = Annotated[
    str | None,
    typer.Option(
        "--pool-capacity-tokens",
        help=f"Whole pooled store, {_CAPACITY} (default: the nodes' DRAM, summed).",
    ),
]
Warmup = Annotated[
    float,
    typer.Option(
        "--warmup",
        help="Fraction of requests that only warm the caches, not measured (0 = cold start).",
    ),
]
TtftSlo = Annotated[
    float, typer.Option("--ttft-slo", help="p90 TTFT target in seconds, for the rate search.")
]


def ingest_options(
    *,
    block_size: int | None,
    fmt: str | None,
    template: str,
    tools_position: str,
    tokenizer: str,
    token_ratio: float,
    salt_file: Path | None,
    hash_key: list[str] | None,
    time_field: str | None,
    time_unit: str,
    prompt_column: str | None,
    time_column: str | None,
    session_column: str | None,
    strict: bool,
    no_exact: bool,
    exact_max_mib: int,
    previews: bool = False,
    keep_names: bool = False,
    jobs: int | None = 1,
    ray: str | None = None,
) -> Any:  # analyzer.ingest.IngestOptions (imported here, not at module load)
    """The :class:`~analyzer.ingest.IngestOptions` the ingest flags describe."""
    from analyzer.errors import UsageError
    from analyzer.ingest.options import IngestOptions
    from analyzer.ingest.parallel import resolve_jobs

    if exact_max_mib < 1:
        raise UsageError(f"--exact-max-mib must be at least 1, got {exact_max_mib}")
    return IngestOptions(
        block_size=block_size,
        fmt=fmt,
        template=template,
        tools_position=tools_position,
        tokenizer=tokenizer,
        token_ratio=token_ratio,
        strict=strict,
        salt_file=salt_file,
        hash_keys=hash_keys(hash_key),
        time_field=time_field,
        time_unit=time_unit,
        prompt_column=prompt_column,
        time_column=time_column,
        session_column=session_column,
        exact=not no_exact,
        exact_max_bytes=exact_max_mib << 20,
        previews=previews,
        keep_names=keep_names,
        jobs=resolve_jobs(jobs),
        ray_address=ray,
    )


# What may follow --ray as its address; anything else (an input file, another flag) means
# that --ray was given alone (typer has no options with optional values).
_RAY_ADDRESS = re.compile(r"(auto|local|ray://\S+|[\w.-]+:\d+)")


def bare_ray(argv: list[str]) -> list[str]:
    """``argv`` with ``local`` after a ``--ray`` that has no address."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--":
            return out + argv[i + 1 :]
        if arg == "--ray" and (i + 1 == len(argv) or not _RAY_ADDRESS.fullmatch(argv[i + 1])):
            out.append("local")
    return out


def hash_keys(given: list[str] | None) -> tuple[str, ...]:
    """The block-hash keys ``--hash-key`` asks for: the model always (engines never share
    KV across models) plus those given, unless ``none`` is among them (then only the
    others, so ``--hash-key none`` lets every model share)."""
    keys = [k.strip().lower() for k in given or ()]
    rest = tuple(dict.fromkeys(k for k in keys if k not in ("none", "model")))
    return rest if "none" in keys else ("model", *rest)


def capacity(value: str | None, flag: str) -> int | None:
    """A capacity flag's token count (None when the flag was not given)."""
    if value is None:
        return None
    from analyzer.replay.config import parse_capacity

    return parse_capacity(value, flag)


def input_bytes(inputs: list[Path]) -> int:
    """Total size of the input files, for the reading progress bar."""
    return sum(p.stat().st_size for p in inputs if p.is_file())
