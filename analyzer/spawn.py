"""Worker processes started by ``spawn`` without re-running the caller's main script."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager

from analyzer.spill import owner


@contextmanager
def main_not_rerun() -> Iterator[None]:
    """Start worker processes without re-running the caller's main script in each.

    A spawned worker first re-imports the parent's ``__main__`` (by module name or file
    path). The workers need only the module of the function they run: under ``kvpool``
    the main script imports the whole command line (typer, rich, every command's
    options; 0.4 s of a worker's start), and under the dashboard ``__main__`` is the
    Streamlit page script, which each worker would re-run outside a server, seconds of
    work and hundreds of "missing ScriptRunContext" warnings. While the workers start,
    ``__main__`` names neither a module nor a file, so nothing is re-run."""

    owner()  # the workers inherit it: their spill folders name this process
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, object] = {
        k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__
    }
    main.__dict__["__spec__"] = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _ready() -> bool:
    return True


def start_processes(pool: Executor, n: int) -> list[Future[bool]]:
    """Have ``pool`` start ``n`` worker processes now rather than at its first real task
    (a process pool starts one at each submit until it has them all): one trivial task
    each, submitted without re-running the main script. Wait on the returned futures to
    know they are up."""
    with main_not_rerun():
        return [pool.submit(_ready) for _ in range(n)]
