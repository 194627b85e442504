"""Pooled connections the server closes while idle: a GET is sent again once on a fresh
connection and never reads as an outage; a write is never sent twice."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from watchd.coder import connections
from watchd.coder.errors import CoderError
from watchd.coder.transport import Transport
from watchd.daemon.metrics import CoderRequests


class IdleClosingServer:
    """HTTP/1.1 with keep-alive, whose idle timer can fire at any moment: with
    ``closing`` set, a request arriving on a connection that already served one is read
    and the connection closed unanswered (its idle close crossing the request)."""

    def __init__(self) -> None:
        self.closing = False
        self.connections = 0
        self.arrived: list[tuple[str, int]] = []  # (method, its connection's number)
        self._hold: asyncio.Event | None = None
        self._holding = 0
        self._server: asyncio.Server | None = None
        self.url = ""
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def close_idle(self) -> None:
        """Close every connection now (the idle timer firing between requests)."""
        for writer in self._writers:
            writer.close()

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        self.close_idle()
        await self._server.wait_closed()

    def hold(self, n: int) -> None:
        """Answer nothing until ``n`` requests wait at once (so the client opens ``n``
        connections, all pooled afterwards)."""
        self._hold, self._holding = (asyncio.Event(), n) if n else (None, 0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number, served = self.connections, 0
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method = lines[0].split(" ")[0]
                sizes = [
                    x.split(":", 1)[1] for x in lines if x.lower().startswith("content-length:")
                ]
                length = int(sizes[0]) if sizes else 0
                await reader.readexactly(length)
                self.arrived.append((method, number))
                if self.closing and served:
                    return  # the idle close, as the request came in
                if self._hold is not None:
                    self._holding -= 1
                    if self._holding <= 0:
                        self._hold.set()
                    await self._hold.wait()
                body = b"{}"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[IdleClosingServer]:
    s = IdleClosingServer()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def pooled() -> AsyncIterator[aiohttp.ClientSession]:
    s = connections.open_session(keepalive=connections.keepalive_for(60.0))
    yield s
    await s.close()


def _transport(
    server: IdleClosingServer, session: aiohttp.ClientSession, meter: CoderRequests | None = None
) -> Transport:
    return Transport(base_url=server.url, token="t", session=session, identity="a", meter=meter)


async def _pool_of(t: Transport, server: IdleClosingServer, n: int) -> None:
    """``n`` connections opened by concurrent GETs, all idle in the pool now."""
    server.hold(n)
    await asyncio.gather(*(t.request("GET", f"/warm/{i}") for i in range(n)))
    server.hold(0)


@pytest.mark.parametrize("idle", [1, 2, 3])
async def test_a_get_on_a_connection_closed_as_it_was_sent_is_sent_once_more_fresh(
    server: IdleClosingServer, pooled: aiohttp.ClientSession, idle: int
) -> None:
    """With 1–3 idle pooled connections all closed by the server as requests arrive, a GET
    succeeds on one fresh connection, sent twice in all, counted as stale (not an error)."""
    t = _transport(server, pooled)
    await _pool_of(t, server, idle)
    assert server.connections == idle
    server.closing = True
    server.arrived.clear()
    answer = await t.request("GET", "/api/v2/chats")
    assert answer.status == 200
    assert len(server.arrived) == 2  # the pooled try, and one on a fresh connection
    assert server.arrived[1][1] == idle + 1
    assert t.stale == 1


async def test_idle_closes_at_random_moments_never_fail_a_get(
    server: IdleClosingServer, pooled: aiohttp.ClientSession
) -> None:
    """GETs interleaved with the server closing its idle connections at random moments
    (before a request, as one arrives, or not at all) never raise: each is sent at most
    twice, and every second send is counted."""
    t = _transport(server, pooled)
    rng = random.Random(29)
    for _ in range(60):
        server.closing = rng.random() < 0.5
        if rng.random() < 0.3:
            await _pool_of(t, server, rng.randint(1, 3))
        if rng.random() < 0.3:
            server.close_idle()
            await asyncio.sleep(0)
        before = len(server.arrived)
        assert (await t.request("GET", "/api/v2/chats")).status == 200
        assert len(server.arrived) - before <= 2
    assert t.stale >= 1


async def test_a_post_on_a_closed_pooled_connection_is_not_sent_again(
    server: IdleClosingServer, pooled: aiohttp.ClientSession
) -> None:
    """A POST that meets a pooled connection closed under it raises a CoderError saying it
    was not sent twice; the server saw it once, and nothing is counted as stale."""
    t = _transport(server, pooled)
    await _pool_of(t, server, 2)
    server.closing = True
    server.arrived.clear()
    with pytest.raises(CoderError) as failed:
        await t.request("POST", "/api/v2/chats/x/interrupt")
    assert [method for method, _ in server.arrived] == ["POST"]
    assert server.arrived[0][1] <= 2  # on a pooled connection
    assert failed.value.status is None
    assert "a POST is not sent twice" in failed.value.message
    assert t.stale == 0


async def test_stale_sends_show_in_metrics_not_as_errors(
    server: IdleClosingServer, pooled: aiohttp.ClientSession
) -> None:
    """A GET sent again after a closed pooled connection counts in
    watchd_coder_stale_connections_total and not as a request without answer."""
    coder = CoderRequests(CollectorRegistry())
    t = _transport(server, pooled, coder)
    await _pool_of(t, server, 2)
    server.closing = True
    await t.request("GET", "/api/v2/chats")
    assert coder.stale_connections.labels("a")._value.get() == 1
    errors = coder.requests.labels("GET", "/api/v2/chats", "error")._value.get()
    assert errors == 0
