"""Recompute versus load: the analytic prefill and load model, and the break-even.

Prefill of ``S`` new tokens after ``P`` cached ones (2 FLOPs per parameter per token, Kaplan
et al. 2020; causal attention as in Mooncake, FAST'25, Eq. 1-2)::

    FLOPs = 2 * N_active_nonembedding * S
          + 4 * d_attn * (L_full * (P*S + S^2/2) + L_window * integral_P^{P+S} min(x, W) dx)
          + 4 * state_elements * S * L_linear                      (linear-attention update)
    compute_s = max(FLOPs / (peak * mfu * tp), (weights read + KV read) per rank / HBM)
    prefill_s = compute_s + overhead_s

Loading ``n`` bytes over a link of ``B`` GB/s shared by ``K`` concurrent loads::

    load_s = first_byte_latency_s + n * K / (B * 1e9)

Bytes moved are whole-instance bytes over the instance's aggregate link (the per-rank
shards of all TP ranks together, so duplicated KV heads count once per rank); see
docs/cost-model.md. A fitted calibration (``analyzer.cost.calibrate``) replaces the
coefficients but keeps these physical forms.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import numpy as np

from analyzer.cost import step_formula
from analyzer.cost.breakdown import BreakEvenRow, TierBreakEven, TtftBreakdown
from analyzer.cost.catalog import get_gpu, get_model, get_tier, list_tiers
from analyzer.cost.coefficients import (
    DEFAULT_OVERHEAD_S,
    LoadLink,
    PrefillCoefficients,
    TtftCoefficients,
    fit_json,
)
from analyzer.cost.dtypes import dtype_bytes
from analyzer.cost.engine_constants import DEFAULT_ENGINE, EngineConstants
from analyzer.cost.hardware import GpuSpec, TierSpec, check_bandwidth
from analyzer.cost.instance import InstanceConstants, engine_coefficients
from analyzer.cost.model_spec import ModelSpec
from analyzer.errors import UsageError

DEFAULT_MFU_DENSE = 0.5  # the --mfu roofline; the engine model fits on models/measurements.toml
DEFAULT_MFU_MOE = 0.35  # lower for MoE: expert imbalance, grouped GEMMs, all-to-all
DEFAULT_TIERS = ("pcie-gen4-dram", "pcie-gen5-dram", "nvme-gen4", "rdma-200", "rdma-400", "tcp")
MAX_SEARCH_TOKENS = 1 << 21


def default_mfu(model: ModelSpec) -> float:
    return DEFAULT_MFU_MOE if model.is_moe else DEFAULT_MFU_DENSE


def window_context(new_tokens: float, cached_tokens: float, window: float | None) -> float:
    """``integral_P^{P+S} min(x, W) dx``: attention context summed over the new tokens.

    Without a window this is ``P*S + S^2/2``, the causal term of the FLOPs formula.
    """
    p, s = float(cached_tokens), float(new_tokens)
    b = p + s
    if window is None or b <= window:
        return p * s + s * s / 2.0
    if p >= window:
        return window * s
    return (window * window - p * p) / 2.0 + window * (b - window)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Prefill and load costs of one model on one instance of ``tp`` GPUs."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    kv_dtype: str = "bf16"
    mfu: float = DEFAULT_MFU_DENSE
    compute_dtype: str = "bf16"
    weight_dtype: str = "bf16"  # from_catalog defaults it to the checkpoint's dtype
    prefill: PrefillCoefficients = field(default_factory=PrefillCoefficients)
    link: LoadLink | None = None  # a fitted link from a profile, used where no bandwidth is given
    ttft_fit: TtftCoefficients | None = None
    profile_source: str = ""
    # the engine model (analyzer.cost.engine_constants); None: the roofline at ``mfu``
    engine: EngineConstants | None = DEFAULT_ENGINE
    expert_parallel: bool = False  # DP attention + expert parallelism: no TP all-reduce
    # the engine's fixed cost per load of a cached prefix, outside the link's first-byte
    # latency, the transfer and the scatter (connector bookkeeping); the CPU-hit rows of
    # models/measurements.toml leave no residual above their reading error, so 0 s
    # (docs/cost-model.md section 4). The replay adds it to every load.
    load_fixed_s: float = 0.0
    _k: InstanceConstants = field(init=False, repr=False, compare=False)
    _c: np.ndarray = field(init=False, repr=False, compare=False)  # step model, uncalibrated
    _steps: np.ndarray = field(init=False, repr=False, compare=False)  # calibrated

    def __post_init__(self) -> None:
        if self.tp > 1 and not self.expert_parallel and self.gpu.interconnect_gbps <= 0:
            raise UsageError(f"{self.gpu.name} has no interconnect figure for tp={self.tp}")
        object.__setattr__(self, "_k", InstanceConstants.of(self))
        object.__setattr__(self, "_c", self.engine_coefficients(self.engine))
        object.__setattr__(self, "_steps", self._calibrated_coefficients())

    @classmethod
    def from_catalog(
        cls,
        model: str | ModelSpec,
        gpu: str | GpuSpec,
        tp: int = 1,
        kv_dtype: str = "bf16",
        mfu: float | None = None,
        *,
        compute_dtype: str | None = None,
        weight_dtype: str | None = None,
        overhead_s: float | None = None,
        engine: EngineConstants | None = DEFAULT_ENGINE,
        expert_parallel: bool = False,
    ) -> CostModel:
        """The model from the catalogs.

        ``mfu=None`` prices prefill with the engine model (``engine``); a number gives the
        plain roofline at that utilisation instead. ``weight_dtype`` (the deployment's
        precision, default the checkpoint's) sets the bytes read and, unless
        ``compute_dtype`` is given, the tensor-core precision GEMMs run at.
        """
        m = model if isinstance(model, ModelSpec) else get_model(model)
        g = gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu)
        m.check_tp(tp)
        dtype_bytes(kv_dtype, allowed=("bf16", "fp16", "fp8"))
        weight_dtype = weight_dtype or m.weight_dtype
        dtype_bytes(weight_dtype)
        compute_dtype = compute_dtype or g.compute_dtype_for(weight_dtype)
        g.tflops(compute_dtype)  # validates, e.g. fp8 on A100
        if mfu is not None:
            engine = None
        else:
            mfu = default_mfu(m)
        if not 0 < mfu <= 1:
            raise UsageError(f"--mfu must be in (0, 1], got {mfu}")
        overhead = DEFAULT_OVERHEAD_S if overhead_s is None else overhead_s
        if overhead < 0:
            raise UsageError(f"overhead must be >= 0 s, got {overhead}")
        return cls(
            model=m,
            gpu=g,
            tp=tp,
            kv_dtype=kv_dtype.lower(),
            mfu=float(mfu),
            compute_dtype=compute_dtype.lower(),
            weight_dtype=weight_dtype.lower(),
            prefill=PrefillCoefficients(overhead_s=float(overhead)),
            engine=engine,
            expert_parallel=expert_parallel,
        )

    def with_prefill(self, coefficients: PrefillCoefficients) -> CostModel:
        return replace(self, prefill=coefficients)

    @property
    def model_ref(self) -> str:
        """What ``--model`` takes to rebuild this model: the catalog id, or the path of the
        user's ``config.json`` it was read from."""
        src = self.model.source
        if src and not src.startswith("http") and os.path.isfile(src):
            return src
        return self.model.id

    @property
    def prefill_model_label(self) -> str:
        """How prefill is priced, for headers: the engine model or the roofline's MFU."""
        if self.engine is None:
            return f"roofline at MFU {self.mfu:g}"
        return "engine model (models/measurements.toml)"

    # -- bytes ----------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        """KV bytes per token the cluster stores (whole model, full-attention layers)."""
        return self.model.kv_bytes_per_token(self.kv_dtype, self.tp)

    @property
    def bytes_per_token_per_rank(self) -> int:
        return self.model.kv_bytes_per_token_per_rank(self.kv_dtype, self.tp)

    @property
    def transfer_bytes_per_token(self) -> int:
        """Bytes per token the instance's ranks read together (duplicates included)."""
        return self.bytes_per_token_per_rank * self.tp

    def kv_bytes(self, tokens: int) -> int:
        """Stored bytes for a prefix of ``tokens`` tokens (window- and state-aware)."""
        return self.model.kv_bytes_for_tokens(tokens, self.kv_dtype, self.tp)

    def transfer_bytes(self, tokens: int) -> int:
        """Bytes moved to load a prefix of ``tokens`` tokens into all ``tp`` ranks."""
        return int(self._k.kv_per_rank(tokens)) * self.tp

    def hbm_kv_capacity_tokens(self, reserve_fraction: float = 0.1) -> int:
        """Tokens of KV one instance (``tp`` GPUs) holds after weights and a reserve.

        Per rank: ``(HBM * (1 - reserve) - weights / tp) / per-rank bytes per token``; the
        reserve stands for activations, CUDA graphs and fragmentation. 0 when the weights
        do not fit.
        """
        if not 0 <= reserve_fraction < 1:
            raise UsageError(f"reserve fraction must be in [0, 1), got {reserve_fraction}")
        free = self.gpu.hbm_bytes * (1 - reserve_fraction) - (
            self.model.weight_bytes(self.weight_dtype) / self.tp
        )
        per_token = self.bytes_per_token_per_rank or self.model.kv_window_bytes_per_token_per_rank(
            self.kv_dtype, self.tp
        )
        if free <= 0 or per_token <= 0:
            return 0
        return int(free // per_token)

    # -- prefill --------------------------------------------------------------------------
    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s of the whole instance."""
        return self.gpu.tflops(self.compute_dtype) * 1e12 * self.tp

    def prefill_flops(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """FLOPs to prefill ``new_tokens`` after ``cached_tokens`` (one request)."""
        s = float(new_tokens)
        if s <= 0:
            return 0.0
        k = self._k
        p = float(cached_tokens)
        ctx = k.full_layers * (p * s + s * s / 2.0)
        if k.sliding_layers:
            ctx += k.sliding_layers * window_context(s, p, k.window)
        return (k.dense_flops_per_token + k.linear_flops_per_token) * s + k.attn_coef * ctx

    def engine_coefficients(self, e: EngineConstants | None) -> np.ndarray:
        """The step model's coefficients (analyzer/cost/step_formula.py) of this instance under
        the engine model with constants ``e``, or the plain roofline at ``mfu`` (None);
        uncalibrated. ``kvpool cost check`` calls this with the constants it is fitting.
        """
        return engine_coefficients(self._k, e, self.compute_dtype)

    def step_coefficients(self) -> np.ndarray:
        """The step model's coefficients with this model's calibration applied (a copy).

        A prefill fit's compute scale multiplies the engine form and its polynomial
        ``K (c1 S + c2 P S + c3 S^2)`` becomes ``c1 t + c2 a + (c3 - c2/2) t^2`` (exact
        for one request; the last coefficient is kept non-negative so the step stays
        monotone); a pure polynomial fit leaves the engine form only the decode work. A
        TTFT calibration's compute scale multiplies everything.
        """
        return self._steps.copy()

    def _calibrated_coefficients(self) -> np.ndarray:
        c = self._c.copy()
        p = self.prefill
        scale = 1.0 if self.ttft_fit is None else self.ttft_fit.compute_scale
        if p.compute_scale > 0:
            c[step_formula.SCALE] = p.compute_scale * scale
        else:
            c[step_formula.SCALE] = scale
            c[step_formula.ENGINE_PREFILL] = 0.0
        c[step_formula.PER_TOKEN_S] = p.per_token_s * scale
        c[step_formula.PER_ATTN_S] = p.per_context_token_s * scale
        c[step_formula.PER_SQ_S] = max(p.per_token_sq_s - p.per_context_token_s / 2.0, 0.0) * scale
        return c

    @staticmethod
    def _chunk_s(
        c: np.ndarray, new_tokens: int, cached_tokens: int, batch: int, weight_tokens: int | None
    ) -> float:
        """One forward of ``batch`` chunks of ``new_tokens`` after ``cached_tokens``."""
        if new_tokens <= 0 or batch <= 0:
            return 0.0
        t = float(new_tokens) * batch
        if weight_tokens is not None and c[step_formula.EXPERT_MISS] < 1.0:
            # the experts that weight_tokens routed rows touch: miss^t' = miss^routed
            c = c.copy()
            c[step_formula.EXPERT_MISS] = c[step_formula.EXPERT_MISS] ** (max(weight_tokens, 1) / t)
        a = batch * step_formula.chunk_attn(float(new_tokens), float(cached_tokens))
        return float(step_formula.step_seconds(c, t, a, 0.0, 0.0))

    def analytic_compute_s(
        self,
        new_tokens: int,
        cached_tokens: int = 0,
        batch: int = 1,
        weight_tokens: int | None = None,
    ) -> float:
        """Prefill time of ``batch`` identical requests prefilled together in one forward.

        The engine model (analyzer.cost.engine_constants) when ``engine`` is set, else the roofline
        ``max(FLOPs / (peak * mfu), HBM floor)``; uncalibrated. Both are the step model
        (analyzer/cost/step_formula.py) of that one chunk. ``weight_tokens`` (default
        ``new_tokens * batch``) sets how many routed tokens decide which MoE experts are
        read.
        """
        return self._chunk_s(self._c, new_tokens, cached_tokens, batch, weight_tokens)

    def engine_compute_s(
        self,
        new_tokens: int,
        cached_tokens: int,
        batch: int,
        e: EngineConstants,
        weight_tokens: int | None = None,
    ) -> float:
        """One forward of ``batch`` requests under the engine model with constants ``e``.

        See analyzer/cost/engine_constants.py for the formula; ``kvpool cost check`` calls this with
        the constants it is fitting.
        """
        c = self._c if e is self.engine else self.engine_coefficients(e)
        return self._chunk_s(c, new_tokens, cached_tokens, batch, weight_tokens)

    def compute_time_s(
        self,
        new_tokens: int,
        cached_tokens: int = 0,
        batch: int = 1,
        weight_tokens: int | None = None,
    ) -> float:
        """Prefill time without the fixed overhead (analytic or calibrated): the step
        model's time of this one chunk (``batch`` alike), nothing else in the step."""
        return self._chunk_s(self._steps, new_tokens, cached_tokens, batch, weight_tokens)

    @property
    def overhead_s(self) -> float:
        """Fixed per-request time: the TTFT calibration's if any, else the prefill one."""
        if self.ttft_fit is not None:
            return self.ttft_fit.overhead_s
        return self.prefill.overhead_s

    def prefill_time_s(self, new_tokens: int, cached_tokens: int = 0, batch: int = 1) -> float:
        """Seconds to prefill ``new_tokens`` after ``cached_tokens``, overhead included."""
        if new_tokens < 0 or cached_tokens < 0:
            raise UsageError("token counts must be >= 0")
        return self.compute_time_s(new_tokens, cached_tokens, batch) + self.overhead_s

    def prefill_tokens_per_s(self, prefix_tokens: int) -> float:
        """The prefill throughput of a prefix, kvpool's one definition: its tokens over the
        forward time their recompute takes, ``P / recompute_saving_s(P)`` (the last
        prompt token runs either way, so its weight-read floor is not counted; no
        per-request overhead). The break-even bandwidth is bytes per token times this
        rate (less the scatter a hit pays); ``cost show``, the report and the dashboard
        print it."""
        t = self.recompute_saving_s(prefix_tokens)
        return prefix_tokens / t if t > 0 else math.inf

    def recompute_saving_s(self, prefix_tokens: int, suffix_tokens: int = 1) -> float:
        """Compute time a cached prefix saves: ``T(P+S | 0) - T(S | P)``.

        The marginal cost of the prefix's tokens: the suffix (at least the last prompt
        token, which vLLM always recomputes) runs either way, so the weight-read floor of
        a small prefill is not credited to the cache. Both sides read the same weights
        (the MoE experts that ``P + S`` routed tokens touch): in a serving batch those
        experts are read anyway, so skipping the prefix saves FLOPs, not weight reads.
        """
        suffix = max(suffix_tokens, 1)
        routed = prefix_tokens + suffix
        return max(
            self.compute_time_s(routed, 0, weight_tokens=routed)
            - self.compute_time_s(suffix, prefix_tokens, weight_tokens=routed),
            0.0,
        )

    # -- load -----------------------------------------------------------------------------
    def load_time_s(
        self, n_bytes: float, bandwidth_gbps: float, latency_s: float, concurrency: int = 1
    ) -> float:
        """``latency + n_bytes * K / (bandwidth * 1e9)``: K loads share one link fairly.

        All K loads start together and finish together at that time. ``n_bytes`` are the
        bytes moved (``transfer_bytes``), ``bandwidth_gbps`` the link's effective GB/s.
        """
        check_bandwidth(bandwidth_gbps, "load bandwidth")
        if latency_s < 0:
            raise UsageError(f"load latency must be >= 0 s, got {latency_s}")
        if concurrency < 1:
            raise UsageError(f"concurrency must be at least 1, got {concurrency}")
        if n_bytes <= 0:
            return 0.0
        return latency_s + n_bytes * concurrency / (bandwidth_gbps * 1e9)

    def _seen(self, tier: str | TierSpec, as_seen: bool) -> TierSpec:
        return tier if as_seen and isinstance(tier, TierSpec) else self.tier_link(tier)

    def tier_link(self, tier: str | TierSpec) -> TierSpec:
        """The tier as this instance sees it (aggregate bandwidth of its ``tp`` GPUs).

        ``hbm`` is the GPU's own HBM on every rank; host DRAM tiers are one PCIe link
        per GPU, so they scale with ``tp``; storage and network tiers are one link per
        instance (node). ``fitted`` is the profile's measured link.
        """
        if isinstance(tier, str) and tier.strip().lower() == "fitted":
            if self.link is None:
                raise UsageError("no fitted link: pass --profile with a load fit")
            return TierSpec("fitted", self.link.bandwidth_gbps, self.link.latency_s, "fitted")
        t = tier if isinstance(tier, TierSpec) else get_tier(tier)
        if t.kind == "gpu":
            return replace(t, bandwidth_gbps=self.gpu.hbm_tbps * 1000.0 * self.tp)
        if t.kind == "host-dram":
            return replace(t, bandwidth_gbps=t.bandwidth_gbps * self.tp)
        return t

    def scatter_s(self, cached_tokens: int) -> float:
        """Seconds to scatter one loaded prefix of ``cached_tokens`` into the paged KV cache:
        an HBM write of each rank's bytes at the engine model's achieved HBM bandwidth
        (the ranks write in parallel). Zero for the plain roofline (``--mfu``). The replay
        adds it to every load it completes, after the transfer."""
        if self.engine is None or cached_tokens <= 0:
            return 0.0
        k = self._k
        return k.kv_per_rank(cached_tokens) / (k.hbm_bytes_per_s * self.engine.hbm_eff)

    def hit_overhead_s(self, cached_tokens: int, concurrency: int = 1) -> float:
        """What ``concurrency`` cached-prefix hits pay besides the transfer itself: each
        one's :meth:`scatter_s` and the engine's fixed cost per load, ``load_fixed_s``.

        The block lookup is in the tier's first-byte latency; the last token's attention
        over the loaded context is in ``compute_time_s(1 | P)``. Zero for the plain
        roofline (``--mfu``).
        """
        if self.engine is None or cached_tokens <= 0:
            return 0.0
        return concurrency * (self.scatter_s(cached_tokens) + self.load_fixed_s)

    def load_prefix_s(
        self, prefix_tokens: int, bandwidth_gbps: float, latency_s: float, concurrency: int = 1
    ) -> float:
        """Loading a prefix: the transfer plus the per-hit scatter (:meth:`hit_overhead_s`)."""
        return self.load_time_s(
            self.transfer_bytes(prefix_tokens), bandwidth_gbps, latency_s, concurrency
        ) + self.hit_overhead_s(prefix_tokens, concurrency)

    # -- break-even -----------------------------------------------------------------------
    def break_even_bandwidth_gbps(self, prefix_tokens: int, suffix_tokens: int = 1) -> float:
        """Bandwidth above which loading a prefix beats recomputing it (zero latency).

        ``BW* = bytes(P) / (saving(P) - scatter(P))``, i.e. bytes per token times the
        prefill rate of the prefix's marginal tokens (less the HBM scatter a hit pays). It
        falls as P grows (attention is quadratic).
        """
        if prefix_tokens <= 0:
            raise UsageError(f"prefix length must be positive, got {prefix_tokens}")
        saving = self.recompute_saving_s(prefix_tokens, suffix_tokens)
        scatter = self.hit_overhead_s(prefix_tokens)
        # Under the weights floor the recompute's only extra is writing the prefix's KV,
        # which a hit's scatter writes too: equal up to rounding, so no saving at all.
        if saving - scatter <= 1e-9 * saving:
            return math.inf
        saving -= scatter
        return self.transfer_bytes(prefix_tokens) / saving / 1e9

    def load_wins(
        self, prefix_tokens: int, bandwidth_gbps: float, latency_s: float, suffix_tokens: int = 1
    ) -> bool:
        load = self.load_prefix_s(prefix_tokens, bandwidth_gbps, latency_s)
        return load < self.recompute_saving_s(prefix_tokens, suffix_tokens)

    def break_even_prefix_tokens(
        self,
        bandwidth_gbps: float,
        latency_s: float,
        suffix_tokens: int = 1,
        max_tokens: int = MAX_SEARCH_TOKENS,
    ) -> int | None:
        """Shortest prefix whose loading beats recomputing it, or None up to ``max_tokens``.

        Scans a geometric grid (x1.25) and bisects the first crossing: the saving grows
        faster than linearly in P while the load grows linearly, so past the crossing
        loading keeps winning.
        """
        check_bandwidth(bandwidth_gbps, "tier bandwidth")
        prev = 0
        p = 1
        while p <= max_tokens:
            if self.load_wins(p, bandwidth_gbps, latency_s, suffix_tokens):
                lo, hi = prev, p  # loses at lo (or lo == 0), wins at hi
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self.load_wins(mid, bandwidth_gbps, latency_s, suffix_tokens):
                        hi = mid
                    else:
                        lo = mid
                return hi
            prev = p
            p = max(p + 1, int(p * 1.25))
        return None

    def overlap_bound_s(
        self, prefix_tokens: int, bandwidth_gbps: float, suffix_tokens: int = 1
    ) -> float:
        """Lower bound on a prefix's time when compute and load overlap ("Cake").

        Compute the front at the recompute rate while loading the back over the link:
        ``P / (r_compute + BW / bytes_per_token)``, with ``r_compute = P / saving(P)``
        (the prefix's marginal recompute rate, as in the break-even).
        """
        if prefix_tokens <= 0:
            return 0.0
        check_bandwidth(bandwidth_gbps, "bandwidth")
        t = self.recompute_saving_s(prefix_tokens, suffix_tokens)
        rate_compute = prefix_tokens / t if t > 0 else math.inf
        per_token = self.transfer_bytes(prefix_tokens) / prefix_tokens
        rate_load = bandwidth_gbps * 1e9 / per_token if per_token > 0 else math.inf
        return prefix_tokens / (rate_compute + rate_load)

    def break_even_table(
        self,
        prefix_tokens: list[int],
        tiers: list[str | TierSpec] | None = None,
        suffix_tokens: int = 1,
        concurrency: int = 1,
        *,
        as_seen: bool = False,
    ) -> list[BreakEvenRow]:
        """One row per (prefix length, tier): recompute vs load vs overlap, plot-ready.

        ``as_seen``: a ``TierSpec`` given is already the link as this instance sees it
        (:func:`~analyzer.replay.link_settings.resolve_link`), taken as it is; a name is
        always the catalog's tier, seen through :meth:`tier_link`."""
        rows: list[BreakEvenRow] = []
        links = [self._seen(t, as_seen) for t in (tiers or DEFAULT_TIERS)]
        for p in prefix_tokens:
            if p <= 0:
                raise UsageError(f"prefix lengths must be positive, got {p}")
            recompute = self.recompute_saving_s(p, suffix_tokens)
            moved = self.transfer_bytes(p)
            be = self.break_even_bandwidth_gbps(p, suffix_tokens)
            be_json = be if math.isfinite(be) else None  # None: loading never beats it
            for link in links:
                load = self.load_time_s(
                    moved, link.bandwidth_gbps, link.latency_s, concurrency
                ) + self.hit_overhead_s(p, concurrency)
                rows.append(
                    BreakEvenRow(
                        prefix_tokens=int(p),
                        tier=link.name,
                        bandwidth_gbps=link.bandwidth_gbps,
                        latency_s=link.latency_s,
                        concurrency=concurrency,
                        kv_bytes=self.kv_bytes(p),
                        transfer_bytes=moved,
                        recompute_s=recompute,
                        load_s=load,
                        overlap_bound_s=self.overlap_bound_s(
                            p, link.bandwidth_gbps / concurrency, suffix_tokens
                        ),
                        break_even_gbps=be_json,
                        load_wins=load < recompute,
                        speedup=recompute / load if load > 0 else None,
                    )
                )
        return rows

    def tier_break_even(
        self,
        tiers: list[str | TierSpec] | None = None,
        suffix_tokens: int = 1,
        *,
        as_seen: bool = False,
    ) -> list[TierBreakEven]:
        """Per tier: the shortest prefix above which loading pays (None: never).
        ``as_seen`` as in :meth:`break_even_table`."""
        out: list[TierBreakEven] = []
        for name in tiers or [t.name for t in list_tiers() if t.kind != "gpu"]:
            link = self._seen(name, as_seen)
            out.append(
                TierBreakEven(
                    tier=link.name,
                    kind=link.kind,
                    bandwidth_gbps=link.bandwidth_gbps,
                    latency_s=link.latency_s,
                    break_even_prefix_tokens=self.break_even_prefix_tokens(
                        link.bandwidth_gbps, link.latency_s, suffix_tokens
                    ),
                )
            )
        return out

    # -- time to first token --------------------------------------------------------------
    def ttft(
        self,
        prompt_tokens: int,
        cached_tokens: int,
        concurrency: int = 1,
        load_gbps: float | None = None,
        load_latency_s: float | None = None,
    ) -> TtftBreakdown:
        """Mean TTFT of ``K`` identical requests that arrive together.

        Each request's ``C`` cached tokens are read over one link of ``load_gbps`` shared
        by all K (so every load finishes at ``latency + K * bytes / B``); then the K
        remaining suffixes are prefilled as ONE batch (continuous batching schedules
        requests that arrive together into the same forward pass), which ends for all K
        at once. Load and compute are serial (the suffix attends to the loaded prefix);
        the overlap bound is reported alongside. The last prompt token is always computed.
        """
        if prompt_tokens <= 0:
            raise UsageError(f"--prompt-tokens must be positive, got {prompt_tokens}")
        if cached_tokens < 0:
            raise UsageError(f"--cached-tokens must be >= 0, got {cached_tokens}")
        if cached_tokens > prompt_tokens:
            raise UsageError(
                f"--cached-tokens ({cached_tokens}) exceed --prompt-tokens ({prompt_tokens})"
            )
        if concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, got {concurrency}")
        cached = min(cached_tokens, prompt_tokens - 1)
        new = prompt_tokens - cached
        link_used = load_gbps is None
        if load_gbps is None:
            if self.link is None:
                raise UsageError("--load-gbps is required (or a --profile with a load fit)")
            load_gbps = self.link.bandwidth_gbps
            if load_latency_s is None:
                load_latency_s = self.link.latency_s
        check_bandwidth(load_gbps, "--load-gbps")
        latency = 0.0 if load_latency_s is None else float(load_latency_s)
        if latency < 0:
            raise UsageError(f"--load-latency-ms must be >= 0, got {latency * 1e3}")
        moved = self.transfer_bytes(cached)
        # A TTFT calibration's compute scale and overhead are inside compute_time_s and
        # overhead_s (so replay and break-even use them too); its load scale and latency
        # refer to the link given here.
        fit = self.ttft_fit
        overhead = self.overhead_s
        load_scale = 1.0 if fit is None else fit.load_scale
        if fit is not None and "latency_s" in fit.fitted:
            latency = fit.latency_s
        load = 0.0
        if cached > 0:
            load = latency + load_scale * moved * concurrency / (load_gbps * 1e9)
            load += self.hit_overhead_s(cached, concurrency)
        compute = self.compute_time_s(new, cached, concurrency)
        recompute = self.compute_time_s(prompt_tokens, 0, concurrency) + overhead
        if cached > 0:
            overlap = overhead + self._overlap_ttft(prompt_tokens, cached, concurrency, load_gbps)
        else:
            overlap = recompute
        warnings = self.range_warnings(
            new_tokens=new,
            cached_tokens=cached,
            prompt_tokens=prompt_tokens,
            concurrency=concurrency,
            load_gbps=load_gbps,
            load_bytes=moved if link_used and cached > 0 else None,
            use_link=link_used,
        )
        return TtftBreakdown(
            ttft_s=load + compute + overhead,
            load_s=load,
            compute_s=compute,
            overhead_s=overhead,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            new_tokens=new,
            concurrency=concurrency,
            load_gbps=float(load_gbps),
            load_latency_s=latency,
            load_bytes_per_request=moved,
            recompute_ttft_s=recompute,
            overlap_bound_s=min(overlap, recompute),
            warnings=tuple(warnings),
        )

    def _overlap_ttft(self, prompt: int, cached: int, k: int, load_gbps: float) -> float:
        # Cached tokens may be loaded (back of the prefix) or recomputed (front); the
        # suffix is computed after both. Split the prefix where both finish together.
        suffix = self.compute_time_s(prompt - cached, cached, k)
        per_token = self.transfer_bytes(cached) / cached
        rate_load = load_gbps * 1e9 / (per_token * k)
        front = self.compute_time_s(cached, 0, k)
        rate_compute = cached / front if front > 0 else math.inf
        return suffix + cached / (rate_compute + rate_load)

    def range_warnings(self, use_link: bool = False, **values: float | None) -> list[str]:
        """Warnings for quantities outside the range a calibration was measured on.

        The fitted link's ranges count only when ``use_link`` (its bandwidth is in use).
        """
        out = []
        for coeffs in (self.prefill, self.ttft_fit, self.link if use_link else None):
            if coeffs is None or not coeffs.ranges:
                continue
            for name, lo, hi in coeffs.ranges:
                v = values.get(name)
                if v is None:
                    continue
                if v < lo or v > hi:
                    out.append(
                        f"{name}={v:g} is outside the calibrated range [{lo:g}, {hi:g}] "
                        f"of {os.path.basename(coeffs.source) or 'the calibration'}: "
                        "extrapolated"
                    )
        return out

    def describe(self) -> dict[str, object]:
        """Identity and coefficients, for JSON output."""
        c = self.prefill
        out: dict[str, object] = {
            "model": self.model.id,
            "gpu": self.gpu.id,
            "tp": self.tp,
            "kv_dtype": self.kv_dtype,
            "compute_dtype": self.compute_dtype,
            "weight_dtype": self.weight_dtype,
            "prefill_model": "roofline" if self.engine is None else "engine",
            "mfu": self.mfu if self.engine is None else None,
            "peak_tflops_instance": self.peak_flops / 1e12,
            "prefill": fit_json(c, provenance=False),
        }
        if self.engine is not None:
            out["engine"] = self.engine.to_json()
        if self.expert_parallel:
            out["expert_parallel"] = True
        if self.link is not None:
            out["load_link"] = {
                "bandwidth_gbps": self.link.bandwidth_gbps,
                "latency_s": self.link.latency_s,
                "fitted": list(self.link.fitted),
                "cv_mape": self.link.cv_mape,
            }
        if self.ttft_fit is not None:
            out["ttft_calibration"] = fit_json(self.ttft_fit, provenance=False)
        if self.profile_source:
            out["profile"] = self.profile_source
        return out
