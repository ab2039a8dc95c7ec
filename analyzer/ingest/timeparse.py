"""Timestamps: numbers in s/ms/us/ns (unit chosen per file by magnitude), ISO-8601 strings.

A numeric timestamp's unit is decided once per file from the largest value in it: at
least 1e17 is nanoseconds, 1e14 microseconds, 1e11 milliseconds, anything smaller
seconds (absolute epochs of 2001-2286 in any unit fall in these bands). A file whose
numbers are all absolute epochs, each in its own band, but in more than one band (a log
that switched from s to ms) has each value read in its own unit, and says so. Formats with a
documented unit (Mooncake ms, Bailian/RAGPulse/BurstGPT s) use it, and ``--time-unit``
overrides both. Times of at least 1e8 s (1973) are absolute epochs; smaller ones are
relative to the trace start. ISO strings without a zone are read as UTC, and fractions
longer than microseconds (Azure writes seven digits) are cut to microseconds. Parquet
timestamp columns arrive as ``datetime`` objects and are read like ISO strings.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime, time

import numpy as np

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
ABSOLUTE_MIN_S = 1e8
_FRACTION = re.compile(r"(\.\d{6})\d+")


def _epoch_s(dt: datetime) -> float:
    """Epoch seconds of ``dt``; a zone-less time is UTC."""
    return (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()


def parse_time(value: object) -> tuple[float, bool]:
    """(value, is_iso): ISO strings become epoch seconds; numbers are returned raw.

    Raises ValueError for anything else.
    """
    if isinstance(value, date):  # Parquet timestamp / date32 columns
        dt = value if isinstance(value, datetime) else datetime.combine(value, time())
        return _epoch_s(dt), True
    if isinstance(value, bool):
        raise ValueError("boolean")
    if isinstance(value, int | float):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError("not finite")
        return v, False
    if isinstance(value, str):
        s = value.strip()
        try:
            v = float(s)
        except ValueError:
            pass
        else:
            if not math.isfinite(v):
                raise ValueError("not finite")
            return v, False
        s = _FRACTION.sub(r"\1", s)
        if s.endswith(("Z", "z")):
            s = s[:-1] + "+00:00"
        return _epoch_s(datetime.fromisoformat(s)), True  # raises ValueError
    raise ValueError(f"{type(value).__name__} is not a time")


# Lower bound of each unit's band, largest first; below the last, seconds.
_BANDS = ((1e17, "ns"), (1e14, "us"), (1e11, "ms"))
_BAND_UNITS = (*(u for _, u in _BANDS), "s")


def unit_for(max_value: float, forced: str | None = None) -> str:
    if forced:
        return forced
    v = abs(max_value)
    return next((u for lo, u in _BANDS if v >= lo), "s")


def numeric_seconds(
    values: np.ndarray, forced: str | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """One file's numeric times in seconds, and how many were read in each unit.

    ``forced``: that unit for all. Otherwise the file's unit is the band of its largest
    value, unless every value is an absolute epoch (at least ``ABSOLUTE_MIN_S``) in the
    unit of its own band and the bands differ: then each is read in its own unit (the
    returned counts have more than one unit).
    """
    v = np.asarray(values, dtype=np.float64)
    if forced is None and v.size:
        mag = np.abs(v)
        band = np.select([mag >= lo for lo, _ in _BANDS], range(len(_BANDS)), len(_BANDS))
        secs = v * np.array([UNITS[u] for u in _BAND_UNITS])[band]
        counts = np.bincount(band, minlength=len(_BAND_UNITS))
        if np.count_nonzero(counts) > 1 and bool(np.all(secs >= ABSOLUTE_MIN_S)):
            return secs, {u: int(n) for u, n in zip(_BAND_UNITS, counts, strict=True) if n}
    unit = unit_for(float(np.abs(v).max()) if v.size else 0.0, forced)
    return v * UNITS[unit], {unit: int(v.size)}


# A timestamp this many spreads of the file's central 80% beyond it is an outlier.
OUTLIER_SPREADS = 10.0


def timestamp_outliers(values: np.ndarray) -> np.ndarray:
    """Which of one file's raw timestamps lie far outside the others (a bool mask).

    One row with time 0 among epoch seconds made a trace of 1.7e9 s; one of 1.5e308
    chose nanoseconds for the whole file. The rule is robust: the spread is that of
    the central 80% of values, and a value more than ``OUTLIER_SPREADS`` spreads below
    the 10th or above the 90th percentile is an outlier. So that a burst at one instant
    has room around it, the spread is at least 0.1% of the values' magnitude (20 days
    for epoch seconds, in any unit) and, for relative times, at least 10^6 (in the
    file's own unit: 11 days of seconds, 17 minutes of milliseconds). Real traces,
    dense or bursty, relative or absolute, sit well inside; at most 10% of values on
    either side can ever be flagged, and none in a file of fewer than 10.
    """
    v = np.asarray(values, dtype=np.float64)
    out: np.ndarray = np.zeros(v.size, dtype=bool)
    if v.size < 10:
        return out
    s = np.sort(v)
    k = v.size // 10
    lo, hi = s[k], s[v.size - 1 - k]
    relative_floor = 1e6 if hi < ABSOLUTE_MIN_S else 0.0
    spread = max(hi - lo, 1e-3 * max(abs(lo), abs(hi)), relative_floor)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (v < lo - OUTLIER_SPREADS * spread) | (v > hi + OUTLIER_SPREADS * spread)
    return out
