"""The transport-event seam: one sink that every producer writes into.

watchd's own HTTP and WebSocket traffic and the events agents send to the
ingest endpoint are the same shapes (docs/forwarding-events.md) and take
the same path. Producers call :meth:`EventSink.emit`, which must never block
and never raise: a slow or broken consumer costs counted drops, not watcher
progress.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Event = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class EventSource:
    """Who sent a batch: the OpenTelemetry resource and part of every pairing key."""

    service: str
    instance: str
    agent: str | None = None
    # watchd's own traffic (not an agent's): counted as spans, never as agent signals.
    own: bool = False


def own_source(identity: str) -> EventSource:
    """The source for watchd's own traffic on behalf of one identity."""
    # OTEL_SERVICE_NAME names watchd's own service, as for any OpenTelemetry SDK user.
    service = os.environ.get("OTEL_SERVICE_NAME", "").strip() or "watchd"
    return EventSource(
        service=service,
        instance=f"{socket.gethostname()}:{os.getpid()}",
        agent=identity,
        own=True,
    )


def now_ms() -> int:
    return int(time.time() * 1000)


class EventSink(Protocol):
    def emit(self, source: EventSource, event: Event) -> None: ...


class NullSink:
    """Discards everything (used by one-shot commands that export nothing)."""

    def emit(self, source: EventSource, event: Event) -> None:
        return None


class RecordingSink:
    """Keeps the last ``limit`` events in memory; for tests and the demo."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self.events: list[tuple[EventSource, dict[str, Any]]] = []
        self.dropped = 0

    def emit(self, source: EventSource, event: Event) -> None:
        if len(self.events) >= self.limit:
            self.events.pop(0)
            self.dropped += 1
        self.events.append((source, dict(event)))

    def of_type(self, prefix: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events if str(e.get("type", "")).startswith(prefix)]


class QueueSink:
    """A bounded queue in front of a slower consumer; overflow is counted, never waited on."""

    def __init__(self, maxsize: int = 50_000) -> None:
        self.queue: asyncio.Queue[tuple[EventSource, Event]] = asyncio.Queue(maxsize=maxsize)
        self.accepted = 0
        self.dropped = 0

    def emit(self, source: EventSource, event: Event) -> None:
        try:
            self.queue.put_nowait((source, event))
        except asyncio.QueueFull:
            self.dropped += 1
        else:
            self.accepted += 1

    def room(self) -> int:
        return self.queue.maxsize - self.queue.qsize()

    def refuse(self, events: int) -> None:
        """Events refused before they reached the queue (a batch without room): dropped."""
        self.dropped += events
