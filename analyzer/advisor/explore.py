"""The explore stage: what would change the verdict, the same deployment on other GPUs
and models, and what the log's arrival pattern does to the answer.

**Flips** (the sensitivity table) change one input the team controls and decide again
(:func:`analyzer.advisor.decide.decide`) on plans made for it, never on figures scaled
from other plans:

* prices (GPU-hour x0, x0.5, x2, x10; host DRAM x0, x0.5, x2): the same plans,
  re-priced;
* the load (x2 the busiest window's), the TTFT SLO (x0.5, x2) and the pool link (x0.5,
  x2 its bandwidth): every affected option sized again by replaying, each search
  starting from the plan's answer and taking every replay it already has that
  answers (a complete run answers any SLO). The properties the plans hold bound the
  search (:func:`_hints`): a harder question (more load, a tighter SLO, a slower
  link) never needs fewer instances than the plan, an easier one never more.

**Other GPUs and models** (the side-by-side table, listed apart from the flips: they are
another purchase, not a setting): the verdict's option (only it: one search a row)
planned on each by replaying,
each model at its own smallest tensor parallelism on that GPU, its floor checked first,
so every row's TTFT is the replay's at the size it states.

**Arrivals**: when many requests share one timestamp (a coarse clock, or bursts), the
verdict's option is sized again with those requests spread evenly over the time to the
next timestamp, and the report gives both sizes.

Every variant's questions go to the replayer in one batch, so they run in parallel:
the side-by-side rows and the arrivals first (the longest searches), each variant's
baseline, and each of its other options as soon as its baseline has answered, starting
where the baseline's answer moved to (:func:`analyzer.advisor.size.answer`,
``baseline_first``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from analyzer.advisor.decide import BASELINE, decide
from analyzer.advisor.economics import load_figures
from analyzer.advisor.figures import Decision, PricedChoice, PricedOption
from analyzer.advisor.measure import spread
from analyzer.advisor.plan import DeploymentPlan, Fleet, repriced
from analyzer.advisor.price import price as price_stage
from analyzer.advisor.replay import floor_searches, floors_of, replay_trace
from analyzer.advisor.sensitivity import FlipRow
from analyzer.advisor.served import model_label
from analyzer.advisor.size import Ask, Hint, Search, Sized, answer, asks, sized_of
from analyzer.errors import UsageError
from analyzer.progress import progress
from analyzer.replay.config import Scenario, Tier

if TYPE_CHECKING:
    from analyzer.advisor.measure import Measured
    from analyzer.advisor.options import AnalyzeOptions
    from analyzer.advisor.price import ModelSetup, Priced
    from analyzer.advisor.replay import Replayed, ReplayTrace, Services
    from analyzer.cost.prices import Prices

ALT_MODELS = ("llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b", "deepseek-v3")
ALT_GPUS = ("a100", "h100", "h200", "b200")
GPU_PRICE_FACTORS = (0.0, 0.5, 2.0, 10.0)
DRAM_PRICE_FACTORS = (0.0, 0.5, 2.0)
LOAD_FACTORS = (2.0,)
SLO_FACTORS = (0.5, 2.0)
LINK_FACTORS = (0.5, 2.0)
# A side-by-side row is searched up to this many times the instances the verdict's option
# is planned on (and within --max-gpus): another GPU or model that needs more is no
# alternative to the plan, and its row says that none within that many meets the SLO.
# The search up to --max-gpus (512 A100s for the Mooncake trace's 4 H100s, every count
# failing after most of the trace) was a quarter of the analysis's time.
SIDE_INSTANCES_MULTIPLE = 8


@dataclass(frozen=True, slots=True)
class ArrivalsEffect:
    """The verdict's option sized on the log as it is and with its same-instant
    requests spread over the time to the next timestamp."""

    option: str
    gpus: int | None
    gpus_spread: int | None
    step_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "option": self.option,
            "gpus": self.gpus,
            "gpus_spread": self.gpus_spread,
            "step_s": self.step_s,
        }


@dataclass(frozen=True, slots=True)
class Explored:
    flips: tuple[FlipRow, ...]
    side_by_side: tuple[PricedChoice, ...]
    arrivals: ArrivalsEffect | None


def loosest_slo_s(opts: AnalyzeOptions) -> float | None:
    """The loosest TTFT SLO this stage will ask of the plan's sizes (its SLO flip), when
    it replays: the plan's failing replays run on until they lose it too, and the flip
    then takes them instead of replaying those sizes again."""
    return opts.ttft_slo_s * max(SLO_FACTORS) if opts.sensitivity_replays else None


def _repriced(sized: Sized, prices: Prices) -> tuple[Fleet, ...]:
    return tuple(
        Fleet.of(f.option, tuple(repriced(p, prices) for p in f.plans)) for f in sized.fleets
    )


def found(p: DeploymentPlan) -> int | None:
    """The count ``p``'s search found: the fewest instances that passed (a latency-first
    team's plan may then sit on its baseline's, more); None when none passed."""
    passed = [t.instances for t in p.tried if t.passed]
    return min(passed) if passed else None


def _hints(
    sized: Sized, scale: float = 1.0, *, harder: bool | None = None, gallop: bool = True
) -> dict[tuple[str, str], Hint]:
    """Where each (model, option) search of a variant starts, its neighbour tried next.
    ``harder`` says which way the variant moves the answer, by the properties the plans
    hold (more load never needs fewer instances, a looser SLO never needs more, a faster
    pool link never makes pooling worse): harder, the counts below the plan's answer
    fail without a replay and the search starts at that answer, stepping up from it
    (``gallop``) or doubling; easier, it starts at
    the answer x ``scale`` and below the answer (a failure stops its replay early, so a
    guess a little low costs less than one a little high) and looks no higher than the
    answer. None (another trace, GPU or model): it starts at the answer x ``scale``."""
    out: dict[tuple[str, str], Hint] = {}
    for p in sized.plans:
        a = found(p)
        if a is None:
            continue
        n = max(1, math.ceil(a * scale))
        if harder is None:
            out[(p.model, p.option)] = Hint(n)
        elif harder:
            out[(p.model, p.option)] = Hint(a, gallop=gallop, fails_to=a - 1)
        else:
            out[(p.model, p.option)] = Hint(max(1, min(n, a - 1)), passes_at=a)
    return out


@dataclass(frozen=True, slots=True)
class _Variant:
    """One variant whose plans are replayed: its flip row (or side-by-side row), and its
    questions' place in the batch."""

    kind: str  # "flip", "side", "arrivals"
    dimension: str
    label: str
    note: str
    asks: tuple[Ask, ...]
    keep: tuple[Fleet, ...] = ()  # the plan's own fleets of the options not asked again
    priced: Priced | None = None


