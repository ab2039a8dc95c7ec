"""KV-event recordings: the engines' wire formats, the recording file, the requests and
occupancy rebuilt from them, and ``kvpool record`` against a publisher on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import msgspec
import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from analyzer.blocks import id_hashes
from analyzer.cli import app
from analyzer.errors import InputError, UsageError
from analyzer.ingest import IngestOptions, detect_format, open_trace
from analyzer.ingest.kvfile import MAGIC, RecordingWriter, read_recording
from analyzer.ingest.kvrebuild import CONTINUATION_GAP_S
from analyzer.ingest.kvrecord import RecordOptions, check_endpoint, record_events
from analyzer.ingest.kvwire import Cleared, Removed, Stored, WireError, decode_payload
from tests.helpers.kv_publisher import (
    ArrayCleared,
    ArrayRemoved,
    ArrayStored,
    Engine,
    MapRemoved,
    MapStored,
    Publisher,
    encode,
)

SALT = b"\x01" * 32
ROOT = Path(__file__).resolve().parents[2]
MASK = (1 << 64) - 1


# -- the wire ---------------------------------------------------------------------------------


def test_array_form_of_vllm_decodes_every_field() -> None:
    stored = ArrayStored([11, -5], 7, list(range(32)), 16, None, "GPU", "adapter-a")
    payload = encode(1700000000.5, [stored, ArrayRemoved([11], "CPU"), ArrayCleared()], 1)
    b = decode_payload(payload)
    assert (b.ts, b.dp_rank, b.bad) == (1700000000.5, 1, [])
    s, r, c = b.events
    assert isinstance(s, Stored) and isinstance(r, Removed) and isinstance(c, Cleared)
    assert s.hashes == [11, -5 & MASK]  # signed hashes read as their 64 bits
    assert (s.parent, s.n_tokens, s.block_size, s.medium, s.lora) == (7, 32, 16, "GPU", "adapter-a")
    assert (r.hashes, r.medium) == ([11], "CPU")


def test_first_vllm_release_without_medium_decodes() -> None:
    # v0.9 (PR #16750): BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
    # lora_id), BlockRemoved(block_hashes), EventBatch(ts, events)
    payload = msgspec.msgpack.encode(
        [2.0, [["BlockStored", [1, 2], None, list(range(8)), 4, None], ["BlockRemoved", [1]]]]
    )
    b = decode_payload(payload)
    s, r = b.events
    assert isinstance(s, Stored) and s.medium is None and s.hashes == [1, 2]
    assert isinstance(r, Removed) and r.medium is None and b.dp_rank is None


def test_map_form_and_bytes_hashes_decode() -> None:
    h = bytes(range(32))  # vLLM's default: the sha256 digest itself
    batch = [3.0, [MapStored([h], None, [1, 2, 3, 4], 4, None, "GPU", group_idx=0)], 0]
    b = decode_payload(msgspec.msgpack.encode(batch))
    (s,) = b.events
    assert isinstance(s, Stored)
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES's conversion: the low 64 bits, big-endian
    assert s.hashes == [int.from_bytes(h, "big") & MASK]
    assert s.group == 0
    m = decode_payload(
        msgspec.msgpack.encode(
            {"ts": 4.0, "events": [MapRemoved([5], "GPU")], "data_parallel_rank": 2}
        )
    )
    assert m.dp_rank == 2 and isinstance(m.events[0], Removed)


def _sglang_events():  # type: ignore[no-untyped-def]
    """SGLang 0.5.23's own event classes (python/sglang/srt/disaggregation/kv_events.py),
    loaded by file; two modules only its functions use stand in for the ones that pull
    in the runtime."""
    from tests.helpers import product_loaders

    for name, attrs in (
        ("sglang.srt.runtime_context", {"get_parallel": None}),
        ("sglang.srt.utils.network", {"NetworkAddress": None}),
    ):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
    return product_loaders.load("sglang.srt.disaggregation.kv_events")


def test_sglang_event_classes_decode() -> None:
    k = _sglang_events()
    batch = k.KVEventBatch(
        ts=5.0,
        events=[
            k.BlockStored(
                block_hashes=[-3, 9],
                parent_block_hash=None,
                token_ids=list(range(8)),
                block_size=4,
                lora_id=None,
                medium=k.StorageMedium.GPU.value,
                session_id="alice",
            ),
            k.BlockStored(
                block_hashes=[9],
                parent_block_hash=None,
                token_ids=list(range(4)),
                block_size=4,
                lora_id=None,
                medium=k.StorageMedium.CPU.value,
            ),
            k.BlockRemoved(block_hashes=[9], medium=k.StorageMedium.GPU.value),
            k.AllBlocksCleared(),
        ],
        attn_dp_rank=3,
    )
    b = decode_payload(msgspec.msgpack.encode(batch))
    s, cpu, r, c = b.events
    assert isinstance(s, Stored) and s.hashes == [-3 & MASK, 9] and s.session == "alice"
    assert isinstance(cpu, Stored) and cpu.medium == "CPU_PINNED"
    assert isinstance(r, Removed) and isinstance(c, Cleared) and b.dp_rank == 3


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1 not msgpack",
        msgspec.msgpack.encode("a string"),
        msgspec.msgpack.encode(["yesterday", []]),
        msgspec.msgpack.encode([-1.0, []]),
        msgspec.msgpack.encode([1.0, "events"]),
    ],
)
def test_a_bad_envelope_is_a_wire_error(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_payload(payload)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=12)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type"]),
    lambda c: st.lists(c, max_size=8) | st.dictionaries(st.text(max_size=12), c, max_size=8),
    max_leaves=40,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(obj=_values, noise=st.binary(max_size=40))
def test_any_payload_is_a_batch_or_a_wire_error(obj: object, noise: bytes) -> None:
    for payload in (msgspec.msgpack.encode(obj), noise):
        try:
            b = decode_payload(payload)
        except WireError:
            continue
        assert all(isinstance(e, Stored | Removed | Cleared) for e in b.events)
        assert all(0 <= h < 2**64 for e in b.events if not isinstance(e, Cleared) for h in e.hashes)


@pytest.mark.slow
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.binary(max_size=200), records=st.lists(_values, max_size=6))
def test_any_recording_reads_or_is_one_input_error(tmp_path: Path, body: bytes, records) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "fuzz.kvev"
    with open(path, "wb") as fh:
        w = RecordingWriter(fh)
        w.header(started_epoch_s=0.0, endpoints=[])
        for r in records:
            w.write(r if isinstance(r, dict) else {"kind": "batch", "events": r})
        fh.write(body)
    try:
        rec = read_recording(str(path))
    except InputError:
        return
    assert all(isinstance(b.ts, float) for b in rec.batches)


def test_a_bad_event_is_left_out_and_counted() -> None:
    payload = msgspec.msgpack.encode(
        [
            1.0,
            [
                ["BlockStored", [1], None, [0] * 4, 4, None, "GPU"],
                ["BlockUpdated", [1]],  # a type kvpool does not know
                ["BlockStored", "x", None, [], 4, None, "GPU"],  # hashes not a list
                ["BlockStored", [2], None, [0] * 4, 0, None, "GPU"],  # block size 0
                42,
            ],
        ]
    )
    b = decode_payload(payload)
    assert len(b.events) == 1
    assert sorted(e.reason for e in b.bad) == [
        "event is neither a tagged array nor a map",
        "invalid value",
        "mistyped field",
        "unknown event type",
    ]


# -- recordings and the requests they show ------------------------------------------------------


def write_recording(path: Path, batches: list[tuple[float, list]], endpoint: int = 0) -> None:
    with open(path, "wb") as fh:
        w = RecordingWriter(fh)
        w.header(started_epoch_s=0.0, endpoints=[{"index": endpoint}])
        for seq, (ts, events) in enumerate(batches):
            w.batch(endpoint, seq, decode_payload(encode(ts, events)))
        w.write({"kind": "end", "reason": "test"})


def test_recording_is_detected_and_rebuilds_requests(tmp_path: Path) -> None:
    eng = Engine(block_size=4, capacity=1000, chunk_blocks=100)
    system = list(range(100, 116))  # 4 blocks shared by both sessions
    a1 = system + list(range(200, 208))
    b1 = system + list(range(300, 312))
    a2 = a1 + list(range(400, 404))  # turn 2 of a extends turn 1 whole
    batches = []
    for t, tokens in ((1000.0, a1), (1010.0, b1), (1020.0, a2)):
        got, _ = eng.serve(tokens, t)
        batches += got
    rec = tmp_path / "events.kvev"
    write_recording(rec, batches)
    assert detect_format(rec) == "kv-events"
    loaded = open_trace([str(rec)], IngestOptions(salt=SALT))
    t = loaded.table
    assert t.column("prompt_tokens").to_pylist() == [24, 28, 28]
    assert t.column("cached_tokens").to_pylist() == [0, 16, 24]
    assert t.column("arrival_s").to_pylist() == [0.0, 10.0, 20.0]
    sessions = t.column("session_id").to_pylist()
    assert sessions[0] == sessions[2] != sessions[1]  # a2 continued a1's chain: one session
    hashes = t.column("block_hashes").to_pylist()
    want = [
        id_hashes(b"kv-events", np.array(eng.chain(x), np.uint64).view(np.int64), SALT)
        for x in (a1, b1, a2)
    ]
    assert hashes == [w.tolist() for w in want]
    assert t.schema.metadata[b"kvpool.block_size"] == b"4"
    e = loaded.engine
    assert e is not None
    assert (e.requests, e.prompt_tokens, e.hit_tokens) == (3, 80, 40)
    gpu = e.medium("GPU")
    assert gpu is not None and (gpu.stored_blocks, gpu.peak_blocks) == (10, 10)


def test_chunked_prefill_and_decode_stores_continue_one_request(tmp_path: Path) -> None:
    eng = Engine(block_size=4, capacity=1000, chunk_blocks=2, step_s=0.05)
    prompt = list(range(40))  # 10 blocks in 5 chunks
    got, _ = eng.serve(prompt, 50.0)
    later, _ = eng.serve(prompt + list(range(900, 908)), 50.0 + CONTINUATION_GAP_S + 1)
    rec = tmp_path / "r.kvev"
    write_recording(rec, got + later)
    t = open_trace([str(rec)], IngestOptions(salt=SALT)).table
    assert t.column("prompt_tokens").to_pylist() == [40, 48]
    assert t.column("cached_tokens").to_pylist() == [0, 40]


@st.composite
def workloads(draw):  # type: ignore[no-untyped-def]
    """Sessions of growing prompts over a few shared system prompts, served one at a
    time, each request at least CONTINUATION_GAP_S after the one before."""
    n_sys = draw(st.integers(1, 3))
    systems = [
        list(range(1000 * (k + 1), 1000 * (k + 1) + 4 * draw(st.integers(0, 4))))
        for k in range(n_sys)
    ]
    sessions: list[list[int]] = []
    reqs = []
    t = 0.0
    for i in range(draw(st.integers(1, 25))):
        if sessions and draw(st.booleans()):
            s = draw(st.integers(0, len(sessions) - 1))
        else:
            sessions.append(list(systems[draw(st.integers(0, n_sys - 1))]))
            s = len(sessions) - 1
        sessions[s] = sessions[s] + [10_000 * (i + 1) + j for j in range(draw(st.integers(1, 14)))]
        t += CONTINUATION_GAP_S + draw(st.floats(0.5, 30))
        reqs.append((t, list(sessions[s])))
    return reqs, draw(st.integers(4, 40)), draw(st.integers(1, 4))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(w=workloads())
def test_rebuilt_requests_match_the_engine(tmp_path: Path, w) -> None:  # type: ignore[no-untyped-def]
    """The oracle: an engine that stores and evicts blocks as vLLM does; every request
    that stored a block comes back with its whole prefix chain, its arrival and the hit
    the engine gave it, and the occupancy is the engine's."""
    reqs, capacity, chunk = w
    eng = Engine(block_size=4, capacity=capacity, chunk_blocks=chunk)
    batches, expect = [], []
    peak = 0
    for t, tokens in reqs:
        got, hit = eng.serve(tokens, t)
        peak = max(peak, len(eng.cached))
        batches += got
        if got:
            expect.append((t, eng.chain(tokens), hit))
    rec = tmp_path / "w.kvev"
    write_recording(rec, batches)
    if not expect:
        with pytest.raises(InputError, match="no requests"):
            open_trace([str(rec)], IngestOptions(salt=SALT))
        return
    loaded = open_trace([str(rec)], IngestOptions(salt=SALT))
    tab = loaded.table
    t0 = expect[0][0]
    assert tab.column("arrival_s").to_pylist() == pytest.approx([t - t0 for t, _, _ in expect])
    assert tab.column("prompt_tokens").to_pylist() == [4 * len(c) for _, c, _ in expect]
    assert tab.column("cached_tokens").to_pylist() == [4 * h for _, _, h in expect]
    want = [
        id_hashes(b"kv-events", np.array(c, np.uint64).view(np.int64), SALT).tolist()
        for _, c, _ in expect
    ]
    assert tab.column("block_hashes").to_pylist() == want
    gpu = loaded.engine.medium("GPU")
    assert gpu.peak_blocks == peak and gpu.final_blocks == len(eng.cached)


