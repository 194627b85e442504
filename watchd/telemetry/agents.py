"""The agents' own transport events as metrics (fleet.md §5).

Forwarded events only (an agent's ``onTransportEvent``, by the ingest endpoint or a
file source), never watchd's own traffic: settled segments by outcome and their
durations, stream redials, and HTTP answers by status class. Plain counters and
fixed histogram buckets, read by the ``/metrics`` collector; every label is from a
closed set (never a chat id, a path or free text). Pure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

OUTCOMES = ("clean", "error", "teardown")
CODE_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "error")
# Segment durations, seconds: a turn segment runs from a fraction of a second to the
# SDK's requestTimeoutMs (minutes).
SEGMENT_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class AgentSignals:
    """Counts from forwarded ``segment:settle``, ``ws:redial``, ``http:response`` and
    ``http:error`` events."""

    def __init__(self) -> None:
        self.segments = dict.fromkeys(OUTCOMES, 0)
        self._buckets = [0] * (len(SEGMENT_BUCKETS) + 1)
        self._sum = 0.0
        self.redials = 0
        self.http = dict.fromkeys(CODE_CLASSES, 0)

    def observe(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "segment:settle":
            self.segments[outcome(event)] += 1
            ms = event.get("durationMs")
            if isinstance(ms, int | float) and not isinstance(ms, bool) and ms >= 0:
                seconds = ms / 1000.0
                self._buckets[bisect_left(SEGMENT_BUCKETS, seconds)] += 1
                self._sum += seconds
        elif kind == "ws:redial":
            self.redials += 1
        elif kind == "http:response":
            self.http[code_class(event.get("status"))] += 1
        elif kind == "http:error":
            self.http["error"] += 1

    def snapshot(self) -> dict[str, Any]:
        """As plain data (``/status`` JSON and the ``/metrics`` collector): the segment
        histogram's buckets are cumulative, as Prometheus' ``le``, the last one +Inf."""
        cumulative, total = [], 0
        for n in self._buckets:
            total += n
            cumulative.append(total)
        return {
            "segments": dict(self.segments),
            "segment_seconds": {
                "buckets": [*SEGMENT_BUCKETS, float("inf")],
                "counts": cumulative,
                "sum": round(self._sum, 3),
            },
            "redials": self.redials,
            "http": dict(self.http),
        }


def outcome(event: Mapping[str, Any]) -> str:
    """``clean`` for a settle with ``status`` and ``finishReason``, ``error`` for one with
    ``error``, ``teardown`` for neither (fleet.md §5)."""
    if event.get("error"):
        return "error"
    if event.get("status") is not None and event.get("finishReason") is not None:
        return "clean"
    return "teardown"


def code_class(status: object) -> str:
    if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
        return f"{status // 100}xx"
    return "error"