def _price_rows(
    m: Measured, priced: Priced, sized: Sized, decision: Decision, opts: AnalyzeOptions
) -> list[FlipRow]:
    tf, rf, bw, th = m.trace_figures, m.reuse, priced.bandwidth, opts.thresholds
    rows: list[FlipRow] = []

    def row(dim: str, label: str, fleets: Sequence[Fleet]) -> None:
        v = decide(tf, rf, bw, fleets, th).verdict
        rows.append(FlipRow(dim, label, v, v != decision.verdict, ""))

    p = priced.prices
    if p.gpu_hour is not None:
        for f in GPU_PRICE_FACTORS:
            row(
                "GPU price",
                f"x{f:g} (${p.gpu_hour.usd * f:.2f} per GPU-hour)",
                _repriced(sized, p.scaled(gpu=f)),
            )
    for f in DRAM_PRICE_FACTORS:
        row(
            "DRAM price",
            f"x{f:g} (${p.dram_gb_month.usd * f:.2f} per GB-month)",
            _repriced(sized, p.scaled(dram=f)),
        )
    return rows


def _flip_variants(
    m: Measured, priced: Priced, replayed: Replayed, sized: Sized, opts: AnalyzeOptions
) -> list[_Variant]:
    """The load, SLO and pool link variants, each asked of every affected option. The
    load row names the whole log's busiest rate (each model's plan is replayed at its
    own busiest window's, x the factor)."""
    out: list[_Variant] = []
    window = opts.peak_window_s
    peak = load_figures(m.trace.arrival_s, window).peak_rps
    for f in LOAD_FACTORS:
        out.append(
            _Variant(
                "flip",
                "load",
                f"x{f:g} ({peak * f:.3g} requests/s at the busiest {window:g} s)",
                "every option sized again by replaying",
                tuple(
                    asks(
                        priced,
                        replayed,
                        opts,
                        load_factor=f,
                        hints=_hints(sized, f, harder=f > 1),
                    )
                ),
            )
        )
    for f in SLO_FACTORS:
        slo = opts.ttft_slo_s * f
        out.append(
            _Variant(
                "flip",
                "TTFT SLO",
                f"x{f:g} (p90 {1000 * slo:,.0f} ms)",
                "every option sized again by replaying",
                tuple(
                    asks(
                        priced,
                        replayed,
                        opts,
                        ttft_slo_s=slo,
                        # a tighter SLO can need many more: doubling finds them sooner
                        hints=_hints(sized, 1 / f, harder=f < 1, gallop=False),
                    )
                ),
            )
        )
    pool = None if priced.bandwidth is None else priced.bandwidth.tier(Tier.POOL)
    if pool is not None and sized.fleet(Scenario.POOLED) is not None:
        for f in LINK_FACTORS:
            gbps = pool.bandwidth_gbps * f
            linked = _with_pool_link(priced, gbps)
            out.append(
                _Variant(
                    "flip",
                    "pool link",
                    f"x{f:g} ({gbps:.3g} GB/s per node)",
                    "the pooled KV store sized again by replaying",
                    tuple(
                        asks(
                            linked,
                            replayed,
                            opts,
                            options=(Scenario.POOLED,),
                            hints=_hints(sized, harder=f < 1),
                        )
                    ),
                    keep=tuple(fl for fl in sized.fleets if fl.option != Scenario.POOLED),
                )
            )
    return out


