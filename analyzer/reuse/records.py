"""The reuse stage's records: what to measure (:class:`ReuseOptions`) and the sections of
what was found, each frozen, with the JSON it leaves the program as.

The sections that are documents read by key (reuse distance, reuse time, the working
set, the SHARDS run, the per-tenant and per-hour breakdowns) are ``TypedDict``\\ s: their
JSON is the record itself, so the terminal table, ``--json`` and the tests read the same
keys. Every rate is hit tokens / prompt tokens of the counted requests (the requests
after the first ``warmup`` share, which fill the cache uncounted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from analyzer.cache.policies import get_policy
from analyzer.errors import UsageError

GIB = 2**30
GB = 10**9
GRANULARITIES = (16, 64, 256, 512)
SOURCE_KEYS = ("same_session", "same_tenant", "cross_tenant", "unattributed")
# Reuse times are binned on a log scale (50 bins per decade, 1 ms .. 1e8 s): a
# percentile is reported as the upper edge of its bin, within 4.7 % of the exact value.
TIME_EDGES = np.geomspace(1e-3, 1e8, 11 * 50 + 1)


@dataclass(frozen=True, slots=True)
class ReuseOptions:
    warmup: float = 0.5  # fraction of requests that fill the cache uncounted
    capacities_tokens: tuple[int, ...] = ()  # where policies are compared; () = knees
    bytes_per_token: int | None = None  # KV bytes per token of the model, for GB/GiB
    policies: tuple[str, ...] = ("lru", "fifo", "s3fifo", "optimal")
    granularities: tuple[int, ...] = GRANULARITIES
    top_n: int = 10
    shards_rate: float | None = None  # None: exact up to shards_threshold_accesses
    shards_threshold_accesses: int = 50_000_000
    shards_auto_rate: float = 0.01
    shards_error_accesses: int = 5_000_000  # prefix on which the sampled curve is checked
    policy_max_accesses: int = 30_000_000  # per-capacity simulations are skipped beyond
    n_windows: int = 48  # working-set windows over the trace's time span
    curve_points: int = 200
    jobs: int = 1  # threads running the per-capacity simulations (same figures at any)

    def __post_init__(self) -> None:
        if not 0.0 <= self.warmup < 1.0:
            raise UsageError(f"--warmup must be in [0, 1), got {self.warmup}")
        if any(c < 0 for c in self.capacities_tokens):
            raise UsageError("capacities must not be negative")
        if self.top_n < 0:
            raise UsageError(f"--top must be >= 0, got {self.top_n}")
        for name in self.policies:
            get_policy(name)  # registered, or a usage error naming the choices
        if self.shards_rate is not None and not 0.0 < self.shards_rate <= 1.0:
            raise UsageError(f"SHARDS rate must be in (0, 1], got {self.shards_rate}")
        if self.bytes_per_token is not None and self.bytes_per_token <= 0:
            raise UsageError("bytes per token must be positive")


def first_counted_request(n_requests: int, warmup: float) -> int:
    """Index of the first request counted under ``warmup`` (earlier ones fill the cache)."""
    return int(warmup * n_requests)


@dataclass(frozen=True, slots=True)
class StepCurve:
    """Hit rate as a step function of capacity in blocks: rate(C) = rates[last caps <= C]."""

    caps_blocks: np.ndarray  # int64, increasing
    rates: np.ndarray  # float64, non-decreasing

    def at(self, capacity_blocks: int) -> float:
        i = int(np.searchsorted(self.caps_blocks, capacity_blocks, side="right")) - 1
        return float(self.rates[i]) if i >= 0 else 0.0

    def smallest_reaching(self, rate: float) -> int | None:
        i = int(np.searchsorted(self.rates, rate - 1e-12, side="left"))
        return int(self.caps_blocks[i]) if i < self.rates.size else None

    @property
    def full_blocks(self) -> int:
        """Capacity at which the curve reaches its ceiling."""
        return int(self.caps_blocks[-1]) if self.caps_blocks.size else 0

    @property
    def top_rate(self) -> float:
        """The curve's ceiling: its hit rate at :attr:`full_blocks` (0 for a curve with
        no points, which a sample that kept no reused block gives)."""
        return float(self.rates[-1]) if self.rates.size else 0.0


EMPTY_CURVE = StepCurve(np.zeros(0, dtype=np.int64), np.zeros(0))


@dataclass(frozen=True, slots=True)
class NonPrefixReuse:
    """Prompt tokens whose content was seen before at any position, and the part of them
    beyond prefixes (position-independent reuse, e.g. CacheBlend, which today's pooling
    products cannot use), as shares of the counted prompt tokens (steady) and of all of
    them (``cold_*``). Without per-block content hashes it is not ``available``."""

    available: bool
    reason: str | None = None  # why it is not available
    content_seen_rate: float = 0.0
    cold_content_seen_rate: float = 0.0
    prefix_rate: float = 0.0
    cold_prefix_rate: float = 0.0
    hit_rate: float = 0.0  # seen before, but not as a prefix
    cold_hit_rate: float = 0.0
    note: str = (
        "content seen before at any position but not as a prefix; today's "
        "pooling products cannot reuse it (position-independent reuse, e.g. CacheBlend)"
    )

    def to_json(self) -> dict[str, object]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {
            "available": True,
            "content_seen_rate": self.content_seen_rate,
            "cold_content_seen_rate": self.cold_content_seen_rate,
            "prefix_rate": self.prefix_rate,
            "cold_prefix_rate": self.cold_prefix_rate,
            "hit_rate": self.hit_rate,
            "cold_hit_rate": self.cold_hit_rate,
            "note": self.note,
        }


NO_CONTENT = NonPrefixReuse(
    available=False,
    reason="the trace has no per-block content hashes (position-independent "
    "reuse needs logs with prompt content)",
)


@dataclass(frozen=True, slots=True)
class GranularityCeiling:
    """The steady and cold ceilings at one cache granularity: ``block_size_tokens``
    tokens per block, or token-exact (``None``). Not ``available`` when the trace cannot
    give it (``reason`` says why)."""

    block_size_tokens: int | None
    available: bool
    hit_rate: float = 0.0
    cold_hit_rate: float = 0.0
    reason: str | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.block_size_tokens is not None:
            out["block_size"] = self.block_size_tokens
        if self.available:
            out.update(available=True, hit_rate=self.hit_rate, cold_hit_rate=self.cold_hit_rate)
        else:
            out.update(available=False, reason=self.reason)
        return out


@dataclass(frozen=True, slots=True)
class Granularity:
    """Ceilings token-exact and at each block size compared (the trace's own among them)."""

    token_exact: GranularityCeiling
    blocks: tuple[GranularityCeiling, ...]

    def hit_rate_by_block_size(self) -> dict[int, float]:
        """Steady ceiling per block size (tokens) that the trace could give."""
        return {
            int(r.block_size_tokens): r.hit_rate
            for r in self.blocks
            if r.available and r.block_size_tokens is not None
        }

    def to_json(self) -> dict[str, object]:
        return {
            "token_exact": self.token_exact.to_json(),
            "blocks": [r.to_json() for r in self.blocks],
        }


SOURCE_ATTRIBUTION = "each reused block is credited to the most recent earlier request that held it"


@dataclass(frozen=True, slots=True)
class ReuseSources:
    """Whose earlier request each reused token comes from, keyed by :data:`SOURCE_KEYS`:
    hit tokens, and shares of the hit and of the counted prompt tokens."""

    hit_tokens_by_source: dict[str, int]
    share_of_hits: dict[str, float]
    share_of_prompt: dict[str, float]
    sessions_known: bool
    tenants_known: bool
    attribution: str = SOURCE_ATTRIBUTION

    def to_json(self) -> dict[str, object]:
        return {
            "attribution": self.attribution,
            "tokens": dict(self.hit_tokens_by_source),
            "share_of_hits": dict(self.share_of_hits),
            "share_of_prompt": dict(self.share_of_prompt),
            "sessions_known": self.sessions_known,
            "tenants_known": self.tenants_known,
            **self.share_of_hits,
        }


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """One shared prefix: ``prefix_blocks`` blocks ending at block ``block_id`` (chained
    hash ``hash_hex``), reused by ``requests`` counted requests. ``tenants``: how many
    tenants' requests hold it (None when the log names no tenant); ``models``: the models
    of the requests that hold it (empty when the log names none)."""

    block_id: int
    hash_hex: str
    prefix_blocks: int
    prefix_tokens: int
    requests: int
    reused_tokens: int  # requests x prefix_tokens
    preview: str | None = None
    tenants: int | None = None
    models: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "block_id": self.block_id,
            "hash": self.hash_hex,
            "prefix_blocks": self.prefix_blocks,
            "prefix_tokens": self.prefix_tokens,
            "requests": self.requests,
            "reused_tokens": self.reused_tokens,
            "preview": self.preview,
            "tenants": self.tenants,
            "models": list(self.models),
        }


