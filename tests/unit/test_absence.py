"""Absence is not deletion: listings that prove (or fail to prove) they were complete, chats
the moving cursor skips, confirmation by GET, the capacity flag that clears, refusals."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web

from tests.conftest import Sim
from tests.unit.test_client import client_for
from tests.unit.test_watching import eventually, watching
from watchd.coder.client import CoderClient, Listing
from watchd.coder.errors import CoderError
from watchd.coder.observing import ChatId, Observation
from watchd.coder.transport import Transport
from watchd.config.watching import Budgets
from watchd.detection.detector import Detector
from watchd.detection.diagnosis import Facts, hint
from watchd.kits.clock import ServerClock
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.rows import ChatRows
from watchd.store.sqlite import StateFile
from watchd.watching.reconciling import ABSENT_GET_LIMIT
from watchd.watching.settings import WatchSettings
from watchd.watching.watcher import IdentityWatcher

# The server-clock estimate moves by fractions of a second as Date samples arrive, and a
# chat seen "after a listing started" is spared by it: listings here are a second apart,
# as real ones (a minute apart) always are (on the virtual clock: no wall time passes).
APART = 1.1


@pytest.mark.looptime
async def test_a_chat_the_cursor_skips_keeps_its_record_and_clock(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A running chat bumped while every listing pages (so every sweep misses it) is
    confirmed by GET each time and keeps its record, clock and clock source."""
    alice = sim.state.add_user("alice")
    moving = sim.state.add_chat(alice, status="running", age=500)
    others = [sim.state.add_chat(alice, status="waiting", age=10) for _ in range(7)]
    async with watching(sim, alice, session) as r:
        r.watcher.client.page_size = 3
        await eventually(lambda: r.health.ready)
        before = r.store.get("alice", moving.id)
        assert before is not None
        sim.state.bump_after_page[moving.id] = 1
        for other in others:
            sim.state.bump_after_page[other.id] = 0
        for _ in range(3):
            await asyncio.sleep(APART)
            await r.watcher.relist()
            assert r.health.last_list_pages >= 3
            assert r.store.absent("alice") == {moving.id: 1}
            await r.watcher.reconciler.confirm_absent()
            rec = r.store.get("alice", moving.id)
            assert rec is not None and (rec.since, rec.clock) == (before.since, before.clock)
            assert r.store.absent("alice") == {}
        assert r.health.absent_confirms == 3


