"""Logs as an operator reads them: every library's warnings as JSON lines through structlog,
OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES honoured, the effective exporter stated."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.harness import DaemonProcess, SimProcess, eventually, free_port
from tests.fakes.otlp import OtlpReceiver

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


async def test_collector_down_every_line_is_json_and_startup_names_the_exporter(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """With the collector down the SDK's export warnings are JSON lines like the rest, and
    the start-up line gives the protocol and endpoint the environment chose (no secrets)."""
    port = free_port()  # nothing listens here
    sim = start_sim()
    d = start_daemon(
        sim,
        extra={"telemetry": {"exporter": "otlp", "schedule_delay": "200ms"}},
        env={
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://user:hunter2secret@127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer otlp-header-secret-123",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        },
    )
    await d.wait_ready()

    def sdk_lines() -> list[dict[str, object]]:
        return [e for e in d.log_events() if str(e.get("logger", "")).startswith("opentelemetry")]

    await eventually(sdk_lines, within=20)
    d.terminate()
    lines = d.stderr_path.read_text().splitlines()
    not_json = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert not not_json, not_json[:5]
    configured = next(e for e in d.log_events() if e.get("event") == "telemetry.configured")
    assert configured["exporter"] == "otlp"
    assert configured["protocol"] == "http/protobuf"
    assert configured["endpoint"] == f"http://127.0.0.1:{port}/v1/traces"
    text = "\n".join(lines)
    assert "hunter2secret" not in text and "otlp-header-secret-123" not in text


async def test_service_name_and_resource_attributes_from_the_environment(
    otlp: OtlpReceiver, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """OTEL_SERVICE_NAME names watchd's own spans; OTEL_RESOURCE_ATTRIBUTES are on them."""
    sim = start_sim()
    d = start_daemon(
        sim,
        extra={
            "telemetry": {
                "exporter": "otlp",
                "protocol": "grpc",
                "endpoint": otlp.endpoint,
                "schedule_delay": "200ms",
            }
        },
        env={
            "OTEL_SERVICE_NAME": "watchd-eu1",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,team=sre",
        },
    )
    await d.wait_ready()
    await eventually(lambda: otlp.named("GET /api/v2/chats"), within=10)
    span = otlp.named("GET /api/v2/chats")[0]
    assert span.resource["service.name"] == "watchd-eu1"
    assert span.resource["deployment.environment"] == "prod"
    assert span.resource["team"] == "sre"
    configured = next(e for e in d.log_events() if e.get("event") == "telemetry.configured")
    assert configured["service_name"] == "watchd-eu1"
    assert configured["endpoint"] == otlp.endpoint
