"""The pilot's paired isolation check: the same prefix sent under two cache salts must
not hit.

``kvpool probe URL [URL ...]`` sends one fresh prompt (a random nonce in its first block,
so nothing cached before can match it) to live engines through their OpenAI-compatible
``/v1/completions``, in four steps:

1. ``warm``: salt A on the first endpoint (its HBM cache and, through its connector, the
   pool now hold the prefix);
2. ``same-salt``: salt A again on every endpoint: the first must hit (HBM), proving the
   engine caches and reports hits at all; the others hit when a pool (or a router
   keeping them together) serves them, and are shown for information;
3. ``other-salt``: a salt of its own on every endpoint (B1, B2, ...: none can hit
   another's blocks legitimately): any cached token is a tenant reading another
   tenant's KV (HBM on the first endpoint, the pool on the others);
4. ``no-salt``: no salt on the last endpoint (the pool's side when there are several):
   an unsalted request must not reach salted blocks either (sent to one endpoint only,
   as a second unsalted request could rightly hit the first one's blocks).

Hits are read from each response's ``usage.prompt_tokens_details.cached_tokens`` (vLLM
with ``--enable-prompt-tokens-details``, SGLang with ``--enable-cache-report``) and, where
the engine serves ``/metrics`` (vLLM always; SGLang with ``--enable-metrics``), from its
prefix-cache counters (:mod:`analyzer.advisor.engine_metrics`) over steps 3 and 4: every
tier's hits there must be zero. Run it on an idle pilot cluster: other traffic in that
window would count in the counters (the responses' figures stay exact per request).

The salt goes in the request field the engines read: ``cache_salt`` (vLLM; SGLang since
``cache_salt`` was added beside ``extra_key``), or ``extra_key`` for SGLang releases
that have only that. The result's ``metrics`` are what ``kvpool validate
isolation=probe.json`` tests against the report's isolation gate.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from analyzer.advisor.engine_metrics import Key, instances_of, read_snapshot, window_of
from analyzer.errors import InputError, Location, UsageError
from analyzer.jsontypes import JSONObject, JSONValue

SALT_FIELDS = ("cache_salt", "extra_key")
PROBE_SCHEMA = "kvpool.isolation-probe/1"
# Steps whose hits are a leak, and the one that proves hits are visible at all.
LEAK_STEPS = ("other-salt", "no-salt")
CONTROL_STEP = "same-salt"
# Words of the filler after the nonce: about one token each in common tokenizers, long
# enough to fill many blocks of any engine's block size (vLLM 16, SGLang pages, LMCache
# 256-token chunks, Mooncake 512).
DEFAULT_PREFIX_WORDS = 2048
_FILLER = [
    "isolation",
    "probe",
    "block",
    "of",
    "the",
    "same",
    "prefix",
    "sent",
    "under",
    "two",
    "salts",
    "which",
    "must",
    "never",
    "hit",
    "across",
    "tenants",
    "and",
    "must",
    "always",
    "hit",
    "within",
    "one",
    "tenant",
]


def shown_url(url: str) -> str:
    """A URL as messages and results show it: no ``user:password@``, query or fragment."""
    p = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((p.scheme, p.netloc.rpartition("@")[2], p.path, "", ""))


def check_url(url: str) -> str:
    """``url`` without a trailing slash, or a usage error naming it."""
    p = urllib.parse.urlsplit(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise UsageError(
            f"{shown_url(url) or url!r} is not an http(s) URL of an engine",
            hint="give each engine's base URL, e.g. http://node-a:8000",
        )
    return url.rstrip("/")


def probe_prompt(nonce: str, words: int) -> str:
    """The probe's prompt: the nonce first (its first block is new to every cache),
    then ``words`` filler words."""
    body = " ".join(_FILLER[i % len(_FILLER)] for i in range(words))
    return f"kvpool isolation probe {nonce}. {body}"


@dataclass(frozen=True, slots=True)
class ProbeStep:
    """One request of the probe and what the engine said of it."""

    step: str  # warm | same-salt | other-salt | no-salt
    endpoint: int  # 1-based, in the order given
    salt: str  # "A", "B1", "B2", ... or "none" (the salts are random and not kept)
    prompt_tokens: int | None
    cached_tokens: int | None  # None: the response did not say

    def to_json(self) -> ProbeStepJSON:
        return {
            "step": self.step,
            "endpoint": self.endpoint,
            "salt": self.salt,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
        }


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The probe's requests and, where the engines serve counters, their hits over the
    leak steps (``counter_hit_tokens``: every tier, all endpoints; None: not read)."""

    endpoints: tuple[str, ...]  # as shown (no credentials)
    salt_field: str
    steps: tuple[ProbeStep, ...]
    counter_hit_tokens: float | None = None
    counter_prompt_tokens: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def _sum(self, steps: Sequence[str], endpoint: int | None = None) -> int | None:
        got = [
            s.cached_tokens
            for s in self.steps
            if s.step in steps and (endpoint is None or s.endpoint == endpoint)
        ]
        if not got or any(c is None for c in got):
            return None
        return sum(c for c in got if c is not None)

    @property
    def metrics(self) -> dict[str, float]:
        """The figures the isolation gate tests (only those measured)."""
        out: dict[str, float] = {}
        leak = self._sum(LEAK_STEPS)
        if leak is not None:
            out["cross_salt_hit_tokens"] = float(leak)
        control = self._sum((CONTROL_STEP,), endpoint=1)
        if control is not None:
            out["same_salt_hit_tokens"] = float(control)
        if self.counter_hit_tokens is not None:
            out["cross_salt_counter_hit_tokens"] = self.counter_hit_tokens
        pool = self._sum(LEAK_STEPS[:1]) if len(self.endpoints) > 1 else None
        if pool is not None:
            out["other_salt_hit_tokens"] = float(pool)
        return out

    @property
    def passed(self) -> bool | None:
        """True: no leak and the control hit; False: a leak; None: nothing to decide
        (the control did not hit, or no hits were visible)."""
        m = self.metrics
        leaks = [m[k] for k in ("cross_salt_hit_tokens", "cross_salt_counter_hit_tokens") if k in m]
        if any(v > 0 for v in leaks):
            return False
        if not leaks or m.get("same_salt_hit_tokens", 0.0) <= 0:
            return None
        return True

    def lines(self) -> list[str]:
        """The terminal's account of the probe."""
        out = [
            f"isolation probe of {len(self.endpoints)} endpoint(s), salt in `{self.salt_field}`:"
        ]
        for s in self.steps:
            got = "not reported" if s.cached_tokens is None else f"{s.cached_tokens:,} cached"
            tokens = "" if s.prompt_tokens is None else f" of {s.prompt_tokens:,} prompt tokens"
            out.append(f"  {s.step:<10} endpoint {s.endpoint}  salt {s.salt:<5} {got}{tokens}")
        if self.counter_hit_tokens is not None:
            out.append(
                f"  engine counters over the other-salt and no-salt steps: "
                f"{self.counter_hit_tokens:,.0f} hit tokens"
            )
        out += [f"  note: {n}" for n in self.notes]
        verdict = {
            True: "PASS: no salt read another salt's KV, and the same salt hit",
            False: "FAIL: a request read KV cached under another salt (or none): tenants "
            "would share blocks",
            None: "UNDECIDED: the same-salt control did not hit, or no hits were reported; "
            "start vLLM with --enable-prompt-tokens-details (SGLang --enable-cache-report) "
            "and make the prompt longer than a block",
        }[self.passed]
        out.append(verdict)
        return out

    def to_json(self) -> ProbeDocument:
        return {
            "schema": PROBE_SCHEMA,
            "endpoints": list(self.endpoints),
            "salt_field": self.salt_field,
            "steps": [s.to_json() for s in self.steps],
            "counter_hit_tokens": self.counter_hit_tokens,
            "counter_prompt_tokens": self.counter_prompt_tokens,
            "metrics": self.metrics,
            "passed": self.passed,
            "notes": list(self.notes),
        }


