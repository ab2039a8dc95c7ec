"""What KV events show: each request as a chain of stored blocks (:class:`Rebuilder`) and
the engine's own cache, its occupancy per medium over time, stores, evictions, clears
and the prefix hits its requests got (:class:`EngineEvents`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from analyzer.ingest.kvfile import Recording, count_into
from analyzer.ingest.kvwire import Event, Removed, Stored
from analyzer.jsontypes import JSONObject

# The medium of the engine's own (HBM) prefix cache: vLLM writes "GPU" (None before it
# had a medium field), SGLang "GPU"; lower tiers are "CPU" (vLLM's offloading, LMCache),
# "CPU_PINNED", "DISK", "EXTERNAL" (SGLang HiCache).
PRIMARY_MEDIA = (None, "GPU")
# A store whose parent is the last block of a request stored within this many seconds
# continues that request (chunked prefill stores a prompt over several steps, decode a
# block every block_size tokens); later, it starts a new request that extends it (the
# next turn). docs/formats.md says what this cannot tell apart.
CONTINUATION_GAP_S = 2.0
TIMELINE_POINTS = 120


@dataclass(frozen=True, slots=True)
class MediumFigures:
    """One medium's blocks (``GPU``: the engine's HBM prefix cache; ``CPU``, ``DISK``, ...:
    the tiers below it), as the events report them."""

    medium: str
    block_size: int  # tokens per block as stored there (LMCache's chunks are 256)
    stored_blocks: int
    removed_blocks: int  # evictions (BlockRemoved)
    removed_unseen_blocks: int  # removals of blocks stored before the recording began
    peak_blocks: int
    mean_blocks: float  # time-weighted over the recording
    final_blocks: int
    evictions_per_s: float
    median_lifetime_s: float | None  # store to eviction, of blocks both seen
    p90_lifetime_s: float | None

    @property
    def peak_tokens(self) -> int:
        return self.peak_blocks * self.block_size

    def to_json(self, bytes_per_token: int | None = None) -> JSONObject:
        out: JSONObject = {
            "medium": self.medium,
            "block_size": self.block_size,
            "stored_blocks": self.stored_blocks,
            "removed_blocks": self.removed_blocks,
            "removed_unseen_blocks": self.removed_unseen_blocks,
            "peak_blocks": self.peak_blocks,
            "peak_tokens": self.peak_tokens,
            "mean_blocks": self.mean_blocks,
            "final_blocks": self.final_blocks,
            "evictions_per_s": self.evictions_per_s,
            "median_lifetime_s": self.median_lifetime_s,
            "p90_lifetime_s": self.p90_lifetime_s,
        }
        if bytes_per_token is not None:
            out["peak_gb"] = self.peak_tokens * bytes_per_token / 1e9
        return out


@dataclass(frozen=True, slots=True)
class OccupancyPoint:
    """Blocks held per medium at ``t_s`` seconds after the first batch (the highest
    count within the point's slice of the recording)."""

    t_s: float
    blocks: tuple[tuple[str, int], ...]

    def to_json(self) -> JSONObject:
        return {"t_s": self.t_s, "blocks": dict(self.blocks)}


@dataclass(frozen=True, slots=True)
class EngineEvents:
    """What KV-event recordings show of the engines' own caches: the measured baseline
    beside kvpool's replay (docs/formats.md, "KV-event recordings")."""

    recordings: int
    engines: int  # endpoints that sent batches
    batches: int
    events: int
    span_s: float
    block_size: int  # the engine's own (HBM) blocks, the trace's block size
    media: tuple[MediumFigures, ...]
    clears: int
    requests: int  # reconstructed (the canonical trace's rows)
    requests_prefix_unseen: int  # extend a prefix stored before the recording began
    prompt_tokens: int  # reconstructed, summed
    hit_tokens: int  # of those, found cached by the engine (the parent chain it extended)
    gaps: int
    lost_batches: int
    replayed_batches: int
    restarts: int
    malformed: tuple[tuple[str, int], ...]
    complete: bool  # every recording ended with its trailer
    timeline: tuple[OccupancyPoint, ...] = ()
    bytes_per_token: int | None = None  # the model's KV bytes per token, for sizes in GB

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def medium(self, name: str) -> MediumFigures | None:
        return next((m for m in self.media if m.medium == name), None)

    def to_json(self) -> JSONObject:
        bytes_per_token = self.bytes_per_token
        return {
            "recordings": self.recordings,
            "engines": self.engines,
            "batches": self.batches,
            "events": self.events,
            "span_s": self.span_s,
            "block_size": self.block_size,
            "media": [m.to_json(bytes_per_token) for m in self.media],
            "clears": self.clears,
            "requests": self.requests,
            "requests_prefix_unseen": self.requests_prefix_unseen,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "gaps": self.gaps,
            "lost_batches": self.lost_batches,
            "replayed_batches": self.replayed_batches,
            "restarts": self.restarts,
            "malformed": dict(self.malformed),
            "complete": self.complete,
            "bytes_per_token": bytes_per_token,
            "timeline": [p.to_json() for p in self.timeline],
        }

    def lines(self) -> list[str]:
        """The figures as a few plain lines (the terminal summary of ``kvpool reuse``)."""
        out = [
            f"engine KV events: {self.engines} engine(s), {self.batches:,} batches, "
            f"{self.events:,} events over {self.span_s:,.1f} s; blocks of {self.block_size} "
            "tokens",
            f"  prefix hits the engine found: {self.hit_rate:.1%} of "
            f"{self.prompt_tokens:,} stored prompt tokens ({self.requests:,} requests "
            "reconstructed)",
        ]
        for m in self.media:
            life = (
                f", median lifetime {m.median_lifetime_s:,.1f} s"
                if m.median_lifetime_s is not None
                else ""
            )
            out.append(
                f"  {m.medium}: peak {m.peak_blocks:,} blocks ({m.peak_tokens:,} tokens), mean "
                f"{m.mean_blocks:,.0f}; {m.stored_blocks:,} stored, {m.removed_blocks:,} "
                f"evicted ({m.evictions_per_s:,.2f}/s{life})"
            )
        if self.clears:
            out.append(f"  cache cleared {self.clears:,} time(s) (AllBlocksCleared)")
        if self.gaps or self.malformed or not self.complete:
            bad = ", ".join(f"{n:,} {r}" for r, n in self.malformed)
            out.append(
                f"  stream: {self.gaps:,} sequence gap(s), {self.lost_batches:,} batches lost, "
                f"{self.replayed_batches:,} replayed"
                + (f"; skipped: {bad}" if bad else "")
                + ("" if self.complete else "; a recording ends without its trailer")
            )
        return out


# -- rebuilding requests -----------------------------------------------------------------------


@dataclass(slots=True)
class _Request:
    endpoint: int
    arrival: float
    last: float  # time of its latest store
    chain: list[int]  # engine block hashes, root first
    hit_blocks: int
    session: str
    model: str | None
    prefix_unseen: bool


@dataclass
class _Medium:
    block_size: int = 0
    stored: int = 0
    removed: int = 0
    removed_unseen: int = 0
    held: int = 0
    peak: int = 0
    area: float = 0.0  # blocks x seconds
    since: float | None = None
    lifetimes: array[float] = field(default_factory=lambda: array("d"))


class Rebuilder:
    """Requests and cache figures from batches taken in time order (:meth:`add`).

    A ``BlockStored`` of the engine's own cache (medium GPU, or none) either continues
    a request (its parent is the last block that request stored, within
    ``CONTINUATION_GAP_S``) or starts one whose prompt is the parent's whole chain
    followed by the new blocks: the blocks before the new ones were found cached (the
    engine only stores what it computed), which is the hit the request got. Every event,
    of every medium, moves that medium's occupancy.
    """

    def __init__(self) -> None:
        self.parent_of: dict[int, int | None] = {}
        self.unseen_roots: set[int] = set()  # parents first seen as a parent
        self.requests: list[_Request] = []
        self.open: dict[tuple[int, int], int] = {}  # (endpoint, tail hash) -> request
        self.tail_session: dict[tuple[int, int], str] = {}
        # (endpoint, medium, KV cache group) -> {block: stored at}
        self.held: dict[tuple[int, str, int | None], dict[int, float]] = {}
        self.media: dict[str, _Medium] = {}
        self.block_size: int | None = None
        self.group: int | None = None
        self.skipped: dict[str, int] = {}
        self.clears = 0
        self.events = 0
        self.batches = 0
        self.engines: set[int] = set()
        self.first: float | None = None
        self.last = 0.0
        self.samples: list[tuple[float, dict[str, int]]] = []

    # per batch ------------------------------------------------------------------------------

    def add(self, endpoint: int, ts: float, events: list[Event]) -> None:
        if self.first is None:
            self.first = ts
        ts = max(ts, self.last)  # a batch stamped earlier than the one before: now
        self._advance(ts)
        self.batches += 1
        self.engines.add(endpoint)
        for ev in events:
            self.events += 1
            if isinstance(ev, Stored):
                self._stored(endpoint, ts, ev)
            elif isinstance(ev, Removed):
                self._removed(endpoint, ts, ev)
            else:
                self._cleared(endpoint, ts)
        self.samples.append((ts, {k: m.held for k, m in self.media.items()}))

    def _advance(self, ts: float) -> None:
        for m in self.media.values():
            if m.since is not None:
                m.area += m.held * (ts - m.since)
            m.since = ts
        self.last = ts

    def _medium(self, name: str, block_size: int | None) -> _Medium:
        m = self.media.get(name)
        if m is None:
            m = self.media[name] = _Medium(since=self.last)
        if block_size and not m.block_size:
            m.block_size = block_size
        return m

    def _stored(self, endpoint: int, ts: float, ev: Stored) -> None:
        medium = ev.medium or "GPU"
        m = self._medium(medium, ev.block_size)
        # per KV cache group too: a hybrid model's groups hold blocks of their own
        held = self.held.setdefault((endpoint, medium, ev.group), {})
        for h in ev.hashes:
            if h not in held:
                held[h] = ts
                m.held += 1
            m.stored += 1
        m.peak = max(m.peak, m.held)
        if ev.medium not in PRIMARY_MEDIA or not ev.hashes:
            return
        if self.group is None:
            self.group = ev.group
        if ev.group != self.group:
            return  # another KV cache group of a hybrid model: the same requests again
        if self.block_size is None:
            self.block_size = ev.block_size
        if ev.block_size != self.block_size:
            count_into(self.skipped, "block size differs from the engine's")
            return
        if ev.n_tokens < len(ev.hashes) * ev.block_size:
            # a partial block: the chain's full blocks end before it (SGLang's last page)
            keep = ev.n_tokens // ev.block_size
            if keep == 0:
                return
            ev = Stored(
                ev.hashes[:keep],
                ev.parent,
                keep * ev.block_size,
                ev.block_size,
                ev.medium,
                ev.lora,
                ev.group,
                ev.session,
            )
        self._chain(endpoint, ts, ev)

    def _chain(self, endpoint: int, ts: float, ev: Stored) -> None:
        parent = ev.parent
        prev = parent
        for h in ev.hashes:
            known = self.parent_of.get(h, -1)
            if known == -1 or (known is None and h in self.unseen_roots):
                # new, or first met as the parent of a store: now its own parent is known
                self.parent_of[h] = prev
                self.unseen_roots.discard(h)
            elif known != prev:
                count_into(self.skipped, "block stored under two parents (kept the first)")
            prev = h
        key = (endpoint, parent) if parent is not None else None
        i = self.open.pop(key, None) if key is not None else None
        if key is not None and i is not None and ts - self.requests[i].last <= CONTINUATION_GAP_S:
            req = self.requests[i]
            # a block inside one request's chain: a store after it is another session's
            self.tail_session.pop(key, None)
            req.chain.extend(ev.hashes)
            req.last = ts
        else:
            head, unseen = self._path(parent)
            if head is None:
                count_into(self.skipped, "block hashes form a loop")
                return
            session = ev.session
            if session is None and key is not None:
                session = self.tail_session.get(key)
            req = _Request(
                endpoint=endpoint,
                arrival=ts,
                last=ts,
                chain=head + ev.hashes,
                hit_blocks=len(head),
                session=session or f"e{endpoint}-r{len(self.requests)}",
                model=ev.lora,
                prefix_unseen=unseen,
            )
            self.requests.append(req)
            i = len(self.requests) - 1
        tail = (endpoint, ev.hashes[-1])
        self.open[tail] = i
        self.tail_session[tail] = self.requests[i].session

    def _path(self, h: int | None) -> tuple[list[int] | None, bool]:
        """The chain ending at ``h``, root first, and whether it reaches back to a block
        stored before the recording began (that block then stands first)."""
        out: list[int] = []
        limit = len(self.parent_of) + 1
        while h is not None:
            out.append(h)
            if len(out) > limit:
                return None, False
            p = self.parent_of.get(h, -1)
            if p == -1:  # never seen stored: it was cached before the recording began
                self.parent_of[h] = None
                self.unseen_roots.add(h)
                break
            h = p
        out.reverse()
        return out, bool(out) and out[0] in self.unseen_roots

    def _removed(self, endpoint: int, ts: float, ev: Removed) -> None:
        medium = ev.medium or "GPU"
        m = self._medium(medium, None)
        held = self.held.setdefault((endpoint, medium, ev.group), {})
        for h in ev.hashes:
            at = held.pop(h, None)
            m.removed += 1
            if at is None:
                m.removed_unseen += 1
            else:
                m.held -= 1
                m.lifetimes.append(ts - at)
            if ev.medium in PRIMARY_MEDIA:
                self.open.pop((endpoint, h), None)

    def _cleared(self, endpoint: int, ts: float) -> None:
        self.clears += 1
        for (e, medium, _), held in self.held.items():
            if e == endpoint:
                self.media[medium].held -= len(held)
                held.clear()
        for key in [k for k in self.open if k[0] == endpoint]:
            del self.open[key]

    # the results ---------------------------------------------------------------------------

    def figures(self, recs: list[Recording]) -> EngineEvents:
        first = self.first or 0.0
        span = max(0.0, self.last - first)
        self._advance(self.last)
        media = []
        for name in sorted(self.media, key=lambda k: (k != "GPU", k)):
            m = self.media[name]
            life = np.frombuffer(m.lifetimes, dtype=np.float64) if m.lifetimes else None
            media.append(
                MediumFigures(
                    medium=name,
                    block_size=m.block_size or (self.block_size or 0),
                    stored_blocks=m.stored,
                    removed_blocks=m.removed,
                    removed_unseen_blocks=m.removed_unseen,
                    peak_blocks=m.peak,
                    mean_blocks=m.area / span if span > 0 else float(m.held),
                    final_blocks=m.held,
                    evictions_per_s=m.removed / span if span > 0 else 0.0,
                    median_lifetime_s=None if life is None else float(np.median(life)),
                    p90_lifetime_s=None if life is None else float(np.quantile(life, 0.9)),
                )
            )
        malformed: dict[str, int] = dict(self.skipped)
        for r in recs:
            for k, v in r.malformed.items():
                count_into(malformed, k, v)
        prompt = sum(len(r.chain) for r in self.requests) * (self.block_size or 0)
        hits = sum(r.hit_blocks for r in self.requests) * (self.block_size or 0)
        return EngineEvents(
            recordings=len(recs),
            engines=len(self.engines),
            batches=self.batches,
            events=self.events,
            span_s=span,
            block_size=self.block_size or 0,
            media=tuple(media),
            clears=self.clears,
            requests=len(self.requests),
            requests_prefix_unseen=sum(r.prefix_unseen for r in self.requests),
            prompt_tokens=prompt,
            hit_tokens=hits,
            gaps=sum(r.gaps for r in recs),
            lost_batches=sum(r.lost_batches for r in recs),
            replayed_batches=sum(r.replayed_batches for r in recs),
            restarts=sum(r.restarts for r in recs),
            malformed=tuple(sorted(malformed.items())),
            complete=all(r.trailer is not None for r in recs),
            timeline=self._timeline(first),
        )

    def _timeline(self, first: float) -> tuple[OccupancyPoint, ...]:
        """At most ``TIMELINE_POINTS`` points: the recording cut in equal slices of time,
        each point the highest count of each medium within its slice."""
        if not self.samples:
            return ()
        span = self.samples[-1][0] - first
        width = span / TIMELINE_POINTS if span > 0 else 1.0
        points: list[OccupancyPoint] = []
        cur: dict[str, int] = {}
        slot = None
        start = 0.0
        for ts, held in self.samples:
            s = min(int((ts - first) / width), TIMELINE_POINTS - 1)
            if slot is not None and s != slot:
                points.append(OccupancyPoint(start, tuple(sorted(cur.items()))))
                cur = {}
            if s != slot:
                slot, start = s, s * width
            for k, v in held.items():
                cur[k] = max(cur.get(k, 0), v)
        points.append(OccupancyPoint(start, tuple(sorted(cur.items()))))
        return tuple(points)


def rebuild(recs: list[Recording]) -> Rebuilder:
    """Every batch of ``recs`` through one :class:`Rebuilder`, in time order (ties: by
    recording, then endpoint and sequence)."""
    order = sorted(
        (b.ts, i, b.endpoint, b.seq, j) for i, r in enumerate(recs) for j, b in enumerate(r.batches)
    )
    rb = Rebuilder()
    for _, i, _, _, j in order:
        b = recs[i].batches[j]
        # endpoints are numbered per recording: keep two recordings' engines apart
        rb.add(i * 1_000_000 + b.endpoint, b.ts, b.events)
    return rb
