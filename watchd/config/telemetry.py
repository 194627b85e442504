"""Spans from transport events: the exporter, its batching, pairing bounds, file sources.

Standard ``OTEL_*`` environment variables are read here (``exporter_kind``) and by
the telemetry package, never by the rest of the configuration.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from watchd.config.fields import AS_DURATION, TICK, Strict, Timeout, floor


class FileSourceConfig(Strict):
    path: str
    service: str
    instance: str
    agent: str | None = None
    # Start at the end like `tail -F` (a restart must not replay a day of events).
    from_start: bool = False


class TelemetryConfig(Strict):
    """Spans from transport events. Standard OTEL_EXPORTER_OTLP_* variables override these."""

    # otlp | console | none; unset: otlp when an endpoint is configured (here or via
    # OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT), else none.
    exporter: Literal["otlp", "console", "none"] | None = None
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    endpoint: str | None = None
    timeout: Timeout = 10.0
    # Spans in flight to the exporter; past it new spans are refused and counted.
    max_queue_size: Annotated[int, Field(ge=16)] = 20_000
    batch_size: Annotated[int, Field(ge=1)] = 512
    schedule_delay: Annotated[float, AS_DURATION, floor(0.01, TICK)] = 1.0
    # An open request/connection/segment older than this is closed as unsettled.
    pair_horizon: Annotated[float, AS_DURATION, floor(1.0, "shorter closes live requests")] = 600.0
    max_open_pairs: Annotated[int, Field(ge=16)] = 20_000
    # Events waiting for the converter (ingest + file sources + watchd's own traffic).
    ingest_queue: Annotated[int, Field(ge=16)] = 50_000
    # Turn watchd's own HTTP and WebSocket traffic into spans too.
    own_events: bool = True
    sources: list[FileSourceConfig] = Field(default_factory=list)

    def exporter_kind(self, env: dict[str, str]) -> str:
        """The exporter in effect: OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER win over
        the YAML (a value this build cannot honour is an env_problems line, never ignored)."""
        if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
            return "none"
        chosen = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        if chosen in EXPORTERS:
            return chosen
        if self.exporter is not None:
            return self.exporter
        has_env = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return "otlp" if (self.endpoint or has_env) else "none"


# What OTEL_TRACES_EXPORTER and OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL may say here: the
# OpenTelemetry Python SDK's OTLP exporter speaks grpc and http/protobuf, not http/json.
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("grpc", "http/protobuf")


def env_problems(env: dict[str, str]) -> list[str]:
    """The standard OTEL_* variables this build would otherwise silently not honour."""
    problems = []
    chosen = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if chosen and chosen not in EXPORTERS:
        problems.append(
            f"OTEL_TRACES_EXPORTER={chosen[:40]}: not supported here; use " + ", ".join(EXPORTERS)
        )
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(name, "").strip()
        if value and value not in PROTOCOLS:
            problems.append(
                f"{name}={value[:40]}: not supported by the OTLP exporter here; use "
                + " or ".join(PROTOCOLS)
            )
    return problems
