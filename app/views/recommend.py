"""Recommendation: the verdict, why, sized settings, pilot gates, and the reports."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analyzer.advisor.products import DOCS_CHECKED
from analyzer.advisor.sensitivity import summarize
from analyzer.quoting import st_text
from analyzer.report import figures
from analyzer.report.document import ReportDocument
from analyzer.report.summary import (
    economics_table,
    glossary_rows,
    isolation_products_table,
    isolation_table,
    price_table,
    side_by_side_table,
    undefined_notes,
)
from app import answers, banner, changes, compare, controls, prefetch, state

st.title("Recommendation")


def _table(header_rows) -> list[dict]:
    header, rows = header_rows
    return [dict(zip(header, r, strict=True)) for r in rows]


def _projected(metric: str, value) -> str:
    """A gate's projected figure: seconds for ``*_s`` metrics (the baseline's TTFT), a
    signed percentage for the reductions and gains."""
    if not isinstance(value, int | float):
        return str(value)
    if metric.endswith("_s"):
        return f"{value:.3g} s"
    return f"{abs(value):.1%} {'more' if value >= 0 else 'less'}"


def _settings(w, thresholds, prices) -> dict[str, str]:
    """The what-if settings, the decision's objective and thresholds, and the prices
    moved away from the catalog's, in words."""
    out = changes.setting_words(w)
    out["objective"] = str(thresholds.objective)
    for name, label, _why in controls.THRESHOLD_CONTROLS:
        out[label] = f"{100 * getattr(thresholds, name):g}%"
    for name, label, _attr in controls.PRICE_CONTROLS:
        value = getattr(prices, name, None)
        out[label] = "catalog" if value is None else f"{value:g}"
    return out


def _figures(doc) -> dict[str, str]:
    """The verdict and each option's GPUs, TTFT and monthly total, as the money table
    shows them."""
    out = {"verdict": str(doc.verdict.verdict)}
    money = economics_table(doc)
    if money is not None:
        header, rows = money
        for row in rows:
            cells = dict(zip(header, row, strict=True))
            for col in ("GPUs", "Mean / p90 TTFT", "Total / month"):
                if col in cells:
                    out[f"{cells['Option']}, {col}"] = cells[col]
    return out


STALE_KEY = "kvpool.shown"  # (trace content, ingest options, the last result shown)
REPRICED_KEY = "kvpool.repriced"  # (the analysis key, the re-priced result shown for it)
# The previous answer's verdict and figures, greyed and inert while the new one replays.
# The containers keep their keys and places whether the answer is greyed or not, and the
# style is drawn in the same place either way (empty when fresh): the browser then only
# restyles what it shows, where a changed key or a shifted place made it draw every
# element anew (1.4 s of its script on two cores, while the replays it waits for ran).
GREYED = ("kvpool-answer", "kvpool-answer-rest")
STALE_CSS = (
    "<style>"
    + ",".join(f".st-key-{k}" for k in GREYED)
    + "{opacity:0.45;filter:grayscale(0.8);pointer-events:none}</style>"
)
FRESH_CSS = "<style></style>"


@st.fragment(run_every=0.5)
def _wait_for(key, partial: str) -> None:
    """Poll the background run; rerun the page once its answer is ready."""
    pf = prefetch.prefetcher()
    now = pf.running(key)
    if now is None:  # done (or failed: the page then runs it itself and shows why)
        st.rerun()
    simulated, seconds = now
    what = (
        f"Replaying {partial} in the background"
        if partial
        else "Replaying the scenarios these settings change, in the background; the answer "
        "below is for the previous settings"
    )
    st.info(
        f"{what}: {simulated:,.0f} requests simulated, {seconds:.0f} s.",
        icon=":material/hourglass_top:",
    )


