"""``-`` on the command line: stdin for an input, stdout for an output, never a file.

An input ``-`` is copied once, as it arrives, to a private temporary file (mode 0600 in
a 0700 folder: a log holds prompt text) that the readers then read like any other: its
compression (gzip, zstd) is recognised by magic bytes and its format by its content, so
nothing depends on a file name, and messages call it ``<stdin>`` (``<stdin>:12 (field
'messages')``). The copy is deleted when the command ends.

An output ``-`` is written to a private temporary file first and copied to stdout once
complete, so a failed run never leaves half a Parquet file in a pipe's reader.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from analyzer.errors import UsageError, show_as

STDIO = "-"
STDIN_NAME = "<stdin>"


def is_stdio(path: Path | str | None) -> bool:
    """Whether ``path`` is ``-`` (stdin or stdout)."""
    return path is not None and str(path) == STDIO


@contextmanager
def stdin_inputs(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """``paths`` with ``-`` replaced by a temporary copy of stdin, named ``<stdin>`` in
    messages; at most one ``-`` (stdin can be read once)."""
    if not any(is_stdio(p) for p in paths):
        yield list(paths)
        return
    if sum(is_stdio(p) for p in paths) > 1:
        raise UsageError("'-' (stdin) can be given once")
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError(
            "'-' reads the log from stdin, which is a terminal",
            hint="pipe a log in: zcat log.jsonl.gz | kvpool reuse -",
        )
    folder = Path(tempfile.mkdtemp(prefix="kvpool-stdin-"))  # mode 0700
    copy = folder / "stdin"
    try:
        with open(copy, "xb") as f:
            copy.chmod(0o600)
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        show_as(str(copy), STDIN_NAME)
        yield [copy if is_stdio(p) else p for p in paths]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def output_file(path: Path, *, what: str = "output") -> Iterator[Path]:
    """The file a command writes: ``path`` itself, or for ``-`` a private temporary file
    whose bytes go to stdout once the command has written it whole."""
    if not is_stdio(path):
        yield path
        return
    folder = Path(tempfile.mkdtemp(prefix="kvpool-stdout-"))
    try:
        tmp = folder / "stdout"
        yield tmp
        if not tmp.exists():
            raise UsageError(f"this {what} cannot be written to stdout ('-')")
        with open(tmp, "rb") as f:
            shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)
        sys.stdout.buffer.flush()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
