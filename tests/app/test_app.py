"""The dashboard under ``streamlit.testing.v1.AppTest``: every page, the what-if controls,
the cache (ingestion not redone), and bad input shown as messages, never tracebacks."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from analyzer.report.document import report_json
from app import answers, compute, replays
from app.command import ENV_INPUT, ENV_MAX_UPLOAD_MB

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app" / "streamlit_app.py"
TIMEOUT_S = 180
PAGES = {
    "views/overview.py": "Workload overview",
    "views/reuse.py": "Prefix reuse",
    "views/capacity.py": "Capacity",
    "views/cost.py": "Cost model",
    "views/replay.py": "Replay",
    "views/recommend.py": "Recommendation",
}


def write_sample(path: Path, requests: int = 240, profile: str = "chat") -> Path:
    """A small synthetic OpenAI chat-completions log (analyzer.synth), deterministic."""
    from analyzer.synth import SynthConfig, generate

    generate(SynthConfig(profile=profile, requests=requests, seed=1), path, fmt="openai")
    return path


AZURE_CSV = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.2000000,1200,12\n"
    "2023-11-16 18:15:53.5000000,880,230\n"
)


@pytest.fixture(autouse=True)
def _no_draw_linger(monkeypatch) -> None:
    """No headless page is drawn by a browser: the Recommendation's pages here let the
    prefetch go on at once (a linger's timer would otherwise fire into a later test's
    stopped worker processes, which the prefetch's hold is global to)."""
    from app import prefetch

    monkeypatch.setattr(prefetch, "DRAW_S", 0.0)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return write_sample(tmp_path_factory.mktemp("dash") / "chat.jsonl")


@pytest.fixture
def at(sample: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv(ENV_INPUT, str(sample))
    monkeypatch.delenv(ENV_MAX_UPLOAD_MB, raising=False)
    app = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    app.run()
    assert_clean(app)
    return app


def assert_clean(at: AppTest) -> None:
    """No exception and no error box on the page."""
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def charts(at: AppTest) -> list[tuple[dict, dict[str, pd.DataFrame]]]:
    """Every Vega-Lite chart on the page: its spec and its datasets as DataFrames."""
    out = []
    for chart in at.get("vega_lite_chart"):
        proto = chart.proto
        tables = {
            d.name: pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in proto.datasets
        }
        out.append((json.loads(proto.spec), tables))
    return out


def rule_marks(at: AppTest) -> dict[str, float]:
    """The labelled vertical rules (knee, HBM sizes) of the capacity chart: label -> x."""
    marks: dict[str, float] = {}
    for _, tables in charts(at):
        for frame in tables.values():
            if "label" in frame.columns:
                x = next(c for c in frame.columns if c.startswith("capacity_"))
                marks.update(dict(zip(frame["label"], frame[x], strict=True)))
    return marks


def _container_key(n) -> str | None:
    """The key of a keyed container (``st.container(key=...)``), else None."""
    block_id = str(getattr(getattr(n, "proto", None), "id", "") or "")
    if type(n).__name__ == "Block" and block_id.startswith("$$ID-"):
        return block_id.split("-", 2)[2]  # "$$ID-<hash>-<key>"
    return None


def keyed_blocks(node) -> dict[str, set[str]]:
    """The page's keyed containers: key -> the keys of the widgets drawn inside it."""
    out: dict[str, set[str]] = {}

    def widgets(n) -> set[str]:
        found = {n.key} if getattr(n, "key", None) else set()
        for child in getattr(n, "children", {}).values():
            found |= widgets(child)
        return found

    def walk(n) -> None:
        key = _container_key(n)
        if key is not None:
            out[key] = widgets(n)
        for child in getattr(n, "children", {}).values():
            walk(child)

    walk(node)
    return out


def keyed_places(node, at: tuple[int, ...] = ()) -> dict[str, tuple[int, ...]]:
    """The page's keyed containers: key -> its place (child indices from ``node``)."""
    key = _container_key(node)
    out: dict[str, tuple[int, ...]] = {} if key is None else {key: at}
    for i, child in getattr(node, "children", {}).items():
        out |= keyed_places(child, (*at, i))
    return out


def metric(at: AppTest, label_start: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(label_start))


def test_load_page_opens_the_given_trace(at: AppTest, sample: Path) -> None:
    from analyzer.ingest import open_trace

    trace = open_trace([sample]).trace
    assert at.title[0].value == "Load a trace"
    assert at.subheader[0].value == "Loaded: chat.jsonl"
    assert metric(at, "Requests") == f"{trace.n_requests:,}" == "240"
    assert metric(at, "Sessions") == f"{len(trace.session_names):,}"
    assert metric(at, "Prompt tokens") == f"{int(trace.prompt_tokens.sum()):,}"
    assert any("chat.jsonl (openai)" in c.value for c in at.caption)


@pytest.mark.slow
@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_renders(at: AppTest, page: str) -> None:
    at.switch_page(page).run()
    assert_clean(at)
    assert at.title[0].value == PAGES[page]
    if page != "views/recommend.py":
        assert charts(at), f"{page} shows no chart"


def test_pages_share_one_ingestion(at: AppTest) -> None:
    before = compute.CALLS["ingest"]
    for page in PAGES:
        at.switch_page(page).run()
        assert_clean(at)
    assert compute.CALLS["ingest"] == before


def test_changing_controls_updates_figures_without_reingesting(at: AppTest) -> None:
    at.switch_page("views/capacity.py").run()
    # the sample's own model is priced by default; start from Llama-3.1-8B on one GPU
    at.selectbox(key="ctl.model").set_value("llama-3.1-8b")
    at.selectbox(key="ctl.tp").set_value(1).run()
    at.radio(key="capacity.unit").set_value("GiB").run()
    assert_clean(at)
    ingest0, reuse0 = compute.CALLS["ingest"], compute.CALLS["reuse"]
    before = rule_marks(at)
    knee_before = next(v for k, v in before.items() if k.startswith("knee"))

    # A bigger model: more KV bytes per token, so the knee moves right in GiB.
    at.selectbox(key="ctl.model").set_value("llama-3.1-70b")
    at.selectbox(key="ctl.tp").set_value(4).run()
    assert_clean(at)
    after = rule_marks(at)
    knee_after = next(v for k, v in after.items() if k.startswith("knee"))
    # Llama-3.1-70B stores 327,680 B per token against 131,072 B for 8B (K and V x layers x
    # KV heads x head dim x 2 bytes: 80 x 8 x 128 against 32 x 8 x 128, each model's config.json).
    assert knee_after == pytest.approx(knee_before * 327_680 / 131_072)
    assert any("llama-3.1-70b" in k and "4x" in k for k in after)

    # More instances: the "HBM x N instances" rule moves with N.
    hbm_one = next(v for k, v in after.items() if k.startswith("HBM per instance"))
    at.number_input(key="ctl.instances").set_value(8).run()
    assert_clean(at)
    marks = rule_marks(at)
    assert marks["HBM x 8 instances"] == pytest.approx(8 * hbm_one)

    # Neither control re-read the trace or re-measured reuse.
    assert compute.CALLS["ingest"] == ingest0
    assert compute.CALLS["reuse"] == reuse0


def test_pool_bandwidth_moves_the_break_even_chart(at: AppTest) -> None:
    at.switch_page("views/cost.py").run()
    assert_clean(at)
    ingest0 = compute.CALLS["ingest"]

    def link_rules() -> dict[str, float]:
        for _, tables in charts(at):
            for frame in tables.values():
                if "link" in frame.columns:
                    return dict(zip(frame["link"], frame["bandwidth_gbps"], strict=True))
        raise AssertionError("no break-even chart")

    tier = compute.control_defaults().pool_tier

    def pool() -> list[float]:  # the pool links with a figure set, named for it
        return [v for k, v in link_rules().items() if k.startswith(f"{tier} link at")]

    # Every command starts from the pool tier's catalog figure (an empty field in the
    # sidebar, None in ClusterConfig), shown under the tier's own name.
    assert pool() == [] and link_rules()[tier] == compute.tier(tier).bandwidth_gbps
    at.number_input(key="ctl.pool_gbps").set_value(80.0).run()
    assert_clean(at)
    assert pool() == [80.0]
    at.number_input(key="ctl.pool_gbps").set_value(None).run()
    assert pool() == []
    assert tier in link_rules()
    assert compute.CALLS["ingest"] == ingest0


def test_replay_reruns_on_instances_but_not_ingest(at: AppTest) -> None:
    at.switch_page("views/replay.py").run()
    assert_clean(at)
    ingest0, replay0 = compute.CALLS["ingest"], compute.CALLS["replay"]
    # The replay without the rate search is the searched replay's first run: no new run.
    at.checkbox(key="replay.search").uncheck().run()
    assert compute.CALLS["replay"] == replay0
    at.number_input(key="ctl.instances").set_value(1).run()
    assert_clean(at)
    assert compute.CALLS["replay"] == replay0 + 4  # each of the four scenarios, once
    assert any("1 instance of" in c.value for c in at.caption)
    # Back to a setting seen before: remembered.
    at.number_input(key="ctl.instances").set_value(4).run()
    assert compute.CALLS["replay"] == replay0 + 4
    # The pool's bandwidth reaches only the pooled scenario.
    pooled0 = compute.CALLS["replay:pooled"]
    at.number_input(key="ctl.pool_gbps").set_value(7.0).run()
    assert_clean(at)
    assert compute.CALLS["replay"] == replay0 + 5
    assert compute.CALLS["replay:pooled"] == pooled0 + 1
    assert compute.CALLS["ingest"] == ingest0


def _open_path(at: AppTest, path: Path) -> None:
    at.switch_page("views/load.py").run()
    at.radio(key="load.how").set_value("Path on this machine").run()
    at.text_input(key="load.path").input(str(path))
    at.button(key="load.open_path").click().run()


def test_count_only_trace_is_explained_on_every_page(at: AppTest, tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(AZURE_CSV)
    _open_path(at, azure)
    assert_clean(at)
    assert any("count-only" in w.value for w in at.warning)
    for page in ("views/reuse.py", "views/capacity.py", "views/replay.py"):
        at.switch_page(page).run()
        assert_clean(at)
        assert any("count-only" in w.value for w in at.warning), page
    at.switch_page("views/overview.py").run()
    assert_clean(at)
    assert metric(at, "Requests") == "4"
    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    assert any("data-verdict='insufficient-data'" in m.value for m in at.markdown)


def test_missing_path_is_an_error_message(at: AppTest, tmp_path: Path) -> None:
    _open_path(at, tmp_path / "nope.jsonl")
    assert not at.exception
    assert any("no such file" in e.value for e in at.error)
    _open_path(at, tmp_path)
    assert not at.exception
    assert any("is a directory" in e.value for e in at.error)


def test_unreadable_upload_is_an_error_message(at: AppTest) -> None:
    at.radio(key="load.how").set_value("Upload a file").run()
    at.file_uploader(key="load.upload").upload("garbage.jsonl", b"\x00\x01 not a log\n{]\n")
    at.run()
    assert not at.exception
    assert at.error, "an unreadable upload must say so"
    # The app keeps running: another page still works once a good trace is chosen.
    at.radio(key="load.how").set_value("Bundled sample").run()
    assert not at.exception


def test_upload_over_the_limit_is_refused(at: AppTest, monkeypatch) -> None:
    monkeypatch.setenv(ENV_MAX_UPLOAD_MB, "1")
    at.radio(key="load.how").set_value("Upload a file").run()
    at.file_uploader(key="load.upload").upload("big.jsonl", b"{}\n" * 400_000)
    at.run()
    assert not at.exception
    assert any("over the 1 MB upload limit" in e.value for e in at.error)


def test_good_upload_is_ingested(at: AppTest, sample: Path) -> None:
    at.radio(key="load.how").set_value("Upload a file").run()
    data = sample.read_bytes()[:200_000]
    data = data[: data.rfind(b"\n") + 1]
    at.file_uploader(key="load.upload").upload("part.jsonl", data)
    at.run()
    assert_clean(at)
    assert at.subheader[0].value == "Loaded: part.jsonl"
    assert int(metric(at, "Requests")) == data.count(b"\n")


CALIBRATION = ROOT / "tests" / "fixtures" / "cost" / "ttft_calibration.csv"


@pytest.mark.skipif(not CALIBRATION.exists(), reason="cost calibration fixture not present")
def test_calibration_upload_shows_fitted_against_measured(at: AppTest) -> None:
    at.switch_page("views/cost.py").run()
    at.file_uploader(key="cost.calibration").upload(
        "ttft.csv", CALIBRATION.read_bytes(), "text/csv"
    )
    at.run()
    assert_clean(at)
    points = next(
        frame
        for _, tables in charts(at)
        for frame in tables.values()
        if "measured_s" in frame.columns and "model" in frame.columns
    )
    err = (points.predicted_s - points.measured_s).abs() / points.measured_s
    by_model = err.groupby(points.model).mean()
    # The fit is to these very points: it must beat the uncalibrated catalog model.
    assert by_model["fitted"] < by_model["catalog"]
    assert any("Cross-validated error" in m.value for m in at.markdown)


def test_bad_calibration_csv_is_an_error_message(at: AppTest) -> None:
    at.switch_page("views/cost.py").run()
    at.file_uploader(key="cost.calibration").upload("bad.csv", b"prompt_tokens,ttft_s\n10,0.1\n")
    at.run()
    assert not at.exception
    assert any("ttft" in e.value or "column" in e.value for e in at.error)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [None, 32])
def test_report_download_matches_kvpool_analyze(sample: Path, block_size: int | None) -> None:
    """The recommendation's JSON report is what `kvpool analyze` (with the load page's
    block size as --block-size) writes for the same input and the default controls,
    byte for byte."""
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.ingest import IngestOptions
    from analyzer.report import ReportDocument, render_json
    from app import controls, state

    cur = compute.ingest((str(sample),), state.IngestChoice(block_size=block_size).key())
    w = controls.default_whatif()
    result = answers.analysis(cur, w, 0.5)
    report = answers.reports(cur, result)
    html, markdown, payload = report("html"), report("md"), report("json")
    expected = render_json(
        ReportDocument.of(
            run_analysis([str(sample)], AnalyzeOptions(ingest=IngestOptions(block_size=block_size)))
        )
    )
    assert payload == expected
    assert json.loads(payload)["inputs"][0]["name"] == "input-1"  # no file names by default
    assert html.lstrip().lower().startswith("<!doctype html")
    assert json.loads(payload)["verdict"]["verdict"] in markdown


def _progress_script() -> None:
    import streamlit as st

    from app import compute

    @st.cache_resource
    def work(n: int, _advance) -> int:
        for _ in range(n):
            _advance(1)
        return n * 2

    for total in (10, None):
        with compute.progress("Working", total) as advance:
            st.write(f"result {work(10, advance)} {total}")


def test_progress_inside_cached_work_replays_cleanly() -> None:
    """Progress updates made inside a cached function are not recorded, so a cache hit
    on the next run neither redraws a stale bar nor fails to find its container."""
    app = AppTest.from_function(_progress_script, default_timeout=30)
    app.run()
    assert_clean(app)
    app.run()  # every call is a cache hit now
    assert_clean(app)
    assert [m.value for m in app.markdown] == ["result 20 10", "result 20 None"]
    assert not app.get("progress")  # bars are removed once the work is done


def test_cost_page_works_when_the_trace_does_not(at: AppTest, tmp_path: Path) -> None:
    bad = tmp_path / "empty.jsonl"
    bad.write_text("\n")
    _open_path(at, bad)
    assert not at.exception
    assert at.error  # the load page says the file has nothing usable
    at.switch_page("views/cost.py").run()
    assert_clean(at)
    assert charts(at)
    at.switch_page("views/overview.py").run()
    assert not at.exception
    assert at.error  # pages that need the trace repeat why it cannot be read


@pytest.mark.skipif(not CALIBRATION.exists(), reason="cost calibration fixture not present")
def test_fitted_model_can_drive_the_replay(at: AppTest) -> None:
    def prefill_gpu_s() -> list[float]:
        frame = at.table[0].value  # shown as "1,234.5 GPU-s"
        return [float(v.split()[0].replace(",", "")) for v in frame["prefill GPU time"]]

    at.switch_page("views/replay.py").run()
    at.checkbox(key="replay.search").uncheck().run()
    assert_clean(at)
    catalog = prefill_gpu_s()
    assert any("catalog cost model" in c.value for c in at.caption)

    at.switch_page("views/cost.py").run()
    at.file_uploader(key="cost.calibration").upload(
        "ttft.csv", CALIBRATION.read_bytes(), "text/csv"
    )
    at.run()
    at.checkbox(key="cost.use_fit").check().run()
    assert_clean(at)
    ingest0 = compute.CALLS["ingest"]

    at.switch_page("views/replay.py").run()
    assert_clean(at)
    assert any("fitted to ttft.csv" in c.value for c in at.caption)
    fitted = prefill_gpu_s()
    assert fitted != catalog  # the fit rescales compute time, so GPU-seconds move
    assert fitted[0] > 0
    assert compute.CALLS["ingest"] == ingest0


def test_gate_projections_show_seconds_as_seconds(at: AppTest, sample: Path) -> None:
    """The baseline gate projects a mean TTFT in seconds, the main gate fractions."""
    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    projected = [c.value for c in at.caption if c.value.startswith("Projected by the replay")]
    baseline = next(c for c in projected if "mean ttft s" in c)
    value = float(baseline.split("mean ttft s ")[1].split(" s")[0])
    assert value > 0 and "%" not in baseline


def test_recommendation_opens_with_the_summary_in_ms_gpus_and_money(
    at: AppTest, sample: Path
) -> None:
    """The page's first text is the report's three-sentence summary; the money table, the
    side-by-side table and the glossary follow, with words rather than JSON keys."""
    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    # The first text shown (a style element, which draws nothing, may come before it).
    first = next(m.value for m in at.markdown if not m.value.startswith("<style>"))
    assert " ms" in first and "GPU" in first and ("$" in first or "not priced" in first)
    subheaders = [h.value for h in at.subheader]
    assert "GPUs and money" in subheaders
    assert "Other GPUs and models on this log" in subheaders
    assert any(e.label == "Glossary" for e in at.expander)
    for frame in [*at.dataframe, *at.table]:
        assert "network_per_node_gbps" not in frame.value.to_string()


def test_node_shape_and_dram_scope_controls_reach_the_replay() -> None:
    """The sidebar's GPUs per node and DRAM scope are the replay's and the analysis's."""
    from dataclasses import replace

    from app import controls

    w = controls.default_whatif()
    assert (w.gpus_per_node, w.dram_scope) == (8, "instance")  # `kvpool analyze`'s defaults
    w = replace(w, gpus_per_node=2, dram_scope="node", instances=4)
    cfg = replays.cluster_config(w)
    assert (cfg.gpus_per_node, cfg.dram_scope, cfg.nodes) == (2, "node", 2)
    opts = replays.analyze_options(w, 0.5)
    assert (opts.gpus_per_node, opts.dram_scope) == (2, "node")


@pytest.mark.slow
def test_neighbouring_what_ifs_are_ready_before_the_click(at: AppTest, sample: Path) -> None:
    """After the Recommendation, half and twice the instances and the neighbouring pool
    networks are analysed in the background; clicking one then runs no replay."""
    from app import prefetch

    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    pf = prefetch.prefetcher()
    assert pf.wait(TIMEOUT_S)
    replay0, ahead0 = compute.CALLS["replay"], compute.CALLS["prefetched"]
    instances = compute.control_defaults().instances
    at.number_input(key="ctl.instances").set_value(instances * 2).run()
    assert_clean(at)
    assert compute.CALLS["prefetched"] == ahead0 + 1
    assert compute.CALLS["replay"] == replay0
    banner = next(m.value for m in at.markdown if "data-verdict" in m.value)
    # The prefetched answer is `kvpool analyze`'s for the same settings.
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.replay import ClusterConfig

    twice = AnalyzeOptions(cluster=ClusterConfig(instances=instances * 2))
    fresh = run_analysis([str(sample)], twice)
    assert f"data-verdict='{fresh.verdict}'" in banner
    assert f"{instances * 2} instances" in " ".join(c.value for c in at.caption)


@pytest.mark.slow
def test_thresholds_redecide_without_a_replay(at: AppTest, sample: Path, monkeypatch) -> None:
    """A decision threshold no replay reads re-decides at once from the remembered
    probes, on the page's thread, as `kvpool analyze` would; the latency-first objective,
    which plans every option on the baseline's GPUs, replays only what that adds, in the
    background."""
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.advisor.figures import Thresholds
    from analyzer.advisor.replay import ProbeStore
    from app import prefetch

    # The background prefetch replays neighbouring clusters on its own schedule and
    # bumps the same counters; it is tested by itself above. Here only the page counts,
    # from a server that remembers nothing yet.
    prefetch.prefetcher().wait(TIMEOUT_S)
    monkeypatch.setattr(prefetch, "after_analysis", lambda cur, opts: None)
    store, pf = ProbeStore(), prefetch.Prefetcher()
    monkeypatch.setattr(answers, "probe_store", lambda: store)
    monkeypatch.setattr(prefetch, "prefetcher", lambda: pf)

    strict = Thresholds(min_reuse=0.99)
    expected = run_analysis([str(sample)], AnalyzeOptions(thresholds=strict)).verdict
    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    replay0 = compute.CALLS["replay"]
    threads: list[str] = []
    counted = replays.count_run
    monkeypatch.setattr(
        replays,
        "count_run",
        lambda name: (threads.append(threading.current_thread().name), counted(name)),
    )
    at.number_input(key="ctl.th.min_reuse").set_value(99.0).run()
    assert_clean(at)
    assert any(f"data-verdict='{expected}'" in m.value for m in at.markdown)
    assert not any("data-stale" in m.value for m in at.markdown)
    assert compute.CALLS["replay"] == replay0 and threads == []
    at.number_input(key="ctl.th.min_reuse").set_value(30.0).run()
    at.radio(key="ctl.th.objective").set_value("ttft").run()
    assert_clean(at)
    assert pf.wait(TIMEOUT_S)
    assert set(threads) <= {"kvpool-whatif"}
    at.run()
    assert_clean(at)
    ttft = run_analysis([str(sample)], AnalyzeOptions(thresholds=Thresholds(objective="ttft")))
    assert any(f"data-verdict='{ttft.verdict}'" in m.value for m in at.markdown)


def test_errors_name_the_controls_not_the_flags(at: AppTest) -> None:
    from app.state import gui_words

    assert gui_words("raise --tp or give --local-capacity-tokens") == (
        "raise 'Tensor parallel (GPUs per instance)' or give 'HBM prefix cache per instance'"
    )
    assert gui_words("--unknown-flag stays") == "--unknown-flag stays"
    # A 70B model does not fit one H100: the replay says so in the sidebar's words.
    at.switch_page("views/replay.py").run()
    at.selectbox(key="ctl.tp").set_value(1)
    at.selectbox(key="ctl.model").set_value("llama-3.1-70b").run()
    assert not at.exception
    shown = " ".join(e.value for e in at.error)
    assert "Tensor parallel (GPUs per instance)" in shown, shown
    assert "--" not in shown


@pytest.mark.slow
def test_pinned_configurations_are_compared_and_exported(at: AppTest, sample: Path) -> None:
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.replay import ClusterConfig
    from analyzer.report import figures
    from app import compare

    at.switch_page("views/recommend.py").run()
    at.button(key="cmp.pin").click().run()
    instances = compute.control_defaults().instances
    at.number_input(key="ctl.instances").set_value(instances * 2).run()
    assert_clean(at)
    # Replayed in the background unless prefetched already; then the page shows it.
    from app import prefetch

    assert prefetch.prefetcher().wait(TIMEOUT_S)
    at.run()
    assert_clean(at)
    table = next(d.value for d in at.dataframe if "GPUs" in d.value.columns)
    assert table.option.tolist() == ["A: reference", f"B: instances {instances * 2}"]
    assert table.GPUs.tolist() == [instances, instances * 2]
    # Each row is `kvpool analyze`'s answer for its settings.
    twice = run_analysis(
        [str(sample)], AnalyzeOptions(cluster=ClusterConfig(instances=instances * 2))
    )
    assert table.verdict.tolist()[1] == figures.VERDICT_TEXT[twice.verdict]
    rec = figures.RECOMMENDED_SCENARIO[twice.verdict]
    assert table["p90 TTFT, recommended"].tolist()[1] == figures.seconds(
        twice.replay.get(rec).ttft_p90_s
    )
    rows = figures.comparison_rows([twice, twice])
    md = compare.with_comparison("md", "# report\n", rows)
    assert "## Configurations compared" in md and "B: as pinned first" in md
    html = compare.with_comparison("html", "<html><body></body></html>", rows)
    assert html.index("Configurations compared") < html.index("</body>")
    assert compare.with_comparison("json", "{}", rows) == "{}"
    at.button(key="cmp.clear").click().run()
    assert not any("GPUs" in d.value.columns for d in at.dataframe)


@pytest.mark.slow
def test_a_change_needing_replays_keeps_the_last_answer_until_ready(
    at: AppTest, sample: Path, monkeypatch
) -> None:
    """Another router (not prefetched): the page answers at once with the previous
    verdict, greyed (``data-stale``), while the options are sized again in the
    background; the next run shows the new answer, `kvpool analyze`'s for the same
    settings."""
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.advisor.replay import ProbeStore
    from analyzer.replay import ClusterConfig
    from app import prefetch

    prefetch.prefetcher().wait(TIMEOUT_S)
    monkeypatch.setattr(prefetch, "after_analysis", lambda cur, opts: None)
    store, pf = ProbeStore(), prefetch.Prefetcher()
    monkeypatch.setattr(answers, "probe_store", lambda: store)
    monkeypatch.setattr(prefetch, "prefetcher", lambda: pf)
    threads: list[str] = []
    counted = replays.count_run
    monkeypatch.setattr(
        replays,
        "count_run",
        lambda name: (threads.append(threading.current_thread().name), counted(name)),
    )
    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    first = next(m.value for m in at.markdown if "data-verdict" in m.value)
    places_before = keyed_places(at.main)
    threads.clear()
    at.selectbox(key="ctl.router").set_value("round-robin").run()
    assert_clean(at)
    greyed = next(m.value for m in at.markdown if "data-verdict" in m.value)
    assert "data-stale='1'" in greyed
    assert greyed.replace(" data-stale='1'", "") == first
    # Greyed and inert: the previous verdict and figures. Left usable: the comparison
    # and the downloads (of the answer shown, as the caption says).
    # The page keeps its containers (keys and places) and greys them by style, so the
    # browser restyles them rather than drawing them anew.
    from app.views import recommend

    keyed = keyed_blocks(at.main)
    assert keyed_places(at.main) == places_before
    styles = [m.value for m in at.markdown if m.value.startswith("<style>")]
    assert recommend.STALE_CSS in styles and recommend.FRESH_CSS not in styles
    for key in recommend.GREYED:
        assert f".st-key-{key}" in recommend.STALE_CSS and key in keyed
    usable = keyed["kvpool-compare"]
    assert {"cmp.pin", "dl.html", "dl.md", "dl.json"} <= usable
    assert not usable & set().union(*(keyed[k] for k in recommend.GREYED))
    assert "st-key-kvpool-compare" not in recommend.STALE_CSS
    assert any("answer shown" in c.value for c in at.caption)
    assert pf.wait(TIMEOUT_S)
    # Every option the change reaches was sized again, and none on the page's thread.
    assert threads and set(threads) == {"kvpool-whatif"}
    at.run()
    assert_clean(at)
    banner = next(m.value for m in at.markdown if "data-verdict" in m.value)
    assert "data-stale" not in banner
    assert recommend.STALE_CSS not in [m.value for m in at.markdown]
    fresh = run_analysis([str(sample)], AnalyzeOptions(cluster=ClusterConfig(router="round-robin")))
    assert f"data-verdict='{fresh.verdict}'" in banner
    assert "router round-robin" in " ".join(c.value for c in at.caption)


@pytest.mark.slow
def test_a_pool_bandwidth_replays_only_the_pooled_option(
    at: AppTest, sample: Path, monkeypatch
) -> None:
    """The pool's bandwidth (not prefetched): only the pooled option's plan reads it, so
    only it is sized again, in the background, while the page shows the previous answer
    greyed; the next run shows `kvpool analyze`'s verdict for the same settings."""
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.advisor.replay import ProbeStore
    from analyzer.replay import ClusterConfig
    from app import prefetch

    prefetch.prefetcher().wait(TIMEOUT_S)
    monkeypatch.setattr(prefetch, "after_analysis", lambda cur, opts: None)
    store, pf = ProbeStore(), prefetch.Prefetcher()
    monkeypatch.setattr(answers, "probe_store", lambda: store)
    monkeypatch.setattr(prefetch, "prefetcher", lambda: pf)
    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    ran: list[tuple[str, str]] = []
    counted = replays.count_run
    monkeypatch.setattr(
        replays,
        "count_run",
        lambda name: (ran.append((threading.current_thread().name, name)), counted(name)),
    )
    at.number_input(key="ctl.pool_gbps").set_value(3.0).run()
    assert_clean(at)
    banner = next(m.value for m in at.markdown if "data-verdict" in m.value)
    assert "data-stale='1'" in banner
    assert pf.wait(TIMEOUT_S)
    assert ran and {t for t, _ in ran} == {"kvpool-whatif"}
    assert {n for _, n in ran} == {"pooled"}
    at.run()
    assert_clean(at)
    banner = next(m.value for m in at.markdown if "data-verdict" in m.value)
    assert "data-stale" not in banner
    fresh = run_analysis([str(sample)], AnalyzeOptions(cluster=ClusterConfig(pool_gbps=3.0)))
    assert f"data-verdict='{fresh.verdict}'" in banner


@pytest.mark.slow
def test_a_price_redecides_without_a_replay(at: AppTest, sample: Path, monkeypatch) -> None:
    """The GPU's price, moved on the page, reaches the money (as `kvpool analyze
    --gpu-hour-usd`) and replays nothing."""
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.cost.prices import PriceOverrides
    from app import prefetch

    monkeypatch.setattr(prefetch, "after_analysis", lambda cur, opts: None)
    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    replay0 = compute.CALLS["replay"]
    gpu = compute.control_defaults().gpu
    at.number_input(key=f"ctl.price.gpu_hour_usd.{gpu}").set_value(9.5).run()
    assert_clean(at)
    assert compute.CALLS["replay"] == replay0
    assert not any("data-stale" in m.value for m in at.markdown)
    import html

    from analyzer.report.document import ReportDocument

    def lines(opts: AnalyzeOptions) -> tuple[str, list[str]]:
        doc = ReportDocument.of(run_analysis([str(sample)], opts))
        return doc.verdict, list(doc.summary)

    verdict, expected = lines(AnalyzeOptions(prices=PriceOverrides(gpu_hour_usd=9.5)))
    assert expected != lines(AnalyzeOptions())[1]  # the price shows in the summary's money
    banner = next(m.value for m in at.markdown if "data-verdict" in m.value)
    assert f"data-verdict='{verdict}'" in banner
    assert all(html.escape(t) in banner for t in expected)


def test_a_neighbour_being_prefetched_is_not_started_twice_when_asked_for() -> None:
    """The user clicks the setting the prefetch is computing: it runs on (no second run
    of it, no pause while a page computes), and the page sees its progress and answer."""
    from app.prefetch import Prefetcher

    pf = Prefetcher()
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def neighbour(gate):
        calls.append("neighbour")
        started.set()
        release.wait(TIMEOUT_S)
        gate(10)  # would wait for the page, were it not asked for
        gate(5)
        return "answer"

    pf.submit([("k", neighbour)])
    assert started.wait(TIMEOUT_S)
    pf.run_now("k", lambda gate: calls.append("again"))
    with pf.foreground():  # a page computing meanwhile
        release.set()
        deadline = time.monotonic() + TIMEOUT_S
        while pf.get("k") is None and time.monotonic() < deadline:
            assert pf.running("k") is not None or pf.get("k") is not None
            time.sleep(0.01)
    assert pf.get("k") == "answer"
    assert pf.running("k") is None
    assert calls == ["neighbour"]
    assert pf.wait(TIMEOUT_S)


def _proc_state(pid: int) -> tuple[str, int]:
    """A process's state letter and CPU ticks used (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[11]) + int(fields[12])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_the_prefetch_is_stopped_while_the_page_computes_and_finishes_when_it_is_idle(
    monkeypatch,
) -> None:
    """The prefetch's processes run at the server's priority (a niced one starved on a
    busy machine), are stopped where they are while the page computes, using no CPU,
    and finish their work once the page is idle again."""
    import os

    from analyzer.replay.run import start_workers
    from app import workers
    from app.prefetch import Prefetcher

    monkeypatch.setattr(workers, "MIN_REQUESTS", 0)
    pf = Prefetcher(hold=workers.hold_prefetch)
    pool = workers.pool("prefetch", 0)
    assert pool is not None
    try:
        start_workers(pool, workers._size("prefetch"))
        pids = list(pool._processes)
        assert pids
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert [os.getpriority(os.PRIO_PROCESS, p) for p in pids] == [mine] * len(pids)
        n = 60_000_000  # a second or more of one core's work
        running = threading.Event()

        def neighbour(gate):
            got = pool.submit(sum, range(n))
            running.set()
            return got.result()

        pf.submit([("neighbour", neighbour)])
        assert running.wait(TIMEOUT_S)
        with pf.foreground():  # the page computes
            time.sleep(0.3)  # any step it was in the middle of is over: it stays put
            before = [_proc_state(p) for p in pids]
            time.sleep(1.0)
            after = [_proc_state(p) for p in pids]
            assert {state for state, _ in after} == {"T"}  # stopped
            assert [ticks for _, ticks in after] == [ticks for _, ticks in before]
            assert pf.get("neighbour") is None
        assert pf.wait(TIMEOUT_S)
        assert pf.get("neighbour") == sum(range(n))
        assert "T" not in {_proc_state(p)[0] for p in pids}
    finally:
        workers.shutdown()


@pytest.mark.slow
def test_replays_in_the_warm_worker_processes_equal_kvpool_analyze(
    tmp_path: Path, monkeypatch
) -> None:
    """The dashboard replays in worker processes it keeps across what-ifs (the page's
    pool, and the prefetch's, stopped while the page computes): the analysis, per-model replays of a
    multi-model log included, is `kvpool analyze`'s, byte for byte, and the processes
    are reused from one what-if to the next."""
    from dataclasses import replace

    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.replay.memo import ReplayMemo
    from app import controls, state, workers

    log = write_sample(tmp_path / "mixed.jsonl", requests=300, profile="mixed")
    monkeypatch.setattr(workers, "MIN_REQUESTS", 0)
    cur = compute.ingest((str(log),), state.IngestChoice().key())
    w = controls.default_whatif()
    try:
        for parallel, instances in ((True, w.instances), (False, 2 * w.instances)):
            opts = answers.analysis_options(cur, replace(w, instances=instances), 0.5)
            got = answers.run_whatif(cur, opts, memo=ReplayMemo(), parallel=parallel)
            cli = run_analysis([str(log)], AnalyzeOptions(cluster=opts.cluster))
            assert report_json(got) == report_json(cli)
        assert len(report_json(cli)["models"]["per_model"]) > 1  # the per-model replays ran
        page = workers.pool("page", 0)
        assert page is workers.pool("page", 0) and page is not workers.pool("prefetch", 0)
    finally:
        workers.shutdown()


def test_the_repriced_answers_error_is_measured_against_the_replay() -> None:
    """The words shown once the replay replaces a re-priced answer: the verdicts, and
    the largest relative differences of the TTFTs and of the highest rates."""
    from types import SimpleNamespace as NS

    from analyzer.advisor.figures import ReplayFigures, ScenarioFigures

    def result(verdict, p90, rate):
        sc = ScenarioFigures("pooled", 0.5, 0.1, p90, 0.3, rate)
        return NS(verdict=verdict, replay=ReplayFigures((sc,)))

    words = answers.reprice_error(result("a", 0.11, 30.0), result("a", 0.10, 32.0))
    assert "the same verdict (a)" in words
    assert "within 10.00%" in words and "within 6.2%" in words
    words = answers.reprice_error(result("a", 0.10, 32.0), result("b", 0.10, 32.0))
    assert "the verdict a where the replay gives b" in words and "within 0.00%" in words


def test_the_prefetch_stays_stopped_while_the_browser_draws() -> None:
    """``foreground(linger_s=...)`` keeps the prefetch stopped after the page's script is
    over, for the browser to draw what it sent, then lets it go on; a neighbour waiting
    at its next step goes on only then."""
    from app.prefetch import Prefetcher

    holds: list[bool] = []
    pf = Prefetcher(hold=holds.append)
    stepped = threading.Event()

    def neighbour(gate):
        gate(1)  # waits while the page computes or is drawn
        stepped.set()
        return "answer"

    with pf.foreground(linger_s=0.5):
        pf.submit([("k", neighbour)])
        assert holds == [True]
    assert not stepped.wait(0.2)  # the page's script is over, the browser still draws
    assert holds == [True]
    assert stepped.wait(TIMEOUT_S)
    assert pf.wait(TIMEOUT_S) and pf.get("k") == "answer"
    assert holds == [True, False]


def test_even_the_neighbour_asked_for_waits_while_the_page_is_drawn() -> None:
    """The user asks for the neighbour being prefetched: it runs on while the page
    computes (its answer is the one awaited), but its processes stop while the browser
    draws what the page shows meanwhile (``linger_s``), then go on."""
    from app.prefetch import Prefetcher

    holds: list[bool] = []
    pf = Prefetcher(hold=holds.append)
    started, release = threading.Event(), threading.Event()

    def neighbour(gate):
        started.set()
        release.wait(TIMEOUT_S)
        return "answer"

    pf.submit([("k", neighbour)])
    assert started.wait(TIMEOUT_S)
    with pf.foreground(linger_s=0.5):
        assert holds == [True]  # the page computes: the neighbour not asked for stops
        pf.run_now("k", lambda gate: None)
        assert holds == [True, False]  # asked for: it runs on
    assert holds == [True, False, True]  # the page is drawn: it stops meanwhile
    release.set()
    assert pf.wait(TIMEOUT_S) and pf.get("k") == "answer"
    deadline = time.monotonic() + TIMEOUT_S
    while holds[-1] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert holds == [True, False, True, False]


def test_recommendation_of_a_short_prefix_log_says_loading_never_pays(
    at: AppTest, tmp_path: Path
) -> None:
    """A log of one-shot calls with a 20-word system prompt, whose break-even bandwidth
    is never reached, gets its verdict on the page with the reason in words."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "undefined", Path(__file__).resolve().parents[1] / "report" / "test_undefined_figures.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _open_path(at, mod.one_shot_log(tmp_path / "oneshot.jsonl"))
    assert_clean(at)
    at.switch_page("views/recommend.py").run()
    assert_clean(at)
    assert any("data-verdict='not-worth-it'" in m.value for m in at.markdown)
    words = [m.value for m in at.markdown] + [
        frame.value.to_string() for frame in [*at.dataframe, *at.table]
    ]
    assert any("never beats recomputing" in w for w in words)
    assert not any(" inf GB/s" in w for w in words)


@pytest.mark.slow
def test_isolation_keys_every_page_and_the_recommendation_prices_it(
    tmp_path: Path, monkeypatch
) -> None:
    """Tenants: 'each tenant alone' keys the trace by tenant on every page (the reuse
    page's ceiling is the keyed trace's), and the Recommendation shows the isolation
    section of its report."""
    from analyzer.ingest import open_trace
    from analyzer.reuse import ReuseOptions, analyze_reuse
    from analyzer.reuse.isolation import isolate

    log = write_sample(tmp_path / "saas.jsonl", requests=300, profile="saas")
    monkeypatch.setenv(ENV_INPUT, str(log))
    app = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    app.run()
    assert_clean(app)
    trace = open_trace([log]).trace
    want = {
        p: analyze_reuse(isolate(trace, p), ReuseOptions()).ceiling_hit_rate
        for p in ("shared", "tenant")
    }
    assert want["tenant"] < want["shared"]
    app.switch_page("views/reuse.py").run()
    assert metric(app, "Ceiling, steady") == f"{want['shared']:.1%}"
    app.selectbox(key="ctl.isolation").set_value("tenant").run()
    assert_clean(app)
    assert metric(app, "Ceiling, steady") == f"{want['tenant']:.1%}"
    app.switch_page("views/recommend.py").run()
    assert_clean(app)
    assert any(s.value == "Tenant isolation" for s in app.subheader)
    assert any("a cache salt per tenant" in c.value for c in app.caption)
    assert any("Whether a salt would hold on each stack" in c.value for c in app.caption)


@pytest.mark.slow
def test_the_dashboard_starts_isolated_by_the_tenant_field_it_was_given(
    tmp_path: Path, monkeypatch
) -> None:
    """`kvpool dashboard --isolation tenant --tenant-field account.slug`: a log whose
    tenants sit in a field of its own is keyed by them from the first page, as `kvpool
    reuse --tenant-field account.slug --isolation tenant` keys it."""
    from analyzer.ingest import IngestOptions, open_trace
    from analyzer.reuse import ReuseOptions, analyze_reuse
    from analyzer.reuse.isolation import isolate
    from app.command import ENV_ISOLATION, ENV_TENANT_FIELD

    synth = write_sample(tmp_path / "synth.jsonl", requests=300, profile="saas")
    log = tmp_path / "own-field.jsonl"
    with synth.open() as src, log.open("w") as out:
        for line in src:
            row = json.loads(line)
            row["account"] = {"slug": row["request"]["metadata"].pop("tenant")}
            out.write(json.dumps(row) + "\n")
    named = open_trace([log], IngestOptions(tenant_field="account.slug")).trace
    assert len(named.tenant_names) == 12 and len(open_trace([log]).trace.tenant_names) == 1
    want = analyze_reuse(isolate(named, "tenant"), ReuseOptions()).ceiling_hit_rate
    assert want < analyze_reuse(named, ReuseOptions()).ceiling_hit_rate
    monkeypatch.setenv(ENV_INPUT, str(log))
    monkeypatch.setenv(ENV_ISOLATION, "tenant")
    monkeypatch.setenv(ENV_TENANT_FIELD, "account.slug")
    compute.control_defaults.clear()  # read once per server, as `kvpool dashboard` sets it
    try:
        app = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
        app.run()
        assert_clean(app)
        assert app.text_input(key="load.tenant_field").value == "account.slug"
        app.switch_page("views/reuse.py").run()
        assert_clean(app)
        assert app.selectbox(key="ctl.isolation").value == "tenant"
        assert metric(app, "Ceiling, steady") == f"{want:.1%}"
    finally:
        compute.control_defaults.clear()


@pytest.mark.slow
def test_the_dashboard_speaks_the_reports_language(at: AppTest, sample: Path) -> None:
    """Tables in words and units (no key names, no bare fractions), the report's option
    names and descriptions, and the reuse shares as the report defines them (share of
    the counted prompt tokens, from report.json's reuse.analysis.sources)."""
    from analyzer.advisor.words import OPTION_DESCRIPTION, OPTION_NAME
    from analyzer.report import figures
    from app import controls, state

    cur = compute.ingest((str(sample),), state.IngestChoice().key())
    doc = report_json(answers.analysis(cur, controls.default_whatif(), 0.5))
    shares = doc["reuse"]["analysis"]["sources"]["share_of_prompt"]
    raw = {"prefix_tokens", "capacity_tokens", "bandwidth_gbps", "capacity_blocks", "latency_s"}
    for page in ("views/reuse.py", "views/capacity.py", "views/cost.py", "views/replay.py"):
        at.switch_page(page).run()
        assert_clean(at)
        for frame in (d.value for d in [*at.dataframe, *at.table]):
            assert not raw & set(frame.columns), (page, list(frame.columns))
            assert not any("_" in str(c) for c in frame.columns), (page, list(frame.columns))
            for col in frame.columns:  # numbers are written out: no float cell is a fraction
                assert frame[col].dtype != float, (page, col)
        if page == "views/reuse.py":
            table = next(d.value for d in at.table if "share of prompt tokens" in d.value)
            want = {figures.SOURCE_LABELS[k]: figures.percent(v) for k, v in shares.items()}
            assert dict(zip(table["source"], table["share of prompt tokens"], strict=True)) == want
        if page == "views/replay.py":
            table = next(d.value for d in at.table if "option" in d.value)
            assert set(table["option"]) <= set(OPTION_NAME.values())
            listed = " ".join(m.value for m in at.markdown)
            # the page replays `kvpool replay`'s options; those the report plans too
            # carry the report's names and descriptions
            shown = {k for k, v in OPTION_NAME.items() if v in set(table["option"])}
            assert shown & set(doc["replay"]["scenarios"])
            for name in shown:
                assert f"**{OPTION_NAME[name]}**: {OPTION_DESCRIPTION[name]}" in listed
            assert all(t.endswith(" ms") for t in table["TTFT p90"])
            ttft = next(s for s, _ in charts(at) if "ms" in json.dumps(s.get("layer", s)))
            assert "time to first token (ms)" in json.dumps(ttft)


def test_log_axes_print_numbers_as_a_reader_writes_them(at: AppTest) -> None:
    """Every logarithmic axis has a number format (Vega's default prints 1e+2 or 100m)."""
    seen = 0
    for page in ("views/capacity.py", "views/cost.py", "views/replay.py"):
        at.switch_page(page).run()
        assert_clean(at)

        def walk(spec: dict, page: str = page) -> None:
            nonlocal seen
            for ch in ("x", "y"):
                enc = (spec.get("encoding") or {}).get(ch) or {}
                if (enc.get("scale") or {}).get("type") == "log":
                    seen += 1
                    assert (enc.get("axis") or {}).get("format"), (page, enc)
            for sub in spec.get("layer", []):
                walk(sub)

        for spec, _ in charts(at):
            walk(spec)
    assert seen >= 4


def test_a_what_if_says_what_changed_and_the_sidebar_what_is_in_force(at: AppTest) -> None:
    """After the pool link is set to 2 GB/s the sidebar says 2 GB/s is in force (not the
    tier's catalog figure), and the Replay page says which setting changed and which of
    its figures moved, before -> after."""
    at.switch_page("views/replay.py").run()
    assert_clean(at)
    catalog = compute.tier(controls_default_pool_tier()).bandwidth_gbps
    assert any(f"pool link {catalog:g} GB/s" in c.value for c in at.sidebar.caption)
    assert not at.info or not any("What changed" in i.value for i in at.info)
    before = {
        d.value["option"][i]: d.value["TTFT p90"][i]
        for d in at.table[:1]
        for i in range(len(d.value))
    }
    at.number_input(key="ctl.pool_gbps").set_value(2.0).run()
    assert_clean(at)
    assert any("pool link 2 GB/s (as set)" in c.value for c in at.sidebar.caption)
    assert not any(f"pool link {catalog:g} GB/s" in c.value for c in at.sidebar.caption)
    said = next(i.value for i in at.info if "What changed" in i.value)
    assert "pool bandwidth per node (GB/s): catalog → 2" in said
    after = at.table[0].value
    for option, p90 in zip(after["option"], after["TTFT p90"], strict=True):
        moved = f"{option}, p90 TTFT: {before[option]} → {p90}"
        assert (moved in said) == (before[option] != p90), (moved, said)
    # a rerun that changes no setting keeps saying it
    at.run()
    assert any("pool bandwidth per node (GB/s): catalog → 2" in i.value for i in at.info)


def controls_default_pool_tier() -> str:
    return compute.control_defaults().pool_tier
