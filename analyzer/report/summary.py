"""Plain words over a ``kvpool.report/2`` document: the three-sentence summary that
opens every output, the glossary, and the money and side-by-side tables.

Everything here reads the report's typed view (:class:`analyzer.report.document.Report`)
only, never a stage, so the terminal, the Markdown and HTML reports and the dashboard
show the same sentences and rows, from the same rounded figures.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields

from analyzer.advisor.figures import Undefined, Verdict
from analyzer.replay.config import Scenario
from analyzer.report.document import FlipRowView, NotApplicable, OptionCost, Report, SideOption

# The option each scenario name stands for, in words.
OPTION_LABEL = {
    Scenario.NONE: "no prefix cache",
    Scenario.LOCAL: "HBM prefix cache only (baseline)",
    Scenario.LOCAL_DRAM: "local DRAM offload",
    Scenario.LOCAL_DRAM_NVME: "local DRAM + NVMe offload",
    Scenario.POOLED: "pooled KV store",
}
VERDICT_SENTENCE = {
    Verdict.DEPLOY_POOLED: "Deploy a pooled KV-cache store (Mooncake Store, LMCache remote or "
    "SGLang HiCache L3) in front of the engines' HBM prefix caches",
    Verdict.LOCAL_OFFLOAD_ONLY: "Offload KV to each node's host DRAM (LMCache local CPU or SGLang "
    "HiCache L2); do not pool",
    Verdict.NOT_WORTH_IT: "Keep the engine's HBM prefix cache; neither a pool nor an offload tier "
    "pays on this log",
    Verdict.INSUFFICIENT_DATA: "The log cannot answer the question yet",
}

GLOSSARY: dict[str, str] = {
    "TTFT": "Time to first token: queueing, KV loads and prefill of a request, in ms.",
    "p90": "The 90th percentile: 9 requests in 10 are at or below it.",
    "SLO": "Service-level objective; here a p90 TTFT target (--ttft-slo).",
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
    "flip": "A change of an input (price, load, reuse, hardware) that changes the verdict.",
    "write-through": "Every KV block computed is written to the lower tiers at once, so a "
    "later request on any instance can load it.",
}

_MS = 1000.0


def _usd(x: float | NotApplicable | None) -> str:
    if x is None:
        return "not priced"
    if isinstance(x, NotApplicable):
        return x.short
    return f"-${-x:,.0f}" if x < 0 else f"${x:,.0f}"


def _count(x: int | NotApplicable | None, prefix: str = "", fmt: str = "") -> str:
    """A count of GPUs in a table cell; a figure that does not apply by its short reason."""
    if x is None:
        return "-"
    if isinstance(x, NotApplicable):
        return x.short
    return f"{prefix}{x:{fmt}}"


def undefined_notes(doc: Report) -> list[str]:
    """What each short "not applicable" word of the money and side-by-side tables means,
    once per reason, in words."""
    rows: list[OptionCost | SideOption] = [
        *_options(doc).values(),
        *(o for r in doc.side_by_side for o in (r.options or {}).values()),
    ]
    notes: dict[str, str] = {}
    for o in rows:
        for f in fields(o):
            x = getattr(o, f.name)
            if isinstance(x, NotApplicable) and x.not_applicable != Undefined.BASELINE:
                notes.setdefault(x.not_applicable, f"{x.short}: {x.reason}.")
    return list(notes.values())


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{_MS * s:,.0f} ms"


def _signed_ms(delta_s: float) -> str:
    """A TTFT change in whole ms; one that rounds to zero reads as such, never as "-0 ms"."""
    ms = _MS * delta_s
    if round(abs(ms)) == 0:
        return "less than 1 ms"
    return f"{'+' if ms > 0 else '-'}{abs(ms):,.0f} ms"


def _gpus(n: int | NotApplicable | None) -> str:
    if n is None or isinstance(n, NotApplicable):
        return "an unknown number of GPUs"
    return f"{n} GPU" + ("" if n == 1 else "s")


def _why_not(*figures: object) -> str | None:
    """The reason of the first figure that does not apply, or None."""
    for x in figures:
        if isinstance(x, NotApplicable):
            return x.reason
    return None


def _one_thing(doc: Report) -> str:
    """The smallest perturbation in the sensitivity table that flips the verdict."""
    rows = [r for r in doc.sensitivity.rows if r.flips]
    if not rows:
        return "no single input of the sensitivity table flips it"

    def distance(r: FlipRowView) -> float:
        m = re.match(r"x([0-9.]+)", r.value)
        if not m:
            return 10.0
        f = float(m.group(1))
        return 20.0 if f <= 0 else abs(math.log(f))

    order = ["GPU price", "load", "DRAM price", "reuse", "pool bandwidth", "gpu", "model"]
    rows.sort(key=lambda r: (distance(r), order.index(r.dimension) if r.dimension in order else 99))
    r = rows[0]
    return f"{r.dimension} at {r.value} would make it {r.verdict}"


def _options(doc: Report) -> dict[Scenario, OptionCost]:
    """The economics section's options by scenario (empty when nothing was priced)."""
    econ = doc.economics
    return dict(econ.options or {}) if econ is not None else {}


