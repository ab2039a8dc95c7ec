"""The eviction policies, by name: one registry that ``kvpool reuse --policies`` and
``kvpool replay --eviction`` both read.

Each entry names the policy's readable reference (a leaf-order
:class:`~analyzer.cache.radix.Policy` run on :class:`~analyzer.cache.radix.BlockRadix`,
or a block cache class such as :class:`~analyzer.cache.s3fifo.S3FIFO`), its compiled
simulation in :mod:`analyzer.cache.kernels` if it has one, and the label tables and
charts print. A name not registered here is an error, never a silent fallback.

Adding a leaf policy is one class and one line, as in SGLang's ``evict_policy.py``::

    class MostRecent(Policy):
        '''Newest leaf first (LIFO), for a look at the other end of LRU.'''

        def key(self, node: Node) -> tuple[float, ...]:
            return (-node.last_access, -node.touch_seq)

    POLICIES["mru"] = EvictionPolicy(MostRecent, "MRU")

The reuse analysis then simulates it at every capacity (with the reference simulation,
as it has no compiled kernel) and the replay evicts with it in every tier.
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.cache.radix import FIFO, LRU, FarthestRank, Policy
from analyzer.cache.s3fifo import S3FIFO
from analyzer.errors import UsageError


@dataclass(frozen=True, slots=True)
class EvictionPolicy:
    """One registered policy.

    ``reference``: a :class:`Policy` subclass (leaf order on a prefix tree, so the cache
    stays prefix-closed) or, for a policy blind to prefixes, a block cache class with
    ``access(block)`` and ``block in cache``. ``kernel``: the key of its compiled
    simulation in :data:`analyzer.cache.kernels.KERNELS` (None: the reference runs).
    ``online``: decides from the past only, so a replay can run it (Belady's optimal
    needs the future and is a bound, not a policy a server can run).
    """

    reference: type
    label: str
    kernel: str | None = None
    online: bool = True

    @property
    def leaf(self) -> bool:
        """Evicts leaves of the prefix tree (runs on :class:`BlockRadix`)."""
        return issubclass(self.reference, Policy)


POLICIES: dict[str, EvictionPolicy] = {
    "lru": EvictionPolicy(LRU, "LRU", kernel="lru"),
    "fifo": EvictionPolicy(FIFO, "FIFO", kernel="fifo"),
    "s3fifo": EvictionPolicy(S3FIFO, "S3-FIFO", kernel="s3fifo"),
    "optimal": EvictionPolicy(FarthestRank, "Belady (optimal)", kernel="optimal", online=False),
}


def get_policy(name: str, *, flag: str = "--policies", replay: bool = False) -> EvictionPolicy:
    """The registered policy ``name``; unknown names (and, for a replay, policies that
    are not leaf policies a server could run) are user errors naming the choices."""
    entry = POLICIES.get(name)
    choices = replay_policies() if replay else tuple(POLICIES)
    if entry is None or name not in choices:
        why = "unknown" if entry is None else "not a policy a replay can run:"
        raise UsageError(
            f"{flag}: {why} eviction policy {name!r}", hint=f"choose from {', '.join(choices)}"
        )
    return entry


def replay_policies() -> tuple[str, ...]:
    """Names a replay can evict with: online leaf policies (the tiers are prefix trees)."""
    return tuple(n for n, e in POLICIES.items() if e.online and e.leaf)


def label(name: str) -> str:
    """What tables and charts call the policy (its name when unregistered)."""
    entry = POLICIES.get(name)
    return entry.label if entry is not None else name
