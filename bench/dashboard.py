"""What-if timings of the dashboard, measured as a user meets them: in headless Chromium,
from the click to the page's updated answer, on the bundled ``mixed`` sample.

    .venv/bin/python bench/dashboard.py [--trace traces/mixed.jsonl.zst] [--port 0]

Starts ``kvpool dashboard TRACE`` (a real server), drives Debian's Chromium through
Playwright and prints, against the targets of the what-if issue:

* first Recommendation page, from opening it on a fresh server      (target < 15 s)
* what-ifs that need no replay: a decision threshold, the objective
  (latency-first: its sensitivity replays run in the background)   (target < 1 s)
* what-ifs prefetched while the user read (twice the instances after ``--read-s``;
  twice the pool's bandwidth after ``--read-again-s``)               (target < 1 s)
* the pool's bandwidth, not prefetched (40 GB/s): the seconds to the verdict re-priced
  from the remembered replay at the catalog's bandwidth (analyzer/replay/reprice.py;
  target < 1 s), and to the verdict replayed in the background that replaces it
* a what-if that needs a replay (3 instances: every scenario, target < 8 s): the
  seconds to the previous answer greyed on screen, and to the updated verdict,
  replayed in the background
* the Replay page: four scenarios with and without the SLO rate search (target < 8 s)
* the server's terminal: lines written, and Streamlit warnings among them

A timing ends with the first frame the browser draws once the app reports that its
script run is over (Streamlit's ``data-test-script-state``), timestamped by the page, so
it includes the browser's drawing. The machine these
figures come from may be shared: a run on a loaded 2-core box can be twice as slow as
on an idle one, so read them with ``nproc`` and the load average printed beside them.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import user_env

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
RUNNING = '[data-testid="stApp"][data-test-script-state="running"]'
TIMEOUT_MS = 600_000


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(trace: Path, port: int, log: Path) -> subprocess.Popen:
    kvpool = Path(sys.executable).with_name("kvpool")
    cmd = [str(kvpool)] if kvpool.exists() else [sys.executable, "-m", "analyzer.cli"]
    env = user_env()
    env.pop("KVPOOL_DASHBOARD_INPUT", None)
    out = log.open("wb")
    proc = subprocess.Popen(
        [*cmd, "dashboard", "--port", str(port), str(trace)],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kvpool dashboard exited with {proc.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.3)
    raise SystemExit("the dashboard did not become healthy in 120 s")


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def settle(page) -> None:
    """Until the script run is over and stays over for a moment."""
    for _ in range(50):
        page.wait_for_selector(IDLE, timeout=TIMEOUT_MS)
        page.wait_for_timeout(250)
        if page.locator(IDLE).count():
            return
    raise RuntimeError("the page kept rerunning")


# Kept by the page itself: the wall-clock time (ms) of the last change to the page's main
# area, and of the first frame drawn after its script state went from running to not
# running (a requestAnimationFrame callback runs before the next frame is drawn; the
# timeout inside it, after that frame).
WATCH = """() => {
  window.__kvpoolLast = 0;
  window.__kvpoolDrawn = 0;
  if (window.__kvpoolObserver) window.__kvpoolObserver.disconnect();
  if (window.__kvpoolState) window.__kvpoolState.disconnect();
  window.__kvpoolObserver = new MutationObserver(() => { window.__kvpoolLast = Date.now(); });
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  window.__kvpoolObserver.observe(main, {subtree: true, childList: true, attributes: true,
                                         characterData: true});
  const app = document.querySelector('[data-testid="stApp"]');
  window.__kvpoolStarted = false;
  window.__kvpoolState = new MutationObserver((records) => {
    // The state each record changed to: the next record's old value, the attribute now
    // for the last. A run counts only once it was seen starting after this was set up:
    // a half-second poll already running at the click is not the click's run.
    const now = app.getAttribute('data-test-script-state');
    let over = false;
    records.forEach((r, i) => {
      const to = i + 1 < records.length ? records[i + 1].oldValue : now;
      if (to === 'running') window.__kvpoolStarted = true;
      if (r.oldValue === 'running' && to !== 'running' && window.__kvpoolStarted) over = true;
    });
    if (over && now === 'notRunning' && !window.__kvpoolDrawn) {
      window.__kvpoolDrawn = -1;
      requestAnimationFrame(() => setTimeout(() => { window.__kvpoolDrawn = Date.now(); }, 0));
    }
  });
  window.__kvpoolState.observe(app, {attributes: true, attributeOldValue: true,
                                     attributeFilter: ['data-test-script-state']});
}"""


def _run(page, action) -> float:
    """Seconds from ``action()`` (a click or an edit) to the first frame the browser drew
    once the run it started was over, timestamped by the page itself.

    Waiting for the page's idle state from outside measured more than that: the
    browser's checks for it run between its frames, so when the page took a moment
    to draw, the half-second poll of a replay running behind the answer (a short run of
    its own) could begin before the check and be waited for too (0.3 to 0.6 s more).
    A short run can be over before the page is ever seen running (the browser may draw
    both states in one frame): then the run ended with the last change to the page's
    main area, which the page also timestamps."""
    page.evaluate(WATCH)
    t0 = time.time()
    action()
    seen = True
    try:
        page.wait_for_selector(RUNNING, timeout=3000)
    except Exception:
        seen = False
    page.wait_for_selector(IDLE, timeout=TIMEOUT_MS)
    took = time.time() - t0
    drawn = 0
    for _ in range(100):  # the frame after the state changed: at most a few frames later
        drawn = page.evaluate("() => window.__kvpoolDrawn")
        if drawn > 0:
            break
        page.wait_for_timeout(20)
    if drawn / 1000 > t0:
        return drawn / 1000 - t0
    if not seen:
        last = page.evaluate("() => window.__kvpoolLast") / 1000
        if last > t0:
            took = last - t0
    return took


def timed(page, action) -> float:
    """Seconds from ``action()`` to the end of the run it starts (:func:`_run`)."""
    took = _run(page, action)
    settle(page)
    return took


def open_page(page, name: str) -> float:
    nav = page.locator('[data-testid="stSidebarNav"]')
    return timed(page, lambda: nav.get_by_text(name, exact=True).click())


def set_number(page, label: str, value: float) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(f"{value:g}")
    box.press("Enter")


def expand(page, title: str) -> None:
    page.locator('[data-testid="stExpander"] summary').filter(has_text=title).first.click()
    page.wait_for_timeout(300)


def verdict(page) -> str:
    return page.locator("[data-testid=kvpool-verdict]").first.get_attribute("data-verdict") or ""


FRESH = "[data-testid=kvpool-verdict]:not([data-stale]):not([data-repriced])"
REPRICED = "[data-testid=kvpool-verdict][data-repriced]"


def timed_verdict(page, action) -> tuple[float, float]:
    """Seconds from ``action()`` to an answer on screen (the run is over: the new verdict,
    or the previous one greyed while the new one is replayed in the background), and to
    the updated verdict (the banner no longer greyed)."""
    t0 = time.time()
    shown = _run(page, action)
    updated = _updated(page, t0, shown)
    settle(page)
    return shown, updated


def _updated(page, t0: float, shown: float) -> float:
    """Seconds from ``t0`` to a fresh verdict at the end of a run: ``shown`` when the run
    that ended then drew it."""
    if page.locator(FRESH).count() and page.locator(IDLE).count():
        return shown
    page.wait_for_selector(FRESH, timeout=TIMEOUT_MS)
    page.wait_for_selector(IDLE, timeout=TIMEOUT_MS)
    return time.time() - t0


def timed_repriced(page, action) -> tuple[float, float, bool]:
    """Seconds from ``action()`` to the end of its run (the re-priced verdict, when the
    page could re-price), to the replayed verdict, and whether the first was
    re-priced."""
    t0 = time.time()
    shown = _run(page, action)
    repriced = page.locator(REPRICED).count() > 0
    updated = _updated(page, t0, shown)
    settle(page)
    return shown, updated, repriced


def wait_prefetch(page, seconds: float) -> None:
    """Let the background prefetch finish while 'the user reads'."""
    page.wait_for_timeout(int(seconds * 1000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=ROOT / "traces" / "mixed.jsonl.zst")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--read-s", type=float, default=60.0, help="time given to the prefetch")
    ap.add_argument(
        "--read-again-s",
        type=float,
        default=30.0,
        help="time given to the prefetch of the pool bandwidth's neighbours",
    )
    args = ap.parse_args()
    if not CHROMIUM.exists():
        raise SystemExit(f"needs Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    from analyzer.report import CHROMIUM_FLAGS

    # A `timeout` or Ctrl-C still stops the server and prints what was measured.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    port = args.port or free_port()
    log = Path(tempfile.mkdtemp(prefix="kvpool-bench-")) / "server.log"
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    proc = start_server(args.trace, port, log)
    started_s = time.perf_counter() - t_start
    rows: list[tuple[str, float, str]] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_FLAGS))
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(f"http://127.0.0.1:{port}", wait_until="domcontentloaded")
            page.get_by_role("heading", name="Load a trace").wait_for(timeout=TIMEOUT_MS)
            settle(page)
            rows.append(("server start to healthy", started_s, ""))

            first = open_page(page, "Recommendation")
            rows.append(("first Recommendation page", first, "< 15 s"))
            before = verdict(page)

            expand(page, "Decision thresholds")
            label = "Pool's least TTFT advantage over host DRAM (%)"
            t = timed(page, lambda: set_number(page, label, 5))
            rows.append(("what-if, no replay (a decision threshold)", t, "< 1 s"))
            t = timed(page, lambda: set_number(page, label, 10))
            rows.append(("what-if, no replay (threshold back)", t, "< 1 s"))
            assert verdict(page) == before
            objective = page.locator('[data-testid="stRadio"]').filter(has_text="Decide on")
            _, t = timed_verdict(page, lambda: objective.get_by_text("ttft", exact=True).click())
            rows.append(("what-if, objective ttft (sensitivity in background)", t, "< 1 s"))
            _, t = timed_verdict(page, lambda: objective.get_by_text("cost", exact=True).click())
            rows.append(("what-if, objective back to cost", t, "< 1 s"))

            wait_prefetch(page, args.read_s)
            _, t = timed_verdict(page, lambda: set_number(page, "Instances", 8))
            rows.append(("what-if, prefetched (instances 4 -> 8)", t, "< 1 s"))
            _, t = timed_verdict(page, lambda: set_number(page, "Instances", 4))
            rows.append(("what-if, seen before (instances back to 4)", t, "< 1 s"))

            expand(page, "Tiers and links")
            bw = "Pool bandwidth per node (GB/s; empty = catalog)"
            # The catalog's figure (empty) has no bandwidth neighbours: 40 GB/s is re-priced
            # from the replay at the catalog's bandwidth, then replayed.
            shown, t, repriced = timed_repriced(page, lambda: set_number(page, bw, 40))
            what = "re-priced verdict" if repriced else "previous answer greyed (not re-priced)"
            rows.append((f"what-if, pool 40 GB/s: click to {what}", shown, "< 1 s"))
            rows.append(("what-if, pool 40 GB/s: click to replayed verdict", t, ""))
            wait_prefetch(page, args.read_again_s)
            _, t = timed_verdict(page, lambda: set_number(page, bw, 80))
            rows.append(("what-if, prefetched (pool 40 -> 80 GB/s)", t, "< 1 s"))

            shown, t = timed_verdict(page, lambda: set_number(page, "Instances", 3))
            rows.append(("what-if, every scenario (instances 3): previous greyed", shown, ""))
            rows.append(("what-if, every scenario (instances 3): updated verdict", t, "< 8 s"))

            open_page(page, "Replay")
            t = timed(page, lambda: set_number(page, "Instances", 5))
            rows.append(("Replay page, 4 scenarios with rate search (instances 5)", t, "< 8 s"))
            page.get_by_text("Find the highest rate under the SLO").click()
            settle(page)
            t = timed(page, lambda: set_number(page, "Instances", 6))
            rows.append(("Replay page, 4 scenarios, no rate search (instances 6)", t, "< 8 s"))
            browser.close()
    finally:
        stop_server(proc)
        # Printed even when a step failed or the run was stopped: what was measured.
        report(args.trace, rows, log, load_before)


def report(
    trace: Path, rows: list[tuple[str, float, str]], log: Path, load_before: tuple[float, ...]
) -> None:
    lines = log.read_text(errors="replace").splitlines()
    warnings = [ln for ln in lines if "ScriptRunContext" in ln or "Warning" in ln]
    load = os.getloadavg()
    print(
        f"kvpool dashboard on {trace.name}; {os.cpu_count()} CPUs, load average "
        f"{load_before[0]:.1f} before, {load[0]:.1f} / {load[1]:.1f} after (1 / 5 min): "
        "timings on a shared box are noisy"
    )
    print(f"{'what':<58} {'seconds':>8}  target")
    for what, secs, target in rows:
        print(f"{what:<58} {secs:>8.2f}  {target}")
    print(f"server terminal: {len(lines)} lines, {len(warnings)} framework warnings")
    for ln in lines[-5:]:
        print(f"  | {ln}", flush=True)


if __name__ == "__main__":
    main()
