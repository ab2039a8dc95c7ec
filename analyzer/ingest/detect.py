"""Which format a file is in, from its extension and its first lines.

Compressed files (gzip, zstd) are recognised by magic bytes and sniffed after
decompression. Formats: see docs/formats.md and ``FORMATS``.
"""

from __future__ import annotations

import difflib
import json
from enum import StrEnum
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.errors import InputError, Location
from analyzer.ingest.documents import (
    DocumentError,
    container,
    document_records,
    page_records,
)
from analyzer.ingest.io import TruncatedInput, check_readable, head_lines
from analyzer.jsontypes import JSONObject
from analyzer.trace import read_metadata


class Format(StrEnum):
    """The log formats kvpool reads (``--format``; docs/formats.md)."""

    CANONICAL = "canonical"
    OPENAI = "openai"
    OPENAI_BATCH = "openai-batch"
    GATEWAY_CSV = "gateway-csv"
    GATEWAY_PARQUET = "gateway-parquet"
    GENERIC_JSONL = "generic-jsonl"
    GENERIC_CSV = "generic-csv"
    GENERIC_PARQUET = "generic-parquet"
    MOONCAKE = "mooncake"
    BAILIAN = "bailian"
    RAGPULSE = "ragpulse"
    AZURE = "azure"
    BURSTGPT = "burstgpt"
    LITELLM = "litellm"
    LANGFUSE = "langfuse"
    HELICONE = "helicone"
    PORTKEY = "portkey"
    OTEL = "otel"
    KV_EVENTS = "kv-events"  # a `kvpool record` recording (analyzer/ingest/kvfile.py)


# Gateway and observability exports (analyzer/ingest/product_logs.py), each in JSON lines,
# a JSON document or CSV.
PRODUCT_FORMATS = frozenset(
    {Format.LITELLM, Format.LANGFUSE, Format.HELICONE, Format.PORTKEY, Format.OTEL}
)


# Names that stand for a family, resolved per file by its container (Parquet, JSON
# lines or CSV): what the README and users call them.
FORMAT_ALIASES: dict[str, tuple[Format, ...]] = {
    "gateway": (Format.GATEWAY_PARQUET, Format.GATEWAY_CSV),
    "generic": (Format.GENERIC_PARQUET, Format.GENERIC_JSONL, Format.GENERIC_CSV),
}
FORMATS: tuple[str, ...] = (*Format, *FORMAT_ALIASES)


