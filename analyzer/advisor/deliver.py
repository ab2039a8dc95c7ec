"""The deliver stage: what a team takes away, each piece read off the chosen plan.

The sized recommendation (:class:`analyzer.advisor.sizing.Sizing`) takes the plan's
instances, nodes and tier capacities as they were replayed, and adds what the plan does
not decide (the NIC, the block and chunk sizes, the router, the eviction policy); the
products' settings and ``deploy/`` are written from it, for the verdict's option and
the runner-up (the next option that meets the SLO, by cost), each model of a
multi-model log in a folder of its own; the pilot gates take their projections from
the plans; the pilot commands replay the log at its own rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from analyzer.advisor import gates as gates_mod
from analyzer.advisor.decide import BASELINE
from analyzer.advisor.deploy import (
    ROOT,
    DeployFile,
    PerProcessRow,
    bundle,
    checked_all,
    per_process,
)
from analyzer.advisor.figures import (
    BandwidthFigures,
    Decision,
    DeployOption,
    ScenarioFigures,
    Verdict,
)
from analyzer.advisor.isolation import tenant_count
from analyzer.advisor.pilot import PilotCommand, pilot_commands
from analyzer.advisor.plan import DeploymentPlan, Fleet, PlanStatus
from analyzer.advisor.products import ProductSettings, translate
from analyzer.advisor.served import served_model
from analyzer.advisor.sizing import ClusterFigures, Sizing, size
from analyzer.advisor.words import count, ms, option_name
from analyzer.cost import list_tiers
from analyzer.replay.config import Scenario
from analyzer.trace import read_metadata

if TYPE_CHECKING:
    from analyzer.advisor.measure import Measured
    from analyzer.advisor.options import AnalyzeOptions
    from analyzer.advisor.price import ModelSetup, Priced
    from analyzer.advisor.size import Sized

# The deploy folder of each option.
DEPLOYED: dict[str, DeployOption] = {
    Scenario.LOCAL: DeployOption.PREFIX_CACHE_ONLY,
    Scenario.LOCAL_DRAM: DeployOption.LOCAL_OFFLOAD,
    Scenario.LOCAL_DRAM_NVME: DeployOption.LOCAL_OFFLOAD_NVME,
    Scenario.POOLED: DeployOption.POOLED,
}


@dataclass(frozen=True, slots=True)
class Delivered:
    sizing: Sizing | None  # the verdict's option, the primary model
    settings: tuple[ProductSettings, ...]
    deploy: tuple[DeployFile, ...]
    per_process: tuple[PerProcessRow, ...]
    gates: tuple[gates_mod.Gate, ...]
    pilot: tuple[PilotCommand, ...]
    runner_up: str | None


def runner_up(sized: Sized, chosen: str | None) -> str | None:
    """The next option to deploy if the verdict's is turned down: the cheapest other
    option that meets the SLO (the fewest GPUs without prices), of another kind."""
    others = [
        f
        for f in sized.fleets
        if f.option != chosen and f.meets_slo and f.option in DEPLOYED and f.gpus is not None
    ]
    if not others:
        return None

    def key(f: Fleet) -> tuple[float, int]:
        total = f.money.total_usd_month
        return (total if total is not None else float(f.gpus or 0), list(DEPLOYED).index(f.option))

    return min(others, key=key).option


def finite_or(gbps: float, bw: BandwidthFigures | None) -> float:
    """``gbps`` if finite, else the median-prefix break-even (or 0 when that is not either):
    very short prefixes may never pay to load, which must not size an infinite NIC."""
    if math.isfinite(gbps):
        return gbps
    if bw is not None and math.isfinite(bw.break_even_gbps):
        return bw.break_even_gbps
    return 0.0


def sizing_of(plan: DeploymentPlan, setup: ModelSetup, m: Measured, priced: Priced) -> Sizing:
    """The sized recommendation of ``plan``: its instances, nodes and tiers as replayed,
    and the settings the plan does not decide."""

    assert plan.instances is not None
    rf, rep, trace = m.reuse, m.reuse_report, setup.trace
    caps = plan.capacities
    net = [
        (t.name, float(t.bandwidth_gbps))
        for t in list_tiers()
        if t.kind == "network" and t.name.startswith(("rdma", "tcp"))
    ]
    short = max(rf.p25_prefix_tokens, trace.block_size)
    gran = rep.granularity.hit_rate_by_block_size() if rep.granularity is not None else {}
    knee = rf.knee_tokens
    pol = {"lru": rep.hit_rate_at(knee)} if knee else {}
    for name, pts in rep.policy_points.items():
        for cap, rate in pts:
            if cap == knee:
                pol[name] = float(rate)
    pooled = plan.option == Scenario.POOLED
    sz = size(
        pool=pooled,
        knee_tokens=(caps.pool or 0) if pooled else (caps.dram_per_node or 0),
        dram_simulated_tokens=caps.dram_per_node,
        cluster=ClusterFigures(
            instances=plan.instances,
            tp=plan.tp,
            gpus_per_node=plan.gpus_per_node,
            hbm_cache_tokens_per_instance=caps.hbm_per_instance,
            bytes_per_token=caps.bytes_per_token,
            router=plan.router,
        ),
        break_even_short_gbps=finite_or(
            float(setup.cost.break_even_bandwidth_gbps(short)), priced.bandwidth
        ),
        replay_pool_read_gbps_per_node=plan.pool_read_bytes_per_s_per_node / 1e9,
        network_tiers=net,
        granularity=gran,
        engine_block=trace.block_size,
        same_session_share=rf.same_session_share,
        sessions_known=m.trace_figures.sessions_known,
        policy_at_knee=pol,
    )
    nodes = plan.nodes or sz.nodes
    if plan.option in (Scenario.LOCAL_DRAM, Scenario.LOCAL_DRAM_NVME):
        sz = replace(
            sz,
            dram_per_node_tokens=caps.dram_per_node or 0,
            dram_reason=(
                f"the host DRAM the plan was replayed with ({caps.dram_per_node or 0:,} tokens "
                f"per node): the knee of the hit-ratio curve ({knee:,} tokens), capped at the "
                "node's DRAM for KV"
                if plan.option == Scenario.LOCAL_DRAM
                else "twice each instance's HBM KV pool, SGLang HiCache's host pool in front of "
                "a storage tier (--hicache-ratio 2)"
            ),
            nvme_per_node_tokens=caps.nvme_per_node or 0,
        )
    return replace(sz, nodes=nodes)


def deliver(
    m: Measured,
    priced: Priced,
    sized: Sized | None,
    decision: Decision,
    opts: AnalyzeOptions,
) -> Delivered:
    tf = m.trace_figures
    inputs = [i.name for i in m.inputs]
    primary = priced.primary
    served = served_model(primary.cost.model, primary.model)
    trace_rate = tf.n_requests / tf.duration_s if tf.duration_s > 0 else 0.0
    outs = m.trace.output_tokens[m.trace.output_tokens >= 0]
    pilot = pilot_commands(
        inputs=inputs,
        model=served,
        rate_rps=trace_rate,
        duration_s=tf.duration_s,
        n_requests=tf.n_requests,
        mean_input_tokens=tf.mean_prompt_tokens,
        mean_output_tokens=float(outs.mean()) if outs.size else None,
        tokenizer=read_metadata(m.loaded.table).get("tokenizer", ""),
        sessions=tf.sessions_known,
    )
    chosen = decision.scenario
    second = None if sized is None else runner_up(sized, chosen)
    base = None if sized is None else sized.fleet(BASELINE)
    pick = None if sized is None or chosen is None else sized.fleet(chosen)
    gates = gates_mod.plan(
        verdict=decision.verdict,
        projection=decision.projection,
        trace_rate_rps=trace_rate,
        projected_baseline_ttft_s=None if base is None or base.ttft is None else base.ttft.mean_s,
        th=opts.thresholds,
        candidate=None if pick is None else _figures(pick),
        baseline=None if base is None or not base.meets_slo else _figures(base),
        ttft_slo_s=opts.ttft_slo_s if sized is not None else None,
        throughput_gain=_gain(pick, base),
    )
    if sized is None or decision.verdict in (Verdict.INSUFFICIENT_DATA, Verdict.CANNOT_MEET_SLO):
        nothing = bundle({}, None, model=served, pilot=pilot, why=_nothing_why(decision, sized))
        return Delivered(None, (), nothing, (), gates, pilot, None)
    several = len(priced.setups) > 1
    tenants = tenant_count((m.shared or m.loaded).trace)
    files: list[DeployFile] = []
    rows: list[PerProcessRow] = []
    sizing: Sizing | None = None
    settings: tuple[ProductSettings, ...] = ()
    for setup in priced.setups:
        sizings: dict[DeployOption, Sizing] = {}
        for option in (chosen, second):
            plan = _plan(sized, setup, option)
            if plan is None:
                continue
            sizings[DEPLOYED[plan.option]] = sizing_of(plan, setup, m, priced)
        if not sizings:
            continue
        name = served if setup is primary else served_model(setup.cost.model, setup.model)
        recommended = next(iter(sizings))
        folder = _folder(setup) if several else ""
        files += bundle(
            sizings,
            recommended,
            model=name,
            pilot=pilot,
            folder=folder,
            isolation=opts.isolation,
            tenants=tenants,
        )
        rows += per_process(sizings)
        if setup is primary:
            sizing = sizings[recommended]
            settings = tuple(
                translate(sizing, decision.verdict, model=name, tp=setup.tp, mode=recommended)
            )
    if several:
        files.insert(0, _fleet_index(priced, sized, chosen, second))
    return Delivered(sizing, settings, tuple(files), tuple(rows), gates, pilot, second)


def _plan(sized: Sized, setup: ModelSetup, option: str | None) -> DeploymentPlan | None:
    if option is None:
        return None
    for p in sized.plans:
        if p.option == option and p.model == setup.model and p.served_as == setup.choice.served_as:
            return p if p.instances is not None else None
    return None


def _folder(setup: ModelSetup) -> str:
    """A model's folder in deploy/: its catalog id (the served name may hold a
    repository's slash)."""
    return setup.model.replace("/", "-")


