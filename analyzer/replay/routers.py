"""Routers: which prefill instance a request goes to.

``load`` of an instance is its queued prefill tokens: tokens routed to it and not yet
prefilled (loading, queued or in the current step). Ties always go to the lowest
instance index, so routing is deterministic.

- ``round-robin``: request ``k`` of the trace goes to instance ``k mod N``.
- ``least-loaded``: the smallest load.
- ``session``: session affinity; a session goes to ``blake2b(session name) mod N``
  (stable across runs, machines and trace subsets); requests without a session fall
  back to least-loaded.
- ``prefix-aware``: the largest ``cached_tokens - lambda * load``, where
  ``cached_tokens`` is the prefix the instance holds in its HBM (lower tiers cost a
  load, and a node's DRAM is shared by its instances, so they do not tell them apart). This is the cost SGLang's cache-aware router, NVIDIA Dynamo's
  KV router and llm-d's prefix scorer balance: with ``lambda = 1`` (the default) it
  picks the instance with the least prefill work ahead of this request's first
  token, ``(prompt - cached) + load``, as Dynamo's ``overlap_score_weight = 1`` does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence


def session_instance(name: str, n_instances: int) -> int:
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n_instances


class Router:
    """``pick(k, session, blocks, loads, cached)``: ``cached(i, blocks)`` gives the
    prefix tokens instance ``i`` holds; called only by routers that need it."""

    name = "router"

    def pick(
        self,
        k: int,
        session: int,
        blocks: Sequence[int],
        loads: list[int],
        cached: Callable[[int, Sequence[int]], int],
    ) -> int:  # pragma: no cover - interface
        raise AssertionError("subclasses define pick()")


def _least(loads: list[int]) -> int:
    best = 0
    low = loads[0]
    for i in range(1, len(loads)):
        if loads[i] < low:
            low = loads[i]
            best = i
    return best


class RoundRobin(Router):
    name = "round-robin"

    def __init__(self, n: int) -> None:
        self.n = n

    def pick(
        self,
        k: int,
        session: int,
        blocks: Sequence[int],
        loads: list[int],
        cached: Callable[[int, Sequence[int]], int],
    ) -> int:
        return k % self.n


class LeastLoaded(Router):
    name = "least-loaded"

    def pick(
        self,
        k: int,
        session: int,
        blocks: Sequence[int],
        loads: list[int],
        cached: Callable[[int, Sequence[int]], int],
    ) -> int:
        return _least(loads)


class SessionAffinity(Router):
    name = "session"

    def __init__(self, n: int, session_names: Sequence[str]) -> None:
        self.by_code = [session_instance(s, n) for s in session_names]

    def pick(
        self,
        k: int,
        session: int,
        blocks: Sequence[int],
        loads: list[int],
        cached: Callable[[int, Sequence[int]], int],
    ) -> int:
        if session < 0:
            return _least(loads)
        return self.by_code[session]


class PrefixAware(Router):
    name = "prefix-aware"

    def __init__(self, lam: float) -> None:
        self.lam = lam

    def pick(
        self,
        k: int,
        session: int,
        blocks: Sequence[int],
        loads: list[int],
        cached: Callable[[int, Sequence[int]], int],
    ) -> int:
        if not blocks:
            return _least(loads)
        lam = self.lam
        best = 0
        best_score = None
        for i in range(len(loads)):
            score = cached(i, blocks) - lam * loads[i]
            if best_score is None or score > best_score:
                best_score = score
                best = i
        return best


def make_router(name: str, n: int, session_names: Sequence[str], lam: float) -> Router:
    if name == "round-robin":
        return RoundRobin(n)
    if name == "least-loaded":
        return LeastLoaded()
    if name == "session":
        return SessionAffinity(n, session_names)
    if name in ("prefix-aware", "kv-router"):  # kv-router: aggregated serving's own
        return PrefixAware(lam)
    raise AssertionError(f"unknown router {name}")  # validated by ClusterConfig
