"""Every file kvpool writes goes through here, so that no output ever destroys data.

The promises (docs/security.md):

- **Atomic.** Bytes go to a temporary file in the target's own directory, are flushed
  to disk (``fsync``) and then renamed over the target (``os.replace``, atomic on POSIX
  within one filesystem). A failure at any point (disk full, a killed process, a
  renderer that raises) leaves the old file, or nothing, never a half-written one; the
  temporary file is removed. Several files that belong together (a report's JSON,
  Markdown and HTML) are all written before any is renamed into place.
- **Never over an input.** A target that is the same file as anything this run reads
  (compared by device and inode, and by resolved path) is refused: ``convert in.jsonl
  -o in.jsonl`` would otherwise replace the log with Parquet.
- **Never through a symlink** unless ``--force`` (then the link's target is replaced and
  the link kept), and never onto something that is not a regular file (a device node, a
  FIFO, a directory): those are refused without being touched. pyarrow, for one, deletes
  its target when a write fails, which on a device path deletes the device node.
- **No directories from nothing.** The target's directory must exist; a mistyped
  ``--json /nonexistent/dir/x.json`` is an error, not a tree of new directories.
- **Datasets are folders written whole.** A partitioned canonical dataset is written
  into a temporary folder beside its target and renamed into place
  (:func:`atomic_dir`); an earlier dataset there is replaced only then, and a target
  that is a file, a symlink, or a folder holding anything else is refused.
- **Existing report directories are kept.** ``analyze -o DIR`` with a ``DIR`` that
  already holds files writes to ``DIR-2`` (``-3``, ...) and says so, unless ``--force``.

Inputs are registered by the readers (:func:`note_input`) as they open files, and
commands may also pass them explicitly so the check runs before a long computation.
The registry is reset at the start of every command (``analyzer/cli.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from analyzer.errors import OutputError, UsageError
from analyzer.storage import check_writable, is_url, reset_input_urls

_INPUTS: dict[str, tuple[int, int] | None] = {}


def reset_inputs() -> None:
    """Forget the inputs of a previous command (the CLI calls this once per command)."""
    _INPUTS.clear()
    reset_input_urls()


def note_input(path: str | Path) -> None:
    """Record that this run reads ``path``: no output may then replace it."""
    p = Path(path)
    try:
        key = str(p.resolve())
    except (OSError, RuntimeError):  # a symlink loop: it cannot be an output either
        return
    try:
        st = os.stat(p)
        _INPUTS[key] = (st.st_dev, st.st_ino)
    except OSError:
        _INPUTS.setdefault(key, None)


def _identity(p: Path) -> tuple[str, tuple[int, int] | None]:
    key = str(p.resolve())
    try:
        st = os.stat(p)
        return key, (st.st_dev, st.st_ino)
    except OSError:
        return key, None


def _not_stdout(p: Path, what: str = "this output", hint: str = "give a file name") -> None:
    """``-`` means stdout on the command line: never a file named ``-``."""
    if str(p) == "-":
        raise UsageError(f"'-' (stdout) cannot take {what}", hint=hint)


def _check_parent(p: Path) -> None:
    """An output's folder must exist: kvpool creates files, not directories from scratch."""
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(
            f"cannot write {p}: directory {parent} does not exist",
            hint="create it first (kvpool does not create directories from scratch)",
        )


