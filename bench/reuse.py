"""Speed of the one-pass LRU curve against per-capacity LRU replays, measured in one run.

    .venv/bin/python bench/reuse.py [--sessions 41000] [--skip-big]

Prints, for the Mooncake conversation trace and for a generated chained trace of at
least 20M block accesses: the time of the exact one-pass curve (numba Fenwick stack
distances), its peak extra memory (RSS high-water mark, reset before the call), a
plain per-capacity LRU replay (OrderedDict, tail-first touches) measured at 10
capacities, and the ratio. A full curve by replays needs one replay per capacity where
the curve steps; that total is *extrapolated* from the measured replays and labelled
so. On the generated trace the replays run on its first 1M accesses and are scaled by
accesses (also labelled). Also prints SHARDS time and measured error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.cache.kernels import simulate_fast  # noqa: E402
from analyzer.cache.simulate import simulate  # noqa: E402
from analyzer.cache.stack import lru_histogram  # noqa: E402
from analyzer.reuse.analysis import (  # noqa: E402
    ReuseOptions,
    analyze_reuse,
    first_counted_request,
    shards_curve,
    shards_error,
)
from analyzer.reuse.curves import exact_curve  # noqa: E402
from analyzer.reuse.synthetic import chained_trace  # noqa: E402
from analyzer.trace import BlockTrace  # noqa: E402

MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def measure(fn, *args):
    """(result, seconds, peak extra RSS bytes) of one call."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the RSS high-water mark
        before = _status("VmRSS")
    except OSError:
        before = None
    t = time.perf_counter()
    out = fn(*args)
    dt = time.perf_counter() - t
    peak = _status("VmHWM") - before if before is not None else -1
    return out, dt, peak


def one_pass(trace: BlockTrace, first: int):
    hist = lru_histogram(
        trace.block_ids,
        trace.offsets,
        trace.prompt_tokens,
        np.empty(0, np.int64),
        trace.block_size,
        first,
        trace.n_blocks,
        True,
    )
    return exact_curve(hist, int(trace.prompt_tokens[first:].sum()))


def replay_lru(chains: list[list[int]], prompts: list[int], bs: int, first: int, cap: int):
    """Plain per-capacity LRU replay: the baseline."""
    cache: OrderedDict[int, None] = OrderedDict()
    hit = 0
    for r, chain in enumerate(chains):
        k = 0
        while k < len(chain) and chain[k] in cache:
            k += 1
        if r >= first:
            hit += max(min(k * bs, prompts[r] - 1), 0)
        for b in reversed(chain):
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
                if len(cache) > cap:
                    cache.popitem(last=False)
    return hit


def mb(n: int) -> str:
    """RSS figures are high-water marks since a reset; memory the process freed earlier
    and reuses does not show, so they are lower bounds on what a call allocates."""
    return f"{n / 2**20:,.1f} MiB" if n >= 0 else "n/a"


