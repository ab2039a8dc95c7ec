"""Whole-process measurements of a command: wall and CPU seconds, peak RSS of its tree.

``run(argv)`` starts the command, samples the summed resident memory of the process
and all its descendants every 50 ms from ``/proc`` (so worker processes count, as they
would against a machine's memory), and reads user + system CPU seconds of the whole
tree from ``wait4`` (children reaped by the command are included). The peak of the
sum is a sampled figure: a spike shorter than 50 ms can be missed; ``maxrss_bytes`` is
the kernel's exact high-water mark of the largest single process, for comparison.
Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class Run:
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int  # summed over the process tree, sampled
    maxrss_bytes: int  # largest single process, exact
    returncode: int
    stdout: str
    stderr: str


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants."""
    kids = _children()
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        with contextlib.suppress(OSError, IndexError, ValueError):  # the process just ended
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
        stack.extend(kids.get(p, ()))
    return total


def user_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a user's command runs in: this one, without a progress bar, and
    without ``PYTHONDONTWRITEBYTECODE`` (which a sandbox may set): an installed package
    runs from bytecode (pip compiles it at install; an editable install writes it on
    first import), and compiling kvpool's modules from source every run costs about
    0.1 s that no user pays."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**base, "KVPOOL_NO_PROGRESS": "1", **(env or {})}


def run(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> Run:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=user_env(env),
        cwd=cwd,
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out_chunks: list[str] = []
    err_chunks: list[str] = []
    readers = [
        threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True),  # type: ignore[union-attr]
        threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True),  # type: ignore[union-attr]
    ]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_bytes=max(peak[0], usage.ru_maxrss * 1024),
        maxrss_bytes=usage.ru_maxrss * 1024,
        returncode=proc.returncode,
        stdout="".join(out_chunks),
        stderr="".join(err_chunks),
    )


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"
