"""The links to the KV tiers below HBM as the user sets them, and their one resolver.

A link is a catalog tier (``models/hardware.toml``: ``pcie-gen5-dram``, ``nvme-gen4``,
``rdma-200``, ...) and, optionally, a bandwidth and a first-byte latency that replace
the tier's. ``None`` is the one way to say "the catalog's figure", in the command
line's flags, a scenario file, the library and the dashboard alike (a 0 is a value, and
:class:`~analyzer.replay.ClusterConfig` refuses it).

:func:`resolve_link` turns a :class:`LinkSettings` into the figures in force: the replay
moves blocks at them, the advisor prints them beside the break-even bandwidth, and the
dashboard charts them, so the three always agree on what a link is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from analyzer.cost import TierSpec, get_tier


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """One link: its catalog tier, and the bandwidth (GB/s, 1e9 bytes per second) and
    first-byte latency (seconds) that replace the tier's; None: the tier's own."""

    tier: str
    gbps: float | None = None
    latency_s: float | None = None

    @property
    def overridden(self) -> bool:
        """Whether a bandwidth or latency replaces the catalog's."""
        return self.gbps is not None or self.latency_s is not None


class TierView(Protocol):
    """What sees a catalog tier as one instance does (a cost model:
    :meth:`analyzer.cost.CostModel.tier_link` gives host DRAM one PCIe link per GPU)."""

    def tier_link(self, tier: str | TierSpec) -> TierSpec: ...


def resolve_link(link: LinkSettings, seen_by: TierView | None = None) -> TierSpec:
    """The link in force: the catalog tier (as ``seen_by``'s instance sees it, when
    given, else as the catalog lists it, per link) with the set bandwidth and latency in
    place of the tier's. A link with a figure set is named for them (``"rdma-200 link at
    50 GB/s"``), so a table or chart never shows a set figure under the tier's name alone.
    """
    spec = seen_by.tier_link(link.tier) if seen_by is not None else get_tier(link.tier)
    if not link.overridden:
        return spec
    gbps = spec.bandwidth_gbps if link.gbps is None else float(link.gbps)
    latency_s = spec.latency_s if link.latency_s is None else float(link.latency_s)
    set_figures = [f"{gbps:g} GB/s"] if link.gbps is not None else []
    if link.latency_s is not None:
        set_figures.append(f"{latency_s * 1e6:g} µs to the first byte")
    return replace(
        spec,
        name=f"{spec.name} link at {', '.join(set_figures)}",
        bandwidth_gbps=gbps,
        latency_s=latency_s,
    )
