"""Timestamps: numbers in s/ms/us/ns (unit chosen per file by magnitude), ISO-8601 strings.

A numeric timestamp's unit is decided once per file from the largest value in it: at
least 1e17 is nanoseconds, 1e14 microseconds, 1e11 milliseconds, anything smaller
seconds (absolute epochs of 2001-2286 in any unit fall in these bands). Formats with a
documented unit (Mooncake ms, Bailian/RAGPulse/BurstGPT s) use it, and ``--time-unit``
overrides both. Times of at least 1e8 s (1973) are absolute epochs; smaller ones are
relative to the trace start. ISO strings without a zone are read as UTC, and fractions
longer than microseconds (Azure writes seven digits) are cut to microseconds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
ABSOLUTE_MIN_S = 1e8
_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_time(value: object) -> tuple[float, bool]:
    """(value, is_iso): ISO strings become epoch seconds; numbers are returned raw.

    Raises ValueError for anything else.
    """
    if isinstance(value, bool):
        raise ValueError("boolean")
    if isinstance(value, int | float):
        v = float(value)
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError("not finite")
        return v, False
    if isinstance(value, str):
        s = value.strip()
        try:
            v = float(s)
        except ValueError:
            pass
        else:
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError("not finite")
            return v, False
        s = _FRACTION.sub(r"\1", s)
        if s.endswith(("Z", "z")):
            s = s[:-1] + "+00:00"
        dt = datetime.fromisoformat(s)  # raises ValueError
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp(), True
    raise ValueError(f"{type(value).__name__} is not a time")


def unit_for(max_value: float, forced: str | None = None) -> str:
    if forced:
        return forced
    v = abs(max_value)
    if v >= 1e17:
        return "ns"
    if v >= 1e14:
        return "us"
    if v >= 1e11:
        return "ms"
    return "s"
