"""The per-user hashing salt: created once with ``os.urandom`` and reused after.

Hashes are salted so that an exported trace cannot be matched against hashes of known
prompts (a dictionary attack on a public system prompt, say) by anyone without the salt.
The same salt file gives the same hashes on every machine, so keep it to compare runs.
Default location: ``./.kvpool-salt`` (hex text, 32 random bytes; gitignored).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from analyzer.errors import InputError, Location, OutputError

DEFAULT_SALT_FILE = Path(".kvpool-salt")
SALT_BYTES = 32


def _read(p: Path) -> bytes:
    """The salt in the file ``p``: a regular file of hex text (a FIFO or a device would
    block the read or never end, so they are refused before it)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise InputError(
            f"cannot read the salt file: {exc.strerror or exc}", Location(str(p))
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(
                "salt file is not a regular file (a pipe, a device or a folder)",
                Location(str(p)),
                hint="point --salt-file at the file holding the salt",
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        salt = bytes.fromhex(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(
            "salt file is not hex text", Location(str(p)), hint="delete it to make a new one"
        ) from exc
    if not 1 <= len(salt) <= 64:
        raise InputError("salt must be 1 to 64 bytes", Location(str(p)))
    return salt


def load_salt(path: str | Path | None = None) -> bytes:
    """Read the salt at ``path`` (default ``./.kvpool-salt``), creating it when absent."""
    p = Path(path) if path is not None else DEFAULT_SALT_FILE
    if p.is_symlink() and not p.exists():
        raise InputError(
            "salt file is a symbolic link to nothing",
            Location(str(p)),
            hint="remove the link, or point it at the salt file it stood for",
        )
    if p.exists():
        return _read(p)
    salt = os.urandom(SALT_BYTES)
    # Write a complete temporary file, then link it into place: a parallel run either
    # wins the link or reads a complete file, never a half-written one.
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{salt[:4].hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(salt.hex() + "\n")
        try:
            os.link(tmp, p)
        except FileExistsError:  # created meanwhile by a parallel run: use theirs
            return _read(p)
    except OSError as exc:
        raise OutputError(f"cannot create salt file {p}: {exc.strerror or exc}") from exc
    finally:
        if tmp.exists():
            tmp.unlink()
    return salt


def salt_id(salt: bytes) -> str:
    """12 hex digits that tell salts apart without revealing them (a keyed, one-way hash).

    Written into canonical traces, so that traces hashed under different salts, whose
    blocks can never match, are not merged as if they could.
    """
    return hashlib.blake2b(b"kvpool salt id", digest_size=6, key=salt).hexdigest()
