"""Tenant isolation: the trace as an engine salted per tenant (or per user) would see it.

A per-request cache salt (vLLM ``cache_salt``, mixed into the first block's hash; SGLang
``extra_key``; TensorRT-LLM ``cache_salt_id``) gives two requests a common block only when
their prompts agree up to that block *and* their salts are equal. With chained hashes the
first condition is already "same block id", so the salted trace is the trace's block ids
re-keyed by ``(salt group, block id)``: no tokens are read again, and the result is the
trace that ingest's ``--hash-key tenant`` hashes (the same block ids in the same order;
``tests/advisor/test_isolation.py`` checks it on generated logs).

Policies (:data:`POLICIES`):

* ``shared``: one pool for everyone (no salt), the trace as it is;
* ``tenant``: one salt per tenant (the trace's ``tenant``: the log's tenant, or the model
  where the log names none);
* ``user``: one salt per end user within a tenant: the log's user where it names one, else
  the session (a session has one owner, so this never shares more than per-user salts
  would), else the tenant (what a gateway salting by user falls back to for requests that
  carry no user).

Re-keyed blocks get new hashes, ``old + g`` (mod 2**64) with ``g`` a hash of the group's
names, so the in-memory path here and the streamed path of :mod:`analyzer.reuse.streamed`
name every block alike. Token-exact prefix lengths (``token_lcp_prev``) are measured
across tenants at ingest and cannot be re-keyed: the salted trace has none (the
block-level ceilings are exact).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np
import polars as pl

from analyzer.cache.stack import splitmix64
from analyzer.dense import FirstSeen
from analyzer.errors import UsageError
from analyzer.trace import BlockTrace, first_seen_ids

Policy = Literal["shared", "tenant", "user"]
POLICIES: tuple[str, ...] = get_args(Policy)
# What each policy adds to the block key, as ingest's ``kvpool.hash_keys`` names keys.
HASH_KEYS = {"shared": (), "tenant": ("tenant",), "user": ("tenant", "user")}
_NONE = "\x00"  # stands for a missing name inside a group key (never a real name)
_SEP = "\x1f"


_DESCRIPTIONS = {
    "shared": "every tenant's requests share blocks (no cache salt: set cache_salt in vLLM "
    "or extra_key in SGLang per tenant to keep tenants apart)",
    "tenant": "blocks are keyed by tenant, as a per-tenant cache_salt (vLLM) or extra_key "
    "(SGLang) keys them",
    "user": "blocks are keyed by end user (else by session) within each tenant, as a "
    "per-user cache_salt / extra_key keys them",
}


def describe(policy: str) -> str:
    """One sentence saying who shares blocks under ``policy``."""
    return _DESCRIPTIONS[check_policy(policy)]


def check_policy(policy: str) -> Policy:
    """``policy`` if it is one of :data:`POLICIES`, else a usage error naming them."""
    if policy not in POLICIES:
        raise UsageError(
            f"unknown isolation '{policy}'", hint="--isolation takes " + " | ".join(POLICIES)
        )
    return policy  # type: ignore[return-value]


def group_hash(key: str) -> int:
    """The 64-bit hash ``g`` of a group key (BLAKE2b, the same on every machine)."""
    d = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8, person=b"kvpool-iso")
    return int.from_bytes(d.digest(), "little")


def _name(names: list[str], code: int) -> str:
    return names[code] if code >= 0 else _NONE


@dataclass(frozen=True, slots=True)
class Groups:
    """The salt group of every request under one policy.

    ``codes`` are dense (0 .. ``n_groups - 1``, in order of first appearance); ``hashes``
    the ``g`` of each group. ``by_user`` / ``by_session`` / ``by_tenant`` count the
    requests keyed by each (under ``tenant`` every request is keyed by its tenant).
    """

    policy: Policy
    codes: np.ndarray  # int64 (n,)
    hashes: np.ndarray  # uint64 (n_groups,)
    by_user: int = 0
    by_session: int = 0
    by_tenant: int = 0

    @property
    def n_groups(self) -> int:
        return int(self.hashes.size)


def groups(trace: BlockTrace, policy: str) -> Groups:
    """Every request's salt group under ``policy`` (module docstring)."""
    policy = check_policy(policy)
    n = trace.n_requests
    tenant = trace.tenant.astype(np.int64)
    if policy == "shared":
        return Groups("shared", np.zeros(n, dtype=np.int64), np.zeros(1, dtype=np.uint64))
    # Each request's group as a (kind, tenant, member) triple of codes, made dense below.
    kind = np.zeros(n, dtype=np.int64)  # 0: tenant, 1: session, 2: user
    member = np.full(n, -1, dtype=np.int64)
    if policy == "user":
        session = trace.session.astype(np.int64)
        has_session = session >= 0
        kind[has_session], member[has_session] = 1, session[has_session]
        if trace.user is not None:
            user = trace.user.astype(np.int64)
            has_user = user >= 0
            kind[has_user], member[has_user] = 2, user[has_user]
    width = np.int64(max(len(trace.session_names), len(trace.user_names), 1) + 1)
    packed = (kind * (np.int64(len(trace.tenant_names)) + 1) + tenant + 1) * width + member + 1
    codes, first = first_seen_ids(packed.view(np.uint64))
    first = first.view(np.int64)
    member_of, rest = first % width - 1, first // width
    tenant_of = rest % (len(trace.tenant_names) + 1) - 1
    kind_of = rest // (len(trace.tenant_names) + 1)
    member_names = {1: trace.session_names, 2: trace.user_names}
    keys = []
    for k, t, m in zip(kind_of.tolist(), tenant_of.tolist(), member_of.tolist(), strict=True):
        tenant_name = _name(trace.tenant_names, t)
        if k == 0:
            keys.append(f"t{_SEP}{tenant_name}")
        else:
            keys.append(f"{'su'[k - 1]}{_SEP}{tenant_name}{_SEP}{member_names[k][m]}")
    hashes = np.fromiter((group_hash(k) for k in keys), dtype=np.uint64, count=len(keys))
    counts = np.bincount(kind, minlength=3)
    return Groups(
        policy,
        codes,
        hashes,
        by_user=int(counts[2]),
        by_session=int(counts[1]),
        by_tenant=int(counts[0]),
    )


