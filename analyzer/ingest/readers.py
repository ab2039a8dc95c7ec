"""Readers of request logs and public traces: each parser turns one record of its format
into a :class:`~analyzer.ingest.fields.Raw` request (OpenAI-style chat logs and gateway
tables, generic logs, Mooncake, Bailian, RAGPulse, Azure, BurstGPT). The products'
exports have theirs in :mod:`analyzer.ingest.product_logs`; :mod:`analyzer.ingest.registry`
holds both. Field meanings and units per format are documented in docs/formats.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from analyzer.errors import InputError, Location
from analyzer.ingest.detect import Format
from analyzer.ingest.fields import (
    I64_MAX,
    I64_MIN,
    TENANT_KEYS,
    FileContext,
    Raw,
    RowError,
    as_int,
    as_str,
    maybe_json,
    take_time,
    take_usage,
)
from analyzer.ingest.streams import json_records
from analyzer.jsontypes import JSONObject, JSONValue

# -- parsers: one record -> Raw ----------------------------------------------------------

_BODY_KEYS = ("request", "body", "request_json", "request_body")
_RESPONSE_KEYS = ("response", "response_json", "response_body")
_ID_KEYS = ("request_id", "id", "custom_id")
# (source, key) in order of precedence; sources: 0 body, 1 row, 2 body metadata, 3 row
# metadata.
_SESSION_SOURCES = (
    (0, "prompt_cache_key"),
    (1, "prompt_cache_key"),
    (0, "user"),
    (1, "user"),
    (2, "session_id"),
    (3, "session_id"),
    (1, "session_id"),
    (1, "conversation_id"),
)
_TENANT_SOURCES = (*((1, k) for k in TENANT_KEYS), (2, "tenant"), (3, "tenant"))
# The end user: OpenAI's ``user`` ("a stable identifier for your end-users") or its
# successor ``safety_identifier``, in the body or beside it, or a ``user_id``.
_USER_SOURCES = (
    (0, "user"),
    (0, "safety_identifier"),
    (1, "user"),
    (1, "user_id"),
    (2, "user_id"),
    (3, "user_id"),
)
_USER_COLUMNS = ("user_id", "user")


def parse_openai(rec: JSONObject, ctx: FileContext) -> Raw:
    """OpenAI chat-completions log rows, Batch input lines and gateway CSV/Parquet rows."""
    body: JSONObject | None = None
    if isinstance(rec.get("messages"), list) or isinstance(rec.get("prompt"), str):
        body = rec
    else:
        for k in _BODY_KEYS:
            if k in rec and rec[k] is not None:
                v = maybe_json(rec[k], k)
                if isinstance(v, dict):
                    body = v
                    break
                if v is not None:
                    raise RowError("mistyped field", k)
    if body is None:
        for k in ("messages", "prompt"):
            if rec.get(k) is not None:  # present but neither a list nor a string
                raise RowError("mistyped field", k)
        raise RowError("missing field", "messages")
    raw = take_time(rec, ctx)
    if isinstance(body.get("messages"), list):
        raw.body = body
    elif isinstance(prompt := body.get("prompt"), str):
        raw.text = prompt
    elif "messages" in body:
        raise RowError("mistyped field", "messages")
    else:
        raise RowError("missing field", "messages")
    resp = None
    for k in _RESPONSE_KEYS:
        if rec.get(k) is not None:
            resp = maybe_json(rec[k], k)
            break
    if isinstance(resp, dict) and isinstance(resp.get("body"), dict):
        resp = resp["body"]  # Batch output lines wrap the response
    usage = (resp.get("usage") if isinstance(resp, dict) else None) or rec.get("usage")
    take_usage(raw, maybe_json(usage, "usage"))
    if raw.output_tokens is None:
        for k in ("output_tokens", "completion_tokens"):
            if rec.get(k) not in (None, ""):
                raw.output_tokens = as_int(rec[k], k)
                break
    if raw.output_tokens is None and isinstance(resp, dict):
        choices = resp.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = choices[0].get("message") or {}
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                raw.output_text = content
            elif isinstance(choices[0].get("text"), str):
                raw.output_text = choices[0]["text"]
    meta = body.get("metadata")
    rmeta = rec.get("metadata")
    where = (
        body,
        rec,
        meta if isinstance(meta, dict) else {},
        rmeta if isinstance(rmeta, dict) else {},
    )
    for i, k in _SESSION_SOURCES:  # first present wins; stops at the first
        v = where[i].get(k)
        if v is not None and v != "":
            raw.session = as_str(v)
            break
    raw.model = as_str(body.get("model") or rec.get("model") or rec.get("model_name"))
    for i, k in _TENANT_SOURCES:
        v = where[i].get(k)
        if v is not None and v != "":
            raw.tenant = as_str(v)
            break
    for i, k in _USER_SOURCES:
        v = where[i].get(k)
        if v is not None and v != "":
            raw.user = as_str(v)
            break
    for k in _ID_KEYS:
        v = rec.get(k)
        if v is not None and v != "":
            raw.request_id = as_str(v)
            break
    return raw


_PROMPT_GUESSES = ("prompt", "text", "input", "messages", "question", "query")
# Columns that count tokens: a table with these and no prompt is a count-only trace.
_COUNT_COLUMNS = (
    "input_tokens",
    "prompt_tokens",
    "output_tokens",
    "completion_tokens",
    "input_length",
    "num_tokens",
    "tokens",
)


def _no_prompt_column(rec: JSONObject, ctx: FileContext) -> InputError:
    """No prompt column: a table of token counts is pointed at the count-only formats."""
    columns = ", ".join(map(str, rec))
    counts = [c for c in rec if str(c).strip().lower() in _COUNT_COLUMNS]
    if counts:
        return InputError(
            f"no prompt column: this table has token counts ({', '.join(counts)}) but no "
            "prompt text, so prefix reuse cannot be measured from it",
            Location(ctx.path),
            hint="kvpool reads such count-only traces (arrivals and lengths) as --format "
            "azure (columns TIMESTAMP, ContextTokens, GeneratedTokens) or --format burstgpt "
            "(Timestamp, Request tokens, Response tokens): rename the columns to one of "
            "these (docs/formats.md, count-only traces); or name the prompt with "
            f"--prompt-column (columns: {columns})",
        )
    return InputError(
        "no prompt column found",
        Location(ctx.path),
        hint=f"name it with --prompt-column (columns: {columns})",
    )


def parse_generic(rec: JSONObject, ctx: FileContext) -> Raw:
    """A table with a prompt column (text, or a JSON list of messages)."""
    col = ctx.opts.prompt_column
    if col is None:
        col = next((c for c in _PROMPT_GUESSES if c in rec), None)
        if col is None:
            raise _no_prompt_column(rec, ctx)
    value = rec.get(col)
    if value is None or value == "":  # an empty CSV cell is how a table says "missing"
        raise RowError("missing field", col)
    raw = take_time(rec, ctx)
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if (
            isinstance(parsed, list)
            and parsed
            and all(isinstance(m, dict) and "role" in m for m in parsed)
        ):
            value = parsed
        elif isinstance(parsed, dict) and isinstance(parsed.get("messages"), list):
            value = parsed["messages"]
    if isinstance(value, list):
        raw.body = {"messages": value}
    elif isinstance(value, str):
        raw.text = value
    else:
        raise RowError("mistyped field", col)
    scol = ctx.opts.session_column or next(
        (c for c in ("session_id", "session", "conversation_id", "user") if c in rec), None
    )
    if scol:
        raw.session = as_str(rec.get(scol))
    raw.model = as_str(rec.get("model") or rec.get("model_name"))
    raw.tenant = as_str(next((rec[k] for k in TENANT_KEYS if rec.get(k) not in (None, "")), None))
    raw.user = as_str(next((rec[k] for k in _USER_COLUMNS if rec.get(k) not in (None, "")), None))
    for k in ("output_tokens", "completion_tokens", "response_tokens"):
        if rec.get(k) not in (None, ""):
            raw.output_tokens = as_int(rec[k], k)
            break
    for k in _ID_KEYS:
        if rec.get(k) not in (None, ""):
            raw.request_id = as_str(rec[k])
            break
    return raw


def _hash_id_list(value: object, field: str) -> list[int]:
    if not isinstance(value, list):
        raise RowError("missing field" if value is None else "mistyped field", field)
    for v in value:
        if isinstance(v, float) and v.is_integer() and abs(v) >= 2**63:
            # orjson reads an integer beyond 64 bits as a float
            raise RowError("hash id out of 64-bit range", field)
        if not isinstance(v, int) or isinstance(v, bool):
            raise RowError("mistyped field", field)
        if not I64_MIN <= v <= I64_MAX:
            raise RowError("hash id out of 64-bit range", field)
    return value


def parse_mooncake(rec: JSONObject, ctx: FileContext) -> Raw:
    raw = take_time(rec, ctx, ("timestamp",))
    raw.prompt_tokens = as_int(rec.get("input_length"), "input_length")
    raw.output_tokens = as_int(rec.get("output_length"), "output_length", required=False)
    ids = _hash_id_list(rec.get("hash_ids"), "hash_ids")
    if len(ids) < (raw.prompt_tokens or 0) // 512:
        raise RowError("hash_ids shorter than input_length / 512", "hash_ids")
    raw.block_ids = ids
    for k in ("session_id", "chat_id"):
        if rec.get(k) not in (None, ""):
            raw.session = as_str(rec[k])
            break
    return raw


def parse_bailian(rec: JSONObject, ctx: FileContext) -> Raw:
    raw = take_time(rec, ctx, ("timestamp",))
    chat = rec.get("chat_id")
    if chat is None:
        raise RowError("missing field", "chat_id")
    parent = rec.get("parent_chat_id")
    raw.request_id = as_str(chat)
    raw.parent = None if parent in (None, -1, "-1", "") else as_str(parent)
    roots = ctx.shared.bailian_roots
    root = roots.get(raw.parent, raw.parent) if raw.parent is not None else raw.request_id
    assert raw.request_id is not None
    assert root is not None
    roots[raw.request_id] = root
    raw.session = root
    raw.turn = as_int(rec.get("turn"), "turn", required=False)
    raw.prompt_tokens = as_int(rec.get("input_length"), "input_length")
    raw.output_tokens = as_int(rec.get("output_length"), "output_length", required=False)
    ids = _hash_id_list(rec.get("hash_ids"), "hash_ids")
    if len(ids) < (raw.prompt_tokens or 0) // 16:
        raise RowError("hash_ids shorter than input_length / 16", "hash_ids")
    raw.block_ids = ids
    raw.tenant = as_str(rec.get("type"))
    return raw


# RAGPulse components in assumed prompt order: (key in hash_ids, file, id key, kind code).
RAGPULSE_COMPONENTS = (
    ("sys_prompt", "1_sys_prompt.jsonl", "sys_prompt_id", 1),
    ("passages_ids", "2_passages.jsonl", "passage_id", 2),
    ("history", "3_history.jsonl", "history_id", 3),
    ("web_search", "5_web_search.jsonl", "web_search_id", 4),
    ("user_input", "4_user_input.jsonl", "user_input_id", 5),
)
RAGPULSE_ID_STRIDE = 4096  # component c of kind k -> tokens (k << 28) + c * 4096 + pos
RAGPULSE_PAD_KIND = 15


def _as_number(value: JSONValue) -> int:
    """``int(value)`` of a JSON value; a list, an object or null is a TypeError."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"not a number: {type(value).__name__}")


