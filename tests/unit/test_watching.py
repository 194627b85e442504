"""The watch stream and the per-identity watcher against the simulator."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import aiohttp
import pytest
import structlog.testing

from tests.conftest import Sim
from watchd.alerting.model import Alert
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError
from watchd.coder.observing import WatchEvent
from watchd.coder.transport import Transport
from watchd.coder.watchstream import ResyncNeeded, open_watch
from watchd.config.watching import Budgets
from watchd.detection.detector import Detector
from watchd.detection.diagnosis import Facts, hint
from watchd.kits.backoff import Backoff
from watchd.kits.clock import LoopClock, ServerClock
from watchd.kits.ratelimit import RateLimiter
from watchd.sim.records import SimUser
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import Change
from watchd.telemetry.events import Event, EventSource, RecordingSink
from watchd.watching.reconciling import CAPACITY_READ_RATE, CAPACITY_READS_MAX
from watchd.watching.settings import WatchSettings
from watchd.watching.watcher import IdentityWatcher

FAST = WatchSettings(
    reconcile_interval=3600,
    heartbeat=2.0,
    backoff_base=0.05,
    backoff_cap=0.4,
    healthy_after=5.0,
    auth_retry=0.3,
    auth_confirm_after=0.2,
)


async def eventually(cond: object, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not cond():  # type: ignore[operator]
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def transport(
    sim: Sim, user: SimUser, session: aiohttp.ClientSession, events: RecordingSink | None = None
) -> Transport:
    return Transport(
        base_url=sim.url,
        token=user.token,
        session=session,
        identity=user.username,
        events=events,
        limiter=RateLimiter(rate=1000, burst=1000),
        server_clock=ServerClock(LoopClock()),
    )


@pytest.mark.parametrize("era", ["A", "C", "E"])
async def test_frames_decode_in_every_era(sim: Sim, session: aiohttp.ClientSession) -> None:
    """Events arrive decoded whatever the era's framing; era A's JSON pings are skipped."""
    sim.state.ping_interval = 0.3
    alice = sim.state.add_user("alice")
    t = transport(sim, alice, session)
    prefix = await CoderClient(t).resolve_prefix()
    conn = await open_watch(t, prefix, reader=1, attempt=1)
    got: asyncio.Queue[WatchEvent] = asyncio.Queue()
    # Keep reading (as the watcher does) so protocol pings are answered.
    pump = asyncio.ensure_future(conn.pump(lambda events: [got.put_nowait(e) for e in events]))
    await asyncio.sleep(0.7)
    chat = sim.state.add_chat(alice, status="running")
    sim.state.set_status(chat.id, "waiting")
    first = await asyncio.wait_for(got.get(), 2)
    second = await asyncio.wait_for(got.get(), 2)
    assert (first.kind, second.kind, second.chat.status) == ("created", "status_change", "waiting")
    pump.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pump
    await conn.close()


async def test_malformed_frame_asks_for_resync(sim: Sim, session: aiohttp.ClientSession) -> None:
    """A frame that cannot be decoded raises ResyncNeeded instead of crashing."""
    alice = sim.state.add_user("alice")
    t = transport(sim, alice, session)
    conn = await open_watch(t, "/api/v2", reader=1, attempt=1)
    sim.state.faults.malformed_next = 1
    sim.state.add_chat(alice)
    with pytest.raises(ResyncNeeded):
        await asyncio.wait_for(conn.pump(lambda events: None), 2)
    await conn.close()


async def test_upgrade_refusals_carry_the_status(sim: Sim, session: aiohttp.ClientSession) -> None:
    """A bad token gets HTTP 401 on the upgrade; a missing route 404."""
    alice = sim.state.add_user("alice")
    sim.state.revoke("alice")
    with pytest.raises(CoderError) as err:
        await open_watch(transport(sim, alice, session), "/api/v2", reader=1, attempt=1)
    assert err.value.status == 401
    bob = sim.state.add_user("bob")
    with pytest.raises(CoderError) as err:
        await open_watch(transport(sim, bob, session), "/api/experimental", reader=1, attempt=1)
    assert err.value.status == 404


@pytest.mark.looptime
async def test_protocol_pings_keep_a_quiet_socket_alive(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """With server pings every 200 ms, the quiet socket survives and we never send data."""
    sim.state.ping_interval = 0.2
    alice = sim.state.add_user("alice")
    conn = await open_watch(transport(sim, alice, session), "/api/v2", reader=1, attempt=1)
    reading = asyncio.ensure_future(conn.pump(lambda events: None))
    await asyncio.sleep(1.0)
    assert not conn.ws.closed and not reading.done()
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    await conn.close()
    assert sim.state.client_data_frames == 0


class TimedSink(RecordingSink):
    """Records each transport event with the loop time it was emitted at."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def emit(self, source: EventSource, event: Event) -> None:
        super().emit(source, event)
        self.at.append(round(asyncio.get_running_loop().time(), 6))

    def times_of(self, kind: str) -> list[float]:
        return [t for t, (_, e) in zip(self.at, self.events, strict=True) if e["type"] == kind]


