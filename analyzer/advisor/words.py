"""One vocabulary: each option's one name and description, and how every output writes
counts, signs, units and truncated lists.

The CLI, the reports and the dashboard name an option and write a figure through
these functions only, so an option has the same name everywhere, a change is said in
words ("saves 181 ms", never "-181 ms"), a count agrees with its noun ("1 GPU"), a
figure has one unit, and a list cut short says how many it leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence

# The one name of each option (scenario), as every output writes it. Keyed by the
# scenarios' names (analyzer.replay.config.Scenario, a StrEnum, looks them up as they
# are): `kvpool reuse` names models through this module without loading the replay.
OPTION_NAME: dict[str, str] = {
    "none": "no prefix cache",
    "local": "HBM prefix cache only",
    "local+dram": "local DRAM offload",
    "local+dram+nvme": "local DRAM + NVMe offload",
    "pooled": "pooled KV store",
}
# What each option deploys, in the products' own words.
OPTION_DESCRIPTION: dict[str, str] = {
    "none": "every prompt token prefilled (a reference, not deployed)",
    "local": "each engine's own prefix cache in GPU memory (vLLM automatic prefix "
    "caching, SGLang RadixAttention): the baseline",
    "local+dram": "plus a host DRAM tier private to each engine (vLLM CPU offloading, "
    "LMCache local CPU, SGLang HiCache L2)",
    "local+dram+nvme": "plus a small host DRAM tier and a local NVMe tier on each node "
    "(LMCache local CPU + local disk, SGLang HiCache L2 + file storage)",
    "pooled": "plus one KV store shared by every engine over RDMA (Mooncake Store, "
    "LMCache remote, SGLang HiCache L3)",
}


def option_name(option: str) -> str:
    """An option's name (a user's own scenario keeps its own)."""
    return OPTION_NAME.get(option, option)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 GPU``, ``2 GPUs``, ``1,024 instances``."""
    word = noun if n == 1 else (plural or noun + "s")
    return f"{n:,} {word}"


def gpus(n: int | None) -> str:
    return "an unknown number of GPUs" if n is None else count(n, "GPU")


def ms(seconds: float | None) -> str:
    """A time in whole milliseconds (``-`` when unknown)."""
    return "-" if seconds is None else f"{1000 * seconds:,.0f} ms"


def usd(x: float | None) -> str:
    """Dollars, whole (``not priced`` when unknown); a negative amount keeps its sign only
    in tables of signed figures, never in a sentence (see :func:`usd_change`)."""
    if x is None:
        return "not priced"
    return f"-${-x:,.0f}" if x < 0 else f"${x:,.0f}"


def ms_change(delta_s: float, *, less: str = "saves", more: str = "adds") -> str:
    """A TTFT change in words: ``saves 181 ms``, ``adds 12 ms``, ``changes it by less
    than 1 ms`` (never ``-0 ms``)."""
    v = 1000 * delta_s
    if round(abs(v)) == 0:
        return "changes it by less than 1 ms"
    return f"{less if v < 0 else more} {abs(v):,.0f} ms"


def usd_change(delta: float, *, less: str = "saves", more: str = "costs") -> str:
    """A monthly money change in words: ``saves $1,260 per month``, ``costs $851 per
    month more``, ``costs the same``."""
    if round(abs(delta)) == 0:
        return "costs the same"
    return (
        f"{less} ${abs(delta):,.0f} per month"
        if delta < 0
        else f"{more} ${delta:,.0f} per month more"
    )


def pct_change(fraction: float, *, less: str = "lower", more: str = "higher") -> str:
    """A relative change in words: ``16.0% lower``, ``2.7% higher``."""
    if round(abs(100 * fraction), 1) == 0:
        return "unchanged"
    return f"{100 * abs(fraction):.1f}% {less if fraction < 0 else more}"


def multiple(x: float, of: str) -> str:
    """A rate multiple with what it multiplies: ``1.14 x the log's mean rate``."""
    return f"{x:.3g} x {of}"


def listed(names: Sequence[str], most: int = 5) -> str:
    """``a, b and c``; ``a, b, c, d, e and 3 more``: a list that says what it leaves out."""
    names = list(names)
    if not names:
        return "none"
    if len(names) <= most:
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{', '.join(names[:most])} and {len(names) - most} more"
