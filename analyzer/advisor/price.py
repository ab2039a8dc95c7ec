"""The price stage: each model of the log on the chosen GPU, and what it costs.

For each model the plan covers (:func:`analyzer.advisor.models.choose_models`), the cost
model at the smallest tensor parallelism that holds its weights and a working KV
budget (unless ``--tp`` is given): room for the model's longest request twice over
(one running while another's prefix stays cached; vLLM refuses to start when one
request of its longest context does not fit) and for a batch of
``WORKING_BATCH`` requests of its mean length. So a 480B MoE is never planned on one
80 GB GPU. Then the tiers each option adds, sized from the model's own reuse
(:func:`option_specs`), the break-even bandwidth at the log's reusable prefix against
each tier, and the prices (the GPU's by any name the catalog knows it by).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from analyzer.advisor.figures import BandwidthFigures, BreakEvenPoint, CostFigures, TierFigure
from analyzer.advisor.models import ModelChoice, choose_models, served_models
from analyzer.cost import CostModel
from analyzer.cost.calibrate import load_profile
from analyzer.cost.prices import Prices, resolve_prices
from analyzer.errors import UsageError
from analyzer.replay.config import (
    STANDARD_SCENARIOS,
    UNBOUNDED,
    ClusterConfig,
    Scenario,
    ScenarioSpec,
    Tier,
)
from analyzer.replay.link_settings import resolve_link
from analyzer.trace import BlockTrace

if TYPE_CHECKING:
    from analyzer.advisor.measure import Measured
    from analyzer.advisor.options import AnalyzeOptions
    from analyzer.cost import CostModel

# Tensor-parallel sizes tried, smallest first (16 and 32 span nodes of 8 GPUs).
TP_SIZES = (1, 2, 4, 8, 16, 32)
# The working KV budget holds a batch of this many requests of the model's mean length
# besides its longest request twice over (vLLM's own default batch is 256 sequences).
WORKING_BATCH = 32
# SGLang HiCache's host pool in front of a storage tier, as a multiple of the HBM KV
# pool (--hicache-ratio 2, SGLang's "HiCache Best Practices",
# https://docs.sglang.io/advanced_features/hicache_best_practices.html).
HOST_RATIO_WITH_STORAGE = 2.0
# The options every analysis plans, the baseline first.
OPTIONS = (Scenario.LOCAL, Scenario.LOCAL_DRAM, Scenario.LOCAL_DRAM_NVME, Scenario.POOLED)

DESCRIPTIONS = {
    Scenario.LOCAL: STANDARD_SCENARIOS[Scenario.LOCAL].description,
    Scenario.LOCAL_DRAM: STANDARD_SCENARIOS[Scenario.LOCAL_DRAM].description,
    Scenario.LOCAL_DRAM_NVME: STANDARD_SCENARIOS[Scenario.LOCAL_DRAM_NVME].description,
    Scenario.POOLED: STANDARD_SCENARIOS[Scenario.POOLED].description,
}


@dataclass(frozen=True, slots=True)
class ModelSetup:
    """One model of the plan on the chosen GPU: its cost model, tensor parallelism and
    why, the cluster it is replayed on (``instances``: where its size search starts),
    its requests, and each option's tiers sized for it."""

    choice: ModelChoice
    cost: CostModel
    tp: int
    tp_reason: str
    cluster: ClusterConfig
    knee_tokens: int
    specs: tuple[ScenarioSpec, ...]
    trace: BlockTrace = field(compare=False, repr=False)

    @property
    def model(self) -> str:
        return self.choice.model

    @property
    def part(self) -> str | None:
        """The log's name for this model when the log names several (its requests
        alone are replayed), else None (the whole log)."""
        return self.choice.served_as or None

    def spec(self, option: str) -> ScenarioSpec:
        return next(s for s in self.specs if s.name == option)


@dataclass(frozen=True, slots=True)
class Priced:
    """The models on their GPUs, the primary model's cost figures and break-even
    bandwidth against each tier, and the prices."""

    setups: tuple[ModelSetup, ...]
    prices: Prices
    bandwidth: BandwidthFigures | None
    break_even_curve: tuple[BreakEvenPoint, ...]
    cost: CostFigures

    @property
    def primary(self) -> ModelSetup:
        """The model with the most prompt tokens (the log's only one, usually)."""
        return self.setups[0]


