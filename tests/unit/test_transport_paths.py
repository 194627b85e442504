"""The transport's per-request shortcuts against what they replace: the query text, the
limiter's lock-free take, no events built for nobody, the listing requests on the wire."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlencode

import aiohttp
import pytest

from tests.conftest import Sim
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError
from watchd.coder.transport import Transport, query
from watchd.coder.watchstream import open_watch
from watchd.kits.ratelimit import RateLimiter
from watchd.telemetry.events import NullSink, RecordingSink
from watchd.telemetry.ingest import parse_batch
from watchd.telemetry.kinds import RULES, TransportEvent, WsRedial, own, problem

UUID = "7a2bd334-3596-401b-ae1e-15035e79c1d5"

PARAMS: list[list[tuple[str, str]]] = [
    [("limit", "500")],
    [("limit", "500"), ("after_id", UUID)],
    [("limit", "1")],
    [("limit", "")],
    [("a.b_c~d-e", "A.B_C~D-E")],
    [("limit", "500"), ("q", "archived:true")],
    [("label", "fleet:bench"), ("label", "team:a b")],
    [("q", "x+y"), ("r", "50%"), ("s", "a&b=c"), ("t", "#frag"), ("u", "/p?")],
    [("label", "é:ü"), ("label", "日本")],
    [("k", "a\nb"), ("k", "\x00"), ("k", "'\"<>")],
    [("k y", "v")],
]


@pytest.mark.parametrize("params", PARAMS, ids=[str(i) for i in range(len(PARAMS))])
def test_query_is_urlencode(params: list[tuple[str, str]]) -> None:
    """The joined query is exactly the text urlencode makes of the same params."""
    assert query(params) == urlencode(params)


async def test_listing_requests_reach_the_server_as_before(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A paged listing through the shortcuts asks the server for the paths urlencode
    would have made, and reports them in its events."""
    alice = sim.state.add_user("alice")
    for i in range(5):
        sim.state.add_chat(alice, title=f"c{i}", status="waiting", publish=False)
    events = RecordingSink()
    t = Transport(
        base_url=sim.url,
        token=alice.token,
        session=session,
        identity="alice",
        events=events,
        limiter=RateLimiter(rate=1000, burst=1000),
    )
    client = CoderClient(t, prefix="/api/v2", page_size=2)
    chats = await client.list_chats(labels={"team": "a b"}) + await client.list_chats()
    assert len(chats) == 5
    paths = [e["path"] for e in events.of_type("http:request")]
    assert paths[0] == "/api/v2/chats?limit=2&label=team%3Aa+b"
    assert paths[1] == "/api/v2/chats?limit=2"
    assert all(p.startswith("/api/v2/chats?limit=2&after_id=") for p in paths[2:])
    assert [e["path"] for e in events.of_type("http:response")] == paths


async def test_a_null_sink_builds_no_events(
    sim: Sim, session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a sink that keeps events (none given, or own_events off), a request builds
    no event at all; with one it builds its request and response events."""
    alice = sim.state.add_user("alice")
    built: list[str] = []
    emit = Transport._emit

    def counted(self: Transport, event: TransportEvent) -> None:
        built.append(str(own(event)["type"]))
        emit(self, event)

    monkeypatch.setattr(Transport, "_emit", counted)
    for events in (None, NullSink()):
        t = Transport(base_url=sim.url, token=alice.token, session=session, events=events)
        await t.request("GET", "/api/v2/chats", params=[("limit", "1")])
    assert built == []
    t = Transport(base_url=sim.url, token=alice.token, session=session, events=RecordingSink())
    await t.request("GET", "/api/v2/chats", params=[("limit", "1")])
    assert built == ["http:request", "http:response"]


async def test_every_event_of_watchds_own_traffic_passes_ingest_validation(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Requests that answer, fail at the server and fail to connect, a watch socket
    opened and closed, refused and undialable, and a redial: every event watchd's own
    transport emits is one the ingest endpoint accepts (chatId null on its watch socket)."""
    alice = sim.state.add_user("alice")
    events = RecordingSink()

    def transport(url: str, token: str) -> Transport:
        limiter = RateLimiter(rate=1000, burst=1000)
        return Transport(base_url=url, token=token, session=session, events=events, limiter=limiter)

    good = transport(sim.url, alice.token)
    await good.request("GET", "/api/v2/chats", params=[("limit", "1")])
    with pytest.raises(CoderError):
        await good.request("GET", f"/api/v2/chats/{UUID}")
    conn = await open_watch(good, "/api/v2", reader=1, attempt=1)
    await conn.close()
    with pytest.raises(CoderError):
        await open_watch(transport(sim.url, "not-a-token"), "/api/v2", reader=1, attempt=2)
    undialable = transport("http://127.0.0.1:1", alice.token)
    with pytest.raises(CoderError):
        await undialable.request("GET", "/api/v2/chats")
    with pytest.raises(CoderError):
        await open_watch(undialable, "/api/v2", reader=1, attempt=3)
    good.emit_ws(
        WsRedial,
        reader=1,
        attempt=3,
        consecutiveFailures=1,
        maxConsecutiveFailures=0,
        backoffMs=1000,
    )
    own_events = [e for _, e in events.events]
    assert {e["type"] for e in own_events} == set(RULES) - {
        "ws:event",
        "segment:start",
        "segment:settle",
    }
    assert [(e["type"], problem(e)) for e in own_events] == [(e["type"], None) for e in own_events]
    envelope = {"source": {"service": "watchd", "instance": "i"}, "events": own_events}
    body = json.dumps(envelope).encode()
    assert len(parse_batch(body, content_type="application/json", query={})) == len(own_events)


@pytest.mark.looptime
async def test_limiter_takes_tokens_in_turn_at_exact_times() -> None:
    """Callers get tokens at the bucket's times and in the order they asked, whether a
    token is there (taken at once) or not (queued behind those already waiting)."""
    limiter = RateLimiter(rate=2.0, burst=2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    got: list[tuple[str, float]] = []

    async def take(name: str, after: float) -> None:
        await asyncio.sleep(after)
        await limiter.acquire()
        got.append((name, round(loop.time() - start, 6)))

    await asyncio.gather(
        take("a", 0.0),
        take("b", 0.0),
        take("c", 0.0),  # the bucket is empty: waits half a second
        take("d", 0.0),  # behind c
        take("e", 0.75),  # c is done, d still waiting: e queues behind d
        take("f", 5.0),  # the bucket has refilled: at once
        take("g", 5.01),
        take("h", 5.02),  # empty again: the next token is due at 5.5
    )
    assert got == [
        ("a", 0.0),
        ("b", 0.0),
        ("c", 0.5),
        ("d", 1.0),
        ("e", 1.5),
        ("f", 5.0),
        ("g", 5.01),
        ("h", 5.5),
    ]
