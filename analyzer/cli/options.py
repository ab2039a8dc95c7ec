"""Flags that several commands share, each declared once: one name, one default, one help.

A command lists the aliases it takes (``block_size: BlockSize = None``); the default
written beside an alias is the one given here in ``DEFAULTS``, and
``tests/cli/test_cli_defaults.py`` checks that these equal the library's own defaults
(:class:`~analyzer.ingest.IngestOptions`, :class:`~analyzer.replay.ClusterConfig`,
:class:`~analyzer.advisor.AnalyzeOptions`) and the dashboard's starting controls, so that
the same trace and flags give the same figures in every command.

Only typer and the standard library are imported here: ``kvpool --help`` must not pay
for numpy, pyarrow or numba.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args, get_type_hints

import typer

if TYPE_CHECKING:
    from analyzer.ingest import IngestOptions
    from analyzer.replay.config import ClusterConfig

# The one default of every shared flag (flag name -> value), as the commands use them.
# The ingest and cluster flags' defaults are their fields' in IngestFlags and ClusterFlags
# (below), added at the end of this module.
DEFAULTS: dict[str, object] = {
    "--ttft-slo": 2.0,
    "--isolation": "shared",
}

_CAPACITY = "tokens (1e6 style accepted) or 'unbounded'"

# Closed sets of names, checked by the parser and listed in --help. Written out here so
# that `kvpool --help` imports no library module; tests/cli/test_cli_defaults.py checks each
# against the tuple its owning stage validates with.
TemplateName = Literal["chatml", "llama3"]  # tokenize.render.TEMPLATES
ToolsPositionName = Literal["in-system", "after-system", "before-system"]  # TOOLS_POSITIONS
TimeUnitName = Literal["auto", "s", "ms", "us", "ns"]  # ingest.options.TIME_UNITS
RouterName = Literal[  # ROUTERS
    "round-robin", "least-loaded", "session", "prefix-aware", "kv-router"
]
DramScopeName = Literal["instance", "node"]  # replay.config.DRAM_SCOPES
KvDtypeName = Literal["bf16", "fp16", "fp8"]  # cost.dtypes.KV_DTYPES
# replay.config.WRITE_POLICIES
WritePolicyName = Literal["write-through", "write-through-selective", "on-evict"]
ServingName = Literal["aggregated", "disaggregated"]  # replay.config.SERVING
ConnectorName = Literal["lmcache", "vllm", "hicache"]  # replay.config.CONNECTORS
IsolationName = Literal["shared", "tenant", "user"]  # reuse.isolation.POLICIES
FormatName = Literal[  # ingest.detect.FORMATS
    "canonical",
    "openai",
    "openai-batch",
    "gateway-csv",
    "gateway-parquet",
    "generic-jsonl",
    "generic-csv",
    "generic-parquet",
    "mooncake",
    "bailian",
    "ragpulse",
    "azure",
    "burstgpt",
    "litellm",
    "langfuse",
    "helicone",
    "portkey",
    "otel",
    "kv-events",
    "gateway",  # aliases: resolved per file by its container (ingest.detect.FORMAT_ALIASES)
    "generic",
]
CHOICES = {
    "--format": get_args(FormatName),
    "--template": get_args(TemplateName),
    "--tools-position": get_args(ToolsPositionName),
    "--time-unit": get_args(TimeUnitName),
    "--router": get_args(RouterName),
    "--dram-scope": get_args(DramScopeName),
    "--kv-dtype": get_args(KvDtypeName),
    "--write-policy": get_args(WritePolicyName),
    "--isolation": get_args(IsolationName),
}

# --- inputs ------------------------------------------------------------------------------

_SCHEMES = ("s3://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "hf://")  # storage.SCHEMES


def path_or_url(value: str) -> Path:
    """A file argument as given: a ``Path``, or an object-storage URL (``s3://b/k``) kept
    as the string it is (a ``Path`` would fold its ``//``); :mod:`analyzer.cli.stdio`
    turns a URL input into a local copy, and an output URL is uploaded once written."""
    if value.lower().startswith(_SCHEMES):
        return value  # type: ignore[return-value]
    return Path(value)


Inputs = Annotated[
    list[Path],
    typer.Argument(
        help="Request logs, public traces or canonical .parquet (gzip/zstd ok; "
        "any format `kvpool convert` reads); '-' reads stdin; s3://, gs://, az://, hf:// "
        "URLs are read from object storage.",
        parser=path_or_url,
    ),
]

# --- ingest: how the inputs are read and hashed (IngestOptions) ------------------------


def _format_name(value: str) -> str:
    """``--format``'s value, checked against the formats with a did-you-mean (the
    message of ``ingest.detect.unknown_format``, without importing the stage)."""
    names = get_args(FormatName)
    if value in names:
        return value
    import difflib

    close = difflib.get_close_matches(value.lower(), names, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise typer.BadParameter(f"unknown format '{value}'{hint}; one of: " + ", ".join(names))


Format = Annotated[
    str | None,
    typer.Option(
        "--format",
        metavar="<format>",
        parser=_format_name,
        help="Input format: " + ", ".join(get_args(FormatName)) + " (default: detected per "
        "file from its content, so stdin works too; gateway and generic pick the file's "
        "CSV, JSON-lines or Parquet form).",
    ),
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
TenantField = Annotated[
    str | None,
    typer.Option(
        "--tenant-field",
        help="Field or column holding the tenant (a.b.c in JSON records), in place of the "
        "format's own (docs/formats.md).",
    ),
]
UserField = Annotated[
    str | None,
    typer.Option(
        "--user-field",
        help="Field or column holding the end user (a.b.c in JSON records), in place of the "
        "format's own (docs/formats.md).",
    ),
]
Strict = Annotated[bool, typer.Option("--strict", help="Stop at the first bad row.")]
OnlyModel = Annotated[
    str | None,
    typer.Option(
        "--only-model", help="Analyze one of the log's models (served name or catalog id) alone."
    ),
]
Isolation = Annotated[
    IsolationName,
    typer.Option(
        "--isolation",
        help="Who may share KV blocks: shared (everyone, no cache salt), tenant (a "
        "cache_salt / extra_key per tenant), user (per end user, else per session); "
        "every figure is measured under it (docs/security.md).",
    ),
]
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
    str | None,
    typer.Option(
        "--model",
        help="Catalog model id (e.g. llama-3.1-70b) or a config.json (default: each model the "
        "log names, as itself; llama-3.1-8b when it names none).",
    ),
]
Gpu = Annotated[
    str,
    typer.Option(
        "--gpu",
        help="GPU: a catalog id or the name a vendor or cloud gives it (h100, H100-SXM, "
        "'NVIDIA H100 80GB HBM3', l40s, ...).",
    ),
]
Tp = Annotated[
    int | None,
    typer.Option(
        "--tp",
        help="Tensor-parallel GPUs per instance (default: the smallest that holds each model's "
        "weights and a working KV budget).",
    ),
]
Instances = Annotated[
    int,
    typer.Option(
        "--instances",
        help="Serving instances in the cluster (prefill instances with --serving disaggregated).",
    ),
]
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
        help="Measured profile (`kvpool cost profile` or `kvpool cost fit`; '-': stdin): its "
        "model, GPU, TP and fitted prefill replace the catalog's.",
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
Serving = Annotated[
    ServingName,
    typer.Option(
        "--serving",
        help="aggregated: prefill and decode in one continuous batch per instance (vLLM, "
        "SGLang); disaggregated: a prefill pool alone, decode beside it (Mooncake).",
    ),
]
MaxNumBatchedTokens = Annotated[
    int | None,
    typer.Option(
        "--max-num-batched-tokens",
        help="Aggregated: tokens one step may take, decode tokens included (default: "
        "vLLM's for the GPU, 8192 on H100-class GPUs).",
    ),
]
MaxNumSeqs = Annotated[
    int | None,
    typer.Option(
        "--max-num-seqs",
        help="Aggregated: requests running at once per instance (default: vLLM's, 1024 on "
        "H100-class GPUs).",
    ),
]
GpuMemoryUtilization = Annotated[
    float,
    typer.Option(
        "--gpu-memory-utilization",
        help="Aggregated: share of each GPU's memory the engine takes for weights, "
        "activations and KV (vLLM's flag; SGLang's --mem-fraction-static); the KV pool "
        "per instance follows unless --local-capacity-tokens gives it.",
    ),
]
Connector = Annotated[
    ConnectorName,
    typer.Option(
        "--connector",
        help="Aggregated: the product moving KV below HBM. lmcache: stores each prompt's "
        "full 256-token chunks as computed; vllm: native CPU offloading, every computed "
        "block; hicache: SGLang HiCache, host-DRAM hits loaded layer by layer beside the "
        "prefill (--write-policy picks write-through, -selective or on-evict).",
    ),
]
HicacheRatio = Annotated[
    float,
    typer.Option(
        "--hicache-ratio",
        help="With --connector hicache: host DRAM per instance as a multiple of its KV "
        "pool (SGLang's flag and default), unless --dram-capacity-tokens or "
        "--hicache-size gives it.",
    ),
]
HicacheSize = Annotated[
    float,
    typer.Option(
        "--hicache-size",
        help="With --connector hicache: host DRAM for KV per GPU in GB (SGLang's flag; "
        "0: --hicache-ratio).",
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
FullReplay = Annotated[
    bool,
    typer.Option(
        "--full-replay",
        help="Replay every request, also above the size replayed in miniature (a session "
        "sample on scaled caches; docs/replay.md).",
    ),
]


@dataclasses.dataclass(frozen=True, slots=True)
class IngestFlags:
    """The flags saying how logs are read and hashed, declared once for every command that
    reads logs (``convert``, ``reuse``, ``replay``, ``analyze``): a new ingest flag is one
    field here (and its line in :meth:`options`), and each of those commands takes it.

    A command asks for the group with :func:`ingest_flags` and receives it as one
    argument, ``ingest: IngestFlags``.
    """

    fmt: Format = None
    block_size: BlockSize = None
    template: Template = "chatml"
    tools_position: ToolsPosition = "in-system"
    tokenizer: Tokenizer = "cl100k"
    token_ratio: TokenRatio = 1.0
    salt_file: SaltFile = None
    hash_key: HashKey = None
    time_field: TimeField = None
    time_unit: TimeUnit = "auto"
    prompt_column: PromptColumn = None
    time_column: TimeColumn = None
    session_column: SessionColumn = None
    tenant_field: TenantField = None
    user_field: UserField = None
    strict: Strict = False
    no_exact: NoExact = False
    exact_max_mib: ExactMaxMib = 320
    jobs: Jobs = None
    ray: Ray = None

    def options(self, *, previews: bool = False, keep_names: bool = False) -> IngestOptions:
        """The :class:`~analyzer.ingest.IngestOptions` these flags describe (imported
        here, not at module load); ``previews`` and ``keep_names`` are the command's
        own output flags."""
        from analyzer.cli.stdio import no_stdio
        from analyzer.errors import UsageError
        from analyzer.ingest.options import IngestOptions

        no_stdio(
            self.salt_file, "--salt-file", "the salt is a secret kept in a file, made on first use"
        )

        if self.exact_max_mib < 1:
            raise UsageError(f"--exact-max-mib must be at least 1, got {self.exact_max_mib}")
        return IngestOptions(
            block_size=self.block_size,
            fmt=self.fmt,
            template=self.template,
            tools_position=self.tools_position,
            tokenizer=self.tokenizer,
            token_ratio=self.token_ratio,
            strict=self.strict,
            salt_file=self.salt_file,
            hash_keys=hash_keys(self.hash_key),
            time_field=self.time_field,
            time_unit=self.time_unit,
            prompt_column=self.prompt_column,
            time_column=self.time_column,
            session_column=self.session_column,
            tenant_field=self.tenant_field,
            user_field=self.user_field,
            exact=not self.no_exact,
            exact_max_bytes=self.exact_max_mib << 20,
            previews=previews,
            keep_names=keep_names,
            jobs=machine_jobs(self.jobs),
            ray_address=self.ray,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterFlags:
    """The flags describing the cluster a trace is replayed on, declared once for every
    command that replays (``replay``, ``analyze``): a new cluster flag is one field here
    (and its line in :meth:`config`), and each of those commands takes it.

    The flags' names are the settings :meth:`~analyzer.replay.ClusterConfig.from_settings`
    takes, the one place a cluster is built from user settings: :meth:`config` passes them
    on, and the dashboard passes its sidebar's values, so the same settings give the same
    cluster everywhere.
    """

    model: Model = None
    gpu: Gpu = "h100"
    tp: Tp = None
    instances: Instances = 4
    gpus_per_node: GpusPerNode = 8
    dram_scope: DramScope = "instance"
    kv_dtype: KvDtype = "bf16"
    weights_dtype: WeightsDtype = None
    router: Router = "prefix-aware"
    eviction: Eviction = "lru"
    write_policy: WritePolicy = "write-through"
    pool_gbps: PoolGbps = None
    local_capacity_tokens: LocalCapacity = None
    dram_capacity_tokens: DramCapacity = None
    pool_capacity_tokens: PoolCapacity = None
    warmup: Warmup = 0.5
    serving: Serving = "aggregated"
    max_num_batched_tokens: MaxNumBatchedTokens = None
    max_num_seqs: MaxNumSeqs = None
    gpu_memory_utilization: GpuMemoryUtilization = 0.9
    connector: Connector = "lmcache"
    hicache_ratio: HicacheRatio = 2.0
    hicache_size: HicacheSize = 0.0

    def config(self, **more: Any) -> ClusterConfig:
        """The :class:`~analyzer.replay.ClusterConfig` these flags describe, built by
        :meth:`~analyzer.replay.ClusterConfig.from_settings` (imported here, not at
        module load). ``more`` sets what no flag names (``time_scale``, links)."""
        from analyzer.replay.config import ClusterConfig

        flags = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return ClusterConfig.from_settings(**flags, **more)


def _group_parameters(group: type) -> list[inspect.Parameter]:
    """A dataclass's fields as keyword-only parameters, typer annotations kept."""
    hints = get_type_hints(group, include_extras=True)
    return [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]
        )
        for f in dataclasses.fields(group)
    ]