def _ragpulse_lengths(ctx: FileContext) -> dict[str, dict[int, int]]:
    """Token lengths of the components beside ``ctx.path``, read once per folder."""
    cache = ctx.shared.ragpulse_lengths
    folder = ctx.folder
    if folder in cache:
        return cache[folder]
    out: dict[str, dict[int, int]] = {}
    for key, fname, idkey, _ in RAGPULSE_COMPONENTS:
        p = Path(folder) / fname
        if not p.exists():
            raise InputError(
                f"RAGPulse component file {fname} not found beside the trace",
                Location(str(p)),
                hint="keep 1_sys_prompt.jsonl ... 5_web_search.jsonl next to 0_trace.jsonl",
            )
        lengths: dict[int, int] = {}
        for lineno, rec in json_records(str(p), None):
            if isinstance(rec, RowError):
                raise InputError(rec.reason, Location(str(p), lineno))
            try:
                lengths[_as_number(rec[idkey])] = _as_number(rec["token_length"])
            except (KeyError, TypeError, ValueError) as exc:
                raise InputError("bad component row", Location(str(p), lineno, idkey)) from exc
        out[key] = lengths
    cache[folder] = out
    return out


def parse_ragpulse(rec: JSONObject, ctx: FileContext) -> Raw:
    lengths = _ragpulse_lengths(ctx)
    raw = take_time(rec, ctx, ("timestamp",))
    n_in = as_int(rec.get("input_length"), "input_length")
    raw.output_tokens = as_int(rec.get("output_length"), "output_length", required=False)
    raw.session = as_str(rec.get("session_id"))
    comps = rec.get("hash_ids")
    if not isinstance(comps, dict):
        raise RowError("missing field" if comps is None else "mistyped field", "hash_ids")
    pieces = []
    for key, _, _, kind in RAGPULSE_COMPONENTS:
        ids = comps.get(key) or []
        if not isinstance(ids, list):
            raise RowError("mistyped field", f"hash_ids.{key}")
        for c in ids:
            if not isinstance(c, int) or isinstance(c, bool):
                raise RowError("mistyped field", f"hash_ids.{key}")
            n = lengths[key].get(c)
            if n is None:
                raise RowError("unknown component id", f"hash_ids.{key}")
            if c >= (1 << 28) // RAGPULSE_ID_STRIDE or n >= RAGPULSE_ID_STRIDE:
                raise RowError("component id or length out of range", f"hash_ids.{key}")
            start = (kind << 28) + c * RAGPULSE_ID_STRIDE
            pieces.append(np.arange(start, start + n, dtype=np.uint32))
    tokens = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.uint32)
    assert n_in is not None
    if tokens.size < n_in:
        # Tokens the components do not account for (template, separators): unique to
        # this request, placed at the end where they cannot create false sharing.
        counter = ctx.shared.ragpulse_pad
        pad = (RAGPULSE_PAD_KIND << 28) + (
            (counter + np.arange(n_in - tokens.size, dtype=np.int64)) % (1 << 28)
        )
        ctx.shared.ragpulse_pad = counter + n_in - tokens.size
        tokens = np.concatenate([tokens, pad.astype(np.uint32)])
    elif tokens.size > n_in:
        raw.approx = True  # components sum to more than input_length: use the components
    raw.tokens = tokens
    return raw


