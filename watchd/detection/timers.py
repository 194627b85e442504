"""A timer heap with lazy invalidation.

Arming a chat pushes (deadline, key, version). Re-arming pushes again; the
old entry stays in the heap and is discarded when it surfaces because its
version no longer matches. No periodic scan of all chats, ever. The heap is
compacted when stale entries outnumber live ones.
"""

from __future__ import annotations

import heapq
import itertools
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
