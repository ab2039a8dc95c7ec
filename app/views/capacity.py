"""Capacity: the hit-ratio curve in tokens and GiB, policies compared, the knee marked."""

from __future__ import annotations

import streamlit as st

from analyzer.report import figures
from app import changes, charts, compute, controls, state

st.title("Capacity")

with state.guard():
    cur = state.loaded_trace()
    state.require_content(cur.trace, "the hit-ratio curve")
    w = controls.concrete(cur)
    rep = compute.reuse(cur, controls.current().warmup)
    if not rep.measurable:
        st.warning(f"Reuse cannot be measured: {rep.reason}")
        st.stop()
    cm = compute.cost_model(w.model, w.gpu, w.tp, w.kv_dtype)
    bytes_per_token = int(cm.bytes_per_token)

    a, b = st.columns([1, 2])
    unit = a.radio("Capacity in", ["tokens", "GiB"], horizontal=True, key="capacity.unit")
    fraction = b.slider(
        "Knee: smallest capacity reaching this share of the ceiling",
        min_value=0.5,
        max_value=0.99,
        value=0.9,
        step=0.01,
        key="capacity.fraction",
    )
    knee = rep.knee_tokens(fraction)
    hbm = int(cm.hbm_kv_capacity_tokens())
    to_unit = (lambda t: t * bytes_per_token / figures.GIB) if unit == "GiB" else float
    marks = [
        (f"knee {fraction:.0%}", to_unit(knee)),
        (f"HBM per instance ({w.model}, {w.tp}x {w.gpu})", to_unit(hbm)),
        (f"HBM x {w.instances} instances", to_unit(hbm * w.instances)),
    ]
    frame = figures.curves_frame(rep.curves(), bytes_per_token)
    st.altair_chart(
        charts.capacity_chart(frame, unit, w.eviction, marks, rep.ceiling_hit_rate),
        width="stretch",
    )

    c = st.columns(4)
    c[0].metric("Ceiling (steady)", f"{rep.ceiling_hit_rate:.1%}")
    c[1].metric(
        f"Knee ({fraction:.0%} of ceiling)",
        f"{knee:,} tok",
        help=f"{knee * bytes_per_token / figures.GIB:,.2f} GiB of KV for {w.model}",
    )
    c[2].metric(
        "Hit rate in one instance's HBM",
        f"{rep.hit_rate_at(hbm):.1%}",
        help="LRU, whole trace through one cache of this size (no routing losses).",
    )
    c[3].metric(
        "Whole working set",
        f"{rep.footprint_tokens:,} tok",
        help="The capacity at which LRU reaches the ceiling.",
    )
    changes.show(
        "capacity",
        changes.setting_words(w),
        {
            "knee": f"{knee:,} tokens ({knee * bytes_per_token / figures.GIB:,.2f} GiB)",
            "hit rate in one instance's HBM": f"{rep.hit_rate_at(hbm):.1%}",
            "one instance's HBM": f"{hbm:,} tokens",
            "KV per token": f"{bytes_per_token:,} B",
        },
    )
    st.caption(
        f"In GiB for {w.model} ({w.kv_dtype}): knee {knee * bytes_per_token / figures.GIB:,.2f} "
        f"GiB, whole working set {rep.footprint_tokens * bytes_per_token / figures.GIB:,.2f} "
        f"GiB, one instance's HBM {hbm * bytes_per_token / figures.GIB:,.1f} GiB."
    )
    st.caption(
        f"{bytes_per_token:,} bytes of KV per token ({w.model}, {w.kv_dtype}); "
        f"LRU curve: {rep.curve_method}. Other policies are simulated at "
        "the capacities in the table. Change the model, TP or KV dtype in the sidebar to "
        "see the GiB axis move; the curve in tokens does not depend on them."
    )
    for note in rep.policy_notes:
        st.info(note)
    if rows := rep.capacity_rows():
        st.dataframe(
            figures.capacities_frame(rows, bytes_per_token), hide_index=True, width="stretch"
        )
