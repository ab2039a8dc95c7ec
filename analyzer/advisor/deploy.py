"""The deployment bundle: the files a team copies into its deployment, per product and
per option (the recommended one and the runner-up), written to ``deploy/`` in the
report directory.

Every size comes from the one sizing record through
:func:`analyzer.advisor.sizing.unit_sizes` and the product configs of
:mod:`analyzer.advisor.products`, so the bundle, the report's settings table and the
dashboard cannot disagree. Every file says which product versions it was checked
against (a comment; in JSON, the ``_checked_against`` key, which the products' loaders
ignore). ``@NODE_IP@`` marks the one value each node fills in (its own address): the
launch scripts do it with ``sed``, the Kubernetes form takes the pod IP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from analyzer.advisor import products as P
from analyzer.advisor import salting
from analyzer.advisor.deploy_local import _local, _local_nvme, _prefix_only
from analyzer.advisor.deploy_pooled import _pooled
from analyzer.advisor.deploy_text import ROOT as ROOT  # re-exported for its users
from analyzer.advisor.deploy_text import DeployFile as DeployFile  # re-exported
from analyzer.advisor.deploy_text import _checked
from analyzer.advisor.deploy_text import checked_all as checked_all  # re-exported
from analyzer.advisor.figures import DeployOption
from analyzer.advisor.pilot import PilotCommand
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import STAGING_PER_RANK_BYTES, Sizing, unit_sizes
from analyzer.advisor.words import option_name
from analyzer.quoting import comment, md_code, md_text

# The option each folder of deploy/ holds, by its one name (analyzer.advisor.words).
_OPTION_OF = {
    DeployOption.PREFIX_CACHE_ONLY: "local",
    DeployOption.LOCAL_OFFLOAD: "local+dram",
    DeployOption.LOCAL_OFFLOAD_NVME: "local+dram+nvme",
    DeployOption.POOLED: "pooled",
}


def _named(mode: DeployOption) -> str:
    return option_name(_OPTION_OF[mode])


def _index(
    files: list[DeployFile],
    sizings: dict[DeployOption, Sizing],
    recommended: DeployOption,
    pilot: Sequence[PilotCommand],
    model: ServedModel,
    isolation: str = "shared",
    tenants: int = 0,
    root: str = ROOT,
) -> DeployFile:
    lines = [
        "# Deployment bundle",
        "",
        f"Recommended option: **{_named(recommended)}** (`{recommended}`)."
        + "".join(
            f" Runner-up (the next option meeting the SLO, if this one is turned down): "
            f"**{_named(m)}** (`{m}`)."
            for m in sizings
            if m != recommended
        ),
        "",
    ]
    for mode, sz in sizings.items():
        lines.append(
            f"- `{mode}`: {sz.instances} instance{'' if sz.instances == 1 else 's'} of "
            f"{sz.tp} GPU{'' if sz.tp == 1 else 's'}, {sz.instances_per_node} per node, on "
            f"{sz.nodes} node{'' if sz.nodes == 1 else 's'}."
        )
    lines += [
        "",
        "Each file names the product versions it was checked against.",
    ]
    if any(f.option == DeployOption.POOLED for f in files):
        lines += [
            "`@NODE_IP@` is the one value each node fills in (its own address; the launch",
            "scripts take `NODE_IP` from the environment).",
            "",
            "Start order for the pooled option: `mooncake-master/start.sh` once, then one",
            "stack's `launch.sh` on every serving node.",
        ]
    if any(f.option == DeployOption.LOCAL_OFFLOAD_NVME for f in files):
        lines += [
            "`@NVME_DIR@` is a folder on each node's local NVMe (the launch scripts take",
            "`NVME_DIR` from the environment).",
        ]
    lines.append("")
    if model.setup:
        lines += [
            "The model is served from a local folder: set `MODEL` to its path before "
            f"running a script or a pilot command ({md_text(model.setup)}).",
            "",
        ]
    if isolation == "shared":
        lines += [salting.shared_paragraph(tenants), ""]
    else:
        lines += [
            f"**Tenant isolation ({isolation})**: every request must carry a cache salt "
            "set by the gateway; `isolation/README.md` says how, which stacks key every "
            "tier by it, and how to test it. Stacks that would share blocks across "
            "tenants at these versions are not written (their folder holds ISOLATION.md).",
            "",
        ]
    for mode, sz in sizings.items():
        units = unit_sizes(sz, mode)
        if not units:
            continue
        lines += [
            f"## Sizes per process: {mode}",
            "",
            "| stack | setting | per | bytes each | units (per node) | total |",
            "|---|---|---|---|---|---|",
        ]
        for u in units:
            lines.append(
                f"| {u.product} | `{u.setting}` | {u.unit} | {u.written_bytes:,} | "
                f"{u.units} ({u.units_per_node}) | {u.total} {u.total_bytes:,} B |"
            )
        if mode == DeployOption.POOLED:
            lines.append(
                f"\nBeside the pool, each GPU rank keeps {STAGING_PER_RANK_BYTES:,} bytes of "
                "transfer staging (Mooncake `local_buffer_size`, LMCache's CPU buffer, "
                "HiCache's host pool in front of L3)."
            )
        lines.append("")
    lines += ["## Files", ""]
    lines += [f"- `{f.path.removeprefix(root + '/')}` ({f.role}, {f.stack})" for f in files]
    if pilot:
        lines += ["", "## Pilot commands", ""]
        for c in pilot:
            lines += [
                f"{c.tool}: {c.purpose}",
                "",
                md_code(f"# {comment(c.note)}\n{c.command}", "bash"),
                "",
            ]
    return DeployFile(
        f"{root}/README.md",
        recommended,
        "index",
        "all",
        "markdown",
        checked_all(),
        "\n".join(lines).rstrip() + "\n",
    )


def bundle(
    sizings: dict[DeployOption, Sizing],
    recommended: DeployOption | None,
    *,
    model: ServedModel,
    master: str = "mooncake-master:50051",
    pilot: Sequence[PilotCommand] = (),
    isolation: str = "shared",
    tenants: int = 0,
    folder: str = "",
    why: str = "",
) -> tuple[DeployFile, ...]:
    """The bundle for each option in ``sizings`` (recommended first, then the
    runner-up), plus ``deploy/README.md`` indexing them; under ``deploy/FOLDER/`` for one
    model of several. Under ``isolation`` tenant or user, :func:`salted` keeps the stacks
    that key every tier by the cache salt and adds ``isolation/``; ``tenants``: how many
    the log has (for the shared note). No sizing (nothing to deploy): the README alone,
    saying ``why``."""
    root = f"{ROOT}/{folder}" if folder else ROOT
    if not sizings or recommended is None:
        text = "# Deployment bundle\n\n" + md_text(why or "Nothing to deploy.") + "\n"
        return (
            DeployFile(
                f"{root}/README.md",
                DeployOption.PREFIX_CACHE_ONLY,
                "index",
                "all",
                "markdown",
                checked_all(),
                text,
            ),
        )
    files: list[DeployFile] = []
    for mode, sz in sizings.items():
        role = "recommended" if mode == recommended else "runner-up"
        net = P.wiring_for(sz, master)
        if mode == DeployOption.POOLED:
            files += _pooled(sz, model, net, role)
        elif mode == DeployOption.LOCAL_OFFLOAD:
            files += _local(sz, model, role)
        elif mode == DeployOption.LOCAL_OFFLOAD_NVME:
            files += _local_nvme(sz, model, role)
        else:
            files += _prefix_only(sz, model, role)
    if isolation != "shared":
        probe = next((c for c in pilot if c.purpose.startswith("tenant isolation")), None)
        files = salted(files, isolation, recommended, probe)
    if folder:
        files = [replace(f, path=root + f.path.removeprefix(ROOT)) for f in files]
    return (
        _index(files, sizings, recommended, pilot, model, isolation, tenants, root),
        *files,
    )


def salted(
    files: list[DeployFile],
    isolation: str,
    recommended: DeployOption,
    probe: PilotCommand | None = None,
) -> list[DeployFile]:
    """The bundle under a cache salt per tenant or user: each stack whose every tier keys
    by the salt at the versions the bundle targets is kept; each other one is replaced by
    an ``ISOLATION.md`` saying that it would share blocks across tenants and what fixes
    it (analyzer/advisor/salting.py); ``deploy/isolation/`` holds the gateway side."""
    by_stack: dict[tuple[DeployOption, str], list[DeployFile]] = {}
    for f in files:
        by_stack.setdefault((f.option, f.stack), []).append(f)
    out: list[DeployFile] = []
    stacks = list(salting.bundle_stacks(by_stack))
    for (option, stack), group in by_stack.items():
        status = salting.stack_salt(option, stack)
        assert status is not None, f"no salt paths for {option} {stack}"
        if status.holds:
            out += group
            continue
        folder = group[0].path.rsplit("/", 1)[0]
        text = (
            f"# {md_text(stack)}: not written under tenant isolation\n\n"
            f"{md_text(salting.refusal(status))}\n\nSee ../../isolation/README.md.\n"
        )
        out.append(
            DeployFile(f"{folder}/ISOLATION.md", option, group[0].role, stack, "markdown",
                       group[0].checked, text)
        )  # fmt: skip
    d = f"{ROOT}/isolation"
    checked = _checked("vLLM", "SGLang HiCache")
    run = (
        probe.command
        if probe is not None
        else "kvpool probe http://ENGINE_A:8000 http://ENGINE_B:8000 --model MODEL"
    )

    def add(path: str, kind: str, text: str) -> None:
        out.append(
            DeployFile(f"{d}/{path}", recommended, "isolation", "gateway", kind, checked, text)
        )

    add("README.md", "markdown", salting.isolation_readme(isolation, stacks, run, md_text, md_code))
    hook = salting.litellm_hook(isolation)
    add("litellm/cache_salt_hook.py", "python", f"# Checked against: {comment(checked)}\n{hook}")
    add(
        "litellm/config.yaml",
        "yaml",
        f"# Checked against: {comment(checked)}\n{salting.litellm_config()}",
    )
    add(
        "envoy/cache-salt-filter.yaml",
        "yaml",
        f"# Checked against: {comment(checked)}\n{salting.envoy_filter()}",
    )
    client = salting.client_example(isolation)
    add("client/cache_salt_client.py", "python", f"# Checked against: {comment(checked)}\n{client}")
    return out


def deploy_sizings(
    sizing: Sizing, verdict: str, resize: Callable[[bool], Sizing]
) -> dict[DeployOption, Sizing]:
    """The sized options to write, recommended first: ``{mode: sizing}``. ``resize(pool)``
    sizes the runner-up when it needs the other kind of sizing (with or without a pool)."""
    rec = P.deployed_mode(sizing, P.mode_for(verdict))
    out = {rec: sizing}
    alt_mode = P.runner_up(rec)
    alt = (
        sizing
        if (alt_mode == DeployOption.POOLED) == sizing.pool
        else resize(alt_mode == DeployOption.POOLED)
    )
    alt_mode = P.deployed_mode(alt, alt_mode)
    out.setdefault(alt_mode, alt)
    return out


@dataclass(frozen=True, slots=True)
class PerProcessRow:
    """One product setting's size per process: what the setting holds
    (``bytes_each``, as written), how many processes hold one, and the total they add
    up to (``total_bytes`` of the ``total``, "pool" or "node DRAM")."""

    option: DeployOption
    stack: str
    setting: str
    per: str
    bytes_each: int
    units: int
    units_per_node: int
    total: str
    total_bytes: int

    def to_json(self) -> dict[str, object]:
        return {
            "option": self.option,
            "stack": self.stack,
            "setting": self.setting,
            "per": self.per,
            "bytes_each": self.bytes_each,
            "units": self.units,
            "units_per_node": self.units_per_node,
            "total": self.total,
            "total_bytes": self.total_bytes,
        }


def per_process(sizings: dict[DeployOption, Sizing]) -> tuple[PerProcessRow, ...]:
    """Every product's size per process, for the report: what each setting holds, how
    many processes hold one, and the total they add up to."""
    return tuple(
        PerProcessRow(
            option=mode,
            stack=u.product,
            setting=u.setting,
            per=u.unit,
            bytes_each=u.written_bytes,
            units=u.units,
            units_per_node=u.units_per_node,
            total=u.total,
            total_bytes=u.total_bytes,
        )
        for mode, sz in sizings.items()
        for u in unit_sizes(sz, mode)
    )
