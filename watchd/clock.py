"""Time sources: the host's wall clock and per-deployment server-clock estimates.

Everything that judges "how long has this chat been in its status" reads a
:class:`ServerClock`, never ``time.time()`` directly, so that host clock skew
can neither fire nor hide an alert. Scheduling (sleeps, timers) uses the event
loop's monotonic clock; this module only answers "what time is it *there*".
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from email.utils import parsedate_to_datetime
from typing import Protocol


class WallClock(Protocol):
    """Seconds since the epoch, as this host believes."""

    def now(self) -> float: ...


class SystemClock:
    """The host's clock. Tests substitute an object with the same ``now``."""

    def now(self) -> float:
        return time.time()


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

    ``Date`` has one-second resolution, so each sample is centred (+0.5 s) and
    the estimate is the median of recent samples: one slow response or a
    proxy with its own clock cannot drag it far.
    """

    def __init__(self, wall: WallClock | None = None, *, window: int = 15) -> None:
        self._wall: WallClock = wall or SystemClock()
        self._samples: deque[float] = deque(maxlen=window)
        self.offset: float = 0.0
        self.synced: bool = False

    def observe(self, date_header: str | None, *, sent_at: float, received_at: float) -> None:
        """Record one response's ``Date`` taken between ``sent_at`` and ``received_at`` (wall)."""
        if not date_header:
            return
        server = parse_http_date(date_header)
        if server is None:
            return
        midpoint = (sent_at + received_at) / 2.0
        self._samples.append(server + 0.5 - midpoint)
        self.offset = statistics.median(self._samples)
        self.synced = True

    def wall_now(self) -> float:
        return self._wall.now()

    def now(self) -> float:
        """The deployment's current time (epoch seconds), as best estimated."""
        return self._wall.now() + self.offset
