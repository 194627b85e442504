"""Transport events end to end: ingest → converter → OTLP → a real gRPC receiver."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.harness import DaemonProcess, SimProcess, eventually
from tests.fakes.otlp import OtlpReceiver

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]
CHAT = "0b7c0000-0000-4000-8000-000000000001"
T0 = 1_764_437_000_000
SOURCE = {"service": "billing-agent", "instance": "pod-7f9c", "agent": "wf-1042"}


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def telemetry(otlp: OtlpReceiver, **more: Any) -> dict[str, Any]:
    return {
        "telemetry": {
            "exporter": "otlp",
            "protocol": "grpc",
            "endpoint": otlp.endpoint,
            "schedule_delay": "200ms",
            **more,
        }
    }


async def post(
    d: DaemonProcess,
    body: bytes | str,
    *,
    content_type: str = "application/json",
    token: str | None = None,
    query: str = "",
) -> tuple[int, Any]:
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://{d.listen}/v1/transport-events{query}", data=body, headers=headers) as r,
    ):
        return r.status, await r.json(content_type=None)


def ev(kind: str, dt: int, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "timestamp": T0 + dt, **fields}


TURN = [
    ev("segment:start", 0, segment=1, chatId=CHAT),
    ev("http:request", 1, id="r1", method="POST", path=f"/api/v2/chats/{CHAT}/messages"),
    ev(
        "http:response",
        40,
        id="r1",
        method="POST",
        path=f"/api/v2/chats/{CHAT}/messages",
        status=200,
        ok=True,
        durationMs=39,
    ),
    ev(
        "ws:dial",
        50,
        chatId=CHAT,
        reader=1,
        attempt=1,
        url=f"wss://coder/api/v2/chats/{CHAT}/stream",
    ),
    ev("ws:open", 60, chatId=CHAT, reader=1, attempt=1),
    ev("ws:dial", 500, chatId=CHAT, reader=2, attempt=1, url="wss://coder/x"),
    ev("ws:close", 520, chatId=CHAT, reader=1, attempt=1),
    ev(
        "ws:event",
        600,
        chatId=CHAT,
        reader=2,
        attempt=1,
        event={"type": "status", "status": {"status": "waiting"}},
    ),
    ev("ws:close", 700, chatId=CHAT, reader=2, attempt=1),
    ev(
        "segment:settle",
        710,
        segment=1,
        chatId=CHAT,
        reader=2,
        durationMs=710,
        status="waiting",
        finishReason="stop",
    ),
]


async def test_posted_events_arrive_as_spans(
    otlp: OtlpReceiver, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Names, event timestamps, status, links and the sender's resource survive to OTLP."""
    sim = start_sim()
    d = start_daemon(sim, extra=telemetry(otlp))
    await d.wait_ready()
    status, body = await post(d, json.dumps({"source": SOURCE, "events": TURN}))
    assert (status, body) == (202, {"accepted": len(TURN)})
    await eventually(lambda: otlp.named("chat.segment"), within=10)
    (segment,) = otlp.named("chat.segment")
    streams = sorted(otlp.named("chat.stream"), key=lambda s: s.start_ns)
    (http,) = otlp.named("POST /api/v2/chats/{chat}/messages")
    assert segment.resource["service.name"] == "billing-agent"
    assert segment.resource["service.instance.id"] == "pod-7f9c"
    assert (segment.start_ns, segment.end_ns) == (T0 * 10**6, (T0 + 710) * 10**6)
    assert segment.attributes["coder.finish_reason"] == "stop"
    assert [s.attributes["coder.stream.reader"] for s in streams] == [1, 2]
    assert streams[0].end_ns == (T0 + 520) * 10**6, "the late close ended reader 1's span"
    assert streams[1].span_id in segment.links
    assert http.attributes["http.response.status_code"] == 200 and http.kind == 3  # CLIENT
    assert http.attributes["coder.chat.id"] == CHAT


