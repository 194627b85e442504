"""A token bucket on the loop clock, for anything that must pace itself.

The Coder transport paces an identity's requests with it, the sweeper its
mutations, the dispatcher a receiver's notifications. Scheduling reads the
running loop's clock (never the wall clock), so a virtual loop clock in tests
gives exact waits. Knows nothing of what is being paced.
"""

from __future__ import annotations

import asyncio


class RateLimiter:
    """A token bucket on the loop clock: ``rate`` requests per second, ``burst`` at once.

    Coder limits each user to about 512 requests per minute per endpoint; the
    default keeps one identity well under that for every endpoint together.
    """

    def __init__(self, *, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp: float | None = None
        self._lock = asyncio.Lock()
        # Callers inside or queued for the lock (who waits, waits in turn).
        self._queued = 0

    def _refill(self, now: float) -> None:
        stamp = now if self._stamp is None else self._stamp
        self._tokens = min(self.burst, self._tokens + (now - stamp) * self.rate)
        self._stamp = now

    async def acquire(self) -> float:
        """Take a token, waiting for one if need be; the seconds waited (loop clock), 0.0
        when one was there at once."""
        loop = asyncio.get_running_loop()
        if not self._queued:
            # Nobody ahead: take a token now if there is one, as the locked path below
            # would at once (nothing awaits between the check and the take). Called for
            # every request, this skips the lock's context manager.
            self._refill(loop.time())
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
        self._queued += 1
        asked = loop.time()
        try:
            async with self._lock:
                self._refill(loop.time())
                if self._tokens < 1.0:
                    wait = (1.0 - self._tokens) / self.rate
                    await asyncio.sleep(wait)
                    self._tokens = 1.0
                    self._stamp = loop.time()
                self._tokens -= 1.0
        finally:
            self._queued -= 1
        return loop.time() - asked
