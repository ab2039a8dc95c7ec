"""The Recommendation's answer: the analysis `kvpool analyze` runs for the sidebar's
settings, decided from remembered replays where it can (a price, a threshold or the
SLO moved), re-priced while a tier's replay runs in the background, and its reports."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import streamlit as st

from app import replays, workers
from app.compute import CALLS, Advance, Current, Key, progress
from app.replays import analyze_options, log_model, replay_memo

_LAYER_LOCK = threading.Lock()
_LAYERS: dict[tuple, Any] = {}  # small analysis layers, most recent last
_LAYERS_MAX = 24


def _remember(key: tuple, make: Callable[[], Any]) -> Any:
    """``make()`` once per ``key``: a plain, locked dict rather than ``st.cache_*``,
    because the background prefetch and the download buttons call it from other threads,
    where Streamlit's caches log a warning for every call."""
    with _LAYER_LOCK:
        if key in _LAYERS:
            return _LAYERS[key]
    value = make()
    with _LAYER_LOCK:
        _LAYERS[key] = value
        while len(_LAYERS) > _LAYERS_MAX:
            _LAYERS.pop(next(iter(_LAYERS)))
    return value


def _analysis_reuse(content: str, ingest_key: Key, warmup: float, bytes_per_token: int, trace):
    """The reuse report as `kvpool analyze` makes it (warm-up and the model's bytes per
    token): one per trace, warm-up and model, however many analyses read it."""

    def make():
        from analyzer.reuse import ReuseOptions, analyze_reuse

        CALLS["analysis_reuse"] += 1
        return analyze_reuse(trace, ReuseOptions(warmup=warmup, bytes_per_token=bytes_per_token))

    return _remember(("reuse", content, ingest_key, warmup, bytes_per_token), make)


def _models_document(loaded, warmup: float, kv_dtype: str):  # ModelsFigures
    from analyzer.advisor.models import models_document
    from analyzer.reuse import ReuseOptions

    return models_document(loaded, ReuseOptions(warmup=warmup), kv_dtype)


@st.cache_resource(show_spinner=False)
def probe_store():
    """The server's remembered probes (``analyzer.advisor.replay.ProbeStore``): every
    replay the plans asked for, by the trace on screen and what the replay reads, so a
    what-if that moves only a price, a threshold or the SLO re-decides from the probes
    it has, and one that moves a tier's setting replays only the options with that tier."""
    from analyzer.advisor.replay import ProbeStore

    # figures for at most 4M measured requests: about 50-120 MB however long it runs
    return ProbeStore(max_keys=2048, max_figures_requests=4_000_000)


def run_whatif(
    cur: Current,
    opts,
    advance: Advance | None = None,
    on_run=None,
    gate=None,
    memo=None,
    only_known: bool = False,
    parallel: bool = True,
    repriced: list | None = None,
):
    """``run_analysis`` on the loaded trace with every layer remembered: the reuse report
    per warm-up and model, every probe of every plan (:func:`probe_store`). Safe to call
    from a background thread (it touches no page element); ``gate`` is then called
    before each batch of replays (the prefetch waits there while a page computes).
    ``only_known``: replay nothing; a probe not remembered raises
    ``analyzer.replay.memo.NotRemembered``. ``parallel``: replay in the page's warm
    worker processes (:mod:`app.workers`), for the answer the user waits for; the
    prefetch passes False: its replays go to the one low-priority prefetch process.
    ``memo`` and ``repriced`` are kept for the callers that pass them: plans are made of
    probes, which are not re-priced from other link speeds (a link what-if replays the
    options that use that link)."""
    from analyzer.advisor import run_analysis
    from analyzer.advisor.measure import choices_of, primary_bytes_per_token
    from analyzer.advisor.replay import LocalReplayer, Services

    bpt = primary_bytes_per_token(choices_of(cur.loaded, opts), opts.kv_dtype)
    rep = _analysis_reuse(cur.content, cur.ingest_key, opts.warmup, bpt, cur.trace)
    models = _remember(
        ("models", cur.content, cur.ingest_key, opts.warmup, opts.kv_dtype),
        lambda: _models_document(cur.loaded, opts.warmup, opts.kv_dtype),
    )
    replayer = LocalReplayer(
        store=probe_store(),
        trace_key=(cur.content, cur.ingest_key),
        # Decided by the whole log's size: its per-model parts go where it goes.
        pool=workers.pool("page" if parallel else "prefetch", cur.trace.n_requests),
        only_known=only_known,
        gate=gate,
        on_run=on_run,
    )
    # The analysis keys the log as read by opts.isolation itself (and plans the other
    # policies beside it); the remembered reuse and models are those of the keyed trace.
    assert opts.isolation == cur.isolation, (opts.isolation, cur.isolation)
    return run_analysis(
        cur.loaded.sources,
        opts,
        advance=advance,
        loaded=cur.as_read,
        services=Services(replayer, rep, models),
    )


