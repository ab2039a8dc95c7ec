"""The aggregated engine's records: one request as the scheduler holds it (:class:`Job`,
its state one of WAITING, LOADING, PREFILL, DECODE, DONE), one instance's scheduler state
(:class:`Engine`), and the output lengths a replay decodes (the log's, else drawn).
:mod:`analyzer.replay.serving` runs them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.replay.engine import Instance
from analyzer.trace import BlockTrace

# Output lengths for requests whose log does not give them: log-normal with median 133
# tokens and sigma 0.63, between 2 and 4,096 tokens (the Azure LLM inference 2023
# conversation trace's generated tokens, as kvpool synth's chat profile draws them),
# drawn once per trace from a fixed seed.
DEFAULT_OUTPUT = (133.0, 0.63, 2, 4096)
OUTPUT_SEED = 0x6B76706F

WAITING, LOADING, PREFILL, DECODE, DONE = range(5)


def output_lengths(trace: BlockTrace) -> tuple[np.ndarray, int]:
    """Each request's output tokens (at least 1) and how many were drawn from
    :data:`DEFAULT_OUTPUT` because the log did not say."""
    out = np.asarray(trace.output_tokens, dtype=np.int64).copy()
    unknown = out < 0
    n = int(unknown.sum())
    if n:
        median, sigma, lo, hi = DEFAULT_OUTPUT
        rng = np.random.default_rng(OUTPUT_SEED)
        draw = np.exp(np.log(median) + sigma * rng.standard_normal(trace.n_requests))
        out[unknown] = np.clip(np.rint(draw[unknown]), lo, hi).astype(np.int64)
    np.maximum(out, 1, out=out)
    return out, n


@dataclass(slots=True, eq=False)
class Job:
    """One request in an aggregated engine. Token counts are of this admission (a
    preempted request is admitted again with its generated tokens to recompute)."""

    k: int
    arrival: float
    blocks: list[int]
    prompt: int
    out: int
    measured: bool
    eng: Engine | None = None
    state: int = WAITING
    tokens: int = 0  # prompt (+ generated, after a preemption) this admission prefills
    hit: int = 0  # of which cached: found in HBM or loaded
    done: int = 0  # of the others, computed so far
    pending: int = 0  # loads in flight
    matched: int = 0  # leading blocks found in some tier (HBM or loaded)
    pinned: int = 0  # leading blocks cached in HBM and held
    priv: int = 0  # private KV tokens held, when decoding: as of dec_step
    stored: int = 0  # leading blocks written to the lower tiers
    gen: int = 0  # tokens generated
    dec_step: int = 0  # the engine's decode-step count when this request's decode started
    fin: int = 0  # the decode-step count at which it ends
    first_t: float = -1.0
    counted: bool = False  # hits counted (the first admission only)
    layerwise: bool = False  # its loads run beside its prefill, layer by layer
    # ``blocks`` as its engine's caches take them: the trace's int64 slice for the
    # compiled caches (ArrayRadix), the list itself for BlockRadix
    cb: Any = None


@dataclass(slots=True, eq=False)
class Engine:
    """One instance's scheduler state."""

    inst: Instance
    waiting: deque[Job] = field(default_factory=deque)
    running: dict[Job, None] = field(default_factory=dict)  # admission order
    prefill: list[Job] = field(default_factory=list)  # running, prompt left to compute
    dec: list[tuple[int, int, Job]] = field(default_factory=list)  # (fin, seq, job) heap
    n_dec: int = 0
    kv_dec: int = 0  # context tokens of the decoding requests, at the current step
    steps: int = 0  # decode steps run so far
    priv: int = 0  # private KV tokens of the running requests, at the current step
    busy: bool = False
    version: int = 0  # of the scheduled step end (a decode run cut short moves it)
    batch: list[tuple[Job, int]] | None = None  # a mixed step's prefill chunks
    burst: np.ndarray | None = None  # a decode run's step end times
    burst_steps: int = 0  # of which run before the scheduled end
    burst_done: int = 0  # of which applied to the counts already (sync)
    prefill_load: int = 0  # tokens routed here and not yet prefilled (the router's)
    step_dt: float = 0.0  # the mixed step in progress: its duration
    held: bool = False  # it ended but waits for a layer-wise load's last layers
