"""The verdict as a strong banner, and the one line that says which settings made it.

The banner's headline and colour are the report's (:mod:`analyzer.report.figures`), so
the dashboard and ``report.html`` look alike. Under the headline go the report's
three-sentence summary, for a reader who reads nothing else.
"""

from __future__ import annotations

import html

import streamlit as st

from analyzer.advisor.words import count
from analyzer.report.figures import VERDICT_COLOR, VERDICT_TEXT


def banner_html(verdict: str, lines: list[str], stale: bool = False, repriced: bool = False) -> str:
    """The banner; ``stale``: it is the previous settings' verdict, shown while the new
    one is computed (``data-stale`` lets a browser test tell the two apart);
    ``repriced``: it is re-priced from a replay at other link speeds until the replay
    at these settings replaces it (``data-repriced``)."""
    color = VERDICT_COLOR.get(verdict, "#444444")
    body = "".join(f"<p style='margin:0.35em 0 0 0'>{html.escape(t)}</p>" for t in lines)
    mark = (" data-stale='1'" if stale else "") + (" data-repriced='1'" if repriced else "")
    return (
        f"<div data-testid='kvpool-verdict' data-verdict='{html.escape(verdict)}'{mark} "
        f"style='background:{color};color:#fff;border-radius:8px;padding:1.1em 1.4em;"
        "margin:0.4em 0 1em 0'>"
        f"<div style='font-size:1.7em;font-weight:700'>{html.escape(VERDICT_TEXT.get(verdict, verdict))}</div>"
        f"<div style='opacity:0.85;font-family:monospace'>{html.escape(verdict)}</div>"
        f"{body}</div>"
    )


def verdict_banner(
    verdict: str, lines: list[str], stale: bool = False, repriced: bool = False
) -> None:
    st.markdown(banner_html(verdict, lines, stale, repriced), unsafe_allow_html=True)


def settings_line(opts, plans=()) -> str:
    """Which settings the figures on the page come from, in the sidebar's words: the
    models as planned (each as the log names it unless the sidebar names one), then the
    cluster's settings."""
    pool = f"{opts.pool_gbps:g} GB/s per node" if opts.pool_gbps else f"{opts.pool_tier} (catalog)"
    models = sorted({f"{p.model} on {p.tp} x {p.gpu}" for p in plans}) or [
        f"{opts.model} on {opts.tp} x {opts.gpu}"
    ]
    return (
        f"Planned for {', '.join(models)} ({count(opts.gpus_per_node, 'GPU')} per node), sized "
        f"by replaying from {count(opts.instances, 'instance')}, router {opts.router}, pool "
        f"link {pool}, "
        f"host DRAM link {opts.dram_tier}, p90 TTFT target {opts.ttft_slo_s:g} s, warm-up "
        f"{opts.warmup:.0%} of requests (not counted)."
    )