def _with_pool_link(priced: Priced, gbps: float) -> Priced:
    setups = tuple(replace(s, cluster=replace(s.cluster, pool_gbps=gbps)) for s in priced.setups)
    return replace(priced, setups=setups)


@dataclass(frozen=True, slots=True)
class _SideRow:
    """Another GPU or model for the side-by-side table, priced: its options, setups and
    the traces its replays take."""

    dim: str  # "gpu" or "model"
    name: str
    opts: AnalyzeOptions
    priced: Priced
    traces: tuple[ReplayTrace, ...]


def _side_rows(
    m: Measured, priced: Priced, replayed: Replayed, opts: AnalyzeOptions
) -> list[_SideRow]:
    """The other catalog GPUs and (for a log of one model) models, each model at the
    smallest tensor parallelism that holds it there (none that fits no TP tried)."""
    alternatives: list[tuple[str, str]] = [("gpu", g) for g in ALT_GPUS]
    if len(priced.setups) == 1:
        alternatives += [("model", x) for x in ALT_MODELS]
    here = priced.primary
    rows: list[_SideRow] = []
    n_models = 0
    for dim, name in alternatives:
        if dim == "gpu" and name == here.cluster.gpu:
            continue
        if dim == "model" and (name == here.model or n_models >= 2):
            continue
        cluster = replace(opts.cluster, gpu=name) if dim == "gpu" else opts.cluster
        o = replace(opts, cluster=cluster)
        choices = tuple(s.choice for s in priced.setups)
        if dim == "model":
            choices = (replace(choices[0], model=name, weights_dtype=None),)
        try:
            alt = price_stage(m, choices, o)
        except UsageError:  # does not fit on this GPU at any TP tried
            continue
        n_models += dim == "model"
        traces = tuple(
            rt if rt.trace is s.trace else replay_trace(s, opts.full_replay)
            for s, rt in zip(alt.setups, replayed.traces, strict=True)
        )
        rows.append(_SideRow(dim, name, o, alt, traces))
    return rows


