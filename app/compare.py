"""Compare options side by side: pin the configuration on screen, change the sidebar,
pin again; up to four configurations in one table and one chart, as a team argues in a
meeting. The rows come from :func:`analyzer.report.figures.comparison_rows`; the
comparison is added to the HTML and Markdown reports downloaded while pins exist."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from analyzer.advisor.words import gpus
from analyzer.report import figures

PINNED_KEY = "kvpool.pinned"
MAX_PINNED = 4


def _pinned() -> list:
    return st.session_state.setdefault(PINNED_KEY, [])


def comparison_chart(rows: list[figures.ComparisonRow]) -> alt.LayerChart:
    """p90 TTFT of each configuration's recommended option, coloured by its verdict,
    with its GPUs written at the bar's end."""
    data = pd.DataFrame(
        [
            {
                "option": r.option,
                "verdict": r.verdict,
                "headline": figures.VERDICT_TEXT.get(r.verdict, r.verdict),
                "ttft": r.p90_ttft_recommended_s,
                "note": gpus(r.gpus),
            }
            for r in rows
            if r.p90_ttft_recommended_s is not None
        ]
    )
    verdicts = [v for v in figures.VERDICT_COLOR if v in set(data.get("verdict", []))]
    base = alt.Chart(data, title="p90 TTFT of the recommended option").encode(
        y=alt.Y("option:N", sort=None, title=None, axis=alt.Axis(labelLimit=0)),
        x=alt.X("ttft:Q", title="seconds"),
        tooltip=["option", "headline", alt.Tooltip("ttft:Q", format=".3f"), "note"],
    )
    bars = base.mark_bar().encode(
        color=alt.Color(
            "headline:N",
            title=None,
            scale=alt.Scale(
                domain=[figures.VERDICT_TEXT[v] for v in verdicts],
                range=[figures.VERDICT_COLOR[v] for v in verdicts],
            ),
            legend=alt.Legend(orient="bottom", labelLimit=0),
        )
    )
    text = base.mark_text(align="left", dx=4).encode(text="note:N")
    return alt.layer(bars, text).properties(height=60 + 40 * len(data))


def section(cur, result) -> list[figures.ComparisonRow]:
    """The "Compare options" section; returns the comparison rows (empty: nothing pinned)."""
    from app import answers

    st.subheader("Compare options")
    pins = _pinned()
    a, b, c = st.columns([1, 1, 3])
    if a.button("Pin this configuration", key="cmp.pin") and result.options not in pins:
        pins.append(result.options)
        del pins[:-MAX_PINNED]
    if b.button("Clear pins", key="cmp.clear", disabled=not pins):
        pins.clear()
    c.caption(
        f"Pin up to {MAX_PINNED}: pin, change the sidebar, pin again. The current "
        "configuration is compared with the pinned ones."
    )
    if not pins:
        return []
    configs = list(pins)
    if result.options not in configs:
        configs.append(result.options)
    results = [result if o == result.options else answers.analysis_of(cur, o) for o in configs]
    rows = figures.comparison_rows(results)
    st.dataframe(figures.comparison_table(rows), hide_index=True, width="stretch")
    if any(r.p90_ttft_recommended_s is not None for r in rows):
        st.altair_chart(comparison_chart(rows), width="stretch")
    return rows


def with_comparison(kind: str, text: str, rows: list[figures.ComparisonRow]) -> str:
    """A downloaded report with the comparison added (HTML and Markdown; the JSON stays
    what `kvpool analyze` writes)."""
    if not rows:
        return text
    if kind == "md":
        return text.rstrip("\n") + "\n\n" + figures.comparison_markdown(rows)
    if kind == "html":
        section = figures.comparison_html(rows)
        at = text.rfind("</body>")
        return text[:at] + section + text[at:] if at >= 0 else text + section
    return text