def did_you_mean(name: str, choices: tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(name.lower(), choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_format(name: str) -> str:
    """The message for a ``--format`` that names no format."""
    return f"unknown format '{name}'{did_you_mean(name, FORMATS)}; one of: " + ", ".join(FORMATS)


def resolve_format(fmt: str | None, path: str | Path) -> str:
    """The format of ``path``: detected (``fmt`` None), the member of an alias family
    its container is (``gateway``: Parquet or CSV; ``generic``: Parquet, JSON lines or
    CSV), or ``fmt`` itself."""
    if fmt is None:
        return detect_format(path)
    family = FORMAT_ALIASES.get(fmt)
    if family is None:
        return fmt
    p = Path(path)
    check_readable(p)
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"PAR1":
        return family[0]
    lines = head_lines(p, 1)
    if len(family) > 2 and lines and lines[0].lstrip().startswith(b"{"):
        return family[1]
    return family[-1]


def _parquet_format(path: Path) -> str:
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"not a readable Parquet file: {exc}", Location(str(path))) from exc
    if "schema_version" in read_metadata(schema):
        return Format.CANONICAL
    return Format.GATEWAY_PARQUET if "request_json" in schema.names else Format.GENERIC_PARQUET


def _product_format(keys: set[str] | JSONObject) -> str | None:
    """The gateway or observability export whose own fields a record (or a CSV header)
    has, else None. Checked before the OpenAI form: a LiteLLM payload has ``messages`` at
    top level too, and reading it as OpenAI loses its sessions and teams."""
    if "resourceSpans" in keys or ("startTimeUnixNano" in keys and "attributes" in keys):
        return Format.OTEL  # OTLP/JSON: an ExportTraceServiceRequest, or one span
    if "call_type" in keys and "startTime" in keys:
        return Format.LITELLM  # StandardLoggingPayload, or a LiteLLM_SpendLogs row
    if "request_created_at" in keys:
        return Format.HELICONE
    if ("traceId" in keys and "startTime" in keys) or (
        "sessionId" in keys and "bookmarked" in keys
    ):
        return Format.LANGFUSE  # an observation, or a trace
    if ("ai_model" in keys or "ai_org" in keys or "req_units" in keys) and "created_at" in keys:
        return Format.PORTKEY  # a logs export row
    if isinstance(keys, dict):  # Portkey's log object: request and response with bodies
        req, resp = keys.get("request"), keys.get("response")
        if isinstance(req, dict) and "body" in req and isinstance(resp, dict) and "body" in resp:
            return Format.PORTKEY
    return None


def _csv_format(header: str) -> str:
    cols = {c.strip().strip('"') for c in header.split(",")}  # iter_lines drops a BOM
    if (product := _product_format(cols)) is not None:
        return product
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
        return Format.AZURE
    if {"Request tokens", "Response tokens"} <= cols:
        return Format.BURSTGPT
    if "request_json" in cols:
        return Format.GATEWAY_CSV
    return Format.GENERIC_CSV


def _json_format(obj: JSONObject) -> str:
    rows = page_records(obj)
    if rows and isinstance(rows[0], dict):  # an API page: its records tell
        obj = rows[0]
    if (product := _product_format(obj)) is not None:
        return product
    ids = obj.get("hash_ids")
    if isinstance(ids, dict):
        return Format.RAGPULSE
    if isinstance(ids, list):
        return Format.BAILIAN if "chat_id" in obj else Format.MOONCAKE
    if "custom_id" in obj and "body" in obj:
        return Format.OPENAI_BATCH
    if isinstance(obj.get("messages"), list) or isinstance(obj.get("prompt"), str):
        return Format.OPENAI
    for k in ("request", "body", "request_json", "request_body"):
        v = obj.get(k)
        if isinstance(v, dict) or (isinstance(v, str) and v.lstrip().startswith("{")):
            return Format.OPENAI
    return Format.GENERIC_JSONL


def detect_format(path: str | Path) -> str:
    """The format name of ``path`` (one of ``FORMATS``); InputError when unreadable."""
    p = Path(path)
    check_readable(p)
    if p.is_dir():  # check_readable let it through: a partitioned canonical dataset
        return "canonical"
    with open(p, "rb") as f:
        magic = f.read(8)
    if magic == b"KVPOOLEV":  # analyzer.ingest.kvfile.MAGIC
        return Format.KV_EVENTS
    if magic[:4] == b"PAR1":
        return _parquet_format(p)
    if container(p) == "document":  # a JSON array or pretty-printed JSON: its first record
        try:
            for _, rec in document_records(p):
                if isinstance(rec, dict):
                    return _json_format(rec)
                if isinstance(rec, DocumentError):
                    raise InputError(rec.reason, Location(str(path), 1))
                break
        except TruncatedInput:
            raise InputError(
                "truncated compressed file (no complete record)", Location(str(path))
            ) from None
        raise InputError(
            "the file's first JSON record is not an object",
            Location(str(path), 1),
            hint="use --format",
        )
    # Several lines, so that one malformed line at the top (a log cut mid-line by
    # rotation, a stray banner) does not hide a valid JSONL file behind it.
    lines = head_lines(p, 8)
    if not lines:
        raise InputError("file has no data (only blank lines)", Location(str(path)))
    if lines[0][:2] in (b"\xff\xfe", b"\xfe\xff") or lines[0][:4].count(b"\x00") >= 2:
        raise InputError(
            "file is UTF-16 (or has NUL bytes); kvpool reads UTF-8",
            Location(str(path), 1),
            hint="convert it: iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8",
        )
    try:
        first = lines[0].decode("utf-8")
    except UnicodeDecodeError:
        first = lines[0].decode("utf-8", "replace")
    name = p.name.lower()
    stripped = first.lstrip()
    if any(line.lstrip().startswith(b"{") for line in lines):
        for line in lines:
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                continue
            if isinstance(obj, dict):
                return _json_format(obj)
        if stripped.startswith("{"):
            raise InputError(
                "first lines are not valid JSON", Location(str(path), 1), hint="use --format"
            )
    if ".csv" in name or "," in first:
        return _csv_format(first)
    raise InputError(
        "cannot tell the format of this file",
        Location(str(path)),
        hint="pass --format (one of: " + ", ".join(FORMATS) + ")",
    )