async def test_watchd_own_traffic_becomes_spans(
    otlp: OtlpReceiver, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """watchd's own REST calls and watch socket go through the same converter, token-free."""
    sim = start_sim()
    d = start_daemon(sim, extra=telemetry(otlp))
    await d.wait_ready()
    await eventually(lambda: otlp.named("GET /api/v2/chats"), within=10)
    listing = otlp.named("GET /api/v2/chats")[0]
    assert listing.resource["service.name"] == "watchd"
    d.terminate()
    await eventually(lambda: otlp.named("chat.watch"), within=5)
    watch = otlp.named("chat.watch")[0]
    assert "url.full" in watch.attributes
    token = sim.token("alice")
    assert all(token not in repr(s) for s in otlp.spans)


async def test_ingest_hardening(
    otlp: OtlpReceiver, tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Unauthenticated → 401, oversized → 413, malformed → 400 naming line and field with
    nothing applied; the watchers are unaffected."""
    sim = start_sim()
    token_file = tmp_path / "ingest"
    token_file.write_text("ingest-token-abcdef")
    token_file.chmod(0o600)
    d = start_daemon(
        sim,
        extra={
            **telemetry(otlp, own_events=False),
            "server": {"ingest_token_file": str(token_file), "max_body_bytes": 4096},
        },
    )
    await d.wait_ready()
    good = json.dumps({"source": SOURCE, "events": TURN[:1]})
    assert (await post(d, good))[0] == 401
    assert (await post(d, good, token="wrong"))[0] == 401
    status, _ = await post(d, "x" * 10_000, token="ingest-token-abcdef")
    assert status == 413
    lines = "\n".join(json.dumps({**e}) for e in [TURN[0], {**TURN[1], "method": 7}])
    status, body = await post(
        d,
        lines,
        content_type="application/x-ndjson",
        token="ingest-token-abcdef",
        query="?service=s&instance=i",
    )
    assert status == 400 and body["error"].startswith("line 2.method")
    doc = await d.status()
    assert doc["telemetry"]["events_accepted"] == 0, "part of a rejected batch was applied"
    assert doc["telemetry"]["ingest"] == {
        "accepted": 0,
        "rejected": 1,
        "unauthorized": 2,
        "too_large": 1,
        "refused_full": 0,
        "refused_busy": 0,
    }
    assert (await post(d, good, token="ingest-token-abcdef"))[0] == 202
    doc = await d.status()
    assert doc["telemetry"]["events_accepted"] == 1
    assert doc["identities"][0]["ready"] is True


async def test_flood_is_refused_and_counted_watchers_unaffected(
    otlp: OtlpReceiver, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A flood beyond the event queue is refused with 503 and counted; stuck chats still alert."""
    sim = start_sim()
    d = start_daemon(sim, extra=telemetry(otlp, ingest_queue=64, own_events=False))
    await d.wait_ready()
    batch = json.dumps(
        {"source": SOURCE, "events": [ev("segment:start", i, segment=i) for i in range(60)]}
    )
    codes = await asyncio.gather(*(post(d, batch) for _ in range(40)))
    statuses = [c for c, _ in codes]
    assert 503 in statuses and 202 in statuses
    await sim.add_chat("alice", status="running")
    await eventually(lambda: d.firing("ChatStuck"), within=10)
    _, metrics = await d.get("/metrics")
    refused = [
        line
        for line in str(metrics).splitlines()
        if line.startswith('watchd_ingest_requests_total{outcome="refused_full"}')
    ]
    assert refused and float(refused[0].split()[-1]) >= 1


async def test_file_source_follows_rotation(
    otlp: OtlpReceiver, tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Events appended to a JSON-lines file become spans, across a rotation; the bad line
    and the rotation are counted in /status and /metrics."""
    log = tmp_path / "events.jsonl"
    log.write_text("")
    sim = start_sim()
    d = start_daemon(
        sim,
        extra=telemetry(
            otlp, sources=[{"path": str(log), "service": "file-agent", "instance": "vol-1"}]
        ),
    )
    await d.wait_ready()
    with log.open("a") as f:
        f.write(json.dumps(ev("segment:start", 0, segment=1)) + "\n")
        f.write("this is not json\n")
        f.write(json.dumps(ev("segment:settle", 5, segment=1, durationMs=5)) + "\n")
    await eventually(lambda: len(otlp.named("chat.segment")) == 1, within=10)
    log.rename(tmp_path / "events.jsonl.1")
    log.write_text(
        json.dumps(ev("segment:start", 100, segment=2))
        + "\n"
        + json.dumps(ev("segment:settle", 150, segment=2, durationMs=50))
        + "\n"
    )
    await eventually(lambda: len(otlp.named("chat.segment")) == 2, within=10)
    assert {s.resource["service.name"] for s in otlp.named("chat.segment")} == {"file-agent"}
    assert any(e.get("event") == "file_source.bad_line" for e in d.log_events())
    # The bad line and the rotation are counted where an operator sees them.
    [source] = (await d.status())["telemetry"]["file_sources"]
    assert (source["bad_lines"], source["rotations"]) == (1, 1)
    _, metrics = await d.get("/metrics")
    counted = [line for line in str(metrics).splitlines() if line.startswith("watchd_file_source")]
    assert f'watchd_file_source_lines_total{{outcome="bad",path="{log}"}} 1.0' in counted
    assert f'watchd_file_source_rotations_total{{path="{log}"}} 1.0' in counted


async def test_otlp_http_configured_by_otel_env(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT + _PROTOCOL=http/protobuf alone switch export to OTLP/HTTP."""
    from tests.fakes.otlp import OtlpHttpReceiver

    receiver = await OtlpHttpReceiver().start()
    try:
        sim = start_sim()
        d = start_daemon(
            sim,
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_BSP_SCHEDULE_DELAY": "200",
            },
        )
        await d.wait_ready()
        status, _ = await post(d, json.dumps({"source": SOURCE, "events": TURN}))
        assert status == 202
        await eventually(lambda: receiver.named("chat.segment"), within=10)
        assert receiver.named("chat.segment")[0].resource["service.name"] == "billing-agent"
    finally:
        await receiver.stop()


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sdk-events"


async def test_every_sdk_versions_fixture_exports_its_spans(
    otlp: OtlpReceiver, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """The 0.6.1, 0.6.3 and 0.7.0 fixtures, posted as NDJSON to the real daemon, are all
    accepted and each becomes its six spans at a real OTLP receiver."""
    sim = start_sim()
    d = start_daemon(sim, extra=telemetry(otlp))
    await d.wait_ready()
    for i, version in enumerate(("0.6.1", "0.6.3", "0.7.0")):
        status, body = await post(
            d,
            (FIXTURES / f"{version}.ndjson").read_bytes(),
            content_type="application/x-ndjson",
            query=f"?service=agent-{version}&instance=pod-{i}",
        )
        assert status == 202, body

    def by_version() -> dict[str, int]:
        got: dict[str, int] = {}
        for s in otlp.spans:
            svc = s.resource.get("service.name", "")
            if svc.startswith("agent-"):
                got[svc] = got.get(svc, 0) + 1
        return got

    await eventually(
        lambda: by_version() == {f"agent-{v}": 6 for v in ("0.6.1", "0.6.3", "0.7.0")}, within=15
    )