def cost_model(
    model: str, gpu: str, tp: int, kv_dtype: str, mfu: float | None, weights: str | None
) -> CostModel:

    return CostModel.from_catalog(
        model, gpu, tp=tp, kv_dtype=kv_dtype, mfu=mfu, weight_dtype=weights
    )


def working_kv_tokens(trace: BlockTrace) -> int:
    """The KV budget an instance needs beyond its weights (module docstring)."""
    if trace.n_requests == 0:
        return 0
    out = np.where(trace.output_tokens > 0, trace.output_tokens, 0)
    length = trace.prompt_tokens + out
    return int(max(2 * int(length.max()), WORKING_BATCH * float(length.mean())))


def fit_tp(
    model: str,
    gpu: str,
    kv_dtype: str,
    weights: str | None,
    need_tokens: int,
    mfu: float | None = None,
) -> tuple[CostModel, int] | None:
    """The smallest tensor parallelism (of ``TP_SIZES``, dividing the model's heads)
    whose KV room after the weights holds ``need_tokens``; None when none does."""
    for tp in TP_SIZES:
        try:
            cm = cost_model(model, gpu, tp, kv_dtype, mfu, weights)
        except UsageError:
            continue
        if cm.hbm_kv_capacity_tokens() >= max(1, need_tokens):
            return cm, tp
    return None