def analysis_options(cur: Current, w, warmup: float, thresholds=None, prices=None):
    """The ``AnalyzeOptions`` of the what-if controls for the trace on screen, with the
    decision thresholds and the prices (``PriceOverrides``) when given."""
    from dataclasses import replace
    from dataclasses import replace as _replace

    concrete = w
    if not (w.model and w.tp):
        model, tp = log_model(cur, w.model, w.gpu, w.tp, w.kv_dtype)
        concrete = _replace(w, model=model, tp=tp)
    opts = analyze_options(w, warmup, dict(cur.ingest_key).get("block_size"), concrete)
    if thresholds is not None:
        opts = replace(opts, thresholds=thresholds)
    return opts if prices is None else replace(opts, prices=prices)


def analysis(cur: Current, w, warmup: float, thresholds=None):
    """``analyzer.advisor.AnalysisResult`` (verdict, sizing, settings, gates) of the
    trace on screen, from its ingestion (never re-read); ``thresholds`` are the decision
    thresholds (``analyzer.advisor.figures.Thresholds``; None: the defaults)."""
    return analysis_of(cur, analysis_options(cur, w, warmup, thresholds))


def _decided_now(cur: Current, opts):
    """The analysis for ``opts`` if it needs no replay (every one it reads is remembered),
    else None: deciding, sizing and pricing from remembered replays takes a fraction of
    a second, so a threshold, the objective, a price or the SLO of a replay without the
    rate search answers at once. A layer it computes on the way (the reuse report of a
    new model) is remembered for the replay that follows."""
    from analyzer.replay.memo import NotRemembered

    try:
        result = run_whatif(cur, opts, only_known=True)
    except NotRemembered:
        return None
    CALLS["analysis"] += 1
    CALLS["decided_now"] += 1
    return result


def _repriced_now(cur: Current, opts):
    """The analysis for ``opts`` from the remembered replays, those it lacks re-priced
    from a remembered replay at other link bandwidths or latencies
    (``analyzer.replay.reprice``), and what was re-priced (nothing: the analysis is
    decided, as :func:`_decided_now`); (None, ()) when a replay it needs can be
    neither remembered nor re-priced."""
    from analyzer.replay.memo import NotRemembered

    notes: list = []
    try:
        result = run_whatif(cur, opts, only_known=True, repriced=notes)
    except NotRemembered:
        return None, ()
    if notes:
        CALLS["repriced"] += 1
    return result, tuple(notes)


def reprice_words(notes) -> list[str]:
    """What a re-priced answer is, in the page's words: from which replay, exact or how
    approximate (see docs/replay.md, "Re-pricing for another link bandwidth")."""
    tiers = {"dram": "host DRAM link", "nvme": "NVMe", "pool": "pool link"}
    moved = sorted(
        {f"{tiers[t]} {a:g} GB/s" for n in notes for t, a, _ in n.link_gbps if a is not None}
    )
    source = ", ".join(moved) or "the same link bandwidths (other latencies)"
    names = ", ".join(sorted({str(n.scenario) for n in notes}))
    head = (
        f"Re-priced from the replay at {source} (scenario {names}), not replayed: the "
        "loads re-timed for the new link, the queues and prefill run again, the cache "
        "hits kept."
    )
    if all(n.exact for n in notes):
        return [
            head,
            "Exact: every request finished in the same order among the arrivals and was "
            "routed as in that replay, so these figures equal a replay at these settings.",
        ]
    moved_n = sum(n.reordered for n in notes)
    rerouted = sum(n.rerouted for n in notes)
    runs = sum(n.runs for n in notes)
    main = all(n.main_exact for n in notes)
    return [
        head,
        f"Approximate: over the {runs} runs re-timed (the trace's rate and the rate "
        f"search's), {moved_n:,} request completions moved among the arrivals and "
        f"{rerouted:,} routes would have changed, so some cache hits may differ from a "
        "replay's"
        + (" (the run at the trace's rate is exact)" if main else "")
        + ". The replay at these settings runs in the background and replaces this "
        "answer; the page then says how far off it was.",
    ]


def reprice_error(before, after) -> str:
    """How far a re-priced answer was from the replay that replaced it, in words."""
    a, b = before.replay, after.replay
    verdict = (
        f"the same verdict ({after.verdict})"
        if before.verdict == after.verdict
        else f"the verdict {before.verdict} where the replay gives {after.verdict}"
    )
    ttft = rate = 0.0
    if a is not None and b is not None:
        for s in b.scenarios:
            r = a.get(s.name)
            if r is None:
                continue
            for x, y in ((r.ttft_mean_s, s.ttft_mean_s), (r.ttft_p90_s, s.ttft_p90_s)):
                if y:
                    ttft = max(ttft, abs(x - y) / y)
            if r.max_rate_scale and s.max_rate_scale:
                rate = max(rate, abs(r.max_rate_scale - s.max_rate_scale) / s.max_rate_scale)
    return (
        f"Replayed: the re-priced answer shown before had {verdict}; its mean and p90 TTFTs "
        f"were within {ttft:.2%} and its highest rates under the SLO within {rate:.1%} of "
        "the replay's."
    )