def test_unseen_prefix_and_other_media(tmp_path: Path) -> None:
    batches = [
        (10.0, [ArrayStored([50, 51], 49, [0] * 8, 4, None, "GPU")]),  # 49 cached before
        (10.5, [ArrayStored([7000], None, [0] * 256, 256, None, "CPU")]),  # LMCache chunk
        (20.0, [ArrayRemoved([50, 51], "GPU"), ArrayRemoved([7000], "CPU")]),
        (21.0, [ArrayCleared()]),
    ]
    rec = tmp_path / "u.kvev"
    write_recording(rec, batches)
    loaded = open_trace([str(rec)], IngestOptions(salt=SALT))
    t = loaded.table
    assert t.column("prompt_tokens").to_pylist() == [12]
    assert t.column("approx_lengths").to_pylist() == [True]
    e = loaded.engine
    cpu, gpu = e.medium("CPU"), e.medium("GPU")
    assert (cpu.block_size, cpu.peak_tokens, cpu.removed_blocks) == (256, 256, 1)
    assert gpu.median_lifetime_s == pytest.approx(10.0)
    assert e.clears == 1 and e.requests_prefix_unseen == 1
    assert any("before the recording began" in n for n in loaded.notes)


def test_a_hybrid_models_groups_count_apart_and_give_one_request(tmp_path: Path) -> None:
    """vLLM's hybrid models store each block once per KV cache group (``group_idx``):
    both groups' blocks are held, one request is rebuilt."""
    batches = [
        (1.0, [MapStored([1, 2], None, [0] * 8, 4, None, "GPU", group_idx=g) for g in (0, 1)]),
        (2.0, [MapRemoved([2], "GPU", group_idx=1)]),
    ]
    rec = tmp_path / "h.kvev"
    write_recording(rec, batches)
    loaded = open_trace([str(rec)], IngestOptions(salt=SALT))
    assert loaded.table.column("prompt_tokens").to_pylist() == [8]
    gpu = loaded.engine.medium("GPU")
    assert (gpu.peak_blocks, gpu.final_blocks, gpu.removed_blocks) == (4, 3, 1)