def option_specs(
    cfg: ClusterConfig, cost: CostModel, knee_tokens: int, block_size: int
) -> tuple[ScenarioSpec, ...]:
    """Each option's tiers, sized as the plan deploys them (unless a capacity flag sets
    one): host DRAM per node at the knee of the model's hit-ratio curve, capped at the
    node's DRAM for KV (``--dram-capacity-tokens``, default 512 GB); with NVMe, host DRAM
    as SGLang HiCache keeps it in front of storage (twice the HBM KV pool per instance)
    and NVMe at the knee, capped at the node's NVMe; the pool at the knee. At least one
    block each, so every tier is a tier."""
    bpt = int(cost.bytes_per_token)
    knee = max(int(knee_tokens), block_size)
    node_dram = (
        cfg.dram_capacity_tokens
        if cfg.dram_capacity_tokens is not None
        else int(cfg.dram_capacity_gb * 1e9 // bpt)
    )
    node_nvme = (
        cfg.nvme_capacity_tokens
        if cfg.nvme_capacity_tokens is not None
        else int(cfg.nvme_capacity_gb * 1e9 // bpt)
    )
    dram = (
        cfg.dram_capacity_tokens if cfg.dram_capacity_tokens is not None else min(knee, node_dram)
    )
    hbm = (
        cfg.local_capacity_tokens
        if cfg.local_capacity_tokens is not None
        else int(cost.hbm_kv_capacity_tokens(cfg.hbm_reserve_fraction))
    )
    sharers = cfg.dram_sharers
    staging = int(HOST_RATIO_WITH_STORAGE * min(hbm, UNBOUNDED // 4)) * sharers
    nvme_dram = (
        cfg.dram_capacity_tokens
        if cfg.dram_capacity_tokens is not None
        else max(block_size * sharers, min(staging, dram))
    )
    nvme = (
        cfg.nvme_capacity_tokens if cfg.nvme_capacity_tokens is not None else min(knee, node_nvme)
    )
    pool = cfg.pool_capacity_tokens if cfg.pool_capacity_tokens is not None else knee
    return (
        replace(STANDARD_SCENARIOS[Scenario.LOCAL]),
        replace(STANDARD_SCENARIOS[Scenario.LOCAL_DRAM], dram_capacity_tokens=dram),
        ScenarioSpec(
            Scenario.LOCAL_DRAM_NVME,
            dram=True,
            nvme=True,
            description=DESCRIPTIONS[Scenario.LOCAL_DRAM_NVME],
            dram_capacity_tokens=nvme_dram,
            nvme_capacity_tokens=nvme,
        ),
        replace(STANDARD_SCENARIOS[Scenario.POOLED], pool_capacity_tokens=pool),
    )


def _knee(m: Measured, choice: ModelChoice) -> int:
    """The model's own knee (a multi-model log's per-model reuse), else the log's."""
    for f in m.models.per_model:
        if f.served.name == choice.served_as and f.reuse is not None:
            return f.reuse.knee_tokens
    return m.reuse.knee_tokens


def setup(m: Measured, choice: ModelChoice, opts: AnalyzeOptions, several: bool) -> ModelSetup:
    """One model on the chosen GPU (module docstring)."""
    c = opts.cluster
    trace = m.loaded.model_part(choice.served_as) if several else m.trace
    weights = choice.weights_dtype or c.weights_dtype
    if opts.tp_given:
        cm = cost_model(choice.model, c.gpu, c.tp, c.kv_dtype, c.mfu, weights)
        tp, why = c.tp, "--tp"
        if (
            cm.hbm_kv_capacity_tokens(c.hbm_reserve_fraction) <= 0
            and c.local_capacity_tokens is None
        ):
            raise UsageError(
                f"{choice.model} does not fit on {c.tp} x {c.gpu} with room for KV cache",
                hint="raise --tp, or leave it out to plan the smallest that fits",
            )
    else:
        need = working_kv_tokens(trace)
        fit = fit_tp(choice.model, c.gpu, c.kv_dtype, weights, need, c.mfu)
        if fit is None:
            raise UsageError(
                f"{choice.model} does not fit on up to {TP_SIZES[-1]} x {c.gpu} with KV room "
                f"for {need:,} tokens",
                hint="plan it on a larger GPU (--gpu), with lighter weights (--weights-dtype "
                "fp8), or give --tp and --local-capacity-tokens",
            )
        cm, tp = fit
        why = (
            f"the smallest that holds the weights and {need:,} tokens of KV (the longest "
            f"request twice, or {WORKING_BATCH} requests of the mean length)"
        )
    cfg = replace(c, model=choice.model, tp=tp, weights_dtype=weights, gpu=cm.gpu.id)
    knee = _knee(m, choice)
    return ModelSetup(
        choice=choice,
        cost=cm,
        tp=tp,
        tp_reason=why,
        cluster=cfg,
        knee_tokens=knee,
        specs=option_specs(cfg, cm, knee, trace.block_size),
        trace=trace,
    )


def bandwidth(cm: CostModel, cfg: ClusterConfig, prefix_tokens: int) -> BandwidthFigures:
    """Break-even bandwidth at ``prefix_tokens`` against each tier's (host DRAM over
    PCIe, local NVMe, the pool link), each link as the replay moves blocks over it
    (:func:`~analyzer.replay.link_settings.resolve_link`: the set figures, else the
    catalog's as one instance sees them)."""
    p = max(int(prefix_tokens), 1)
    be = cm.break_even_bandwidth_gbps(p)
    links = ((Tier.DRAM, cfg.dram_link), (Tier.NVME, cfg.nvme_link), (Tier.POOL, cfg.pool_link))
    tiers = []
    for role, link in links:
        spec = resolve_link(link, cm)
        tiers.append(TierFigure(role, spec.name, float(spec.bandwidth_gbps), float(spec.latency_s)))
    return BandwidthFigures(
        prefix_tokens=p,
        break_even_gbps=float(be),
        bytes_per_token=int(cm.transfer_bytes_per_token),
        prefill_tokens_per_s=float(cm.prefill_tokens_per_s(p)),
        tiers=tuple(tiers),
    )


def break_even_curve(
    cm: CostModel, bw: BandwidthFigures, prompt_max: int
) -> tuple[BreakEvenPoint, ...]:
    top = max(1024, min(int(prompt_max), 1 << 20))
    lengths = sorted({int(x) for x in np.geomspace(16, top, 24)} | {bw.prefix_tokens})
    return tuple(BreakEvenPoint(p, float(cm.break_even_bandwidth_gbps(p))) for p in lengths)


def cost_figures(cm: CostModel) -> CostFigures:
    return CostFigures(
        model=cm.model.name if hasattr(cm.model, "name") else str(cm.model),
        gpu=cm.gpu.name if hasattr(cm.gpu, "name") else str(cm.gpu),
        tp=cm.tp,
        kv_dtype=cm.kv_dtype,
        weight_dtype=cm.weight_dtype,
        prefill_model="roofline" if cm.engine is None else "engine",
        mfu=cm.mfu if cm.engine is None else None,
        bytes_per_token=int(cm.bytes_per_token),
        transfer_bytes_per_token=int(cm.transfer_bytes_per_token),
        hbm_kv_capacity_tokens=int(cm.hbm_kv_capacity_tokens()),
    )


def price(m: Measured, choices: tuple[ModelChoice, ...], opts: AnalyzeOptions) -> Priced:
    """Every model on the chosen GPU, the primary's break-even figures, the prices."""
    several = len(choices) > 1
    setups = tuple(setup(m, c, opts, several) for c in choices)
    if opts.profile is not None:
        cal = load_profile(
            opts.profile, kv_dtype=opts.kv_dtype, mfu=opts.mfu, weight_dtype=opts.weights_dtype
        )
        s = setups[0]
        cfg = replace(s.cluster, model=cal.model_ref, gpu=cal.gpu.id, tp=cal.tp)
        setups = (replace(s, cost=cal, tp=cal.tp, tp_reason="the profile's", cluster=cfg),)
    first = setups[0]
    cm = first.cost
    bw: BandwidthFigures | None = None
    curve: tuple[BreakEvenPoint, ...] = ()
    rf = m.reuse
    if rf.measurable and m.trace.n_requests:
        prefix = rf.median_prefix_tokens or max(
            m.trace.block_size, int(m.trace_figures.mean_prompt_tokens // 2)
        )
        bw = bandwidth(cm, first.cluster, prefix)
        curve = break_even_curve(cm, bw, prompt_max=int(m.trace.prompt_tokens.max()))
    return Priced(
        setups=setups,
        prices=resolve_prices(first.cluster.gpu, opts.prices),
        bandwidth=bw,
        break_even_curve=curve,
        cost=cost_figures(cm),
    )


# The network one GPU's price includes: an 8-GPU instance's 3,200 Gb/s over its 8 GPUs
# (AWS p5.48xlarge; models/prices.toml's [nic]), in GB/s.
NETWORK_PER_GPU_GBPS = 3200 / 8 / 8


def unpriced_nic(priced: Priced) -> str | None:
    """A warning when the pool's NICs are priced at $0 (the catalog's: the GPU price
    includes its share of its instance's network) but the pool link asked for is more
    than the share of a node's GPUs; None when the share carries it."""
    if priced.bandwidth is None or priced.prices.nic_node_month.usd > 0:
        return None
    per_node = priced.primary.cluster.gpus_per_node
    share = NETWORK_PER_GPU_GBPS * per_node
    link = next((t for t in priced.bandwidth.tiers if t.role == Tier.POOL), None)
    if link is None or link.bandwidth_gbps <= share:
        return None
    return (
        f"The pool link of {link.bandwidth_gbps:,.4g} GB/s per node is more than the "
        f"{share:,.4g} GB/s of network the GPU price includes for {per_node} GPU"
        f"{'' if per_node == 1 else 's'} (400 Gb/s per GPU of an 8-GPU instance), yet its "
        "NICs are priced at $0: give --nic-node-month-usd."
    )


def log_cluster(
    cfg: ClusterConfig, loaded: object, *, model_given: bool, tp_given: bool
) -> tuple[ClusterConfig, str | None]:
    """The cluster ``kvpool replay`` replays, by the rules ``kvpool analyze`` plans with:
    the log's own model unless ``--model`` names one (a log of several: its most
    requested, with a note saying so), at the smallest tensor parallelism that holds it
    unless ``--tp`` is given. Returns the cluster and the note (None: nothing to say)."""

    table = loaded.table  # type: ignore[attr-defined]
    trace: BlockTrace = loaded.trace  # type: ignore[attr-defined]
    named = served_models(table)
    note = None
    if not model_given and len(named) > 1:
        note = (
            f"The log names {len(named)} models; replayed as {named[0].name}, its most requested "
            "(kvpool analyze plans each as itself; --model with --only-model picks one)."
        )
    named = named[:1]  # one cluster: the most requested model, or --model for all
    choice = choose_models(named, model=cfg.model, model_given=model_given, only_model=None)[0]
    model, weights = choice.model, choice.weights_dtype or cfg.weights_dtype
    if tp_given:
        return replace(cfg, model=model, weights_dtype=weights), note
    fit = fit_tp(model, cfg.gpu, cfg.kv_dtype, weights, working_kv_tokens(trace), cfg.mfu)
    if fit is None:
        raise UsageError(
            f"{model} does not fit on up to {TP_SIZES[-1]} x {cfg.gpu} with room for KV",
            hint="give --gpu, --weights-dtype fp8, or --tp with --local-capacity-tokens",
        )
    return replace(cfg, model=model, tp=fit[1], weights_dtype=weights, gpu=fit[0].gpu.id), note
