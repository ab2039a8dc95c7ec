"""Benchmark of reading a KV-event recording, against the same requests as a Bailian trace.

Generates one workload (sessions that resend their history every turn, over a few shared
system prompts) twice: as a ``kvpool record`` recording of the events a prefix-caching
engine would publish for it (vLLM's array form: chunked prefill, LRU evictions, a
``BlockRemoved`` per eviction), and as a Qwen Bailian trace of the same requests
(``hash_ids`` per 16-token block, a pre-hashed form, at the same block size). Then runs, each in a
fresh process, ``kvpool convert`` and ``kvpool reuse`` on both, and prints wall time, CPU
time and peak RSS side by side: the recording's cost over the peer is rebuilding the
requests from their block chains and counting the occupancy.

    .venv/bin/python bench/kvevents.py [--requests 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import mib, run


def _chain(parent: int, block: tuple[int, ...]) -> int:
    return hash((parent, block)) & ((1 << 63) - 1)


def generate(folder: Path, requests: int, seed: int) -> tuple[Path, Path, int]:
    """(recording, Bailian trace, events) of ``requests`` requests."""
    import msgspec

    from analyzer.ingest.kvfile import RecordingWriter
    from analyzer.ingest.kvwire import decode_payload

    bs = 16  # the engine's blocks and Bailian's
    rnd = random.Random(seed)
    systems = [[rnd.randrange(1, 50_000) for _ in range(bs * rnd.randint(8, 64))] for _ in range(8)]
    sessions: list[list[int]] = []
    last_id: list[int] = []  # each session's latest request, its next turn's parent
    capacity = 200_000  # blocks of HBM prefix cache
    cached: OrderedDict[int, None] = OrderedDict()
    rec_path, moon_path = folder / "events.kvev", folder / "bailian.jsonl"
    events = 0
    t = 1_700_000_000.0
    with open(rec_path, "wb") as fh, open(moon_path, "w") as moon:
        w = RecordingWriter(fh)
        w.header(started_epoch_s=t, endpoints=[{"index": 0}])
        seq = 0
        for i in range(requests):
            if sessions and rnd.random() < 0.7:
                s = rnd.randrange(len(sessions))
                if len(sessions[s]) > 60_000:
                    sessions[s] = list(rnd.choice(systems))
                    last_id[s] = -1
            else:
                sessions.append(list(rnd.choice(systems)))
                last_id.append(-1)
                s = len(sessions) - 1
            sessions[s] += [rnd.randrange(1, 50_000) for _ in range(rnd.randint(20, 600))]
            tokens = sessions[s]
            t += rnd.expovariate(20.0) + 0.001
            hashes, h = [], 0
            for k in range(len(tokens) // bs):
                h = _chain(h, tuple(tokens[k * bs : (k + 1) * bs]))
                hashes.append(h)
            row = {
                "chat_id": i,
                "parent_chat_id": last_id[s],
                "timestamp": t - 1_700_000_000.0,
                "input_length": len(tokens),
                "output_length": 0,
                "type": "text",
                "turn": 1,
                "hash_ids": hashes,
            }
            last_id[s] = i
            moon.write(json.dumps(row) + "\n")
            hit = 0
            while hit < len(hashes) and hashes[hit] in cached:
                cached.move_to_end(hashes[hit])
                hit += 1
            new = hashes[hit:]
            for c in range(0, len(new), 128):  # chunked prefill, 2048 tokens a step
                part = new[c : c + 128]
                evs: list[list[object]] = []
                over = len(cached) + len(part) - capacity
                if over > 0:
                    victims = [cached.popitem(last=False)[0] for _ in range(over)]
                    evs.append(["BlockRemoved", victims, "GPU"])
                first = hit + c
                for x in part:
                    cached[x] = None
                parent = hashes[first - 1] if first else None
                evs.append(["BlockStored", part, parent, tokens[first * bs : (first + len(part)) * bs], bs, None, "GPU"])  # fmt: skip
                payload = msgspec.msgpack.encode([t + 0.02 * (c // 128), evs, 0])
                w.batch(0, seq, decode_payload(payload))
                seq += 1
                events += len(evs)
        w.write({"kind": "end", "reason": "generated"})
    return rec_path, moon_path, events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    kvpool = [sys.executable, "-m", "analyzer.cli"]
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-kvev-") as d:
        folder = Path(d)
        rec, moon, n_events = generate(folder, args.requests, args.seed)
        print(
            f"workload: {args.requests:,} requests, {n_events:,} events; recording "
            f"{mib(rec.stat().st_size)}, Bailian trace {mib(moon.stat().st_size)}"
        )
        salt = folder / "salt"
        cases = {
            "convert kv-events": [
                *kvpool,
                "-q",
                "convert",
                str(rec),
                "-o",
                str(folder / "a.parquet"),
                "--force",
            ],
            "convert bailian": [
                *kvpool,
                "-q",
                "convert",
                str(moon),
                "-o",
                str(folder / "b.parquet"),
                "--force",
            ],
            "reuse kv-events": [*kvpool, "-q", "reuse", str(rec)],
            "reuse bailian": [*kvpool, "-q", "reuse", str(moon)],
        }
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(args.repeat):
            for name, argv in cases.items():  # interleaved: drift hits every case alike
                r = run([*argv, "--salt-file", str(salt)])
                if r.returncode:
                    sys.exit(f"{name} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
                w, c, m = best.get(name, (float("inf"), float("inf"), 0))
                best[name] = (min(w, r.wall_s), min(c, r.cpu_s), max(m, r.peak_rss_bytes))
        print(f"{'case':<20} {'wall s':>8} {'cpu s':>8} {'peak RSS':>10}   (best of {args.repeat})")
        for name, (w, c, m) in best.items():
            print(f"{name:<20} {w:>8.2f} {c:>8.2f} {mib(m):>10}")
        for what in ("convert", "reuse"):
            a, b = best[f"{what} kv-events"], best[f"{what} bailian"]
            print(
                f"{what}: kv-events / bailian wall {a[0] / b[0]:.2f}x, peak RSS {a[2] / b[2]:.2f}x"
            )


if __name__ == "__main__":
    main()
