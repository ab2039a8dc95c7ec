"""Properties of the plans over generated logs (Hypothesis): each size found by
replaying, compared across one input the team controls.

* a faster pool link never makes pooling less attractive;
* cheaper GPUs never make an offload tier more attractive;
* a looser SLO never needs more GPUs;
* more load never needs fewer;
* the plan's TTFT, replayed at the plan's size, meets the SLO.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.advisor.decide import decide
from analyzer.advisor.figures import BandwidthFigures, ReuseFigures, TierFigure, TraceFigures
from analyzer.advisor.plan import Capacities, DeploymentPlan, Fleet, PlanLoad, PlanStatus, price
from analyzer.advisor.size import SizeQuestion, SizeSearch, size_option
from analyzer.cost.prices import PriceOverrides, resolve_prices
from analyzer.replay import ClusterConfig
from analyzer.replay.config import STANDARD_SCENARIOS, Scenario, ScenarioSpec
from analyzer.replay.probe import probe
from analyzer.replay.run import TtftSummary
from tests.helpers.replay import AnalyticCost, build_trace, chained_requests

COST = AnalyticCost(bytes_per_token=2000, hbm_tokens=3000)
OPTIONS = (Scenario.LOCAL, Scenario.LOCAL_DRAM, Scenario.POOLED)
TRACE_FIGURES = TraceFigures(5000, False, 3600.0, 10_000_000, 2000.0, 16)
REUSE = ReuseFigures(True, 0.6, 0.6)
BANDWIDTH = BandwidthFigures(
    2000,
    0.01,
    2000,
    5e6,
    (
        TierFigure("dram", "d", 1000.0, 0.0),
        TierFigure("nvme", "n", 1000.0, 0.0),
        TierFigure("pool", "p", 1000.0, 0.0),
    ),
)


@st.composite
def logs(draw):
    """A chat-like log: requests extending earlier ones' prefixes, arriving in gaps
    drawn from an exponential law (a Poisson process), some bursts among them."""
    n = draw(st.integers(40, 120))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    spec = [
        (int(rng.integers(0, 40)), int(rng.integers(0, 10)), int(rng.integers(1, 6)))
        for _ in range(n)
    ]
    gaps = rng.exponential(draw(st.sampled_from([0.005, 0.02, 0.05])), n)
    gaps[rng.random(n) < 0.2] = 0.0  # some requests arrive together
    return build_trace(chained_requests(spec), block_size=64, arrivals=np.cumsum(gaps).tolist())


def cfg(**kw) -> ClusterConfig:
    # the analytic cost prices a prefill pool (it names no GPU to size an engine's KV pool)
    base = dict(
        serving="disaggregated",
        model="test-model",
        gpu="test-gpu",
        instances=2,
        gpus_per_node=1,
        router="round-robin",
        dram_capacity_tokens=2000,
        pool_capacity_tokens=20_000,
        warmup_fraction=0.25,
    )
    base.update(kw)
    return ClusterConfig(**base)


def smallest(trace, c, spec: ScenarioSpec, *, time_scale=1.0, slo=0.5, cap=64, **hint):
    q = SizeQuestion(spec, c, COST, time_scale, slo, cap=cap, **hint)
    return size_option(trace, q)


def bounded_by(easier: SizeSearch, *, harder: bool) -> dict[str, object]:
    """The hint the explore stage gives a harder (or easier) question than ``easier``'s
    (analyzer.advisor.explore._hints): from that answer, counts below it known to fail,
    or the answer known to pass."""
    a = easier.instances
    assert a is not None
    if harder:
        return {"instances": a, "gallop": True, "fails_to": a - 1}
    return {"instances": max(1, a - 1), "near": True, "passes_at": a}


def passes(trace, c, spec: ScenarioSpec, n: int, *, time_scale=1.0, slo=0.5, cap=64) -> bool:
    """Whether ``n`` instances meet the SLO, replayed on their own."""
    q = SizeQuestion(spec, c, COST, time_scale, slo, cap=cap)
    return size_option(trace, q, only=n).instances == n


def same_with_bounds(trace, c, spec, easy: SizeSearch, harder: bool, **question):
    """The question searched with and without the bound the properties give. Both rest
    on the premises of any bisection: meeting the SLO is monotone in the count (and,
    for the bound, a harder question never needs fewer). Where the replay keeps them
    the two find the same count with the same figures; where they part, the replay
    broke a premise: a count between the two answers fails above one that passes, or
    the unbounded search found a count the bound took as failing."""
    free = smallest(trace, c, spec, **question)
    hint = bounded_by(easy, harder=harder)
    start = replace(c, instances=hint.pop("instances"))
    bound = smallest(trace, start, spec, **question, **hint)
    if bound.instances == free.instances:
        assert bound.above_cap == free.above_cap
        assert bound.at_size is not None and bound.at_size.ttft == free.at_size.ttft
        return free, bound
    assert free.instances is not None and bound.instances is not None, (
        free.probes,
        bound.probes,
    )
    lo, hi = sorted((free.instances, bound.instances))
    assumed = harder and free.instances == lo and lo <= easy.instances - 1  # type: ignore[operator]
    broken = assumed or any(not passes(trace, c, spec, m, **question) for m in range(lo + 1, hi))
    assert broken, (free.probes, bound.probes)
    return free, bound


def fleet_of(trace, c, option: str, gpu_hour: float, *, slo=0.5) -> Fleet:
    s = smallest(trace, c, STANDARD_SCENARIOS[option], slo=slo)
    at = s.at_size
    prices = resolve_prices("h100", PriceOverrides(gpu_hour_usd=gpu_hour))
    caps = Capacities(2000, 3000, dram_per_node=2000, pool=20_000)
    plan = DeploymentPlan(
        option=option,
        model="test-model",
        served_as="",
        gpu="h100",
        tp=1,
        gpus_per_node=1,
        router=c.router,
        status=PlanStatus.MEETS if s.instances else PlanStatus.CANNOT_MEET,
        instances=s.instances,
        capacities=caps,
        load=PlanLoad(1.0, 1.0, 300.0),
        ttft_slo_s=slo,
        money=price(
            option,
            instances=s.instances,
            tp=1,
            gpus_per_node=1,
            capacities=caps,
            prices=prices,
            gpu="h100",
        ),
        ttft=None if at is None else at.ttft,
    )
    return Fleet.of(option, (plan,))


PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@PROPS
@given(logs(), st.sampled_from([0.05, 0.2, 1.0]), st.sampled_from([2.0, 4.0]))
def test_a_faster_pool_link_never_makes_pooling_less_attractive(trace, gbps, faster):
    pooled = STANDARD_SCENARIOS[Scenario.POOLED]
    slow = smallest(trace, cfg(pool_gbps=gbps), pooled)
    fast = smallest(trace, cfg(pool_gbps=gbps * faster), pooled)
    if slow.instances is not None:
        assert fast.instances is not None
        if fast.instances > slow.instances:
            # Only where the replay of a small generated log is not monotone in the link
            # itself: the count the slower link meets fails on the faster one, replayed
            # on their own (loads ending sooner shift which requests share a step), and
            # the report's link flip, which replays the plan's answer first, says so.
            n = slow.instances
            assert passes(trace, cfg(pool_gbps=gbps), pooled, n)
            assert not passes(trace, cfg(pool_gbps=gbps * faster), pooled, n), (n, fast.probes)
            return
    # and the verdict: a pool recommended over the slower link stays recommended
    others = [fleet_of(trace, cfg(), o, 4.0) for o in (Scenario.LOCAL, Scenario.LOCAL_DRAM)]
    v_slow = decide(
        TRACE_FIGURES,
        REUSE,
        BANDWIDTH,
        (*others, fleet_of(trace, cfg(pool_gbps=gbps), Scenario.POOLED, 4.0)),
    ).verdict
    v_fast = decide(
        TRACE_FIGURES,
        REUSE,
        BANDWIDTH,
        (*others, fleet_of(trace, cfg(pool_gbps=gbps * faster), Scenario.POOLED, 4.0)),
    ).verdict
    if v_slow == "deploy-pooled":
        assert v_fast == "deploy-pooled"


@pytest.mark.slow
@PROPS
@given(logs(), st.sampled_from([0.5, 2.0, 8.0]), st.sampled_from([0.0, 0.25, 0.5]))
def test_cheaper_gpus_never_make_an_offload_tier_more_attractive(trace, gpu_hour, cheaper):
    c = cfg()

    def verdict(price_: float) -> str:
        return decide(
            TRACE_FIGURES, REUSE, BANDWIDTH, tuple(fleet_of(trace, c, o, price_) for o in OPTIONS)
        ).verdict

    dear, cheap = verdict(gpu_hour), verdict(gpu_hour * cheaper)
    tiers = ("deploy-pooled", "local-offload-only")
    if cheap in tiers:
        assert dear in tiers, (dear, cheap)


@PROPS
@given(
    logs(),
    st.sampled_from(OPTIONS),
    st.sampled_from([0.25, 0.5, 1.0]),
    st.sampled_from([1.5, 2.0, 3.0]),
    st.sampled_from(["load", "slo", "link"]),
)
def test_the_bounded_searches_of_the_flips_find_the_unbounded_answers(
    trace, option, time_scale, factor, what
):
    """The explore stage searches a harder question (more load, a tighter SLO, a slower
    pool link) taking the counts below the plan's answer as failing, and an easier one
    no higher than that answer (the properties below): on generated logs, those searches
    find what a search from the analysis cluster's size with no bound finds, except
    where the replay breaks the premise both searches rest on (same_with_bounds)."""
    spec = STANDARD_SCENARIOS[option]
    c = cfg(pool_gbps=1.0)
    plan = smallest(trace, c, spec, time_scale=time_scale)
    if plan.instances is None:
        return
    if what == "load":
        same_with_bounds(trace, c, spec, plan, True, time_scale=time_scale / factor)
        light = smallest(trace, c, spec, time_scale=time_scale * factor)
        if light.instances is not None:
            same_with_bounds(trace, c, spec, plan, False, time_scale=time_scale * factor)
    elif what == "slo":
        same_with_bounds(trace, c, spec, plan, True, time_scale=time_scale, slo=0.5 / factor)
        same_with_bounds(trace, c, spec, plan, False, time_scale=time_scale, slo=0.5 * factor)
    else:
        slow, fast = cfg(pool_gbps=1.0 / factor), cfg(pool_gbps=factor)
        same_with_bounds(trace, slow, spec, plan, True, time_scale=time_scale)
        same_with_bounds(trace, fast, spec, plan, False, time_scale=time_scale)


@PROPS
@given(
    logs(), st.sampled_from(OPTIONS), st.sampled_from([0.1, 0.3, 1.0]), st.sampled_from([1.5, 3.0])
)
def test_a_looser_slo_never_needs_more_gpus(trace, option, slo, looser):
    tight = smallest(trace, cfg(), STANDARD_SCENARIOS[option], slo=slo)
    loose = smallest(trace, cfg(), STANDARD_SCENARIOS[option], slo=slo * looser)
    if tight.instances is not None:
        assert loose.instances is not None and loose.instances <= tight.instances


@PROPS
@given(
    logs(), st.sampled_from(OPTIONS), st.sampled_from([0.25, 0.5, 1.0]), st.sampled_from([1.5, 3.0])
)
def test_more_load_never_needs_fewer_gpus(trace, option, time_scale, more):
    """More load never needs fewer instances in what kvpool reports: the explore stage
    searches the heavier load with the counts below the plan's answer taken as failing.
    Two searches with no bound agree too, except where the replay of a small generated
    log is not monotone itself (a count the heavier load passes and the lighter fails,
    or counts passing, failing and passing again); then the test shows which."""
    spec = STANDARD_SCENARIOS[option]
    light = smallest(trace, cfg(), spec, time_scale=time_scale)
    heavy = smallest(trace, cfg(), spec, time_scale=time_scale / more)
    if heavy.instances is None:
        return
    assert light.instances is not None
    hint = bounded_by(light, harder=True)
    start = replace(cfg(), instances=hint.pop("instances"))
    reported = smallest(trace, start, spec, time_scale=time_scale / more, **hint)
    assert reported.instances is None or reported.instances >= light.instances
    if light.instances > heavy.instances:
        n = heavy.instances
        at_light = passes(trace, cfg(), spec, n, time_scale=time_scale)
        assert not at_light or any(
            not passes(trace, cfg(), spec, m, time_scale=time_scale)
            for m in range(n + 1, light.instances)
        ), (light.probes, heavy.probes)


@PROPS
@given(logs(), st.sampled_from(OPTIONS), st.sampled_from([0.05, 0.3, 1.0]))
def test_the_plans_ttft_replayed_at_its_size_meets_the_slo(trace, option, slo):
    s = smallest(trace, cfg(), STANDARD_SCENARIOS[option], slo=slo)
    if s.instances is None:
        return
    at = s.at_size
    assert at is not None and at.passed and at.ttft.p90_s is not None
    again = probe(
        trace,
        cfg(),
        STANDARD_SCENARIOS[option],
        instances=s.instances,
        time_scale=1.0,
        ttft_slo_s=slo,
        cost=COST,
    )
    assert again.passed and again.ttft == at.ttft
    assert again.rank_s is not None and again.rank_s <= slo
    # one fewer instance misses it: the plan is the smallest
    if s.instances > 1:
        fewer = probe(
            trace,
            cfg(),
            STANDARD_SCENARIOS[option],
            instances=s.instances - 1,
            time_scale=1.0,
            ttft_slo_s=slo,
            cost=COST,
        )
        assert not fewer.passed
    assert dataclasses.replace(at, result=None).passes(slo)


def test_ttft_summary_is_of_the_measured_requests():
    t = TtftSummary.of(np.array([0.1, 0.2, 0.3]))
    assert t.p50_s == 0.2