def _pairs(ids: np.ndarray, per_access: np.ndarray, n_ids: int, n_groups: int) -> np.ndarray:
    """A uint64 key of each pair ``(ids[i], per_access[i])``: equal keys, equal pairs."""
    if n_ids * n_groups < 2**62:
        packed: np.ndarray = ids * np.int64(n_groups) + per_access
        return packed.view(np.uint64)
    # Too many pairs to pack exactly: pairs named by a 64-bit mix, as hashes are.
    mixed: np.ndarray = splitmix64(ids.astype(np.uint64)) + splitmix64(
        per_access.astype(np.uint64) + 1
    )
    return mixed


def _rekey(ids: np.ndarray, per_access: np.ndarray, n_ids: int, n_groups: int) -> np.ndarray:
    """Dense ids, in order of first appearance, of the pairs ``(ids[i], per_access[i])``."""
    new, _ = first_seen_ids(_pairs(ids, per_access, n_ids, n_groups))
    return new


# Block accesses keyed at a time when only the number of keyed blocks is wanted.
COUNT_SLICE = 1 << 20


def keyed_blocks(trace: BlockTrace, policy: str, grp: Groups | None = None) -> int:
    """``isolate(trace, policy, grp).n_blocks``, the distinct (block, group) pairs,
    without building the keyed trace: its pairs are numbered a slice of requests at a
    time, so only the pairs' table is held (not the keyed ids, content ids and
    per-access groups, ~400 MB at 12 M accesses)."""
    policy = check_policy(policy)
    if policy == "shared":
        return trace.n_blocks
    grp = grp if grp is not None else groups(trace, policy)
    offsets, n = trace.offsets, trace.n_requests
    numbering = FirstSeen()
    start = 0
    while start < n:
        end = int(np.searchsorted(offsets, offsets[start] + COUNT_SLICE, side="right")) - 1
        end = min(n, max(end, start + 1))
        a, b = int(offsets[start]), int(offsets[end])
        per_access = np.repeat(grp.codes[start:end], np.diff(offsets[start : end + 1]))
        numbering.number(_pairs(trace.block_ids[a:b], per_access, trace.n_blocks, grp.n_groups))
        start = end
    return numbering.distinct


@dataclass(frozen=True, slots=True)
class Keyings:
    """The policies an analysis compares (``user`` only when the log names users or it
    is asked for), each one's groups and the blocks it keys the trace into."""

    users_known: bool
    wanted: list[str]
    groups: dict[str, Groups]
    blocks: dict[str, int]

    def measured_again(self, policy: str) -> list[str]:
        """The policies the isolation stage measures again beside ``policy``'s own
        analysis: each whose number of blocks no policy before it (``policy`` first)
        has. Keyings refine one another (shared, tenant, user), so the same number of
        blocks means the same blocks, hence the same figures."""
        seen = {self.blocks[policy]}
        out = []
        for p in self.wanted:
            if p != policy and self.blocks[p] not in seen:
                out.append(p)
            seen.add(self.blocks[p])
        return out


def keyings(shared: BlockTrace, policy: str) -> Keyings:
    """:class:`Keyings` of the log as read (``shared``) for an analysis under ``policy``."""
    users_known = shared.user is not None and bool((shared.user >= 0).any())
    wanted = [p for p in POLICIES if p != "user" or users_known or policy == "user"]
    by_groups = {p: groups(shared, p) for p in wanted}
    blocks = {p: keyed_blocks(shared, p, by_groups[p]) for p in wanted}
    return Keyings(users_known, wanted, by_groups, blocks)


