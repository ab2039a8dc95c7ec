"""Anonymized exports that replayers read: Mooncake and Bailian JSONL. Never any text.

* ``mooncake``: ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}`` with
  512-token blocks; where the log has sessions, each request of a session also carries
  ``session_id`` (``"s<n>"``, numbered in order of first appearance: no name from the
  log leaves) and every turn after the first ``delay``, the milliseconds since the
  session's previous request arrived. AIPerf's ``mooncake_trace`` groups turns by
  ``session_id`` and, under its fixed schedule, sends each at its ``timestamp``; with
  ``--no-fixed-schedule`` a turn waits ``delay`` after the previous turn's response
  (so the arrival gap written here is an upper bound on that think time). Replayers that
  read only ``timestamp`` (SGLang's ``bench_serving``) ignore both keys. Ids come from
  coarsening the canonical chained hashes (block ``j`` at 512 is the fine hash at
  position ``m*j + m - 1``, ``m = 512 / block_size``), renumbered densely from 0 in
  order of first appearance. As in Mooncake's own traces,
  ``len(hash_ids) == ceil(input_length / 512)``: a partial last block gets a fresh id that
  no other request shares.
* ``bailian``: ``{"chat_id", "parent_chat_id", "timestamp": s, "input_length",
  "output_length", "type", "turn", "hash_ids"}`` with 16-token blocks (same rules; the
  canonical block size must divide 16). ``chat_id`` is the row number;
  ``parent_chat_id`` is the parent request when the source said so, else the previous
  request of the same session, else -1.

Count-only rows get ``hash_ids: []``: their reuse is unknown, and unique ids would
claim there is none.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from analyzer.errors import UsageError
from analyzer.outputs import atomic_path
from analyzer.trace import BlockTrace


def _coarse(table: pa.Table, target: int) -> BlockTrace:
    trace = BlockTrace.from_table(table)
    if target % trace.block_size:
        raise UsageError(
            f"cannot export {target}-token blocks from a trace hashed at {trace.block_size} tokens",
            hint=f"convert again with --block-size dividing {target} (e.g. 16)",
        )
    return trace.coarsen(target // trace.block_size)


def _ids(trace: BlockTrace, block: int) -> list[list[int]]:
    next_id = trace.n_blocks
    out = []
    for i in range(trace.n_requests):
        ids = trace.blocks_of(i).tolist()
        n = int(trace.prompt_tokens[i])
        if n % block:
            ids.append(next_id)
            next_id += 1
        out.append(ids)
    return out


def _write(lines: list[str], out: str | Path, *, force: bool = False) -> None:
    p = Path(out)
    data = ("\n".join(lines) + "\n").encode() if lines else b""
    with atomic_path(p, force=force) as tmp:
        if p.suffix == ".gz":
            # mtime 0 and no name in the header: byte-identical reruns.
            with open(tmp, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
                f.write(data)
        else:
            tmp.write_bytes(data)


def export_mooncake(table: pa.Table, out: str | Path, *, force: bool = False) -> int:
    trace = _coarse(table, 512)
    count_only = table.column("count_only").to_numpy(zero_copy_only=False)
    ids = _ids(trace, 512)
    last_ms: dict[int, int] = {}
    lines = []
    for i in range(trace.n_requests):
        ms = round(float(trace.arrival_s[i]) * 1000)
        rec: dict[str, object] = {"timestamp": ms}
        s = int(trace.session[i])
        if s >= 0:
            rec["session_id"] = f"s{s}"
            if s in last_ms:
                rec["delay"] = ms - last_ms[s]
            last_ms[s] = ms
        rec["input_length"] = int(trace.prompt_tokens[i])
        rec["output_length"] = max(0, int(trace.output_tokens[i]))
        rec["hash_ids"] = [] if count_only[i] else ids[i]
        lines.append(json.dumps(rec, separators=(", ", ": ")))
    _write(lines, out, force=force)
    return len(lines)


def export_bailian(table: pa.Table, out: str | Path, *, force: bool = False) -> int:
    trace = _coarse(table, 16)
    order = np.argsort(table.column("arrival_s").to_numpy(), kind="stable")
    sorted_table = table.take(pa.array(order))
    count_only = sorted_table.column("count_only").to_numpy(zero_copy_only=False)
    parents = sorted_table.column("parent_request_id").to_pylist()
    turns = sorted_table.column("turn").to_pylist()
    row_of = {rid: i for i, rid in enumerate(trace.request_ids)}
    last_in_session: dict[int, int] = {}
    turn_in_session: dict[int, int] = {}
    ids = _ids(trace, 16)
    lines = []
    for i in range(trace.n_requests):
        s = int(trace.session[i])
        parent = row_of.get(parents[i], -1) if parents[i] is not None else -1
        if parent == -1 and s >= 0:
            parent = last_in_session.get(s, -1)
        turn = turns[i]
        if turn is None:
            turn = turn_in_session.get(s, 0) + 1 if s >= 0 else 1
        if s >= 0:
            last_in_session[s] = i
            turn_in_session[s] = turn
        rec = {
            "chat_id": i,
            "parent_chat_id": parent,
            "timestamp": round(float(trace.arrival_s[i]), 6),
            "input_length": int(trace.prompt_tokens[i]),
            "output_length": max(0, int(trace.output_tokens[i])),
            "type": "text",
            "turn": int(turn),
            "hash_ids": [] if count_only[i] else ids[i],
        }
        lines.append(json.dumps(rec, separators=(", ", ": ")))
    _write(lines, out, force=force)
    return len(lines)