def test_bad_recordings_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.kvev"
    bad.write_bytes(MAGIC + b"\x05\x00\x00\x00abc")
    with pytest.raises(InputError, match="cut short inside its header"):
        read_recording(str(bad))
    huge = tmp_path / "huge.kvev"
    huge.write_bytes(MAGIC + b"\xff\xff\xff\xff")
    with pytest.raises(InputError, match="corrupt"):
        read_recording(str(huge))
    other = tmp_path / "v2.kvev"
    with open(other, "wb") as fh:
        RecordingWriter(fh).write({"kind": "header", "format": "kvpool.kvevents", "version": 2})
    with pytest.raises(InputError, match="version 2"):
        read_recording(str(other))
    # a recording cut short keeps what came before the cut, and says so
    good = tmp_path / "good.kvev"
    write_recording(good, [(1.0, [ArrayStored([1, 2], None, [0] * 8, 4, None, "GPU")])])
    cut = tmp_path / "cut.kvev"
    cut.write_bytes(good.read_bytes()[:-3])
    loaded = open_trace([str(cut)], IngestOptions(salt=SALT))
    assert loaded.table.num_rows == 1 and loaded.engine is not None
    assert not loaded.engine.complete
    assert loaded.skipped.by_reason == {"recording cut short": 1}
    with pytest.raises(UsageError, match="cannot be mixed"):
        open_trace([str(good), str(ROOT / "traces" / "chat.jsonl.zst")], IngestOptions(salt=SALT))


