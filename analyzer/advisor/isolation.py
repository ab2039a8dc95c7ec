"""The isolation stage: what keeping tenants apart costs, option by option.

A pool shared by every tenant serves some of its hits from another tenant's prompts (a
SaaS's system prompt and tools, common documents). A per-tenant cache salt (vLLM
``cache_salt``, SGLang ``extra_key`` / ``cache_salt``) removes those hits, and with them
the side channel that prefix-cache timing opens (docs/security.md). The analysis runs
under its own ``--isolation``; this stage plans the same options again under the other
policies (the trace as logged, ``shared``; keyed by tenant, ``tenant``; and when the log
names its end users, keyed by user, ``user``: :mod:`analyzer.reuse.isolation`), each
through the same measure, price, replay and size stages, so that every option has its
hit rate, TTFT, GPUs and money under each policy, each at the size that meets the SLO
under it. A policy whose keying splits no more blocks than one already planned gives the
same figures and is not planned again.

Two shares answer two questions. How much of a shared pool's reuse crosses tenants:
the share of the shared log's hit tokens whose block another tenant's request last held
(the reuse analysis's source split, at unlimited capacity; the replay does not attribute
its hits). What isolating takes away: per option, ``1 - hit rate keyed by tenant / hit
rate shared`` (a tenant's hits on its own copy stay, so this is usually much smaller: a
SaaS's system prompt is shared by every tenant, and each re-warms its own copy after its
first request). The headline sentence gives the first and the monthly price of
isolating the verdict's option (the pooled option's beside it when that is another); the
summary names isolation when the first is at least
:data:`MATERIAL_SHARE` and the log has two tenants or more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from analyzer.advisor.measure import measure
from analyzer.advisor.price import price
from analyzer.advisor.replay import Services, replay
from analyzer.advisor.size import plan_sizes
from analyzer.advisor.words import OPTION_NAME
from analyzer.progress import progress
from analyzer.replay.config import Scenario
from analyzer.reuse.isolation import describe, keyings
from analyzer.trace import BlockTrace

if TYPE_CHECKING:
    from analyzer.advisor.measure import Measured
    from analyzer.advisor.options import AnalyzeOptions
    from analyzer.advisor.plan import Fleet
    from analyzer.advisor.replay import Replayer, Services
    from analyzer.advisor.salting import StackSalt
    from analyzer.advisor.size import Search, Sized, SizeQuestion, SizeSearch
    from analyzer.replay.probe import Probe

# The share of a shared pool's hits served from another tenant's prompts from which the
# summary names isolation: one hit in twenty is a side channel worth a sentence.
MATERIAL_SHARE = 0.05
SALT_FIELDS = "cache_salt (vLLM, SGLang) / extra_key (SGLang) / cache_salt_id (TensorRT-LLM)"


@dataclass(frozen=True, slots=True)
class PolicyFigures:
    """One option under one policy, at the size that meets the SLO under it."""

    hit_rate: float | None
    ttft_mean_s: float | None
    ttft_p90_s: float | None
    gpus: int | None
    total_usd_month: float | None
    meets_slo: bool
    # of its hit tokens at size, the share another tenant's request last held (None:
    # not replayed); 0 under a salt, which keys every block by its tenant or user
    cross_tenant_hit_share: float | None = None

    @classmethod
    def of(cls, f: Fleet) -> PolicyFigures:
        t = f.ttft
        return cls(
            hit_rate=f.hit_rate,
            ttft_mean_s=None if t is None else t.mean_s,
            ttft_p90_s=None if t is None else t.p90_s,
            gpus=f.gpus,
            total_usd_month=f.money.total_usd_month,
            meets_slo=f.meets_slo,
            cross_tenant_hit_share=f.cross_tenant_hit_share,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "hit_rate": self.hit_rate,
            "ttft_mean_s": self.ttft_mean_s,
            "ttft_p90_s": self.ttft_p90_s,
            "gpus": self.gpus,
            "total_usd_month": self.total_usd_month,
            "meets_slo": self.meets_slo,
            "cross_tenant_hit_share": self.cross_tenant_hit_share,
        }


@dataclass(frozen=True, slots=True)
class OptionIsolation:
    """One option across the policies planned (keyed by policy name)."""

    option: str
    by_policy: Mapping[str, PolicyFigures]
    # Of the option's hit rate when shared, the share keying by tenant takes away.
    hits_lost_share: float | None
    # What keying by tenant (and by user) adds to its monthly money; None: not priced.
    isolating_usd_month: Mapping[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "policies": {p: f.to_json() for p, f in self.by_policy.items()},
            "hits_lost_share": self.hits_lost_share,
            "isolating_usd_month": dict(self.isolating_usd_month),
        }


@dataclass(frozen=True, slots=True)
class IsolationFigures:
    """The report's ``isolation`` section (module docstring)."""

    policy: str  # what the analysis's own figures were measured under
    policies: tuple[str, ...]  # the columns planned, in POLICIES order
    tenants: int  # salt groups under ``tenant`` (the model stands in for a missing tenant)
    requests_without_tenant: int
    users_known: bool  # the log names end users
    user_groups: int | None  # salt groups under ``user`` (None: not planned)
    keyed_by: Mapping[str, int]  # under ``user``: requests keyed by user, session, tenant
    shares_across_tenants: bool  # some block is used by two tenants
    ceiling: Mapping[str, float]  # unlimited capacity, steady state, per policy
    # Of the shared log's hit tokens, the share another tenant's request last held.
    cross_tenant_hit_share: float
    options: tuple[OptionIsolation, ...]
    pool_option: str | None
    sentence: str
    material: bool
    recommended_option: str | None = None  # the verdict's option (None: none deployed)
    # Whether each stack of the bundle keys every tier by the salt at the versions it
    # targets (analyzer/advisor/salting.py): what a salt would hold on, under any policy.
    products: tuple[StackSalt, ...] = ()

    def option(self, name: str) -> OptionIsolation | None:
        return next((o for o in self.options if o.option == name), None)

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "described": describe(self.policy),
            "salt_fields": SALT_FIELDS,
            "policies": list(self.policies),
            "tenants": self.tenants,
            "requests_without_tenant": self.requests_without_tenant,
            "users_known": self.users_known,
            "user_groups": self.user_groups,
            "keyed_by": dict(self.keyed_by),
            "shares_across_tenants": self.shares_across_tenants,
            "ceiling": dict(self.ceiling),
            "cross_tenant_hit_share": self.cross_tenant_hit_share,
            "options": {o.option: o.to_json() for o in self.options},
            "pool_option": self.pool_option,
            "recommended_option": self.recommended_option,
            "sentence": self.sentence,
            "material": self.material,
            "products": [p.to_json() for p in self.products],
        }