def bench_trace(name: str, trace: BlockTrace, subset_accesses: int | None) -> None:
    print(
        f"\n== {name}: {trace.n_requests:,} requests, {trace.n_accesses:,} block accesses, "
        f"{trace.n_blocks:,} distinct blocks, block size {trace.block_size}"
    )
    first = first_counted_request(trace.n_requests, 0.5)
    curve, dt, peak = measure(one_pass, trace, first)
    per_block = peak / max(trace.n_blocks, 1) if peak >= 0 else float("nan")
    arrays = 48 * trace.n_blocks  # tree + positions (2 x 16 B), last touch 8 B, histogram 8 B
    print(
        f"one-pass exact LRU curve: {dt:.3f} s; working arrays {mb(arrays)} (48 B per distinct "
        f"block), peak extra RSS {mb(peak)} ({per_block:.0f} B per distinct block, pages "
        f"touched); {curve.caps_blocks.size:,} capacities where the curve steps, ceiling "
        f"{100 * curve.rates[-1]:.2f}%"
    )
    # baseline: per-capacity LRU replays at 10 capacities (on a prefix for huge traces)
    n_req = trace.n_requests
    label = "full trace"
    if subset_accesses is not None and subset_accesses < trace.n_accesses:
        n_req = int(np.searchsorted(trace.offsets, subset_accesses, side="right")) - 1
        label = f"first {int(trace.offsets[n_req]):,} accesses"
    chains = [trace.blocks_of(i).tolist() for i in range(n_req)]
    prompts = trace.prompt_tokens[:n_req].tolist()
    sub_first = first_counted_request(n_req, 0.5)
    caps = np.unique(np.round(np.geomspace(1, max(curve.full_blocks, 2), 10)).astype(int))
    t = time.perf_counter()
    for cap in caps:
        replay_lru(chains, prompts, trace.block_size, sub_first, int(cap))
    replay_s = time.perf_counter() - t
    per_cap = replay_s / caps.size
    scale = trace.n_accesses / max(int(trace.offsets[n_req]), 1)
    full_replays = per_cap * scale * curve.caps_blocks.size
    print(
        f"per-capacity LRU replay (OrderedDict), measured at {caps.size} capacities on the "
        f"{label}: {replay_s:.2f} s ({per_cap:.3f} s per capacity)"
    )
    if scale > 1:
        print(
            f"  scaled by accesses to the whole trace (extrapolated): "
            f"{per_cap * scale:.1f} s per capacity"
        )
    print(
        f"  10 capacities by replay vs the whole curve in one pass: "
        f"{per_cap * scale * caps.size / dt:,.0f}x slower"
    )
    print(
        f"  whole curve by replay, {curve.caps_blocks.size:,} capacities (extrapolated): "
        f"{full_replays:,.0f} s = {full_replays / dt:,.0f}x the one pass"
    )
    if trace.n_accesses > 1_000_000:
        for rate in (0.01, 0.1):
            _, sdt, speak = measure(shards_curve, trace, rate, first)
            err = shards_error(trace, rate, 0.5, 5_000_000)
            print(
                f"SHARDS rate {rate}: {sdt:.3f} s, peak extra RSS {mb(speak)}; error vs "
                f"exact on the first {err['checked_accesses']:,} accesses: max "
                f"{100 * err['max_abs_error']:.2f} pts, mean {100 * err['mean_abs_error']:.2f} pts"
            )
    cap = int(caps[len(caps) // 2])
    for policy in ("fifo", "s3fifo", "optimal"):
        _, fdt, _ = measure(
            simulate_fast,
            trace.block_ids,
            trace.offsets,
            trace.prompt_tokens,
            trace.block_size,
            first,
            cap,
            policy,
        )
        sub = (trace.block_ids, trace.offsets[: n_req + 1], trace.prompt_tokens, trace.block_size)
        t = time.perf_counter()
        simulate(*sub, sub_first, cap, policy)
        ref_s = (time.perf_counter() - t) * scale
        print(
            f"{policy} at {cap:,} blocks: numba {fdt:.2f} s; Python reference "
            f"{ref_s:.1f} s{' (extrapolated from the subset)' if scale > 1 else ''}"
        )
    _, adt, apeak = measure(analyze_reuse, trace, ReuseOptions(policies=("lru",)))
    print(
        f"analyze_reuse, LRU curve + ceilings/sources/granularity: {adt:.2f} s, "
        f"peak extra RSS {mb(apeak)}"
    )
    _, adt, apeak = measure(analyze_reuse, trace, ReuseOptions())
    print(
        f"analyze_reuse with FIFO/S3-FIFO/optimal at 4 capacities: {adt:.2f} s, "
        f"peak extra RSS {mb(apeak)}"
    )


def load_mooncake() -> BlockTrace | None:
    if not MOONCAKE.is_file():
        print(f"(skipping Mooncake: {MOONCAKE} not found)")
        return None
    from analyzer.ingest import open_trace

    return open_trace(str(MOONCAKE)).trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=41_000, help="generated sessions (~20M)")
    ap.add_argument("--skip-big", action="store_true")
    args = ap.parse_args()
    # numba compiles (or loads its cache) on first use: do it on a tiny trace, and say so
    t = time.perf_counter()
    tiny = chained_trace(20, seed=0)
    one_pass(tiny, 0)
    analyze_reuse(tiny, ReuseOptions(shards_rate=0.5))
    print(f"numba compile / cache load (once per process): {time.perf_counter() - t:.2f} s")
    mc = load_mooncake()
    if mc is not None:
        bench_trace("Mooncake conversation trace", mc, None)
    if not args.skip_big:
        t = time.perf_counter()
        big = chained_trace(args.sessions, seed=1)
        print(f"\n(generated the chained trace in {time.perf_counter() - t:.1f} s)")
        bench_trace("generated chained trace", big, 1_000_000)


if __name__ == "__main__":
    main()
