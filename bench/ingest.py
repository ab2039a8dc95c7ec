"""Benchmark of ``kvpool convert`` on a generated multi-turn chat log.

Prints MB/s and requests/s of the conversion (read, render, tokenize, hash, radix LCP,
write Parquet) per second of CPU time (the process is single-threaded, so this is "on one
core" and does not depend on what else the machine runs; wall time is shown too), its
peak RSS, and the same figures with the memos off (every prompt
tokenized and hashed in full with the same tokenizer), measured in the same run; the
ratio is the speed-up from content-addressed memoization. Each mode runs in a fresh
child process so that peak RSS is its own, ``--repeat`` times, the modes interleaved;
the figures are each mode's fastest run (noise from other work on the machine only
ever adds time) and its largest peak RSS.

    .venv/bin/python bench/ingest.py [--requests 50000] [--seed 1] [--repeat 3] [--stages]

Modes: ``memo`` is ``kvpool convert`` as shipped; ``no-memo`` the same with the memos off;
``tokenize-all`` the naive baseline that only reads each request and tokenizes its whole
prompt (no hashing, no radix tree, no output); ``no-exact`` convert without the exact-LCP
tree. Targets (issue 2): >= 3x faster than tokenize-everything, >= 20 MB/s of log on one
core.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import user_env

WORDS = (  # noqa: SIM905 (a sentence reads better than 80 quoted words)
    "the of and to in is for on that with as by at from this be are it an or was we can "
    "cache token prefix model server request latency memory block hash session user "
    "assistant system answer question data table report policy travel flight booking "
    "price refund code python function error result value deploy cluster gpu network "
    "storage bandwidth compute throughput queue router instance replica kernel tensor "
    "batch stream window context layer attention head weight gradient vector index"
).split()


def _text(rnd: random.Random, n_words: int) -> str:
    words = rnd.choices(WORDS, k=n_words)
    out = []
    for i, w in enumerate(words):
        out.append(w.capitalize() + "." if i % 12 == 11 else w)
    return " ".join(out)


def generate(path: Path, requests: int, seed: int, generator: str = "synth") -> str:
    """A chat log in OpenAI JSONL where sessions resend their full history every turn.

    ``synth``: the project's synthetic-workload generator (analyzer.synth, profile "chat"),
    when it is installed; ``builtin``: the small generator below. Returns the one used.
    """
    if generator == "synth":
        try:
            from analyzer.synth import SynthConfig  # type: ignore[attr-defined]
            from analyzer.synth import generate as synth_generate  # type: ignore[attr-defined]
        except ImportError:
            generator = "builtin"
        else:
            synth_generate(
                SynthConfig(profile="chat", requests=requests, seed=seed), path, fmt="openai"
            )
            return "synth"
    rnd = random.Random(seed)
    systems = [_text(rnd, rnd.randint(300, 800)) for _ in range(8)]
    t = 1_700_000_000.0
    live: list[dict] = []
    written = 0
    next_session = 0
    with open(path, "w") as f:
        while written < requests:
            if not live or (len(live) < 400 and rnd.random() < 0.25):
                live.append(
                    {
                        "id": f"sess-{next_session}",
                        "messages": [{"role": "system", "content": rnd.choice(systems)}],
                        "turns_left": 1 + int(rnd.expovariate(1 / 5)),
                    }
                )
                next_session += 1
            s = rnd.choice(live)
            s["messages"].append({"role": "user", "content": _text(rnd, rnd.randint(15, 80))})
            t += rnd.expovariate(20.0)
            rec = {
                "id": f"req-{written}",
                "timestamp": round(t, 3),
                "request": {"model": "llama-3.1-8b", "messages": s["messages"], "user": s["id"]},
                "response": {"usage": {"completion_tokens": rnd.randint(20, 300)}},
            }
            f.write(json.dumps(rec) + "\n")
            written += 1
            s["messages"].append({"role": "assistant", "content": _text(rnd, rnd.randint(40, 160))})
            s["turns_left"] -= 1
            if s["turns_left"] <= 0:
                live.remove(s)
    return "builtin"


def tokenize_all(log: str) -> dict:
    """The naive baseline: read each request and tokenize its whole prompt, nothing else.

    Same reader, chat framing and tokenizer as ``convert``, no memo; no hashing, no
    radix tree, no output.
    """
    from analyzer.ingest import IngestOptions
    from analyzer.ingest.fields import FileContext
    from analyzer.ingest.registry import PARSERS, records
    from analyzer.tokenize import PromptRenderer, load_tokenizer

    opts = IngestOptions()
    ctx = FileContext(log, "openai", opts)
    renderer = PromptRenderer(load_tokenizer(opts.tokenizer), opts.template, memo=False)
    n_requests = n_tokens = 0
    for _, rec in records(log, "openai", None):
        parts, gen = renderer.render(PARSERS["openai"](rec, ctx).body)
        n_tokens += sum(int(p.tokens.size) for p in (*parts, *gen))
        n_requests += 1
    return {"requests": n_requests, "tokens": n_tokens, "blocks": 0, "tokens_encoded": n_tokens}


def stages(log: str, out: str) -> dict[str, float]:
    """CPU seconds of each stage of the memoized convert, by wrapping its functions.

    Each wrapper charges a call's time to its stage minus the time of wrapped calls
    inside it, so the stages add up to the whole; the wrappers themselves cost a little
    (it lands in "other"), so the total runs somewhat above the plain ``memo`` mode.
    """
    from collections import defaultdict

    import analyzer.blocks.hashing as hashing
    import analyzer.cache.token_radix as radix
    import analyzer.ingest.builder as builder
    import analyzer.ingest.readers as readers
    import analyzer.tokenize.render as render
    import analyzer.tokenize.tokenizer as tokenizer
    from analyzer.ingest import IngestOptions, open_trace
    from analyzer.trace import write_canonical

    spent: dict[str, float] = defaultdict(float)
    inner: list[float] = []

    def charge(owner: object, name: str, stage: str) -> None:
        fn = getattr(owner, name)

        def timed(*a, **kw):  # type: ignore[no-untyped-def]
            c0 = time.process_time()
            inner.append(0.0)
            try:
                return fn(*a, **kw)
            finally:
                dt = time.process_time() - c0
                spent[stage] += dt - inner.pop()
                if inner:
                    inner[-1] += dt

        setattr(owner, name, timed)

    charge(tokenizer.Tokenizer, "encode", "tokenizer (new text only)")
    charge(render.PromptRenderer, "render", "chat framing and memo lookups")
    charge(hashing.BlockHasher, "extend", "block hashing")
    charge(hashing.BlockHasher, "extend_split", "block hashing")
    charge(radix.ArrivalLCP, "extend", "exact-LCP radix tree")
    charge(radix.ArrivalLCP, "finish", "exact-LCP radix tree")
    charge(readers, "parse_openai", "row fields (parse_openai)")
    builder.PARSERS["openai"] = readers.parse_openai
    charge(builder.TraceBuilder, "__init__", "start-up (tokenizer tables, numba code)")
    charge(builder.TraceBuilder, "finish", "building the table")
    charge(builder.TraceBuilder, "_hash_content", "per-request glue")
    charge(builder.TraceBuilder, "_add", "per-request glue")
    c0 = time.process_time()
    loaded = open_trace([log], IngestOptions(salt=b"bench"))
    c1 = time.process_time()
    write_canonical(loaded.table, out)
    spent["writing Parquet"] = time.process_time() - c1
    total = time.process_time() - c0
    spent["reading lines, JSON, other"] = total - sum(spent.values())
    return {"total": total, **spent}


def child(mode: str, log: str, out: str) -> None:
    from analyzer.ingest import IngestOptions, open_trace
    from analyzer.trace import write_canonical

    if mode == "stages":
        print(json.dumps(stages(log, out)))
        return
    if mode == "tokenize-all":
        t0, c0 = time.perf_counter(), time.process_time()
        figures = tokenize_all(log)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"seconds": dt, "cpu_seconds": cpu, "peak_rss_bytes": rss, **figures}))
        return
    opts = IngestOptions(salt=b"bench", memo=(mode != "no-memo"), exact=(mode != "no-exact"))
    t0, c0 = time.perf_counter(), time.process_time()
    loaded = open_trace([log], opts)
    write_canonical(loaded.table, out)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(
        json.dumps(
            {
                "seconds": dt,
                "cpu_seconds": cpu,
                "requests": loaded.trace.n_requests,
                "tokens": int(loaded.trace.prompt_tokens.sum()),
                "blocks": loaded.trace.n_accesses,
                "peak_rss_bytes": rss,
                **loaded.stats,
            }
        )
    )


def run_child(mode: str, log: Path, out: Path) -> dict:
    env = user_env()
    res = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(log), str(out)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "LOG", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--modes", default="memo,no-memo,tokenize-all,no-exact")
    ap.add_argument("--generator", choices=("synth", "builtin"), default="synth")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (the fastest counts)")
    ap.add_argument(
        "--stages", action="store_true", help="also print where the memoized convert's time goes"
    )
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "chat.jsonl"
        used = generate(log, args.requests, args.seed, args.generator)
        n = args.requests
        mb = log.stat().st_size / 1e6
        print(
            f"log ({used} generator): {n:,} requests, {mb:,.1f} MB "
            f"({log.stat().st_size / n / 1e3:.1f} kB/request)"
        )
        modes = args.modes.split(",")
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(max(1, args.repeat)):
            for mode in modes:
                runs[mode].append(run_child(mode, log, Path(d) / f"{mode}.parquet"))
        results = {}
        for mode in modes:
            r = min(runs[mode], key=lambda x: x["cpu_seconds"])
            r["peak_rss_bytes"] = max(x["peak_rss_bytes"] for x in runs[mode])
            results[mode] = r
            cpu = r["cpu_seconds"]
            spread = max(x["cpu_seconds"] for x in runs[mode]) - cpu
            print(
                f"{mode:>12}: {cpu:7.2f} CPU s (+{spread:.2f} slowest)  {mb / cpu:6.1f} MB/s  "
                f"{r['requests'] / cpu:7,.0f} req/s   (wall {r['seconds']:.2f} s, "
                f"{mb / r['seconds']:.1f} MB/s)  peak RSS "
                f"{r['peak_rss_bytes'] / 2**20:,.0f} MiB  tokenized "
                f"{r.get('tokens_encoded', 0):,} of {r['tokens']:,} prompt tokens"
            )
        if "memo" in results and "no-memo" in results:
            a, b = results["memo"], results["no-memo"]
            same = (a["requests"], a["tokens"], a["blocks"]) == (
                b["requests"],
                b["tokens"],
                b["blocks"],
            )
            print(
                f"memoized convert vs convert with the memos off (every prompt tokenized and "
                f"hashed in full): {b['cpu_seconds'] / a['cpu_seconds']:.2f}x in CPU time, "
                f"{b['seconds'] / a['seconds']:.2f}x in wall time (same output sizes: {same})"
            )
        if "memo" in results and "tokenize-all" in results:
            a, b = results["memo"], results["tokenize-all"]
            print(
                f"memoized convert vs tokenizing every prompt in full (read, frame, tokenize; "
                f"no hashing, no output): {b['cpu_seconds'] / a['cpu_seconds']:.2f}x in CPU "
                f"time (same prompt tokens: {a['tokens'] == b['tokens']})"
            )
        if args.stages:
            print_stages(log, Path(d) / "stages.parquet")


def print_stages(log: Path, out: Path) -> None:
    st = run_child("stages", log, out)
    total = st.pop("total")
    print(f"where the memoized convert's CPU time goes (one instrumented run, {total:.2f} s):")
    for name, sec in sorted(st.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<42} {sec:6.2f} s")


if __name__ == "__main__":
    main()