def test_endpoints_are_checked() -> None:
    assert check_endpoint("tcp://10.0.0.1:5557", "--kv-events")
    for bad in ("localhost:5557", "tcp://*:5557", "tcp://h:70000", "http://h:1"):
        with pytest.raises(UsageError):
            check_endpoint(bad, "--kv-events")


# -- recording from a publisher on loopback ---------------------------------------------------------


def _record_in_thread(pub: Publisher | list[Publisher], tmp: Path, **kw):  # type: ignore[no-untyped-def]
    """``record_events`` on a thread, subscribed to each publisher; returns ``finish()``,
    which stops it and gives (the recording, its stats)."""
    pubs = pub if isinstance(pub, list) else [pub]
    out = tmp / "live.kvev"
    fh = open(out, "wb")  # noqa: SIM115 (closed by finish())
    stop = threading.Event()
    seen: dict[str, list[int]] = {"per_endpoint": [0] * len(pubs)}

    def tick(stats):  # type: ignore[no-untyped-def]
        seen["per_endpoint"] = list(stats.per_endpoint)

    opts = RecordOptions(
        endpoints=tuple(p.endpoint for p in pubs),
        replay=tuple(p.replay_endpoint for p in pubs),
        topic="kv-events",
        **kw,
    )
    result = {}
    th = threading.Thread(
        target=lambda: result.setdefault(
            "stats", record_events(opts, RecordingWriter(fh), SALT, stop.is_set, tick)
        )
    )
    th.start()
    # PUB drops what it sends before the subscription arrives: warm up until one is seen
    deadline = time.monotonic() + 20
    while not all(seen["per_endpoint"]):
        assert time.monotonic() < deadline, "the recorder never received a batch"
        for p in pubs:
            p.publish(encode(time.time(), [ArrayStored([1], None, [0] * 4, 4, None, "GPU")]))
        time.sleep(0.1)

    def finish():  # type: ignore[no-untyped-def]
        time.sleep(0.5)
        stop.set()
        th.join(timeout=20)
        fh.close()
        return out, result["stats"]

    return finish


