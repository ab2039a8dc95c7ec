"""End to end: `kvpool dashboard` on a free localhost port, driven in headless Chromium.

Starts the real server (subprocess), waits for Streamlit's health endpoint, loads a
bundled sample from the Load page, opens every page through the sidebar navigation,
saves a full-page screenshot of each under test-artifacts/dashboard/, and fails on any
exception or error box shown in the page.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from analyzer.report import CHROMIUM_FLAGS
from app.state import bundled_samples

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
# (sidebar link text, title the page shows): the order a user would go through them.
PAGES = [
    ("Workload overview", "Workload overview"),
    ("Prefix reuse", "Prefix reuse"),
    ("Capacity", "Capacity"),
    ("Cost model", "Cost model"),
    ("Replay", "Replay"),
    ("Recommendation", "Recommendation"),
]
PAGE_TIMEOUT_MS = 180_000
E2E_SAMPLE = "chat.jsonl.zst"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kvpool() -> list[str]:
    script = Path(sys.executable).with_name("kvpool")
    return [str(script)] if script.exists() else [sys.executable, "-m", "analyzer.cli"]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.fail(f"kvpool dashboard exited with {proc.returncode}:\n{out}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200 and r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"the dashboard at {url} did not become healthy within {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def first_log(tmp_path_factory) -> Path:
    """The log the server opens at start (a new browser session starts on it)."""
    from analyzer.synth import SynthConfig, generate

    first = tmp_path_factory.mktemp("e2e") / "first.jsonl"
    generate(SynthConfig(profile="chat", requests=300, seed=2), first, fmt="openai")
    return first


@pytest.fixture(scope="module")
def dashboard_url(first_log: Path) -> Iterator[str]:
    if not CHROMIUM.exists():
        pytest.skip(f"headless Chromium not installed at {CHROMIUM} (apt-get install chromium)")
    first = first_log
    port = _free_port()
    env = {
        **os.environ,
        "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
        "STREAMLIT_SERVER_HEADLESS": "true",
        "KVPOOL_NO_PROGRESS": "1",
    }
    env.pop("KVPOOL_DASHBOARD_INPUT", None)
    proc = subprocess.Popen(
        [*_kvpool(), "dashboard", "--port", str(port), str(first)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so teardown reaches streamlit too
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url
    finally:
        # Ctrl-C as a terminal would send it, then make sure nothing is left behind.
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        if proc.stdout:
            proc.stdout.close()


def _settle(page, stable_ms: int = 1000) -> None:
    """Wait until the script run has finished: the app reports ``notRunning`` and stays
    so for ``stable_ms`` (a rerun triggered by a click starts a moment later)."""
    idle = '[data-testid="stApp"][data-test-script-state="notRunning"]'
    page.wait_for_timeout(300)
    for _ in range(100):
        page.wait_for_selector(idle, timeout=PAGE_TIMEOUT_MS)
        page.wait_for_timeout(stable_ms)
        if page.locator(idle).count():
            page.wait_for_timeout(300)  # charts draw after the run's last message
            return
    raise AssertionError("the page kept rerunning")


def _assert_no_errors(page, where: str) -> None:
    exceptions = page.locator('[data-testid="stException"]')
    errors = page.locator('[data-testid="stAlertContentError"]')
    texts = [exceptions.nth(i).inner_text() for i in range(exceptions.count())]
    texts += [errors.nth(i).inner_text() for i in range(errors.count())]
    assert not texts, f"{where}: the page shows errors:\n" + "\n---\n".join(texts)


def test_dashboard_pages_in_chromium(dashboard_url: str) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            console_errors: list[str] = []
            page.on("pageerror", lambda exc: console_errors.append(str(exc)))
            page.goto(dashboard_url, wait_until="domcontentloaded")
            page.get_by_role("heading", name="Load a trace").wait_for(timeout=PAGE_TIMEOUT_MS)
            _settle(page)

            page.get_by_text("Loaded: first.jsonl").wait_for(timeout=PAGE_TIMEOUT_MS)
            samples = [p.name for p in bundled_samples()]
            if samples:  # load a bundled sample explicitly, as a user would
                # chat (600 requests) keeps the replay and analysis quick; else the first.
                pick = E2E_SAMPLE if E2E_SAMPLE in samples else samples[0]
                page.get_by_text("Bundled sample", exact=True).click()
                _settle(page)
                page.locator('[data-testid="stSelectbox"]').filter(has_text="Sample").click()
                page.get_by_role("option", name=pick).click()
                page.get_by_role("button", name="Open sample").click()
                _settle(page)
                page.get_by_text(f"Loaded: {pick}").wait_for(timeout=PAGE_TIMEOUT_MS)
            _assert_no_errors(page, "Load a trace")
            page.screenshot(path=str(ARTIFACTS / "0-load.png"), full_page=True)

            for i, (link, title) in enumerate(PAGES, start=1):
                nav = page.locator('[data-testid="stSidebarNav"]')
                nav.get_by_text(link, exact=True).click()
                page.get_by_role("heading", name=title).first.wait_for(timeout=PAGE_TIMEOUT_MS)
                _settle(page)
                _assert_no_errors(page, title)
                slug = title.lower().replace(" ", "-")
                page.screenshot(path=str(ARTIFACTS / f"{i}-{slug}.png"), full_page=True)
            assert not console_errors, f"JavaScript errors in the page: {console_errors}"
        finally:
            browser.close()


# Counts the drawn marks of every chart on the page: coloured pixels on a canvas (axes,
# grid lines and text are grey or black), or filled shapes in an SVG.
CHART_MARKS_JS = """
() => Array.from(document.querySelectorAll('.vega-embed')).map((el) => {
  const canvas = el.querySelector('canvas');
  if (canvas) {
    const ctx = canvas.getContext('2d');
    const {data} = ctx.getImageData(0, 0, canvas.width, canvas.height);
    let coloured = 0;
    for (let i = 0; i < data.length; i += 4) {
      const r = data[i], g = data[i + 1], b = data[i + 2], a = data[i + 3];
      if (a > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 40) coloured++;
    }
    return coloured;
  }
  return el.querySelectorAll('svg .mark-rect path, svg .mark-line path, svg .mark-area path, svg .mark-symbol path').length;
})
"""

# One change per control, away from its default (the changes add up, as in a meeting).
SELECTS = [
    ("Model", "qwen2.5-7b"),
    ("GPU", "h200"),
    ("Tensor parallel (GPUs per instance)", "2"),
    ("KV cache dtype", "fp8"),
    ("GPUs per node", "4"),
    ("Router", "round-robin"),
    ("Eviction policy", "fifo"),
    ("Host DRAM link", "pcie-gen4-dram"),
    ("Host DRAM cache", "one per node, shared by its instances"),
    ("Pool network", "rdma-400"),
]
NUMBERS = [
    ("Instances", 2),
    ("HBM prefix cache per instance (GB; 0 = what the HBM leaves)", 5),
    ("Host DRAM per node (GB)", 64),
    ("DRAM bandwidth (GB/s; empty = catalog)", 10),
    ("DRAM first-byte latency (µs; empty = catalog)", 20),
    ("Pool capacity, whole cluster (GB; 0 = the nodes' DRAM)", 100),
    ("Pool bandwidth per node (GB/s; empty = catalog)", 10),
    ("Pool first-byte latency (µs; empty = catalog)", 50),
    ("TTFT SLO, p90 (s)", 1),
]


def _open(page, link: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_text(link, exact=True).click()
    page.get_by_role("heading", name=link).first.wait_for(timeout=PAGE_TIMEOUT_MS)
    _settle(page)


def _charts_have_marks(page, where: str) -> None:
    marks = page.evaluate(CHART_MARKS_JS)
    assert marks, f"{where}: no chart on the page"
    assert all(m > 0 for m in marks), f"{where}: a chart without marks: {marks}"


def _select(page, label: str, option: str) -> None:
    page.locator('[data-testid="stSelectbox"]').filter(
        has=page.get_by_text(label, exact=True)
    ).first.click()
    page.get_by_role("option", name=option, exact=True).click()


def _number(page, label: str, value: float) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(f"{value:g}")
    box.press("Enter")


# The rows of the page's static tables (st.table), each a list of its cells' text.
TABLE_ROWS_JS = """
() => Array.from(document.querySelectorAll('[data-testid="stTable"] tr')).map(
  (tr) => Array.from(tr.querySelectorAll('th, td')).map((c) => c.innerText.trim()))