def parse_azure(rec: JSONObject, ctx: FileContext) -> Raw:
    raw = take_time(rec, ctx, ("TIMESTAMP", "timestamp"))
    raw.prompt_tokens = as_int(rec.get("ContextTokens"), "ContextTokens")
    raw.output_tokens = as_int(rec.get("GeneratedTokens"), "GeneratedTokens", required=False)
    raw.count_only = True
    return raw


def parse_burstgpt(rec: JSONObject, ctx: FileContext) -> Raw:
    raw = take_time(rec, ctx, ("Timestamp", "timestamp"))
    raw.prompt_tokens = as_int(rec.get("Request tokens"), "Request tokens")
    raw.output_tokens = as_int(rec.get("Response tokens"), "Response tokens", required=False)
    raw.model = as_str(rec.get("Model"))
    raw.session = None
    raw.count_only = True
    return raw


PARSERS: dict[str, Callable[[JSONObject, FileContext], Raw]] = {
    Format.OPENAI: parse_openai,
    Format.OPENAI_BATCH: parse_openai,
    Format.GATEWAY_CSV: parse_openai,
    Format.GATEWAY_PARQUET: parse_openai,
    Format.GENERIC_CSV: parse_generic,
    Format.GENERIC_JSONL: parse_generic,
    Format.GENERIC_PARQUET: parse_generic,
    Format.MOONCAKE: parse_mooncake,
    Format.BAILIAN: parse_bailian,
    Format.RAGPULSE: parse_ragpulse,
    Format.AZURE: parse_azure,
    Format.BURSTGPT: parse_burstgpt,
}
