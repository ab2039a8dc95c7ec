"""Shared fixtures: where the public traces live, and a quiet environment."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"
SAMPLES = ROOT / "traces"

os.environ.setdefault("KVPOOL_NO_PROGRESS", "1")
# The dashboard's path box opens files only under its allowed folders; tests keep their
# traces in pytest's temporary folders.
os.environ.setdefault("KVPOOL_DASHBOARD_ROOTS", tempfile.gettempdir())
# Step fits are kept between runs in a cache folder; the suite keeps its own, fresh
# each session, so that no test reads a fit another run made.
os.environ.setdefault("KVPOOL_CACHE_DIR", tempfile.mkdtemp(prefix="kvpool-test-cache-"))


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real public traces beside the project; tests skip when they are absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"public traces not found at {SHARED_TRACES}")
    return SHARED_TRACES
