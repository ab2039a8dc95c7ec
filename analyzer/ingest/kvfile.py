"""kvpool's KV-event recording file (``.kvev``, docs/formats.md "KV-event recordings"):
written by ``kvpool record`` (:mod:`analyzer.ingest.kvrecord`) as it receives the
engines' batches, read back whole by :func:`read_recording`.

An 8-byte magic, then length-prefixed msgpack records (a header, batches, gaps, a
trailer). The token ids of ``BlockStored`` are not kept, only their count: with the
model's tokenizer they read back as the prompt.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import msgspec

from analyzer.errors import InputError, Location
from analyzer.ingest.kvwire import (
    Cleared,
    Event,
    Removed,
    Stored,
    WireBatch,
    WireError,
    block_hash,
    block_hashes,
    opt_int,
    opt_str,
)
from analyzer.jsontypes import JSONObject
from analyzer.outputs import note_input

MAGIC = b"KVPOOLEV"
FORMAT_NAME = "kvpool.kvevents"
VERSION = 1
# One record at most this size (a batch of a few thousand events is well under 1 MiB):
# a corrupt length cannot make the reader allocate gigabytes.
MAX_RECORD_BYTES = 64 * 2**20
_LEN = struct.Struct("<I")


class RecordingWriter:
    """Records appended to an open binary file (the temporary file ``kvpool record``
    renames into place when it ends)."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._enc = msgspec.msgpack.Encoder()
        fh.write(MAGIC)

    def write(self, record: dict[str, object]) -> None:
        """One record: a map msgspec encodes (events as their ``record()`` lists)."""
        body = self._enc.encode(record)
        self._fh.write(_LEN.pack(len(body)))
        self._fh.write(body)

    def header(self, **fields: object) -> None:
        self.write({"kind": "header", "format": FORMAT_NAME, "version": VERSION, **fields})

    def batch(self, endpoint: int, seq: int, batch: WireBatch, *, replayed: bool = False) -> None:
        self.write(
            {
                "kind": "batch",
                "endpoint": endpoint,
                "seq": seq,
                "ts": batch.ts,
                "dp_rank": batch.dp_rank,
                "replayed": replayed,
                "events": [e.record() for e in batch.events],
            }
        )


