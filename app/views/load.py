"""Load a trace: a bundled sample, an upload, or a path on this machine."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from analyzer.quoting import st_text
from app import compute, state
from app.command import check_trace_path, max_upload_mb

st.title("Load a trace")
st.write(
    "Open a request log in any format `kvpool convert` reads (OpenAI JSONL, gateway CSV, "
    "Mooncake, Bailian, RAGPulse, Azure, BurstGPT, canonical Parquet; `.gz` and `.zst` are "
    "read transparently). Everything stays on this machine."
)

how = st.radio(
    "Source",
    ["Bundled sample", "Upload a file", "Path on this machine"],
    horizontal=True,
    key="load.how",
)

with state.guard():
    if how == "Bundled sample":
        samples = state.bundled_samples()
        if not samples:
            st.info("No bundled samples found in traces/. Upload a file or give a path.")
        else:
            names = [p.name for p in samples]
            current = state.source()
            index = names.index(current.label) if current and current.label in names else 0
            choice = st.selectbox("Sample", names, index=index, key="load.sample")
            if st.button("Open sample", type="primary", key="load.open_sample"):
                picked = samples[names.index(choice)]
                state.set_source(state.Source(choice, (str(picked),), "sample"))
    elif how == "Upload a file":
        limit = max_upload_mb()
        upload = st.file_uploader(
            f"Trace file (up to {limit} MB)", key="load.upload", accept_multiple_files=False
        )
        if upload is not None:
            state.set_source(state.save_upload(upload.name, upload.getvalue()))
    else:
        typed = st.text_input(
            "Path", key="load.path", placeholder="/data/gateway-2026-11.jsonl.zst"
        )
        if st.button("Open path", type="primary", key="load.open_path") and typed.strip():
            path = Path(typed.strip()).expanduser()
            check_trace_path(path, confined=True)
            state.set_source(state.Source(path.name, (str(path.resolve()),), "path"))

    with st.expander("Ingest options"):
        choice = state.ingest_choice()
        sizes = [None, 16, 32, 64, 128, 256, 512]
        block_size = st.selectbox(
            "Block size (tokens)",
            sizes,
            index=sizes.index(choice.block_size) if choice.block_size in sizes else 0,
            format_func=lambda b: (
                "auto (16 for text, the trace's own for hashed traces)" if b is None else str(b)
            ),
            help="KV block (page) size used for hashing: vLLM 16, LMCache 256, Mooncake 512. "
            "Changing it re-reads the trace.",
            key="load.block_size",
        )
        strict = st.checkbox(
            "Strict (fail on the first bad line instead of skipping and counting)",
            value=choice.strict,
            key="load.strict",
        )
        fields = st.columns(2)
        tenant_field = fields[0].text_input(
            "Tenant field",
            value=choice.tenant_field or "",
            help="Field or column holding the tenant (a.b.c in JSON records), in place of "
            "the format's own (docs/formats.md); the Tenants control keys blocks by it.",
            key="load.tenant_field",
        )
        user_field = fields[1].text_input(
            "User field",
            value=choice.user_field or "",
            help="Field or column holding the end user (a.b.c in JSON records), in place of "
            "the format's own; the Tenants control's 'user' keys blocks by it.",
            key="load.user_field",
        )
        state.set_ingest_choice(
            state.IngestChoice(
                block_size=block_size,
                strict=strict,
                tenant_field=tenant_field.strip() or None,
                user_field=user_field.strip() or None,
            )
        )

    src = state.source()
    if src is None:
        st.stop()
    st.subheader(f"Loaded: {st_text(src.label)}")
    loaded = compute.ingest(src.paths, state.ingest_choice().key()).loaded
    trace = loaded.trace
    span = float(trace.arrival_s[-1] - trace.arrival_s[0]) if trace.n_requests else 0.0
    c = st.columns(5)
    c[0].metric("Requests", f"{trace.n_requests:,}")
    c[1].metric("Time span", f"{span:,.0f} s")
    c[2].metric("Prompt tokens", f"{int(trace.prompt_tokens.sum()):,}")
    c[3].metric("Sessions", f"{len(trace.session_names):,}")
    c[4].metric("Tenants", f"{len(trace.tenant_names):,}")
    if trace.count_only:
        st.warning(
            "This trace is **count-only**: it has arrival times and lengths but no prompt "
            "content or block hashes, so prefix reuse cannot be measured from it. The "
            "overview and cost pages work; reuse, capacity and replay say so; the "
            "recommendation is `insufficient-data`."
        )
    else:
        st.caption(
            f"{trace.n_blocks:,} distinct blocks of {trace.block_size} tokens, "
            f"{trace.n_accesses:,} block accesses."
        )
    skipped = loaded.skipped
    if skipped.total:
        st.warning(f"Skipped {skipped.total:,} unusable lines.")
        st.dataframe(
            [{"reason": r, "lines": n} for r, n in sorted(skipped.by_reason.items())],
            hide_index=True,
        )
        if skipped.examples:
            st.code("\n".join(skipped.examples[:10]), language=None)
    formats = loaded.formats or ["?"] * len(loaded.sources)
    st.caption(
        "Read: "
        + ", ".join(
            f"{st_text(Path(p).name)} ({f})" for p, f in zip(loaded.sources, formats, strict=False)
        )
    )
    if loaded.untimed_files:
        st.info(
            "No timestamps in "
            + ", ".join(st_text(Path(p).name) for p in loaded.untimed_files)
            + ": requests are spaced 1 s apart in file order, so rates and replay timing "
            "are nominal."
        )
    for note in loaded.mixed_unit_files:
        st.info(note)
    if loaded.reordered:
        st.caption(f"{loaded.reordered:,} rows were out of time order in their file (sorted).")
