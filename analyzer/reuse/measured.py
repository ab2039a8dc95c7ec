"""The prefix-cache hits today's deployment already measured, read from the log.

OpenAI-compatible responses carry ``usage.prompt_tokens_details.cached_tokens``: the
prompt tokens the engine served from its cache (vLLM with
``--enable-prompt-tokens-details``, SGLang with ``--enable-cache-report``, OpenAI's own
API). The measured hit rate is

    sum(cached_tokens) / sum(prompt_tokens)

over the steady-state requests that carry the field: those at or after
``floor(warmup * n)`` in arrival order (the replay's and the reuse ceiling's warm-up),
with each request's prompt as the engine counted it (``usage.prompt_tokens``), or as
kvpool counted it when the response leaves that out. It is given overall, per model and
over time (``WINDOWS`` equal spans of the steady-state part of the trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from analyzer.reuse.records import first_counted_request
from analyzer.trace import BlockTrace

WINDOWS = 10


@dataclass(frozen=True, slots=True)
class MeasuredRate:
    requests: int
    cached_tokens: int
    prompt_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "hit_rate": round(self.hit_rate, 6),
        }


class MeasuredWindow(TypedDict):
    """One of the :data:`WINDOWS` equal spans of the steady-state part of the trace."""

    start_s: float
    end_s: float
    requests: int
    cached_tokens: int
    prompt_tokens: int
    hit_rate: float


@dataclass(frozen=True, slots=True)
class MeasuredHits:
    """The measured hit rate of today's deployment (module docstring)."""

    overall: MeasuredRate
    warmup: float
    steady_requests: int  # steady-state requests, with the field or not
    by_model: dict[str, MeasuredRate] = field(default_factory=dict)
    over_time: list[MeasuredWindow] = field(default_factory=list)
    # responses claiming more cached tokens than their prompt holds: left out
    excluded_requests: int = 0

    @property
    def coverage(self) -> float:
        """Share of the steady-state requests whose response carried the field."""
        return self.overall.requests / self.steady_requests if self.steady_requests else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "definition": "sum(cached_tokens) / sum(prompt_tokens) over the steady-state "
            "requests whose responses carry usage.prompt_tokens_details.cached_tokens "
            "(prompt tokens as the engine counted them)",
            "warmup": self.warmup,
            **self.overall.to_json(),
            "steady_requests": self.steady_requests,
            "coverage": round(self.coverage, 6),
            "by_model": {k: v.to_json() for k, v in self.by_model.items()},
            "over_time": self.over_time,
            "excluded_requests": self.excluded_requests,
        }


def _rate(cached: np.ndarray, prompt: np.ndarray) -> MeasuredRate:
    return MeasuredRate(int(cached.size), int(cached.sum()), int(prompt.sum()))


def measure_cached(trace: BlockTrace, warmup: float = 0.5) -> MeasuredHits | None:
    """The measured hit rate, or None when no response in the log carries the field."""
    if trace.cached_tokens is None or trace.n_requests == 0:
        return None
    n = trace.n_requests
    start = first_counted_request(n, warmup)
    cached = trace.cached_tokens[start:]
    has = cached >= 0
    if not has.any():
        return None
    prompt = trace.prompt_tokens[start:].astype(np.int64)
    if trace.engine_prompt_tokens is not None:
        engine = trace.engine_prompt_tokens[start:]
        prompt = np.where(engine >= 0, engine, prompt)
    # A response cannot have served more of the prompt from cache than the prompt holds
    # (the engine's count, or kvpool's when the response leaves it out): such a row is
    # counted and left out, never a hit rate above 100%.
    over = has & (cached > prompt)
    has &= ~over
    c, p = cached[has], prompt[has]
    by_model: dict[str, MeasuredRate] = {}
    if trace.model is not None and trace.model_names:
        codes = trace.model[start:][has]
        for code, name in enumerate(trace.model_names):
            sel = codes == code
            if sel.any():
                by_model[name] = _rate(c[sel], p[sel])
    t = trace.arrival_s[start:][has]
    over_time: list[MeasuredWindow] = []
    if t.size:
        lo, hi = float(t[0]), float(t[-1])
        edges = np.linspace(lo, hi, WINDOWS + 1)
        idx = np.minimum(np.searchsorted(edges, t, side="right") - 1, WINDOWS - 1)
        for w in range(WINDOWS):
            sel = idx == w
            if sel.any():
                r = _rate(c[sel], p[sel])
                over_time.append(
                    MeasuredWindow(
                        start_s=round(float(edges[w]), 6),
                        end_s=round(float(edges[w + 1]), 6),
                        requests=r.requests,
                        cached_tokens=r.cached_tokens,
                        prompt_tokens=r.prompt_tokens,
                        hit_rate=round(r.hit_rate, 6),
                    )
                )
    return MeasuredHits(
        overall=_rate(c, p),
        warmup=warmup,
        steady_requests=int(cached.size),
        by_model=by_model,
        over_time=over_time,
        excluded_requests=int(over.sum()),
    )