def _table_of(rows) -> None:
    """A small read-only table, drawn as a static table: the browser redraws it on every
    what-if, and a static table costs it less than an interactive grid. A lone "-" (no
    figure) is drawn as an en dash: a static table reads it as a Markdown list item."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    st.table(frame.replace({"-": "–"}), hide_index=True)


def _repriced_lines(cur, opts, ans) -> None:
    """Under the banner: what a re-priced answer is; once the replay has replaced it,
    how far off it was."""
    key = prefetch.analysis_key(cur, opts)
    if ans.repriced:
        st.session_state[REPRICED_KEY] = (key, ans.result)
        for line in answers.reprice_words(ans.repriced):
            st.caption(line)
        return
    before = st.session_state.get(REPRICED_KEY)
    if before is not None and before[0] == key and not ans.stale:
        st.caption(answers.reprice_error(before[1], ans.result))


@st.fragment
def _page() -> None:
    """The page below the title. A fragment: a decision threshold, a price or the
    objective (drawn inside it) re-runs only this part, not the sidebar; a sidebar
    control re-runs the whole app, this part included. The prefetch stays stopped while
    it runs and while the browser draws it (:data:`app.prefetch.DRAW_S`)."""
    with prefetch.prefetcher().foreground(linger_s=prefetch.DRAW_S):
        _draw()


def _draw() -> None:
    with state.guard():
        cur = state.loaded_trace()
        w = controls.current()
        src = state.source()
        warmup = controls.current().warmup
        thresholds = controls.thresholds()
        prices = controls.prices(w.gpu)
        opts = answers.analysis_options(cur, w, warmup, thresholds, prices)
        shown = st.session_state.get(STALE_KEY)
        same_trace = shown is not None and shown[:2] == (cur.content, cur.ingest_key)
        # The first visit's progress bar is drawn in a container of its own, always
        # drawn, so that the containers below keep their places on every later run.
        with st.container(key="kvpool-progress"):
            ans = answers.answer(cur, opts, shown[2] if same_trace else None)
        result = ans.result
        # Always drawn, empty unless a replay runs behind the answer: the containers
        # below keep their places in the page, so the browser updates them rather than
        # drawing them anew (a second on two cores).
        with st.container(key="kvpool-background"):
            if ans.pending is not None:
                what = ans.partial or ("the scenarios re-priced" * bool(ans.repriced))
                _wait_for(ans.pending, what)
        if not ans.stale:
            st.session_state[STALE_KEY] = (cur.content, cur.ingest_key, result)
            if ans.pending is None:
                prefetch.after_analysis(cur, result.options)
        report_doc = ReportDocument.of(result)
        doc = report_doc.report  # the money and side-by-side tables are the report's own rows
        decision = result.decision
        st.markdown(STALE_CSS if ans.stale else FRESH_CSS, unsafe_allow_html=True)

    answer_key, rest_key = GREYED
    with st.container(key=answer_key), state.guard():
        # the report's three-sentence summary (verdict; ms, GPUs, money; confidence) opens the page
        banner.verdict_banner(
            decision.verdict,
            list(report_doc.summary),
            stale=ans.stale,
            repriced=bool(ans.repriced),
        )
        st.caption(st_text(banner.settings_line(result.options, result.plans)))  # model names
        _repriced_lines(cur, opts, ans)
        if not ans.stale and not ans.repriced:
            changes.show("recommend", _settings(w, thresholds, prices), _figures(doc))
        with st.expander("Why: every reason", expanded=False):
            for reason in decision.reasons:
                st.markdown(f"- {reason}")
            st.caption(decision.confidence_statement)

    # Left usable while a new answer replays (not greyed, not inert): a team keeps
    # comparing and downloading what is on screen, which the caption says.
    with st.container(key="kvpool-compare"), state.guard():
        pinned = compare.section(cur, result)

        st.subheader("Reports")
        stem = src.label.split(".")[0] or "kvpool"
        report = answers.reports(cur, result)
        for col, (kind, label, mime) in zip(
            st.columns(3),
            (
                ("html", "HTML report", "text/html"),
                ("md", "Markdown report", "text/markdown"),
                ("json", "JSON report", "application/json"),
            ),
            strict=True,
        ):
            col.download_button(
                label,
                # Drawn when clicked, not on every what-if; with the comparison when pinned.
                lambda kind=kind: compare.with_comparison(kind, report(kind), pinned),
                file_name=f"{stem}-report.{kind}",
                mime=mime,
                key=f"dl.{kind}",
                on_click="ignore",
            )
        if ans.stale:  # last in its container: the elements above keep their places
            st.caption(
                "Until the new answer is ready, the comparison and the reports above are "
                "those of the answer shown (the previous settings): pinning pins it."
            )

    with st.container(key=rest_key), state.guard():
        st.subheader("Decision steps")
        _table_of(
            [
                {
                    "step": ch.step,
                    "check": ch.name.replace("_", " "),
                    "outcome": {True: "passed", False: "failed", None: "not evaluated"}[ch.passed],
                    "what was measured": ch.text,
                }
                for ch in decision.checks
            ],
        )

        money = economics_table(doc)
        if money:
            st.subheader("GPUs and money")
            _table_of(_table(money))
        for note in undefined_notes(doc, side_by_side=False):
            st.caption(note)
        if money:
            prices = price_table(doc)
            if prices:
                st.caption("Prices used (change them under Prices above):")
                _table_of(_table(prices))

        if doc.isolation is not None:
            st.subheader("Tenant isolation")
            iso = doc.isolation
            said = iso.sentence[:1].upper() + iso.sentence[1:] + "."
            st.markdown(said.replace("$", "\\$"))  # a dollar amount, not LaTeX
            if iso.policy == "shared":
                st.caption(
                    "Every figure above is for a pool shared across tenants: the gateway "
                    "would set cache_salt (vLLM, SGLang) or extra_key (older SGLang) per "
                    "tenant to keep them apart (Tenants, in the sidebar, prices it)."
                )
            else:
                st.caption(
                    f"Every figure above is with a cache salt per {iso.policy}: "
                    "deploy/isolation/README.md in the bundle says how to set it end to end."
                )
            table = isolation_table(doc)
            if table:
                _table_of(_table(table))
            products = isolation_products_table(doc)
            if products:
                st.caption(
                    "Whether a salt would hold on each stack of the bundle: every tier must "
                    "key its blocks by it at the versions the bundle targets; under "
                    "isolation, deploy/ refuses the others."
                )
                _table_of(_table(products))

        side = side_by_side_table(doc)
        if side:
            st.subheader("Other GPUs and models on this log")
            _table_of(_table(side))
            for note in undefined_notes(doc, money=False):
                st.caption(note)

        if doc.sizing is not None:
            st.subheader("Sizing")
            _table_of(figures.sizing_table(doc.sizing))

        if result.settings:
            st.subheader("Product settings")
            products = result.settings
            tabs = st.tabs([f"{p.product} ({p.mode})" for p in products])
            for tab, product in zip(tabs, products, strict=True):
                with tab:
                    _table_of(
                        [
                            {"option": s.option, "value": s.value, "why": s.why}
                            for s in product.settings
                        ],
                    )
                    if product.snippet:
                        st.code(product.snippet, language=product.snippet_lang or None)
            st.caption(
                "Option names checked against: "
                + "; ".join(f"{p['product']} {p['version']}" for p in DOCS_CHECKED)
            )

        st.subheader("Pilot gates")
        if not result.gates:
            st.caption("No gate plan for this verdict.")
        for gate in result.gates:
            with st.expander(gate.name, expanded=gate.id == "main"):
                st.write(gate.run)
                for crit in gate.criteria:
                    st.markdown(f"- {crit.text}")
                if gate.projected:
                    st.caption(
                        "Projected by the replay: "
                        + ", ".join(
                            f"{k.replace('_', ' ')} {_projected(k, v)}"
                            for k, v in sorted(gate.projected.items())
                        )
                    )

        if result.pilot:
            st.subheader("Pilot commands")
            for cmd in result.pilot:
                st.markdown(f"**{cmd.tool}**: {cmd.purpose}")
                st.code(cmd.command, language="bash")
                st.caption(cmd.note)

        if result.flips:
            st.subheader("What would change the verdict")
            if ans.partial:
                st.caption(f"Still being replayed in the background: {ans.partial}.")
            _table_of(
                [
                    {
                        "if": r.dimension,
                        "were": r.label,
                        "the verdict would be": r.verdict,
                        "changes the verdict": "yes" if r.flips else "no",
                        "note": r.note,
                    }
                    for r in result.flips
                ],
            )
            for line in summarize(result.flips):
                st.caption(line)

        with st.expander("Glossary"):
            _table_of(
                [{"term": t, "meaning": m} for t, m in glossary_rows()],
            )
    if ans.drawn is not None:  # the page is drawn: its background replay may start
        ans.drawn.set()


_page()