def analysis_of(cur: Current, opts):
    """The analysis of the trace on screen for ``opts`` (``AnalyzeOptions``): from the
    prefetch or an earlier page when it got there first, from the remembered replays
    when it needs none, else run here with a progress bar (every layer remembered)."""
    from app.prefetch import analysis_key, prefetcher

    pf = prefetcher()
    key = analysis_key(cur, opts)
    ahead = pf.get(key)
    if ahead is not None:
        CALLS["prefetched"] += 1
        return ahead
    with pf.foreground():
        result = _decided_now(cur, opts)
        if result is None:
            with progress("Running the analysis", 100) as advance:
                CALLS["analysis"] += 1
                result = run_whatif(cur, opts, advance, on_run=replays.count_run)
    pf.put(key, result)
    return result


@dataclass(frozen=True, slots=True)
class Answer:
    """What the Recommendation page shows for the settings asked.

    ``result`` is the analysis for them, or, while their replays run in the background
    (``pending``), the last one shown (``stale``: drawn greyed with a progress bar). A
    latency-first analysis whose sensitivity replays (other instance counts) are not
    ready yet is shown at once without those rows (``partial``); the verdict, sizing
    and money do not depend on them."""

    result: Any  # analyzer.advisor.AnalysisResult
    stale: bool = False
    pending: Any = None  # the background job's key, polled by the page
    partial: str = ""  # what the result leaves out until ``pending`` is done
    # The scenarios re-priced from a replay at other link speeds rather than replayed
    # (``analyzer.replay.memo.Repriced``): ``result`` is then that re-priced analysis,
    # shown until ``pending`` (the replay at these settings) replaces it.
    repriced: tuple = ()
    # Set by the page once it has drawn: the background replay of a re-priced answer
    # starts then, leaving the cores to the drawing until then.
    drawn: threading.Event | None = None


def answer(cur: Current, opts, shown=None) -> Answer:
    """The Recommendation's answer for ``opts`` without waiting for a replay when there
    is something to show meanwhile: ``shown`` is the last result the page showed for
    this trace (None on the first visit: then the analysis runs here, with progress)."""
    from dataclasses import replace

    from app.prefetch import analysis_key, prefetcher

    pf = prefetcher()
    key = analysis_key(cur, opts)
    ahead = pf.get(key)
    if ahead is not None:
        CALLS["prefetched"] += 1
        return Answer(ahead)
    with pf.foreground():
        # Decided from the remembered replays, or, where only a link's bandwidth or
        # latency moved, with those replays re-priced at once (``notes`` says which).
        now, notes = _repriced_now(cur, opts)
    if now is not None and not notes:
        CALLS["analysis"] += 1
        CALLS["decided_now"] += 1
        pf.put(key, now)
        return Answer(now)
    if shown is None or pf.failed(key):
        # Nothing to show meanwhile, or the background run failed: run here, with the
        # progress bar, where an error shows as the page's message.
        return Answer(analysis_of(cur, opts))
    memo = replay_memo()
    # The replay at these settings, in the background; behind a re-priced answer it
    # starts once the page has drawn that answer.
    drawn = threading.Event() if now is not None else None
    pf.run_now(
        key,
        lambda gate: run_whatif(cur, opts, gate=gate, memo=memo, on_run=replays.count_run),
        drawn,
    )
    if now is not None:
        return Answer(now, pending=key, repriced=notes, drawn=drawn)
    if opts.thresholds.objective == "ttft" and opts.sensitivity_replays:
        # The rows for other instance counts are replays of their own; the rest of the
        # analysis may be all remembered.
        with pf.foreground():
            quick = _decided_now(cur, replace(opts, sensitivity_replays=False))
        if quick is not None:
            return Answer(quick, pending=key, partial="the rows for other instance counts")
    return Answer(shown, stale=True, pending=key)


def reports(cur: Current, result) -> Callable[[str], str]:
    """The HTML, Markdown or JSON report of :func:`analysis`'s result, as ``kvpool
    analyze`` writes them (``analyzer.report``): ``reports(cur, result)("html")``,
    rendered once per analysis and format, when first asked (the HTML's charts take
    about a second, so they are drawn when a download button is clicked, not on every
    what-if)."""

    def render(kind: str) -> str:
        def make() -> str:
            from analyzer.report import ReportDocument, render_html, render_json, render_markdown

            fn = {"html": render_html, "md": render_markdown, "json": render_json}[kind]
            return fn(ReportDocument.of(result))

        return _remember(("report", kind, cur.content, cur.ingest_key, repr(result.options)), make)

    return render