def side_floor_searches(
    m: Measured, priced: Priced, replayed: Replayed, opts: AnalyzeOptions
) -> list[Search]:
    """The replays of the side-by-side rows' floors, which depend on no plan: an
    analysis with processes to spare runs them beside the plan's first searches, and
    :func:`explore` then finds them remembered (its floors are the same questions)."""
    if not opts.sensitivity_replays:
        return []
    pairs = _floor_pairs(_side_rows(m, priced, replayed, opts))
    return [sr for _, _, sr in floor_searches(pairs, opts.ttft_slo_s, opts.warmup)[1]]


def _floor_pairs(rows: Sequence[_SideRow]) -> list[tuple[ModelSetup, ReplayTrace]]:
    """Every row's models with the traces they replay, in order (their floors)."""
    return [(s, rt) for row in rows for s, rt in zip(row.priced.setups, row.traces, strict=True)]


def _side_variants(
    m: Measured,
    priced: Priced,
    replayed: Replayed,
    sized: Sized,
    decision: Decision,
    opts: AnalyzeOptions,
    services: Services,
) -> list[_Variant]:
    """The verdict's option on the other GPUs and models (:func:`_side_rows`), each
    row's floor checked first."""

    option = decision.scenario or BASELINE
    fleet = sized.fleet(option)
    if fleet is None:
        return []
    cap = None if fleet.instances is None else SIDE_INSTANCES_MULTIPLE * fleet.instances
    rows = _side_rows(m, priced, replayed, opts)
    # every row's floors replayed at once
    floors = floors_of(_floor_pairs(rows), opts.ttft_slo_s, opts.warmup, services.replayer)
    out: list[_Variant] = []
    k = 0
    for row in rows:
        alt, traces = row.priced, row.traces
        ratio = _compute_ratio(priced, alt, m.trace_figures.mean_prompt_tokens)
        mine = _hints(sized, ratio)
        hints = {
            (s.model, option): h for s in alt.setups for (_, o), h in mine.items() if o == option
        }
        rp = replace(replayed, traces=traces, floors=tuple(floors[k : k + len(traces)]))
        k += len(traces)
        label = f"{row.name} (tp {alt.primary.tp})"
        out.append(
            _Variant(
                "side",
                row.dim,
                label,
                "",
                # within the cap only (SIDE_INSTANCES_MULTIPLE): a GPU or model no size of
                # which meets the SLO says so, and the counts above the cap, each
                # replay costlier than the last (an arrival syncs every instance), are
                # not searched for a row
                tuple(
                    asks(
                        alt,
                        rp,
                        row.opts,
                        options=(option,),
                        hints=hints,
                        look_beyond=False,
                        cap_instances=cap,
                    )
                ),
                priced=alt,
            )
        )
    return out


def _arrivals_variant(
    m: Measured,
    priced: Priced,
    replayed: Replayed,
    sized: Sized,
    decision: Decision,
    opts: AnalyzeOptions,
) -> _Variant | None:
    """The verdict's option with the log's same-instant requests spread out, when its
    arrivals are coarse."""

    a = m.arrivals
    option = decision.scenario or BASELINE
    mine = sized.fleet(option)
    if not a.coarse or mine is None or not mine.meets_slo or len(priced.setups) != 1:
        return None
    s = priced.setups[0]
    smooth = replace(s, trace=spread(s.trace, a.step_s))
    rt = replay_trace(smooth, opts.full_replay)
    rt = replace(rt, part=f"{s.part or ''}#spread")
    spread_priced = replace(priced, setups=(smooth,))
    spread_replayed = replace(replayed, traces=(rt,))
    batch = asks(spread_priced, spread_replayed, opts, options=(option,), hints=_hints(sized))
    return _Variant("arrivals", "arrivals", "", "", tuple(batch))


