"""kvpool what-if dashboard: the Streamlit entrypoint (``kvpool dashboard`` runs this).

This file is the frame around every page: page setup, the what-if controls in the
sidebar, and the navigation. Each page lives in ``app/views/`` and only draws widgets
from what ``app.compute`` (the cached calls into analyzer/) returns.
"""

from __future__ import annotations

import streamlit as st

from analyzer.quoting import st_text
from app import controls, state

st.set_page_config(page_title="kvpool what-if", page_icon=":material/memory:", layout="wide")

PAGES = [
    st.Page("views/load.py", title="Load a trace", icon=":material/upload_file:", default=True),
    st.Page("views/overview.py", title="Workload overview", icon=":material/monitoring:"),
    st.Page("views/reuse.py", title="Prefix reuse", icon=":material/account_tree:"),
    st.Page("views/capacity.py", title="Capacity", icon=":material/storage:"),
    st.Page("views/cost.py", title="Cost model", icon=":material/calculate:"),
    st.Page("views/replay.py", title="Replay", icon=":material/replay:"),
    st.Page("views/recommend.py", title="Recommendation", icon=":material/verified:"),
]

page = st.navigation(PAGES)

src = state.source()
with st.sidebar:
    st.caption(f"Trace: **{st_text(src.label)}**" if src else "No trace loaded")
controls.sidebar()

page.run()
