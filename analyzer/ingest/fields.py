"""One row of a log as read, before tokenization and hashing (:class:`Raw`), the errors
that skip it (:class:`RowError`), each file's reading state (:class:`FileContext`), and the
helpers every reader reads a record's fields with.

A reader yields ``(line, record)`` or ``(line, RowError)`` (:data:`Record`); the builder
decides whether an error skips the row (default) or stops the run (``--strict``). Field
meanings and units per format are documented in docs/formats.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from analyzer.ingest.detect import Format
from analyzer.ingest.options import IngestOptions
from analyzer.ingest.timeparse import parse_time
from analyzer.jsontypes import JSONObject

TIME_FIELDS = (
    "timestamp",
    "ts",
    "time",
    "created",
    "created_at",
    "start_time",
    "startTime",
    "request_time",
    "requested_at",
    "arrival_time",
    "@timestamp",
    "datetime",
    "date",
    "TIMESTAMP",
    "Timestamp",
)

# Native timestamp unit and block size of the formats that define them.
NATIVE_UNIT: dict[str, str] = {
    Format.MOONCAKE: "ms",
    Format.BAILIAN: "s",
    Format.RAGPULSE: "s",
    Format.BURSTGPT: "s",
}
NATIVE_BLOCK: dict[str, int] = {Format.MOONCAKE: 512, Format.BAILIAN: 16}
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


class RowError(Exception):
    """One bad row: a short reason (the skip-summary key) and the field at fault."""

    def __init__(self, reason: str, field: str | None = None, fatal: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field
        self.fatal = fatal  # the rest of the file is unreadable (truncated stream)


@dataclass(slots=True)
class Raw:
    """One request as read, before tokenization and hashing."""

    time: float | None = None
    time_iso: bool = False
    request_id: str | None = None
    session: str | None = None
    tenant: str | None = None
    user: str | None = None  # the end user or session owner the log names
    model: str | None = None
    output_tokens: int | None = None
    output_text: str | None = None  # counted with the tokenizer when usage is absent
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    engine_prompt_tokens: int | None = None  # usage.prompt_tokens
    parent: str | None = None
    turn: int | None = None
    body: JSONObject | None = None  # chat-completions request body
    text: str | None = None  # raw prompt text
    tokens: np.ndarray | None = None  # token ids given by the format (RAGPulse)
    block_ids: list[int] | None = None  # the trace's own chained block ids
    prompt_tokens: int | None = None  # from the trace (count-only and pre-hashed formats)
    count_only: bool = False
    approx: bool = False


@dataclass(slots=True)
class RunState:
    """What readers carry from file to file and row to row within one run."""

    # Every (path, format) of the run: a Langfuse observation whose session is on its
    # trace's row looks in every Langfuse input for it.
    inputs: tuple[tuple[str, str], ...] = ()
    bailian_roots: dict[str, str] = field(default_factory=dict)  # chat id -> session root
    # RAGPulse component lengths, per folder: kind -> component id -> tokens.
    ragpulse_lengths: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)
    ragpulse_pad: int = 0  # padding tokens handed out so far (each request's are unique)
    langfuse_traces: dict[str, tuple[str | None, str | None]] | None = None  # id -> (session, user)


@dataclass
class FileContext:
    path: str
    fmt: str
    opts: IngestOptions
    timed: bool | None = None  # decided by the first row: does this file carry times?
    time_name: str | None = None  # the field the file's times were found in
    shared: RunState = field(default_factory=lambda: RunState())  # per-run reader state
    # The file's name and folder, taken once: two Paths a row took about 0.3 s of the
    # 2.9 s `kvpool reuse` of the RAGPulse trace.
    name: str = field(init=False)
    folder: str = field(init=False)

    def __post_init__(self) -> None:
        self.name, self.folder = Path(self.path).name, str(Path(self.path).parent)


# -- field helpers -----------------------------------------------------------------------


def get_path(rec: JSONObject, dotted: str) -> object:
    cur: object = rec
    for key in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return as_str(cur)


def as_int(value: object, field: str, required: bool = True) -> int | None:
    if value is None or value == "":
        if required:
            raise RowError("missing field", field)
        return None
    if isinstance(value, bool):
        raise RowError("mistyped field", field)
    if isinstance(value, int):
        out = value
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    elif isinstance(value, str):
        try:
            out = int(float(value.strip()))
        except (ValueError, OverflowError) as exc:  # "abc", "nan"; "inf"
            raise RowError("mistyped field", field) from exc
    else:
        raise RowError("mistyped field", field)
    if out < 0:
        raise RowError("negative value", field)
    if out > I64_MAX:
        raise RowError("value out of 64-bit range", field)
    return out


def as_str(value: object) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True)


def maybe_json(value: object, field: str) -> object:
    """A cell holding JSON, parsed (orjson first, as JSON lines are; what it refuses is
    read by ``json``, which also names the reason a cell is bad)."""
    if isinstance(value, str):
        s = value.strip()
        if not s:
            return None
        try:
            return orjson.loads(s)
        except orjson.JSONDecodeError:
            pass
        try:
            return json.loads(s)
        except json.JSONDecodeError as exc:
            raise RowError("malformed JSON", field) from exc
    return value


def take_time(rec: JSONObject, ctx: FileContext, names: tuple[str, ...] = TIME_FIELDS) -> Raw:
    """A Raw with the row's time set; applies the per-file timed/untimed rule."""
    opts = ctx.opts
    forced = opts.time_field or opts.time_column
    fname: str | None = None
    value: object = None
    if forced:
        fname, value = forced, get_path(rec, forced)
    else:
        for n in names:
            v = rec.get(n)
            if v is not None and v != "":
                fname, value = n, v
                break
    raw = Raw()
    if value is None or value == "":
        if forced:  # the user named the field: every row must have it
            raise RowError("missing timestamp", forced)
        if ctx.timed is None:
            ctx.timed = False
        elif ctx.timed:
            raise RowError("missing timestamp", ctx.time_name or "timestamp")
        return raw
    if ctx.timed is False:
        return raw  # the file started without times: arrival is file order
    try:
        t, iso = parse_time(value)
    except (ValueError, OverflowError) as exc:
        raise RowError("bad timestamp", fname) from exc
    if t < 0:
        raise RowError("negative timestamp", fname)
    ctx.timed = True
    ctx.time_name = ctx.time_name or fname
    raw.time, raw.time_iso = t, iso
    return raw


