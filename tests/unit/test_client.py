"""The REST client against the simulator: prefixes, paging, mutations, errors, retries."""

from __future__ import annotations

import random

import aiohttp
import pytest

from tests.conftest import Sim
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.transport import Transport
from watchd.kits.ratelimit import RateLimiter
from watchd.sim import scenarios
from watchd.sim.records import SimUser, Step
from watchd.telemetry.events import RecordingSink


def client_for(
    sim: Sim,
    user: SimUser,
    session: aiohttp.ClientSession,
    events: RecordingSink | None = None,
    **kw: object,
) -> CoderClient:
    transport = Transport(
        base_url=sim.url,
        token=user.token,
        session=session,
        identity=user.username,
        events=events,
        limiter=RateLimiter(rate=1000, burst=1000),
    )
    return CoderClient(transport, rng=random.Random(1), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("era", "prefix"),
    [
        ("A", "/api/experimental"),
        ("B", "/api/experimental"),
        ("C", "/api/experimental"),
        ("D", "/api/v2"),
        ("E", "/api/v2"),
    ],
)
async def test_prefix_probe_per_era(sim: Sim, session: aiohttp.ClientSession, prefix: str) -> None:
    """/api/v2 is tried first, /api/experimental second; the working one is cached."""
    alice = sim.state.add_user("alice")
    client = client_for(sim, alice, session)
    assert await client.resolve_prefix() == prefix
    requests = sim.state.requests
    await client.resolve_prefix()
    assert sim.state.requests == requests


@pytest.mark.parametrize("era", ["C"])
async def test_reprobe_after_server_upgrade(sim: Sim, session: aiohttp.ClientSession) -> None:
    """After an upgrade removes the experimental routes, a 404 re-probes and the call succeeds."""
    alice = sim.state.add_user("alice")
    sim.state.add_chat(alice, status="running")
    client = client_for(sim, alice, session)
    assert len(await client.list_chats()) == 1
    sim.state.set_era("E")
    assert len(await client.list_chats()) == 1
    assert client.prefix == "/api/v2"


async def test_listing_pages_dedupes_and_flattens(sim: Sim, session: aiohttp.ClientSession) -> None:
    """250 roots page in limit-100 pages; children arrive flattened; each chat once."""
    alice = sim.state.add_user("alice")
    bob = sim.state.add_user("bob")
    roots = [sim.state.add_chat(alice, title=f"r{i}", status="waiting", age=i) for i in range(250)]
    sim.state.add_chat(alice, title="child", status="running", parent=roots[3])
    sim.state.add_chat(bob, title="not mine")
    events = RecordingSink()
    chats = await client_for(sim, alice, session, events, page_size=100).list_chats()
    assert len(chats) == 251 and len({c.id for c in chats}) == 251
    assert any(c.parent_chat_id == roots[3].id for c in chats)
    pages = [e for e in events.of_type("http:request") if "/chats?" in e["path"]]
    assert len(pages) == 1 + 3  # the probe, then three pages
    assert "limit=1&" in pages[0]["path"] + "&"
    assert all("limit=100" in e["path"] for e in pages[1:])


@pytest.mark.parametrize("era", ["B"])
async def test_old_era_flat_listing(sim: Sim, session: aiohttp.ClientSession) -> None:
    """Era B lists children as top-level rows; the result is the same set."""
    alice = sim.state.add_user("alice")
    root = sim.state.add_chat(alice, status="running")
    sim.state.add_chat(alice, status="running", parent=root)
    chats = await client_for(sim, alice, session).list_chats()
    assert {c.id for c in chats} == {root.id, *[c.id for c in sim.state.chats.values()]}


async def test_archived_listing_on_request(sim: Sim, session: aiohttp.ClientSession) -> None:
    """Archived chats are excluded by default and listed with archived=True."""
    alice = sim.state.add_user("alice")
    a = sim.state.add_chat(alice, status="waiting")
    b = sim.state.add_chat(alice, status="waiting")
    sim.state.archive(b.id)
    client = client_for(sim, alice, session)
    assert [c.id for c in await client.list_chats()] == [a.id]
    assert [c.id for c in await client.list_chats(archived=True)] == [b.id]


async def test_get_chat_and_scope(sim: Sim, session: aiohttp.ClientSession) -> None:
    """GET returns queued_for_capacity; another user's chat is a permanent 404."""
    alice = sim.state.add_user("alice")
    bob = sim.state.add_user("bob")
    mine = sim.state.add_chat(alice, status="running", queued_for_capacity=True)
    theirs = sim.state.add_chat(bob, status="running")
    client = client_for(sim, alice, session)
    chat = await client.get_chat(mine.id)
    assert chat.queued_for_capacity is True
    with pytest.raises(CoderError) as err:
        await client.get_chat(theirs.id)
    assert err.value.status == 404 and not err.value.retryable
    assert "not found" in err.value.message.lower()


