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

pytestmark = pytest.mark.e2e

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
def dashboard_url(tmp_path_factory) -> Iterator[str]:
    if not CHROMIUM.exists():
        pytest.skip(f"headless Chromium not installed at {CHROMIUM} (apt-get install chromium)")
    from analyzer.synth import SynthConfig, generate

    # Opened at start; the test then loads a bundled sample from the Load page.
    first = tmp_path_factory.mktemp("e2e") / "first.jsonl"
    generate(SynthConfig(profile="chat", requests=300, seed=2), first, fmt="openai")
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