def check_output(
    path: str | Path, *, force: bool = False, inputs: Iterable[str | Path] = ()
) -> Path:
    """Validate an output path before anything is written; returns the path to write.

    Raises :class:`OutputError` (exit 4) when the target is an input, a symlink (without
    ``force``), not a regular file, or in a directory that does not exist. With ``force``
    a symlink resolves to the file it points at. An object-storage URL is checked by
    :func:`analyzer.storage.check_writable` and returned as given.
    """

    if is_url(path):
        for extra in inputs:
            if not is_url(extra):
                note_input(extra)
        check_writable(str(path))
        return path  # type: ignore[return-value]
    p = Path(path)
    _not_stdout(p)
    for extra in inputs:
        note_input(extra)
    try:
        if p.is_symlink():
            if not force:
                raise OutputError(
                    f"{p} is a symbolic link; not writing through it",
                    hint="pass --force to replace the file it points to",
                )
            p = p.resolve()
        if p.exists() or p.is_symlink():
            st = os.stat(p)
            if stat.S_ISDIR(st.st_mode):
                raise OutputError(f"{p} is a directory, not a file")
            if not stat.S_ISREG(st.st_mode):
                raise OutputError(
                    f"{p} is not a regular file (a device, FIFO or socket); left untouched"
                )
        key, ident = _identity(p)
        for in_key, in_ident in _INPUTS.items():
            if key == in_key or (ident is not None and ident == in_ident):
                raise OutputError(
                    f"{p} is also an input of this run; refusing to overwrite it",
                    hint="choose another output path",
                )
        _check_parent(p)
    except OSError as exc:
        raise OutputError(f"cannot write {p}: {exc.strerror or exc}") from exc
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_paths(
    targets: Iterable[str | Path],
    *,
    force: bool = False,
    inputs: Iterable[str | Path] = (),
    private: bool = False,
) -> Iterator[list[Path]]:
    """Temporary paths beside each target; on success each is renamed over its target.

    The caller writes the temporaries by name (pyarrow, gzip and plain writes alike).
    ``private`` makes the files readable by their owner only (0600).
    """
    inputs = list(inputs)
    finals = [check_output(t, force=force, inputs=inputs) for t in targets]
    mode = 0o600 if private else 0o666 & ~_umask()
    temps: list[Path] = []
    try:
        for final in finals:
            fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
            os.fchmod(fd, mode)
            os.close(fd)
            temps.append(Path(name))
        yield temps
        for tmp in temps:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        # Checked again just before the rename: the target may have changed meanwhile.
        for final in finals:
            check_output(final, force=True)
        for tmp, final in zip(temps, finals, strict=True):
            os.replace(tmp, final)
        for d in {f.parent for f in finals}:
            _fsync_dir(d)
    except OSError as exc:
        raise OutputError(
            f"cannot write {', '.join(map(str, finals))}: {exc.strerror or exc}"
        ) from exc
    finally:
        for tmp in temps:
            with contextlib.suppress(OSError):
                tmp.unlink()


@contextlib.contextmanager
def atomic_path(
    target: str | Path,
    *,
    force: bool = False,
    inputs: Iterable[str | Path] = (),
    private: bool = False,
) -> Iterator[Path]:
    """One temporary path beside ``target``, renamed over it on success."""
    with atomic_paths([target], force=force, inputs=inputs, private=private) as (tmp,):
        yield tmp


def write_files(
    contents: Mapping[Path, bytes | str],
    *,
    force: bool = False,
    inputs: Iterable[str | Path] = (),
    private: bool = False,
) -> None:
    """Write several files so that either all are replaced or none is."""
    items = list(contents.items())
    with atomic_paths([p for p, _ in items], force=force, inputs=inputs, private=private) as temps:
        for tmp, (_, data) in zip(temps, items, strict=True):
            if isinstance(data, str):
                tmp.write_text(data, encoding="utf-8")
            else:
                tmp.write_bytes(data)


def write_text(
    path: str | Path,
    text: str,
    *,
    force: bool = False,
    inputs: Iterable[str | Path] = (),
    private: bool = False,
) -> Path:
    """Atomically write ``text`` (UTF-8) to ``path``; returns the path written."""
    p = Path(path)
    write_files({p: text}, force=force, inputs=inputs, private=private)
    return p