def tenant_count(trace: BlockTrace) -> int:
    """The log's tenants: distinct tenant values (the model standing in for a missing
    one), requests with neither counted as one more."""
    t = trace.tenant
    return int(np.unique(t[t >= 0]).size) + int(bool((t < 0).any()))


def requests_without_tenant(trace: BlockTrace) -> int:
    """Requests whose log named no tenant: none at all, or the model standing in."""
    t = trace.tenant.astype(np.int64)
    missing = int(np.count_nonzero(t < 0))
    if trace.model is None or not trace.model_names:
        return missing
    index = {name: i for i, name in enumerate(trace.model_names)}
    as_model = np.array([index.get(n, -2) for n in trace.tenant_names], dtype=np.int64)
    named = t >= 0
    same = np.zeros(t.size, dtype=bool)
    same[named] = as_model[t[named]] == trace.model[named]
    return missing + int(np.count_nonzero(same))


class KeyedReplayer:
    """A replayer whose remembered answers are kept apart per policy: the same model's
    requests keyed otherwise are another trace (``part`` is the memo's key)."""

    def __init__(self, inner: Replayer, policy: str) -> None:
        self.inner, self.policy = inner, policy

    def _part(self, part: str | None) -> str:
        return f"{part or ''}\x00isolation={self.policy}"

    def size(self, searches: Sequence[Search]) -> list[SizeSearch]:
        return self.inner.size([replace(sr, part=self._part(sr.part)) for sr in searches])

    def probe(
        self,
        part: str | None,
        trace: BlockTrace,
        question: SizeQuestion,
        instances: int,
        sampling_rate: float,
    ) -> Probe:
        return self.inner.probe(self._part(part), trace, question, instances, sampling_rate)


