"""Progress bars for long work, silent when output is not a terminal or in tests.

Library code reports progress through a :class:`Progress` callback so that the CLI
(rich), the dashboard (st.progress) and tests (nothing) can each show it their way.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# advance(n) is called with the amount of work done since the last call.
Advance = Callable[[float], None]

# The CLI sets its level: -q (WARNING) hides progress bars, -v (DEBUG) logs each stage.
log = logging.getLogger("kvpool")


def _noop(_: float) -> None:
    return None


def enabled() -> bool:
    if os.environ.get("KVPOOL_NO_PROGRESS") or not log.isEnabledFor(logging.INFO):
        return False
    return sys.stderr.isatty()


@contextmanager
def progress(description: str, total: float | None = None, *, unit: str = "") -> Iterator[Advance]:
    """Yield an ``advance(n)`` callable driving a rich progress bar on stderr.

    With ``-v`` each stage is also logged with its wall time (a log line only: nothing
    the analysis computes or writes depends on the clock)."""
    start = time.perf_counter()
    try:
        yield from _bar(description, total, unit)
    finally:
        log.debug("%s: %.2f s", description, time.perf_counter() - start)


def _bar(description: str, total: float | None, unit: str) -> Iterator[Advance]:
    if not enabled():
        yield _noop
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn("[bold]{task.description}"), BarColumn()]
    columns += [MofNCompleteColumn()] if total else []
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description + (f" ({unit})" if unit else ""), total=total)
        yield lambda n: bar.advance(task, n)
