"""Backoff policies and the server's retry hints.

Pure: no sleeping here. Callers ask for the next delay and sleep on the loop.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from watchd.kits.clock import parse_http_date


class Backoff:
    """Jittered exponential backoff: ``base`` doubling to ``cap``, each delay
    multiplied by a random factor in [1 - jitter, 1 + jitter] so that many
    watchers redialing after a Coder restart spread out instead of stampeding."""

    def __init__(
        self,
        *,
        base: float = 1.0,
        cap: float = 30.0,
        factor: float = 2.0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        self.base = base
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        raw = min(self.cap, self.base * self.factor**self.failures)
        self.failures += 1
        spread = raw * self.jitter
        return max(0.0, raw + self._rng.uniform(-spread, spread))

    def reset(self) -> None:
        self.failures = 0


# A server's hint is a floor for our wait, never a sentence: one `Retry-After: 99999`
# must not switch an identity (or a receiver) off for a day. Past this, we try again.
MAX_HINT = 300.0


def retry_hint(
    headers: Mapping[str, str], *, server_now: float, cap: float = MAX_HINT
) -> float | None:
    """Seconds the server asks us to wait, from the first hint present:
    ``retry-after-ms``, ``Retry-After`` (seconds or HTTP-date), ``X-RateLimit-Reset``
    (unix seconds), at most ``cap``. Dates are compared with the server's own clock.
    The one parser for Coder and every receiver."""
    hint = _hint(headers, server_now=server_now)
    return None if hint is None else min(hint, cap)


def _hint(headers: Mapping[str, str], *, server_now: float) -> float | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    ra = lowered.get("retry-after")
    if ra:
        ra = ra.strip()
        try:
            return max(0.0, float(ra))
        except ValueError:
            when = parse_http_date(ra)
            if when is not None:
                return max(0.0, when - server_now)
    reset = lowered.get("x-ratelimit-reset")
    if reset:
        try:
            return max(0.0, float(reset) - server_now)
        except ValueError:
            pass
    return None