def isolation_stage(
    paths: list[str],
    m: Measured,
    opts: AnalyzeOptions,
    services: Services,
    own: Sized | None,
    products: Sequence[StackSalt] = (),
    recommended: str | None = None,
) -> IsolationFigures:
    """Every option planned under each policy (module docstring); ``own`` is the
    analysis's own plans, under ``opts.isolation`` (None: nothing was sized, so only the
    ceilings are compared); ``products``: the salt status of the bundle's stacks;
    ``recommended``: the verdict's option, whose price of isolating the sentence gives."""

    shared_loaded = m.shared if m.shared is not None else m.loaded
    shared = shared_loaded.trace
    policy = opts.isolation
    k = keyings(shared, policy)
    users_known, wanted, by_groups, blocks = k.users_known, k.wanted, k.groups, k.blocks
    fleets: dict[str, tuple[Fleet, ...]] = {policy: () if own is None else own.fleets}
    ceiling: dict[str, float] = {policy: m.reuse.ceiling_hit_rate}
    # Of the shared trace's reused tokens, the share another tenant's request last held.
    split: dict[str, float] = {policy: m.reuse.cross_tenant_share}
    for p in wanted:
        if p in fleets:
            continue
        # Keyings refine one another (shared, tenant, user): the same number of distinct
        # blocks means the same blocks, hence the same plans.
        same = next((q for q in fleets if blocks[q] == blocks[p]), None)
        if same is not None:
            fleets[p], ceiling[p], split[p] = fleets[same], ceiling[same], split[same]
            continue
        o = replace(opts, isolation=p)
        with progress(f"isolation: planning every option keyed by {p}", None):
            mp = measure(paths, o, loaded=shared_loaded)
            fleets[p] = ()  # nothing sized: the unlimited-capacity figures alone
            if own is not None:
                pp = price(mp, mp.choices, o)
                keyed = Services(KeyedReplayer(services.replayer, p))
                rp = replay(mp, pp, o, keyed, True)
                fleets[p] = plan_sizes(pp, rp, o, keyed).fleets
        ceiling[p], split[p] = mp.reuse.ceiling_hit_rate, mp.reuse.cross_tenant_share
    options = _options(fleets, wanted)
    tenants = by_groups["tenant"].n_groups
    pooled = next((x for x in options if x.option == Scenario.POOLED), None)
    chosen = next((x for x in options if x.option == recommended), None)
    share = split["shared"] if tenants > 1 else 0.0
    # the sentence speaks of the pool: its own replay's share when it was sized, else the
    # log's (unlimited capacity, which the pool's equals when nothing is evicted)
    pool_share = share
    if tenants > 1 and pooled is not None and "shared" in pooled.by_policy:
        measured = pooled.by_policy["shared"].cross_tenant_hit_share
        pool_share = share if measured is None else measured
    user = by_groups.get("user")
    return IsolationFigures(
        policy=policy,
        policies=tuple(wanted),
        tenants=tenants,
        requests_without_tenant=requests_without_tenant(shared),
        users_known=users_known,
        user_groups=None if user is None else user.n_groups,
        keyed_by={}
        if user is None
        else {"user": user.by_user, "session": user.by_session, "tenant": user.by_tenant},
        shares_across_tenants=blocks["tenant"] > blocks["shared"],
        ceiling={p: ceiling[p] for p in wanted},
        cross_tenant_hit_share=share,
        options=options,
        pool_option=None if pooled is None else pooled.option,
        sentence=sentence(tenants, pool_share, pooled, policy, chosen),
        material=tenants > 1 and share >= MATERIAL_SHARE,
        recommended_option=None if chosen is None else chosen.option,
        products=tuple(products),
    )