@pytest.mark.slow
def test_record_several_endpoints_at_once(tmp_path: Path) -> None:
    """One engine per endpoint (or one data-parallel rank each): their caches are kept
    apart, and the same prefix stored by both is one block id in the trace."""
    pubs = [Publisher(), Publisher()]
    try:
        finish = _record_in_thread(pubs, tmp_path)
        t = time.time()
        for rank, p in enumerate(pubs):
            p.publish(encode(t, [ArrayStored([500, 501], None, [0] * 8, 4, None, "GPU")], rank))
            p.publish(
                encode(t + 5, [ArrayStored([600 + rank], 501, [0] * 4, 4, None, "GPU")], rank)
            )
        out, stats = finish()
    finally:
        for p in pubs:
            p.close()
    assert all(n >= 3 for n in stats.per_endpoint)
    loaded = open_trace([str(out)], IngestOptions(salt=SALT))
    e = loaded.engine
    assert e is not None and e.engines == 2
    t = loaded.table
    rows = [
        (rid[:2], tuple(h))
        for rid, h in zip(
            t.column("request_id").to_pylist(), t.column("block_hashes").to_pylist(), strict=True
        )
        if len(h) == 3
    ]
    # each engine's [500, 501, 60r]: the shared prefix is the same ids, the ends differ
    assert sorted(r[0] for r in rows) == ["e0", "e1"]
    assert rows[0][1][:2] == rows[1][1][:2] and rows[0][1][2] != rows[1][1][2]
    assert t.column("cached_tokens").to_pylist()[-2:] == [8, 8]


