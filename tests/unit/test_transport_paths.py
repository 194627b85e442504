"""The transport's per-request shortcuts against what they replace: the query text, the
limiter's lock-free take, no events built for nobody, the listing requests on the wire."""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

import aiohttp
import pytest

from tests.conftest import Sim
from watchd.coder.client import CoderClient
from watchd.coder.transport import Transport, query
from watchd.kits.ratelimit import RateLimiter
from watchd.telemetry.events import NullSink, RecordingSink

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

    def counted(self: Transport, event: dict[str, object]) -> None:
        built.append(str(event["type"]))
        emit(self, event)

    monkeypatch.setattr(Transport, "_emit", counted)
    for events in (None, NullSink()):
        t = Transport(base_url=sim.url, token=alice.token, session=session, events=events)
        await t.request("GET", "/api/v2/chats", params=[("limit", "1")])
    assert built == []
    t = Transport(base_url=sim.url, token=alice.token, session=session, events=RecordingSink())
    await t.request("GET", "/api/v2/chats", params=[("limit", "1")])
    assert built == ["http:request", "http:response"]


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
