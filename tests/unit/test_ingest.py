"""The ingest endpoint under load: parsing in steps on the loop, one batch at a time, and
a batch the queue has no room for refused before its events are validated."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

import watchd.daemon.server as server_module
from watchd.daemon.ingesting import IngestPort
from watchd.daemon.server import Server
from watchd.daemon.silences_api import AdminToken
from watchd.telemetry.events import QueueSink
from watchd.telemetry.ingest import (
    STEP,
    IngestError,
    NoRoom,
    parse_batch,
    parse_batch_stepwise,
)

T0 = 1_764_437_000_000
SENDER = {"service": "s", "instance": "i"}


def _event(i: int) -> dict[str, Any]:
    return {
        "type": "http:request",
        "timestamp": T0 + i,
        "id": f"r{i}",
        "method": "GET",
        "path": "/x",
    }


def _envelope(n: int, *, broken_at: int | None = None) -> bytes:
    events = [_event(i) for i in range(n)]
    if broken_at is not None:
        events[broken_at]["method"] = 7
    return json.dumps({"source": SENDER, "events": events}).encode()


def _ndjson(n: int, *, broken_at: int | None = None) -> bytes:
    events = [_event(i) for i in range(n)]
    if broken_at is not None:
        del events[broken_at]["path"]
    return "\n".join(json.dumps(e) for e in events).encode()


BODIES = [
    ("envelope", _envelope(3 * STEP + 7), "application/json"),
    ("envelope, bad late", _envelope(3 * STEP + 7, broken_at=2 * STEP + 3), "application/json"),
    ("ndjson", _ndjson(2 * STEP + 1), "application/x-ndjson"),
    ("ndjson, bad late", _ndjson(2 * STEP + 1, broken_at=STEP + 5), "application/x-ndjson"),
    ("not json", b'{"source": ', "application/json"),
    ("not utf-8", b'{"source": "\xff"}', "application/json"),
    ("empty", b"", "application/json"),
]


def _answer(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except IngestError as exc:
        return ("error", str(exc))


@pytest.mark.parametrize(("name", "body", "ctype"), BODIES, ids=[b[0] for b in BODIES])
async def test_stepwise_parsing_answers_exactly_as_the_plain_parser(
    name: str, body: bytes, ctype: str
) -> None:
    """Parsing in steps gives the same events or the same error as parse_batch."""
    plain = _answer(lambda: parse_batch(body, content_type=ctype, query=SENDER))
    try:
        stepped = ("ok", await parse_batch_stepwise(body, content_type=ctype, query=SENDER))
    except IngestError as exc:
        stepped = ("error", str(exc))
    assert stepped == plain


async def test_a_large_batch_gives_the_loop_back_while_it_is_parsed() -> None:
    """A 10-step batch lets another task run between its steps (the loop is never held
    for the whole batch)."""
    body = _envelope(10 * STEP)
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    batch = await parse_batch_stepwise(body, content_type="application/json", query={})
    done = True
    await task
    assert len(batch) == 10 * STEP and ticks - before >= 9


async def test_a_batch_without_room_is_refused_before_its_events_are_checked() -> None:
    """An envelope outnumbering the queue's room raises NoRoom, even with a bad event in
    it: the flood's refused batches cost a decode, not a validation."""
    body = _envelope(50, broken_at=40)
    with pytest.raises(NoRoom) as caught:
        await parse_batch_stepwise(body, content_type="application/json", query={}, room=lambda: 49)
    assert caught.value.events == 50
    with pytest.raises(IngestError, match=r"events\[40\]\.method"):
        await parse_batch_stepwise(body, content_type="application/json", query={}, room=lambda: 50)


def _server(sink: QueueSink) -> Server:
    daemon: Any = SimpleNamespace()
    silences: Any = SimpleNamespace(routes=lambda app: None)
    return Server(
        daemon,
        ingest=IngestPort(sink=sink, token=lambda: None),
        listen="127.0.0.1:0",
        max_body_bytes=1 << 20,
        identities=0,
        silences=silences,
        render_metrics=lambda: b"",
        admin=AdminToken(lambda: None),
        reload=lambda: None,  # not routed to in these tests
    )


async def test_concurrent_batches_are_parsed_one_at_a_time(monkeypatch: Any) -> None:
    """Eight senders at once: every batch is accepted, and never two are parsed together
    (each loop turn holds one parse step, not one per sender)."""
    in_flight = most = 0
    real = server_module.parse_batch_stepwise

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            return await real(*args, **kwargs)
        finally:
            in_flight -= 1

    monkeypatch.setattr(server_module, "parse_batch_stepwise", counted)
    sink = QueueSink(maxsize=100_000)
    server = _server(sink)
    async with TestClient(TestServer(server.app)) as client:
        body = _envelope(5 * STEP)

        async def post() -> int:
            resp = await client.post(
                "/v1/transport-events", data=body, headers={"Content-Type": "application/json"}
            )
            return resp.status

        statuses = await asyncio.gather(*(post() for _ in range(8)))
    assert statuses == [202] * 8 and most == 1
    assert sink.accepted == 8 * 5 * STEP


async def test_a_full_queue_answers_503_and_counts_the_batch_and_its_events() -> None:
    """A batch larger than the room left is refused 503 with Retry-After, counted as
    refused_full, its events as dropped; nothing of it enters the queue."""
    sink = QueueSink(maxsize=100)
    server = _server(sink)
    async with TestClient(TestServer(server.app)) as client:
        resp = await client.post(
            "/v1/transport-events",
            data=_envelope(150, broken_at=120),
            headers={"Content-Type": "application/json"},
        )
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert "queue full" in (await resp.json())["error"]
        ok = await client.post(
            "/v1/transport-events", data=_envelope(60), headers={"Content-Type": "application/json"}
        )
        assert ok.status == 202
    counts = server.intake.snapshot()
    assert counts["refused_full"] == 1 and counts["accepted"] == 1
    assert sink.dropped == 150 and sink.queue.qsize() == 60


async def test_the_wait_for_the_parse_slot_is_bounded_and_counted(monkeypatch: Any) -> None:
    """With MAX_WAITING_BATCHES batches waiting behind a held parse slot, one more is
    answered 503 and counted as refused_busy; a cancelled wait gives its place back."""
    monkeypatch.setattr(server_module, "MAX_WAITING_BATCHES", 2)
    sink = QueueSink(maxsize=100_000)
    server = _server(sink)
    async with TestClient(TestServer(server.app)) as client:
        body = _envelope(10)
        headers = {"Content-Type": "application/json"}
        await server._parsing.acquire()  # a batch being parsed, for as long as we like
        waiting = [
            asyncio.create_task(client.post("/v1/transport-events", data=body, headers=headers))
            for _ in range(2)
        ]
        for _ in range(1_000):
            if server._waiting == 2:
                break
            await asyncio.sleep(0.01)
        busy = await client.post("/v1/transport-events", data=body, headers=headers)
        assert busy.status == 503 and "wait to be parsed" in (await busy.json())["error"]
        assert server.intake.snapshot()["refused_busy"] == 1

        async def wait_turn() -> None:
            async with server._parse_turn():
                pass

        gone = asyncio.create_task(wait_turn())
        await asyncio.sleep(0)
        assert server._waiting == 3
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert server._waiting == 2
        server._parsing.release()
        assert [r.status for r in await asyncio.gather(*waiting)] == [202, 202]
    assert server._waiting == 0 and sink.accepted == 20
