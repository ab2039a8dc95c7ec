"""The dashboard's replay worker processes, started once per server and kept warm.

A what-if that replays runs its scenarios in worker processes. Starting them for every
replay (a spawned Python importing numpy and the analyzer) cost about a second each
time, and a replay run in one of the server's own threads held Python's global lock
against the page: every click then waited for it. So the server keeps two pools
(:func:`analyzer.replay.run.worker_pool`), started in the background on the first
page, and nothing heavy runs in its own process:

* ``page``: one process per core (at most four), for the replays a user waits for (the
  first Recommendation, a what-if, the Replay page);
* ``prefetch``: as many, for the settings the user may try next (:mod:`app.prefetch`).
  They run at the server's priority while the page needs nothing, and are stopped
  outright (``SIGSTOP``, :func:`hold_prefetch`) while it computes, then continued where
  they were. They once ran at a lower priority (``nice`` 5) instead: on a machine busy
  with other work a niced process gets almost no CPU (a sixth of a core against ten
  busy processes on two cores), so the prefetch of a neighbour had not finished after
  a minute of reading; stopped and continued, it never slows the page and gets a fair
  share of the machine whenever the page is idle. Where processes cannot be stopped
  (Windows) the prefetch runs beside the page.

When the server stops, the processes are stopped with it, a replay they were running
abandoned (:func:`stop`).

Traces under :data:`MIN_REQUESTS` requests are replayed in the calling thread as
before: a small replay is over before a process would have read its arguments.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from contextlib import suppress

MIN_REQUESTS = 2000  # a smaller trace is replayed in the calling thread

_LOCK = threading.Lock()
_POOLS: dict[str, ProcessPoolExecutor] = {}
_HELD = [False]  # whether the prefetch's processes are stopped for the page


def _size(kind: str) -> int:
    """Up to 4 processes, no more than the cores this process may use (its affinity and
    a container's CPU limit)."""
    from analyzer.ingest.parallel import default_jobs

    return max(1, min(default_jobs(), 4))


def pool(kind: str, n_requests: int) -> ProcessPoolExecutor | None:
    """The warm ``kind`` pool ("page" or "prefetch") for a replay of a trace of
    ``n_requests`` requests; None: replay in the calling thread (a small trace)."""
    if n_requests < MIN_REQUESTS:
        return None
    with _LOCK:
        got = _POOLS.get(kind)
        # A pool whose worker died (killed from outside) refuses work: start another.
        if got is None or getattr(got, "_broken", False):
            from analyzer.replay.run import worker_pool

            got = worker_pool(_size(kind))
            if not _POOLS:
                _at_exit(stop)
            _POOLS[kind] = got
        return got


def warm_up() -> None:
    """Start both pools' processes in the background (once per server), so that the
    first replay does not wait for them; returns at once."""
    with _LOCK:
        if "page" in _POOLS:
            return

    def start() -> None:
        from analyzer.replay.run import start_workers

        for kind in ("page", "prefetch"):
            got = pool(kind, MIN_REQUESTS)
            if got is not None:
                start_workers(got, _size(kind))

    threading.Thread(target=start, name="kvpool-workers", daemon=True).start()


def _pids(got: ProcessPoolExecutor | None) -> list[int]:
    return list(getattr(got, "_processes", None) or {}) if got is not None else []


def hold_prefetch(held: bool) -> None:
    """Stop the prefetch's processes where they are (``held``: the page computes), or
    continue them. A process the prefetch pool starts later is continued by the next
    call; one stopped mid-replay holds its memory until then. Nothing where the system
    has no such signals."""
    sig = getattr(signal, "SIGSTOP" if held else "SIGCONT", None)
    with _LOCK:
        _HELD[0] = held
        pids = _pids(_POOLS.get("prefetch"))
    if sig is None:
        return
    for pid in pids:
        with suppress(OSError):  # exited meanwhile
            os.kill(pid, sig)


def shutdown() -> None:
    """Stop both pools once their running replays are over (tests)."""
    hold_prefetch(False)  # a stopped process would never be over
    with _LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for got in pools:
        got.shutdown(wait=True, cancel_futures=True)


def stop() -> None:
    """Stop both pools' processes now, abandoning what they run (the server stops)."""
    with _LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for got in pools:
        # The executor has no public way to end a running task; its processes are ended
        # as multiprocessing ends them, then the executor is told to stop.
        for proc in list(getattr(got, "_processes", {}).values()):
            proc.terminate()
            if hasattr(signal, "SIGCONT"):  # a stopped process takes its SIGTERM once continued
                with suppress(OSError):
                    os.kill(proc.pid, signal.SIGCONT)
        got.shutdown(wait=False, cancel_futures=True)


def _at_exit(fn) -> None:
    """Run ``fn`` as the interpreter exits, before ``concurrent.futures`` waits there for
    the running tasks of every pool (which could be a rate search of seconds)."""
    import atexit

    register = getattr(threading, "_register_atexit", None)  # runs before atexit's
    if register is not None:
        register(fn)
    else:
        atexit.register(fn)