def summary_sentences(doc: Report) -> list[str]:
    """Three sentences: the verdict; what it buys in ms of mean and p90 TTFT, in GPUs and
    in money per month; the confidence and the one thing that would most change it."""
    v = doc.verdict
    verdict = v.verdict
    first = VERDICT_SENTENCE.get(verdict, verdict) + "."
    opts = _options(doc)
    scen = doc.scenarios
    chosen = v.scenario
    base = Scenario.LOCAL
    if verdict == Verdict.INSUFFICIENT_DATA or not scen or base not in scen:
        missing = "; ".join(v.missing) or "a replay"
        second = f"No TTFT, GPU or money figure is projected without it: missing {missing}."
    else:
        b = scen[base].ttft_s
        bo = opts.get(base) or OptionCost()
        if chosen and chosen != base and chosen in scen:
            c = scen[chosen].ttft_s
            co = opts.get(chosen) or OptionCost()
            gpus = co.gpus_at_peak_load
            bg = bo.gpus_at_peak_load
            gpu_part = (
                f"serves the busiest load on {_gpus(gpus)} instead of {bg}"
                if isinstance(gpus, int) and isinstance(bg, int)
                else f"GPUs needed not projected ({_why_not(gpus, bg) or 'no rate search'})"
            )
            money = co.net_usd_month
            money_part = (
                f"{'saves' if money >= 0 else 'costs'} {_usd(abs(money))} per month net "
                f"(GPUs saved minus {_usd(co.added_usd_month)} of memory, NICs and servers)"
                if isinstance(money, int | float)
                else f"money not projected ({_why_not(money) or 'no GPU price'})"
            )
            second = (
                f"Against the baseline it changes mean TTFT by {_signed_ms(_s(c.mean) - _s(b.mean))} "
                f"({_ms(b.mean)} to {_ms(c.mean)}) and p90 TTFT by "
                f"{_signed_ms(_s(c.p90) - _s(b.p90))}, {gpu_part}, and {money_part}."
            )
        else:
            bg = bo.gpus_at_peak_load
            total = _priced(bo.total_usd_month)
            alts = [
                (n, o)
                for n, o in opts.items()
                if n not in (Scenario.NONE, base) and _priced(o.total_usd_month) is not None
            ]
            alt = min(alts, key=lambda no: _s(_priced(no[1].total_usd_month))) if alts else None
            why = _why_not(bg, bo.total_usd_month)
            second = (
                f"The baseline serves the log at {_ms(b.mean)} mean and {_ms(b.p90)} p90 TTFT; "
                f"its GPUs and money are not projected: {why}"
                if why is not None
                else f"The baseline serves the busiest load on {_gpus(bg)} "
                f"for {_usd(total)} per month at {_ms(b.mean)} mean and {_ms(b.p90)} p90 "
                "TTFT"
            )
            if alt is not None and total is not None:
                n, o = alt
                t = scen[n].ttft_s
                second += (
                    f"; the cheapest alternative, {OPTION_LABEL.get(n, n)}, would change mean "
                    f"TTFT by {_signed_ms(_s(t.mean) - _s(b.mean))} and p90 by "
                    f"{_signed_ms(_s(t.p90) - _s(b.p90))} on {_gpus(o.gpus_at_peak_load)} "
                    f"and cost {_usd(_s(_priced(o.total_usd_month)) - total)} per month more"
                )
            second += "."
    third = (
        f"Confidence is {v.confidence}; the one thing that would most change it: {_one_thing(doc)}."
    )
    return [first, second, third]