@dataclass
class Rig:
    watcher: IdentityWatcher
    health: IdentityHealth
    store: ChatStore
    events: TimedSink
    alerts: list[Alert]


@contextlib.asynccontextmanager
async def watching(
    sim: Sim, user: SimUser, session: aiohttp.ClientSession, settings: WatchSettings = FAST
) -> AsyncIterator[Rig]:
    events = TimedSink()
    t = transport(sim, user, session, events)
    store = ChatStore()
    alerts: list[Alert] = []

    class Sink:
        def put(self, alert: Alert) -> None:
            alerts.append(alert)

    det = Detector(store=store, sink=Sink(), confirm_rate=50)
    health = IdentityHealth(
        name=user.username, deployment=sim.url, server_clock=t.server_clock, unhealthy_after=60
    )
    w = IdentityWatcher(
        health=health,
        client=CoderClient(t),
        store=store,
        changes=det,
        listing_gate=asyncio.Semaphore(2),
        settings=settings,
        token_provider=lambda: user.token,
        rng=random.Random(2),
    )
    det.register(health, confirmer=w.rereads, budgets=Budgets(running=3600), labels={})
    tasks = [asyncio.create_task(w.watch_forever()), asyncio.create_task(det.run())]
    try:
        yield Rig(w, health, store, events, alerts)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await det.unregister(user.username, reason="test over")


async def test_seed_then_stream(sim: Sim, session: aiohttp.ClientSession) -> None:
    """The watcher seeds from a listing, becomes ready, then applies stream events."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        assert r.store.get("alice", chat.id) is not None
        sim.state.set_status(chat.id, "waiting")
        await eventually(lambda: r.store.get("alice", chat.id).status == "waiting")  # type: ignore[union-attr]
        assert r.store.get("alice", chat.id).clock == "transition"  # type: ignore[union-attr]
        types = [e["type"] for _, e in r.events.events]
        listing = next(
            i
            for i, (_, e) in enumerate(r.events.events)
            if e["type"] == "http:request" and "limit=500" in e["path"]
        )
        assert types.index("ws:open") < listing, "the socket opens before the seed listing"


@pytest.mark.looptime
async def test_events_during_listing_are_buffered(sim: Sim, session: aiohttp.ClientSession) -> None:
    """A transition published while the seed listing is in flight is applied after it."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    await CoderClient(transport(sim, alice, session)).resolve_prefix()
    sim.state.faults.latency = 0.4
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.state == "seeding")
        await asyncio.sleep(0.05)
        # The listing will show `running` (it was answered before), the stream `waiting`.
        sim.state.set_status(chat.id, "waiting")
        late = sim.state.add_chat(alice, status="running")
        await eventually(lambda: r.health.ready)
        sim.state.faults.latency = 0
        await eventually(lambda: r.store.get("alice", chat.id).status == "waiting")  # type: ignore[union-attr]
        assert r.store.get("alice", late.id) is not None