@pytest.mark.slow
def test_record_recovers_a_gap_by_replay_and_counts_malformed_frames(tmp_path: Path) -> None:
    pub = Publisher()
    try:
        finish = _record_in_thread(pub, tmp_path)
        t = time.time()
        pub.publish(encode(t, [ArrayStored([10, 11], None, [0] * 8, 4, None, "GPU")]))
        pub.publish(encode(t + 0.01, [ArrayStored([12], 11, [0] * 4, 4, None, "GPU")]), drop=True)
        pub.publish(encode(t + 5, [ArrayStored([13], 11, [0] * 4, 4, None, "GPU")]))
        pub.send_raw([b"kv-events", b"short", b"x"])
        pub.send_raw([b"kv-events only"])
        pub.publish(b"\xc1\xc1 not msgpack")
        pub.publish(encode(t + 6, [["BlockStored", "bad"]]))
        private = {  # SGLang's map form, with the session that stored the blocks
            "type": "BlockStored",
            "block_hashes": [20],
            "parent_block_hash": None,
            "token_ids": [7] * 4,
            "block_size": 4,
            "lora_id": None,
            "medium": "GPU",
            "session_id": "alice@example.com",
        }
        pub.publish(msgspec.msgpack.encode([t + 30, [private], 0]))
        out, stats = finish()
    finally:
        pub.close()
    assert stats.gaps == 1 and stats.replayed == 1 and stats.lost == 0
    assert stats.malformed == {
        "frame count is not 3 (topic, seq, payload)": 1,
        "sequence frame is not 8 bytes": 1,
        "payload is not msgpack": 1,
        "mistyped field (block_hashes)": 1,
    }
    raw = out.read_bytes()
    assert b"alice" not in raw and b"127.0.0.1" not in raw  # pseudonym; no address
    rec = read_recording(str(out))
    assert rec.trailer is not None and rec.trailer["reason"] == "interrupted"
    assert rec.gaps == 1 and rec.replayed_batches == 1
    seqs = [b.seq for b in rec.batches]
    assert seqs == sorted(seqs)  # the replayed batch is written before the one after the gap
    loaded = open_trace([str(out)], IngestOptions(salt=SALT))
    # the warm-up root, [10, 11, 12] (the replayed continuation), [10, 11, 13], [20]
    assert loaded.table.column("prompt_tokens").to_pylist()[-3:] == [12, 12, 4]
    assert loaded.table.column("cached_tokens").to_pylist()[-3:] == [0, 8, 0]
    assert loaded.table.column("session_id").to_pylist()[-1].startswith("s-")


@pytest.mark.slow
def test_record_stops_at_max_events(tmp_path: Path) -> None:
    pub = Publisher()
    try:
        finish = _record_in_thread(pub, tmp_path, max_events=5)
        for i in range(10):
            pub.publish(
                encode(time.time(), [ArrayStored([100 + i], None, [0] * 4, 4, None, "GPU")])
            )
        _, stats = finish()
    finally:
        pub.close()
    assert stats.reason == "max-events" and stats.events == 5


