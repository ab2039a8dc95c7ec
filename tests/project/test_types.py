"""mypy --strict over analyzer/ (the library ships py.typed, so its types are part of its
interface): a test, so that the suite fails when a change breaks them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")


@pytest.mark.slow
def test_analyzer_passes_mypy_strict():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "analyzer"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_package_ships_its_type_marker():
    assert (ROOT / "analyzer" / "py.typed").is_file()
