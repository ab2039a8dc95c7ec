"""Which format a file is in, from its extension and its first lines.

Compressed files (gzip, zstd) are recognised by magic bytes and sniffed after
decompression. Formats: see docs/formats.md and ``FORMATS``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analyzer.errors import InputError, Location
from analyzer.ingest.io import check_readable, head_lines

FORMATS = (
    "canonical",
    "openai",
    "openai-batch",
    "gateway-csv",
    "gateway-parquet",
    "generic-jsonl",
    "generic-csv",
    "generic-parquet",
    "mooncake",
    "bailian",
    "ragpulse",
    "azure",
    "burstgpt",
)


def _parquet_format(path: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analyzer.trace import read_metadata

    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"not a readable Parquet file: {exc}", Location(str(path))) from exc
    if "schema_version" in read_metadata(schema):
        return "canonical"
    return "gateway-parquet" if "request_json" in schema.names else "generic-parquet"


def _csv_format(header: str) -> str:
    cols = {c.strip().strip('"') for c in header.split(",")}  # iter_lines drops a BOM
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
        return "azure"
    if {"Request tokens", "Response tokens"} <= cols:
        return "burstgpt"
    if "request_json" in cols:
        return "gateway-csv"
    return "generic-csv"


def _json_format(obj: dict[str, Any]) -> str:
    ids = obj.get("hash_ids")
    if isinstance(ids, dict):
        return "ragpulse"
    if isinstance(ids, list):
        return "bailian" if "chat_id" in obj else "mooncake"
    if "custom_id" in obj and "body" in obj:
        return "openai-batch"
    if isinstance(obj.get("messages"), list) or isinstance(obj.get("prompt"), str):
        return "openai"
    for k in ("request", "body", "request_json", "request_body"):
        v = obj.get(k)
        if isinstance(v, dict) or (isinstance(v, str) and v.lstrip().startswith("{")):
            return "openai"
    return "generic-jsonl"


def detect_format(path: str | Path) -> str:
    """The format name of ``path`` (one of ``FORMATS``); InputError when unreadable."""
    p = Path(path)
    check_readable(p)
    if p.is_dir():  # check_readable let it through: a partitioned canonical dataset
        return "canonical"
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"PAR1":
        return _parquet_format(p)
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
