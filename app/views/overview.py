"""Workload overview: arrivals over time, prompt and output lengths, sessions, tenants."""

from __future__ import annotations

import numpy as np
import streamlit as st

from analyzer.report import figures
from app import charts, state

st.title("Workload overview")

with state.guard():
    trace = state.loaded_trace().trace
    if trace.n_requests == 0:
        st.info("The trace has no requests.")
        st.stop()

    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    known_out = trace.output_tokens[trace.output_tokens >= 0]
    c = st.columns(5)
    c[0].metric("Requests", f"{trace.n_requests:,}")
    c[1].metric("Mean rate", f"{trace.n_requests / span:,.2f} req/s" if span > 0 else "n/a")
    c[2].metric("Median prompt", f"{int(np.median(trace.prompt_tokens)):,} tok")
    c[3].metric(
        "Median output", f"{int(np.median(known_out)):,} tok" if known_out.size else "unknown"
    )
    c[4].metric("Sessions", f"{len(trace.session_names):,}")

    st.subheader("Arrivals")
    arrivals = figures.arrivals_frame(trace)
    left, right = st.columns(2)
    left.altair_chart(
        charts.arrivals_chart(arrivals, "requests_per_s", "requests per second"),
        width="stretch",
    )
    right.altair_chart(
        charts.arrivals_chart(arrivals, "prompt_tokens_per_s", "prompt tokens per second"),
        width="stretch",
    )

    st.subheader("Lengths")
    left, right = st.columns(2)
    left.altair_chart(
        charts.histogram_chart(
            figures.log2_histogram_frame(trace.prompt_tokens, "prompt_tokens"),
            "prompt_tokens",
            "requests",
            "Prompt length (tokens)",
        ),
        width="stretch",
    )
    if known_out.size:
        right.altair_chart(
            charts.histogram_chart(
                figures.log2_histogram_frame(known_out, "output_tokens"),
                "output_tokens",
                "requests",
                "Output length (tokens)",
            ),
            width="stretch",
        )
    else:
        right.info("The trace does not record output lengths.")

    st.subheader("Sessions and tenants")
    left, right = st.columns(2)
    sessions = figures.sessions_frame(trace)
    if len(sessions):
        in_multi = figures.requests_in_multi_request_sessions(trace)
        left.altair_chart(
            charts.histogram_chart(
                sessions, "requests_in_session", "sessions", "Requests per session"
            ),
            width="stretch",
        )
        left.caption(
            f"{len(trace.session_names):,} sessions; {in_multi:,} requests "
            f"({in_multi / trace.n_requests:.0%}) belong to a session with more than one."
        )
    else:
        left.info("The trace names no sessions (no session id, user or cache key).")
    tenants = figures.tenants_frame(trace)
    right.altair_chart(charts.tenants_chart(tenants), width="stretch")
    n_tenants = len(trace.tenant_names)
    right.caption(
        f"{n_tenants:,} tenant{'s' if n_tenants != 1 else ''} "
        "(the model stands in when none is named)."
    )