def _cli(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KVPOOL_NO_PROGRESS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "analyzer.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
def test_sigterm_leaves_a_whole_recording_that_converts_and_analyzes(tmp_path: Path) -> None:
    """The issue's "Done when": a recorded KV-event stream converts and analyzes."""
    pub = Publisher()
    out = tmp_path / "events.kvev"
    salt = tmp_path / "salt"
    eng = Engine(block_size=16, capacity=2000, chunk_blocks=8)
    rng = np.random.default_rng(0)
    system = list(range(1, 513))
    convs = [system + rng.integers(1000, 50_000, 64).tolist() for _ in range(40)]
    try:
        proc = _cli("record", "--kv-events", pub.endpoint, "--replay", pub.replay_endpoint,
                    "--topic", "kv-events", "--salt-file", str(salt), "-o", str(out))  # fmt: skip
        assert proc.stderr is not None
        assert b"recording from 1 endpoint" in proc.stderr.readline()
        t = time.time()
        for _ in range(10):  # the subscription takes a moment to reach the publisher
            pub.publish(encode(t, [ArrayCleared()]))
            time.sleep(0.1)
        for step in range(240):  # 240 turns of 40 conversations, 3 s of engine time apart
            k = step % 40
            convs[k] = convs[k] + rng.integers(1000, 50_000, 48).tolist()
            for ts, events in eng.serve(convs[k], t + 3 * step)[0]:
                pub.publish(encode(ts, events))
            time.sleep(0.005)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        pub.close()
    assert proc.returncode == 0, err.decode()
    assert b"stopped: interrupted" in err
    rec = read_recording(str(out))
    assert rec.trailer is not None and rec.batches
    runner = CliRunner()
    conv = tmp_path / "trace.parquet"
    r = runner.invoke(app, ["convert", str(out), "-o", str(conv), "--salt-file", str(salt)])
    assert r.exit_code == 0, r.output
    assert pq.read_metadata(conv).num_rows > 0
    reuse_json = tmp_path / "reuse.json"
    r = runner.invoke(app, ["reuse", str(out), "--json", str(reuse_json), "--salt-file", str(salt)])
    assert r.exit_code == 0, r.output
    assert "engine KV events" in r.output
    ev = json.loads(reuse_json.read_text())["engine_events"]
    assert ev["media"][0]["medium"] == "GPU" and ev["hit_rate"] > 0.5
    rep = tmp_path / "report"
    rep.mkdir()
    r = runner.invoke(
        app,
        ["analyze", str(out), "-o", str(rep), "--model", "llama-3.1-8b", "--salt-file", str(salt)],
    )
    assert r.exit_code == 0, r.output
    from analyzer.report.document import ReportDocument

    doc = ReportDocument.load(rep / "report.json").report
    assert doc.engine_events is not None and doc.engine_events.media[0].peak_gb is not None
    assert doc.engine_events.requests >= 200 and doc.replay is not None
    assert doc.measured_vs_projected is not None  # the engine's hits beside the replay's
    assert "What the engine's KV events show" in (rep / "report.md").read_text()
    r = runner.invoke(
        app, ["replay", str(out), "--salt-file", str(salt), "--model", "llama-3.1-8b"]
    )
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-events", "localhost:5557"], "is not a ZMQ endpoint"),
        (["--kv-events", "tcp://*:5557"], "connect to its host"),
        (
            ["--kv-events", "tcp://h:1", "--replay", "tcp://h:2", "--replay", "tcp://h:3"],
            "2 --replay",
        ),
        (["--kv-events", "tcp://h:1", "--duration", "0"], "--duration"),
        (["--kv-events", "tcp://h:1", "--max-events", "0"], "--max-events"),
    ],
)
def test_record_flags_are_checked(tmp_path: Path, args: list[str], message: str) -> None:
    r = CliRunner().invoke(app, ["record", *args, "-o", str(tmp_path / "x.kvev")])
    assert isinstance(r.exception, UsageError) and message in str(r.exception), r.output
    assert r.exception.exit_code == 2
    assert not (tmp_path / "x.kvev").exists()


@pytest.mark.slow
def test_record_to_stdout_with_nothing_published(tmp_path: Path) -> None:
    """--duration ends it; a silent endpoint is a warning, and the recording is still
    whole (header and trailer), here on stdout."""
    proc = _cli("record", "--kv-events", "tcp://127.0.0.1:9", "--duration", "0.5", "-o", "-",
                "--salt-file", str(tmp_path / "salt"))  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert out.startswith(MAGIC)
    assert b"no event batches from tcp://127.0.0.1:9" in err
    path = tmp_path / "stdout.kvev"
    path.write_bytes(out)
    rec = read_recording(str(path))
    assert rec.trailer is not None and rec.trailer["reason"] == "duration" and not rec.batches
    with pytest.raises(InputError, match="no requests"):
        open_trace([str(path)], IngestOptions(salt=SALT))
