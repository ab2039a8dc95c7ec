"""Plain words over a ``kvpool.report/3`` document: the three-sentence summary that
opens every output, the glossary, and the money and side-by-side tables.

Everything here reads the report's typed view (:class:`analyzer.report.plan_views.ReportView`)
only, never a stage, and every count, TTFT and amount of money it writes is one of the
plans' (``doc.fleet``, ``doc.plans``): the terminal, the Markdown and HTML reports and
the dashboard show the same sentences and rows, from the same rounded figures, in the
one vocabulary of :mod:`analyzer.advisor.words`.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import TypeVar

from analyzer.advisor.figures import Undefined, Verdict
from analyzer.advisor.plan import PlanStatus
from analyzer.advisor.words import (
    OPTION_DESCRIPTION,
    OPTION_NAME,
    count,
    gpus,
    listed,
    ms,
    ms_change,
    option_name,
    usd,
)
from analyzer.replay.config import Scenario
from analyzer.report.plan_views import FleetView, FlipRowView, MoneyView, ReportView, SideOptionView
from analyzer.report.schema import NotApplicable
from analyzer.report.views import TtftSecondsView

_T = TypeVar("_T")

# The option each scenario name stands for, in words (one name everywhere).
OPTION_LABEL = OPTION_NAME
OPTION_ORDER = (Scenario.LOCAL, Scenario.LOCAL_DRAM, Scenario.LOCAL_DRAM_NVME, Scenario.POOLED)
VERDICT_SENTENCE = {
    Verdict.DEPLOY_POOLED: "Deploy a pooled KV store (Mooncake Store, LMCache remote or SGLang "
    "HiCache L3) in front of the engines' HBM prefix caches",
    Verdict.NOT_WORTH_IT: "Keep the engines' HBM prefix cache; neither a pool nor an offload "
    "tier pays on this log",
    Verdict.INSUFFICIENT_DATA: "The log cannot answer the question yet",
}
OFFLOAD_SENTENCE = {
    Scenario.LOCAL_DRAM: "Offload KV to a host DRAM tier on each node (vLLM CPU offloading, "
    "LMCache local CPU or SGLang HiCache L2); do not pool",
    Scenario.LOCAL_DRAM_NVME: "Offload KV to host DRAM and local NVMe on each node (LMCache "
    "local CPU and local disk, or SGLang HiCache L2 and file storage); do not pool",
}

GLOSSARY: dict[str, str] = {
    "TTFT": "Time to first token: queueing, KV loads and prefill of a request, in ms.",
    "p90": "The 90th percentile: 9 requests in 10 are at or below it.",
    "SLO": "Service-level objective; here a p90 TTFT target (--ttft-slo).",
    "plan": "One option for one model sized by replaying: the fewest instances whose "
    "replay keeps p90 TTFT within the SLO at the busiest load, and the GPUs, nodes, "
    "memory and money of exactly those instances.",
    "busiest load": "The request rate of the log's busiest window (--peak-window, 300 s by "
    "default); plans are replayed with the log's gaps shortened to that rate.",
    "prefill": "Processing the prompt before the first token; the work a KV cache saves.",
    "ceiling": "The share of prompt tokens a cache of unlimited size with perfect routing "
    "would serve: the most any cache can save on this log.",
    "steady state": "Figures measured after the warm-up, once caches hold what the "
    "workload keeps reusing.",
    "warm-up": "The first share of requests (--warmup, default 50%) that only fill the "
    "caches and are not counted.",
    "knee": "The smallest cache reaching 90% of the ceiling on the LRU hit-ratio curve: "
    "beyond it, more memory buys little.",
    "working set": "The KV bytes of the prefixes the workload keeps reusing; the cache "
    "size at which the hit ratio reaches the ceiling.",
    "break-even bandwidth": "The link speed (GB/s) above which loading a cached prefix is "
    "faster than recomputing it: bytes per token x prefill tokens per second.",
    "MFU": "Model FLOP/s utilisation: the share of the GPU's peak FLOP/s prefill achieves.",
    "gate": "A pilot check with a pass/fail criterion; `kvpool validate` tests measured "
    "results against it.",
    "flip": "A change of an input the team controls (load, prices, the SLO, the pool link) "
    "that changes the verdict.",
    "write-through": "Every KV block computed is written to the lower tiers at once, so a "
    "later request on any instance can load it.",
}


def _f(x: float | NotApplicable | None) -> float | None:
    return None if x is None or isinstance(x, NotApplicable) else float(x)


def known(x: _T | NotApplicable | None) -> _T | None:
    """A figure, None when it is missing or does not apply (its reason is elsewhere)."""
    return None if isinstance(x, NotApplicable) else x


def _i(x: int | NotApplicable | None) -> int | None:
    """A count, None when it does not apply."""
    return None if x is None or isinstance(x, NotApplicable) else int(x)


def _t(x: TtftSecondsView | NotApplicable | None) -> TtftSecondsView | None:
    return None if x is None or isinstance(x, NotApplicable) else x


def _usd(x: float | NotApplicable | None) -> str:
    """Dollars in a cell or a sentence; a figure that does not apply by its short reason."""
    return x.short if isinstance(x, NotApplicable) else usd(x)


def _ms(x: float | NotApplicable | None) -> str:
    return x.short if isinstance(x, NotApplicable) else ms(x)


def _cell(x: int | NotApplicable | None, fmt: str = ",") -> str:
    """A count in a table cell; one that does not apply by its short reason."""
    if x is None:
        return "-"
    if isinstance(x, NotApplicable):
        return x.short
    return f"{x:{fmt}}"


def undefined_notes(doc: ReportView, *, money: bool = True, side_by_side: bool = True) -> list[str]:
    """What each short "not applicable" word of the money table and of the side-by-side
    table (other GPUs and models) means, once per reason, in words: each output gives
    the notes of the tables it shows, beside them."""
    rows: list[FleetView | MoneyView | SideOptionView] = []
    if money:
        rows += [*doc.fleet.values(), *(f.money for f in doc.fleet.values())]
    if side_by_side:
        rows += [o for r in doc.side_by_side for o in (r.options or {}).values()]
    notes: dict[str, str] = {}
    for o in rows:
        for f in fields(o):
            x = getattr(o, f.name)
            if isinstance(x, NotApplicable) and x.not_applicable != Undefined.BASELINE:
                notes.setdefault(x.not_applicable, f"{x.short}: {x.reason}.")
    return list(notes.values())


def _signed_ms(delta_s: float) -> str:
    """A TTFT change in words (the summary's): ``saves 181 ms``, ``adds 12 ms``."""
    return ms_change(delta_s)


def _fleet(doc: ReportView, option: str) -> FleetView | None:
    return doc.fleet.get(Scenario(option)) if option in set(Scenario) else None


def _where(doc: ReportView, f: FleetView) -> str:
    """``7 instances of 1 x h100 on 7 nodes``; for a fleet of several models, each
    model's GPUs, most first (``qwen3-coder-480b-a35b on 16 GPUs, llama-3.1-70b on 2
    GPUs, ...``)."""
    plans = [p for p in doc.plans if p.option == f.option and _i(p.instances) is not None]
    if len(plans) == 1:
        p = plans[0]
        n, nodes = _i(p.instances), _i(p.nodes)
        assert n is not None and nodes is not None
        return f"{count(n, 'instance')} of {p.tp} x {p.gpu} on {count(nodes, 'node')}"
    plans.sort(key=lambda p: -(_i(p.gpus) or 0))
    parts = [f"{p.model} on {gpus(_i(p.gpus))}" for p in plans]
    nodes = _i(f.nodes)
    on = "" if nodes is None else f" on {count(nodes, 'node')}"
    return f"{count(len(plans), 'model')}{on}, no two on one GPU: {listed(parts, most=5)}"


def _load_words(doc: ReportView) -> str:
    """The busiest load, with what its rate multiple means."""
    econ = doc.economics
    if econ is None or econ.load is None:
        return "the busiest load"
    load = econ.load
    peak, mean, factor = _f(load.peak_rps), _f(load.mean_rps), _f(load.peak_factor)
    if peak is None or mean is None or factor is None:
        return "the busiest load"
    return (
        f"the busiest load ({peak:.3g} requests/s over its busiest {load.peak_window_s:g} s, "
        f"{factor:.3g} x the log's mean of {mean:.3g} requests/s)"
    )


def _ttft_words(f: FleetView) -> str:
    t = _t(f.ttft_s)
    if t is None:
        return ""
    return f" at {ms(t.mean)} mean and {ms(t.p90)} p90 TTFT"


def _one_thing(doc: ReportView) -> str:
    """The smallest change of an input the team controls that flips the verdict."""
    rows = [r for r in doc.sensitivity.rows if r.flips]
    if not rows and doc.verdict.verdict == Verdict.CANNOT_MEET_SLO:
        return _what_would_meet(doc)
    if not rows:
        return "no input the team controls flips it within the sensitivity table's ranges"

    def distance(r: FlipRowView) -> float:
        m = re.match(r"x([0-9.]+)", r.value)
        if not m:
            return 10.0
        f = float(m.group(1))
        return 20.0 if f <= 0 else abs(math.log(f))

    order = ["load", "TTFT SLO", "GPU price", "DRAM price", "pool link"]
    rows.sort(key=lambda r: (distance(r), order.index(r.dimension) if r.dimension in order else 99))
    r = rows[0]
    more = (
        f" ({len(rows) - 1} other change{'' if len(rows) == 2 else 's'} in the sensitivity table)"
        if len(rows) > 1
        else ""
    )
    return f"{r.dimension} at {r.value} would make it {r.verdict}{more}"


def _what_would_meet(doc: ReportView) -> str:
    """For an SLO no option meets: the SLO the fastest deployment meets, or the GPUs
    that would meet this one (the fewest over the options searched above the cap)."""
    base = _fleet(doc, Scenario.LOCAL)
    if base is not None and base.status == PlanStatus.PREFILL_BOUND and base.floor_p90_s:
        return (
            f"a p90 TTFT SLO of at least {ms(base.floor_p90_s)}, the lowest any size reaches "
            "on this model and GPU"
        )
    above = [
        n
        for f in (_fleet(doc, o) for o in OPTION_ORDER)
        if f is not None and (n := f.gpus_above_cap) is not None
    ]
    if above:
        return f"--max-gpus of at least {min(above):,}, the fewest GPUs that meet the SLO"
    return "a looser SLO: no size searched meets this one"


def summary_sentences(doc: ReportView) -> list[str]:
    """Three sentences: the verdict; what it buys, from its plan, in ms of mean and p90
    TTFT, in GPUs and in money per month; the confidence and the one input the team
    controls that would most change it. A fourth on tenant isolation when it matters
    (:func:`isolation_sentence`)."""
    v = doc.verdict
    verdict, chosen = v.verdict, v.scenario
    if verdict == Verdict.LOCAL_OFFLOAD_ONLY and chosen in OFFLOAD_SENTENCE:
        first = OFFLOAD_SENTENCE[chosen] + "."
    elif verdict == Verdict.CANNOT_MEET_SLO:
        base = _fleet(doc, Scenario.LOCAL)
        where = (
            "at any size"
            if base is not None and base.status == PlanStatus.PREFILL_BOUND
            else "within the GPUs allowed"
        )
        first = (
            f"No deployment meets the p90 TTFT SLO of {ms(doc.options.ttft_slo_s)} {where}; "
            "no tier is recommended."
        )
    else:
        first = VERDICT_SENTENCE.get(verdict, verdict) + "."
    base = _fleet(doc, Scenario.LOCAL)
    if verdict != Verdict.INSUFFICIENT_DATA and base is None and not doc.options.size_search:
        second = f"No TTFT, GPU or money figure is projected: {Undefined.SIZE_SEARCH_OFF.words}."
    elif verdict == Verdict.INSUFFICIENT_DATA or base is None:
        missing = "; ".join(v.missing) or "the options sized by replaying"
        second = f"No TTFT, GPU or money figure is projected without it: missing {missing}."
    elif verdict == Verdict.CANNOT_MEET_SLO:
        second = _cannot_meet_sentence(doc)
    else:
        pick = _fleet(doc, chosen) if chosen else None
        assert pick is not None
        head = (
            f"It serves {_load_words(doc)} on {gpus(_i(pick.gpus))} ({_where(doc, pick)}) for "
            f"{_month(pick.money.total_usd_month)}{_ttft_words(pick)}"
        )
        b_gpus, b_ttft, p_ttft = _i(base.gpus), _t(base.ttft_s), _t(pick.ttft_s)
        if chosen != Scenario.LOCAL and b_gpus is not None and b_ttft and p_ttft:
            d_gpus = b_gpus - (_i(pick.gpus) or 0)
            saved = (
                f"{count(d_gpus, 'GPU')} fewer"
                if d_gpus > 0
                else f"{count(-d_gpus, 'GPU')} more"
                if d_gpus < 0
                else "as many GPUs"
            )
            net = _f(pick.net_usd_month)
            money = (
                "its money is not projected"
                if net is None
                else f"saves {usd(net)} per month net"
                if net >= 0
                else f"costs {usd(-net)} per month more"
            )
            second = (
                f"{head}: against the baseline ({gpus(b_gpus)}, "
                f"{_month(base.money.total_usd_month)}) it "
                f"{ms_change(_s(p_ttft.mean) - _s(b_ttft.mean))} of mean TTFT, needs "
                f"{saved} and {money}."
            )
        else:
            second = head
            second += _runner_up(doc, base)
            second += "."
    third = f"Confidence is {v.confidence}; what would most change it: {_one_thing(doc)}."
    fourth = isolation_sentence(doc)
    return [first, second, third, *([fourth] if fourth else [])]


def isolation_sentence(doc: ReportView) -> str | None:
    """The summary's word on tenant isolation: when the analysis keyed blocks by tenant or
    user, or when a shared pool would serve a material share of its hits across tenants
    (analyzer/advisor/isolation.py); None otherwise."""
    iso = doc.isolation
    if iso is None or (iso.policy == "shared" and not iso.material):
        return None
    said = iso.sentence[:1].upper() + iso.sentence[1:]
    if iso.policy == "shared":
        return (
            f"{said}: a cache salt per tenant (cache_salt, extra_key) would keep tenants "
            "apart (Tenant isolation)."
        )
    unit = "tenant" if iso.policy == "tenant" else "end user"
    return f"Every figure is with a cache salt per {unit} (Tenant isolation): {iso.sentence}."


def _runner_up(doc: ReportView, base: FleetView) -> str:
    """The next option meeting the SLO beside the baseline, as deploy/ ships it."""
    name = next((f.option for f in doc.deploy.files if f.role == "runner-up"), None)
    deploy_of = {
        "pooled": Scenario.POOLED,
        "local-offload": Scenario.LOCAL_DRAM,
        "local-offload-nvme": Scenario.LOCAL_DRAM_NVME,
    }
    option = deploy_of.get(str(name)) if name is not None else None
    alt = _fleet(doc, option) if option is not None else None
    a_total = None if alt is None else _f(alt.money.total_usd_month)
    b_total = _f(base.money.total_usd_month)
    if alt is None or a_total is None or b_total is None:
        return ""
    more = a_total - b_total
    cost = (
        f"costs {usd(more)} per month more"
        if more > 0
        else f"costs {usd(-more)} per month less"
        if more < 0
        else "costs the same"
    )
    return f"; the runner-up in deploy/, {option_name(alt.option)}, needs {gpus(_i(alt.gpus))} and {cost}"


def _cannot_meet_sentence(doc: ReportView) -> str:
    base = _fleet(doc, Scenario.LOCAL)
    assert base is not None
    if base.status == PlanStatus.PREFILL_BOUND and base.floor_p90_s is not None:
        return (
            "Even alone on an idle instance with every reusable prefix cached, a tenth of the "
            f"requests take longer to prefill: p90 TTFT cannot go below {ms(base.floor_p90_s)} "
            "on this model and GPU at any size."
        )
    parts = []
    for o in OPTION_ORDER:
        f = _fleet(doc, o)
        if f is None:
            continue
        if f.status == PlanStatus.ABOVE_CAP and f.gpus_above_cap is not None:
            parts.append(f"{option_name(o)} would on {gpus(f.gpus_above_cap)}")
        else:
            parts.append(f"{option_name(o)} on none up to {gpus(f.cap_gpus or None)}")
    return (
        f"Within the cap of {gpus(base.cap_gpus)} (--max-gpus) none meets it: "
        + "; ".join(parts)
        + "."
    )


def _month(x: float | NotApplicable | None) -> str:
    """A monthly cost in a sentence; one without a price says why."""
    if isinstance(x, NotApplicable):
        return f"a monthly cost not projected ({x.reason})"
    return f"{usd(x)} per month" if x is not None else "a monthly cost not priced"


def _s(x: float | None) -> float:
    """A figure the sentence needs (a replayed TTFT): present whenever the branch that
    reads it runs."""
    assert x is not None
    return x


def economics_table(doc: ReportView) -> tuple[list[str], list[list[str]]] | None:
    """Per option (its fleet): GPUs, nodes, TTFT at the busiest load, monthly cost, net
    value, payback."""
    if not doc.fleet:
        return None
    header = [
        "Option",
        "GPUs",
        "Nodes",
        "Mean / p90 TTFT",
        "GPU cost / month",
        "Added: DRAM, NVMe, NICs, servers / month",
        "Total / month",
        "Net against the baseline / month",
        "Payback of the pilot",
    ]
    rows = []
    for name in OPTION_ORDER:
        f = doc.fleet.get(name)
        if f is None:
            continue
        g, n = _cell(f.gpus), _cell(f.nodes)
        if f.status == PlanStatus.ABOVE_CAP and f.gpus_above_cap is not None:
            g = f"above the cap ({f.gpus_above_cap:,} needed)"
        t = f.ttft_s
        m = f.money
        pay = f.payback_months
        net = f.net_usd_month
        rows.append(
            [
                option_name(name),
                g,
                n,
                "-"
                if t is None
                else t.short
                if isinstance(t, NotApplicable)
                else f"{ms(t.mean)} / {ms(t.p90)}",
                _usd(m.gpu_usd_month),
                f"{usd(m.added_usd_month)} ({m.dram_gb:,.0f} GB DRAM, {m.nvme_tb:,.1f} TB NVMe, "
                f"{count(m.nic_nodes, 'NIC')})",
                _usd(m.total_usd_month),
                "baseline"
                if name == Scenario.LOCAL
                else "-"
                if net is None
                else net.short
                if isinstance(net, NotApplicable)
                else f"saves {usd(net)}"
                if net > 0
                else f"costs {usd(-net)} more"
                if net < 0
                else "the same",
                "-"
                if pay is None
                else pay.short
                if isinstance(pay, NotApplicable)
                else f"{pay:.1f} months ({_usd(f.pilot_usd)})",
            ]
        )
    return header, rows


def isolation_table(doc: ReportView) -> tuple[list[str], list[list[str]]] | None:
    """Each option under each policy the isolation section planned (None: none)."""
    iso = doc.isolation
    if iso is None or not iso.options:
        return None
    rows = []
    for name, o in iso.options.items():
        for i, (policy, f) in enumerate(o.policies.items()):
            extra = o.isolating_usd_month.get(policy)
            lost = o.hits_lost_share
            cross = f.cross_tenant_hit_share
            rows.append(
                [
                    OPTION_LABEL.get(name, name) if i == 0 else "",
                    policy,
                    "-" if f.hit_rate is None else f"{f.hit_rate:.1%}",
                    "-" if cross is None else f"{cross:.1%}",
                    f"{ms(f.ttft_mean_s)} / {ms(f.ttft_p90_s)}",
                    "-" if f.gpus is None else f"{f.gpus:,}",
                    "-" if f.total_usd_month is None else usd(f.total_usd_month),
                    "" if policy == "shared" else "-" if extra is None else usd(extra),
                    ("-" if lost is None else f"{lost:.1%}") if i == 0 else "",
                ]
            )
    header = [
        "Option",
        "Keyed by",
        "Hit rate",
        "Hits from another tenant",
        "Mean / p90 TTFT",
        "GPUs",
        "Total / month",
        "Isolating adds / month",
        "Hit rate lost",
    ]
    return header, rows


def isolation_products_table(doc: ReportView) -> tuple[list[str], list[list[str]]] | None:
    """Whether each stack of the bundle keys every tier by the cache salt at the versions
    it targets (None: the section lists none)."""
    iso = doc.isolation
    if iso is None or not iso.products:
        return None
    rows = [
        [
            p.option,
            p.stack,
            "yes" if p.holds else "no: it would share KV blocks across tenants",
            (p.needs or "-") if p.holds else "no release keys every tier (above)",
        ]
        for p in iso.products
    ]
    return ["deploy/ folder", "Stack", "Keys every tier by the salt", "Needs"], rows


def options_table() -> tuple[list[str], list[list[str]]]:
    """Each option's one name and what it deploys."""
    return ["Option", "What it deploys"], [
        [OPTION_NAME[o], OPTION_DESCRIPTION[o]] for o in OPTION_ORDER
    ]


def price_table(doc: ReportView) -> tuple[list[str], list[list[str]]] | None:
    prices = (doc.economics.prices if doc.economics is not None else None) or ()
    if not prices:
        return None
    rows = [
        [
            p.what,
            "not priced" if p.usd is None else f"${p.usd:,.4g} per {p.unit}",
            "" if p.source is None else p.source,
            p.date or "-",
        ]
        for p in prices
    ]
    return ["Price", "Value", "Source", "Read on"], rows


def side_by_side_table(doc: ReportView) -> tuple[list[str], list[list[str]]] | None:
    """The verdict's option on your model and GPU and planned on catalog alternatives."""
    rows_in = doc.side_by_side
    if not rows_in:
        return None
    header = [
        "Model on GPU",
        "Option",
        "GPUs (busiest load)",
        "Mean TTFT",
        "p90 TTFT",
        "Cost / month",
    ]
    rows = []
    for k, r in enumerate(rows_in):
        choice = f"{r.model} on {r.tp} x {r.gpu}" + (" (yours)" if k == 0 else "")
        for name, o in (r.options or {}).items():
            rows.append(
                [
                    choice,
                    option_name(name),
                    _cell(o.gpus_at_peak_load)
                    if o.cap_gpus is None or not isinstance(o.gpus_at_peak_load, NotApplicable)
                    else f"none within {o.cap_gpus:,}",
                    _ms(o.ttft_mean_s),
                    _ms(o.ttft_p90_s),
                    _usd(o.total_usd_month),
                ]
            )
    return header, rows


def glossary_rows() -> list[list[str]]:
    return [[term, text] for term, text in GLOSSARY.items()]
