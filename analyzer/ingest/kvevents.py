"""KV-cache events: the engines' wire format, kvpool's recording file, and the requests
and cache occupancy they show.

Engines that publish KV events (vLLM ``--kv-events-config '{"publisher": "zmq", ...}'``,
SGLang ``--kv-events-config``, LMCache through vLLM's publisher) send ZMQ messages of
three frames, ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian sequence number,
``payload`` a msgpack ``EventBatch`` of ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared`` events (vLLM ``vllm/distributed/kv_events.py``, SGLang
``python/sglang/srt/disaggregation/kv_events.py``). Two encodings exist and both are
read (:func:`decode_payload`): positional arrays (every vLLM release up to v0.23, which
set ``array_like=True`` on the structs; SGLang before its events became maps), and named
maps (vLLM after PR #42892, SGLang 0.5.23: the events are ``{"type": "BlockStored",
...}`` maps, the batch still ``[ts, events, dp_rank]`` or a map). Block hashes are
integers (signed or not) or bytes (vLLM's ``ExternalBlockHash = bytes | int``); all are
read as vLLM's own ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` conversion reads them, the low
64 bits, so one engine recorded either way gives the same ids.

``kvpool record`` (:mod:`analyzer.ingest.kvrecord`) writes what it receives to a
recording (``.kvev``, docs/formats.md "KV-event recordings"): an 8-byte magic, then
length-prefixed msgpack records (a header, batches, gaps, a trailer). The token ids of
``BlockStored`` are not kept, only their count: with the model's tokenizer they read
back as the prompt.

:func:`open_recordings` turns recordings into the canonical trace (each request a chain
of stored blocks, :class:`Rebuilder`) and :class:`EngineEvents`, what the events show
of the engine's own cache: its occupancy per medium over time, stores, evictions,
clears, and the prefix hits its requests got.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from analyzer.errors import InputError, Location

MAGIC = b"KVPOOLEV"
FORMAT_NAME = "kvpool.kvevents"
VERSION = 1
# One record at most this size (a batch of a few thousand events is well under 1 MiB):
# a corrupt length cannot make the reader allocate gigabytes.
MAX_RECORD_BYTES = 64 * 2**20
_LEN = struct.Struct("<I")
_MASK64 = (1 << 64) - 1
# The medium of the engine's own (HBM) prefix cache: vLLM writes "GPU" (None before it
# had a medium field), SGLang "GPU"; lower tiers are "CPU" (vLLM's offloading, LMCache),
# "CPU_PINNED", "DISK", "EXTERNAL" (SGLang HiCache).
PRIMARY_MEDIA = (None, "GPU")
# A store whose parent is the last block of a request stored within this many seconds
# continues that request (chunked prefill stores a prompt over several steps, decode a
# block every block_size tokens); later, it starts a new request that extends it (the
# next turn). docs/formats.md says what this cannot tell apart.
CONTINUATION_GAP_S = 2.0
TIMELINE_POINTS = 120


class WireError(ValueError):
    """A payload or event that does not fit the published schema: ``reason`` is the
    counted skip's key, ``field`` the field at fault."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


# -- the engines' events, normalized -------------------------------------------------------


@dataclass(slots=True)
class Stored:
    """``BlockStored``: full blocks, in chain order, after ``parent`` (None: a root)."""

    hashes: list[int]
    parent: int | None
    n_tokens: int  # len(token_ids): the blocks' tokens (the ids themselves are not kept)
    block_size: int
    medium: str | None = None
    lora: str | None = None  # lora_name (vLLM, SGLang)
    group: int | None = None  # vLLM's KV cache group (hybrid models)
    session: str | None = None  # SGLang's session_id, as a salted pseudonym

    def record(self) -> list[Any]:
        return [
            "S",
            self.hashes,
            self.parent,
            self.n_tokens,
            self.block_size,
            self.medium,
            self.lora,
            self.group,
            self.session,
        ]


@dataclass(slots=True)
class Removed:
    """``BlockRemoved``: blocks evicted from ``medium``."""

    hashes: list[int]
    medium: str | None = None
    group: int | None = None

    def record(self) -> list[Any]:
        return ["R", self.hashes, self.medium, self.group]


@dataclass(slots=True)
class Cleared:
    """``AllBlocksCleared``: the engine reset its prefix cache."""

    def record(self) -> list[Any]:
        return ["C"]


