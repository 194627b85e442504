"""The span pipeline and the event files it follows, as the configuration asks.

The OpenTelemetry SDK (and OTLP/gRPC with protobuf) is imported only when spans
are exported: a sidecar that exports nothing never pays for importing it.
"""

from __future__ import annotations

import os

from watchd.config.telemetry import TelemetryConfig
from watchd.kits import logs
from watchd.telemetry.events import EventSink, EventSource, own_source
from watchd.telemetry.filesource import FileSource
from watchd.telemetry.pipeline import SpanPipeline
from watchd.telemetry.spans import SpanConverter

log = logs.get("watchd.telemetry")


def build_pipeline(t: TelemetryConfig) -> SpanPipeline:
    """The span pipeline the telemetry config asks for (exporter, converter, queue)."""
    kind = t.exporter_kind(dict(os.environ))
    export = None
    if kind != "none":
        # The OpenTelemetry SDK (and OTLP/gRPC with protobuf) only when spans are exported:
        # a sidecar that exports nothing never pays for importing it.
        from watchd.telemetry.export import (
            SpanExport,
            build_exporter,
            effective_otlp,
            printable_endpoint,
        )

        exporter = build_exporter(
            kind=kind, protocol=t.protocol, endpoint=t.endpoint, timeout=t.timeout
        )
        assert exporter is not None
        export = SpanExport(
            exporter,
            max_queue_size=t.max_queue_size,
            schedule_delay=t.schedule_delay,
            batch_size=t.batch_size,
        )
    if kind == "otlp":
        protocol, endpoint = effective_otlp(protocol=t.protocol, endpoint=t.endpoint)
        log.info(
            "telemetry.configured",
            exporter=kind,
            protocol=protocol,
            endpoint=printable_endpoint(endpoint),
            service_name=own_source("").service,
        )
    else:
        log.info("telemetry.configured", exporter=kind)
    return SpanPipeline(
        converter=SpanConverter(horizon_ms=int(t.pair_horizon * 1000), max_open=t.max_open_pairs),
        export=export,
        queue_size=t.ingest_queue,
    )


def file_sources(t: TelemetryConfig, sink: EventSink) -> list[FileSource]:
    """One follower per ``telemetry.sources`` file, feeding the pipeline's sink."""
    return [
        FileSource(
            fs.path,
            source=EventSource(fs.service, fs.instance, fs.agent),
            sink=sink,
            from_start=fs.from_start,
        )
        for fs in t.sources
    ]