@pytest.mark.parametrize(("era", "idle_answer"), [("B", 200), ("E", 409)])
async def test_interrupt_semantics_per_era(
    sim: Sim, session: aiohttp.ClientSession, idle_answer: int
) -> None:
    """Newest servers answer 409 for idle chats and `interrupting` for running ones;
    older ones always 200 and set `waiting` directly."""
    alice = sim.state.add_user("alice")
    running = sim.state.add_chat(alice, status="running")
    idle = sim.state.add_chat(alice, status="waiting")
    client = client_for(sim, alice, session)
    after = await client.interrupt(running.id)
    assert after is not None
    assert after.status == ("interrupting" if idle_answer == 409 else "waiting")
    if idle_answer == 409:
        with pytest.raises(CoderError) as err:
            await client.interrupt(idle.id)
        assert err.value.status == 409 and "not in an interruptible state" in err.value.message
    else:
        assert await client.interrupt(idle.id) is not None


async def test_archive_rules_newest(sim: Sim, session: aiohttp.ClientSession) -> None:
    """Active → 409, child → 400, idle root → 204 (cascading), again → 400 already archived."""
    alice = sim.state.add_user("alice")
    root = sim.state.add_chat(alice, status="waiting")
    child = sim.state.add_chat(alice, status="waiting", parent=root)
    active = sim.state.add_chat(alice, status="running")
    client = client_for(sim, alice, session)
    with pytest.raises(CoderError) as err:
        await client.archive(active.id)
    assert err.value.status == 409
    with pytest.raises(CoderError) as err:
        await client.archive(child.id)
    assert err.value.status == 400 and "root chat" in err.value.message
    await client.archive(root.id)
    assert sim.state.chats[child.id].archived
    with pytest.raises(CoderError) as err:
        await client.archive(root.id)
    assert err.value.status == 400 and "already archived" in err.value.message


@pytest.mark.parametrize("era", ["A"])
async def test_archive_era_a_uses_post(sim: Sim, session: aiohttp.ClientSession) -> None:
    """On era A the client falls back to POST …/archive."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="completed")
    await client_for(sim, alice, session).archive(chat.id)
    assert sim.state.chats[chat.id].archived


async def test_identity_and_quota(sim: Sim, session: aiohttp.ClientSession) -> None:
    """users/me, organizations and quota; budget -1 and the OSS 404 are both handled."""
    alice = sim.state.add_user("alice", budget=100, consumed=40)
    bob = sim.state.add_user("bob")
    ca, cb = client_for(sim, alice, session), client_for(sim, bob, session)
    me = await ca.me()
    assert me.username == "alice" and me.organization_ids == (alice.org_id,)
    assert (await ca.organizations())[0]["id"] == alice.org_id
    q = await ca.workspace_quota(alice.org_id)
    assert q is not None and q.headroom == 60
    qb = await cb.workspace_quota(bob.org_id)
    assert qb is not None and qb.unlimited
    sim.state.faults.enterprise = False
    assert await ca.workspace_quota(alice.org_id) is None


async def test_workspace_build(sim: Sim, session: aiohttp.ClientSession) -> None:
    """A workspace's latest build status and error code are read."""
    alice = sim.state.add_user("alice")
    ws = sim.state.add_workspace(
        alice, build_status="failed", job_status="failed", error_code="INSUFFICIENT_QUOTA"
    )
    build = await client_for(sim, alice, session).workspace(ws.id)
    assert (build.status, build.error_code) == ("failed", "INSUFFICIENT_QUOTA")


