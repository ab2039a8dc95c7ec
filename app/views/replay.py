"""Replay: the trace through the what-if cluster, once per deployment option, compared."""

from __future__ import annotations

import streamlit as st

from analyzer.advisor.words import count
from analyzer.replay.config import Scenario
from analyzer.replay.link_settings import resolve_link
from analyzer.report import figures
from app import changes, charts, controls, replays, state

st.title("Replay")

with state.guard():
    cur = state.loaded_trace()
    state.require_content(cur.trace, "cache hits in a replay")
    w = controls.concrete(cur)
    from analyzer.replay import DEFAULT_SCENARIOS, STANDARD_SCENARIOS

    names = list(STANDARD_SCENARIOS)
    a, b = st.columns([3, 1])
    chosen = a.multiselect(
        "Options",
        names,
        default=list(DEFAULT_SCENARIOS),  # `kvpool replay`'s; the NVMe tier is one pick away
        key="replay.scenarios",
        format_func=figures.scenario_label,
        help="; ".join(
            f"{figures.scenario_label(n)}: {figures.option_description(n)}" for n in names
        ),
    )
    search = b.checkbox(
        "Find the highest rate under the SLO",
        value=True,
        key="replay.search",
        help="Replays again at compressed time scales until p90 TTFT crosses the SLO.",
    )
    if not chosen:
        st.info("Pick at least one option.")
        st.stop()
    order = [n for n in names if n in chosen]
    calibration = state.calibration()
    res = replays.replay(cur, w, tuple(order), search_rate=search, calibration=calibration)
    scen = res.scenarios
    cluster = res.cluster

    def link(pool: bool) -> str:
        found = [s.resolved.pool_gbps if pool else s.resolved.dram_gbps for s in scen.values()]
        settings = cluster.pool_link if pool else cluster.dram_link
        gbps = next((g for g in found if g), None) or resolve_link(settings).bandwidth_gbps
        return f"{gbps:g} GB/s"

    st.caption(
        f"{count(w.instances, 'instance')} of {w.tp}x {w.gpu} ({count(cluster.nodes, 'node')} of "
        f"{count(cluster.gpus_per_node, 'GPU')}), {w.model}, router {w.router}, eviction "
        f"{w.eviction}, p90 TTFT SLO {figures.seconds(w.ttft_slo_s)}; pool link {link(True)} per "
        f"node ({cluster.pool_tier}), host DRAM link {link(False)} "
        f"({cluster.dram_tier}, {cluster.dram_scope} scope); warm-up "
        f"{cluster.warmup_fraction:.0%} of requests not counted; "
        f"{res.n_requests:,} requests. The same settings as the Recommendation "
        "and `kvpool analyze`. "
        + (
            "Prefill and decode in one continuous batch per instance (aggregated serving)."
            if cluster.serving == "aggregated"
            else "Decode is not modelled (prefill pool)."
        )
        + (
            f" Prefill and TTFT from the model fitted to {calibration[0]} (Cost model page)."
            if calibration
            else " Prefill times from the catalog cost model."
        )
    )

    cols = st.columns(len(order))
    base = scen.get(Scenario.LOCAL) or scen[order[0]]
    for col, name in zip(cols, order, strict=True):
        p90 = scen[name].ttft.p90_s
        delta = None
        if (
            name != Scenario.LOCAL
            and Scenario.LOCAL in scen
            and p90 is not None
            and base.ttft.p90_s
        ):
            delta = f"{p90 / base.ttft.p90_s - 1:+.0%} vs {figures.scenario_label(Scenario.LOCAL)}"
        col.metric(
            f"{figures.scenario_label(name)}: p90 TTFT",
            figures.seconds(p90) if p90 is not None else "n/a",
            delta=delta,
            delta_color="inverse",
        )
        col.caption(
            f"prompt tokens from cache: **{figures.percent(scen[name].hit_rate, 2)}**",
            help=f"scenario `{name}` in `kvpool replay --json`",
        )

    ttft = {name: scen[name].stats.ttft_s for name in order}
    left, right = st.columns(2)
    left.altair_chart(
        charts.ttft_chart(figures.ttft_quantiles_frame(ttft), w.ttft_slo_s), width="stretch"
    )
    right.altair_chart(
        charts.tier_hits_chart(figures.tier_hits_frame(scen), order), width="stretch"
    )
    table = figures.scenarios_frame(scen)
    left, right = st.columns(2)
    left.altair_chart(
        charts.scenario_bar_chart(
            table,
            "network_gb",
            "Network traffic to and from the pool",
            "GB (reads and writes)",
            ",.2f",
            order,
        ),
        width="stretch",
    )
    if search:
        right.altair_chart(
            charts.scenario_bar_chart(
                table,
                "max_rate_scale",
                f"Capacity: highest rate with p90 TTFT under {figures.seconds(w.ttft_slo_s)}",
                "x the trace's arrival rate",
                ".3g",
                order,
            ),
            width="stretch",
        )
    else:
        right.info("Tick *Find the highest rate under the SLO* to compare capacity.")
    moved = {}
    for n in order:
        s, label = scen[n], figures.scenario_label(n)
        moved[f"{label}, p90 TTFT"] = figures.seconds(s.ttft.p90_s)
        moved[f"{label}, prompt tokens from cache"] = figures.percent(s.hit_rate)
        if search:
            moved[f"{label}, highest rate"] = figures.rate_multiple(
                s.max_rate_scale_at_slo, s.search is not None and s.search.capped
            )
    changes.show("replay", changes.setting_words(w), moved)
    # A static table, as the report prints it: every column and cell whole (a scrolling
    # grid clipped the wide ones).
    shown = figures.scenarios_table(table)
    if not search:  # nothing was searched: no column of dashes
        shown = shown.drop(columns=["highest rate under the SLO"])
    # A lone "-" in a static table's cell reads as a Markdown list item: an en dash.
    st.table(shown.replace({"-": "–"}), hide_index=True)
    # What each option deploys, in the report's words: under the table, whole, where a
    # table cell would clip it.
    st.markdown(
        "\n".join(
            f"- **{figures.scenario_label(n)}**: {figures.option_description(n)}" for n in order
        )
    )
