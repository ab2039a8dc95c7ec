"""GPUs, money and payback per deployment option, from the replay's SLO rate search.

**Capacity.** The replay finds, per scenario, the highest multiple ``s`` of the log's
arrival rate at which ``N`` prefill instances keep p90 TTFT under the SLO. Prefill
capacity scales with the number of instances at a fixed hit rate, so the instances
needed to serve the log's load are ``ceil(N * k / s)`` for a load ``k`` times the log's
mean rate: ``k = 1`` at the mean, ``k = peak / mean`` at the busiest window (length
``--peak-window``, default 300 s), GPUs = instances x TP. This is an approximation
(fewer instances also means fewer private HBM caches to spread a prefix over; a pool's
hit rate does not depend on the count), stated in the report. A search whose top
multiple passed gives an upper bound on the instances needed; one where even the
lowest multiple failed cannot serve the load at any size the search tried.

**Decode is not modelled.** The saving is on prefill GPUs: a disaggregated prefill pool,
as in Mooncake (Qin et al., FAST'25) or vLLM's and SGLang's prefill/decode
disaggregation. In an aggregated deployment (prefill and decode on the same GPUs) the
same saving is a saving of prefill GPU time: multiply by the prefill share of GPU time
(``AGGREGATED_PREFILL_SHARE``; the report states which share it assumes).

**Money.** Per option, per month: the GPUs needed at the peak load x the GPU-hour price
x hours per month, plus what the option adds: host DRAM (GB x price per GB-month), NVMe
(TB-month), a pool NIC per node and the store's own servers. The net value of an option
is the baseline's GPU cost minus its own, minus what it adds. Its payback period is the
pilot's cost (the 72-hour stability gate run on the option's GPUs) over the net value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from analyzer.advisor.figures import ReplayFigures, ScenarioFigures
from analyzer.cost.prices import Prices
from analyzer.replay.config import Scenario

PEAK_WINDOW_S = 300.0
PILOT_HOURS = 72.0
# Prefill's share of GPU time in an aggregated deployment, for the stated approximation
# only (the decision uses the disaggregated figure). Splitwise (Patel et al., ISCA'24)
# and DistServe (Zhong et al., OSDI'24) measure prefill at roughly a third or less of the
# GPU time of chat workloads; long prompts (Mooncake's mean of 12k tokens) push it up.
AGGREGATED_PREFILL_SHARE = 0.3
# The search tried rate multiples down to 4**-5; below that the load cannot be served.
MIN_RATE_SCALE = 4.0**-5


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
class OptionResources:
    """What an option adds on top of its GPUs."""

    name: str
    dram_gb: float = 0.0
    nvme_tb: float = 0.0
    nic_nodes: int = 0
    store: bool = False


@dataclass(frozen=True, slots=True)
class EconomicsInputs:
    """Everything the money figures need besides the replay."""

    instances: int
    tp: int
    gpu: str
    load: LoadFigures
    prices: Prices
    resources: tuple[OptionResources, ...]
    load_factor: float = 1.0  # sensitivity: the log's load x this
    pilot_hours: float = PILOT_HOURS
    baseline: str = Scenario.LOCAL

    def resources_of(self, name: str) -> OptionResources:
        for r in self.resources:
            if r.name == name:
                return r
        return OptionResources(name)


@dataclass(frozen=True, slots=True)
class Capacity:
    """Instances and GPUs one scenario needs for the log's load within the SLO."""

    name: str
    rate_scale: float | None
    bound: str  # "exact", "at most" (the search's top multiple passed), "infeasible", "unknown"
    instances_mean: int | None
    instances_peak: int | None
    gpus_mean: int | None
    gpus_peak: int | None


def capacity(s: ScenarioFigures, inp: EconomicsInputs) -> Capacity:
    x = s.max_rate_scale
    if x is None:
        return Capacity(s.name, None, "unknown", None, None, None, None)
    if x < MIN_RATE_SCALE:
        return Capacity(s.name, x, "infeasible", None, None, None, None)
    k = inp.load_factor

    def need(load: float) -> int:
        # round away float noise before the ceiling (8 / 1.0 must stay 8)
        return max(1, math.ceil(round(inp.instances * load / x, 9)))

    mean = need(k)
    peak = need(k * inp.load.peak_factor)
    return Capacity(
        s.name,
        x,
        "at most" if s.max_rate_capped else "exact",
        mean,
        peak,
        mean * inp.tp,
        peak * inp.tp,
    )