async def test_the_demo_fleets_quota_failure_is_coderds_text_only_shape(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """The simulator's demo fails a build for quota as coderd does (the job's error text,
    no error_code), and the client reads it as failed for quota."""
    scenarios.demo(sim.state)
    ws = next(w for w in sim.state.workspaces.values() if w.build_status == "failed")
    owner = next(u for u in sim.state.users.values() if u.id == ws.owner_id)
    build = await client_for(sim, owner, session).workspace(ws.id)
    assert (build.error_code, build.error) == ("", "insufficient quota") and build.quota_failed


async def test_bad_token_is_permanent_401(sim: Sim, session: aiohttp.ClientSession) -> None:
    """A revoked token is a 401, classified permanent, and never retried."""
    alice = sim.state.add_user("alice")
    sim.state.revoke("alice")
    client = client_for(sim, alice, session)
    before = sim.state.requests
    with pytest.raises(CoderError) as err:
        await client.list_chats()
    assert err.value.status == 401 and err.value.is_auth and not err.value.retryable
    assert sim.state.requests - before == 1


async def test_5xx_is_retried_until_success(sim: Sim, session: aiohttp.ClientSession) -> None:
    """Transient 5xx answers are retried with backoff and the call succeeds."""
    alice = sim.state.add_user("alice")
    sim.state.add_chat(alice)
    sim.state.faults.error_rate = 0.5
    sim.state.rng.seed(11)
    client = client_for(sim, alice, session, attempts=10)
    assert len(await client.list_chats()) == 1


async def test_429_waits_at_least_retry_after(sim: Sim, session: aiohttp.ClientSession) -> None:
    """A 429 with Retry-After is retried no sooner than the server asked."""
    alice = sim.state.add_user("alice")
    sim.state.faults.throttle_next = 1
    sim.state.faults.throttle_retry_after = 1.0
    events = RecordingSink()
    client = client_for(sim, alice, session, events)
    await client.resolve_prefix()
    responses = events.of_type("http:response")
    requests = events.of_type("http:request")
    assert [r["status"] for r in responses] == [429, 200]
    assert requests[1]["timestamp"] - responses[0]["timestamp"] >= 1000


async def test_network_error_is_retryable(session: aiohttp.ClientSession) -> None:
    """A refused connection is a retryable network error with no HTTP status."""
    transport = Transport(base_url="http://127.0.0.1:9", token="x" * 20, session=session)
    client = CoderClient(transport, attempts=1)
    with pytest.raises(CoderError) as err:
        await client.resolve_prefix()
    assert err.value.status is None and err.value.retryable


async def test_pagination_validation_is_strict(sim: Sim, session: aiohttp.ClientSession) -> None:
    """The simulator rejects a negative or over-int32 limit, bare words in q, unknown keys."""
    alice = sim.state.add_user("alice")
    t = Transport(base_url=sim.url, token=alice.token, session=session)
    for params in (
        [("limit", "-1")],
        [("limit", "2147483648")],
        [("q", "stuck")],
        [("q", "status:running")],
        [("after_id", "not-a-uuid")],
    ):
        with pytest.raises(CoderError) as err:
            await t.request("GET", "/api/v2/chats", params=params)
        assert err.value.status == 400


async def test_non_json_listing_is_a_payload_error(session: aiohttp.ClientSession) -> None:
    """A proxy answering 200 with HTML yields a PayloadError naming the listing."""
    from aiohttp import web

    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>login</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/api/v2/chats", html)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        t = Transport(base_url=f"http://127.0.0.1:{port}", token="x" * 20, session=session)
        with pytest.raises(PayloadError, match="chats"):
            await CoderClient(t).list_chats()
    finally:
        await runner.cleanup()


async def test_token_only_in_header_never_in_events(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """The token travels in Coder-Session-Token only; no transport event carries it."""
    alice = sim.state.add_user("alice")
    sim.state.add_chat(alice, status="running", script=[Step("running", 0.05), Step("waiting")])
    events = RecordingSink()
    client = client_for(sim, alice, session, events)
    chats = await client.list_chats()
    await client.get_chat(chats[0].id)
    sim.state.revoke("alice")
    with pytest.raises(CoderError) as err:
        await client.get_chat(chats[0].id)
    assert alice.token not in str(err.value)
    assert events.events and all(alice.token not in repr(e) for _, e in events.events)


async def test_listing_pages_carry_compared_fields_only(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """chat_pages pages exactly as chat_rows does, with each row's compared fields decoded
    and nothing decoded in full until asked."""
    alice = sim.state.add_user("alice")
    roots = [sim.state.add_chat(alice, title=f"r{i}", status="waiting", age=i) for i in range(7)]
    sim.state.add_chat(alice, title="child", status="running", parent=roots[2])
    client = client_for(sim, alice, session, page_size=3)
    pages = [p async for p in client.chat_pages()]
    rows = [r async for r in client.chat_rows()]
    assert [p.ids for p in pages] == [[r["id"] for r in page] for page in rows]
    assert all(p.rows is not None and p._full is None for p in pages)
    assert [p.full() for p in pages] == rows
    assert any(r.children for p in pages for r in p.rows or ())


async def test_a_listing_row_without_an_id_is_named(session: aiohttp.ClientSession) -> None:
    """A row with an empty or missing id fails the page with a PayloadError naming the
    row, whichever path reads it."""
    from aiohttp import web

    bodies = [
        b'[{"id":"c1","status":"running"},{"id":"","status":"running"}]',
        b'[{"id":"c1","status":"running"},{"status":"running","title":5}]',
    ]

    async def chats(request: web.Request) -> web.Response:
        return web.Response(body=bodies[int(request.query["label"].removeprefix("n:"))])

    app = web.Application()
    app.router.add_get("/api/v2/chats", chats)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        t = Transport(base_url=f"http://127.0.0.1:{port}", token="x" * 20, session=session)
        for n in range(len(bodies)):
            client = CoderClient(t, prefix="/api/v2")
            client.page_size = 10
            with pytest.raises(PayloadError, match=r"chats\[1\]\.id"):
                async for _ in client.chat_pages(labels={"n": str(n)}):
                    pass
    finally:
        await runner.cleanup()