def _options(
    fleets: Mapping[str, tuple[Fleet, ...]], wanted: list[str]
) -> tuple[OptionIsolation, ...]:
    out = []
    for f in fleets["shared"]:
        by: dict[str, PolicyFigures] = {}
        for p in wanted:
            got = next((g for g in fleets[p] if g.option == f.option), None)
            if got is not None:
                by[p] = PolicyFigures.of(got)
        base = by["shared"]
        lost = None
        if "tenant" in by and base.hit_rate and by["tenant"].hit_rate is not None:
            lost = max(0.0, 1.0 - by["tenant"].hit_rate / base.hit_rate)
        extra: dict[str, float | None] = {}
        for p, fig in by.items():
            if p == "shared":
                continue
            usd, usd0 = fig.total_usd_month, base.total_usd_month
            extra[p] = None if usd is None or usd0 is None else usd - usd0
        out.append(OptionIsolation(f.option, by, lost, extra))
    return tuple(out)


def sentence(
    tenants: int,
    share: float,
    pooled: OptionIsolation | None,
    policy: str = "shared",
    recommended: OptionIsolation | None = None,
) -> str:
    """The section's plain sentence: how much of a shared pool's hits another tenant's
    prompts serve (``share``), and what isolating costs a month (per tenant, and per user
    too when the analysis keyed by user): for the pooled option, or, when the verdict
    deploys another option (``recommended``), for that one, the pool's price beside it."""
    plural = "s" if tenants != 1 else ""
    served = f"{share:.0%}" if tenants > 1 else "none"
    said = (
        f"a pool shared across {tenants} tenant{plural} serves {served} of its hits from "
        "another tenant's prompts"
    )
    if recommended is not None and (pooled is None or recommended.option != pooled.option):
        name = OPTION_NAME.get(recommended.option, recommended.option)
        out = f"{said}; isolating the recommended {name} {_price(recommended, 'tenant')}"
        if policy == "user" and "user" in recommended.by_policy:
            out += f"; per end user, it {_price(recommended, 'user')}"
        if pooled is not None:
            out += f"; isolating a {OPTION_NAME[Scenario.POOLED]} {_cost(pooled, 'tenant')}"
            if policy == "user" and "user" in pooled.by_policy:
                out += f" (per end user, it {_cost(pooled, 'user')})"
        return out
    if pooled is None:
        return f"{said}; no pooled option was sized, so the price of isolating it is not known"
    out = f"{said}; isolating {_price(pooled, 'tenant')}"
    if policy == "user" and "user" in pooled.by_policy:
        out += f"; per end user, it {_price(pooled, 'user')}"
    return out


def _cost(option: OptionIsolation, policy: str) -> str:
    """What keying ``option`` by ``policy`` adds to its money a month, in words."""
    usd = option.isolating_usd_month.get(policy)
    if usd is None:
        return "has no monthly price (the option is not priced)"
    if round(usd) < 0:
        return f"saves ${-usd:,.0f}/month"
    return f"costs ${max(usd, 0.0):,.0f}/month"


def _price(option: OptionIsolation, policy: str) -> str:
    """What keying ``option`` by ``policy`` costs a month and does to its hits."""
    cost = _cost(option, policy)
    before = option.by_policy["shared"].hit_rate
    after = option.by_policy.get(policy)
    if before is not None and after is not None and after.hit_rate is not None:
        cost += f" and takes its hit rate from {before:.1%} to {after.hit_rate:.1%}"
    return cost
