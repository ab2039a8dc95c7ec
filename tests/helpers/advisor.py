"""Fleets and sizings shared by the advisor tests."""

from __future__ import annotations

from analyzer.advisor.plan import Capacities, DeploymentPlan, Fleet, Money, PlanLoad, PlanStatus
from analyzer.advisor.sizing import (
    ClusterFigures,
    size,
)
from analyzer.cost.prices import resolve_prices
from analyzer.replay.run import TtftSummary

PRICES = resolve_prices("h100")


MONTH = PRICES.hours_per_month * 3.99


def plan(
    option: str,
    gpus: int | None,
    ttft: float,
    *,
    dram_gb: float = 0.0,
    priced: bool = True,
    status: PlanStatus | None = None,
    above: int | None = None,
) -> DeploymentPlan:
    """One hand-made plan: ``gpus`` instances of 1 GPU, TTFT mean ``ttft`` (p90 x1.5,
    p99 x2), a DRAM bill of ``dram_gb`` at the catalog's rate."""
    st_ = status or (PlanStatus.MEETS if gpus is not None else PlanStatus.CANNOT_MEET)
    money = Money(
        gpu_usd_month=None if gpus is None or not priced else gpus * MONTH,
        dram_gb=dram_gb,
        dram_usd_month=dram_gb * PRICES.dram_gb_month.usd,
        nic_nodes=0,
        store_usd_month=PRICES.store_month.usd if option == "pooled" else 0.0,
    )
    return DeploymentPlan(
        option=option,
        model="llama-3.1-8b",
        served_as="",
        gpu="h100",
        tp=1,
        gpus_per_node=8,
        router="prefix-aware",
        status=st_,
        instances=gpus,
        capacities=Capacities(131072, 400_000),
        load=PlanLoad(2.0, 3.0, 300.0),
        ttft_slo_s=2.0,
        money=money,
        ttft=TtftSummary(ttft, ttft, 1.5 * ttft, 2 * ttft, 3 * ttft),
        instances_above_cap=above,
        cap_instances=64,
    )


def fleets(
    local: tuple[int | None, float] = (8, 1.0),
    dram: tuple[int | None, float] = (8, 0.9),
    pooled: tuple[int | None, float] = (6, 0.5),
    *,
    dram_gb: float = 500.0,
    pool_gb: float = 1000.0,
    priced: bool = True,
    nvme: tuple[int | None, float] | None = None,
) -> tuple[Fleet, ...]:
    out = [
        Fleet.of("local", (plan("local", local[0], local[1], priced=priced),)),
        Fleet.of(
            "local+dram", (plan("local+dram", dram[0], dram[1], dram_gb=dram_gb, priced=priced),)
        ),
    ]
    if nvme is not None:
        out.append(
            Fleet.of(
                "local+dram+nvme",
                (plan("local+dram+nvme", nvme[0], nvme[1], dram_gb=50.0, priced=priced),),
            )
        )
    out.append(
        Fleet.of("pooled", (plan("pooled", pooled[0], pooled[1], dram_gb=pool_gb, priced=priced),))
    )
    return tuple(out)


def deploy_sizing(pool: bool, *, instances=8, tp=1, gpus_per_node=4, knee=2_000_000, bpt=131072):
    return size(
        pool=pool,
        knee_tokens=knee,
        cluster=ClusterFigures(
            instances=instances,
            tp=tp,
            gpus_per_node=gpus_per_node,
            hbm_cache_tokens_per_instance=400_000,
            bytes_per_token=bpt,
        ),
        break_even_short_gbps=6.0,
        replay_pool_read_gbps_per_node=3.0,
        network_tiers=[("tcp", 2.0), ("rdma-200", 21.75)],
        granularity={16: 0.6, 64: 0.595, 256: 0.57},
        engine_block=16,
        same_session_share=0.3,
        sessions_known=True,
        policy_at_knee={},
    )
