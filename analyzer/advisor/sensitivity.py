"""The sensitivity table's rows: one input the team controls changed, and the verdict
on the plans made for it (:mod:`analyzer.advisor.explore` makes them; nothing here is
scaled from another plan's figures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analyzer.advisor.words import listed


@dataclass(frozen=True, slots=True)
class FlipRow:
    dimension: str  # "GPU price", "DRAM price", "load", "TTFT SLO", "pool link"
    label: str
    verdict: str
    flips: bool
    note: str

    def to_json(self) -> dict[str, object]:
        return {
            "dimension": self.dimension,
            "value": self.label,
            "verdict": self.verdict,
            "flips": self.flips,
            "note": self.note,
        }


def summarize(rows: Sequence[FlipRow]) -> list[str]:
    """One sentence per dimension: the values that flip the verdict, or none."""
    out = []
    dims: list[str] = []
    for r in rows:
        if r.dimension not in dims:
            dims.append(r.dimension)
    for dim in dims:
        mine = [r for r in rows if r.dimension == dim]
        flips = [r for r in mine if r.flips]
        if flips:
            out.append(f"{dim}: " + "; ".join(f"{r.label} gives {r.verdict}" for r in flips))
        else:
            out.append(f"{dim}: no flip across {listed([r.label for r in mine], most=6)}")
    return out
