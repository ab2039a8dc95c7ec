"""Recommendation: the verdict, why, sized settings, pilot gates, and the reports."""

from __future__ import annotations

import json

import streamlit as st

from app import compute, controls, state

st.title("Recommendation")

VERDICT_STYLE = {
    "deploy-pooled": (st.success, "Deploy a pooled KV store"),
    "local-offload-only": (st.info, "Offload to local host memory only; do not pool"),
    "not-worth-it": (st.warning, "Not worth it: keep the local prefix cache"),
    "insufficient-data": (st.warning, "Insufficient data to decide"),
}

with state.guard():
    cur = state.loaded_trace()
    w = controls.current()
    src = state.source()
    warmup = st.session_state.get("reuse.warmup", 0.5)
    result = compute.analysis(cur, src.label, w, warmup)
    doc = result.to_json()
    verdict = doc["verdict"]

    show, headline = VERDICT_STYLE.get(verdict["verdict"], (st.info, verdict["verdict"]))
    show(f"**{headline}** (`{verdict['verdict']}`)")
    for reason in verdict["reasons"]:
        st.markdown(f"- {reason}")
    st.caption(verdict["confidence_statement"])
    if verdict.get("missing"):
        st.write("What the log lacks: " + "; ".join(verdict["missing"]))

    st.subheader("Reports")
    stem = src.label.split(".")[0] or "kvpool"
    payload = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    a, b, c = st.columns(3)
    html, markdown = compute.reports(result)
    a.download_button(
        "HTML report", html, file_name=f"{stem}-report.html", mime="text/html", key="dl.html"
    )
    b.download_button(
        "Markdown report",
        markdown,
        file_name=f"{stem}-report.md",
        mime="text/markdown",
        key="dl.md",
    )
    c.download_button(
        "JSON report",
        payload,
        file_name=f"{stem}-report.json",
        mime="application/json",
        key="dl.json",
    )

    st.subheader("Decision steps")
    st.dataframe(
        [
            {
                "step": ch["step"],
                "check": ch["name"],
                "passed": {True: "yes", False: "no", None: "n/a"}[ch["passed"]],
                "value": ch["value"],
                "threshold": ch["threshold"],
                "why": ch["text"],
            }
            for ch in verdict["checks"]
        ],
        hide_index=True,
        width="stretch",
    )

    if doc.get("sizing"):
        st.subheader("Sizing")
        sizing = doc["sizing"]
        flat = {k: v for k, v in sizing.items() if not isinstance(v, dict | list)}
        st.dataframe(
            [{"setting": k, "value": str(v)} for k, v in flat.items()],
            hide_index=True,
            width="stretch",
        )

    if doc.get("settings"):
        st.subheader("Product settings")
        tabs = st.tabs([s.get("product", f"#{i}") for i, s in enumerate(doc["settings"])])
        for tab, product in zip(tabs, doc["settings"], strict=True):
            with tab:
                st.json(product, expanded=2)

    st.subheader("Pilot gates")
    plan = doc.get("gates", {}).get("plan", [])
    if plan:
        st.dataframe(
            [
                {k: v if not isinstance(v, dict | list) else json.dumps(v) for k, v in g.items()}
                for g in plan
            ],
            hide_index=True,
            width="stretch",
        )
    else:
        st.caption("No gate plan for this verdict.")

    rows = doc.get("sensitivity", {}).get("rows", [])
    if rows:
        st.subheader("What would change the verdict")
        st.dataframe(
            [
                {k: v if not isinstance(v, dict | list) else json.dumps(v) for k, v in r.items()}
                for r in rows
            ],
            hide_index=True,
            width="stretch",
        )