# What a record stream yields: a record's line (or row) and the record, or why it is bad.
Record = tuple[int, JSONObject | RowError]
# Where a row names its tenant, in order of precedence.
TENANT_KEYS = ("tenant", "tenant_id", "org", "organization", "team")


def named_field(rec: JSONObject, name: str) -> str | None:
    """The value a ``--tenant-field`` / ``--user-field`` names in a record, as text: the
    column or key of that exact name, else the dotted path, read into cells that hold JSON
    text (a gateway's ``request_json``); None when absent or empty."""
    if name in rec:
        return as_str(rec[name])
    cur: object = rec
    for key in name.split("."):
        if isinstance(cur, str):
            try:
                cur = maybe_json(cur, key)
            except RowError:
                return None
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return as_str(cur)


def take_usage(raw: Raw, usage: object, where: str = "usage") -> None:
    """Output tokens and the measured cache hits of an OpenAI ``usage`` object into
    ``raw`` (nothing when ``usage`` is not an object); ``where`` names it in errors."""
    if not isinstance(usage, dict):
        return
    for k in ("completion_tokens", "output_tokens"):
        if usage.get(k) is not None:
            raw.output_tokens = as_int(usage[k], f"{where}.{k}")
            break
    # The hits today's engine measured (vLLM with --enable-prompt-tokens-details,
    # SGLang, OpenAI): cached prompt tokens, and the prompt as the engine counted it.
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        cached = as_int(details["cached_tokens"], f"{where}.prompt_tokens_details.cached_tokens")
        prompt = None
        if usage.get("prompt_tokens") is not None:
            prompt = as_int(usage["prompt_tokens"], f"{where}.prompt_tokens")
        take_cached(raw, cached, prompt, f"{where}.prompt_tokens_details.cached_tokens")


def take_cached(raw: Raw, cached: int | None, prompt: int | None, field: str) -> None:
    """The engine's measured hit (``cached`` of ``prompt`` tokens) into ``raw``; more hits
    than prompt tokens is a bad row naming ``field``."""
    if cached is None:
        return
    if prompt is not None and cached > prompt:
        raise RowError("invalid value", field)
    raw.cached_tokens, raw.engine_prompt_tokens = cached, prompt