def _first_accesses(ids: np.ndarray) -> np.ndarray:
    """Position of each dense id's first access (ids numbered in order of first appearance)."""
    if not ids.size:
        return np.empty(0, dtype=np.int64)
    before = np.maximum.accumulate(ids)[:-1]
    return np.flatnonzero(np.concatenate(([True], ids[1:] > before)))


def isolate(trace: BlockTrace, policy: str, grp: Groups | None = None) -> BlockTrace:
    """``trace`` with every block keyed by its request's salt group under ``policy``.

    ``shared`` returns ``trace`` itself. Otherwise block ids (and content ids) are
    re-numbered over ``(group, block)`` pairs in order of first appearance, so a block
    used by two groups becomes two blocks; the block hashes become ``old + g``.
    """
    policy = check_policy(policy)
    if policy == "shared":
        return trace
    grp = grp if grp is not None else groups(trace, policy)
    counts = np.diff(trace.offsets)
    per_access = np.repeat(grp.codes, counts)
    ids = _rekey(trace.block_ids, per_access, trace.n_blocks, grp.n_groups)
    # The first access of each new id names its old block and its group; ids are dense in
    # order of first appearance, so an id is new exactly where the running maximum grows.
    first = _first_accesses(ids)
    with np.errstate(over="ignore"):
        hashes = trace.block_hashes[trace.block_ids[first]] + grp.hashes[per_access[first]]
    content = None
    if trace.content_ids is not None:
        n_content = int(trace.content_ids.max()) + 1 if trace.content_ids.size else 0
        content = _rekey(trace.content_ids, per_access, n_content, grp.n_groups)
    previews: dict[int, str] = {}
    if trace.previews:
        old = trace.block_ids[first]
        keep = np.isin(old, np.fromiter(trace.previews, dtype=np.int64))
        previews = {
            int(i): trace.previews[int(o)]
            for i, o in zip(np.flatnonzero(keep), old[keep], strict=True)
        }
    keys = [k for k in trace.meta.get("hash_keys", "").split(",") if k]
    keys += [k for k in HASH_KEYS[policy] if k not in keys]
    return replace(
        trace,
        block_ids=ids,
        block_hashes=hashes.astype(np.uint64),
        content_ids=content,
        token_lcp_prev=None,
        previews=previews,
        meta={**trace.meta, "hash_keys": ",".join(keys), "isolation": policy},
    )


def shares_across_groups(trace: BlockTrace, policy: str) -> bool:
    """Whether any block is used by requests of two salt groups: when none is, isolating
    changes no figure (every block already belongs to one group)."""
    if check_policy(policy) == "shared" or not trace.n_accesses:
        return False
    grp = groups(trace, policy)
    if grp.n_groups < 2:
        return False
    per_access = np.repeat(grp.codes, np.diff(trace.offsets))
    owner = np.full(trace.n_blocks, -1, dtype=np.int64)
    owner[trace.block_ids] = per_access  # any one group that used each block
    return bool(np.any(owner[trace.block_ids] != per_access))


# -- the streamed path (analyzer/reuse/streamed.py) ----------------------------------------


def group_key_expr(policy: Policy) -> pl.Expr:
    """The group key of each row of a canonical frame, as :func:`groups` spells it."""

    def named(col: str) -> pl.Expr:
        return pl.col(col).fill_null(_NONE)

    tenant_key = pl.concat_str([pl.lit("t"), named("tenant")], separator=_SEP)
    if policy == "tenant":
        return tenant_key
    session_key = pl.concat_str(
        [pl.lit("s"), named("tenant"), pl.col("session_id")], separator=_SEP
    )
    user_key = pl.concat_str([pl.lit("u"), named("tenant"), pl.col("user_id")], separator=_SEP)
    return (
        pl.when(pl.col("user_id").is_not_null())
        .then(user_key)
        .when(pl.col("session_id").is_not_null())
        .then(session_key)
        .otherwise(tenant_key)
    )


def isolate_frame(lf: pl.LazyFrame, policy: str) -> pl.LazyFrame:
    """A canonical frame with its hashes keyed by each row's salt group, as
    :func:`isolate` keys a :class:`BlockTrace` (the same new hashes)."""
    policy = check_policy(policy)
    if policy == "shared":
        return lf
    key = group_key_expr(policy)
    distinct = lf.select(key.alias("k")).unique().collect(engine="streaming")["k"].to_list()
    mapping = pl.Series([group_hash(k) for k in distinct], dtype=pl.UInt64)
    g = key.replace_strict(pl.Series(distinct, dtype=pl.String), mapping, return_dtype=pl.UInt64)
    return lf.with_columns(
        block_hashes=pl.col("block_hashes") + g,
        content_hashes=pl.col("content_hashes") + g,
        token_lcp_prev=pl.lit(None, dtype=pl.Int64),
    )
