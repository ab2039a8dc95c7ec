"""Small canonical traces built in memory or written to disk, shared by several test packages."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from analyzer.trace import CANONICAL_SCHEMA, BlockTrace, trace_metadata, write_canonical


def make_trace(
    chains: list[list[int]],
    extra: list[int] | None = None,
    block_size: int = 4,
    sessions: list[int] | None = None,
    tenants: list[int] | None = None,
    content: list[list[int]] | None = None,
    lcp: list[int] | None = None,
    previews: dict[int, str] | None = None,
) -> BlockTrace:
    """A BlockTrace straight from id chains (ids must be dense in first-seen order)."""
    n = len(chains)
    extra = extra if extra is not None else [1] * n
    counts = [len(c) for c in chains]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat = np.array([b for c in chains for b in c], dtype=np.int64)
    n_ids = int(flat.max()) + 1 if flat.size else 0
    sess = np.array(sessions if sessions is not None else [-1] * n, dtype=np.int32)
    ten = np.array(tenants if tenants is not None else [-1] * n, dtype=np.int32)
    return BlockTrace(
        block_size=block_size,
        arrival_s=np.arange(n, dtype=np.float64),
        prompt_tokens=np.array(
            [c * block_size + e for c, e in zip(counts, extra, strict=True)], dtype=np.int64
        ),
        output_tokens=np.full(n, -1, dtype=np.int64),
        session=sess,
        tenant=ten,
        offsets=offsets,
        block_ids=flat,
        block_hashes=np.arange(n_ids, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15),
        request_ids=[f"r{i}" for i in range(n)],
        session_names=[f"s{i}" for i in range(int(sess.max(initial=-1)) + 1)],
        tenant_names=[f"t{i}" for i in range(int(ten.max(initial=-1)) + 1)],
        content_ids=(
            np.array([b for c in content for b in c], dtype=np.int64) if content else None
        ),
        token_lcp_prev=np.array(lcp, dtype=np.int64) if lcp is not None else None,
        previews=previews or {},
        meta={"block_size": str(block_size)},
    )


def read_jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def mooncake_table(path, block_size: int = 512) -> pa.Table:
    """Canonical table from the raw Mooncake JSONL (full blocks only)."""
    rows = read_jsonl(path)
    n = len(rows)
    cols: dict[str, list] = {f.name: [None] * n for f in CANONICAL_SCHEMA}
    cols["request_id"] = [f"r{i}" for i in range(n)]
    cols["arrival_s"] = [r["timestamp"] / 1000 for r in rows]
    cols["prompt_tokens"] = [r["input_length"] for r in rows]
    cols["output_tokens"] = [r["output_length"] for r in rows]
    cols["block_hashes"] = [r["hash_ids"][: r["input_length"] // block_size] for r in rows]
    cols["count_only"] = [False] * n
    cols["approx_lengths"] = [False] * n
    cols["cached_tokens"] = cols["engine_prompt_tokens"] = cols["user_id"] = [None] * n
    meta = trace_metadata(block_size=block_size)
    return pa.table(cols, schema=CANONICAL_SCHEMA).replace_schema_metadata(meta)


def canonical(path, rows, block_size=16, count_only=False):
    """Write a small canonical trace: rows are (session, tenant, prompt_tokens, hashes)."""
    n = len(rows)
    cols: dict[str, list] = {f.name: [None] * n for f in CANONICAL_SCHEMA}
    cols["request_id"] = [f"r{i}" for i in range(n)]
    cols["arrival_s"] = [float(i) for i in range(n)]
    cols["session_id"] = [r[0] for r in rows]
    cols["tenant"] = [r[1] for r in rows]
    cols["prompt_tokens"] = [r[2] for r in rows]
    cols["block_hashes"] = [r[3] for r in rows]
    cols["count_only"] = [count_only] * n
    cols["approx_lengths"] = [False] * n
    table = pa.table(cols, schema=CANONICAL_SCHEMA)
    write_canonical(table.replace_schema_metadata(trace_metadata(block_size=block_size)), path)
    return path


ROWS = [
    ("a", "acme", 70, [11, 12, 13, 14]),
    ("a", "acme", 90, [11, 12, 13, 14, 15]),
    ("b", "acme", 50, [11, 12, 21]),
    ("c", "other", 50, [11, 12, 31]),
    ("c", "other", 70, [11, 12, 31, 32]),
    ("d", "acme", 40, [11, 12]),
]
