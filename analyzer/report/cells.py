"""The report outline's parts and how a figure prints in them: a :class:`Section` holds
paragraphs, :class:`Table` rows, chart names, code blocks and links; the functions here
write a share, a size, a time, a bandwidth or money as a cell shows it (one place, so
report.md, report.html and the terminal print the same words).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analyzer.replay.config import Tier
from analyzer.report.schema import NotApplicable


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x: float | NotApplicable | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, NotApplicable):
        return x.short
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def threshold_pct(value: float) -> str:
    """A decision threshold of this report's run (``options.thresholds``) as "25%"."""
    return f"{100 * value:.0f}%"


def gb(n_bytes: float | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / 1e9:,.2f} GB"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:,.0f} ms"


def gbps(x: float | NotApplicable | None) -> str:
    """A bandwidth in GB/s with its Gb/s (bits) beside it."""
    if x is None or isinstance(x, NotApplicable):
        return num(x)
    return f"{num(x)} GB/s ({num(8 * x)} Gb/s)"


def usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"-${-x:,.0f}" if x < 0 else f"${x:,.0f}"


TIER_LABEL = {Tier.DRAM: "Host DRAM", Tier.POOL: "Pool link", Tier.NVME: "Local NVMe"}


def check_value(name: str, x: float | None) -> str:
    """A decision check's value in its unit: money, bandwidth or a percentage."""
    if x is None:
        return "-"
    if "USD" in name:
        return usd(x)
    if name.startswith("bandwidth"):
        return gbps(x)
    return pct(x)


def criterion_value(metric: str, x: float | None) -> str:
    """A gate threshold or projection in its unit."""
    if x is None:
        return "-"
    if metric.endswith("_s"):
        return ms(x)
    if metric.endswith("_h"):
        return f"{x:g} h"
    if metric.endswith("_tokens"):
        return f"{x:,.0f} tokens"
    if metric in ("p99_ttft_ratio", "p99_drift"):
        return f"{x:.2f}x"
    if metric == "throughput_gain":
        return f"{100 * abs(x):.1f}% {'more' if x >= 0 else 'less'}"
    return pct(x)


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    id: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)  # chart names
    code: list[tuple[str, str, str]] = field(default_factory=list)  # (title, lang, text)
    links: list[tuple[str, str]] = field(default_factory=list)  # (relative path, note)
