"""Prefix reuse: ceilings, granularity, where reuse comes from, top prefixes, prefix tree."""

from __future__ import annotations

import numpy as np
import streamlit as st

from analyzer.report import figures
from app import changes, charts, compute, controls, state

st.title("Prefix reuse")

with state.guard():
    cur = state.loaded_trace()
    state.require_content(cur.trace, "prefix reuse")
    warmup = controls.current().warmup
    rep = compute.reuse(cur, warmup)
    if not rep.measurable:
        st.warning(f"Reuse cannot be measured: {rep.reason}")
        st.stop()

    c = st.columns(4)
    c[0].metric(
        f"Ceiling, steady (warm-up {rep.warmup:.0%})",
        f"{rep.ceiling_hit_rate:.1%}",
        help="Token-weighted prefix hit rate with unlimited cache and perfect routing.",
    )
    c[1].metric("Ceiling, cold start", f"{rep.cold_ceiling_hit_rate:.1%}")
    c[2].metric("Counted prompt tokens", f"{rep.prompt_tokens:,}")
    c[3].metric("Reusable tokens", f"{rep.hit_tokens:,}")
    changes.show(
        "reuse",
        {"warm-up": f"{warmup:.0%}"},
        {
            "steady-state ceiling": f"{rep.ceiling_hit_rate:.1%}",
            "counted prompt tokens": f"{rep.prompt_tokens:,}",
            "reusable tokens": f"{rep.hit_tokens:,}",
        },
    )
    st.caption(
        f"Block size {rep.block_size} tokens; the last prompt token is always "
        "recomputed, so a hit covers at most prompt - 1 tokens."
    )

    left, right = st.columns(2)
    with left:
        st.subheader("Granularity")
        gran = figures.granularity_frame(rep.granularity)
        st.altair_chart(charts.granularity_chart(gran), width="stretch")
        st.dataframe(figures.granularity_table(gran), hide_index=True, width="stretch")
    with right:
        st.subheader("Where reuse comes from")
        src = figures.sources_frame(rep.sources)
        st.altair_chart(charts.sources_chart(src), width="stretch")
        # a static table: every cell shown whole, and as text a browser can read
        st.table(figures.sources_table(src).replace({"-": "–"}), hide_index=True)
        st.caption(
            "Each source's reused tokens as a share of the counted prompt tokens, as in "
            "the report (together they make the steady-state ceiling). "
            + (rep.sources.attribution if rep.sources is not None else "")
        )
        non_prefix = rep.non_prefix
        if non_prefix.available:
            st.metric(
                "Seen before, but not as a prefix",
                f"{non_prefix.hit_rate:.1%}",
                help=non_prefix.note,
            )
            st.caption(
                f"Content seen before at any position: {non_prefix.content_seen_rate:.1%} "
                f"of tokens; as a prefix: {non_prefix.prefix_rate:.1%}."
            )
        else:
            st.caption(f"Non-prefix reuse: {non_prefix.reason or 'not available'}")

    st.subheader("Top shared prefixes")
    tops = rep.top_prefixes
    by_volume, by_count = st.tabs(["By reused tokens", "By requests"])
    by_volume.dataframe(
        figures.top_prefixes_frame(tops.by_volume), hide_index=True, width="stretch"
    )
    by_count.dataframe(figures.top_prefixes_frame(tops.by_count), hide_index=True, width="stretch")
    if tops.note:
        st.caption(tops.note)

    st.subheader("Prefix tree")
    bs = cur.trace.block_size
    depths = [bs * 2**k for k in range(0, 14) if 256 <= bs * 2**k <= 32768] or [bs]
    a, b, c3 = st.columns(3)
    depth = a.select_slider(
        "Depth (tokens into the prompt)",
        depths,
        # Start at the typical prompt length: the part of the prompt most requests have.
        value=min(
            depths, key=lambda d: abs(d - min(8192, int(np.median(cur.trace.prompt_tokens))))
        ),
        key="reuse.tree_depth",
    )
    steps = [bs * 2**k for k in range(0, 10) if bs * 2**k <= depth]
    step = b.select_slider(
        "Resolution (tokens per step)",
        steps,
        value=next((s for s in steps if depth // s <= 128), steps[-1]),
        key="reuse.tree_step",
        help="Finer steps show where prefixes diverge more exactly but take longer.",
    )
    min_share = c3.select_slider(
        "Merge prefixes under",
        [0.001, 0.005, 0.01, 0.02, 0.05],
        value=0.01,
        format_func=lambda v: f"{v:.1%} of requests",
        key="reuse.tree_min_share",
    )
    tree = compute.prefix_tree(cur, step // bs, depth // step, min_share)
    if tree.empty:
        st.info(f"No request has a full block of {step} tokens.")
    else:
        st.altair_chart(charts.prefix_tree_chart(tree, depth), width="stretch")
        reached = int(tree.y1_tokens.max())
        if reached < depth:
            st.caption(
                f"No prefix is shared by at least {min_share:.1%} of requests beyond "
                f"{reached:,} tokens: below that every prefix is in a grey merged slice or "
                "the prompts have ended."
            )
        st.caption(
            "Read down from the top of the prompt: a rectangle is one distinct prefix, as "
            "wide as the share of requests that start with it and as tall as the tokens "
            "they share before branching. Wide, tall rectangles are long shared prefixes: "
            "what a KV cache can reuse. Hover for the text where previews were kept."
        )
