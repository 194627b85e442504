"""coderd's per-user rate limit (``httpmw.RateLimit``, go-chi httprate), simulated.

A mixin of :class:`~watchd.sim.state.SimState` (``rate_limit`` and the windows stay
the state's attributes, which the tests set and age): keyed by user id and the
concrete URL path, over a sliding one-minute window on the host's clock, with the
``X-RateLimit-*`` headers and a 429 answer past the limit.
"""

from __future__ import annotations

from collections.abc import Callable

from watchd.sim.records import SimError


class HttpRate:
    """``check_rate`` over ``_rate``: (user, path) → (window start, count, previous count)."""

    rate_limit: int
    clock_offset: float
    wall: Callable[[], float]
    _rate: dict[tuple[str, str], tuple[int, int, int]]

    def check_rate(self, user_id: str, path: str) -> dict[str, str]:
        """``httpmw.RateLimit``: go-chi httprate keyed by user id and the concrete URL path
        (every ``/chats/<id>`` its own bucket), over a sliding one-minute window — the
        previous window's count weighs in by how much of it still overlaps. Raises 429
        with ``Retry-After: 60`` and the ``X-RateLimit-*`` headers."""
        now = self.wall()
        window = int(now // 60) * 60
        key = (user_id, path)
        start, count, previous = self._rate.get(key, (window, 0, 0))
        if start != window:
            previous = count if start == window - 60 else 0
            start, count = window, 0
        weight = (60 - (now - start)) / 60
        rate = previous * weight + count
        headers = {
            "X-RateLimit-Limit": str(self.rate_limit),
            "X-RateLimit-Remaining": str(max(0, int(self.rate_limit - rate - 1))),
            "X-RateLimit-Reset": str(int(start + 60 + self.clock_offset)),
        }
        if self.rate_limit >= 0 and rate >= self.rate_limit:
            self._rate[key] = (start, count, previous)
            raise SimError(
                429,
                f"You've been rate limited for sending more than {self.rate_limit} "
                "requests in 1m0s.",
                headers={**headers, "X-RateLimit-Remaining": "0", "Retry-After": "60"},
            )
        self._rate[key] = (start, count + 1, previous)
        return headers
