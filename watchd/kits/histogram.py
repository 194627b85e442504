"""A bucket histogram counted by hand: fixed bounds, a count per bucket, the sum.

For the histograms observed on a hot path (each chat's time in status, on every
transition; each forwarded segment's duration), where prometheus_client's
``labels().observe()`` cost more than the rest of the event. Read at scrape time as
Prometheus' cumulative ``le`` buckets (:meth:`Buckets.samples`), or as plain data
(:meth:`Buckets.snapshot`). Pure: no clock, no I/O, no registry.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from itertools import accumulate
from typing import Any

INF = float("inf")


class Buckets:
    """Counts per bucket and their sum. A value lands in the first bucket whose bound is
    at least it (Prometheus' ``le``: a value on a bound is in that bound's bucket), or in
    the last, unbounded one (``+Inf``)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)  # ascending
        self.counts = [0] * (len(self.bounds) + 1)  # not cumulative; the last is +Inf's
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[int]:
        """Counts at or below each bound, the last one (+Inf) every observation."""
        return list(accumulate(self.counts))

    def samples(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` per bucket, as ``HistogramMetricFamily.add_metric``
        takes them: ``le`` as Prometheus' clients write it (``5.0``, ``+Inf``)."""
        return [
            (le(b), float(c)) for b, c in zip((*self.bounds, INF), self.cumulative(), strict=True)
        ]

    def snapshot(self) -> dict[str, Any]:
        """As plain data (``/status`` JSON): the bounds with +Inf last, the cumulative
        counts, the sum to the millisecond."""
        return {
            "buckets": [*self.bounds, INF],
            "counts": self.cumulative(),
            "sum": round(self.sum, 3),
        }


def le(bound: float) -> str:
    """A bucket's ``le`` label value."""
    return "+Inf" if bound == INF else repr(float(bound))
