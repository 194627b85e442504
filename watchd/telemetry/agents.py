"""The agents' own transport events as metrics (fleet.md §5).

Forwarded events only (an agent's ``onTransportEvent``, by the ingest endpoint or a
file source), never watchd's own traffic: settled segments by outcome and their
durations, stream redials, and HTTP answers by status class. Plain counters and
fixed histogram buckets, read by the ``/metrics`` collector; every label is from a
closed set (never a chat id, a path or free text). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from watchd.kits.histogram import Buckets

OUTCOMES = ("clean", "error", "teardown")
CODE_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "error")
# Segment durations, seconds: a turn segment runs from a fraction of a second to the
# SDK's requestTimeoutMs (minutes).
SEGMENT_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# The kinds AgentSignals counts: the pipeline hands it no other (a ws:event, a stream's
# frame, is most of what agents forward).
KINDS = frozenset({"segment:settle", "ws:redial", "http:response", "http:error"})
_NUMBER = (int, float)


class AgentSignals:
    """Counts from forwarded ``segment:settle``, ``ws:redial``, ``http:response`` and
    ``http:error`` events."""

    def __init__(self) -> None:
        self.segments = dict.fromkeys(OUTCOMES, 0)
        self.segment_seconds = Buckets(SEGMENT_BUCKETS)
        self.redials = 0
        self.http = dict.fromkeys(CODE_CLASSES, 0)

    def observe(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "segment:settle":
            self.segments[outcome(event)] += 1
            ms = event.get("durationMs")
            if isinstance(ms, _NUMBER) and ms.__class__ is not bool and ms >= 0:
                self.segment_seconds.observe(ms / 1000.0)
        elif kind == "ws:redial":
            self.redials += 1
        elif kind == "http:response":
            status = event.get("status")
            # An int (every valid event's) by lookup; anything else as code_class says.
            c = _CLASS_OF.get(status, "error") if status.__class__ is int else code_class(status)
            self.http[c] += 1
        elif kind == "http:error":
            self.http["error"] += 1

    def snapshot(self) -> dict[str, Any]:
        """As plain data (``/status`` JSON and the ``/metrics`` collector): the segment
        histogram's buckets are cumulative, as Prometheus' ``le``, the last one +Inf."""
        return {
            "segments": dict(self.segments),
            "segment_seconds": self.segment_seconds.snapshot(),
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


# code_class of every valid status, by lookup (an http:response per forwarded request).
_CLASS_OF = {code: code_class(code) for code in range(100, 600)}
