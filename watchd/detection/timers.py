"""The chats' clocks: timer heaps with lazy invalidation, one per identity in that
identity's server time.

Arming a chat pushes (deadline, key, version). Re-arming pushes again; the
old entry stays in the heap and is discarded when it surfaces because its
version no longer matches. No periodic scan of all chats, ever. The heap is
compacted when stale entries outnumber live ones.

Deadlines are the server's (a chat's entry stamp plus its budget), kept as such and
turned into this host's time only when the loop asks what is due or when to wake, with
the identity's offset as estimated then (:class:`ServerTimers`). Chats that cross their
budget at one server instant therefore come due together, however the estimate moved
while they were armed (it narrows from ±0.5 s to about a round trip as ``Date``
samples arrive): converting at arming time would spread such a burst over the
estimate's drift.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Due:
    deadline: float
    key: tuple[str, str, str]  # (identity, chat id, clock name)
    version: int


class TimerHeap:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, tuple[str, str, str], int]] = []
        self._live: dict[tuple[str, str, str], tuple[float, int]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: tuple[str, str, str]) -> bool:
        return key in self._live

    def arm(self, key: tuple[str, str, str], deadline: float, version: int) -> None:
        entry = (deadline, version)
        if self._live.get(key) == entry:
            return
        self._live[key] = entry
        heapq.heappush(self._heap, (deadline, next(self._seq), key, version))
        if len(self._heap) > 64 and len(self._heap) > 2 * len(self._live):
            self._compact()

    def cancel(self, key: tuple[str, str, str]) -> None:
        self._live.pop(key, None)

    def next_deadline(self) -> float | None:
        while self._heap:
            deadline, _, key, version = self._heap[0]
            if self._live.get(key) == (deadline, version):
                return deadline
            heapq.heappop(self._heap)
        return None

    def pop_due(self, now: float, *, limit: int = 10_000) -> list[Due]:
        out: list[Due] = []
        while self._heap and len(out) < limit:
            deadline, _, key, version = self._heap[0]
            if deadline > now:
                break
            heapq.heappop(self._heap)
            if self._live.get(key) != (deadline, version):
                continue
            del self._live[key]
            out.append(Due(deadline, key, version))
        return out

    def _compact(self) -> None:
        self._heap = [(d, next(self._seq), k, v) for k, (d, v) in self._live.items()]
        heapq.heapify(self._heap)


class ServerTimers:
    """One :class:`TimerHeap` per identity, deadlines in that identity's server time;
    ``offset_of(identity)`` (server minus host) converts them when the loop asks."""

    def __init__(self, offset_of: Callable[[str], float]) -> None:
        self._heaps: dict[str, TimerHeap] = {}
        self._offset_of = offset_of

    def __len__(self) -> int:
        return sum(len(h) for h in self._heaps.values())

    def __contains__(self, key: tuple[str, str, str]) -> bool:
        heap = self._heaps.get(key[0])
        return heap is not None and key in heap

    def arm(self, key: tuple[str, str, str], deadline: float, version: int) -> None:
        """Arm ``key`` (identity first) at ``deadline``, the server's time."""
        heap = self._heaps.get(key[0])
        if heap is None:
            heap = self._heaps[key[0]] = TimerHeap()
        heap.arm(key, deadline, version)

    def cancel(self, key: tuple[str, str, str]) -> None:
        heap = self._heaps.get(key[0])
        if heap is not None:
            heap.cancel(key)

    def drop(self, identity: str) -> None:
        """Forget an identity's clocks (it is no longer watched)."""
        self._heaps.pop(identity, None)

    def next_deadline(self, identity: str | None = None) -> float | None:
        """The earliest deadline in this host's time: of one identity, or of all."""
        names = self._heaps if identity is None else (identity,)
        best: float | None = None
        for name in names:
            heap = self._heaps.get(name)
            nxt = heap.next_deadline() if heap is not None else None
            if nxt is not None:
                nxt -= self._offset_of(name)
                if best is None or nxt < best:
                    best = nxt
        return best

    def pop_due(self, now: float, *, limit: int = 10_000) -> list[Due]:
        """What is due at ``now`` (this host's time), each identity judged on its own
        server's time; ``deadline`` in the answer stays the server's."""
        out: list[Due] = []
        for name, heap in self._heaps.items():
            if len(out) >= limit:
                break
            out += heap.pop_due(now + self._offset_of(name), limit=limit - len(out))
        return out
