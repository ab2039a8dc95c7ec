"""The load a deployment serves, and each option's money against the baseline's.

**Load.** The log's mean request rate and its busiest ``--peak-window`` (default 300 s):
every plan is sized and replayed at the busiest window's rate (the whole log with its
gaps shortened by the mean over that rate, :class:`analyzer.advisor.plan.PlanLoad`).

**Money.** Each plan prices its own GPUs, nodes, DRAM, NVMe, NICs and store servers
(:func:`analyzer.advisor.plan.price`). Against the baseline's plan an option saves GPUs
(the baseline's GPUs minus its own) and money; its net value is the baseline's monthly
cost minus its own, and its payback period the pilot's cost (the 72-hour stability gate
run on the option's GPUs) over the net value.

**What the GPUs are.** Under the replay's default aggregated serving they are whole
serving GPUs (prefill and decode in one continuous batch per instance), so a GPU saved is
saved outright. With ``--serving disaggregated`` decode is not replayed: they are the
prefill pool's GPUs, as in Mooncake (Qin et al., FAST'25) or vLLM's and SGLang's
prefill/decode disaggregation, and the report states the prefill share of GPU time
(``AGGREGATED_PREFILL_SHARE``) by which an aggregated deployment would scale the saving.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.advisor.plan import Fleet
from analyzer.cost.prices import Prices
from analyzer.replay.config import Scenario

PEAK_WINDOW_S = 300.0
PILOT_HOURS = 72.0
# Prefill's share of GPU time in an aggregated deployment, for the stated approximation
# only (the decision uses the disaggregated figure). Splitwise (Patel et al., ISCA'24)
# and DistServe (Zhong et al., OSDI'24) measure prefill at roughly a third or less of the
# GPU time of chat workloads; long prompts (Mooncake's mean of 12k tokens) push it up.
AGGREGATED_PREFILL_SHARE = 0.3


@dataclass(frozen=True, slots=True)
class LoadFigures:
    """The log's load: mean request rate and the busiest window's."""

    mean_rps: float
    peak_rps: float
    window_s: float

    @property
    def peak_factor(self) -> float:
        return self.peak_rps / self.mean_rps if self.mean_rps > 0 else 1.0


def load_figures(arrival_s: np.ndarray, window_s: float = PEAK_WINDOW_S) -> LoadFigures:
    """Mean rate over the log, and the highest rate of any ``window_s`` window of it
    (sliding over arrivals; the whole log when it is shorter than the window)."""
    t = np.sort(np.asarray(arrival_s, dtype=np.float64))
    n = int(t.size)
    if n < 2 or not t[-1] > t[0]:
        return LoadFigures(0.0, 0.0, window_s)
    span = float(t[-1] - t[0])
    mean = n / span
    if span <= window_s:
        return LoadFigures(mean, mean, window_s)
    # requests in [t_i, t_i + window) for every start i
    ends = np.searchsorted(t, t + window_s, side="left")
    most = int((ends - np.arange(n)).max())
    return LoadFigures(mean, max(mean, most / window_s), window_s)


@dataclass(frozen=True, slots=True)
class OptionValue:
    """One option's money against the baseline's plan (None: not priced, or the
    baseline has no size)."""

    option: str
    gpus_saved: int | None
    gpu_saving_usd_month: float | None
    net_usd_month: float | None
    pilot_usd: float | None

    @property
    def payback_months(self) -> float | None:
        net = self.net_usd_month
        if net is None or net <= 0 or self.pilot_usd is None or self.option == Scenario.LOCAL:
            return None
        return self.pilot_usd / net

    def to_json(self) -> dict[str, object]:
        return {
            "gpus_saved": self.gpus_saved,
            "gpu_saving_usd_month": self.gpu_saving_usd_month,
            "net_usd_month": self.net_usd_month,
            "pilot_usd": self.pilot_usd,
            "payback_months": self.payback_months,
        }


def value(
    f: Fleet, base: Fleet | None, prices: Prices, pilot_hours: float = PILOT_HOURS
) -> OptionValue:
    """``f``'s GPUs and money saved against ``base``, and the pilot's cost on its GPUs."""
    gpus = f.gpus
    saved = None if gpus is None or base is None or base.gpus is None else base.gpus - gpus
    month = prices.gpu_month_usd(f.plans[0].gpu) if f.plans else None
    saving = None if saved is None or month is None else saved * month
    b_total = None if base is None else base.money.total_usd_month
    total = f.money.total_usd_month
    net = None if b_total is None or total is None else b_total - total
    hour = prices.gpu_hour_for(f.plans[0].gpu) if f.plans else None
    pilot = None if gpus is None or hour is None else pilot_hours * gpus * hour.usd
    return OptionValue(f.option, saved, saving, net, pilot)


def values(fleets: Sequence[Fleet], prices: Prices) -> dict[str, OptionValue]:
    """Every option against the baseline (the baseline's own saving is 0)."""
    base = next((f for f in fleets if f.option == Scenario.LOCAL), None)
    return {f.option: value(f, base, prices) for f in fleets}


def economics_json(load: LoadFigures, prices: Prices, gpu: str, tp: int) -> dict[str, Any]:
    """The report's ``economics`` section: the load, the prices and the constants (each
    option's money is its fleet's, ``fleet[option]``)."""
    return {
        "baseline": Scenario.LOCAL,
        "gpu": gpu,
        "tp": tp,
        "load": {
            "mean_rps": load.mean_rps,
            "peak_rps": load.peak_rps,
            "peak_window_s": load.window_s,
            "peak_factor": load.peak_factor,
        },
        "hours_per_month": prices.hours_per_month,
        "gpu_usd_month": prices.gpu_month_usd(),
        "prices": [p.to_json() for p in prices.used()],
        "aggregated_prefill_share": AGGREGATED_PREFILL_SHARE,
        "pilot_hours": PILOT_HOURS,
    }
