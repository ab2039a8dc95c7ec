"""The dashboard's caching layer: every analyzer call the pages make goes through here.

Each stage result is cached with ``st.cache_resource`` (results are shared, read-only
objects: no copy per rerun) under a key made of the input's content hash and only the
options that stage depends on. So moving a what-if control re-runs the replay, never the
ingestion; changing the model re-prices, never re-measures reuse.

``CALLS`` counts how often each stage really ran (cache misses); tests read it to check
that a control change did not redo ingestion.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import streamlit as st

from analyzer.errors import InputError, Location

CALLS: Counter[str] = Counter()

Advance = Callable[[float], None]
Key = tuple[tuple[str, Any], ...]


def as_key(values: dict[str, Any]) -> Key:
    """A hashable, order-independent cache key from plain option values."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in values.items()))


# --- progress ----------------------------------------------------------------------------


def _outside_cache_recording(fn: Callable[[], None]) -> None:
    """Run a UI update without it being recorded as part of a cached function's output.

    The progress bar lives outside the cached call; if Streamlit recorded its updates it
    would try to replay them on the next cache hit into a container that no longer
    exists. The updates are transient, so they are excluded from the recording.
    """
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import (
            in_cached_function,
        )
    except ImportError:  # a Streamlit without this hook: no live progress, results intact
        return
    token = in_cached_function.set(False)
    try:
        fn()
    finally:
        in_cached_function.reset(token)


@contextmanager
def progress(label: str, total: float) -> Iterator[Advance]:
    """A progress bar fed by an analyzer ``advance(n)`` callback; removed when done.

    ``total`` is the amount of work the stage reports in all (e.g. requests); updates are
    sent only when the shown percentage changes, so a per-request callback stays cheap.
    """
    box = st.empty()
    done = 0.0
    shown = -1

    def advance(n: float) -> None:
        nonlocal done, shown
        done += n
        pct = 100 if total <= 0 else min(100, math.floor(100 * done / total))
        if pct != shown:
            shown = pct
            _outside_cache_recording(lambda: box.progress(pct / 100, text=f"{label}: {pct}%"))

    try:
        yield advance
    finally:
        box.empty()


# --- content hash ------------------------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=64)
def _digest_file(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest(paths: tuple[str, ...]) -> str:
    """Content hash of the inputs (re-hashed only when a file's size or mtime changes)."""
    parts = []
    for p in paths:
        try:
            info = Path(p).stat()
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", Location(p)) from exc
        parts.append(_digest_file(p, info.st_size, info.st_mtime_ns))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# --- ingest ------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=4)
def _ingest(content: str, ingest_key: Key, _paths: tuple[str, ...], _advance: Advance | None):
    CALLS["ingest"] += 1
    from analyzer.ingest import IngestOptions, open_trace

    return open_trace(list(_paths), IngestOptions(**dict(ingest_key)), advance=_advance)


def ingest(paths: tuple[str, ...], ingest_key: Key):
    """The loaded trace (``analyzer.ingest.LoadedTrace``), ingested once per content+options."""
    content = digest(paths)
    total = sum(Path(p).stat().st_size for p in paths)
    with progress("Reading the trace", total) as advance:
        return _ingest(content, ingest_key, paths, advance)