def _fleet_index(
    priced: Priced, sized: Sized, chosen: str | None, second: str | None
) -> DeployFile:

    lines = ["# Deployment bundle", ""]
    lines.append(
        f"One folder per model: engines serve one model each, so no two share a GPU. "
        f"Recommended: **{option_name(chosen or BASELINE)}**"
        + (f"; runner-up: **{option_name(second)}**." if second else ".")
    )
    lines.append("")
    for setup in priced.setups:
        plan = _plan(sized, setup, chosen)
        if plan is None or plan.instances is None:
            continue
        lines.append(
            f"- `{_folder(setup)}/`: {setup.choice.served_as or setup.model}, "
            f"{count(plan.instances, 'instance')} of {count(plan.tp, 'GPU')} "
            f"({count(plan.gpus or 0, 'GPU')} on {count(plan.nodes or 0, 'node')})"
        )
    return DeployFile(
        f"{ROOT}/README.md",
        DEPLOYED[chosen or BASELINE],
        "index",
        "all",
        "markdown",
        checked_all(),
        "\n".join(lines).rstrip() + "\n",
    )


def _nothing_why(decision: Decision, sized: Sized | None) -> str:
    if decision.verdict == Verdict.CANNOT_MEET_SLO:
        base = None if sized is None else sized.fleet(BASELINE)
        if base is not None and base.status == PlanStatus.PREFILL_BOUND and base.floor_p90_s:
            return (
                "No option meets the TTFT SLO at any size, so nothing is deployed: even alone "
                f"on an idle instance a tenth of the requests take longer to prefill (p90 "
                f"{ms(base.floor_p90_s)}). See the report's verdict for what would meet it."
            )
        return (
            "No option meets the TTFT SLO within the GPUs allowed, so nothing is deployed: "
            "see the report's verdict for the size that would meet it, or a looser SLO."
        )
    return "The log cannot answer the question yet, so nothing is sized or deployed."


def _figures(f: Fleet) -> ScenarioFigures:
    t = f.ttft
    return ScenarioFigures(
        name=f.option,
        hit_rate=f.hit_rate or 0.0,
        ttft_mean_s=(t.mean_s or 0.0) if t else 0.0,
        ttft_p90_s=(t.p90_s or 0.0) if t else 0.0,
        ttft_p99_s=(t.p99_s or 0.0) if t else 0.0,
        max_rate_scale=None,
    )


def _gain(pick: Fleet | None, base: Fleet | None) -> float | None:
    if pick is None or base is None or pick.gpus is None or base.gpus is None or pick.gpus <= 0:
        return None
    return base.gpus / pick.gpus - 1.0
