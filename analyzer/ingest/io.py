"""Reading input files as numbered lines: plain, gzip or zstd, with truncation detected.

Compression is recognised by its magic bytes, not the file name. Decompression is done
in small steps whose output is bounded (64 KiB of gzip input can inflate to at most
~64 MiB, deflate's limit being 1032:1; 2 KiB of zstd input to at most ~64 MiB, one
128 KiB RLE block per 4 bytes), so memory stays bounded whatever the file holds; a
stream that ends before its end-of-stream marker is reported as truncated
(``TruncatedInput``) after every complete line before it has been yielded.

Two limits stop hostile files early with a one-line error (docs/security.md), each
overridable by an environment variable:

- a line longer than ``KVPOOL_MAX_LINE_MB`` (default 64 MiB; a 1M-token prompt is
  about 4 MiB of text) is an error at that line, before it is held whole in memory;
- a compressed file that inflates more than ``KVPOOL_MAX_INFLATE_RATIO`` times its size
  (default 2000; the bundled zstd samples are 10-50:1, chat logs rarely pass 200:1) is a
  compression bomb, refused once 64 MiB have come out of it.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import zstandard

from analyzer.errors import InputError, Location, UsageError
from analyzer.outputs import note_input
from analyzer.trace import dataset_files

CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BOM = b"\xef\xbb\xbf"
GZIP_STEP = 64 << 10  # compressed bytes per decompress call: output <= ~64 MiB
ZSTD_STEP = 2 << 10
INFLATE_FLOOR = 64 << 20  # the ratio limit applies past this much output


def _env_number(name: str, default: float, lo: float, hi: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:  # NaN fails too
        raise UsageError(f"{name}={raw!r} must be a number from {lo:g} to {hi:g}")
    return value


def max_line_bytes() -> int:
    """The longest input line read (``KVPOOL_MAX_LINE_MB``, MiB, default 64)."""
    return int(_env_number("KVPOOL_MAX_LINE_MB", 64, 1, 1 << 20) * (1 << 20))


def max_inflate_ratio() -> float:
    """Decompressed bytes allowed per compressed byte (``KVPOOL_MAX_INFLATE_RATIO``)."""
    return _env_number("KVPOOL_MAX_INFLATE_RATIO", 2000, 1, 1e9)


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
    if str(path) == "-":  # the CLI turns '-' into a copy of stdin; never a file named '-'
        raise UsageError("'-' (stdin) is read by the kvpool command line, not as a file name")
    p = Path(path)
    note_input(p)
    if not p.exists():
        raise InputError("file not found", Location(str(path)))
    if p.is_dir():
        if dataset_files(p):  # a partitioned canonical dataset (kvpool convert --ray)
            return
        raise InputError(
            "is a directory, not a file (nor a canonical dataset: no "
            "window_start_s=*/*.parquet in it)",
            Location(str(path)),
        )
    if p.stat().st_size == 0:
        raise InputError("file is empty", Location(str(path)))


def _chunks(
    path: str | Path, on_bytes: Callable[[int], None] | None, span: Span | None = None
) -> Iterator[bytes]:
    kind = compression(path)
    with open(path, "rb") as f:
        if span is not None:  # a byte range of an uncompressed file
            assert kind == "none"
            f.seek(span.start)
            left = span.end - span.start
            while left > 0 and (chunk := f.read(min(CHUNK, left))):
                left -= len(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
                yield chunk
            return
        if kind == "none":
            while chunk := f.read(CHUNK):
                if on_bytes:
                    on_bytes(len(chunk))
                yield chunk
            return
        ratio = max_inflate_ratio()
        n_in = n_out = 0
        step = GZIP_STEP if kind == "gzip" else ZSTD_STEP
        out_parts: list[bytes] = []
        out_size = 0
        pieces = _inflate(f, kind, on_bytes, step)
        while True:
            try:
                piece = next(pieces)
            except StopIteration:
                break
            except TruncatedInput:
                if out_parts:  # every complete line before the cut is still read
                    yield b"".join(out_parts)
                raise
            if isinstance(piece, int):
                n_in += piece
                continue
            n_out += len(piece)
            if n_out > INFLATE_FLOOR and n_out > ratio * max(n_in, 1):
                raise InputError(
                    f"{kind} data inflates more than {ratio:g} times its size "
                    f"({n_in:,} bytes read gave {n_out:,}): a compression bomb?",
                    Location(str(path)),
                    hint="if the file is genuine, raise KVPOOL_MAX_INFLATE_RATIO",
                )
            # Many small outputs are joined to ~1 MiB so the line splitter stays fast.
            out_parts.append(piece)
            out_size += len(piece)
            if out_size >= CHUNK:
                yield b"".join(out_parts)
                out_parts, out_size = [], 0
        if out_parts:
            yield b"".join(out_parts)


class _Decompressor(Protocol):
    """What zlib's and zstandard's streaming decompressors both offer."""

    @property
    def eof(self) -> bool: ...
    @property
    def unused_data(self) -> bytes: ...
    def decompress(self, data: bytes) -> bytes: ...


def _inflate(
    f: BinaryIO, kind: str, on_bytes: Callable[[int], None] | None, step: int
) -> Iterator[int | bytes]:
    """Decompressed pieces of ``f``, and (as ints) the compressed bytes consumed."""
    if kind == "gzip":

        def new() -> _Decompressor:
            return zlib.decompressobj(wbits=47)
    else:
        zd = zstandard.ZstdDecompressor()

        def new() -> _Decompressor:
            return zd.decompressobj()

    dec = new()
    pending = b""
    done = False  # the current member/frame reached its end marker
    while True:
        chunk = pending
        pending = b""
        if not chunk:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            if on_bytes:
                on_bytes(len(chunk))
        if done:
            if not chunk.strip(b"\x00"):
                continue  # zero padding after the last gzip member is allowed
            dec, done = new(), False
        for at in range(0, len(chunk), step):
            piece = chunk[at : at + step]
            try:
                out = dec.decompress(piece)
            except Exception as exc:  # zlib.error, ZstdError: corrupt data reads as truncated
                raise TruncatedInput(-1) from exc
            yield len(piece)
            if out:
                yield out
            if dec.eof:
                done = True
                pending = dec.unused_data + chunk[at + step :]
                break
    if not done:
        raise TruncatedInput(-1)


def _too_long(path: str | Path, lineno: int, limit: int) -> None:
    raise InputError(
        f"line is longer than {limit >> 20} MiB (a hostile or corrupt file?)",
        Location(str(path), lineno),
        hint="if the line is genuine, raise KVPOOL_MAX_LINE_MB",
    )


@dataclass(frozen=True, slots=True)
class Span:
    """Bytes ``[start, end)`` of an uncompressed file, starting at line ``first_line``
    (``start`` is 0 or just after a newline) and ending with line ``last_line`` (0 for
    the file's last span); see :func:`line_spans`."""

    start: int
    end: int
    first_line: int
    last_line: int = 0


def line_spans(path: str | Path, parts: int, quoted: bool = False) -> list[Span]:
    """An uncompressed file cut into about ``parts`` spans of equal size at line ends.

    Reads the file once, counting newlines, so that each span knows its first line
    number (error messages and default request ids name lines). ``quoted`` (CSV): a cut
    is made only where an even number of ``"`` lie before it, so that it falls between
    records when a quoted field holds newlines (RFC 4180 doubles a quote inside one).
    """
    size = Path(path).stat().st_size
    targets = [size * k // parts for k in range(1, parts)]
    cuts, lines_before = [0], [0]
    pos, lines, quotes = 0, 0, 0  # newlines and quotes in [0, pos + lo)
    with open(path, "rb") as f:
        while targets and (chunk := f.read(CHUNK)):
            lo = 0
            while targets and pos + len(chunk) > targets[0]:
                i = chunk.find(b"\n", max(lo, targets[0] - pos))
                if i < 0:
                    break
                lines += chunk.count(b"\n", lo, i + 1)
                if quoted:
                    quotes += chunk.count(b'"', lo, i + 1)
                lo = i + 1
                if quotes % 2:
                    continue  # inside a quoted field: the next line end
                if pos + lo < size and pos + lo > cuts[-1]:
                    cuts.append(pos + lo)
                    lines_before.append(lines)
                while targets and targets[0] < pos + lo:
                    targets.pop(0)
            lines += chunk.count(b"\n", lo)
            if quoted:
                quotes += chunk.count(b'"', lo)
            pos += len(chunk)
    cuts.append(size)
    last = len(cuts) - 2
    return [
        Span(cuts[k], cuts[k + 1], lines_before[k] + 1, lines_before[k + 1] if k < last else 0)
        for k in range(len(cuts) - 1)
    ]


def iter_lines(
    path: str | Path, on_bytes: Callable[[int], None] | None = None, span: Span | None = None
) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line bytes without the newline); raises TruncatedInput.

    With ``span``, only the lines of that byte range (numbered from its first line).
    """
    lineno = span.first_line - 1 if span is not None else 0
    rest = b""
    held: list[bytes] = []  # chunks of one long line, joined once its end arrives
    held_size = 0
    first = span is None or span.start == 0
    limit = max_line_bytes()
    try:
        for chunk in _chunks(path, on_bytes, span):
            if first:
                # A UTF-8 byte order mark (Windows exports) is not part of the first line.
                chunk, first = chunk.removeprefix(BOM), False
            if b"\n" not in chunk:
                held.append(chunk)
                held_size += len(chunk)
                if len(rest) + held_size > limit:
                    _too_long(path, lineno + 1, limit)
                continue
            if held:
                chunk, held, held_size = b"".join([*held, chunk]), [], 0
            buf = rest + chunk if rest else chunk
            lines = buf.split(b"\n")
            rest = lines.pop()
            for line in lines:
                lineno += 1
                if len(line) > limit:
                    _too_long(path, lineno, limit)
                yield lineno, line
            if len(rest) > limit:
                _too_long(path, lineno + 1, limit)
    except TruncatedInput as exc:
        # The partial last line is not yielded: it is the truncated one.
        raise TruncatedInput(lineno + 1) from exc
    if held:
        rest += b"".join(held)
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
