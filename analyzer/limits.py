"""The ranges every number a user or a file can give must fall in (docs/security.md).

One extreme value is enough to hang or exhaust a run: a request of 10^12 prompt tokens
keeps the prefill loop busy for hours, ``--pool-gbps 1e-6`` stretches every transfer
over years of simulated time, ``--instances 1000000000`` allocates per-instance state
for a billion instances, a ``block_size`` of 20 digits overflows the compiled kernels.
Each bound below sits well outside what any real deployment or trace uses (the reason
is given beside it), so a value outside is a mistake or an attack, never a workload.
Flags and config values outside their range are a usage error (exit 2); per-row values
in a log outside theirs make that row a counted skip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analyzer.errors import UsageError


@dataclass(frozen=True, slots=True)
class Range:
    """Inclusive bounds for one named quantity, with the reason for them."""

    lo: float
    hi: float
    why: str

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return math.isfinite(value) and self.lo <= value <= self.hi


# Request sizes: the longest context windows served today are 10M tokens (Llama 4 Scout).
MAX_REQUEST_TOKENS = 10_000_000

RANGES: dict[str, Range] = {
    "prompt_tokens": Range(0, MAX_REQUEST_TOKENS, "the longest served context, 10M tokens"),
    "output_tokens": Range(0, MAX_REQUEST_TOKENS, "the longest served context, 10M tokens"),
    "cached_tokens": Range(0, MAX_REQUEST_TOKENS, "a prompt's cached part, 10M tokens at most"),
    "block_size": Range(1, 65_536, "vLLM/SGLang pages are 1-512 tokens, Mooncake's 512"),
    "token_ratio": Range(0.01, 100, "tokenizers differ by well under 2x per token"),
    "tp": Range(1, 1024, "tensor parallelism spans one or a few nodes"),
    "instances": Range(1, 4096, "the replay keeps per-instance caches and queues"),
    "gpus_per_node": Range(1, 64, "servers hold 1-16 GPUs"),
    "bandwidth_gbps": Range(0.001, 100_000, "1 MB/s is below any KV tier; HBM is ~5,000 GB/s"),
    "latency_s": Range(0, 10, "first-byte latencies are micro- to milliseconds"),
    "capacity_tokens": Range(0, 1e13, "10^13 tokens is petabytes of KV"),
    "time_scale": Range(0.001, 1000, "1000x faster or slower than the trace"),
    "ttft_slo_s": Range(0.001, 3600, "a time-to-first-token target"),
    "prefill_chunk_tokens": Range(1, 1_048_576, "chunked-prefill budgets are 512-64K"),
    "max_num_batched_tokens": Range(1, 1_048_576, "engines' step budgets are 512-64K tokens"),
    "max_num_seqs": Range(1, 65_536, "engines run up to a few thousand requests at once"),
    "hicache_ratio": Range(0.01, 1000, "host pools are a few times the device pool"),
    "link_window_s": Range(0.001, 3600, "a utilisation window"),
    "mfu": Range(0.001, 1, "a fraction of peak FLOPs"),
    "model_layers": Range(1, 1024, "the deepest published models have ~200 layers"),
    "model_width": Range(1, 1_048_576, "hidden sizes and head counts"),
    "model_params": Range(1, 1e14, "10^14 parameters is 100x today's largest"),
    "hours_per_month": Range(1, 744, "a calendar month has at most 744 hours"),
    "price_usd": Range(0, 1_000_000, "no GPU-hour, GB-month, NIC or store price nears $10^6"),
    "synth_requests": Range(1, 10_000_000, "ten million requests is about 50 GB of chat log"),
}


def _num(x: float) -> str:
    """10,000,000 rather than 1e+07; 0.001 rather than 1e-03."""
    return f"{int(x):,}" if x == int(x) and abs(x) < 1e15 else f"{x:g}"


def check(value: object, name: str, flag: str | None = None) -> None:
    """Raise a usage error (exit 2) unless ``value`` is a finite number in ``RANGES[name]``."""
    r = RANGES[name]
    if value not in r:
        raise UsageError(
            f"{flag or name} must be a number from {_num(r.lo)} to {_num(r.hi)}, got {value!r}",
            hint=f"the range covers every real deployment ({r.why}); see docs/security.md",
        )


def reason(value: object, name: str) -> str | None:
    """Why a per-row ``value`` is refused (a skip reason), or None when it is in range."""
    r = RANGES[name]
    if value in r:
        return None
    return f"{name} outside {_num(r.lo)}..{_num(r.hi)}"
