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
from datetime import UTC, datetime
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


# Samples in a row that make a step (a single or a double outlier stays outvoted).
STEP_SAMPLES = 3
# A fresh stamp this far behind the estimate contradicts it (a watch event is delivered
# within milliseconds of its transition; this leaves room for a slow socket), when
# FRESH_AGREE stamps in a row do, all by about as much (within FRESH_SPREAD): one stale
# stamp (a server bug, a simulator's aged chat) never moves the clock.
FRESH_LAG = 30.0
FRESH_AGREE = 3
FRESH_SPREAD = 5.0


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
        # What the Date samples agree on (server − wall), and how far the server's own
        # fresh stamps say that is ahead (0 while they agree): see fresh_stamp.
        self.date_offset: float = 0.0
        self.stamp_lag: float = 0.0
        # Responses without a usable Date header (the estimate then rests on the others).
        self.missing_date = 0
        # Steps followed (every recent sample disagreeing with the estimate), and times
        # fresh stamps contradicted the Date-based estimate.
        self.steps = 0
        self.contradicted = 0
        self._lags: deque[float] = deque(maxlen=FRESH_AGREE)

    @property
    def offset(self) -> float:
        """Server time minus this host's, as best estimated (what deadlines are armed by)."""
        return self.date_offset - self.stamp_lag

    @offset.setter
    def offset(self, value: float) -> None:
        self.date_offset = value
        self.stamp_lag = 0.0

    def observe(self, date_header: str | None, *, sent_at: float, received_at: float) -> None:
        """Record one response's ``Date`` taken between ``sent_at`` and ``received_at`` (wall).

        One sample, or two, that disagree with the rest are outvoted (a slow response, a
        proxy with its own clock); STEP_SAMPLES samples in a row that agree with each other
        and not with the estimate are a step of the server's clock (or of this host's),
        and the estimate follows them at once instead of after half the window."""
        server = parse_http_date(date_header) if date_header else None
        if server is None:
            self.missing_date += 1
            return
        samples = self._samples
        samples.append((server - received_at, server + 1.0 - sent_at))
        if len(samples) > STEP_SAMPLES:
            recent = list(samples)[-STEP_SAMPLES:]
            lo = max(s[0] for s in recent)
            hi = min(s[1] for s in recent)
            if lo <= hi and not lo <= self.date_offset <= hi:
                samples.clear()
                samples.extend(recent)
                self.steps += 1
        self.date_offset = best_agreement(samples)

    def fresh_stamp(self, stamp: float) -> bool:
        """A stamp the server wrote just now (a transition's ``updated_at`` as its watch
        event arrives). One more than FRESH_LAG behind the estimate says the estimate runs
        ahead of the server's own clock (a proxy's ``Date``, or no ``Date`` from a server
        behind this host) once FRESH_AGREE stamps in a row say so by about as much: the
        stamps are believed instead, and True says so. The correction goes as soon as a
        fresh stamp agrees with the Date samples again."""
        lag = self._wall.now() + self.date_offset - stamp
        if lag <= FRESH_LAG:
            self._lags.clear()
            self.stamp_lag = 0.0
            return False
        lags = self._lags
        lags.append(lag)
        if len(lags) < FRESH_AGREE or max(lags) - min(lags) > FRESH_SPREAD:
            return False
        self.stamp_lag = min(lags)
        self.contradicted += 1
        return True

    def wall_now(self) -> float:
        return self._wall.now()

    def now(self) -> float:
        """The deployment's current time (epoch seconds), as best estimated."""
        return self._wall.now() + self.date_offset - self.stamp_lag


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


def utc_second(second: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` of a whole UTC second, remembered: a burst's alerts put
    thousands of stamps of a few seconds into words (their fractions are added by the
    caller)."""
    text = _SECONDS.get(second)
    if text is None:
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        text = _SECONDS[second] = datetime.fromtimestamp(second, tz=UTC).isoformat()[:19]
    return text


_SECONDS: dict[int, str] = {}
