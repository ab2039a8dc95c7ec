"""cache: the prefix caches the reuse analysis and the replay share.

* :mod:`~analyzer.cache.radix`: :class:`BlockRadix`, a prefix tree over chained block ids
  with leaf-only eviction, and the leaf orders (:class:`LRU`, :class:`FIFO`,
  :class:`FarthestRank`), each a small class returning a sort key.
* :mod:`~analyzer.cache.array_radix`: :class:`ArrayRadix`, BlockRadix's compiled twin for
  chained LRU and FIFO caches (the replay's tiers), answering call for call as it does.
* :mod:`~analyzer.cache.token_radix`: :class:`TokenRadix`, the token-exact tree (SGLang's
  RadixAttention at page size 1), and :class:`ArrivalLCP` built on it.
* :mod:`~analyzer.cache.policies`: the one registry of eviction policies by name
  (reference class, compiled kernel, label), read by ``kvpool reuse --policies`` and
  ``kvpool replay --eviction``.
* :mod:`~analyzer.cache.stack`: exact LRU stack distances (the one-pass hit-ratio curve).
* :mod:`~analyzer.cache.simulate` and :mod:`~analyzer.cache.kernels`: per-capacity
  simulations, readable and compiled (numba).

The tree, the policies and the registry are plain Python; the numba modules load only
when their names are first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from analyzer.cache.policies import POLICIES, EvictionPolicy, get_policy, label, replay_policies
from analyzer.cache.radix import FIFO, LRU, ROOT, BlockRadix, FarthestRank, Node, Policy
from analyzer.cache.s3fifo import S3FIFO

_LAZY = {
    "ArrayRadix": "analyzer.cache.array_radix",
    "TokenRadix": "analyzer.cache.token_radix",
    "ArrivalLCP": "analyzer.cache.token_radix",
    "lcp_reference": "analyzer.cache.token_radix",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'analyzer.cache' has no attribute {name!r}")


__all__ = [
    "FIFO",
    "LRU",
    "POLICIES",
    "ROOT",
    "S3FIFO",
    "ArrayRadix",
    "ArrivalLCP",
    "BlockRadix",
    "EvictionPolicy",
    "FarthestRank",
    "Node",
    "Policy",
    "TokenRadix",
    "get_policy",
    "label",
    "lcp_reference",
    "replay_policies",
]
