"""``-`` on the command line: stdin for an input, stdout for an output, never a file.

An input ``-`` is copied once, as it arrives, to a private temporary file (mode 0600 in
a 0700 folder: a log holds prompt text) that the readers then read like any other: its
compression (gzip, zstd) is recognised by magic bytes and its format by its content, so
nothing depends on a file name, and messages call it ``<stdin>`` (``<stdin>:12 (field
'messages')``). The copy is deleted when the command ends.

A pipe given as an input path (``kvpool reuse <(zcat log.jsonl.gz)``, a FIFO) is copied
the same way, since it too can be read only once, and messages name it as given. Like
``cat``, it waits for a writer to write or close; after two seconds of nothing it says
on stderr what it waits for (Ctrl-C stops it), so a FIFO nobody writes to is never a
silent wait.

An output ``-`` is written to a private temporary file first and copied to stdout once
complete, so a failed run never leaves half a Parquet file in a pipe's reader.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from analyzer.errors import InputError, Location, UsageError, show_as
from analyzer.spill import new_dir, remove

STDIO = "-"
STDIN_NAME = "<stdin>"
# Whether a command holds the copy of stdin now: stdin can be read once, so a second '-'
# (a log and a price file, say) is a usage error rather than an empty input.
_taken = False


def is_stdio(path: Path | str | None) -> bool:
    """Whether ``path`` is ``-`` (stdin or stdout)."""
    return path is not None and str(path) == STDIO


def _is_pipe(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except (OSError, ValueError):  # not there: the reader says so
        return False


def _copy_pipe(path: Path, copy: Path) -> None:
    # Opened without blocking (the open of a FIFO with no writer would not return), then
    # polled until a writer writes or closes: a read before that would end at once.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"cannot read the pipe: {exc.strerror}", Location(str(path))) from None
    ready = select.poll()
    ready.register(fd, select.POLLIN | select.POLLHUP)
    if not ready.poll(2000):
        print(f"waiting for {path} to be written (Ctrl-C stops)", file=sys.stderr, flush=True)
        ready.poll()
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as src, open(copy, "xb") as f:
        copy.chmod(0o600)
        shutil.copyfileobj(src, f, 1 << 20)


@contextmanager
def stdin_inputs(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """``paths`` with ``-`` replaced by a temporary copy of stdin, named ``<stdin>`` in
    messages (at most one ``-``: stdin can be read once), each pipe by a copy of what it
    gives, named as given, and each object-storage URL by a copy of the object (or of a
    dataset prefix), named by its URL without credentials (:mod:`analyzer.storage`)."""
    global _taken
    from analyzer.storage import is_url

    stdin = [p for p in paths if is_stdio(p)]
    urls = sorted({str(p) for p in paths if is_url(p)})
    pipes = sorted(
        {str(p) for p in paths if not is_stdio(p) and not is_url(p) and _is_pipe(Path(p))}
    )
    if not stdin and not pipes and not urls:
        yield list(paths)
        return
    if stdin and (_taken or len(stdin) > 1):
        raise UsageError("'-' (stdin) can be given once")
    if stdin and (sys.stdin is None or sys.stdin.isatty()):
        raise UsageError(
            "'-' reads from stdin, which is a terminal",
            hint="pipe the file in: zcat log.jsonl.gz | kvpool reuse -",
        )
    folder = new_dir("stdin")  # mode 0700, swept if this command is SIGKILLed
    copies: dict[str, Path] = {}
    _taken = _taken or bool(stdin)
    try:
        if stdin:
            copy = copies[STDIO] = folder / "stdin"
            with open(copy, "xb") as f:
                copy.chmod(0o600)
                shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
            show_as(str(copy), STDIN_NAME)
        for i, pipe in enumerate(pipes):
            copy = copies[pipe] = folder / f"pipe-{i}"
            _copy_pipe(Path(pipe), copy)
            show_as(str(copy), pipe)
        if urls:
            _fetch_urls(urls, folder, copies)
        yield [copies.get(str(p), Path(p)) for p in paths]
    finally:
        if stdin:
            _taken = False
        remove(folder)


def _fetch_urls(urls: list[str], folder: Path, copies: dict[str, Path]) -> None:
    """Each URL copied into ``folder`` (streamed, bounded memory), with a progress bar."""
    from analyzer.progress import progress
    from analyzer.storage import fetch, public

    with progress("downloading", None, unit="bytes") as advance:
        for i, url in enumerate(urls):
            name = f"object-{i}" + "".join(Path(url.split("?", 1)[0]).suffixes[-2:])
            copy = copies[url] = fetch(url, folder, name, advance)
            show_as(str(copy), public(url))


@contextmanager
def stdin_files(*values: str | Path | None) -> Iterator[list[str | None]]:
    """Input options (``--config``, ``--prices``, a CSV of measurements) with a ``-``
    replaced by the path of a private copy of stdin, named ``<stdin>`` in messages; None
    (an option not given) stays None. At most one ``-`` in the whole command."""
    given = [Path(v) for v in values if v is not None]
    with stdin_inputs(given) as copies:
        rest = iter(copies)
        yield [None if v is None else str(next(rest)) for v in values]


def no_stdio(value: str | Path | None, flag: str, why: str) -> None:
    """A usage error for ``-`` given to ``flag``, which cannot be stdin or stdout
    (``why``): never a file named ``-``."""
    if is_stdio(value):
        raise UsageError(f"{flag} cannot be '-' (stdin or stdout): {why}")


@contextmanager
def output_file(path: Path, *, what: str = "output") -> Iterator[Path]:
    """The file a command writes: ``path`` itself, or for ``-`` a private temporary file
    whose bytes go to stdout once the command has written it whole, or for an
    object-storage URL a private local file (or folder) uploaded once written whole
    (:func:`analyzer.storage.staged_output`)."""
    from analyzer.storage import is_url, staged_output

    if is_url(path):
        with staged_output(str(path)) as local:
            yield local
        return
    if not is_stdio(path):
        yield path
        return
    folder = new_dir("stdout")
    try:
        tmp = folder / "stdout"
        yield tmp
        if not tmp.exists():
            raise UsageError(f"this {what} cannot be written to stdout ('-')")
        with open(tmp, "rb") as f:
            shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)
        sys.stdout.buffer.flush()
    finally:
        remove(folder)


def stdin_options(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command whose input-file options ``names`` take ``-`` for stdin: each call
    gets the path of the copy (:func:`stdin_files`) in place of ``-``, as a ``Path`` where
    the option is one."""

    def wrap(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def run(**kwargs: Any) -> None:
            given = [kwargs.get(n) for n in names]
            with stdin_files(*given) as files:
                for n, old, new in zip(names, given, files, strict=True):
                    if old is not None:
                        kwargs[n] = Path(str(new)) if isinstance(old, Path) else new
                command(**kwargs)

        return run

    return wrap
