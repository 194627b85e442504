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

    async def acquire(self) -> None:
        async with self._lock:
            loop = asyncio.get_running_loop()
            now = loop.time()
            if self._stamp is None:
                self._stamp = now
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            if self._tokens < 1.0:
                wait = (1.0 - self._tokens) / self.rate
                await asyncio.sleep(wait)
                self._tokens = 1.0
                self._stamp = loop.time()
            self._tokens -= 1.0
