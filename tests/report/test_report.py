"""Reports: JSON stable byte for byte, Markdown with the same sections as the HTML, and
the HTML self-contained and opening in real headless Chromium without console errors."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from html import escape as html_escape
from pathlib import Path

import pytest

from analyzer.advisor import AnalyzeOptions, run_analysis
from analyzer.report import (
    CHROMIUM_FLAGS,
    find_chromium,
    render_html,
    render_json,
    render_markdown,
    write_reports,
)
from analyzer.report.document import ReportDocument, report_json
from analyzer.report.outline import sections

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "report"
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("report-logs")
    log = make_logs.high_reuse(d / "high.jsonl")
    r = run_analysis([str(log)], make_logs.pooled_options())
    assert r.verdict == "deploy-pooled"
    return report_json(r)


@pytest.mark.slow
def test_json_is_canonical_and_reloads_to_the_same_reports(doc, tmp_path):
    text = render_json(doc)
    again = json.loads(text)
    assert render_json(again) == text
    assert again["schema"] == "kvpool.report/3"
    # floats are rounded to 6 significant digits; no NaN/Infinity in the document
    assert "NaN" not in text and "Infinity" not in text
    floats: list[float] = []

    def walk(x):
        if isinstance(x, float):
            floats.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(again)
    assert floats and all(float(f"{f:.6g}") == f for f in floats)
    a = write_reports(doc, tmp_path / "a")
    b = write_reports(json.loads(a["json"].read_text()), tmp_path / "b")
    for k in ("json", "md", "html"):
        assert a[k].read_bytes() == b[k].read_bytes(), k


def test_markdown_and_html_carry_the_same_sections(doc):
    md = render_markdown(doc)
    html = render_html(doc)
    titles = [s.title for s in sections(ReportDocument.from_json(doc).report)]
    assert titles[:2] == ["Summary", "Verdict"]
    # the three-sentence summary opens both reports and names ms, GPUs and money
    summary = " ".join(doc["summary"])
    assert len(doc["summary"]) == 3
    assert " ms" in summary and "GPUs" in summary and "$" in summary
    lines = md.split("\n")
    assert lines[2:4] == ["## Summary", ""]
    assert lines[4] == summary
    assert html.index(html_escape(summary[:60])) < html.index("<nav>")
    for t in (
        "GPUs and money",
        "Glossary",
        "Key figures",
        "Prefix reuse",
        "Bandwidth against break-even",
        "Each option replayed at its planned size",
        "Sensitivity: what would change the verdict",
        "Sized recommendation",
        "Recommended settings",
        "Pilot gates",
        "Assumptions and sources",
    ):
        assert t in titles
        assert f"## {t}" in md
        assert f"<h2>{t.replace('(', '(')}</h2>" in html
    assert md.index("deploy-pooled") < md.index("## Key figures")  # verdict first
    for option in (
        "--enable-prefix-caching",
        "global_segment_size",
        "--hicache-storage-backend",
        "chunk_size",
    ):
        assert option in md and option in html


def test_html_is_self_contained_with_inline_svg_charts(doc):
    html = render_html(doc)
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "url(http" not in html
    assert html.count("<svg") == 6  # hit ratio, sources, break-even, TTFT, tiers, network
    assert "<?xml" not in html


def _chromium_or_skip() -> str:
    exe = find_chromium()
    if exe is None:
        pytest.skip("Chromium is not installed (/usr/bin/chromium); `apt-get install chromium`")
    return exe


@pytest.mark.slow
@pytest.mark.e2e
def test_html_opens_in_headless_chromium_without_errors(doc, tmp_path):
    exe = _chromium_or_skip()
    paths = write_reports(doc, tmp_path / "rep")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                exe,
                "--headless",
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--window-size=1200,4000",
                "--enable-logging=stderr",
                "--v=0",
                f"--screenshot={shot}",
                paths["html"].resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 10_000
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln]
    assert not console, console
    # Playwright, when importable, drives the same binary and reports console messages
    # and page errors directly.
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        messages: list[str] = []
        page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
        failed: list[str] = []
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.goto(paths["html"].resolve().as_uri())
        assert page.title() == "kvpool report: deploy-pooled"
        assert page.locator("svg").count() == 6
        page.screenshot(path=str(ARTIFACTS / "report-full.png"), full_page=True)
        browser.close()
    assert not messages and not failed, (messages, failed)


@pytest.mark.slow
@pytest.mark.e2e
def test_pdf_is_written_when_chromium_exists(doc, tmp_path):
    _chromium_or_skip()
    paths = write_reports(doc, tmp_path / "pdf", pdf=True)
    assert paths["pdf"].read_bytes()[:5] == b"%PDF-"


def test_insufficient_data_report_names_what_is_missing(shared_traces, tmp_path):
    path = shared_traces / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    r = run_analysis([str(path)], AnalyzeOptions())
    paths = write_reports(r, tmp_path)
    md = paths["md"].read_text()
    html = paths["html"].read_text()
    assert md.startswith("# kvpool report: **insufficient-data**")
    for text in (md, html):
        assert "prompt content or block hashes" in text
        assert "Before any pilot: collect the data named in the verdict" in text
    assert "<svg" not in html and "## Recommended settings" not in md


def test_thresholds_in_the_text_are_the_runs_own(doc):
    """The report quotes the thresholds the decision used, not the defaults."""
    default = render_markdown(doc)
    assert "at least 30% steady-state prefix reuse" in default
    custom = json.loads(json.dumps(doc))
    custom["options"]["thresholds"].update(min_reuse=0.4)
    text = render_markdown(custom)
    assert "at least 40% steady-state prefix reuse" in text


def test_no_raw_key_names_or_private_files_in_what_a_person_reads(doc):
    """Tables show words and units, not JSON keys; sources are public, not FIELD.md."""
    md = render_markdown(doc)
    for raw in (
        "network_per_node_gbps",
        "pool False",
        "pool True",
        "ttft_reduction >=",
        "FIELD.md",
    ):
        assert raw not in md, raw
    assert "GB/s (" in md and "Gb/s)" in md  # bandwidth in both units
    html = render_html(doc)
    assert 'href="#g-break-even-bandwidth"' in html and 'id="g-break-even-bandwidth"' in html


@pytest.mark.slow
@pytest.mark.parametrize("fails", ["reports", "deploy"])
def test_a_failed_write_leaves_no_folder_or_half_bundle(doc, tmp_path, monkeypatch, fails):
    """A full disk while the reports or the bundle are written: the folder made for the
    run is removed, and a folder that was there keeps no half-built bundle."""
    import errno

    from analyzer.errors import OutputError

    real_write_text = Path.write_text

    def full(self: Path, *args: object, **kwargs: object) -> int:
        if fails == "deploy" and ".deploy.tmp" in self.parts and self.name.endswith(".sh"):
            raise OSError(errno.ENOSPC, "No space left on device")
        if fails == "reports" and self.name.startswith(".report.html."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OutputError, match="No space left on device"):
        write_reports(doc, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(OutputError, match="No space left on device"):
        write_reports(doc, kept, force=True)
    assert kept.is_dir() and not (kept / ".deploy.tmp").exists()
    assert not (kept / "deploy").exists()
    assert not list(kept.iterdir())  # no report without its bundle, nor a temporary
    # a folder holding an earlier run keeps it whole: its reports still match its bundle
    monkeypatch.setattr(Path, "write_text", real_write_text)
    earlier = write_reports(doc, tmp_path / "earlier")
    before = {p: p.read_bytes() for p in (tmp_path / "earlier").rglob("*") if p.is_file()}
    monkeypatch.setattr(Path, "write_text", full)
    other = json.loads(json.dumps(doc))
    other["summary"] = ["another run"]
    with pytest.raises(OutputError, match="No space left on device"):
        write_reports(other, earlier["json"].parent, force=True)
    after = {p: p.read_bytes() for p in (tmp_path / "earlier").rglob("*") if p.is_file()}
    assert after == before


def test_analyze_finds_an_unwritable_report_folder_before_reading_the_logs(tmp_path, monkeypatch):
    """A read-only -o DIR (or disk) used to be found only after the whole analysis."""
    import errno
    import tempfile

    from typer.testing import CliRunner

    from analyzer.advisor import pipeline
    from analyzer.cli import app
    from analyzer.errors import OutputError

    real = tempfile.mkstemp

    def read_only(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if str(kwargs.get("prefix", "")).startswith(".kvpool-probe-"):
            raise PermissionError(errno.EROFS, "Read-only file system")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the logs were read before the output folder was checked")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(pipeline, "run_analysis", never)
    log = tmp_path / "log.jsonl"
    log.write_text('{"timestamp": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    for out, force in ((tmp_path / "new", False), (tmp_path, True), (tmp_path, False)):
        r = CliRunner().invoke(
            app, ["analyze", str(log), "-o", str(out), *(["--force"] if force else [])]
        )
        assert isinstance(r.exception, OutputError), r.output
        assert "Read-only file system" in str(r.exception)
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="a folder's mode does not bind root")
def test_analyze_refuses_a_read_only_report_folder_at_once(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    log = tmp_path / "log.jsonl"
    log.write_text('{"timestamp": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    r = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "analyze", str(log), "-o", str(ro)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 4 and "Permission denied" in r.stderr


def test_inline_code_is_code_in_both_reports(doc):
    """The program's own commands in a sentence (`kvpool validate ...`) are code spans in
    report.md and <code> in report.html, not escaped backticks."""
    from markdown_it import MarkdownIt

    md, page = render_markdown(doc), render_html(doc)
    inline = [c for t in MarkdownIt("commonmark").parse(md) for c in t.children or []]
    spans = {c.content for c in inline if c.type == "code_inline"}
    assert "kvpool validate RESULTS... --report report.json" in spans
    assert "\\`" not in md
    assert "<code>kvpool validate RESULTS... --report report.json</code>" in page
    text_outside_code = re.sub(
        r"<code>.*?</code>", "", page.split("<style>")[0] + page.split("</style>")[1]
    )
    assert "`" not in re.sub(r"<pre>.*?</pre>", "", text_outside_code, flags=re.S)


def test_a_product_with_nothing_to_paste_has_no_empty_code_block(doc):
    """A product the verdict does not deploy keeps its settings table ("(not deployed)")
    and shows no code block, rather than an empty one."""
    from markdown_it import MarkdownIt

    edited = json.loads(json.dumps(doc))
    store = next(p for p in edited["settings"] if p["product"] == "Mooncake Store")
    store["snippet"] = ""
    store["settings"] = [{"option": "(not deployed)", "value": "-", "why": "no pool"}]
    md, page = render_markdown(edited), render_html(edited)
    fences = [t for t in MarkdownIt("commonmark").parse(md) if t.type == "fence"]
    assert fences and all(f.content.strip() for f in fences)
    assert "**Mooncake Store**" not in md and "<h3>Mooncake Store</h3>" not in page
    assert "| Mooncake Store (pooled) | Value | Why |" in md
    assert "<pre><code></code></pre>" not in page
    # the pooled report's own store config is there, with its content
    assert '"global_segment_size"' in render_markdown(doc)


def test_the_ttft_chart_speaks_the_tables_unit_and_names(doc):
    from analyzer.report.charts import charts_possible, ttft_chart

    if not charts_possible():
        pytest.skip("charts cannot be drawn under this address-space limit")
    svg = ttft_chart(ReportDocument.from_json(doc).report)
    assert svg is not None
    assert "TTFT (ms)" in svg and "TTFT (s)" not in svg
    assert "pooled KV store" in svg and "pooled_kv" not in svg
    md = render_markdown(doc)
    assert " ms" in md  # the tables' unit


def test_shared_prefixes_are_described_by_what_is_known_not_a_hash(doc):
    top = doc["reuse"]["analysis"]["top_prefixes"]["by_volume"]
    assert top and all("tenants" in p and "models" in p for p in top)
    md, page = render_markdown(doc), render_html(doc)
    header = "| Shared prefix | Tokens | Requests | Tenants | Models | Reused tokens |"
    assert header in md
    for p in top:
        assert p["hash"] not in md and p["hash"] not in page
    rows = md.split(header)[1].split("\n\n")[0].strip().split("\n")[1:]
    first = rows[0].strip("| ").split(" | ")
    assert first[0] == "#1" and first[1] == f"{top[0]['prefix_tokens']:,}"
    models = ", ".join(top[0]["models"]) or "not named"
    assert first[3] == (f"{top[0]['tenants']:,}" if top[0]["tenants"] is not None else "not named")
    assert first[4] == models
