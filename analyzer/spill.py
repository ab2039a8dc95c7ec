"""Spill folders: where a command keeps temporary files that may hold prompt text.

A copy of stdin or of a pipe, the rows an ingest spools, the token spill of the LCP
tree (which decodes back to the prompts), a stdout copy, the local copy of an output to
object storage: each lives in a folder made by
:func:`new_dir` under one root per user, ``$TMPDIR/kvpool-spill-<uid>`` (mode 0700,
refused when it is a symlink or someone else's). A folder's name starts with its
owner's id: the process id and start time of the command that made it (its worker
processes name the command, not themselves, through ``KVPOOL_SPILL_OWNER``).

Ctrl-C, SIGTERM and SIGHUP unwind a command, which removes its folders as it goes. A
SIGKILL (an OOM kill among them) cannot be caught, so every command starts by sweeping
the root (:func:`sweep`): a folder whose owner is no longer running is removed. What a
killed command leaves is therefore readable by its user only, and gone when the next
kvpool command starts (docs/security.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from analyzer.errors import OutputError

OWNER_ENV = "KVPOOL_SPILL_OWNER"
_swept = False


def _start_time(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22),
    which tells a reused process id from its first owner; None when not running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (macOS): a live process id is taken as the owner
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "0"
    # the command name (field 2) may hold spaces and parentheses: split after its end
    return data[data.rindex(b")") + 2 :].split()[19].decode()


def owner(*, claim: bool = False) -> str:
    """This command's owner id, ``PID-START``: its main process's (inherited by its
    worker processes through the environment). A command's main process claims it
    (``claim=True``): an id inherited from whatever started the command (a script, a
    test runner, another kvpool) names a process that outlives a SIGKILLed command,
    and would keep its folders from the sweep."""
    own = None if claim else os.environ.get(OWNER_ENV)
    if not own:
        own = f"{os.getpid()}-{_start_time(os.getpid()) or '0'}"
        os.environ[OWNER_ENV] = own
    return own


def root() -> Path:
    """The user's spill root, made private (0700) on first use."""
    r = Path(tempfile.gettempdir()) / f"kvpool-spill-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        r.mkdir(mode=0o700)
    st = r.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise OutputError(
            f"{r} is not a folder of this user's: temporary files cannot be kept private",
            hint="remove it, or set TMPDIR to a folder of your own",
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        r.chmod(0o700)
    return r


def _alive(owner_id: str) -> bool:
    pid, _, start = owner_id.partition("-")
    if not pid.isdigit():
        return True  # not a folder this module made: left alone
    now = _start_time(int(pid))
    return now is not None and (now == start or "0" in (now, start))


def sweep() -> list[Path]:
    """Remove the spill folders whose owner is no longer running (once per process);
    the folders removed."""
    global _swept
    if _swept:
        return []
    _swept = True
    r = Path(tempfile.gettempdir()) / f"kvpool-spill-{os.getuid()}"
    if not r.is_dir() or r.is_symlink():
        return []  # nothing spilled yet (root() refuses a symlink when a spill needs it)
    try:
        r = root()
        entries = list(r.iterdir())
    except OSError:
        return []
    mine = owner()
    gone = []
    for d in entries:
        own = d.name.split(".", 1)[0]
        if own != mine and not _alive(own):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


def new_dir(what: str) -> Path:
    """A new private folder (0700) for this command's spill files of kind ``what``
    (``stdin``, ``rows``, ``lcp``, ...); the caller removes it when done."""
    sweep()
    for _ in range(3):  # another command's tidy() may remove an empty root meanwhile
        try:
            return Path(tempfile.mkdtemp(prefix=f"{owner()}.{what}-", dir=root()))
        except FileNotFoundError:
            continue
    return Path(tempfile.mkdtemp(prefix=f"{owner()}.{what}-", dir=root()))


def remove(folder: str | Path) -> None:
    """Remove one of this command's spill folders, and the root when it was the last."""
    shutil.rmtree(folder, ignore_errors=True)
    tidy()


def tidy() -> None:
    """Remove the root when no command has a folder in it (at a command's end), so an
    ordinary run leaves TMPDIR as it found it."""
    with contextlib.suppress(OSError):
        (Path(tempfile.gettempdir()) / f"kvpool-spill-{os.getuid()}").rmdir()
