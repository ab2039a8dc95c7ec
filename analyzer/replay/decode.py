"""The decode pool a disaggregated deployment runs beside its prefill pool.

``--serving disaggregated`` replays the prefill instances alone (as Mooncake's prefill
pool runs); every request then decodes on a separate pool of instances of the same GPUs,
model and TP. This sizes that pool from the trace's outputs, the step model and the KV
pool each decode instance holds, at the load the replay served:

- each decode instance runs decode-only steps over the requests it holds; a step of ``B``
  requests with ``K`` context tokens lasts ``step_seconds(c, 0, 0, B, K)`` (the step
  model of :mod:`analyzer.replay.steps`);
- it can hold at most ``min(max_num_seqs, KV pool / context)`` requests, the context
  being a request's prompt plus half its output on average;
- ``n`` instances share the output tokens the trace asks for per second; each runs the
  batch ``B`` at which it generates its share (``B / step(B)`` tokens a second, Little's
  law), which must not exceed what it holds;
- the pool is the fewest instances for which that holds, and its TPOT is the step time
  at that batch.

Token counts per second are the whole trace's (the decode pool serves every request,
warm-up included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.replay.steps import StepPricing


@dataclass(frozen=True, slots=True)
class DecodePool:
    """Decode instances (of ``tp`` GPUs each) that keep up with a trace's outputs."""

    instances: int
    gpus: int
    batch: float  # requests decoding at once on each instance
    max_batch: int  # what one instance holds (max_num_seqs, its KV pool)
    tpot_s: float  # the step time at that batch
    output_tokens_per_s: float  # what the pool generates, all instances

    def to_json(self) -> dict[str, Any]:
        return {
            "instances": self.instances,
            "gpus": self.gpus,
            "batch": self.batch,
            "max_batch": self.max_batch,
            "tpot_s": self.tpot_s,
            "output_tokens_per_s": self.output_tokens_per_s,
        }


def size_decode_pool(
    prompts: np.ndarray,
    outputs: np.ndarray,
    duration_s: float,
    pricing: StepPricing,
    kv_pool_tokens: int,
    max_num_seqs: int,
    tp: int,
) -> DecodePool | None:
    """The decode pool for requests of ``prompts`` and ``outputs`` tokens arriving over
    ``duration_s`` seconds (None when there is nothing to decode)."""
    total = float(outputs.sum())
    if total <= 0 or duration_s <= 0 or prompts.size == 0:
        return None
    rate = total / duration_s
    context = float(np.mean(prompts + outputs / 2.0))
    held = int(min(max_num_seqs, max(1.0, kv_pool_tokens // max(context, 1.0))))

    def tokens_per_s(batch: float) -> float:
        return batch / pricing.step_s(0.0, 0.0, batch, batch * context)

    top = tokens_per_s(float(held))
    n = max(1, math.ceil(rate / top))
    share = rate / n
    lo, hi = 0.0, float(held)  # the batch generating ``share``: tokens_per_s rises with it
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if tokens_per_s(mid) < share:
            lo = mid
        else:
            hi = mid
    batch = max(hi, 1e-9)
    tpot = pricing.step_s(0.0, 0.0, batch, batch * context)
    return DecodePool(n, n * tp, batch, held, tpot, rate)