def tenants_words(tenants: int | None) -> str:
    """A shared prefix's tenants as a table shows them (a count: names stay private)."""
    return "not named" if tenants is None else f"{tenants:,}"


def models_words(models: Sequence[str]) -> str:
    return ", ".join(models) if models else "not named"


TOP_PREFIXES_NOTE = "reused_tokens = requests x prefix length (each request reusing it counts once)"


@dataclass(frozen=True, slots=True)
class TopPrefixes:
    """The most reused prefixes, by reused tokens and by requests (``note`` only when
    some prefix was reused)."""

    by_volume: tuple[SharedPrefix, ...] = ()
    by_count: tuple[SharedPrefix, ...] = ()
    note: str | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "by_volume": [e.to_json() for e in self.by_volume],
            "by_count": [e.to_json() for e in self.by_count],
        }
        if self.note is not None:
            out["note"] = self.note
        return out


NO_TOP_PREFIXES = TopPrefixes()


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One point of a hit-ratio curve: steady hit rate with ``capacity_tokens`` of cache
    (also in GB and GiB when the bytes per token are known)."""

    capacity_tokens: int
    hit_rate: float
    capacity_gb: float | None = None
    capacity_gib: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            **capacity_json(self.capacity_tokens, self.capacity_gb, self.capacity_gib),
            "hit_rate": round6(self.hit_rate),
        }


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """The policies compared at one capacity: LRU's steady hit rate and each simulated
    policy's (``None`` where it was not simulated there)."""

    capacity_tokens: int
    capacity_blocks: int
    lru_hit_rate: float
    hit_rate_by_policy: dict[str, float | None]
    capacity_gb: float | None = None
    capacity_gib: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            **capacity_json(self.capacity_tokens, self.capacity_gb, self.capacity_gib),
            "capacity_blocks": self.capacity_blocks,
            "lru": round6(self.lru_hit_rate),
            **{p: round6(r) for p, r in self.hit_rate_by_policy.items()},
        }