"""


def _check_the_reports_language(page, report: dict) -> None:
    """The dashboard's option names and reuse shares are report.json's: on the Replay
    page each option the report planned and the page replayed is under the report's
    name, and on Prefix reuse each source's share is report.json's share of the prompt
    tokens (reuse.analysis.sources.share_of_prompt), in the same words and percent."""
    from analyzer.advisor.words import OPTION_NAME
    from analyzer.report import figures

    _open(page, "Replay")
    rows = page.evaluate(TABLE_ROWS_JS)
    header = next(r for r in rows if r and r[0] == "option")
    shown = {r[0] for r in rows if r and r != header}
    planned = {OPTION_NAME[k] for k in report["replay"]["scenarios"]}
    assert shown & planned, (shown, planned)
    assert shown <= set(OPTION_NAME.values()), shown  # no scenario key as a name
    text = page.locator('[data-testid="stMain"]').inner_text()
    for name in report["replay"]["scenarios"]:
        if OPTION_NAME[name] in shown:
            assert f"{OPTION_NAME[name]}: p90 TTFT" in text, name

    _open(page, "Prefix reuse")
    rows = page.evaluate(TABLE_ROWS_JS)
    shares = {r[0]: r[1] for r in rows if len(r) >= 2 and r[0] != "source"}
    want = report["reuse"]["analysis"]["sources"]["share_of_prompt"]
    assert shares == {figures.SOURCE_LABELS[k]: figures.percent(v) for k, v in want.items()}


def _kvpool_json(args: list[str], tmp: Path) -> dict:
    import json

    subprocess.run([*_kvpool(), *args], cwd=ROOT, check=True, capture_output=True, timeout=600)
    return json.loads(tmp.read_text())


def test_replay_and_verdict_equal_the_cli_and_every_control_works(
    dashboard_url: str, first_log: Path, tmp_path: Path
) -> None:
    """A fresh session (on the log the server opened): the Replay page's hit rates are
    `kvpool replay --json`'s and the Recommendation's verdict `kvpool analyze`'s for the
    default settings, its options and the reuse shares report.json's names and
    figures; then each sidebar control is changed once on the Replay page, with
    no error box and every chart drawing marks."""
    from playwright.sync_api import sync_playwright

    from analyzer.advisor.words import OPTION_NAME
    from analyzer.report import figures

    replay_json = _kvpool_json(
        ["replay", str(first_log), "--json", str(tmp_path / "replay.json")],
        tmp_path / "replay.json",
    )
    report = _kvpool_json(
        ["analyze", str(first_log), "-o", str(tmp_path / "report")],
        tmp_path / "report" / "report.json",
    )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(dashboard_url, wait_until="domcontentloaded")
            page.get_by_role("heading", name="Load a trace").wait_for(timeout=PAGE_TIMEOUT_MS)
            _settle(page)
            page.get_by_text(f"Loaded: {first_log.name}").wait_for(timeout=PAGE_TIMEOUT_MS)

            _open(page, "Replay")
            _assert_no_errors(page, "Replay")
            _charts_have_marks(page, "Replay")
            text = page.locator('[data-testid="stMain"]').inner_text()
            for name, s in replay_json["scenarios"].items():
                shown = f"prompt tokens from cache: {figures.percent(s['hit_rate'], 2)}"
                assert shown in text, f"{name}: {shown!r} not on the Replay page"

            _open(page, "Recommendation")
            _assert_no_errors(page, "Recommendation")
            verdict = page.locator("[data-testid=kvpool-verdict]").first
            assert verdict.get_attribute("data-verdict") == report["verdict"]["verdict"]
            money = page.evaluate(TABLE_ROWS_JS)
            options = {r[0] for r in money if r and r[0] in set(OPTION_NAME.values())}
            assert options == {OPTION_NAME[k] for k in report["fleet"]}, options

            _check_the_reports_language(page, report)

            _open(page, "Replay")
            page.get_by_text("Find the highest rate under the SLO").click()
            _settle(page)
            page.locator('[data-testid="stExpander"] summary').filter(
                has_text="Tiers and links"
            ).first.click()
            _settle(page)
            for label, option in SELECTS:
                _select(page, label, option)
                _settle(page)
                _assert_no_errors(page, f"{label} = {option}")
                _charts_have_marks(page, f"{label} = {option}")
            for label, value in NUMBERS:
                _number(page, label, value)
                _settle(page)
                _assert_no_errors(page, f"{label} = {value}")
                _charts_have_marks(page, f"{label} = {value}")
            page.get_by_role("slider").first.press("ArrowLeft")
            _settle(page)
            _assert_no_errors(page, "warm-up")
            _charts_have_marks(page, "warm-up")
            page.screenshot(path=str(ARTIFACTS / "8-controls.png"), full_page=True)
        finally:
            browser.close()


FRESH = "[data-testid=kvpool-verdict]:not([data-stale])"


def _fresh_verdict(page) -> str:
    """The verdict once the page shows the answer for the settings asked (the previous
    one stays on screen, greyed, while a replay runs in the background)."""
    page.wait_for_selector(FRESH, timeout=PAGE_TIMEOUT_MS)
    _settle(page)
    page.wait_for_selector(FRESH, timeout=PAGE_TIMEOUT_MS)
    return page.locator(FRESH).first.get_attribute("data-verdict") or ""


def test_recommendation_what_ifs_update_the_verdict_as_the_cli_decides(
    dashboard_url: str, first_log: Path, tmp_path: Path
) -> None:
    """On the Recommendation page: the objective (decided at once, its sensitivity rows
    from the background) and an instance count that needs every scenario replayed (the
    previous answer greyed meanwhile) each end on `kvpool analyze`'s verdict for the same
    settings, with no error box."""
    from playwright.sync_api import sync_playwright

    def cli(*flags: str) -> str:
        out = tmp_path / "-".join(f.strip("-") for f in flags)
        report = _kvpool_json(
            ["analyze", str(first_log), "-o", str(out), *flags], out / "report.json"
        )
        return report["verdict"]["verdict"]

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(dashboard_url, wait_until="domcontentloaded")
            page.get_by_role("heading", name="Load a trace").wait_for(timeout=PAGE_TIMEOUT_MS)
            _settle(page)
            _open(page, "Recommendation")
            _assert_no_errors(page, "Recommendation")
            assert _fresh_verdict(page) == cli()

            page.locator('[data-testid="stExpander"] summary').filter(
                has_text="Decision thresholds"
            ).first.click()
            radio = page.locator('[data-testid="stRadio"]').filter(has_text="Decide on")
            radio.get_by_text("ttft", exact=True).click()
            assert _fresh_verdict(page) == cli("--objective", "ttft")
            _assert_no_errors(page, "objective ttft")
            radio.get_by_text("cost", exact=True).click()
            _fresh_verdict(page)

            # The answer's containers are greyed and then refreshed in place, not drawn
            # anew (a remount cost the browser 1.4 s on the bundled sample): the same
            # elements, marked here, are still on the page afterwards.
            kept = (".st-key-kvpool-answer", ".st-key-kvpool-answer-rest")
            page.evaluate(
                "(sels) => sels.forEach((s) => { document.querySelector(s).__kvpoolKept = 1; })",
                list(kept),
            )
            _number(page, "Instances", 3)
            page.wait_for_selector(
                '[data-testid="stApp"][data-test-script-state="notRunning"]',
                timeout=PAGE_TIMEOUT_MS,
            )
            _assert_no_errors(page, "instances 3, replaying")
            assert _fresh_verdict(page) == cli("--instances", "3")
            assert page.evaluate(
                "(sels) => sels.map((s) => document.querySelector(s).__kvpoolKept === 1)",
                list(kept),
            ) == [True, True]
            _assert_no_errors(page, "instances 3")
            caption = page.locator('[data-testid="stMain"]').inner_text()
            assert "sized by replaying from 3 instances" in caption  # the settings line
            page.screenshot(path=str(ARTIFACTS / "9-whatif.png"), full_page=True)
        finally:
            browser.close()
