"""Reading input files as numbered lines: plain, gzip or zstd, with truncation detected.

Compression is recognised by its magic bytes, not the file name. Decompression is done
chunk by chunk (1 MiB of compressed input at a time) so memory stays bounded whatever
the file size; a stream that ends before its end-of-stream marker is reported as
truncated (``TruncatedInput``) after every complete line before it has been yielded.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from analyzer.errors import InputError, Location

CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BOM = b"\xef\xbb\xbf"


class TruncatedInput(Exception):
    """The compressed stream ended early; ``line`` is the first line that is missing."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


def compression(path: str | Path) -> str:
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return "none"


def check_readable(path: str | Path) -> None:
    p = Path(path)
    if not p.exists():
        raise InputError("file not found", Location(str(path)))
    if p.is_dir():
        raise InputError("is a directory, not a file", Location(str(path)))
    if p.stat().st_size == 0:
        raise InputError("file is empty", Location(str(path)))


def _chunks(path: str | Path, on_bytes: Callable[[int], None] | None) -> Iterator[bytes]:
    kind = compression(path)
    with open(path, "rb") as f:
        if kind == "none":
            while chunk := f.read(CHUNK):
                if on_bytes:
                    on_bytes(len(chunk))
                yield chunk
            return
        if kind == "gzip":

            def new() -> Any:
                return zlib.decompressobj(wbits=47)
        else:
            import zstandard

            zd = zstandard.ZstdDecompressor()

            def new() -> Any:
                return zd.decompressobj()

        dec = new()
        pending = b""
        done = False  # the current member/frame reached its end marker
        while True:
            chunk = pending or f.read(CHUNK)
            pending = b""
            if not chunk:
                break
            if on_bytes:
                on_bytes(len(chunk))
            if done:
                if not chunk.strip(b"\x00"):
                    continue  # zero padding after the last gzip member is allowed
                dec, done = new(), False
            try:
                out = dec.decompress(chunk)
            except Exception as exc:  # zlib.error, ZstdError: corrupt data reads as truncated
                raise TruncatedInput(-1) from exc
            if out:
                yield out
            if dec.eof:
                done = True
                pending = dec.unused_data
        if not done:
            raise TruncatedInput(-1)


def iter_lines(
    path: str | Path, on_bytes: Callable[[int], None] | None = None
) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line bytes without the newline); raises TruncatedInput."""
    lineno = 0
    rest = b""
    first = True
    try:
        for chunk in _chunks(path, on_bytes):
            if first:
                # A UTF-8 byte order mark (Windows exports) is not part of the first line.
                chunk, first = chunk.removeprefix(BOM), False
            buf = rest + chunk if rest else chunk
            lines = buf.split(b"\n")
            rest = lines.pop()
            for line in lines:
                lineno += 1
                yield lineno, line
    except TruncatedInput as exc:
        # The partial last line is not yielded: it is the truncated one.
        raise TruncatedInput(lineno + 1) from exc
    if rest:
        lineno += 1
        yield lineno, rest


def head_lines(path: str | Path, n: int = 5) -> list[bytes]:
    """The first ``n`` non-blank lines (for format detection); tolerant of truncation."""
    out: list[bytes] = []
    try:
        for _, line in iter_lines(path):
            if line.strip():
                out.append(line)
                if len(out) >= n:
                    break
    except TruncatedInput as exc:
        if not out:
            raise InputError(
                "truncated compressed file (no complete line)", Location(str(path), exc.line)
            ) from exc
    return out