def is_recording(path: str | Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _event_from_record(rec: object) -> Event:
    """An event as :meth:`Stored.record` (and the others) wrote it."""
    if not isinstance(rec, list) or not rec or not isinstance(rec[0], str):
        raise WireError("malformed event record")
    kind = rec[0]
    if kind == "S" and len(rec) == 9:
        _, hashes, parent, n_tokens, bs, medium, lora, group, session = rec
        if (
            isinstance(n_tokens, bool)
            or not isinstance(n_tokens, int)
            or n_tokens < 0
            or isinstance(bs, bool)
            or not isinstance(bs, int)
            or bs < 1
        ):
            raise WireError("malformed event record")
        return Stored(
            block_hashes(hashes, "block_hashes"),
            None if parent is None else block_hash(parent, "parent_block_hash"),
            n_tokens,
            bs,
            opt_str(medium, "medium"),
            opt_str(lora, "lora_name"),
            opt_int(group, "group_idx"),
            opt_str(session, "session_id"),
        )
    if kind == "R" and len(rec) == 4:
        return Removed(
            block_hashes(rec[1], "block_hashes"),
            opt_str(rec[2], "medium"),
            opt_int(rec[3], "group_idx"),
        )
    if kind == "C" and len(rec) == 1:
        return Cleared()
    raise WireError("malformed event record")


@dataclass(slots=True)
class RecordedBatch:
    endpoint: int
    seq: int
    ts: float
    replayed: bool
    events: list[Event]
    record: int  # its record number in the file (1: the header)


@dataclass
class Recording:
    """One recording read back: its header, batches (in file order), gap and malformed
    counts, and whether it ended with its trailer."""

    path: str
    header: JSONObject
    batches: list[RecordedBatch] = field(default_factory=list)
    gaps: int = 0  # sequence gaps seen live
    lost_batches: int = 0  # batches neither received nor replayed
    replayed_batches: int = 0
    restarts: int = 0  # a publisher's sequence started again (the engine restarted)
    malformed: dict[str, int] = field(default_factory=dict)  # wire problems, by reason
    bad_records: int = 0  # records of this file that could not be read
    trailer: JSONObject | None = None


def _records(path: str, fh: BinaryIO) -> Iterator[tuple[int, object]]:
    """(record number, decoded record) until the end; a record cut short ends it."""
    dec = msgspec.msgpack.Decoder()
    n = 0
    while True:
        head = fh.read(_LEN.size)
        if not head:
            return
        n += 1
        if len(head) < _LEN.size:
            raise _CutShort(n)
        (size,) = _LEN.unpack(head)
        if size > MAX_RECORD_BYTES:
            raise InputError(
                f"record of {size:,} bytes (the limit is {MAX_RECORD_BYTES:,}): the file "
                "is corrupt",
                Location(path, n),
            )
        body = fh.read(size)
        if len(body) < size:
            raise _CutShort(n)
        try:
            yield n, dec.decode(body)
        except (msgspec.DecodeError, RecursionError):
            yield n, None


class _CutShort(Exception):
    def __init__(self, record: int) -> None:
        self.record = record


def read_recording(path: str) -> Recording:
    """A recording read whole. Not one: an :class:`InputError` naming the file (and the
    record). A record that cannot be read is counted and skipped; a file cut short keeps
    what came before the cut (the trailer is then missing, and the summary says so)."""
    note_input(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below; open's error first)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", Location(path)) from None
    with fh:
        if fh.read(len(MAGIC)) != MAGIC:
            raise InputError("not a kvpool KV-event recording (no KVPOOLEV magic)", Location(path))
        rec: Recording | None = None
        try:
            for n, obj in _records(path, fh):
                if rec is None:
                    rec = Recording(path, _header(path, obj))
                    continue
                _take(rec, n, obj)
        except _CutShort as cut:
            if rec is None:
                raise InputError(
                    "recording cut short inside its header", Location(path, 1)
                ) from None
            rec.bad_records += 1
            rec.malformed["recording cut short"] = rec.malformed.get("recording cut short", 0) + 1
            _ = cut
        if rec is None:
            raise InputError("recording has no header record", Location(path))
    return rec


def _header(path: str, obj: object) -> JSONObject:
    if not isinstance(obj, dict) or obj.get("kind") != "header" or obj.get("format") != FORMAT_NAME:
        raise InputError("the first record is not a kvpool.kvevents header", Location(path, 1))
    version = obj.get("version")
    if version != VERSION:
        raise InputError(
            f"recording version {version!r}; this kvpool reads version {VERSION}",
            Location(path, 1, "version"),
            hint="record it again with this kvpool, or use the kvpool that recorded it",
        )
    return obj


def count_into(d: dict[str, int], key: str, n: int = 1) -> None:
    """``d[key] += n``, from nothing."""
    d[key] = d.get(key, 0) + n


def _take(rec: Recording, n: int, obj: object) -> None:
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or kind is None:
        rec.bad_records += 1
        count_into(rec.malformed, "unreadable record")
        return
    if kind == "batch":
        e, seq, ts = obj.get("endpoint"), obj.get("seq"), obj.get("ts")
        raw = obj.get("events")
        if (
            not isinstance(e, int)
            or not isinstance(seq, int)
            or isinstance(ts, bool)
            or not isinstance(ts, int | float)
            or not math.isfinite(ts)
            or ts < 0
            or not isinstance(raw, list)
        ):
            rec.bad_records += 1
            count_into(rec.malformed, "unreadable record")
            return
        events: list[Event] = []
        for r in raw:
            try:
                events.append(_event_from_record(r))
            except WireError:
                count_into(rec.malformed, "malformed event record")
        replayed = bool(obj.get("replayed"))
        rec.replayed_batches += replayed
        rec.batches.append(RecordedBatch(e, seq, float(ts), replayed, events, n))
    elif kind == "gap":
        rec.gaps += 1
        lost = obj.get("lost")
        rec.lost_batches += lost if isinstance(lost, int) and lost > 0 else 0
    elif kind == "restart":
        rec.restarts += 1
    elif kind == "malformed":
        reason, count = obj.get("reason"), obj.get("count", 1)
        if isinstance(reason, str) and isinstance(count, int) and count > 0:
            count_into(rec.malformed, reason, count)
    elif kind == "end":
        rec.trailer = obj
    else:
        count_into(rec.malformed, "unknown record kind")
