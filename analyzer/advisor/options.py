"""The options of one ``kvpool analyze`` run (:class:`AnalyzeOptions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from analyzer import limits
from analyzer.advisor.economics import PEAK_WINDOW_S
from analyzer.advisor.figures import Thresholds
from analyzer.cost.prices import PriceOverrides
from analyzer.errors import UsageError
from analyzer.ingest.options import IngestOptions
from analyzer.replay.config import ROUTERS, ClusterConfig
from analyzer.reuse.isolation import check_policy


@dataclass(frozen=True, slots=True)
class AnalyzeOptions:
    """One ``kvpool analyze`` run: how the logs are read (:class:`IngestOptions`), the
    cluster they are replayed on (:class:`ClusterConfig`, whose ``warmup_fraction`` also
    sets the reuse analysis's warm-up), and what the advisor adds on top.

    The defaults are the library's own (``IngestOptions()``, ``ClusterConfig()``), which
    the CLI flags and the dashboard's controls also start from.
    """

    ingest: IngestOptions = field(default_factory=IngestOptions)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    ttft_slo_s: float = 2.0
    only_model: str | None = None  # analyze one of the log's models alone
    # Today's deployment, replayed beside the hits the log measured (None: as `cluster`).
    current_instances: int | None = None
    current_router: str | None = None
    current_local_capacity_tokens: int | None = None
    profile: str | None = None  # a `kvpool cost profile` / `kvpool cost fit` JSON
    size_search: bool = True  # size every option by replaying (False: nothing is sized)
    full_replay: bool = False  # replay every request, also above the miniature's size
    sensitivity_replays: bool = True
    knee_fraction: float = 0.9
    thresholds: Thresholds = field(default_factory=Thresholds)
    peak_window_s: float = PEAK_WINDOW_S
    prices: PriceOverrides = field(default_factory=PriceOverrides)
    # --model / --tp given: plan that model (a log of one model, or with --only-model) at
    # that TP; otherwise each model the log names, at the smallest TP that holds it.
    model_given: bool = False
    tp_given: bool = False
    max_gpus: int | None = None  # the most GPUs a plan may use (None: size.max_gpus)
    # Who may share KV blocks (analyzer/reuse/isolation.py): every figure is measured
    # under it, and the report's isolation section compares it with the others.
    isolation: str = "shared"

    def __post_init__(self) -> None:

        check_policy(self.isolation)
        if not (self.peak_window_s > 0 and math.isfinite(self.peak_window_s)):
            raise UsageError(
                f"--peak-window must be a positive number of seconds, got {self.peak_window_s}"
            )
        if not (self.ttft_slo_s > 0 and math.isfinite(self.ttft_slo_s)):
            raise UsageError(f"--ttft-slo must be a positive number, got {self.ttft_slo_s}")
        if not 0.0 < self.knee_fraction <= 1.0:
            raise UsageError("knee fraction must be in (0, 1]")

        # The cluster's and the ingest's numbers are checked by their own options.
        limits.check(self.ttft_slo_s, "ttft_slo_s", "--ttft-slo")

        if self.current_instances is not None:
            limits.check(self.current_instances, "instances", "--current-instances")
        if self.current_router is not None and self.current_router not in ROUTERS:
            raise UsageError(
                f"unknown --current-router {self.current_router!r}; choose one of {ROUTERS}"
            )
        if self.max_gpus is not None:
            limits.check(self.max_gpus, "instances", "--max-gpus")

    # Read-only views of the composed options, under the names the advisor uses.
    @property
    def model(self) -> str:
        return self.cluster.model

    @property
    def gpu(self) -> str:
        return self.cluster.gpu

    @property
    def tp(self) -> int:
        return self.cluster.tp

    @property
    def instances(self) -> int:
        return self.cluster.instances

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node

    @property
    def dram_scope(self) -> str:
        return self.cluster.dram_scope

    @property
    def tokenizer(self) -> str:
        return self.ingest.tokenizer

    @property
    def kv_dtype(self) -> str:
        return self.cluster.kv_dtype

    @property
    def mfu(self) -> float | None:
        return self.cluster.mfu

    @property
    def weights_dtype(self) -> str | None:
        return self.cluster.weights_dtype

    @property
    def router(self) -> str:
        return self.cluster.router

    @property
    def pool_gbps(self) -> float | None:
        return self.cluster.pool_gbps

    @property
    def pool_tier(self) -> str:
        return self.cluster.pool_tier

    @property
    def dram_tier(self) -> str:
        return self.cluster.dram_tier

    @property
    def local_capacity_tokens(self) -> int | None:
        return self.cluster.local_capacity_tokens

    @property
    def dram_capacity_tokens(self) -> int | None:
        return self.cluster.dram_capacity_tokens

    @property
    def pool_capacity_tokens(self) -> int | None:
        return self.cluster.pool_capacity_tokens

    @property
    def warmup(self) -> float:
        return self.cluster.warmup_fraction

    @property
    def block_size(self) -> int | None:
        return self.ingest.block_size
