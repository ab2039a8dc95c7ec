"""Process start-up of the ``kvpool`` command: imports its commands do not need, skipped.

Start-up dominates a command on a small trace (``kvpool reuse`` of the 12k-request
Mooncake trace spent most of its CPU time importing), and two imports are made by
libraries on behalf of features kvpool never uses:

* pyarrow, on its first array, imports pandas (about 0.3 s) to learn whether objects may
  be pandas Series; a command that never makes a pandas object can tell it there is no
  pandas. A later ``to_pandas()`` still imports pandas then (pyarrow retries), but
  ``pa.array(series)`` would not recognise a Series, so this is done only in the
  processes of the commands listed in :data:`NO_PANDAS` (never in a test runner's
  process, where other code follows).
* numba, when it loads its first cached kernel, imports ``scipy.linalg`` (about 0.3 s)
  to see whether its ``np.dot`` may call BLAS; kvpool's kernels do no linear algebra.
  Without it numba uses its own loop for the few functions that would call BLAS; a
  kernel that used ``np.linalg`` would import scipy when compiled, as before.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

# Commands whose process never makes a pandas object (analyze and the dashboard draw
# charts from DataFrames).
NO_PANDAS = frozenset({"convert", "reuse", "replay"})


class _Refuse(MetaPathFinder):
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> None:
        if fullname in self.names:
            raise ModuleNotFoundError(f"{fullname} is not imported at start-up", name=fullname)
        return None


@contextmanager
def unimportable(*names: str) -> Iterator[None]:
    """Within the block, importing any of ``names`` fails as if it were not installed."""
    finder = _Refuse(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class _ArraymathWithoutBlas(MetaPathFinder):
    """Runs the import of ``numba.np.arraymath`` with ``scipy.linalg`` unimportable."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "numba.np.arraymath":
            return None
        sys.meta_path.remove(self)  # once: find the real module below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            with unimportable("scipy.linalg"):
                run(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def trim(command: str | None) -> None:
    """Settle the two probes above before ``command`` runs (see the module's notes)."""
    if command in NO_PANDAS and "pandas" not in sys.modules:
        with unimportable("pandas"):
            import pyarrow as pa

            pa.array([0])  # the probe: pyarrow now knows there is no pandas here
    if "numba.np.arraymath" not in sys.modules and "scipy.linalg" not in sys.modules:
        sys.meta_path.insert(0, _ArraymathWithoutBlas())