class ProbeStepJSON(TypedDict):
    """A step of the probe's ``-o`` file."""

    step: str
    endpoint: int
    salt: str
    prompt_tokens: int | None
    cached_tokens: int | None


class ProbeDocument(TypedDict):
    """``kvpool probe -o``'s file (schema ``kvpool.isolation-probe/1``); ``kvpool validate``
    reads its ``metrics`` back (:func:`analyzer.advisor.validate.read_probe`)."""

    schema: str
    endpoints: list[str]
    salt_field: str
    steps: list[ProbeStepJSON]
    counter_hit_tokens: float | None
    counter_prompt_tokens: float | None
    metrics: dict[str, float]
    passed: bool | None
    notes: list[str]


# A JSON POST: the URL and the body, to the answer's object.
Post = Callable[[str, JSONObject], JSONObject]


def http_post(timeout_s: float) -> Post:
    """A JSON POST through urllib; errors are one line naming the URL (no credentials)."""

    def post(url: str, body: JSONObject) -> JSONObject:
        data = json.dumps(body).encode()
        req = urllib.request.Request(
            url, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        shown = shown_url(url)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read(16 << 20)
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode("utf-8", "replace").strip().splitlines()[:1]
            raise InputError(
                f"HTTP {exc.code} {exc.reason}" + (f": {detail[0]}" if detail else ""),
                Location(shown),
                hint="an engine that refuses the salt field is too old for it "
                "(--salt-field extra_key for SGLang releases before cache_salt)",
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise InputError(f"cannot reach it ({reason})", Location(shown)) from None
        try:
            doc: JSONValue = json.loads(raw)
        except json.JSONDecodeError:
            raise InputError("the answer is not JSON", Location(shown)) from None
        if not isinstance(doc, dict):
            raise InputError("the answer is not a JSON object", Location(shown))
        return doc

    return post


def _usage(doc: JSONObject, where: str) -> tuple[int | None, int | None]:
    """(prompt tokens, cached tokens) of a completions answer (None: not said)."""
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        raise InputError(
            "the answer has no usage (not an OpenAI-compatible completions endpoint?)",
            Location(where, field="usage"),
        )
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return _tokens(usage.get("prompt_tokens"), where, "prompt_tokens"), _tokens(
        cached, where, "cached_tokens"
    )


def _tokens(v: JSONValue, where: str, name: str) -> int | None:
    """A count of tokens of the answer's usage (None: not said)."""
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise InputError("not a count of tokens", Location(where, field=f"usage.{name}"))
    return v


def run_probe(
    urls: Sequence[str],
    model: str,
    *,
    salt_field: str = "cache_salt",
    words: int = DEFAULT_PREFIX_WORDS,
    post: Post | None = None,
    counters: Callable[[str], dict[Key, float] | None] | None = None,
    timeout_s: float = 60.0,
) -> ProbeResult:
    """The paired check against ``urls`` (module docstring). ``post`` and ``counters``
    (an endpoint's ``/metrics`` samples, or None where it serves none) replace the HTTP
    calls for a caller with its own."""
    if salt_field not in SALT_FIELDS:
        raise UsageError(f"--salt-field must be one of {', '.join(SALT_FIELDS)}")
    if not urls:
        raise UsageError("give at least one engine URL")
    if not 16 <= words <= 100_000:
        raise UsageError(f"--prefix-words must be 16 to 100,000, got {words}")
    bases = [check_url(u) for u in urls]
    post = post or http_post(timeout_s)
    counters = counters or _scrape(timeout_s)
    nonce = secrets.token_hex(8)
    salts: dict[str, str | None] = {"A": secrets.token_hex(16), "none": None}
    salts |= {f"B{i + 1}": secrets.token_hex(16) for i in range(len(bases))}
    prompt = probe_prompt(nonce, words)
    steps: list[ProbeStep] = []

    def send(step: str, i: int, salt: str) -> None:
        body: JSONObject = {"model": model, "prompt": prompt, "max_tokens": 1}
        if salts[salt] is not None:
            body[salt_field] = salts[salt]
        url = f"{bases[i]}/v1/completions"
        p, c = _usage(post(url, body), shown_url(url))
        steps.append(ProbeStep(step, i + 1, salt, p, c))

    send("warm", 0, "A")
    for i in range(len(bases)):
        send("same-salt", i, "A")
    before = {b: counters(b) for b in bases}
    for i in range(len(bases)):
        send("other-salt", i, f"B{i + 1}")
    send("no-salt", len(bases) - 1, "none")
    hit, prompt_tokens, notes = _counter_window(bases, before, counters)
    if any(s.cached_tokens is None for s in steps):
        notes.append(
            "a response gave no usage.prompt_tokens_details.cached_tokens (vLLM: "
            "--enable-prompt-tokens-details; SGLang: --enable-cache-report)"
        )
    return ProbeResult(
        endpoints=tuple(shown_url(b) for b in bases),
        salt_field=salt_field,
        steps=tuple(steps),
        counter_hit_tokens=hit,
        counter_prompt_tokens=prompt_tokens,
        notes=tuple(notes),
    )


def _scrape(timeout_s: float) -> Callable[[str], dict[Key, float] | None]:
    """An endpoint's prefix-cache counters from its ``/metrics`` (None: it serves none)."""

    def scrape(base: str) -> dict[Key, float] | None:
        url = f"{base}/metrics"
        try:
            return read_snapshot(url, shown_url(url), timeout_s)
        except InputError:
            return None

    return scrape


def _counter_window(
    bases: Sequence[str],
    before: dict[str, dict[Key, float] | None],
    counters: Callable[[str], dict[Key, float] | None],
) -> tuple[float | None, float | None, list[str]]:
    """Hit and prompt tokens every endpoint's counters added over the leak steps."""

    notes: list[str] = []
    hit = prompt = 0.0
    read = 0
    for b in bases:
        start = before.get(b)
        end = counters(b) if start is not None else None
        if start is None or end is None:
            notes.append(f"{shown_url(b)} serves no prefix-cache counters at /metrics")
            continue
        for inst in instances_of(window_of(start, end, shown_url(b)), shown_url(b)):
            hit += inst.hits_by_tier.get("total", 0.0)
            prompt += inst.prompt_tokens
        read += 1
    if not read:
        return None, None, notes
    return hit, prompt, notes