@pytest.mark.looptime
async def test_a_deleted_chat_is_gone_only_after_a_404(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A hard-deleted running chat stays while merely absent and is tombstoned as
    gone (404) once the GET confirms it."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        sim.state.delete(chat.id)
        await asyncio.sleep(APART)
        await r.watcher.relist()
        assert r.store.get("alice", chat.id) is not None
        await r.watcher.reconciler.confirm_absent()
        assert r.store.get("alice", chat.id) is None and r.store.absent("alice") == {}


@pytest.mark.looptime
async def test_an_archive_whose_event_was_lost_is_found_by_the_get(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A chat archived without its watch event (a dropped NOTIFY) leaves the listing; the
    GET says archived and the chat is tombstoned."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="waiting")
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        sim.state.chats[chat.id].archived = True  # the deleted event never arrived
        await asyncio.sleep(APART)
        await r.watcher.relist()
        assert r.store.get("alice", chat.id) is not None
        await r.watcher.reconciler.confirm_absent()
        assert r.store.get("alice", chat.id) is None


@pytest.mark.looptime
async def test_many_idle_chats_missing_wait_for_a_second_listing(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A mass deletion of idle chats costs no GET storm: they stay through one listing and
    are tombstoned when the second complete listing lacks them too."""
    alice = sim.state.add_user("alice")
    idle = [sim.state.add_chat(alice, status="waiting") for _ in range(30)]
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        for chat in idle:
            sim.state.delete(chat.id)
        await asyncio.sleep(APART)
        await r.watcher.relist()
        assert len(r.store.absent("alice")) == 30 and not r.watcher.reconciler.to_confirm
        assert all(r.store.get("alice", c.id) is not None for c in idle)
        await asyncio.sleep(APART)
        await r.watcher.relist()
        assert all(r.store.get("alice", c.id) is None for c in idle)


async def _scripted(pages: dict[str | None, list[dict[str, str]]]) -> web.AppRunner:
    async def chats(request: web.Request) -> web.Response:
        return web.json_response(pages.get(request.query.get("after_id"), pages[None]))

    app = web.Application()
    app.router.add_get("/api/v2/chats", chats)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def _rows(*ids: str) -> list[dict[str, str]]:
    return [{"id": i, "status": "waiting", "updated_at": "2026-11-29T10:00:00Z"} for i in ids]


@pytest.mark.parametrize(
    ("pages", "why"),
    [
        ({None: _rows("a", "b")}, "already seen"),  # ignores after_id: page 1 again
        ({None: _rows("a", "b"), "b": _rows("b", "a")}, "already seen"),
    ],
)
async def test_a_listing_that_does_not_progress_is_incomplete(
    session: aiohttp.ClientSession, pages: dict[str | None, list[dict[str, str]]], why: str
) -> None:
    """A server that serves rows already seen instead of moving on makes the listing
    incomplete, and the watcher infers no absence from it."""
    runner = await _scripted(pages)
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        client = CoderClient(
            Transport(base_url=url, token="t", session=session), prefix="/api/v2", page_size=2
        )
        listing = Listing()
        got = [rows async for rows in client.chat_rows(listing=listing)]
        assert not listing.complete and why in listing.incomplete
        assert len(got) == 2 and client.incomplete_listings == 1
    finally:
        await runner.cleanup()


async def test_an_empty_page_after_a_full_one_walks_the_cursor_back(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """The cursor chat deleted mid-sweep makes coderd answer an empty page; the client asks
    again from an earlier row and the listing still completes with every chat."""
    alice = sim.state.add_user("alice")
    chats = [sim.state.add_chat(alice, status="waiting", age=50 - i) for i in range(5)]
    client = client_for(sim, alice, session, page_size=2)
    listing = Listing()
    ids: list[str] = []
    async for rows in client.chat_rows(listing=listing):
        if not ids:
            sim.state.delete(rows[-1]["id"])  # the cursor chat vanishes between pages
        ids += [r["id"] for r in rows]
    assert listing.complete
    assert {c.id for c in chats} <= set(ids)


async def test_a_short_listing_is_complete(sim: Sim, session: aiohttp.ClientSession) -> None:
    """An ordinary listing that ends in a short page is complete, even at an exact multiple
    of the page size (the empty last page is not mistaken for a deleted cursor)."""
    alice = sim.state.add_user("alice")
    for _ in range(4):
        sim.state.add_chat(alice, status="waiting")
    listing = Listing()
    client = client_for(sim, alice, session, page_size=2)
    rows = [r async for page in client.chat_rows(listing=listing) for r in page]
    assert listing.complete and len({r["id"] for r in rows}) == 4


async def test_capacity_flag_omitted_on_get_clears_the_learned_flag(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A GET that omits queued_for_capacity (coderd's bool,omitempty) reads as false: a flag
    learned earlier clears, and the stuck hint is no longer the capacity hint."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running", queued_for_capacity=True)
    client = client_for(sim, alice, session)
    store = ChatStore()
    store.observe("a", await client.get_chat(chat.id), now=1.0, via="confirm")
    rec = store.get("a", chat.id)
    assert rec is not None and rec.queued_for_capacity is True
    assert "concurrency cap" in hint(Facts(record=rec))
    sim.state.chats[chat.id].queued_for_capacity = False
    got = await client.get_chat(chat.id)
    assert got.queued_for_capacity is False
    store.observe("a", got, now=2.0, via="confirm")
    rec = store.get("a", chat.id)
    assert rec is not None and rec.queued_for_capacity is False
    assert "concurrency cap" not in hint(Facts(record=rec))


def test_state_written_by_an_older_build_loads(tmp_path: Path) -> None:
    """A chats table without the details column (0.1) is migrated in place; its rows load
    with their clocks and capacity flag, and new writes carry the new fields."""
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE chats (identity TEXT NOT NULL, chat_id TEXT NOT NULL, status TEXT NOT "
        "NULL, since REAL NOT NULL, clock TEXT NOT NULL, updated_at REAL, seen_at REAL NOT "
        "NULL, owner TEXT, title TEXT, workspace_id TEXT, parent_id TEXT, labels TEXT, "
        "last_error TEXT, queued INTEGER, version INTEGER NOT NULL, "
        "PRIMARY KEY (identity, chat_id)) WITHOUT ROWID"
    )
    db.execute(
        "INSERT INTO chats VALUES ('a','c1','running',100.0,'transition',100.0,101.0,"
        "'alice','t',NULL,NULL,'[]',NULL,1,3)"
    )
    db.commit()
    db.close()
    state = StateFile(path)
    try:
        (rec,) = state.part(ChatRows).load()
        assert (rec.since, rec.clock, rec.queued_for_capacity, rec.version) == (
            100.0,
            "transition",
            True,
            3,
        )
        assert rec.mode == "" and rec.warnings == ()
        moved = msgspec.structs.replace(rec, mode="orchestrator", warnings=("slow",))
        state.part(ChatRows).mark(moved)
        state.flush()
        (again,) = state.part(ChatRows).load()
        assert again.mode == "orchestrator" and again.warnings == ("slow",)
    finally:
        state.close()


class _Sink:
    def __init__(self) -> None:
        self.alerts: list[object] = []

    def put(self, alert: object) -> None:
        self.alerts.append(alert)


async def test_a_confirmed_refusal_fires_without_the_outage_grace() -> None:
    """An identity whose token was refused twice raises IdentityUnhealthy at once; one that
    is merely unreachable waits for unhealthy_after."""
    sink = _Sink()
    det = Detector(store=ChatStore(), sink=sink)  # type: ignore[arg-type]
    refused = IdentityHealth(
        name="r", deployment="http://x", server_clock=ServerClock(), unhealthy_after=120
    )
    down = IdentityHealth(
        name="d", deployment="http://x", server_clock=ServerClock(), unhealthy_after=120
    )

    class NoConfirm:
        async def reread(self, chat_id: str) -> object:
            raise AssertionError

    for h in (refused, down):
        det.register(h, confirmer=NoConfirm(), budgets=Budgets(), labels={})  # type: ignore[arg-type]
    refused.set_state("auth_failed", error="HTTP 401: API key expired.")
    refused.refused = True
    down.set_state("unreachable", error="HTTP 503")
    det.identity_watch.tick()
    names = [(a.labels["alertname"], a.labels["identity"]) for a in sink.alerts]  # type: ignore[attr-defined]
    assert names == [("IdentityUnhealthy", "r")]
    for name in ("r", "d"):
        await det.unregister(name, reason="test over")


async def test_a_revoked_token_is_noticed_through_the_next_rest_call(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """coderd leaves the open socket alone; the next REST call's 401 ends the session, one
    retry confirms it, and the identity is marked refused."""
    alice = sim.state.add_user("alice")
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        sim.state.revoke("alice")
        with pytest.raises(CoderError):
            await r.watcher.relist()
        await eventually(lambda: r.health.refused, within=5)
        assert r.health.state == "auth_failed" and "401" in r.health.last_error


@pytest.mark.looptime
async def test_a_busy_stream_during_the_first_listing_keeps_dirty_ids(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Past the event buffer during a slow listing, the watcher keeps the ids of the chats
    that changed and re-reads them after, instead of dropping the stream and relisting
    forever; the identity becomes ready on the first try."""
    from dataclasses import replace

    from tests.unit.test_watching import FAST

    alice = sim.state.add_user("alice")
    chats = [sim.state.add_chat(alice, status="running", publish=False) for _ in range(12)]
    sim.state.faults.latency = 1.0
    async with watching(sim, alice, session, replace(FAST, buffer_limit=5)) as r:
        await eventually(lambda: sim.state.subscribers, within=10)
        for c in chats:
            sim.state.set_status(c.id, "waiting")
        await eventually(lambda: r.health.ready, within=10)
        sim.state.faults.latency = 0.0
        assert r.health.overflow == 1 and r.health.reconnects == 0
        assert set(r.watcher.reconciler.to_confirm) == {c.id for c in chats}
        await r.watcher.reconciler.confirm_absent()
        assert all(r.store.get("alice", c.id).status == "waiting" for c in chats)  # type: ignore[union-attr]


@pytest.mark.looptime
async def test_a_deployment_without_date_headers_is_said_once(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Answers without a usable Date header are counted by the server clock, and the
    watcher says so once, not on every listing; stamps ahead of the clock are said once."""
    from structlog.testing import capture_logs

    clock = ServerClock()
    clock.observe(None, sent_at=1.0, received_at=1.1)
    clock.observe("not a date", sent_at=1.0, received_at=1.1)
    assert clock.missing_date == 2 and clock.offset == 0.0
    alice = sim.state.add_user("alice")
    sim.state.add_chat(alice, status="waiting")
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        r.health.server_clock.missing_date += 2
        r.store.future_clamped["alice"] = 1
        with capture_logs() as logs:
            for _ in range(3):
                await asyncio.sleep(APART)
                await r.watcher.relist()
        events = [e["event"] for e in logs]
        assert events.count("clock.no_date_header") == 1
        assert events.count("clock.disagrees") == 1


@pytest.mark.looptime
async def test_phantom_chats_retire_in_bulk_whatever_their_status(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Thousands of chats only ever seen in watch events (statuses this build does not
    know) cost no GET each: a second complete listing that lacks them retires them in one
    pass; an active chat among them is still confirmed by GET (the moving cursor)."""
    alice = sim.state.add_user("alice")
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        now = r.health.server_clock.now()
        for i in range(ABSENT_GET_LIMIT * 2):
            phantom = Observation(id=ChatId(f"p{i}"), status="hibernating", updated_at=now)
            r.store.observe("alice", phantom, now=now, via="watch", kind="status_change")
        running = Observation(id=ChatId("p-run"), status="running", updated_at=now)
        r.store.observe("alice", running, now=now, via="watch", kind="status_change")
        await asyncio.sleep(APART)
        await r.watcher.relist()
        assert set(r.watcher.reconciler.to_confirm) == {"p-run"}
        assert len(r.store.absent("alice")) == ABSENT_GET_LIMIT * 2 + 1
        await asyncio.sleep(APART)
        await r.watcher.relist()
        left = {rec.chat_id for rec in r.store.records("alice")}
        assert left == {"p-run"}


async def test_an_incomplete_listing_says_so_in_the_identitys_last_error(
    session: aiohttp.ClientSession,
) -> None:
    """A listing that cannot prove it covered everything leaves its reason in the
    identity's last_error (not an empty one), beside the incomplete_listings count."""
    runner = await _scripted({None: _rows("a", "b")})
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        health = IdentityHealth(
            name="x", deployment=url, server_clock=ServerClock(), unhealthy_after=60
        )
        client = CoderClient(
            Transport(base_url=url, token="t", session=session), prefix="/api/v2", page_size=2
        )
        w = IdentityWatcher(
            health=health,
            client=client,
            store=ChatStore(),
            changes=Detector(store=ChatStore(), sink=None),  # type: ignore[arg-type]
            listing_gate=asyncio.Semaphore(1),
            settings=WatchSettings(),
        )
        await w.relist()
        assert health.incomplete_listings == 1
        assert health.last_error.startswith("listing incomplete: ")
    finally:
        await runner.cleanup()