def _compute_ratio(a: Priced, b: Priced, mean_prompt: float) -> float:
    """Prefill time of the mean prompt on an instance of ``b``'s primary model and GPU
    (at its TP) over one of ``a``'s: how many more instances ``b`` probably needs, where
    its search starts (its answer does not depend on it). Per instance, not per GPU:
    the Mooncake trace's 70B row (TP 4) started at 3 instances for an answer of 10 when
    the ratio was also divided by the TPs, and took five replays for two."""
    n = max(1, round(mean_prompt))
    ta = a.primary.cost.prefill_time_s(n, 0)
    tb = b.primary.cost.prefill_time_s(n, 0)
    return tb / ta if ta > 0 else 1.0


def _choice(f: Fleet, priced: Priced, verdict: str | None) -> PricedChoice:
    p = f.plans[0]
    price = priced.prices.gpu_hour_for(p.gpu)
    return PricedChoice(
        model=" + ".join(model_label(x.model) for x in f.plans),  # a config by its folder
        gpu=p.gpu,
        tp=p.tp,
        usd_per_gpu_hour=None if price is None else price.usd,
        verdict=verdict,
        options=(
            (
                Scenario(f.option),
                PricedOption(
                    ttft_mean_s=None if f.ttft is None else f.ttft.mean_s,
                    ttft_p90_s=None if f.ttft is None else f.ttft.p90_s,
                    gpus_at_peak_load=f.gpus,
                    total_usd_month=f.money.total_usd_month,
                    status=f.status,
                    cap_gpus=sum(p.cap_instances * p.tp for p in f.plans),
                ),
            ),
        ),
    )


def explore(
    m: Measured,
    priced: Priced,
    replayed: Replayed,
    sized: Sized,
    decision: Decision,
    opts: AnalyzeOptions,
    services: Services,
) -> Explored:
    """The flips, the other GPUs and models, the arrivals' effect (module docstring):
    every variant's questions asked of the replayer at once, so that they run in
    parallel. Without ``opts.sensitivity_replays`` only what needs no replay (the price
    flips)."""
    rows = _price_rows(m, priced, sized, decision, opts)
    meeting = any(f.meets_slo for f in sized.fleets)
    if not opts.sensitivity_replays or not meeting:
        return Explored(tuple(rows), (), None)
    # The side-by-side rows first: a GPU or model no size of which meets the SLO is the
    # longest search, and the searches go out in this order as processes come free.
    variants = _side_variants(m, priced, replayed, sized, decision, opts, services)
    arr = _arrivals_variant(m, priced, replayed, sized, decision, opts)
    if arr is not None:
        variants.append(arr)
    variants += _flip_variants(m, priced, replayed, sized, opts)
    batch = [a for v in variants for a in v.asks]
    with progress("sensitivity, other GPUs and models: sized again by replaying", None):
        plans = answer(batch, services, opts.thresholds.objective, baseline_first=True)
    tf, rf, th = m.trace_figures, m.reuse, opts.thresholds
    option = decision.scenario or BASELINE
    mine = sized.fleet(option)
    side: list[PricedChoice] = [] if mine is None else [_choice(mine, priced, decision.verdict)]
    effect: ArrivalsEffect | None = None
    k = 0
    for v in variants:
        got = sized_of(plans[k : k + len(v.asks)])
        k += len(v.asks)
        if v.kind == "flip":
            fleets = (*v.keep, *got.fleets)
            verdict = decide(tf, rf, priced.bandwidth, fleets, th).verdict
            rows.append(FlipRow(v.dimension, v.label, verdict, verdict != decision.verdict, v.note))
        elif v.kind == "side":
            f = got.fleet(option)
            if f is not None and v.priced is not None:
                side.append(_choice(f, v.priced, None))
        else:
            f = got.fleet(option)
            effect = ArrivalsEffect(
                option,
                None if mine is None else mine.gpus,
                None if f is None else f.gpus,
                m.arrivals.step_s,
            )
    return Explored(tuple(rows), tuple(side), effect)
