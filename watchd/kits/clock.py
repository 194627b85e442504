"""Time sources: the host's wall clock and per-deployment server-clock estimates.

Everything that judges "how long has this chat been in its status" reads a
:class:`ServerClock`, never ``time.time()`` directly, so that host clock skew
can neither fire nor hide an alert. Scheduling (sleeps, timers) uses the event
loop's monotonic clock; this module only answers "what time is it *there*".
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from email.utils import parsedate_to_datetime
from typing import Protocol


class WallClock(Protocol):
    """Seconds since the epoch, as this host believes."""

    def now(self) -> float: ...


class SystemClock:
    """The host's clock. Tests substitute an object with the same ``now``."""

    def now(self) -> float:
        return time.time()


class LoopClock:
    """Wall time that advances with the running event loop's clock: the host's time when
    it is made, then the loop's. On a real loop it tracks the host clock (without its
    steps); on a virtual loop (looptime in tests) a sleep of an hour passes an hour here
    too, so what judges time in status runs on the virtual clock."""

    def __init__(self) -> None:
        self._epoch = time.time() - loop_time()

    def now(self) -> float:
        return self._epoch + loop_time()


def loop_time() -> float:
    """The running event loop's clock (what scheduling uses), or the monotonic clock that
    asyncio's loop reads when none is running (a record built before the loop starts).

    The same clock in production; on a virtual loop (looptime in tests) durations measured
    with it follow the loop's time instead of the host's.
    """
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def parse_http_date(value: str) -> float | None:
    """An RFC 9110 HTTP-date as epoch seconds, or None when it is not one."""
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed is None or parsed.tzinfo is None:
        return None
    return parsed.timestamp()


class ServerClock:
    """An estimate of one deployment's clock, learned from HTTP ``Date`` headers.

    ``Date`` has one-second resolution: a response stamped ``D`` that we sent at ``s``
    and received at ``r`` (our clock) only says the offset lies in ``[D − r, D + 1 − s]``.
    Each sample is such an interval, and the estimate is the middle of the range that the
    most recent samples agree on (Marzullo's intersection): samples that straddle second
    boundaries narrow it to about a round trip, where averaging centred samples would stay
    up to half a second off; a slow response or a proxy with its own clock is outvoted.
    """

    def __init__(self, wall: WallClock | None = None, *, window: int = 15) -> None:
        self._wall: WallClock = wall or SystemClock()
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self.offset: float = 0.0
        # Responses without a usable Date header (the estimate then rests on the others).
        self.missing_date = 0

    def observe(self, date_header: str | None, *, sent_at: float, received_at: float) -> None:
        """Record one response's ``Date`` taken between ``sent_at`` and ``received_at`` (wall)."""
        server = parse_http_date(date_header) if date_header else None
        if server is None:
            self.missing_date += 1
            return
        self._samples.append((server - received_at, server + 1.0 - sent_at))
        self.offset = best_agreement(self._samples)

    def wall_now(self) -> float:
        return self._wall.now()

    def now(self) -> float:
        """The deployment's current time (epoch seconds), as best estimated."""
        return self._wall.now() + self.offset


def best_agreement(intervals: Iterable[tuple[float, float]]) -> float:
    """The middle of the range covered by the most intervals (Marzullo's algorithm)."""
    edges = sorted([(lo, 0) for lo, _ in intervals] + [(hi, 1) for _, hi in intervals])
    best = count = 0
    lo = hi = edges[0][0]
    for i, (x, end) in enumerate(edges):
        if end:
            count -= 1
            continue
        count += 1
        if count > best:
            best, lo, hi = count, x, edges[i + 1][0]
    return (lo + hi) / 2.0
