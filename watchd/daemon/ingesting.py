"""The ingest port: all the HTTP server may touch of the transport-event intake.

The server gets this port, not the daemon: the event sink to emit into (and the
room left in it), the bearer-token check (the token itself stays here, read
through the daemon's current secrets so a reload applies), and the ingest
counters, which only this port writes. A refused batch's events are counted by
the sink itself (``QueueSink.refuse``), never by the server.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping

from pydantic import SecretStr

from watchd.telemetry.events import Event, EventSource, QueueSink

OUTCOMES = ("accepted", "rejected", "unauthorized", "too_large", "refused_full", "refused_busy")


class IngestPort:
    """The sink, the token check and the counters of ``/v1/transport-events``."""

    def __init__(self, *, sink: QueueSink, token: Callable[[], SecretStr | None]) -> None:
        self._sink = sink
        self._token = token
        self._counts = dict.fromkeys(OUTCOMES, 0)

    def authorized(self, header: str) -> bool:
        """Whether an ``Authorization`` header bears the ingest token (any does when no
        token is set)."""
        token = self._token()
        if token is None:
            return True
        return hmac.compare_digest(header.encode(), f"Bearer {token.get_secret_value()}".encode())

    def room(self) -> int:
        return self._sink.room()

    def count(self, outcome: str) -> None:
        self._counts[outcome] += 1

    def put(self, batch: Iterable[tuple[EventSource, Event]]) -> None:
        """An accepted batch into the sink, counted as accepted."""
        for source, event in batch:
            self._sink.emit(source, event)
        self._counts["accepted"] += 1

    def refuse_full(self, events: int) -> None:
        """A batch the queue has no room for: counted here, its events by the sink."""
        self._counts["refused_full"] += 1
        self._sink.refuse(events)

    def snapshot(self) -> Mapping[str, int]:
        return dict(self._counts)