def capacity_json(tokens: int, gb: float | None, gib: float | None) -> dict[str, object]:
    out: dict[str, object] = {"capacity_tokens": tokens}
    if gb is not None:
        out["capacity_gb"] = gb
        out["capacity_gib"] = gib
    return out


# -- the sections read by key ---------------------------------------------------------


class Percentiles(TypedDict):
    p50: float | None
    p90: float | None
    p99: float | None


class ReuseDistance(TypedDict):
    unit: str
    weighting: str
    hit_accesses: int
    blocks: Percentiles
    tokens: Percentiles


class ReuseTime(TypedDict):
    unit: str
    hit_accesses: int
    p50: float | None
    p90: float | None
    p99: float | None


class WorkingSetWindow(TypedDict):
    start_s: float
    distinct_blocks: int
    distinct_tokens: int


class WorkingSet(TypedDict):
    window_s: float
    windows: list[WorkingSetWindow]
    peak_distinct_tokens: int
    total_distinct_tokens: int


class ShardsCheck(TypedDict):
    """The sampled LRU curve against the exact one on a prefix of the trace."""

    checked_requests: int
    checked_accesses: int
    max_abs_error: float
    mean_abs_error: float


class ShardsRun(TypedDict):
    """How the LRU curve was sampled, and its measured error (:class:`ShardsCheck`)."""

    rate: float
    sampled_by: str
    checked_requests: int
    checked_accesses: int
    max_abs_error: float
    mean_abs_error: float


class TenantRow(TypedDict):
    tenant: int | None  # 1, 2, ... in order of first appearance; None: no tenant
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float


class HourRow(TypedDict):
    hour: int  # hour 0 starts at the first request
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float


class Breakdowns(TypedDict):
    by_tenant: list[TenantRow]
    by_hour: list[HourRow]
    note: str


# -- JSON numbers ---------------------------------------------------------------------


def round6(x: float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def round_floats(obj: object) -> object:
    """``obj`` with every float rounded to 6 places (dicts and lists alike; tuples as lists)."""
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: round_floats(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [round_floats(v) for v in obj]
    return obj
