"""Links that transfers share: a processor-sharing (fair-share fluid) model.

Every transfer in flight on a link gets an equal share ``bandwidth / n`` of it, and
shares change the moment a transfer starts or ends, as TCP/RDMA flows on one
bottleneck do in steady state. Each transfer uses exactly one link (the bottleneck of
its path: the instance's PCIe link for host DRAM, the node's NVMe for local disk, the
node's NIC for the pool); the two directions of a link are separate links (PCIe and
NICs are full duplex), so background writes do not slow reads.

Implementation: *virtual time*. ``served`` is the number of bytes each transfer in
flight has received since the link was created (it grows at ``bandwidth / n``), so a
transfer of ``b`` bytes that starts when ``served == s`` ends when ``served`` reaches
``s + b``, whatever happens to ``n`` meanwhile. Only the earliest such end needs an
event; the link's ``version`` invalidates the event scheduled before the last change.

Nothing waits for a write to end (the request that wrote has moved on), and nothing
reads a write link but its figures (bytes, transfers, busy time by window, the end of
its last transfer). Those are the same under any discipline that keeps the link busy
while it has bytes to send, fair share or first come first served alike: the busy
periods are where the bytes sent so far fall short of the bytes offered. So a write
link (``lazy``) is a backlog of bytes, drained at the link's rate as time passes when it
is next used (:meth:`Link.settle`), with no events and no per-transfer record, and its
busy time counted once per busy period.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class Link:
    name: str
    kind: str  # "pcie-read", "pcie-write", "nvme-read", ..., "net-read", "net-write"
    bytes_per_s: float
    window_s: float
    n: int = 0  # transfers in flight
    served: float = 0.0  # bytes each transfer in flight has received (virtual time)
    last_t: float = 0.0
    version: int = 0
    seq: int = 0
    heap: list[tuple[float, int, object]] = field(default_factory=list)
    bytes_total: float = 0.0
    transfers: int = 0
    busy_s: float = 0.0
    first_t: float | None = None
    last_end_t: float = 0.0
    busy_by_window: dict[int, float] = field(default_factory=dict)
    lazy: bool = False  # a backlog of bytes, drained when the link is next used
    backlog: float = 0.0  # a lazy link's bytes offered and not yet sent
    queued: int = 0  # its transfers since it was last idle
    busy_from: float = 0.0  # where its busy time is counted to (counted per busy period)

    def settle(self, now: float) -> int:
        """End, in order, every transfer the link's events would have ended by ``now``
        (ends at ``now`` included: an end event runs before anything else at its time);
        returns the number of ends (a lazy link's: its transfers, once it has sent
        them all)."""
        if self.lazy:
            ended = self._drain(now)
            if self.backlog > 0.0 and now > self.busy_from and not math.isinf(now):
                self._busy(self.busy_from, now)  # busy so far, the rest still to send
                self.busy_from = now
            return ended
        ended = 0
        heap = self.heap
        while heap:
            end = self._next_end(self.last_t)
            if end > now:
                break
            self.finish(end, self.version)
            ended += 1
        return ended

    def _drain(self, now: float) -> int:
        """A lazy link's backlog sent at the link's rate up to ``now`` (``math.inf``:
        all of it); the transfers that ended (all those queued, once it is empty)."""
        t = self.last_t
        if self.backlog <= 0.0 or now <= t:
            if now > t and not math.isinf(now):
                self.last_t = now
            return 0
        end = t + self.backlog / self.bytes_per_s
        if end <= now:
            self._busy(self.busy_from, end)  # the busy period, counted once it ends
            self.backlog = 0.0
            self.last_end_t = end
            self.last_t = end if math.isinf(now) else now
            ended, self.queued = self.queued, 0
            return ended
        self.backlog -= self.bytes_per_s * (now - t)
        self.last_t = now
        return 0

    def _advance(self, now: float) -> None:
        if self.n:
            dt = now - self.last_t
            if dt > 0:
                self.served += self.bytes_per_s * dt / self.n
                self._busy(self.last_t, now)
        self.last_t = now

    def _busy(self, a: float, b: float) -> None:
        self.busy_s += b - a
        w = self.window_s
        k = int(a // w)
        windows = self.busy_by_window
        while a < b:
            end = min(b, (k + 1) * w)
            windows[k] = windows.get(k, 0.0) + (end - a)
            a = end
            k += 1

    def _next_end(self, now: float) -> float:
        return now + (self.heap[0][0] - self.served) * self.n / self.bytes_per_s

    def add(self, now: float, n_bytes: float, item: object) -> float:
        """Start a transfer; returns the time of the link's next end (the caller
        schedules it with this link's current ``version``; a lazy link's caller does
        not)."""
        assert n_bytes > 0
        if self.lazy:
            self._drain(now)
            if self.first_t is None:
                self.first_t = now
            if self.backlog <= 0.0:
                self.busy_from = self.last_t  # a busy period starts
            self.backlog += n_bytes
            self.queued += 1
            self.bytes_total += n_bytes
            self.transfers += 1
            return self.last_t + self.backlog / self.bytes_per_s
        self._advance(now)
        if self.first_t is None:
            self.first_t = now
        self.seq += 1
        heapq.heappush(self.heap, (self.served + n_bytes, self.seq, item))
        self.n += 1
        self.bytes_total += n_bytes
        self.transfers += 1
        self.version += 1
        return self._next_end(now)

    def finish(self, now: float, version: int) -> tuple[list[object], float | None] | None:
        """Handle the end event scheduled for ``version``: the transfers that ended and
        the time of the next end (None when idle). None when the event is stale."""
        if version != self.version:
            return None
        self._advance(now)
        heap = self.heap
        done = [heapq.heappop(heap)[2]]  # the event was scheduled for this one
        # Others ending within rounding of the same instant end now too.
        slack = 1e-9 * max(1.0, self.served)
        while heap and heap[0][0] <= self.served + slack:
            done.append(heapq.heappop(heap)[2])
        self.n -= len(done)
        self.version += 1
        self.last_end_t = now
        if not heap:
            self.served = 0.0  # nothing in flight: restart virtual time (keeps floats small)
            return done, None
        return done, self._next_end(now)

    def drop(self) -> None:
        """Forget the transfers in flight (a run stopped early)."""
        self.heap.clear()
        self.backlog = 0.0
        self.queued = 0

    def record_instant(self, n_bytes: float) -> None:
        """Count a transfer that takes no time (free-loads mode)."""
        self.bytes_total += n_bytes
        self.transfers += 1

    def stats(self, duration_s: float) -> dict[str, float]:
        peak = max(self.busy_by_window.values(), default=0.0) / self.window_s
        return {
            "bytes": self.bytes_total,
            "transfers": self.transfers,
            "busy_s": self.busy_s,
            "mean_utilisation": self.busy_s / duration_s if duration_s > 0 else 0.0,
            "peak_utilisation": min(1.0, peak),
        }
