"""A KV-event publisher on loopback and a small prefix-caching engine, for the tests.

The schema is restated from vLLM's source (vllm/distributed/kv_events.py) at two points
of its history, since vLLM itself cannot be installed here (its wheel needs CUDA's
PyTorch build and hundreds of MB of dependencies, and ``vllm.distributed.kv_events``
imports ``vllm.config``, which imports the engine):

* ``Array*``: v0.11 to v0.23, every struct ``array_like=True``, the events tagged by
  class name: ``[ts, [["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, lora_name], ...], data_parallel_rank]``;
* ``Map*``: after PR #42892, the events tagged maps, the batch still an array.

The publisher speaks the protocol of ``ZmqEventPublisher``: a PUB socket sending
``(topic, seq as 8 big-endian bytes, payload)``, and a ROUTER replay socket that answers
a start sequence number with ``(seq, payload)`` messages, then ``(-1, b"")``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class ArrayStored(ArrayEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class ArrayRemoved(ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None


class ArrayCleared(ArrayEvent, tag="AllBlocksCleared"):
    pass


class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class MapStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class MapRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class MapCleared(MapEvent, tag="AllBlocksCleared"):
    pass


def encode(ts: float, events: list[Any], rank: int | None = 0) -> bytes:
    return msgspec.msgpack.encode(ArrayBatch(ts, events, rank))


class Publisher:
    """PUB + ROUTER replay on 127.0.0.1, on ports the OS picks."""

    def __init__(self, topic: str = "kv-events") -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.topic = topic.encode()
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def publish(self, payload: bytes, *, drop: bool = False) -> int:
        """Send the next sequence number; ``drop`` keeps it for replay only (a gap)."""
        with self._lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
            if not drop:
                self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        return seq

    def send_raw(self, parts: list[bytes]) -> None:
        with self._lock:
            self.pub.send_multipart(parts)

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start_b = frames
            start = int.from_bytes(start_b, "big")
            self.replay_requests.append(start)
            with self._lock:
                kept = [(s, b) for s, b in self.buffer if s >= start]
            for s, b in kept:
                self.router.send_multipart((ident, b"", s.to_bytes(8, "big"), b))
            self.router.send_multipart((ident, b"", END_SEQ, b""))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """A chained 64-bit block hash (the shape of vLLM's; not its function)."""
    d = hashlib.sha256(repr((parent, tokens)).encode()).digest()
    return int.from_bytes(d[-8:], "big")


@dataclass
class Engine:
    """A prefix cache that emits vLLM-shaped events: full blocks only, stored once
    computed (a hit stores nothing), evicted least recently used first, in chain order
    (a parent outlives its children as vLLM's eviction of tail blocks first keeps it)."""

    block_size: int = 4
    capacity: int = 64
    chunk_blocks: int = 3  # chunked prefill: blocks stored per step
    step_s: float = 0.05
    cached: OrderedDict[int, int | None] = field(default_factory=OrderedDict)

    def chain(self, tokens: list[int]) -> list[int]:
        out: list[int] = []
        parent = None
        bs = self.block_size
        for k in range(len(tokens) // bs):
            parent = block_hash(parent, tuple(tokens[k * bs : (k + 1) * bs]))
            out.append(parent)
        return out

    def serve(self, tokens: list[int], t: float) -> tuple[list[tuple[float, list[Any]]], int]:
        """The request's batches as ``(ts, [ArrayStored | ArrayRemoved, ...])`` and how
        many of its blocks were hits."""
        hashes = self.chain(tokens)
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.cached:
            self.cached.move_to_end(hashes[hit])
            hit += 1
        new = hashes[hit:]
        batches: list[tuple[float, list[Any]]] = []
        bs = self.block_size
        for c in range(0, len(new), self.chunk_blocks):
            part = new[c : c + self.chunk_blocks]
            events: list[Any] = []
            room = len(self.cached) + len(part) - self.capacity
            if room > 0:
                protect = set(hashes)
                victims = [h for h in self.cached if h not in protect][:room]
                for h in victims:
                    del self.cached[h]
                if victims:
                    events.append(ArrayRemoved(victims, "GPU"))
            first = hit + c
            parent = hashes[first - 1] if first else None
            for h in part:
                self.cached[h] = None
            toks = tokens[first * bs : (first + len(part)) * bs]
            events.append(ArrayStored(part, parent, toks, bs, None, "GPU"))
            batches.append((t + (c // self.chunk_blocks) * self.step_s, events))
        return batches, hit