def report_dir(
    path: str | Path, *, force: bool = False, create: bool = True
) -> tuple[Path, str | None]:
    """The directory a report goes to, and a note when it is not the one asked for.

    A missing directory is created (one level: its parent must exist). An existing
    empty directory is used. An existing directory with files in it is used only with
    ``force``; otherwise the first free ``DIR-2``, ``DIR-3``, ... is created and the note
    says so. A symlink or a non-directory at ``path`` is refused. ``create=False`` only
    checks (before a long run), creating nothing.
    """
    p = Path(path)
    _not_stdout(
        p, "a directory of reports", "give a directory; --json - puts the report's JSON on stdout"
    )
    try:
        if p.is_symlink() and not force:
            raise OutputError(
                f"{p} is a symbolic link; not writing through it",
                hint="pass --force to write into the directory it points to",
            )
        if p.exists() and not p.is_dir():
            raise OutputError(f"{p} exists and is not a directory")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise OutputError(
                f"cannot write reports to {p}: directory {parent} does not exist",
                hint="create it first (kvpool does not create directories from scratch)",
            )
        if not create:
            # the folder the files will be made in must take them: found now, not after
            # the whole analysis (a read-only DIR, a full or read-only disk)
            _probe(p if p.is_dir() and (force or not any(p.iterdir())) else parent)
            return p, None
        if not p.exists():
            p.mkdir()
            return p, None
        if force or not any(p.iterdir()):
            return p, None
        for i in range(2, 10_000):
            alt = p.with_name(f"{p.name}-{i}")
            try:
                alt.mkdir()
            except FileExistsError:
                continue
            return alt, f"{p} already holds files; wrote to {alt} instead (--force overwrites)"
        raise OutputError(f"no free directory name next to {p}")
    except OSError as exc:
        raise OutputError(f"cannot write reports to {p}: {exc.strerror or exc}") from exc


def _probe(d: Path) -> None:
    """Raise OSError unless a file can be made (and removed) in the folder ``d``."""
    fd, name = tempfile.mkstemp(dir=d, prefix=".kvpool-probe-")
    os.close(fd)
    os.unlink(name)


PARTITION = "window_start_s"  # a partitioned canonical dataset's folders: PARTITION=NNN


def is_dataset_dir(p: Path) -> bool:
    """An empty folder, or one that holds only a partitioned dataset's window folders."""
    try:
        return all(c.is_dir() and c.name.startswith(PARTITION + "=") for c in p.iterdir())
    except OSError:
        return False


def check_dataset_output(path: str | Path, *, inputs: Iterable[str | Path] = ()) -> Path:
    """Validate a partitioned dataset's target folder before anything is written.

    A folder is written whole in place of the target: refused when the target is a file,
    a symlink, a folder holding anything but an earlier dataset's windows, or a folder
    that holds (or is) an input of this run.
    """
    p = Path(path)
    for extra in inputs:
        note_input(extra)
    if p.is_symlink():
        raise OutputError(f"{p} is a symbolic link; not writing a dataset through it")
    if p.exists():
        if not p.is_dir():
            raise OutputError(
                f"{p} is a file; a partitioned dataset is written as a directory",
                hint="choose a path that does not exist yet",
            )
        if not is_dataset_dir(p):
            raise OutputError(
                f"{p} is a directory holding other files; not replacing it with a dataset",
                hint="choose a path that does not exist yet",
            )
    key = str(p.resolve())
    for in_key in _INPUTS:
        if in_key == key or in_key.startswith(key + os.sep):
            raise OutputError(
                f"{p} holds an input of this run; refusing to replace it",
                hint="choose another output path",
            )
    _check_parent(p)
    return p


@contextlib.contextmanager
def atomic_dir(target: str | Path, *, inputs: Iterable[str | Path] = ()) -> Iterator[Path]:
    """A temporary folder beside ``target``, put in its place on success (an earlier
    dataset there is removed only then); removed on failure."""

    final = check_dataset_output(target, inputs=inputs)
    parent = final.parent if str(final.parent) else Path(".")
    try:
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{final.name}.", suffix=".tmp"))
        os.chmod(tmp, 0o777 & ~_umask())
    except OSError as exc:
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from exc
    try:
        yield tmp
        check_dataset_output(final)  # again: the target may have changed meanwhile
        old = None
        if final.exists():
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f".{final.name}.", suffix=".old"))
            os.rename(final, old / "d")
        os.rename(tmp, final)
        _fsync_dir(parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