Event = Stored | Removed | Cleared


def _hash(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise WireError("mistyped block hash", name)
    if isinstance(value, int):
        return value & _MASK64
    if isinstance(value, bytes | bytearray | memoryview):
        b = bytes(value)
        if not b:
            raise WireError("empty block hash", name)
        return int.from_bytes(b[-8:], "big")
    raise WireError("mistyped block hash", name)


def _hashes(value: object, name: str) -> list[int]:
    if not isinstance(value, list | tuple):
        raise WireError("missing field" if value is None else "mistyped field", name)
    return [_hash(v, name) for v in value]


def _opt_str(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise WireError("mistyped field", name)


def _opt_int(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError("mistyped field", name)
    return value


def _stored(f: dict[str, Any]) -> Stored:
    hashes = _hashes(f.get("block_hashes"), "block_hashes")
    parent = f.get("parent_block_hash")
    tokens = f.get("token_ids")
    if not isinstance(tokens, list | tuple):
        raise WireError("missing field" if tokens is None else "mistyped field", "token_ids")
    bs = f.get("block_size")
    if isinstance(bs, bool) or not isinstance(bs, int):
        raise WireError("missing field" if bs is None else "mistyped field", "block_size")
    if bs < 1:
        raise WireError("invalid value", "block_size")
    lora = f.get("lora_name")
    return Stored(
        hashes=hashes,
        parent=None if parent is None else _hash(parent, "parent_block_hash"),
        n_tokens=len(tokens),
        block_size=bs,
        medium=_opt_str(f.get("medium"), "medium"),
        lora=lora if isinstance(lora, str) else None,
        group=_opt_int(f.get("group_idx"), "group_idx"),
        session=_opt_str(f.get("session_id"), "session_id"),
    )


def _removed(f: dict[str, Any]) -> Removed:
    return Removed(
        hashes=_hashes(f.get("block_hashes"), "block_hashes"),
        medium=_opt_str(f.get("medium"), "medium"),
        group=_opt_int(f.get("group_idx"), "group_idx"),
    )


# Positional fields after the tag, in the order vLLM declares them (every field was
# appended: PRs #16750, #19737 medium, #27577 lora_name, #33304 extra_keys, #37688
# group_idx, #40984 kv_cache_spec_*); msgspec leaves trailing defaults out.
_ARRAY_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def decode_event(raw: object) -> Event:
    """One event of a batch, array or map encoded; :class:`WireError` when it fits
    neither, or names a type kvpool does not know."""
    if isinstance(raw, dict):
        tag, fields = raw.get("type"), raw
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _ARRAY_FIELDS.get(tag)
        if names is None:
            raise WireError("unknown event type", "type")
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise WireError("event is neither a tagged array nor a map")
    if tag == "BlockStored":
        return _stored(fields)
    if tag == "BlockRemoved":
        return _removed(fields)
    if tag == "AllBlocksCleared":
        return Cleared()
    raise WireError("unknown event type", "type")


@dataclass(slots=True)
class WireBatch:
    ts: float
    dp_rank: int | None
    events: list[Event]
    bad: list[WireError]  # events of the batch that were skipped


def decode_payload(payload: bytes) -> WireBatch:
    """An ``EventBatch`` payload: ``[ts, events, dp_rank]`` or ``{ts, events,
    data_parallel_rank | attn_dp_rank}``. A bad envelope raises :class:`WireError`; a bad
    event is left out and listed in ``bad``."""
    import msgspec

    try:
        obj = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise WireError("payload is not msgpack") from exc
    if isinstance(obj, dict):
        ts, events = obj.get("ts"), obj.get("events")
        rank = obj.get("data_parallel_rank", obj.get("attn_dp_rank"))
    elif isinstance(obj, list | tuple) and len(obj) >= 2:
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    else:
        raise WireError("payload is not an EventBatch")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise WireError("mistyped field", "ts")
    if ts < 0:
        raise WireError("negative timestamp", "ts")
    if not isinstance(events, list | tuple):
        raise WireError("mistyped field", "events")
    if isinstance(rank, bool) or not (rank is None or isinstance(rank, int)):
        raise WireError("mistyped field", "data_parallel_rank")
    out: list[Event] = []
    bad: list[WireError] = []
    for raw in events:
        try:
            out.append(decode_event(raw))
        except WireError as exc:
            bad.append(exc)
    return WireBatch(float(ts), rank, out, bad)


# -- the recording file --------------------------------------------------------------------


class RecordingWriter:
    """Records appended to an open binary file (the temporary file ``kvpool record``
    renames into place when it ends)."""

    def __init__(self, fh: BinaryIO) -> None:
        import msgspec

        self._fh = fh
        self._enc = msgspec.msgpack.Encoder()
        fh.write(MAGIC)

    def write(self, record: dict[str, Any]) -> None:
        body = self._enc.encode(record)
        self._fh.write(_LEN.pack(len(body)))
        self._fh.write(body)

    def header(self, **fields: Any) -> None:
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
            _hashes(hashes, "block_hashes"),
            None if parent is None else _hash(parent, "parent_block_hash"),
            n_tokens,
            bs,
            _opt_str(medium, "medium"),
            _opt_str(lora, "lora_name"),
            _opt_int(group, "group_idx"),
            _opt_str(session, "session_id"),
        )
    if kind == "R" and len(rec) == 4:
        return Removed(
            _hashes(rec[1], "block_hashes"),
            _opt_str(rec[2], "medium"),
            _opt_int(rec[3], "group_idx"),
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
    header: dict[str, Any]
    batches: list[RecordedBatch] = field(default_factory=list)
    gaps: int = 0  # sequence gaps seen live
    lost_batches: int = 0  # batches neither received nor replayed
    replayed_batches: int = 0
    restarts: int = 0  # a publisher's sequence started again (the engine restarted)
    malformed: dict[str, int] = field(default_factory=dict)  # wire problems, by reason
    bad_records: int = 0  # records of this file that could not be read
    trailer: dict[str, Any] | None = None


def _records(path: str, fh: BinaryIO) -> Iterator[tuple[int, object]]:
    """(record number, decoded record) until the end; a record cut short ends it."""
    import msgspec

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
    from analyzer.outputs import note_input

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


def _header(path: str, obj: object) -> dict[str, Any]:
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


def _count(d: dict[str, int], key: str, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n


def _take(rec: Recording, n: int, obj: object) -> None:
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or kind is None:
        rec.bad_records += 1
        _count(rec.malformed, "unreadable record")
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
            _count(rec.malformed, "unreadable record")
            return
        events: list[Event] = []
        for r in raw:
            try:
                events.append(_event_from_record(r))
            except WireError:
                _count(rec.malformed, "malformed event record")
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
            _count(rec.malformed, reason, count)
    elif kind == "end":
        rec.trailer = obj
    else:
        _count(rec.malformed, "unknown record kind")


# -- what the events show --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MediumFigures:
    """One medium's blocks (``GPU``: the engine's HBM prefix cache; ``CPU``, ``DISK``, ...:
    the tiers below it), as the events report them."""

    medium: str
    block_size: int  # tokens per block as stored there (LMCache's chunks are 256)
    stored_blocks: int
    removed_blocks: int  # evictions (BlockRemoved)
    removed_unseen_blocks: int  # removals of blocks stored before the recording began
    peak_blocks: int
    mean_blocks: float  # time-weighted over the recording
    final_blocks: int
    evictions_per_s: float
    median_lifetime_s: float | None  # store to eviction, of blocks both seen
    p90_lifetime_s: float | None

    @property
    def peak_tokens(self) -> int:
        return self.peak_blocks * self.block_size

    def to_json(self, bytes_per_token: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "medium": self.medium,
            "block_size": self.block_size,
            "stored_blocks": self.stored_blocks,
            "removed_blocks": self.removed_blocks,
            "removed_unseen_blocks": self.removed_unseen_blocks,
            "peak_blocks": self.peak_blocks,
            "peak_tokens": self.peak_tokens,
            "mean_blocks": self.mean_blocks,
            "final_blocks": self.final_blocks,
            "evictions_per_s": self.evictions_per_s,
            "median_lifetime_s": self.median_lifetime_s,
            "p90_lifetime_s": self.p90_lifetime_s,
        }
        if bytes_per_token is not None:
            out["peak_gb"] = self.peak_tokens * bytes_per_token / 1e9
        return out


@dataclass(frozen=True, slots=True)
class OccupancyPoint:
    """Blocks held per medium at ``t_s`` seconds after the first batch (the highest
    count within the point's slice of the recording)."""

    t_s: float
    blocks: tuple[tuple[str, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"t_s": self.t_s, "blocks": dict(self.blocks)}


@dataclass(frozen=True, slots=True)
class EngineEvents:
    """What KV-event recordings show of the engines' own caches: the measured baseline
    beside kvpool's replay (docs/formats.md, "KV-event recordings")."""

    recordings: int
    engines: int  # endpoints that sent batches
    batches: int
    events: int
    span_s: float
    block_size: int  # the engine's own (HBM) blocks, the trace's block size
    media: tuple[MediumFigures, ...]
    clears: int
    requests: int  # reconstructed (the canonical trace's rows)
    requests_prefix_unseen: int  # extend a prefix stored before the recording began
    prompt_tokens: int  # reconstructed, summed
    hit_tokens: int  # of those, found cached by the engine (the parent chain it extended)
    gaps: int
    lost_batches: int
    replayed_batches: int
    restarts: int
    malformed: tuple[tuple[str, int], ...]
    complete: bool  # every recording ended with its trailer
    timeline: tuple[OccupancyPoint, ...] = ()
    bytes_per_token: int | None = None  # the model's KV bytes per token, for sizes in GB

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def medium(self, name: str) -> MediumFigures | None:
        return next((m for m in self.media if m.medium == name), None)

    def to_json(self) -> dict[str, Any]:
        bytes_per_token = self.bytes_per_token
        return {
            "recordings": self.recordings,
            "engines": self.engines,
            "batches": self.batches,
            "events": self.events,
            "span_s": self.span_s,
            "block_size": self.block_size,
            "media": [m.to_json(bytes_per_token) for m in self.media],
            "clears": self.clears,
            "requests": self.requests,
            "requests_prefix_unseen": self.requests_prefix_unseen,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "gaps": self.gaps,
            "lost_batches": self.lost_batches,
            "replayed_batches": self.replayed_batches,
            "restarts": self.restarts,
            "malformed": dict(self.malformed),
            "complete": self.complete,
            "bytes_per_token": bytes_per_token,
            "timeline": [p.to_json() for p in self.timeline],
        }

    def lines(self) -> list[str]:
        """The figures as a few plain lines (the terminal summary of ``kvpool reuse``)."""
        out = [
            f"engine KV events: {self.engines} engine(s), {self.batches:,} batches, "
            f"{self.events:,} events over {self.span_s:,.1f} s; blocks of {self.block_size} "
            "tokens",
            f"  prefix hits the engine found: {self.hit_rate:.1%} of "
            f"{self.prompt_tokens:,} stored prompt tokens ({self.requests:,} requests "
            "reconstructed)",
        ]
        for m in self.media:
            life = (
                f", median lifetime {m.median_lifetime_s:,.1f} s"
                if m.median_lifetime_s is not None
                else ""
            )
            out.append(
                f"  {m.medium}: peak {m.peak_blocks:,} blocks ({m.peak_tokens:,} tokens), mean "
                f"{m.mean_blocks:,.0f}; {m.stored_blocks:,} stored, {m.removed_blocks:,} "
                f"evicted ({m.evictions_per_s:,.2f}/s{life})"
            )
        if self.clears:
            out.append(f"  cache cleared {self.clears:,} time(s) (AllBlocksCleared)")
        if self.gaps or self.malformed or not self.complete:
            bad = ", ".join(f"{n:,} {r}" for r, n in self.malformed)
            out.append(
                f"  stream: {self.gaps:,} sequence gap(s), {self.lost_batches:,} batches lost, "
                f"{self.replayed_batches:,} replayed"
                + (f"; skipped: {bad}" if bad else "")
                + ("" if self.complete else "; a recording ends without its trailer")
            )
        return out


# -- rebuilding requests -----------------------------------------------------------------------


@dataclass(slots=True)
class _Request:
    endpoint: int
    arrival: float
    last: float  # time of its latest store
    chain: list[int]  # engine block hashes, root first
    hit_blocks: int
    session: str
    model: str | None
    prefix_unseen: bool


@dataclass
class _Medium:
    block_size: int = 0
    stored: int = 0
    removed: int = 0
    removed_unseen: int = 0
    held: int = 0
    peak: int = 0
    area: float = 0.0  # blocks x seconds
    since: float | None = None
    lifetimes: array[float] = field(default_factory=lambda: array("d"))


class Rebuilder:
    """Requests and cache figures from batches taken in time order (:meth:`add`).

    A ``BlockStored`` of the engine's own cache (medium GPU, or none) either continues
    a request (its parent is the last block that request stored, within
    ``CONTINUATION_GAP_S``) or starts one whose prompt is the parent's whole chain
    followed by the new blocks: the blocks before the new ones were found cached (the
    engine only stores what it computed), which is the hit the request got. Every event,
    of every medium, moves that medium's occupancy.
    """

    def __init__(self) -> None:
        self.parent_of: dict[int, int | None] = {}
        self.unseen_roots: set[int] = set()  # parents first seen as a parent
        self.requests: list[_Request] = []
        self.open: dict[tuple[int, int], int] = {}  # (endpoint, tail hash) -> request
        self.tail_session: dict[tuple[int, int], str] = {}
        # (endpoint, medium, KV cache group) -> {block: stored at}
        self.held: dict[tuple[int, str, int | None], dict[int, float]] = {}
        self.media: dict[str, _Medium] = {}
        self.block_size: int | None = None
        self.group: int | None = None
        self.skipped: dict[str, int] = {}
        self.clears = 0
        self.events = 0
        self.batches = 0
        self.engines: set[int] = set()
        self.first: float | None = None
        self.last = 0.0
        self.samples: list[tuple[float, dict[str, int]]] = []

    # per batch ------------------------------------------------------------------------------

    def add(self, endpoint: int, ts: float, events: list[Event]) -> None:
        if self.first is None:
            self.first = ts
        ts = max(ts, self.last)  # a batch stamped earlier than the one before: now
        self._advance(ts)
        self.batches += 1
        self.engines.add(endpoint)
        for ev in events:
            self.events += 1
            if isinstance(ev, Stored):
                self._stored(endpoint, ts, ev)
            elif isinstance(ev, Removed):
                self._removed(endpoint, ts, ev)
            else:
                self._cleared(endpoint, ts)
        self.samples.append((ts, {k: m.held for k, m in self.media.items()}))

    def _advance(self, ts: float) -> None:
        for m in self.media.values():
            if m.since is not None:
                m.area += m.held * (ts - m.since)
            m.since = ts
        self.last = ts

    def _medium(self, name: str, block_size: int | None) -> _Medium:
        m = self.media.get(name)
        if m is None:
            m = self.media[name] = _Medium(since=self.last)
        if block_size and not m.block_size:
            m.block_size = block_size
        return m

    def _stored(self, endpoint: int, ts: float, ev: Stored) -> None:
        medium = ev.medium or "GPU"
        m = self._medium(medium, ev.block_size)
        # per KV cache group too: a hybrid model's groups hold blocks of their own
        held = self.held.setdefault((endpoint, medium, ev.group), {})
        for h in ev.hashes:
            if h not in held:
                held[h] = ts
                m.held += 1
            m.stored += 1
        m.peak = max(m.peak, m.held)
        if ev.medium not in PRIMARY_MEDIA or not ev.hashes:
            return
        if self.group is None:
            self.group = ev.group
        if ev.group != self.group:
            return  # another KV cache group of a hybrid model: the same requests again
        if self.block_size is None:
            self.block_size = ev.block_size
        if ev.block_size != self.block_size:
            _count(self.skipped, "block size differs from the engine's")
            return
        if ev.n_tokens < len(ev.hashes) * ev.block_size:
            # a partial block: the chain's full blocks end before it (SGLang's last page)
            keep = ev.n_tokens // ev.block_size
            if keep == 0:
                return
            ev = Stored(
                ev.hashes[:keep],
                ev.parent,
                keep * ev.block_size,
                ev.block_size,
                ev.medium,
                ev.lora,
                ev.group,
                ev.session,
            )
        self._chain(endpoint, ts, ev)

    def _chain(self, endpoint: int, ts: float, ev: Stored) -> None:
        parent = ev.parent
        prev = parent
        for h in ev.hashes:
            known = self.parent_of.get(h, -1)
            if known == -1 or (known is None and h in self.unseen_roots):
                # new, or first met as the parent of a store: now its own parent is known
                self.parent_of[h] = prev
                self.unseen_roots.discard(h)
            elif known != prev:
                _count(self.skipped, "block stored under two parents (kept the first)")
            prev = h
        key = (endpoint, parent) if parent is not None else None
        i = self.open.pop(key, None) if key is not None else None
        if key is not None and i is not None and ts - self.requests[i].last <= CONTINUATION_GAP_S:
            req = self.requests[i]
            # a block inside one request's chain: a store after it is another session's
            self.tail_session.pop(key, None)
            req.chain.extend(ev.hashes)
            req.last = ts
        else:
            head, unseen = self._path(parent)
            if head is None:
                _count(self.skipped, "block hashes form a loop")
                return
            session = ev.session
            if session is None and key is not None:
                session = self.tail_session.get(key)
            req = _Request(
                endpoint=endpoint,
                arrival=ts,
                last=ts,
                chain=head + ev.hashes,
                hit_blocks=len(head),
                session=session or f"e{endpoint}-r{len(self.requests)}",
                model=ev.lora,
                prefix_unseen=unseen,
            )
            self.requests.append(req)
            i = len(self.requests) - 1
        tail = (endpoint, ev.hashes[-1])
        self.open[tail] = i
        self.tail_session[tail] = self.requests[i].session

    def _path(self, h: int | None) -> tuple[list[int] | None, bool]:
        """The chain ending at ``h``, root first, and whether it reaches back to a block
        stored before the recording began (that block then stands first)."""
        out: list[int] = []
        limit = len(self.parent_of) + 1
        while h is not None:
            out.append(h)
            if len(out) > limit:
                return None, False
            p = self.parent_of.get(h, -1)
            if p == -1:  # never seen stored: it was cached before the recording began
                self.parent_of[h] = None
                self.unseen_roots.add(h)
                break
            h = p
        out.reverse()
        return out, bool(out) and out[0] in self.unseen_roots

    def _removed(self, endpoint: int, ts: float, ev: Removed) -> None:
        medium = ev.medium or "GPU"
        m = self._medium(medium, None)
        held = self.held.setdefault((endpoint, medium, ev.group), {})
        for h in ev.hashes:
            at = held.pop(h, None)
            m.removed += 1
            if at is None:
                m.removed_unseen += 1
            else:
                m.held -= 1
                m.lifetimes.append(ts - at)
            if ev.medium in PRIMARY_MEDIA:
                self.open.pop((endpoint, h), None)

    def _cleared(self, endpoint: int, ts: float) -> None:
        self.clears += 1
        for (e, medium, _), held in self.held.items():
            if e == endpoint:
                self.media[medium].held -= len(held)
                held.clear()
        for key in [k for k in self.open if k[0] == endpoint]:
            del self.open[key]

    # the results ---------------------------------------------------------------------------

    def figures(self, recs: list[Recording]) -> EngineEvents:
        first = self.first or 0.0
        span = max(0.0, self.last - first)
        self._advance(self.last)
        media = []
        for name in sorted(self.media, key=lambda k: (k != "GPU", k)):
            m = self.media[name]
            life = np.frombuffer(m.lifetimes, dtype=np.float64) if m.lifetimes else None
            media.append(
                MediumFigures(
                    medium=name,
                    block_size=m.block_size or (self.block_size or 0),
                    stored_blocks=m.stored,
                    removed_blocks=m.removed,
                    removed_unseen_blocks=m.removed_unseen,
                    peak_blocks=m.peak,
                    mean_blocks=m.area / span if span > 0 else float(m.held),
                    final_blocks=m.held,
                    evictions_per_s=m.removed / span if span > 0 else 0.0,
                    median_lifetime_s=None if life is None else float(np.median(life)),
                    p90_lifetime_s=None if life is None else float(np.quantile(life, 0.9)),
                )
            )
        malformed: dict[str, int] = dict(self.skipped)
        for r in recs:
            for k, v in r.malformed.items():
                _count(malformed, k, v)
        prompt = sum(len(r.chain) for r in self.requests) * (self.block_size or 0)
        hits = sum(r.hit_blocks for r in self.requests) * (self.block_size or 0)
        return EngineEvents(
            recordings=len(recs),
            engines=len(self.engines),
            batches=self.batches,
            events=self.events,
            span_s=span,
            block_size=self.block_size or 0,
            media=tuple(media),
            clears=self.clears,
            requests=len(self.requests),
            requests_prefix_unseen=sum(r.prefix_unseen for r in self.requests),
            prompt_tokens=prompt,
            hit_tokens=hits,
            gaps=sum(r.gaps for r in recs),
            lost_batches=sum(r.lost_batches for r in recs),
            replayed_batches=sum(r.replayed_batches for r in recs),
            restarts=sum(r.restarts for r in recs),
            malformed=tuple(sorted(malformed.items())),
            complete=all(r.trailer is not None for r in recs),
            timeline=self._timeline(first),
        )

    def _timeline(self, first: float) -> tuple[OccupancyPoint, ...]:
        """At most ``TIMELINE_POINTS`` points: the recording cut in equal slices of time,
        each point the highest count of each medium within its slice."""
        if not self.samples:
            return ()
        span = self.samples[-1][0] - first
        width = span / TIMELINE_POINTS if span > 0 else 1.0
        points: list[OccupancyPoint] = []
        cur: dict[str, int] = {}
        slot = None
        start = 0.0
        for ts, held in self.samples:
            s = min(int((ts - first) / width), TIMELINE_POINTS - 1)
            if slot is not None and s != slot:
                points.append(OccupancyPoint(start, tuple(sorted(cur.items()))))
                cur = {}
            if s != slot:
                slot, start = s, s * width
            for k, v in held.items():
                cur[k] = max(cur.get(k, 0), v)
        points.append(OccupancyPoint(start, tuple(sorted(cur.items()))))
        return tuple(points)


def rebuild(recs: list[Recording]) -> Rebuilder:
    """Every batch of ``recs`` through one :class:`Rebuilder`, in time order (ties: by
    recording, then endpoint and sequence)."""
    order = sorted(
        (b.ts, i, b.endpoint, b.seq, j) for i, r in enumerate(recs) for j, b in enumerate(r.batches)
    )
    rb = Rebuilder()
    for _, i, _, _, j in order:
        b = recs[i].batches[j]
        # endpoints are numbered per recording: keep two recordings' engines apart
        rb.add(i * 1_000_000 + b.endpoint, b.ts, b.events)
    return rb


def canonical_table(rb: Rebuilder, salt: bytes, source: str) -> tuple[pa.Table, dict[str, int]]:
    """The rebuilt requests as a canonical table (docs/schema.md), and what it left out."""
    import hashlib

    from analyzer.blocks import id_hashes, salt_id
    from analyzer.ingest.spool import list_array
    from analyzer.trace import CANONICAL_SCHEMA, trace_metadata

    reqs = rb.requests
    bs = rb.block_size or 16

    def pseudonym(value: str) -> str:
        # as ingest writes every session id: a salted pseudonym, never the value
        d = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8, key=salt)
        return "s-" + d.hexdigest()

    first = reqs[0].arrival if reqs else 0.0
    lengths = np.fromiter((len(r.chain) for r in reqs), dtype=np.int64, count=len(reqs))
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise InputError(
            f"{offsets[-1]:,} blocks do not fit in one canonical file",
            hint="record a shorter window, or convert the recordings one at a time",
        )
    flat = np.fromiter((h for r in reqs for h in r.chain), dtype=np.uint64, count=int(offsets[-1]))
    # The engine's hashes, keyed with the salt as pre-hashed traces' ids are: equal
    # blocks stay equal, and nothing in the file can be matched to the engine's own.
    hashes = id_hashes(b"kv-events", flat.view(np.int64), salt)
    tokens = lengths * bs
    n = len(reqs)

    def strings(values: list[str | None]) -> pa.Array:
        return pa.array(values, type=pa.string())

    cols = {
        "request_id": strings([f"e{r.endpoint}-{i}" for i, r in enumerate(reqs)]),
        "arrival_s": pa.array([r.arrival - first for r in reqs], type=pa.float64()),
        "session_id": strings([pseudonym(r.session) for r in reqs]),
        "tenant": strings([r.model for r in reqs]),
        "model": strings([r.model for r in reqs]),
        "prompt_tokens": pa.array(tokens, type=pa.int64()),
        "output_tokens": pa.nulls(n, pa.int64()),
        "block_hashes": list_array(offsets, hashes),
        "content_hashes": pa.nulls(n, pa.list_(pa.uint64())),
        "token_lcp_prev": pa.nulls(n, pa.int64()),
        "parent_request_id": pa.nulls(n, pa.string()),
        "turn": pa.nulls(n, pa.int64()),
        "count_only": pa.array(np.zeros(n, dtype=bool)),
        "approx_lengths": pa.array([r.prefix_unseen for r in reqs], type=pa.bool_()),
        "cached_tokens": pa.array([r.hit_blocks * bs for r in reqs], type=pa.int64()),
        "engine_prompt_tokens": pa.array(tokens, type=pa.int64()),
    }
    for f in CANONICAL_SCHEMA:  # what the events cannot say (a user, ...): null
        if f.name not in cols:
            assert f.nullable, f"the events give no {f.name}"
            cols[f.name] = pa.nulls(n, f.type)
    meta = trace_metadata(
        block_size=bs,
        tokenizer="",
        template="",
        hash_keys="",
        source=source,
        t0_epoch_s=repr(first) if reqs else "",
        salt_id=salt_id(salt),
    )
    table = pa.Table.from_pydict(cols, schema=CANONICAL_SCHEMA).replace_schema_metadata(meta)
    return table, dict(rb.skipped)


def open_recordings(paths: list[str], opts: Any, block_size: int | None = None) -> Any:
    """KV-event recordings as a :class:`~analyzer.ingest.options.LoadedTrace` (its
    ``engine`` the :class:`EngineEvents`); ``block_size`` coarsens the trace to a
    multiple of the engine's blocks."""
    from analyzer.blocks import load_salt
    from analyzer.errors import UsageError, shown
    from analyzer.ingest.options import LoadedTrace, SkipSummary

    recs = [read_recording(p) for p in paths]
    rb = rebuild(recs)
    salt = opts.salt if opts.salt is not None else load_salt(opts.salt_file)
    source = ",".join(
        f"kv-events:{Path(p).name}" if opts.keep_names else "kv-events" for p in paths
    )
    table, left_out = canonical_table(rb, salt, source)
    engine = rb.figures(recs)
    if not table.num_rows:
        raise InputError(
            "no requests in "
            + ", ".join(map(shown, paths))
            + f": {engine.batches:,} batches, {engine.events:,} events, none a store of the "
            "engine's own (GPU) cache",
            hint="record while the engine serves requests (kvpool record --duration S)",
        )
    fine = engine.block_size
    if block_size is not None and block_size != fine:
        if block_size % fine:
            raise UsageError(
                f"the engine's blocks are {fine} tokens; --block-size {block_size} is not a "
                "multiple of it",
                hint=f"use {fine} or a multiple of it",
            )
        from analyzer.ingest.pipeline import coarsen_table

        table = coarsen_table(table, block_size // fine)
    # What the wire or the file held that could not be read, and stores left out of
    # the requests, are the recording's skipped "rows" (counted; the engine figures
    # keep them apart under ``malformed``).
    skipped = SkipSummary(max_examples=opts.max_examples)
    for r in recs:
        for reason, n in sorted(r.malformed.items()):
            for _ in range(min(n, opts.max_examples)):
                skipped.add(reason, r.path, None, None)
            skipped.total += n - min(n, opts.max_examples)
            skipped.by_reason[reason] += n - min(n, opts.max_examples)
    for reason, n in sorted(left_out.items()):
        skipped.total += n
        skipped.by_reason[reason] = skipped.by_reason.get(reason, 0) + n
    notes = []
    if engine.requests_prefix_unseen:
        notes.append(
            f"{engine.requests_prefix_unseen:,} requests extend a prefix the engine cached "
            "before the recording began: their prompts count from that prefix's last block "
            "(approx_lengths)"
        )
    if engine.lost_batches:
        notes.append(
            f"{engine.lost_batches:,} event batches were lost in {engine.gaps:,} sequence "
            "gap(s) and not replayed (give --replay to kvpool record): requests and "
            "occupancy miss what they held"
        )
    if not engine.complete:
        notes.append("a recording ends without its trailer (cut short): read up to the cut")
    return LoadedTrace(
        table=table,
        skipped=skipped,
        sources=list(paths),
        formats=["kv-events"] * len(paths),
        notes=notes,
        engine=engine,
    )
