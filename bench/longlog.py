"""A long-prompt gateway log: what the gateway of an assistant product keeps.

    .venv/bin/python bench/longlog.py -n 50000 --seed 1 -o DIR/long-50000.csv

Every request of such a product resends a long system prompt, the product's tool
definitions and, on many turns, documents a retriever put in front of the question, so
its prompts run to thousands of tokens (3,807 on average at 50,000 requests, 190 M in
all) and its log to about 17 KB a request: 856 MB at 50,000 requests, like the 830 MB
gateway CSV of 50,000 requests the long-prompt targets were set on. The log is the
gateway CSV ``kvpool synth --format gateway-csv`` writes (``request_id, timestamp,
model_name, request_json, response_json``), its text from the same generator
(:mod:`analyzer.synth.text`), so every row reads as an OpenAI chat request:

* four applications (tenants), each with its model, two to four system prompts
  (log-normal around each application's median; 700 to 1,900 cl100k tokens at seed 1)
  and 3 to 16 function tools sent with every request (470 to 1,300 tokens at seed 1);
* sessions of a geometric number of turns (mean 2.5, at most 10) that resend their
  history: the system prompt, every earlier question with its retrieved documents,
  every reply, and on a fifth of turns an assistant tool call with the tool's JSON
  result;
* retrieval on 25% to 80% of turns (by application): 1 to 4 documents of 100 to 600
  tokens from the application's pool of 3,000, Zipf-popular (s = 1.1), in the
  retriever's order;
* Poisson session starts at 4 requests a second, a reply of about 150 tokens, 80% of
  sessions tagged ``metadata.session_id``, every request ``metadata.tenant``.

Same seed, same bytes. Library use: ``write_log(path, requests, seed)``.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyzer.synth.text import TextGen

# In the names the benches give the log in their --dir: bumped with any change to the
# workload, so a log kept from an older generator is not measured as if it were this one.
VERSION = "v1"
T0_EPOCH_S = 1736154000.0  # Monday 2025-01-06 09:00 UTC, as kvpool synth
RATE_RPS = 4.0
MEAN_TURNS = 2.5
MAX_TURNS = 10
DOC_POOL = 3000
SESSION_ID_SHARE = 0.8
# (name, model, share of sessions, system prompt median tokens, tools (lo, hi),
#  share of turns with retrieval, documents per retrieval (lo, hi))
APPS = (
    ("support-assistant", "llama-3.1-70b-instruct", 0.40, 1250, (5, 10), 0.4, (2, 3)),
    ("coding-assistant", "qwen3-coder-480b-a35b-instruct", 0.20, 1800, (10, 16), 0.25, (1, 3)),
    ("docs-search", "llama-3.1-8b-instruct", 0.25, 700, (3, 5), 0.8, (2, 4)),
    ("sales-copilot", "qwen2.5-32b-instruct", 0.15, 1050, (5, 8), 0.4, (2, 3)),
)


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _lognormal(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(median * float(np.exp(sigma * rng.standard_normal()))))))


@dataclass(slots=True)
class App:
    name: str
    model: str
    share: float
    systems: list[str]  # each a message's compact JSON
    tools_json: str
    tool_names: list[str]
    rag_share: float
    docs_per_turn: tuple[int, int]
    cdf: np.ndarray
    docs: dict[int, str] = field(default_factory=dict)


class _World:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(np.random.SeedSequence(seed))
        self.text = TextGen(self.rng)
        w = 1.0 / np.arange(1, DOC_POOL + 1, dtype=np.float64) ** 1.1
        cdf = np.cumsum(w / w.sum())
        self.apps: list[App] = []
        for name, model, share, median, (t_lo, t_hi), rag, per in APPS:
            systems = []
            for _ in range(int(self.rng.integers(2, 5))):
                body, _ = self.text.paragraphs(_lognormal(self.rng, median, 0.25, 700, 6000))
                head = f"You are {name}, the assistant of the {self.text.title(2)} team."
                systems.append(_dumps({"role": "system", "content": f"{head}\n\n{body}"}))
            tools = [self.text.tool_schema() for _ in range(int(self.rng.integers(t_lo, t_hi + 1)))]
            self.apps.append(
                App(
                    name,
                    model,
                    share,
                    systems,
                    _dumps(tools),
                    [t["function"]["name"] for t in tools],
                    rag,
                    per,
                    cdf,
                )
            )
        self.app_cdf = np.cumsum([a.share for a in self.apps])

    def document(self, app: App, doc: int) -> str:
        if doc not in app.docs:
            body, _ = self.text.paragraphs(
                _lognormal(self.rng, 230, 0.3, 100, 600), per_paragraph=120
            )
            app.docs[doc] = f"[{doc}] {self.text.title(int(self.rng.integers(3, 7)))}\n{body}"
        return app.docs[doc]

    def retrieve(self, app: App) -> list[int]:
        k = int(self.rng.integers(app.docs_per_turn[0], app.docs_per_turn[1] + 1))
        out: list[int] = []
        while len(out) < k:
            d = min(int(np.searchsorted(app.cdf, self.rng.random(), side="right")), DOC_POOL - 1)
            if d not in out:
                out.append(d)
        return out


class _Session:
    def __init__(self, world: _World, index: int) -> None:
        rng = world.rng
        self.world = world
        self.app = world.apps[int(np.searchsorted(world.app_cdf, rng.random(), side="right"))]
        self.history = [self.app.systems[int(rng.integers(0, len(self.app.systems)))]]
        self.turns = min(MAX_TURNS, int(rng.geometric(1 / MEAN_TURNS)))
        self.key = f"{self.app.name}-{index:07d}" if rng.random() < SESSION_ID_SHARE else None

    def step(self, n: int) -> tuple[str, str, int, float | None]:
        """(request JSON, response JSON, prompt characters, delay to the next turn)."""
        w, rng, app = self.world, self.world.rng, self.app
        question, _ = w.text.prose(_lognormal(rng, 60, 0.9, 4, 2000))
        if rng.random() < app.rag_share:
            docs = "\n\n".join(w.document(app, d) for d in w.retrieve(app))
            question = f"Context:\n\n{docs}\n\nQuestion: {question}"
        messages = [*self.history, _dumps({"role": "user", "content": question})]
        if rng.random() < 0.2:  # the model called a tool first: its call and the result
            call = {
                "id": f"call_{n:08x}",
                "type": "function",
                "function": {
                    "name": app.tool_names[int(rng.integers(0, len(app.tool_names)))],
                    "arguments": _dumps({"query": w.text.prose(int(rng.integers(4, 20)))[0]}),
                },
            }
            messages.append(_dumps({"role": "assistant", "content": None, "tool_calls": [call]}))
            result, _ = w.text.json_result(_lognormal(rng, 200, 0.8, 20, 3000))
            messages.append(_dumps({"role": "tool", "tool_call_id": call["id"], "content": result}))
        answer, n_out = w.text.paragraphs(_lognormal(rng, 150, 0.6, 4, 2000))
        reply = _dumps({"role": "assistant", "content": answer})
        meta = {"tenant": app.name} | ({"session_id": self.key} if self.key else {})
        request = (
            f'{{"model":{json.dumps(app.model)},"messages":[{",".join(messages)}],'
            f'"tools":{app.tools_json},"metadata":{_dumps(meta)}}}'
        )
        chars = sum(len(m) for m in messages) + len(app.tools_json)
        p = chars // 5  # the gateway's own estimate, as a usage block logs it
        response = (
            f'{{"id":"chatcmpl-{n:08d}","object":"chat.completion","model":'
            f'{json.dumps(app.model)},"choices":[{{"index":0,"message":{reply},'
            f'"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{p},'
            f'"completion_tokens":{n_out},"total_tokens":{p + n_out}}}}}'
        )
        self.history = [*messages, reply]
        self.turns -= 1
        if self.turns <= 0:
            return request, response, chars, None
        return request, response, chars, _lognormal(rng, 30, 0.9, 2, 1800)


def write_log(path: str | Path, requests: int, seed: int = 1) -> int:
    """Write the log (written beside ``path``, then renamed); returns its size in bytes."""
    path = Path(path)
    world = _World(seed)
    rng = world.rng
    part = path.with_name(path.name + ".part")
    heap: list[tuple[float, int, _Session | None]] = [(0.0, 0, None)]
    seq = n_sessions = n = 0
    session_rate = RATE_RPS / MEAN_TURNS
    with open(part, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["request_id", "timestamp", "model_name", "request_json", "response_json"])
        while n < requests:
            t, _, sess = heapq.heappop(heap)
            seq += 1
            if sess is None:  # a new session now, and the next start
                sess = _Session(world, n_sessions)
                n_sessions += 1
                heapq.heappush(heap, (t + float(rng.exponential(1 / session_rate)), seq, None))
                seq += 1
            request, response, _, delay = sess.step(n)
            ts = datetime.fromtimestamp(round(T0_EPOCH_S + t, 3), UTC)
            iso = ts.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
            out.writerow([f"req-{n:08d}", iso, sess.app.model, request, response])
            n += 1
            if delay is not None:
                heapq.heappush(heap, (t + delay, seq, sess))
    part.rename(path)
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--requests", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    size = write_log(args.out, args.requests, args.seed)
    print(f"{args.out}: {args.requests:,} requests, {size / 1e6:,.0f} MB")


if __name__ == "__main__":
    main()
