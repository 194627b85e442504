"""The span pipeline: one bounded queue in, the converter, the exporter out.

Every producer — the ingest endpoint, file sources, watchd's own transport —
writes into the same :class:`QueueSink`; one consumer task converts and
exports. Nothing here ever blocks a watcher: a full queue refuses (counted).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from watchd.kits import logs
from watchd.telemetry.agents import KINDS, AgentSignals
from watchd.telemetry.events import EventSource, QueueSink
from watchd.telemetry.spans import SpanConverter

if TYPE_CHECKING:
    # The OpenTelemetry SDK is imported only when an exporter is configured.
    from watchd.telemetry.export import SpanExport

log = logs.get("watchd.telemetry")

EXPIRE_EVERY = 5.0
# Events converted per loop turn at most (then the loop runs everything else once), and
# the time a turn may take: a turn of 500 events took 10-20 ms under an ingest flood,
# and a /healthz request waits behind every such turn it meets (1 ms halved its p50
# under the flood against 2 ms, and 2 ms beat 4 ms; docs/PERFORMANCE.md).
BATCH = 500
SLICE = 0.001
SLICE_CHECK = 16  # events between looks at the clock
_NUMBER = (int, float)


class SpanPipeline:
    def __init__(
        self, *, converter: SpanConverter, export: SpanExport | None, queue_size: int = 50_000
    ) -> None:
        self.sink = QueueSink(maxsize=queue_size)
        self.converter = converter
        self.export = export
        self.by_name: Counter[str] = Counter()
        self.by_source: Counter[str] = Counter()
        self.batches = 0
        # The agents' forwarded events as metrics (watchd's own traffic is not counted),
        # and to whoever else wants them (the daemon: each chat's timeline), with the
        # event's own time in seconds.
        self.agents = AgentSignals()
        self.on_forwarded: Callable[[dict[str, Any], float], None] | None = None

    def snapshot(self) -> dict[str, Any]:
        """The pipeline's counts as plain data (``/status`` and ``/metrics`` read this)."""
        export = self.export
        return {
            "events_accepted": self.sink.accepted,
            "events_dropped": self.sink.dropped,
            "event_queue_depth": self.sink.queue.qsize(),
            "open_pairs": self.converter.open_pairs,
            "converter": dict(self.converter.counters),
            "spans_by_name": dict(self.by_name.most_common(20)),
            "agents": self.agents.snapshot(),
            "export": None
            if export is None
            else {
                "submitted": export.submitted,
                "exported": export.exported,
                "failed": export.failed,
                "dropped": export.dropped,
                "in_flight": export.in_flight,
            },
        }

    async def run(self) -> None:
        queue = self.sink.queue
        last_expire = time.monotonic()
        while True:
            try:
                # asyncio.timeout, not wait_for (see Detector.run): cancellation must win.
                async with asyncio.timeout(EXPIRE_EVERY):
                    source, event = await queue.get()
            except TimeoutError:
                pass
            else:
                self._convert(source, event)
                # Drain what is already there without yielding per event, but give the
                # loop back after every batch: `queue.get()` does not suspend while items
                # are queued, so without this a flood would hold the loop for its length.
                until = time.monotonic() + SLICE
                for n in range(1, min(queue.qsize(), BATCH) + 1):
                    source, event = queue.get_nowait()
                    self._convert(source, event)
                    if n % SLICE_CHECK == 0 and time.monotonic() > until:
                        break
                self.batches += 1
                await asyncio.sleep(0)
            now = time.monotonic()
            if now - last_expire >= EXPIRE_EVERY:
                last_expire = now
                for rec in self.converter.expire(int(time.time() * 1000)):
                    self._emit(rec)

    def _convert(self, source: object, event: object) -> None:
        # Runs for every forwarded event: each lookup and call here is paid per event.
        if isinstance(source, EventSource) and not source.own and isinstance(event, dict):
            if event.get("type") in KINDS:
                self.agents.observe(event)
            hook = self.on_forwarded
            if hook is not None:
                ts = event.get("timestamp")
                at = ts / 1000.0 if isinstance(ts, _NUMBER) else time.time()
                try:
                    hook(event, at)
                except Exception:
                    log.exception("transport.observer_failed")
        try:
            records = self.converter.feed(source, event)  # type: ignore[arg-type]
        except Exception:
            log.exception("span.convert_failed")
            return
        for rec in records:
            self._emit(rec)

    def _emit(self, rec: object) -> None:
        from watchd.telemetry.spans import SpanRecord

        assert isinstance(rec, SpanRecord)
        self.by_name[rec.name] += 1
        self.by_source[rec.source.service] += 1
        if self.export is not None:
            self.export.submit(rec)

    def drain(self) -> int:
        """Convert whatever is queued (shutdown); returns how many events."""
        n = 0
        while not self.sink.queue.empty():
            source, event = self.sink.queue.get_nowait()
            self._convert(source, event)
            n += 1
        return n

    async def close(self, *, deadline: float) -> None:
        self.drain()
        if self.export is not None:
            ok = await asyncio.to_thread(self.export.flush, deadline)
            if not ok:
                log.warning("span.flush_incomplete", deadline=deadline)
            await asyncio.to_thread(self.export.shutdown)
