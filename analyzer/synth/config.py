"""What to generate (:class:`SynthConfig`) and what was generated (:class:`SynthStats`)."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from analyzer import limits
from analyzer.errors import UsageError

PROFILES = ("chat", "agent", "rag", "api", "mixed", "saas")
FORMATS = ("openai", "gateway-csv", "mooncake")
ARRIVALS = ("poisson", "bursty", "diurnal")

# Default request rates (requests per second over the whole trace).
DEFAULT_RATE_RPS = {"chat": 2.0, "agent": 1.0, "rag": 2.0, "api": 5.0, "mixed": 5.0, "saas": 5.0}


def _nearest(name: str, choices: tuple[str, ...]) -> str:

    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """A synthetic workload: profile, size, seed and arrival process.

    ``rate_rps`` and ``duration_s`` are alternatives: with ``duration_s`` the rate is
    ``requests / duration_s``; with neither, the profile's default rate. ``shared_templates``
    (api, and the api tenant of mixed) is the number of few-shot templates requests share;
    0 gives every request its own instructions, hence near-zero reuse. ``documents`` is the
    size of the rag document pool; ``session_id_share`` the share of chat sessions whose
    requests carry ``metadata.session_id``.
    """

    profile: str
    requests: int
    seed: int = 0
    arrival: str = "poisson"
    rate_rps: float | None = None
    duration_s: float | None = None
    shared_templates: int = 4
    documents: int = 2000
    session_id_share: float = 0.8

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise UsageError(
                f"unknown profile '{self.profile}'{_nearest(self.profile, PROFILES)}",
                hint="profiles: " + ", ".join(PROFILES),
            )
        if self.arrival not in ARRIVALS:
            raise UsageError(
                f"unknown arrival process '{self.arrival}'{_nearest(self.arrival, ARRIVALS)}",
                hint="arrival processes: " + ", ".join(ARRIVALS),
            )
        if isinstance(self.requests, bool) or int(self.requests) != self.requests:
            raise UsageError(f"--requests must be a whole number, got {self.requests!r}")
        if self.requests < 1:
            raise UsageError(f"--requests must be at least 1, got {self.requests}")
        limits.check(self.requests, "synth_requests", "--requests")
        if self.seed < 0:
            raise UsageError(f"--seed must be zero or positive, got {self.seed}")
        if self.rate_rps is not None and self.duration_s is not None:
            raise UsageError("give --rate or --duration, not both")
        for flag, v in (("--rate", self.rate_rps), ("--duration", self.duration_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise UsageError(f"{flag} must be a positive number, got {v}")
        if self.shared_templates < 0:
            raise UsageError(f"shared templates must be zero or more, got {self.shared_templates}")
        if self.documents < 1:
            raise UsageError(f"the document pool needs at least 1 document, got {self.documents}")
        if not 0.0 <= self.session_id_share <= 1.0:
            raise UsageError(f"session id share must lie in [0, 1], got {self.session_id_share}")

    @property
    def effective_rate_rps(self) -> float:
        if self.rate_rps is not None:
            return float(self.rate_rps)
        if self.duration_s is not None:
            return self.requests / float(self.duration_s)
        return DEFAULT_RATE_RPS[self.profile]


@dataclass(frozen=True, slots=True)
class SynthStats:
    """What :func:`analyzer.synth.generate` wrote."""

    path: str
    fmt: str
    requests: int
    sessions: int
    bytes_written: int  # uncompressed bytes of the log
    prompt_tokens: int  # sum of the logged usage.prompt_tokens (cl100k estimate)
    completion_tokens: int
    span_s: float  # last arrival minus first
    truth_path: str | None = None
