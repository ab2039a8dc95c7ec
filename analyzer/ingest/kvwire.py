"""The engines' KV events on the wire, normalized: ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared`` in either published encoding, and the ``EventBatch`` around them.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

_MASK64 = (1 << 64) - 1


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

    def record(self) -> list[object]:
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

    def record(self) -> list[object]:
        return ["R", self.hashes, self.medium, self.group]


@dataclass(slots=True)
class Cleared:
    """``AllBlocksCleared``: the engine reset its prefix cache."""

    def record(self) -> list[object]:
        return ["C"]


Event = Stored | Removed | Cleared


def block_hash(value: object, name: str) -> int:
    """A block hash as an int: the low 64 bits of an int, the last 8 bytes of bytes."""
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


def block_hashes(value: object, name: str) -> list[int]:
    """A list of block hashes (:func:`block_hash`)."""
    if not isinstance(value, list | tuple):
        raise WireError("missing field" if value is None else "mistyped field", name)
    return [block_hash(v, name) for v in value]


def opt_str(value: object, name: str) -> str | None:
    """A string field that may be absent."""
    if value is None or isinstance(value, str):
        return value
    raise WireError("mistyped field", name)


def opt_int(value: object, name: str) -> int | None:
    """An int field that may be absent (a bool is not one)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError("mistyped field", name)
    return value


def _stored(f: dict[str, object]) -> Stored:
    hashes = block_hashes(f.get("block_hashes"), "block_hashes")
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
        parent=None if parent is None else block_hash(parent, "parent_block_hash"),
        n_tokens=len(tokens),
        block_size=bs,
        medium=opt_str(f.get("medium"), "medium"),
        lora=lora if isinstance(lora, str) else None,
        group=opt_int(f.get("group_idx"), "group_idx"),
        session=opt_str(f.get("session_id"), "session_id"),
    )


def _removed(f: dict[str, object]) -> Removed:
    return Removed(
        hashes=block_hashes(f.get("block_hashes"), "block_hashes"),
        medium=opt_str(f.get("medium"), "medium"),
        group=opt_int(f.get("group_idx"), "group_idx"),
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