_INGEST_PARAMETERS = _group_parameters(IngestFlags)
_CLUSTER_PARAMETERS = _group_parameters(ClusterFlags)


def _with_group(
    command: Callable[..., None],
    name: str,
    group: type,
    parameters: list[inspect.Parameter],
    enter: Callable[[dict[str, Any]], Any] | None = None,
) -> Callable[..., None]:
    """``command`` taking ``group``'s fields as flags in place of its parameter ``name``.

    Typer reads a command's flags from its signature: the wrapper shows the group's
    parameters where ``name`` stands (so ``--help`` lists them in that place), and each
    call gathers their values into one ``group``. ``enter`` (if given) is a context
    manager factory called with the remaining keyword arguments, whose value replaces
    them (the ingest group's stdin copy)."""
    sig = inspect.signature(command, eval_str=True)
    params = list(sig.parameters.values())
    at = [p.name for p in params].index(name)
    # Keyword-only, all of them: typer passes flags by name, and a signature cannot have
    # positional parameters after the group's keyword-only ones.
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    names = [p.name for p in parameters]

    @functools.wraps(command)
    def run(**kwargs: Any) -> None:
        kwargs[name] = group(**{n: kwargs.pop(n) for n in names})
        if enter is None:
            command(**kwargs)
            return
        with enter(kwargs) as kwargs:
            command(**kwargs)

    run.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[*own[:at], *parameters, *own[at + 1 :]]
    )
    return run


