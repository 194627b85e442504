"""Inbound connection bounds on the real server, on a virtual loop clock (looptime)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from watchd.daemon.inbound import HEADER_TIMEOUT, REQUEST_TIMEOUT, inbound_cap
from watchd.daemon.ingesting import IngestPort
from watchd.daemon.server import Server
from watchd.daemon.silences_api import AdminToken
from watchd.telemetry.events import QueueSink

pytestmark = pytest.mark.looptime


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    daemon: Any = SimpleNamespace()
    silences: Any = SimpleNamespace(routes=lambda app: None)
    s = Server(
        daemon,
        ingest=IngestPort(sink=QueueSink(10), token=lambda: None),
        listen="127.0.0.1:0",
        max_body_bytes=1 << 20,
        identities=0,
        silences=silences,
        render_metrics=lambda: b"",
        admin=AdminToken(lambda: None),
        reload=lambda: None,  # not routed to in these tests
    )
    await s.start()
    yield s
    await s.stop()


async def connect(s: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = s.bound.rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def closed_after(reader: asyncio.StreamReader) -> tuple[float, bytes]:
    """When the server closed the connection (loop time from now), and what it said."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    said = await reader.read()
    return round(loop.time() - start, 1), said


async def test_a_silent_connection_is_closed_after_the_header_timeout(server: Server) -> None:
    """A connection that never sends a byte is closed HEADER_TIMEOUT after it was accepted."""
    reader, writer = await connect(server)
    assert await closed_after(reader) == (HEADER_TIMEOUT, b"")
    writer.close()
    await writer.wait_closed()


async def test_a_trickled_request_head_is_closed_after_the_header_timeout(
    server: Server,
) -> None:
    """Half a request head (slowloris) does not hold the connection past HEADER_TIMEOUT."""
    reader, writer = await connect(server)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    assert await closed_after(reader) == (HEADER_TIMEOUT, b"")
    writer.close()
    await writer.wait_closed()


async def test_a_trickled_body_gets_408_after_the_request_timeout(server: Server) -> None:
    """A POST whose body never completes is answered 408 at REQUEST_TIMEOUT and counted."""
    loop = asyncio.get_running_loop()
    reader, writer = await connect(server)
    writer.write(
        b"POST /v1/transport-events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n[{"
    )
    start = loop.time()
    status = await reader.readline()
    assert round(loop.time() - start, 1) == REQUEST_TIMEOUT
    assert status.startswith(b"HTTP/1.1 408 ")
    assert server.inbound.dropped["slow_request"] == 1
    writer.close()
    await writer.wait_closed()


async def test_at_the_cap_the_oldest_idle_connection_makes_room(server: Server) -> None:
    """With the cap reached by idle connections, a probe is answered at once: the oldest
    idle connection is closed for it (evicted_idle); all others stay open."""
    server.inbound.cap = 3
    idle = [await connect(server) for _ in range(3)]
    await asyncio.sleep(0.1)
    reader, writer = await connect(server)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 1.0)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert await asyncio.wait_for(idle[0][0].read(), 0.1) == b""
    assert server.inbound.dropped["evicted_idle"] == 1
    for _, w in [*idle, (reader, writer)]:
        w.close()
        await w.wait_closed()


def test_the_cap_keeps_the_reserve() -> None:
    """systemd's default 1 024 descriptors with 20 identities leave 752 inbound connections;
    a huge limit is capped at 1 024, a tiny one still allows 16."""
    assert inbound_cap(1024, 20) == 752
    assert inbound_cap(1 << 20, 10) == 1024
    assert inbound_cap(100, 0) == 16
