"""Cost model: recompute against load for the sidebar's model and GPUs, and the break-even."""

from __future__ import annotations

import numpy as np
import streamlit as st

from analyzer.errors import KvpoolError
from analyzer.quoting import st_text
from analyzer.report import figures
from app import breakeven, calibration, changes, charts, compute, controls, state

st.title("Cost model")

with state.guard():
    w = controls.current()
    if not (w.model and w.tp):
        # a model left to the log is priced as the log names it (its most requested);
        # without a trace, as `kvpool cost` prices it by default
        from dataclasses import replace

        cur = None
        if state.source() is not None:
            try:  # an unreadable trace: priced as `kvpool cost` prices by default
                cur = state.loaded_trace()
            except KvpoolError:
                cur = None
        if cur is not None:
            w = controls.concrete(cur)
        else:
            from analyzer.replay import ClusterConfig

            w = replace(w, model=w.model or ClusterConfig().model, tp=w.tp or 1)
    cm = compute.cost_model(w.model, w.gpu, w.tp, w.kv_dtype)
    st.caption(
        f"{w.model} on {w.tp}x {w.gpu} ({w.kv_dtype} KV), prefill priced by the "
        f"{cm.prefill_model_label}. The trace does not enter this page except for its "
        "prompt lengths."
    )

    typical = None
    if state.source() is not None:
        try:  # this page works without a readable trace; it only borrows its lengths
            trace = state.loaded_trace().trace
        except KvpoolError:
            trace = None
        if trace is not None and trace.n_requests:
            typical = int(np.median(trace.prompt_tokens))

    prefix = st.select_slider(
        "Prefix length for the figures below (tokens)",
        options=breakeven.PREFIX_GRID,
        value=min(breakeven.PREFIX_GRID, key=lambda p: abs(p - (typical or 8192))),
        key="cost.prefix",
        help="Starts at the trace's median prompt length.",
    )
    from analyzer.cost import uncertainty as unc

    band = unc.prefill_band(cm, prefix)
    rate = unc.rate_range(cm.prefill_tokens_per_s(prefix), band)
    c = st.columns(4)
    c[0].metric("KV per token", f"{cm.bytes_per_token:,} B", help="Whole model, all ranks.")
    c[1].metric(
        "Prefill rate",
        f"{rate.value:,.0f} tok/s",
        help=f"{rate.low:,.0f}-{rate.high:,.0f} tok/s by the model's measured error.",
    )
    be = cm.break_even_bandwidth_gbps(prefix)
    be_r = unc.break_even_range(be, band)
    c[2].metric(
        "Break-even bandwidth",
        f"{be:,.1f} GB/s" if np.isfinite(be) else "never",
        help=f"{be_r.low:,.1f}-{be_r.high:,.1f} GB/s by the model's measured error."
        if np.isfinite(be)
        else None,
    )
    c[3].metric("HBM left for KV", f"{cm.hbm_kv_capacity_tokens():,} tok", help="Per instance.")

    range_text = (
        f"Ranges: prefill {rate.low:,.0f}-{rate.high:,.0f} tok/s"
        + (f", break-even {be_r.low:,.1f}-{be_r.high:,.1f} GB/s" if np.isfinite(be) else "")
        + f", from {band.describe()} (`kvpool cost check`)."
    )
    st.caption(range_text)
    changes.show(
        "cost",
        changes.setting_words(w),
        {
            "KV per token": f"{cm.bytes_per_token:,} B",
            "prefill rate": f"{rate.value:,.0f} tokens/s",
            "break-even bandwidth": f"{be:,.1f} GB/s" if np.isfinite(be) else "never",
            "HBM left for KV": f"{cm.hbm_kv_capacity_tokens():,} tokens",
        },
    )

    rows = breakeven.break_even_rows(w)
    left, right = st.columns(2)
    left.altair_chart(
        charts.break_even_chart(rows),
        width="stretch",
    )
    right.altair_chart(charts.prefix_time_chart(rows), width="stretch")

    st.subheader("Per link: shortest prefix worth loading")
    st.dataframe(
        figures.link_break_even_table(breakeven.tier_break_even(w)),
        hide_index=True,
        width="stretch",
    )
    st.caption(
        "Host-DRAM links are per GPU, so their bandwidth scales with TP. Loads assume one "
        "transfer on an idle link; in the replay, concurrent loads share it."
    )

    st.subheader("Fitted versus measured")
    upload = st.file_uploader(
        "Calibration CSV (prompt_tokens, cached_tokens, concurrency, load_gbps, ttft_s)",
        type=["csv"],
        key="cost.calibration",
    )
    if upload is None:
        st.caption(
            "Upload measurements from your own serving benchmark to fit the model's "
            "coefficients to your system and compare fitted against measured TTFT."
        )
    else:
        fit = calibration.calibrate(w, upload.name, upload.getvalue())
        st.altair_chart(charts.fitted_chart(fit.points), width="stretch")
        for line in fit.summary:  # the upload's name and its rows' values: text only
            st.markdown(st_text(line))
        for warning in fit.warnings:
            st.warning(st_text(warning))
        use = st.checkbox(
            "Use the fitted model on the Replay page",
            value=state.calibration() is not None,
            key="cost.use_fit",
        )
        state.set_calibration((upload.name, upload.getvalue()) if use else None)
    if state.calibration() is not None:
        name = st_text(state.calibration()[0])
        st.caption(f"The Replay page uses the TTFT model fitted to {name}.")
