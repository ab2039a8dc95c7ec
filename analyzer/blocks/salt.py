"""The per-user hashing salt: created once with ``os.urandom`` and reused after.

Hashes are salted so that an exported trace cannot be matched against hashes of known
prompts (a dictionary attack on a public system prompt, say) by anyone without the salt.
The same salt file gives the same hashes on every machine, so keep it to compare runs.
Default location: ``./.kvpool-salt`` (hex text, 32 random bytes; gitignored).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from analyzer.errors import InputError, Location, OutputError

DEFAULT_SALT_FILE = Path(".kvpool-salt")
SALT_BYTES = 32


def load_salt(path: str | Path | None = None) -> bytes:
    """Read the salt at ``path`` (default ``./.kvpool-salt``), creating it when absent."""
    p = Path(path) if path is not None else DEFAULT_SALT_FILE
    if p.exists():
        try:
            text = p.read_text(encoding="ascii").strip()
            salt = bytes.fromhex(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(
                "salt file is not hex text", Location(str(p)), hint="delete it to make a new one"
            ) from exc
        if not 1 <= len(salt) <= 64:
            raise InputError("salt must be 1 to 64 bytes", Location(str(p)))
        return salt
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
            return load_salt(p)
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