@dataclass(frozen=True, slots=True)
class OptionCost:
    """One option's monthly cost, its net value against the baseline and its payback."""

    name: str
    capacity: Capacity
    gpu_usd_month: float | None  # GPUs at the peak load
    dram_gb: float
    dram_usd_month: float
    nvme_tb: float
    nvme_usd_month: float
    nic_nodes: int
    nic_usd_month: float
    store_usd_month: float
    gpus_saved: int | None  # against the baseline, at the peak load
    gpu_saving_usd_month: float | None
    pilot_usd: float | None
    baseline: str = Scenario.LOCAL

    @property
    def added_usd_month(self) -> float:
        return self.dram_usd_month + self.nvme_usd_month + self.nic_usd_month + self.store_usd_month

    @property
    def total_usd_month(self) -> float | None:
        if self.gpu_usd_month is None:
            return None
        return self.gpu_usd_month + self.added_usd_month

    @property
    def net_usd_month(self) -> float | None:
        """GPU money saved against the baseline, minus what the option adds."""
        if self.gpu_saving_usd_month is None:
            return None
        return self.gpu_saving_usd_month - self.added_usd_month

    @property
    def payback_months(self) -> float | None:
        net = self.net_usd_month
        if net is None or net <= 0 or self.pilot_usd is None or self.name == self.baseline:
            return None
        return self.pilot_usd / net

    def to_json(self) -> dict[str, Any]:
        c = self.capacity
        return {
            "scenario": self.name,
            "rate_scale_at_slo": c.rate_scale,
            "capacity_bound": c.bound,
            "instances_at_mean_load": c.instances_mean,
            "instances_at_peak_load": c.instances_peak,
            "gpus_at_mean_load": c.gpus_mean,
            "gpus_at_peak_load": c.gpus_peak,
            "gpus_saved": self.gpus_saved,
            "gpu_usd_month": self.gpu_usd_month,
            "gpu_saving_usd_month": self.gpu_saving_usd_month,
            "dram_gb": self.dram_gb,
            "dram_usd_month": self.dram_usd_month,
            "nvme_tb": self.nvme_tb,
            "nvme_usd_month": self.nvme_usd_month,
            "nic_nodes": self.nic_nodes,
            "nic_usd_month": self.nic_usd_month,
            "store_usd_month": self.store_usd_month,
            "added_usd_month": self.added_usd_month,
            "total_usd_month": self.total_usd_month,
            "net_usd_month": self.net_usd_month,
            "pilot_usd": self.pilot_usd,
            "payback_months": self.payback_months,
        }


def option_costs(replay: ReplayFigures, inp: EconomicsInputs) -> dict[str, OptionCost]:
    """Every replayed scenario priced (the baseline's own saving is 0)."""
    p = inp.prices
    gpu_month = p.gpu_month_usd()
    caps = {s.name: capacity(s, inp) for s in replay.scenarios}
    base = caps.get(inp.baseline)
    out: dict[str, OptionCost] = {}
    for s in replay.scenarios:
        c = caps[s.name]
        r = inp.resources_of(s.name)
        gpus = c.gpus_peak
        gpu_usd = None if gpus is None or gpu_month is None else gpus * gpu_month
        saved = None
        if gpus is not None and base is not None and base.gpus_peak is not None:
            saved = base.gpus_peak - gpus
        saving = None if saved is None or gpu_month is None else saved * gpu_month
        pilot = (
            None if gpus is None or p.gpu_hour is None else inp.pilot_hours * gpus * p.gpu_hour.usd
        )
        out[s.name] = OptionCost(
            name=s.name,
            capacity=c,
            gpu_usd_month=gpu_usd,
            dram_gb=r.dram_gb,
            dram_usd_month=r.dram_gb * p.dram_gb_month.usd,
            nvme_tb=r.nvme_tb,
            nvme_usd_month=r.nvme_tb * p.nvme_tb_month.usd,
            nic_nodes=r.nic_nodes,
            nic_usd_month=r.nic_nodes * p.nic_node_month.usd,
            store_usd_month=p.store_month.usd if r.store else 0.0,
            gpus_saved=saved,
            gpu_saving_usd_month=saving,
            pilot_usd=pilot,
            baseline=inp.baseline,
        )
    return out


def scaled(
    inp: EconomicsInputs, *, gpu_price: float = 1.0, dram_price: float = 1.0, load: float = 1.0
) -> EconomicsInputs:
    """The same inputs with a price or the load multiplied (the sensitivity table)."""
    return replace(
        inp,
        prices=inp.prices.scaled(gpu=gpu_price, dram=dram_price),
        load_factor=inp.load_factor * load,
    )


def economics_json(
    replay: ReplayFigures | None, inp: EconomicsInputs | None
) -> dict[str, Any] | None:
    """The report's ``economics`` section."""
    if inp is None:
        return None
    options = option_costs(replay, inp) if replay is not None else {}
    gpu_month = inp.prices.gpu_month_usd()
    return {
        "baseline": inp.baseline,
        "gpu": inp.gpu,
        "tp": inp.tp,
        "instances_replayed": inp.instances,
        "load": {
            "mean_rps": inp.load.mean_rps,
            "peak_rps": inp.load.peak_rps,
            "peak_window_s": inp.load.window_s,
            "peak_factor": inp.load.peak_factor,
        },
        "hours_per_month": inp.prices.hours_per_month,
        "gpu_usd_month": gpu_month,
        "prices": [p.to_json() for p in inp.prices.used()],
        "aggregated_prefill_share": AGGREGATED_PREFILL_SHARE,
        "pilot_hours": inp.pilot_hours,
        "options": {name: o.to_json() for name, o in options.items()},
    }