@contextlib.contextmanager
def _stdin_inputs(kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from analyzer.cli.stdio import stdin_inputs

    with stdin_inputs(kwargs["inputs"]) as inputs:  # '-': a copy of stdin
        yield {**kwargs, "inputs": inputs}


def ingest_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` every ingest flag, collected into its ``ingest: IngestFlags``.
    An input ``-`` is stdin (:func:`analyzer.cli.stdio.stdin_inputs`)."""
    return _with_group(command, "ingest", IngestFlags, _INGEST_PARAMETERS, _stdin_inputs)


def cluster_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` every cluster flag, collected into its ``cluster: ClusterFlags``."""
    return _with_group(command, "cluster", ClusterFlags, _CLUSTER_PARAMETERS)


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


def machine_jobs(given: int | None, *, say: bool = True) -> int:
    """``--jobs`` as :func:`~analyzer.ingest.parallel.resolve_jobs` takes it (at most the
    cores this process may run on), with a note when that cuts it (unless ``say`` is
    False: a second call for the same flag)."""
    from analyzer.ingest.parallel import resolve_jobs

    jobs = resolve_jobs(given)
    if say and given is not None and given > jobs:
        from analyzer.cli.output import console

        console(stderr=True).print(
            f"note: --jobs {given} is more than the {jobs} cores kvpool may use here; "
            f"running {jobs} processes",
            markup=False,
        )
    return jobs


def hash_keys(given: list[str] | None) -> tuple[str, ...]:
    """The block-hash keys ``--hash-key`` asks for: the model always (engines never share
    KV across models) plus those given, unless ``none`` is among them (then only the
    others, so ``--hash-key none`` lets every model share)."""
    keys = [k.strip().lower() for k in given or ()]
    rest = tuple(dict.fromkeys(k for k in keys if k not in ("none", "model")))
    return rest if "none" in keys else ("model", *rest)


def weights_dtype(value: str | None) -> str | None:
    """``--weights-dtype`` as the catalog names it (``fp16`` is ``bf16``); None: the
    checkpoint's."""
    from analyzer.cost.dtypes import weights_dtype_named

    return weights_dtype_named(value)


def capacity(value: str | None, flag: str) -> int | None:
    """A capacity flag's token count (None when the flag was not given)."""
    if value is None:
        return None
    from analyzer.replay.config import parse_capacity

    return parse_capacity(value, flag)


def input_bytes(inputs: list[Path]) -> int:
    """Total size of the input files, for the reading progress bar."""
    return sum(p.stat().st_size for p in inputs if p.is_file())


def flag_name(param: inspect.Parameter) -> str:
    """The long flag (``--format``) of a parameter annotated with a typer Option.

    Inside ``Annotated``, typer keeps an Option's first name in its ``default``."""
    info = param.annotation.__metadata__[0]
    return next(
        str(d) for d in (info.default, *(info.param_decls or ())) if str(d).startswith("--")
    )


DEFAULTS.update({flag_name(p): p.default for p in (*_INGEST_PARAMETERS, *_CLUSTER_PARAMETERS)})
INGEST_FLAG_NAMES = tuple(flag_name(p) for p in _INGEST_PARAMETERS)
CLUSTER_FLAG_NAMES = tuple(flag_name(p) for p in _CLUSTER_PARAMETERS)