async def test_capacity_change_is_read_to_learn_the_flag(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """capacity_change (a list row: no flag, same updated_at) makes the watcher GET the
    chat once, so the store learns it was queued, and then that it was admitted."""
    alice = sim.state.add_user("alice")
    first = sim.state.add_chat(alice, status="running")
    async with watching(sim, alice, session) as r:
        reconcile = asyncio.create_task(r.watcher.reconcile_forever())
        try:
            await eventually(lambda: r.health.ready)
            sim.state.faults.capacity_roots = 1
            queued = sim.state.add_chat(alice, status="running")

            def flag() -> bool | None:
                rec = r.store.get("alice", queued.id)
                return None if rec is None else rec.queued_for_capacity

            await eventually(lambda: flag() is True)
            stamp = r.store.get("alice", queued.id).updated_at  # type: ignore[union-attr]
            sim.state.set_status(first.id, "waiting")
            await eventually(lambda: flag() is False)
            assert r.store.get("alice", queued.id).updated_at == stamp  # type: ignore[union-attr]
        finally:
            reconcile.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconcile


@pytest.mark.looptime
async def test_capacity_reads_learn_two_hundred_flags_paced_within_the_documented_time(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """200 running chats queued before watchd watched (so no capacity_change reached it):
    asked for their flags, the reconciler reads each by GET at CAPACITY_READ_RATE, every
    flag learned within 200/rate seconds (+1), never faster than the pace; past
    CAPACITY_READS_MAX waiting, the rest are counted as dropped, logged once while the
    queue stays full."""
    alice = sim.state.add_user("alice")
    sim.state.faults.capacity_roots = 0
    chats = [sim.state.add_chat(alice, status="running") for _ in range(200)]
    sim.state.tick()
    assert all(c.queued_for_capacity for c in chats)
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        assert all(r.store.get("alice", c.id).queued_for_capacity is None for c in chats)  # type: ignore[union-attr]
        reconcile = asyncio.create_task(r.watcher.reconcile_forever())
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            r.watcher.rereads.learn_capacity([c.id for c in chats])
            await eventually(
                lambda: all(r.store.get("alice", c.id).queued_for_capacity for c in chats),  # type: ignore[union-attr]
                within=60,
            )
            took = loop.time() - started
            assert (200 - 1) / CAPACITY_READ_RATE <= took <= 200 / CAPACITY_READ_RATE + 1
            with structlog.testing.capture_logs() as logged:
                r.watcher.rereads.learn_capacity([f"x{i}" for i in range(CAPACITY_READS_MAX + 7)])
                for page in range(3):  # a burst asks page by page: one line, all counted
                    r.watcher.rereads.learn_capacity([f"y{page}-{i}" for i in range(5)])
            assert r.health.capacity_reads_dropped == 7 + 15
            assert [e["chats"] for e in logged if e["event"] == "capacity.reads_dropped"] == [7]
        finally:
            reconcile.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconcile


@pytest.mark.parametrize("silent", [False, True], ids=["event", "listing"])
async def test_a_transition_stamped_after_the_server_clock_stepped_back_is_read_again(
    sim: Sim, session: aiohttp.ClientSession, silent: bool
) -> None:
    """The server's clock steps back 3 s between two transitions, so the second carries an
    older updated_at than the first: its event (or, when it sent none, the listing row)
    looks stale, so the chat is read again, and the read starts the new clock at the
    transition's own stamp instead of waiting for updated_at to pass the old one."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="waiting")
    async with watching(sim, alice, session) as r:
        reconcile = asyncio.create_task(r.watcher.reconcile_forever())
        try:
            await eventually(lambda: r.health.ready)
            sim.state.set_status(chat.id, "error")
            await eventually(lambda: r.store.get("alice", chat.id).status == "error")  # type: ignore[union-attr]
            sim.state.clock_offset -= 3.0
            sim.state.set_status(chat.id, "running", silent=silent)
            stamp = sim.state.chats[chat.id].updated_at
            if silent:
                await r.watcher.relist()
            await eventually(lambda: r.store.get("alice", chat.id).status == "running")  # type: ignore[union-attr]
            assert r.store.get("alice", chat.id).since == pytest.approx(stamp, abs=1e-5)  # type: ignore[union-attr]
        finally:
            reconcile.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconcile


async def test_reconnect_after_drop_reseeds(sim: Sim, session: aiohttp.ClientSession) -> None:
    """A dropped socket is redialed and the identity reseeded, catching missed changes."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        relists = r.health.relists
        sim.state.drop_watch(code=1006)
        sim.state.set_status(chat.id, "waiting", silent=True)
        await eventually(lambda: r.health.relists > relists and r.health.ready)
        assert r.store.get("alice", chat.id).status == "waiting"  # type: ignore[union-attr]
        assert r.store.get("alice", chat.id).clock == "synthesized"  # type: ignore[union-attr]
        assert r.health.reconnects >= 1


@pytest.mark.looptime
async def test_redial_backoff_grows_while_the_server_is_down(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """While the watch upgrade fails, each redial waits exactly the next backoff (50 ms
    doubling to the 400 ms cap, jittered by the seeded RNG), then the identity recovers
    (no fallback to polling here: test_a_refused_watch_stream_falls_back_to_polling)."""
    alice = sim.state.add_user("alice")
    sim.state.faults.subscribe_fail = True
    no_polling = dataclasses.replace(FAST, poll_after=1_000)
    async with watching(sim, alice, session, no_polling) as r:
        await asyncio.sleep(2.0)
        assert r.health.state == "unreachable" and "500" in r.health.last_error
        sim.state.faults.subscribe_fail = False
        await eventually(lambda: r.health.ready, within=1)
        redials = r.events.times_of("ws:redial")
        upgrades = r.events.times_of("ws:open")
        expected = Backoff(base=FAST.backoff_base, cap=FAST.backoff_cap, rng=random.Random(2))
        waits = [expected.next() for _ in redials]
        delays = [e["backoffMs"] for e in r.events.of_type("ws:redial")]
        assert delays == [round(w * 1000) for w in waits]
        assert max(delays) <= FAST.backoff_cap * 1.2 * 1000 and len(delays) >= 6
        # Each dial happens exactly the previous redial's wait after it: the failed dials
        # take no loop time, so dial k+1 is at the sum of the first k waits.
        dials = r.events.times_of("ws:dial")
        assert dials[0] == 0.0 and len(dials) == len(redials) + 1
        for dial, redial, wait in zip(dials[1:], redials, waits, strict=True):
            assert dial == pytest.approx(redial + wait, abs=2e-6)  # to the µs (rounding)
        assert upgrades == [dials[-1]]


async def test_malformed_frame_triggers_relist(sim: Sim, session: aiohttp.ClientSession) -> None:
    """After a garbage frame the watcher drops the socket, relists and is ready again."""
    alice = sim.state.add_user("alice")
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        relists = r.health.relists
        sim.state.faults.malformed_next = 1
        sim.state.add_chat(alice)
        await eventually(lambda: r.health.relists > relists and r.health.ready)
        assert r.health.malformed == 1


async def test_auth_failure_is_contained_and_heals(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A revoked identity goes auth_failed while another keeps working; a new token heals it."""
    alice = sim.state.add_user("alice")
    bob = sim.state.add_user("bob")
    sim.state.revoke("bob")
    async with watching(sim, alice, session) as ra, watching(sim, bob, session) as rb:
        await eventually(lambda: ra.health.ready and rb.health.state == "auth_failed")
        chat = sim.state.add_chat(alice, status="running")
        await eventually(lambda: ra.store.get("alice", chat.id) is not None)
        assert "401" in rb.health.last_error
        bob.revoked = False  # the operator rotated the token (here: un-revoked it)
        await eventually(lambda: rb.health.ready, within=10)


async def test_diagnosis_reads_a_workspace_build_once_and_only_when_asked(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Two stuck chats on one workspace cost one build read; lookup=False reads nothing."""
    alice = sim.state.add_user("alice")
    ws = sim.state.add_workspace(alice, build_status="pending")
    other = sim.state.add_workspace(alice)
    a = sim.state.add_chat(alice, status="running", workspace=ws)
    b = sim.state.add_chat(alice, status="running", workspace=ws)
    c = sim.state.add_chat(alice, status="running", workspace=other)
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        seen = len(r.events.events)
        recs = [r.store.get("alice", x.id) for x in (a, b, c)]
        assert all(rec is not None for rec in recs)
        diagnosing = r.watcher.diagnosing
        fa = await diagnosing.read(recs[0])  # type: ignore[arg-type]
        fb = await diagnosing.read(recs[1])  # type: ignore[arg-type]
        fc = await diagnosing.read(recs[2], lookup=False)  # type: ignore[arg-type]
        workspace_gets = [
            e
            for _, e in r.events.events[seen:]
            if e["type"] == "http:request" and "/workspaces/" in e["path"]
        ]
        assert fa.build is not None and fa.build.status == "pending" and fb.build == fa.build
        assert fc.build is None and not fc.build_checked
        assert len(workspace_gets) == 1


async def test_diagnosis_reads_agent_health_from_the_same_workspace_response(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A workspace's agents (status, lifecycle_state) come with the build read, one GET;
    a disconnected agent of a succeeded build is the hint's cause."""
    alice = sim.state.add_user("alice")
    ws = sim.state.add_workspace(alice)
    ws.agent_status, ws.agent_lifecycle = "disconnected", "start_error"
    chat = sim.state.add_chat(alice, status="running", workspace=ws)
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        seen = len(r.events.events)
        rec = r.store.get("alice", chat.id)
        assert rec is not None
        got = await r.watcher.diagnosing.read(rec)
        paths = [e["path"] for _, e in r.events.events[seen:] if e["type"] == "http:request"]
        assert sum("/workspaces/" in p for p in paths) == 1
        assert not any("agent" in p for p in paths)
        assert got.build is not None
        assert [(a.name, a.status, a.lifecycle_state) for a in got.build.agents] == [
            ("main", "disconnected", "start_error")
        ]
        text = hint(Facts(record=rec, build=got.build))
        assert "workspace agent main is unhealthy" in text and "start_error" in text


@pytest.mark.looptime
async def test_reconcile_relists_at_exactly_the_jittered_interval(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Beside the stream, the identity is relisted every reconcile_interval × U(0.9, 1.1)
    (the seeded RNG): at exactly those loop times, and at no others."""
    alice = sim.state.add_user("alice")
    sim.state.add_chat(alice, status="waiting")
    settings = dataclasses.replace(FAST, reconcile_interval=60.0)
    async with watching(sim, alice, session, settings) as r:
        started = asyncio.get_running_loop().time()
        reconcile = asyncio.create_task(r.watcher.reconcile_forever())
        await asyncio.sleep(200)
        reconcile.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reconcile
        listings = [
            t
            for t, (_, e) in zip(r.events.at, r.events.events, strict=True)
            if e["type"] == "http:request" and "limit=500" in e["path"]
        ]
        rng = random.Random(2)  # the watcher's; nothing else drew from it (no redial)
        expected, t = [], started
        while (t := t + 60.0 * rng.uniform(0.9, 1.1)) < started + 200:
            expected.append(t)
        assert listings[0] == pytest.approx(0.0, abs=1e-6)  # the seed
        assert listings[1:] == pytest.approx(expected, abs=2e-6)
        assert len(expected) == 3 and r.health.relists == 4


class Changes:
    """A change sink that keeps what it is handed."""

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def apply(self, identity: str, changes: Iterable[Change]) -> None:
        self.changes.extend(changes)

    def readiness_changed(self, name: str) -> None:
        return None


@pytest.mark.looptime
async def test_confirmation_reads_answer_through_the_store_and_the_sink(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A re-read detection asks for lands in the store and reaches the change sink tagged
    "confirm" (a 404 as a tombstone); a failed one is noted in the identity's health,
    timed, and raised; detection writes neither."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, title="t", status="running", publish=False)
    store, sink, timed = ChatStore(), Changes(), []
    health = IdentityHealth(
        name="alice", deployment=sim.url, server_clock=ServerClock(), unhealthy_after=60
    )
    health.on_confirmation = timed.append
    w = IdentityWatcher(
        health=health,
        client=CoderClient(transport(sim, alice, session), prefix="/api/v2"),
        store=store,
        changes=sink,
        listing_gate=asyncio.Semaphore(1),
        settings=FAST,
    )
    assert await w.rereads.reread(chat.id) == "read"
    assert [(c.kind, c.via) for c in sink.changes] == [("new", "confirm")]
    sim.state.delete(chat.id)
    assert await w.rereads.reread(chat.id) == "gone"
    assert [(c.kind, c.reason, c.via) for c in sink.changes[1:]] == [
        ("tombstone", "gone", "confirm")
    ]
    assert store.get("alice", chat.id) is None and health.last_error == ""
    down = Transport(
        base_url="http://127.0.0.1:1", token=alice.token, session=session, identity="alice"
    )
    w.rereads.client = CoderClient(down, prefix="/api/v2")
    with pytest.raises(CoderError):
        await w.rereads.reread(chat.id)
    assert health.last_error.startswith("confirmation failed: ")
    assert health.confirm_failures == 1  # counted toward the identity's health
    assert len(timed) == 3


@pytest.mark.looptime
async def test_a_proxy_clock_ahead_of_the_stamps_does_not_fire_every_running_chat(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Date headers two hours ahead of the server's own stamps (a proxy's clock): the
    transition events' fresh stamps are believed, so a chat that just started running is
    not taken for two hours old and paged (budget 1 h), and the identity says why once."""
    alice = sim.state.add_user("alice")
    sim.state.faults.date_skew = 7200.0
    chats = [sim.state.add_chat(alice, status="waiting") for _ in range(3)]
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.ready)
        for chat in chats:  # three transitions, each its own burst, agree on the lag
            sim.state.set_status(chat.id, "running")
            await eventually(lambda c=chat: r.store.get("alice", c.id).status == "running")  # type: ignore[misc, union-attr]
        await asyncio.sleep(5.0)
        assert r.alerts == []
        assert r.health.server_clock.stamp_lag == pytest.approx(7200.0, abs=5.0)
        assert r.health.server_clock.now() == pytest.approx(sim.state.now(), abs=5.0)


@pytest.mark.looptime
async def test_a_refused_watch_stream_falls_back_to_polling_and_back(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A proxy that refuses every upgrade (500 on /chats/watch) while GET /chats works:
    after a few refusals the identity is watched by listing (ready, state "polling",
    IdentityDegraded firing), a stuck chat still pages, a change is seen a poll later, and
    when the stream is allowed again the identity streams and the alert resolves."""
    alice = sim.state.add_user("alice")
    stuck = sim.state.add_chat(alice, status="running", age=4000)
    idle = sim.state.add_chat(alice, status="waiting")
    sim.state.faults.subscribe_fail = True
    async with watching(sim, alice, session) as r:
        await eventually(lambda: r.health.state == "polling", within=30)
        assert r.health.ready and "polling by listing" in r.health.last_error
        await eventually(lambda: any(a.name == "ChatStuck" for a in r.alerts), within=30)
        assert [a.labels["chat_id"] for a in r.alerts if a.name == "ChatStuck"] == [stuck.id]
        assert any(a.name == "IdentityDegraded" and a.status == "firing" for a in r.alerts)
        sim.state.set_status(idle.id, "running")
        await eventually(
            lambda: r.store.get("alice", idle.id).status == "running",  # type: ignore[union-attr]
            within=WatchSettings().poll_interval + 5,
        )
        sim.state.faults.subscribe_fail = False
        await eventually(
            lambda: r.health.state == "ready", within=WatchSettings().poll_interval + 5
        )
        await eventually(
            lambda: any(a.name == "IdentityDegraded" and a.status == "resolved" for a in r.alerts)
        )