def _priced(x: float | NotApplicable | None) -> float | None:
    """A monthly cost as a number, None when the option has none."""
    return None if x is None or isinstance(x, NotApplicable) else x


def _s(x: float | None) -> float:
    """A figure the sentence needs (a replayed TTFT, a priced option's total): present
    whenever the branch that reads it runs."""
    assert x is not None
    return x


def economics_table(doc: Report) -> tuple[list[str], list[list[str]]] | None:
    """Per option: GPUs at the mean and busiest load, monthly cost, net value, payback."""
    opts = _options(doc)
    if not opts:
        return None
    header = [
        "Option",
        "GPUs (mean load)",
        "GPUs (busiest load)",
        "GPUs saved",
        "GPU cost / month",
        "Added: DRAM, NVMe, NICs, servers / month",
        "Total / month",
        "Net value / month",
        "Payback of the pilot",
    ]
    rows = []
    for name in (
        Scenario.NONE,
        Scenario.LOCAL,
        Scenario.LOCAL_DRAM,
        Scenario.LOCAL_DRAM_NVME,
        Scenario.POOLED,
    ):
        o = opts.get(name)
        if o is None:
            continue
        bound = o.capacity_bound
        prefix = "at most " if bound == "at most" else ""
        gm = o.gpus_at_mean_load
        gp = o.gpus_at_peak_load
        pay = o.payback_months
        rows.append(
            [
                OPTION_LABEL.get(name, name),
                _count(gm, prefix),
                _count(gp, prefix),
                _count(o.gpus_saved, fmt="+d"),
                _usd(o.gpu_usd_month),
                f"{_usd(o.added_usd_month)} ({_or0(o.dram_gb):,.0f} GB DRAM, "
                f"{_or0(o.nvme_tb):,.1f} TB NVMe, {_or0(o.nic_nodes)} NICs)",
                _usd(o.total_usd_month),
                _usd(o.net_usd_month) if name != Scenario.LOCAL else "baseline",
                _count(pay)
                if pay is None or isinstance(pay, NotApplicable)
                else f"{pay:.1f} months ({_usd(o.pilot_usd)})",
            ]
        )
    return header, rows


def _or0(x: float | None) -> float:
    return 0 if x is None else x


def price_table(doc: Report) -> tuple[list[str], list[list[str]]] | None:
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


def side_by_side_table(doc: Report) -> tuple[list[str], list[list[str]]] | None:
    """The same log priced on the user's model and GPU and catalog alternatives."""
    rows_in = doc.side_by_side
    if not rows_in:
        return None
    header = [
        "Model on GPU",
        "Option",
        "Mean TTFT",
        "p90 TTFT",
        "GPUs (busiest load)",
        "Cost / month",
        "Verdict there",
    ]
    rows = []
    for k, r in enumerate(rows_in):
        choice = f"{r.model} on {r.tp} x {r.gpu}" + (" (yours)" if k == 0 else "")
        for j, (name, o) in enumerate((r.options or {}).items()):
            rows.append(
                [
                    choice if j == 0 else "",
                    OPTION_LABEL.get(name, name),
                    _ms(o.ttft_mean_s),
                    _ms(o.ttft_p90_s),
                    _count(o.gpus_at_peak_load),
                    _usd(o.total_usd_month),
                    (r.verdict or "") if j == 0 else "",
                ]
            )
    return header, rows


def glossary_rows() -> list[list[str]]:
    return [[term, text] for term, text in GLOSSARY.items()]
