"""An OpenAI-compatible completions endpoint with a prefix cache, on loopback, for the
isolation probe's tests (no GPU engine runs in the test suite).

It answers as vLLM does where the probe reads it: ``POST /v1/completions`` with
``usage.prompt_tokens`` and ``usage.prompt_tokens_details.cached_tokens``, and ``GET
/metrics`` with the ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` and
``vllm:external_prefix_cache_hits`` counters. Words are tokens; blocks of 16 are chained
and keyed like vLLM's (the salt in the first block's key). Each engine has its own HBM
cache; engines given the same ``pool`` share it behind their HBM caches. ``leak_hbm`` /
``leak_pool`` drop the salt from that tier's keys: the defects the probe must catch.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCK = 16


@dataclass
class Pool:
    keys: set[str] = field(default_factory=set)


@dataclass
class Engine:
    pool: Pool | None = None
    leak_hbm: bool = False
    leak_pool: bool = False
    report_cached: bool = True  # vLLM's --enable-prompt-tokens-details
    serve_metrics: bool = True
    salt_field: str = "cache_salt"
    hbm: set[str] = field(default_factory=set)
    queries: int = 0
    hits: int = 0
    external_hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def chain(self, words: list[str], salt: str | None) -> list[str]:
        out, prev = [], ""
        for k in range(len(words) // BLOCK):
            extra = salt if (k == 0 and salt) else ""
            block = " ".join(words[k * BLOCK : (k + 1) * BLOCK])
            prev = hashlib.sha256(f"{prev}|{block}|{extra}".encode()).hexdigest()
            out.append(prev)
        return out

    def complete(self, body: dict) -> dict:
        words = str(body["prompt"]).split()
        salt = body.get(self.salt_field) or None
        salted = self.chain(words, salt)
        plain = self.chain(words, None)
        with self.lock:
            n = 0
            external = 0
            for i, h in enumerate(salted):
                hbm_key = plain[i] if self.leak_hbm else h
                pool_key = plain[i] if self.leak_pool else h
                if hbm_key in self.hbm:
                    n += 1
                elif self.pool is not None and pool_key in self.pool.keys:
                    n += 1
                    external += 1
                else:
                    break
            cached = min(n * BLOCK, max(len(words) - 1, 0))
            for i, h in enumerate(salted):
                self.hbm.add(plain[i] if self.leak_hbm else h)
                if self.pool is not None:
                    self.pool.keys.add(plain[i] if self.leak_pool else h)
            self.queries += len(words)
            self.hits += cached - min(external * BLOCK, cached)
            self.external_hits += min(external * BLOCK, cached)
        usage: dict = {"prompt_tokens": len(words), "completion_tokens": 1}
        if self.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage}

    def metrics(self) -> str:
        labels = '{engine="0",model_name="m"}'
        return "".join(
            f"# TYPE vllm:{name} counter\nvllm:{name}_total{labels} {value}\n"
            for name, value in (
                ("prefix_cache_queries", self.queries),
                ("prefix_cache_hits", self.hits),
                ("external_prefix_cache_hits", self.external_hits),
            )
        )


class Served:
    """An :class:`Engine` served on 127.0.0.1 until :meth:`close`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        eng = engine

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                if self.path != "/v1/completions":
                    self._send(404, b'{"error": "not found"}', "application/json")
                    return
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n))
                out = json.dumps(eng.complete(body)).encode()
                self._send(200, out, "application/json")

            def do_GET(self) -> None:
                if self.path == "/metrics" and eng.serve_metrics:
                    self._send(200, eng.metrics().encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"not found", "text/plain")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
