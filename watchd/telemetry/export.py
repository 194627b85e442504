"""Span records → the OpenTelemetry SDK's batch processor → OTLP (gRPC or HTTP).

Exporter settings come the standard ``OTEL_*`` way (endpoint, headers,
protocol, timeout), with the YAML ``telemetry`` section as defaults. The SDK
drops silently when its queue is full or the backend is down; here nothing
is silent: at most ``max_queue_size`` spans are admitted in flight (so the
SDK's own queue never overflows and our refusals are counted), and the
exporter is wrapped to count what was exported and what failed.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from watchd import __version__
from watchd.telemetry.events import EventSource
from watchd.telemetry.spans import SpanRecord

SCOPE = InstrumentationScope("watchd.transport", __version__)
KINDS = {"CLIENT": SpanKind.CLIENT, "INTERNAL": SpanKind.INTERNAL}
MAX_RESOURCES = 1024


class CountingExporter(SpanExporter):
    """Wraps the real exporter; counts exported and failed spans."""

    def __init__(self, inner: SpanExporter, on_done: Any) -> None:
        self.inner = inner
        self.on_done = on_done

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        self.on_done(len(spans), result == SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def effective_otlp(*, protocol: str, endpoint: str | None) -> tuple[str, str]:
    """The OTLP protocol and traces endpoint the exporter will really use: the standard
    ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` / ``_ENDPOINT`` variables win over the YAML."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or protocol
    )
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return protocol, traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or endpoint
    if protocol == "grpc":
        return protocol, base or "http://localhost:4317"
    # OTLP/HTTP appends the signal path to a base endpoint (the spec's rule).
    return protocol, (base or "http://localhost:4318").rstrip("/") + "/v1/traces"


def printable_endpoint(url: str) -> str:
    """An endpoint for a log line: no userinfo, query or fragment (they can carry keys)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "(unparseable)"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def build_exporter(
    *, kind: str, protocol: str, endpoint: str | None, timeout: float
) -> SpanExporter | None:
    """The configured exporter; OTEL_* environment variables override YAML defaults."""
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol, _ = effective_otlp(protocol=protocol, endpoint=endpoint)
    env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    kwargs: dict[str, Any] = {}
    if not env_endpoint and endpoint:
        if protocol == "grpc":
            kwargs["endpoint"] = endpoint
            kwargs["insecure"] = endpoint.startswith("http://")
        else:
            kwargs["endpoint"] = endpoint.rstrip("/") + "/v1/traces"
    if not os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
        kwargs["timeout"] = timeout
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(**kwargs)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(**kwargs)


class SpanExport:
    """Admission control + the SDK batch processor + counted outcomes."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = 20_000,
        schedule_delay: float = 1.0,
        batch_size: int = 512,
    ) -> None:
        self.max_queue_size = max_queue_size
        self._lock = threading.Lock()
        self.in_flight = 0
        self.submitted = 0
        self.exported = 0
        self.failed = 0
        self.dropped = 0
        self._processor = BatchSpanProcessor(
            CountingExporter(exporter, self._done),
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay * 1000,
            max_export_batch_size=min(batch_size, max_queue_size),
        )
        self._resources: OrderedDict[EventSource, Resource] = OrderedDict()

    def _done(self, n: int, ok: bool) -> None:
        with self._lock:
            self.in_flight -= n
            if ok:
                self.exported += n
            else:
                self.failed += n

    def _resource(self, source: EventSource) -> Resource:
        r = self._resources.get(source)
        if r is None:
            attrs: dict[str, Any] = {
                "service.name": source.service,
                "service.instance.id": source.instance,
            }
            if source.agent:
                attrs["coder.agent.id"] = source.agent
            r = Resource.create(attrs)
            self._resources[source] = r
            while len(self._resources) > MAX_RESOURCES:
                self._resources.popitem(last=False)
        else:
            self._resources.move_to_end(source)
        return r

    def submit(self, record: SpanRecord) -> bool:
        """Hand one span to the batch processor; False (counted) when the queue is full."""
        with self._lock:
            if self.in_flight >= self.max_queue_size:
                self.dropped += 1
                return False
            self.in_flight += 1
            self.submitted += 1
        ctx = SpanContext(
            record.trace_id,
            record.span_id,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        span = ReadableSpan(
            name=record.name,
            context=ctx,
            resource=self._resource(record.source),
            attributes=dict(record.attributes),
            events=[Event(e.name, dict(e.attributes), e.time_ns) for e in record.events],
            links=[
                Link(
                    SpanContext(
                        lk.trace_id,
                        lk.span_id,
                        is_remote=False,
                        trace_flags=TraceFlags(TraceFlags.SAMPLED),
                    ),
                    dict(lk.attributes),
                )
                for lk in record.links
            ],
            kind=KINDS[record.kind],
            status=Status(StatusCode.ERROR, record.description or None)
            if record.status == "ERROR"
            else Status(StatusCode.UNSET),
            start_time=record.start_ns,
            end_time=record.end_ns,
            instrumentation_scope=SCOPE,
        )
        self._processor.on_end(span)
        return True

    def flush(self, deadline: float) -> bool:
        return self._processor.force_flush(int(deadline * 1000))

    def shutdown(self) -> None:
        self._processor.shutdown()  # type: ignore[no-untyped-call]
