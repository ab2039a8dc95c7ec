"""Miniature replay: a spatial sample of a large trace on a cluster scaled to match.

A replay costs time in proportion to the block accesses it simulates, and the SLO rate
search repeats it five to eight times per scenario. Above ``MIN_ACCESSES`` accesses the
replay runs on a *miniature* instead, as SHARDS-based miniature cache simulation does
(Waldspurger et al., "Cache Modeling and Optimization using Miniature Simulations",
USENIX ATC 2017): keep the requests whose sampling key hashes below a threshold, a
fixed fraction ``R``, and shrink every cache to ``R`` of its capacity, so that a
sampled block sees, between two of its uses, ``R`` of the traffic it saw in the whole
trace and ``R`` of the room.

The sampling key is the request's session, so a conversation is kept or dropped
whole (its follow-ups hit what its earlier turns cached); a request without a session
is sampled by its first block (its prefix root), so requests sharing a system prompt
are kept or dropped together. The kept requests arrive ``1 / R`` times faster (their
offsets scaled by ``R``): each instance, link and queue then carries the load it carries
in the full replay, with the cluster's shape (instances, nodes, links) unchanged, so
routing chooses among the same instances. Figures that are totals over requests
(tokens, GPU-seconds, bytes, the makespan) are scaled back by ``1 / R``; rates,
percentiles and utilisations are the miniature's own.

The error this costs is measured, not assumed: ``bench/replay.py --miniature`` replays
a 50,000-request ``kvpool synth`` chat log in full and in miniature and prints the
differences in hit rate and TTFT percentiles; the figures it printed are kept in
``models/replay-miniature.toml`` and printed with every miniature replay.
``--full-replay`` replays every request.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.trace import BlockTrace

# Traces with more block accesses than this replay in miniature (unless --full-replay).
MIN_ACCESSES = 4_000_000
# The miniature holds about this many accesses: the sampling rate is the largest power
# of two 1/2**k that brings the trace to it or below, and never below MIN_RATE.
TARGET_ACCESSES = 1_000_000
MIN_RATE = 1 / 64
_KEY_BITS = 32
_ERROR_FILE = Path(__file__).resolve().parents[2] / "models" / "replay-miniature.toml"


@dataclass(frozen=True, slots=True)
class Miniature:
    """How a replay was sampled, and the error such a sample was measured to have."""

    sampling_rate: float
    requests: int  # of the whole trace
    sampled_requests: int
    accesses: int
    sampled_accesses: int

    def to_json(self) -> dict[str, Any]:
        return {
            "sampling_rate": self.sampling_rate,
            "requests": self.requests,
            "sampled_requests": self.sampled_requests,
            "block_accesses": self.accesses,
            "sampled_block_accesses": self.sampled_accesses,
            "sampled_by": "session (first block without one), SHARDS spatial sampling",
            "measured_error": measured_error(),
        }

    def describe(self) -> str:
        return describe(self.to_json())


def describe(doc: dict[str, Any]) -> str:
    """One line on a miniature replay, from the ``miniature`` section of a report document.

    The report renderers and the terminal read a report (possibly a report.json loaded back),
    so this takes the serialized section; ``Miniature.describe`` serializes first."""
    text = (
        f"Miniature replay: {doc['sampled_requests']:,} of {doc['requests']:,} requests "
        f"(sessions sampled at 1/{round(1 / doc['sampling_rate'])}, caches scaled to match). "
    )
    err = doc.get("measured_error") or {}
    if err:
        text += (
            f"Measured against the full replay of {err['trace']} at 1/"
            f"{round(1 / err['sampling_rate'])}: hit rate within "
            f"{err['hit_rate_abs_error'] * 100:.1f} points, TTFT p50 / p90 / p99 within "
            f"{err['ttft_p50_rel_error']:.0%} / {err['ttft_p90_rel_error']:.0%} / "
            f"{err['ttft_p99_rel_error']:.0%}"
        )
        if "max_rate_rel_error" in err:
            text += f", rate at the SLO within {err['max_rate_rel_error']:.0%}"
        text += ". "
    return text + "--full-replay replays every request."


@cache
def measured_error() -> dict[str, Any]:
    """The error of a miniature replay as ``bench/replay.py --miniature`` measured it
    (``models/replay-miniature.toml``): largest over the scenarios."""
    if not _ERROR_FILE.is_file():
        return {}
    with _ERROR_FILE.open("rb") as f:
        doc = tomllib.load(f)
    return dict(doc.get("measured", {}))


def sampling_rate(n_accesses: int) -> float | None:
    """The sampling rate for a trace of ``n_accesses`` block accesses (None: full)."""
    if n_accesses <= MIN_ACCESSES:
        return None
    rate = 1.0
    while n_accesses * rate > TARGET_ACCESSES and rate / 2 >= MIN_RATE:
        rate /= 2
    return rate


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads any 64-bit key evenly over 64 bits."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


def sample_keys(trace: BlockTrace) -> np.ndarray:
    """Per request a 64-bit hash of what it is sampled by: its session's name, else its
    first block's chained hash, else its index. Stable across runs and machines."""
    n = trace.n_requests
    by_session = np.array(
        [
            int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")
            for s in trace.session_names
        ],
        dtype=np.uint64,
    )
    keys = _mix(np.arange(n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    offsets = trace.offsets
    has_block = offsets[1:] > offsets[:-1]
    if trace.n_accesses:
        first = trace.block_ids[np.minimum(offsets[:-1], trace.n_accesses - 1)]
        keys = np.where(has_block, _mix(trace.block_hashes[first]), keys)
    sess = trace.session
    if by_session.size:
        keys = np.where(sess >= 0, by_session[np.maximum(sess, 0)], keys)
    return keys


def sample(trace: BlockTrace, rate: float) -> tuple[BlockTrace, Miniature]:
    """The requests whose key falls below ``rate`` of the hash space, as a trace of its
    own (blocks renumbered densely in order of first use)."""
    keys = sample_keys(trace)
    threshold = np.uint64(int(rate * 2**_KEY_BITS))
    keep = np.nonzero((keys >> np.uint64(64 - _KEY_BITS)) < threshold)[0]
    offsets = trace.offsets
    counts = offsets[keep + 1] - offsets[keep]
    new_offsets = np.zeros(keep.size + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    # positions of the kept requests' blocks in the full block_ids
    pos = np.repeat(offsets[keep] - new_offsets[:-1], counts) + np.arange(new_offsets[-1])
    old_ids = trace.block_ids[pos]
    uniq, first, inverse = np.unique(old_ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    ids = rank[inverse.reshape(-1)].astype(np.int64)
    hashes = trace.block_hashes[uniq[order]]

    def take(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[keep]

    mini = BlockTrace(
        block_size=trace.block_size,
        arrival_s=trace.arrival_s[keep],
        prompt_tokens=trace.prompt_tokens[keep],
        output_tokens=trace.output_tokens[keep],
        session=trace.session[keep],
        tenant=trace.tenant[keep],
        offsets=new_offsets,
        block_ids=ids,
        block_hashes=hashes.astype(np.uint64),
        request_ids=[],
        session_names=trace.session_names,
        tenant_names=trace.tenant_names,
        count_only=trace.count_only,
        meta=dict(trace.meta),
        model=take(trace.model),
        model_names=trace.model_names,
    )
    info = Miniature(
        sampling_rate=rate,
        requests=trace.n_requests,
        sampled_requests=int(keep.size),
        accesses=trace.n_accesses,
        sampled_accesses=int(ids.size),
    )
    return mini, info
