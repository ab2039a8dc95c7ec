"""``kvpool record``: subscribe to engines' KV-event streams and write a recording.

One ZMQ SUB socket per endpoint (an engine, or a data-parallel rank: vLLM and SGLang
bind rank ``r`` at the configured port plus ``r``), subscribed to ``topic``. Each
message is ``(topic, seq, payload)``; a sequence number more than one past the last is
a gap. Given the engine's replay endpoint (vLLM's ``replay_endpoint``, a ROUTER socket),
the missed batches are asked for: the request is the first missing sequence number as
8 big-endian bytes, and the answer a run of ``(seq, payload)`` messages (SGLang 0.5.23
sends ``(topic, seq, payload)``) ending with sequence -1 and an empty payload
(``ZmqEventPublisher._service_replay`` in vllm/distributed/kv_events.py and in SGLang's
python/sglang/srt/disaggregation/kv_events.py). A DEALER socket asks, so that every
message of the answer is read (a REQ socket takes one). A sequence number at or below
the last is the publisher starting again (an engine restart), recorded as such.

Everything received is written as it comes (:class:`~analyzer.ingest.kvfile.RecordingWriter`);
a frame or payload that does not fit the schema is counted by reason, never fatal.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from analyzer import __version__
from analyzer.errors import UsageError
from analyzer.ingest.kvfile import RecordingWriter
from analyzer.ingest.kvwire import Stored, WireBatch, WireError, decode_payload

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_ENDPOINT = re.compile(
    r"^(tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.*-]+):\d{1,5}|ipc://.+|inproc://.+)$"
)


def check_endpoint(value: str, flag: str) -> str:
    """A ZMQ endpoint a SUB socket can connect to, or a usage error naming ``flag``."""
    if not _ENDPOINT.match(value):
        raise UsageError(
            f"{flag} {value!r} is not a ZMQ endpoint",
            hint="e.g. tcp://HOST:5557 (the engine's kv-events endpoint; rank r of a "
            "data-parallel engine publishes on the port plus r)",
        )
    if value.startswith("tcp://"):
        port = int(value.rsplit(":", 1)[1])
        if not 0 < port < 65536:
            raise UsageError(f"{flag} {value!r}: port {port} is out of range (1-65535)")
        if "*" in value:
            raise UsageError(
                f"{flag} {value!r}: '*' is how the engine binds; connect to its host",
                hint="e.g. tcp://127.0.0.1:5557",
            )
    return value


@dataclass(frozen=True, slots=True)
class RecordOptions:
    endpoints: tuple[str, ...]
    replay: tuple[str | None, ...]  # the replay endpoint of each, or None
    topic: str = ""
    duration_s: float | None = None
    max_events: int | None = None
    replay_timeout_s: float = 2.0
    keep_names: bool = False  # write the endpoints' addresses into the header


@dataclass
class RecordStats:
    """What a recording holds so far (the progress line and the trailer)."""

    started_epoch_s: float
    elapsed_s: float = 0.0
    batches: int = 0
    events: int = 0
    gaps: int = 0
    lost: int = 0
    replayed: int = 0
    restarts: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    per_endpoint: list[int] = field(default_factory=list)
    reason: str = ""

    def line(self) -> str:
        bad = sum(self.malformed.values())
        return (
            f"recording: {self.events:,} events in {self.batches:,} batches from "
            f"{sum(1 for n in self.per_endpoint if n)}/{len(self.per_endpoint)} endpoint(s), "
            f"{self.gaps:,} gap(s) ({self.replayed:,} batches replayed, {self.lost:,} lost), "
            f"{bad:,} malformed, {self.elapsed_s:,.1f} s"
        )

    def trailer(self) -> dict[str, object]:
        return {
            "kind": "end",
            "reason": self.reason,
            "started_epoch_s": self.started_epoch_s,
            "stopped_epoch_s": self.started_epoch_s + self.elapsed_s,
            "batches": self.batches,
            "events": self.events,
            "gaps": self.gaps,
            "lost": self.lost,
            "replayed": self.replayed,
            "restarts": self.restarts,
            "malformed": dict(sorted(self.malformed.items())),
            "batches_per_endpoint": list(self.per_endpoint),
        }


class _Recorder:
    def __init__(self, opts: RecordOptions, writer: RecordingWriter, salt: bytes) -> None:
        self.zmq = zmq
        self.opts, self.writer, self.salt = opts, writer, salt
        self.ctx = zmq.Context()
        self.subs: list[zmq.Socket[bytes]] = []
        self.replays: list[zmq.Socket[bytes] | None] = []
        self.last: list[int | None] = [None] * len(opts.endpoints)
        self.stats = RecordStats(time.time(), per_endpoint=[0] * len(opts.endpoints))
        try:
            for ep, rep in zip(opts.endpoints, opts.replay, strict=True):
                s = self.ctx.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(ep)
                s.setsockopt(zmq.SUBSCRIBE, opts.topic.encode("utf-8"))
                self.subs.append(s)
                d = None
                if rep is not None:
                    d = self.ctx.socket(zmq.DEALER)
                    d.setsockopt(zmq.LINGER, 0)
                    d.connect(rep)
                self.replays.append(d)
        except zmq.ZMQError as exc:
            self.close()
            raise UsageError(f"cannot connect to {ep}: {exc}") from None

    def close(self) -> None:
        for s in [*self.subs, *self.replays]:
            if s is not None:
                s.close(linger=0)
        self.ctx.term()

    def _bad(self, reason: str, endpoint: int, n: int = 1) -> None:
        self.stats.malformed[reason] = self.stats.malformed.get(reason, 0) + n
        self.writer.write({"kind": "malformed", "endpoint": endpoint, "reason": reason, "count": n})

    def _pseudonym(self, value: str) -> str:
        d = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8, key=self.salt)
        return "s-" + d.hexdigest()

    def _write(self, i: int, seq: int, payload: bytes, replayed: bool) -> None:
        try:
            batch: WireBatch = decode_payload(payload)
        except WireError as exc:
            self._bad(exc.reason if exc.field is None else f"{exc.reason} ({exc.field})", i)
            return
        for err in batch.bad:
            self._bad(err.reason if err.field is None else f"{err.reason} ({err.field})", i)
        for ev in batch.events:
            if isinstance(ev, Stored) and ev.session is not None:
                ev.session = self._pseudonym(ev.session)  # SGLang's session_id: never in clear
        self.writer.batch(i, seq, batch, replayed=replayed)
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        self.stats.per_endpoint[i] += 1
        self.stats.replayed += replayed

    def _replay(self, i: int, first: int, upto: int) -> int:
        """Ask endpoint ``i`` for batches ``first .. upto-1``; write those that come;
        return how many came."""
        sock = self.replays[i]
        if sock is None:
            return 0
        zmq = self.zmq
        sock.send_multipart([b"", first.to_bytes(8, "big")])
        deadline = time.monotonic() + self.opts.replay_timeout_s
        got: dict[int, bytes] = {}
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                break
            parts = sock.recv_multipart()
            if parts and parts[0] == b"":
                parts = parts[1:]  # the envelope's empty delimiter
            if len(parts) == 3:
                parts = parts[1:]  # SGLang puts the topic first
            if len(parts) != 2 or len(parts[0]) != 8:
                self._bad("malformed replay frame", i)
                continue
            seq_b, payload = parts
            if seq_b == END_SEQ or not payload:
                break
            seq = int.from_bytes(seq_b, "big")
            if first <= seq < upto:
                got[seq] = payload
        for seq in sorted(got):
            self._write(i, seq, got[seq], replayed=True)
        return len(got)

    def _message(self, i: int, parts: list[bytes]) -> None:
        if len(parts) != 3:
            self._bad("frame count is not 3 (topic, seq, payload)", i)
            return
        _, seq_b, payload = parts
        if len(seq_b) != 8:
            self._bad("sequence frame is not 8 bytes", i)
            return
        seq = int.from_bytes(seq_b, "big")
        last = self.last[i]
        if last is not None and seq <= last:
            self.stats.restarts += 1
            self.writer.write({"kind": "restart", "endpoint": i, "after": last, "seq": seq})
        elif last is not None and seq > last + 1:
            missing = seq - last - 1
            came = self._replay(i, last + 1, seq)
            self.stats.gaps += 1
            self.stats.lost += missing - came
            self.writer.write(
                {
                    "kind": "gap",
                    "endpoint": i,
                    "first": last + 1,
                    "last": seq - 1,
                    "replayed": came,
                    "lost": missing - came,
                }
            )
        self.last[i] = seq
        self._write(i, seq, payload, replayed=False)

    def run(
        self, stop: Callable[[], bool], tick: Callable[[RecordStats], None] | None
    ) -> RecordStats:
        zmq = self.zmq
        opts, stats = self.opts, self.stats
        self.writer.header(
            kvpool_version=__version__,
            started_epoch_s=stats.started_epoch_s,
            topic=opts.topic,
            token_ids="count only",
            endpoints=[
                {
                    "index": i,
                    "address": ep if opts.keep_names else None,
                    "replay": rep is not None,
                }
                for i, (ep, rep) in enumerate(zip(opts.endpoints, opts.replay, strict=True))
            ],
        )
        poller = zmq.Poller()
        for s in self.subs:
            poller.register(s, zmq.POLLIN)
        index = {s: i for i, s in enumerate(self.subs)}
        t0 = time.monotonic()
        next_tick = t0
        while True:
            now = time.monotonic()
            stats.elapsed_s = now - t0
            if stop():
                stats.reason = "interrupted"
                break
            if opts.duration_s is not None and stats.elapsed_s >= opts.duration_s:
                stats.reason = "duration"
                break
            if opts.max_events is not None and stats.events >= opts.max_events:
                stats.reason = "max-events"
                break
            if tick is not None and now >= next_tick:
                tick(stats)
                next_tick = now + 0.5
            wait = 0.2
            if opts.duration_s is not None:
                wait = max(0.0, min(wait, opts.duration_s - stats.elapsed_s))
            for sock, _ in poller.poll(int(wait * 1000)):
                i = index[sock]
                for _ in range(1000):  # then look at the clock and the other endpoints
                    try:
                        parts = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._message(i, parts)
                    if opts.max_events is not None and stats.events >= opts.max_events:
                        break
        stats.elapsed_s = time.monotonic() - t0
        self.writer.write(stats.trailer())
        if tick is not None:
            tick(stats)
        return stats


def record_events(
    opts: RecordOptions,
    writer: RecordingWriter,
    salt: bytes,
    stop: Callable[[], bool],
    tick: Callable[[RecordStats], None] | None = None,
) -> RecordStats:
    """Record until ``stop()``, ``opts.duration_s`` or ``opts.max_events``; the
    recording's header, batches, gaps and trailer go to ``writer``."""
    rec = _Recorder(opts, writer, salt)
    try:
        return rec.run(stop, tick)
    finally:
        rec.close()
