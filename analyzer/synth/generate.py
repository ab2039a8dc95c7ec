"""Generate a synthetic request log: arrivals, sessions, writers, ground truth.

The engine is one event heap ordered by (time, sequence number): sources emit session
starts at their arrival process's times, and each session schedules its own next request.
Requests are written in arrival order as they are made, so memory holds only the live
sessions, never the log.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gzip
import heapq
import io
import json
import math
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np

from analyzer.errors import OutputError, UsageError
from analyzer.outputs import atomic_paths
from analyzer.progress import Advance
from analyzer.synth.config import FORMATS, SynthConfig, SynthStats
from analyzer.synth.workload import (
    PROFILE_TENANTS,
    Request,
    Session,
    Tenant,
    World,
    make_tenant,
    mean_requests_per_session,
    new_session,
)

# Every trace starts on Monday 2025-01-06 09:00:00 UTC (a fixed epoch: no wall clock).
T0_EPOCH_S = 1736154000.0
DIURNAL_PEAK_HOUR = 14.0
DIURNAL_AMPLITUDE = 0.6
BURSTY_GAMMA_SHAPE = 0.2  # inter-arrival CV = 1/sqrt(shape) = 2.2
MOONCAKE_BLOCK = 512
_CHUNK_BYTES = 1 << 20


class _ByteSink(Protocol):
    """A file, or a gzip or zstd stream over one: what the generator writes to."""

    def write(self, data: bytes, /) -> int: ...

    def close(self) -> None: ...


# (time s, tie-break sequence, kind, what): kind 0 starts a session from the source with
# that index, kind 1 sends that session's next request.
_Event = tuple[float, int, int, "int | Session"]


class Arrivals:
    """Session start times of one source at mean rate ``rate`` per second."""

    def __init__(self, kind: str, rate: float, rng: np.random.Generator) -> None:
        self.kind, self.rate, self.rng = kind, rate, rng

    def next(self, t: float) -> float:
        rng = self.rng
        if self.kind == "poisson":
            return t + float(rng.exponential(1.0 / self.rate))
        if self.kind == "bursty":
            k = BURSTY_GAMMA_SHAPE
            return t + float(rng.gamma(k, 1.0 / (k * self.rate)))
        # diurnal: thinning of a Poisson process at the peak rate
        peak = self.rate * (1.0 + DIURNAL_AMPLITUDE)
        while True:
            t += float(rng.exponential(1.0 / peak))
            hour = ((T0_EPOCH_S + t) / 3600.0) % 24.0
            lam = 1.0 + DIURNAL_AMPLITUDE * math.cos(2 * math.pi * (hour - DIURNAL_PEAK_HOUR) / 24)
            if rng.random() * (1.0 + DIURNAL_AMPLITUDE) < lam:
                return t


# --- writers ----------------------------------------------------------------------------


def _request_body(req: Request) -> str:
    t = req.tenant
    out = ['{"model":', json.dumps(t.model), ',"messages":[']
    out.append(",".join(m.json for m in req.messages))
    out.append("]")
    if t.tools_json is not None:
        out += [',"tools":', t.tools_json]
    if req.cache_key is not None:
        out += [',"prompt_cache_key":', json.dumps(req.cache_key)]
    if req.user is not None:
        out += [',"user":', json.dumps(req.user)]
    meta = {}
    if req.session_key is not None:
        meta["session_id"] = req.session_key
    if t.share < 1.0:  # several tenants: the gateway tags each request with its tenant
        meta["tenant"] = t.name
    if meta:
        out += [',"metadata":', json.dumps(meta, separators=(",", ":"))]
    out.append("}")
    return "".join(out)


def _response_body(req: Request, rid: str, ts: float) -> str:
    p, c = req.prompt_tokens, req.completion_tokens
    return (
        f'{{"id":"chatcmpl-{rid}","object":"chat.completion","created":{int(ts)},'
        f'"model":{json.dumps(req.tenant.model)},"choices":[{{"index":0,"message":'
        f'{req.reply.json},"finish_reason":"{req.finish_reason}"}}],'
        f'"usage":{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{p + c}}}}}'
    )


class _Writer:
    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.buf: list[str] = []
        self.size = 0
        # (parent block id, the (segment, start, end) pieces it holds) -> block id
        self._blocks: dict[tuple[int, tuple[tuple[int, int, int], ...]], int] = {}
        self._csv_out = io.StringIO()
        self._csv = csv.writer(self._csv_out, lineterminator="\n")
        if fmt == "gateway-csv":
            self._csv.writerow(
                ["request_id", "timestamp", "model_name", "request_json", "response_json"]
            )
            self._take_csv()

    def _take_csv(self) -> None:
        s = self._csv_out.getvalue()
        self._csv_out.seek(0)
        self._csv_out.truncate()
        self.buf.append(s)
        self.size += len(s)

    def add(self, req: Request, rid: str, t: float) -> None:
        ts = T0_EPOCH_S + t
        if self.fmt == "openai":
            line = (
                f'{{"request_id":"{rid}","timestamp":{ts:.3f},"request":{_request_body(req)},'
                f'"response":{_response_body(req, rid, ts)}}}\n'
            )
            self.buf.append(line)
            self.size += len(line)
        elif self.fmt == "gateway-csv":
            iso = datetime.fromtimestamp(round(ts, 3), UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
            self._csv.writerow(
                [rid, iso[:-3] + "Z", req.tenant.model, _request_body(req),
                 _response_body(req, rid, ts)]
            )  # fmt: skip
            self._take_csv()
        else:
            ids = self._hash_ids(req.prompt_parts())
            line = (
                f'{{"timestamp":{round(t * 1000)},"input_length":{req.prompt_tokens},'
                f'"output_length":{req.completion_tokens},"hash_ids":{ids}}}\n'
            ).replace(" ", "")
            self.buf.append(line)
            self.size += len(line)

    def _hash_ids(self, parts: list[tuple[int, int]]) -> list[int]:
        """Chained 512-token block ids, dense from 0 in order of first appearance.

        A block's identity is its parent block and the (segment, offset range) pieces it
        holds; equal segments hold equal tokens, so equal ids mean equal prefixes.
        """
        table = self._blocks
        ids: list[int] = []
        parent, room = -1, MOONCAKE_BLOCK
        cur: list[tuple[int, int, int]] = []
        for seg, n in parts:
            off = 0
            while off < n:
                take = min(room, n - off)
                cur.append((seg, off, off + take))
                off += take
                room -= take
                if room == 0:
                    parent = table.setdefault((parent, tuple(cur)), len(table))
                    ids.append(parent)
                    cur, room = [], MOONCAKE_BLOCK
        if cur:
            ids.append(table.setdefault((parent, tuple(cur)), len(table)))
        return ids


def _open_out(path: Path, name: str) -> tuple[_ByteSink, _ByteSink]:
    """Open ``path`` (a temporary file) for an output called ``name`` (.gz, .zst or plain)."""
    try:
        raw = open(path, "wb")  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise OutputError(f"cannot write {name}: {exc.strerror or exc}") from None
    if name.endswith(".gz"):
        # mtime=0 and no file name in the header: the same seed gives the same bytes.
        return raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=5)
    if name.endswith(".zst"):
        import zstandard

        # zstd's window reaches back over the history every turn resends, which gzip's 32 KiB
        # window cannot: the bundled samples are a third of their gzip size. Level 9 still
        # compresses at about 100 MB/s.
        return raw, zstandard.ZstdCompressor(level=9).stream_writer(raw, closefd=False)
    return raw, raw


# --- engine -----------------------------------------------------------------------------


class _Truth:
    """Per-request ground truth, kept in columns (compact for millions of requests)."""

    def __init__(self) -> None:
        self.tenant: list[int] = []
        self.session: list[int] = []
        self.session_key: list[str | None] = []
        self.parent: list[int] = []
        self.shared_messages: list[int] = []
        self.shared_prefix_chars: list[int] = []
        self.template: list[int] = []
        self.documents: list[list[int]] = []
        self.messages: list[int] = []
        self.prompt_tokens: list[int] = []

    def add(self, req: Request) -> None:
        self.tenant.append(req.tenant.index)
        self.session.append(req.session)
        self.session_key.append(req.session_key)
        self.parent.append(req.parent)
        self.shared_messages.append(req.shared_messages)
        self.shared_prefix_chars.append(sum(m.chars for m in req.messages[: req.shared_messages]))
        self.template.append(req.template)
        self.documents.append(list(req.documents))
        self.messages.append(len(req.messages))
        self.prompt_tokens.append(req.prompt_tokens)


def generate(
    config: SynthConfig,
    out_path: str | Path,
    fmt: str = "openai",
    truth_path: str | Path | None = None,
    advance: Advance | None = None,
    force: bool = False,
    stream: BinaryIO | None = None,
) -> SynthStats:
    """Write ``config.requests`` synthetic requests to ``out_path`` (gzip for .gz, zstd for .zst).

    Same config, same bytes. ``truth_path`` gets a JSON description of what was built:
    tenants, shared templates and documents, and per request its session, the earlier
    request whose whole prompt it resent (``parent``) and how much of it. Both files are
    written atomically (analyzer/outputs.py): an interrupted run leaves neither half-written.
    With ``stream`` (stdout) the log goes there as it is made, plain, never spooled: a
    reader that stops early (``| head``) stops the generation (``out_path`` only names it).
    """
    if fmt not in FORMATS:
        raise UsageError(f"unknown output format '{fmt}'", hint="formats: " + ", ".join(FORMATS))
    out_path = Path(out_path)
    truth_p = Path(truth_path) if truth_path is not None else None
    if truth_p is not None and truth_p.resolve() == out_path.resolve():
        raise UsageError("--truth must name a different file than -o")
    rng = np.random.default_rng(np.random.SeedSequence(config.seed))
    world = World(rng, config.documents)
    tenants: list[Tenant] = []
    for i, (name, model, kind, share) in enumerate(PROFILE_TENANTS[config.profile]):
        tenant = make_tenant(world, name, model, kind, share, config.shared_templates)
        tenant.index = i
        tenants.append(tenant)

    rate = config.effective_rate_rps
    heap: list[_Event] = []
    seq = 0
    sources: list[tuple[Tenant, Arrivals]] = []
    for tenant in tenants:
        session_rate = rate * tenant.share / mean_requests_per_session(tenant.kind)
        arr = Arrivals(config.arrival, session_rate, rng)
        sources.append((tenant, arr))
        heapq.heappush(heap, (arr.next(0.0), seq, 0, len(sources) - 1))
        seq += 1

    truth = _Truth() if truth_p is not None else None
    targets = ([] if stream is not None else [out_path]) + ([truth_p] if truth_p else [])
    files: contextlib.AbstractContextManager[list[Path]] = (
        atomic_paths(targets, force=force) if targets else contextlib.nullcontext([])
    )
    with files as temps:  # checked before the long run
        slots: list[Path | None] = [None, *temps] if stream is not None else list(temps)
        stats = _run(
            config, fmt, world, tenants, sources, heap, seq, truth, slots, out_path, advance, stream
        )
    return dataclasses.replace(
        stats, path=str(out_path), truth_path=str(truth_p) if truth_p is not None else None
    )


def _run(
    config: SynthConfig,
    fmt: str,
    world: World,
    tenants: list[Tenant],
    sources: list[tuple[Tenant, Arrivals]],
    heap: list[_Event],
    seq: int,
    truth: _Truth | None,
    temps: list[Path | None],
    out_path: Path,
    advance: Advance | None,
    stream: BinaryIO | None = None,
) -> SynthStats:
    """The generation loop of :func:`generate`, writing to the temporary files ``temps``
    (or the log to ``stream``)."""
    writer = _Writer(fmt)
    raw: _ByteSink
    out: _ByteSink
    if stream is not None:
        raw, out = stream, stream
    else:
        assert temps[0] is not None
        raw, out = _open_out(temps[0], out_path.name)
    n_sessions = prompt_sum = completion_sum = 0
    first_t = last_t = 0.0
    sink = _Sink(out, out_path)
    try:
        while world.n_requests < config.requests:
            t, _, event, obj = heapq.heappop(heap)
            if event == 0:  # a source: start a session now, schedule the next start
                assert isinstance(obj, int)
                tenant, arr = sources[obj]
                sess = new_session(world, tenant, n_sessions, config.session_id_share)
                n_sessions += 1
                heapq.heappush(heap, (t, seq, 1, sess))
                heapq.heappush(heap, (arr.next(t), seq + 1, 0, obj))
                seq += 2
                continue
            assert isinstance(obj, Session)
            sess = obj
            req, delay = sess.step(t)
            rid = f"req-{world.n_requests:08d}"
            writer.add(req, rid, t)
            if truth is not None:
                truth.add(req)
            if world.n_requests == 0:
                first_t = t
            last_t = t
            world.n_requests += 1
            prompt_sum += req.prompt_tokens
            completion_sum += req.completion_tokens
            if delay is not None:
                heapq.heappush(heap, (t + delay, seq, 1, sess))
                seq += 1
            if writer.size >= _CHUNK_BYTES:
                sink.write(writer)
            if advance is not None and world.n_requests % 1000 == 0:
                advance(1000)
        sink.write(writer)
        sink.close()
        if stream is not None:
            stream.flush()
        if advance is not None:
            advance(world.n_requests % 1000)
    finally:
        sink.pool.shutdown(wait=True, cancel_futures=True)
        if stream is None:
            if out is not raw:
                out.close()
            raw.close()
    truth_p = temps[1] if truth is not None else None
    if truth is not None and truth_p is not None:
        _write_truth(truth_p, config, fmt, tenants, world, truth, n_sessions)
    return SynthStats(
        path=str(out_path),
        fmt=fmt,
        requests=world.n_requests,
        sessions=n_sessions,
        bytes_written=sink.written,
        prompt_tokens=prompt_sum,
        completion_tokens=completion_sum,
        span_s=last_t - first_t,
        truth_path=None,
    )


class _Sink:
    """Writes chunks in order on one background thread.

    zlib releases the GIL while it compresses, so with a spare core a .gz output costs
    little more than a plain one; the stream, hence the bytes, is the same as a direct
    write. At most two chunks wait, so memory stays bounded.
    """

    def __init__(self, out: _ByteSink, path: Path) -> None:
        self.out, self.path = out, path
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending: list[Future[int]] = []
        self.written = 0

    def write(self, writer: _Writer) -> None:
        data = "".join(writer.buf).encode("utf-8")
        writer.buf.clear()
        writer.size = 0
        self.written += len(data)
        self.pending.append(self.pool.submit(self.out.write, data))
        while len(self.pending) > 2:
            self._wait(self.pending.pop(0))

    def _wait(self, fut: Future[int]) -> None:
        try:
            fut.result()
        except BrokenPipeError:
            raise  # the reader of stdout stopped (`| head`): the command's end, not an error
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        try:
            while self.pending:
                self._wait(self.pending.pop(0))
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _write_truth(
    path: Path,
    config: SynthConfig,
    fmt: str,
    tenants: list[Tenant],
    world: World,
    truth: _Truth,
    n_sessions: int,
) -> None:
    doc_ids = sorted(world.docs)
    doc = {
        "kvpool_synth_truth": 1,
        "config": {
            "profile": config.profile,
            "requests": config.requests,
            "seed": config.seed,
            "arrival": config.arrival,
            "rate_rps": config.effective_rate_rps,
            "shared_templates": config.shared_templates,
            "documents": config.documents,
            "session_id_share": config.session_id_share,
            "format": fmt,
            "t0_epoch_s": T0_EPOCH_S,
        },
        "tenants": [
            {
                "name": t.name,
                "model": t.model,
                "kind": t.kind,
                "share": t.share,
                "system_prompts": [{"chars": m.chars, "tokens": m.tokens} for m in t.system],
                "tools": len(t.tool_names),
                "templates": [
                    {
                        "messages": len(tpl),
                        "chars": sum(m.chars for m in tpl),
                        "tokens": sum(m.tokens for m in tpl),
                    }
                    for tpl in t.templates
                ],
            }
            for t in tenants
        ],
        "sessions": n_sessions,
        "documents": {
            "pool": config.documents,
            "zipf_s": 1.1,
            "quoted": len(doc_ids),
            "tokens": {str(d): world.docs[d][1] for d in doc_ids},
        },
        "block_size_mooncake": MOONCAKE_BLOCK,
        "requests": {
            "request_id": [f"req-{i:08d}" for i in range(len(truth.parent))],
            "tenant": truth.tenant,
            "session": truth.session,
            "session_key": truth.session_key,
            "parent": truth.parent,
            "shared_messages": truth.shared_messages,
            "shared_prefix_chars": truth.shared_prefix_chars,
            "messages": truth.messages,
            "prompt_tokens_est": truth.prompt_tokens,
            "template": truth.template,
            "documents": truth.documents,
        },
    }
    path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
