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
- ``kv-router``: the same score here; the aggregated engine (serving.py) scores it
  over every tier as Dynamo's KV router does, and ``prefix-aware`` as llm-d's scorer.

Routers are registered by name in :data:`ROUTERS`, as eviction policies are in
:data:`analyzer.cache.policies.POLICIES`. Adding one is one class and one line::

    class Busiest(Router):
        '''The most loaded instance: a worst case to compare against.'''

        def pick(self, k, session, blocks, loads, cached):
            return max(range(len(loads)), key=loads.__getitem__)

    ROUTERS["busiest"] = Busiest

``--router busiest`` (in a ``replay --config`` scenario or a :class:`ClusterConfig`)
then routes every replayed request with it, in both serving modes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def session_instance(name: str, n_instances: int) -> int:
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n_instances


@dataclass(frozen=True, slots=True)
class RouterContext:
    """What a router is made with: the cluster's instances, the trace's session names
    (indexed by a request's session code) and the prefix-aware router's lambda."""

    instances: int
    session_names: Sequence[str] = ()
    prefix_aware_lambda: float = 1.0


class Router:
    """``pick(k, session, blocks, loads, cached)``: ``cached(i, blocks)`` gives the
    prefix tokens instance ``i`` holds; called only by routers that need it."""

    def __init__(self, ctx: RouterContext) -> None:
        self.ctx = ctx

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
    def pick(
        self,
        k: int,
        session: int,
        blocks: Sequence[int],
        loads: list[int],
        cached: Callable[[int, Sequence[int]], int],
    ) -> int:
        return k % self.ctx.instances


class LeastLoaded(Router):
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
    def __init__(self, ctx: RouterContext) -> None:
        super().__init__(ctx)
        self.by_code = [session_instance(s, ctx.instances) for s in ctx.session_names]

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
    def __init__(self, ctx: RouterContext) -> None:
        super().__init__(ctx)
        self.lam = ctx.prefix_aware_lambda

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


ROUTERS: dict[str, Callable[[RouterContext], Router]] = {
    "round-robin": RoundRobin,
    "least-loaded": LeastLoaded,
    "session": SessionAffinity,
    "prefix-aware": PrefixAware,
    "kv-router": PrefixAware,
}


def make_router(name: str, ctx: RouterContext) -> Router:
    """The registered router ``name`` (checked by :class:`ClusterConfig`)."""
    return ROUTERS[name](ctx)
