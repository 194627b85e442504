"""The stuck detector: budgets on the server clock, confirmation, readiness, resolves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from msgspec.structs import replace

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.errors import CoderError
from watchd.coder.models import WorkspaceBuild
from watchd.coder.observing import ChatId, Observation, WireContext, WireError
from watchd.config.watching import Budgets, IncidentsConfig
from watchd.detection.alerts import iso
from watchd.detection.confirming import SETTLE_MAX, SETTLE_QUIET
from watchd.detection.detector import Detector
from watchd.detection.diagnosis import Facts
from watchd.detection.verdicts import BURST_LOOKUPS
from watchd.kits.clock import ServerClock
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import ChatRecord
from watchd.store.rows import ChatRows
from watchd.store.sqlite import StateFile


class Wall:
    """A host clock that tests can set; the server clock is this plus a skew."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


@dataclass
class Server:
    """What the Coder server holds: the truth the confirmer reads."""

    chats: dict[str, Observation] = field(default_factory=dict)
    fail: bool = False  # GETs fail
    list_fail: bool = False  # listings fail
    gets: int = 0
    lists: int = 0
    lookups: int = 0
    build_status: dict[str, str] = field(default_factory=dict)  # workspace -> latest build
    # (loop time, "get" | "list") of every read, for exact-time assertions.
    reads: list[tuple[float, str]] = field(default_factory=list)

    def read(self, kind: str) -> None:
        self.reads.append((round(asyncio.get_running_loop().time(), 6), kind))


class FakeConfirmer:
    def __init__(
        self, server: Server, store: ChatStore, det: Detector, name: str, clock: ServerClock
    ) -> None:
        self.server, self.store, self.det, self.name, self.clock = server, store, det, name, clock
        self.builds: dict[str, WorkspaceBuild] = {}
        self.capacity_asked: list[str] = []

    def learn_capacity(self, chat_ids: Sequence[str]) -> AbstractSet[str]:
        """As Rereads: queued for the reconciler's paced GETs (a test performs them)."""
        self.capacity_asked.extend(chat_ids)
        return set(chat_ids)

    async def reread(self, chat_id: str) -> Literal["read", "gone"]:
        """As the watcher's Rereads answers: into the store, the changes to the sink."""
        self.server.gets += 1
        self.server.read("get")
        if self.server.fail:
            raise CoderError(status=503, message="down")
        if chat_id not in self.server.chats:
            gone = self.store.tombstone(self.name, chat_id, reason="gone", via="confirm")
            if gone is not None:
                self.det.apply(self.name, [gone])
            return "gone"
        chat = self.server.chats[chat_id]
        change = self.store.observe(self.name, chat, now=self.clock.now(), via="confirm")
        if change is not None:
            self.det.apply(self.name, [change])
        return "read"

    async def relist(self, *, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
        self.server.lists += 1
        self.server.read("list")
        if self.server.list_fail:
            raise CoderError(status=502, message="bad gateway")
        now = self.clock.now()
        self.det.apply(
            self.name,
            self.store.apply_listing(
                self.name, list(self.server.chats.values()), now=now, started=now
            ),
        )
        if on_page is not None:
            on_page(set(self.server.chats))

    async def facts(self, record: ChatRecord, *, lookup: bool = True) -> Facts:
        # As the real reader (watching/diagnosing.py): a build read is remembered per
        # workspace, and lookup=False answers from what is remembered.
        ws = record.workspace_id
        if ws and ws in self.builds:
            return Facts(record=record, build=self.builds[ws])
        if ws and lookup:
            self.server.lookups += 1
            build = self.builds[ws] = WorkspaceBuild(
                ws, self.server.build_status.get(ws, "running")
            )
            return Facts(record=record, build=build)
        return Facts(record=record, build_checked=not ws)


class Sink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    def put(self, alert: Alert) -> None:
        self.alerts.append(alert)

    def names(self) -> list[tuple[str, str]]:
        return [(a.name, a.status) for a in self.alerts]


@dataclass
class Rig:
    det: Detector
    store: ChatStore
    sink: Sink
    server: Server
    health: IdentityHealth
    wall: Wall
    clock: ServerClock

    def see(
        self,
        cid: str,
        status: str,
        updated: float,
        *,
        via: str = "watch",
        kind: str = "status_change",
        **kw: object,
    ) -> None:
        chat = Observation(
            id=ChatId(cid), status=status, updated_at=updated, title=f"chat {cid}", **kw
        )  # type: ignore[arg-type]
        self.server.chats[cid] = chat
        change = self.store.observe("a", chat, now=self.clock.now(), via=via, kind=kind)
        if change:
            self.det.apply("a", [change])

    def advance(self, seconds: float) -> None:
        self.wall.t += seconds
        self.det.wake()

    def ready(self, ok: bool = True) -> None:
        self.health.set_state("ready" if ok else "reconnecting")
        self.det.readiness_changed("a")

    async def settle(self) -> None:
        """Let the loops run for 0.4 s of loop time (virtual: looptime)."""
        for _ in range(20):
            await asyncio.sleep(0.02)


pytestmark = pytest.mark.looptime

SKEW = -600.0  # the server's clock is ten minutes behind the host's


@contextlib.asynccontextmanager
async def rig(
    budgets: Budgets,
    *,
    db: StateFile | None = None,
    chat_failed: bool = False,
    unhealthy_after: float = 3600.0,
    crash: bool = False,
    listing_threshold: int = 5,
    incidents: bool = False,
) -> AsyncIterator[Rig]:
    """``incidents``: whether FleetIncident is on (off: these tests count chat alerts;
    tests/unit/test_incidents.py has its own)."""
    wall = Wall(1_800_000_000.0)
    clock = ServerClock(wall)
    clock.offset = SKEW
    store = ChatStore()
    if db is not None:
        store.load(db.part(ChatRows).load())
    sink = Sink()
    det = Detector(
        store=store,
        sink=sink,
        db=db,
        confirm_rate=50.0,
        listing_threshold=listing_threshold,
        chat_failed=chat_failed,
        wall=wall,
        incidents=IncidentsConfig(enabled=incidents),
    )
    health = IdentityHealth(
        name="a",
        deployment="https://coder.test",
        server_clock=clock,
        unhealthy_after=unhealthy_after,
    )
    server = Server()
    det.register(
        health,
        confirmer=FakeConfirmer(server, store, det, "a", clock),
        budgets=budgets,
        labels={"team": "x"},
    )
    task = asyncio.create_task(det.run())
    try:
        yield Rig(det, store, sink, server, health, wall, clock)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if crash:
            # A crash resolves nothing: only the confirm task goes away with the process.
            confirm = det.watched["a"].task
            assert confirm is not None
            with contextlib.suppress(asyncio.CancelledError):
                await confirm
        else:
            await det.unregister("a", reason="test over")


async def test_fires_only_after_the_budget_on_the_server_clock() -> None:
    """A running chat fires ChatStuck once its server-side age passes the budget, not before."""
    async with rig(Budgets(running=300)) as r:
        r.ready()
        server_now = r.clock.now()
        r.see("c1", "running", server_now - 200)
        await r.settle()
        assert r.sink.alerts == []
        r.advance(101)
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]
        a = r.sink.alerts[0]
        assert a.labels["status"] == "running" and a.labels["team"] == "x"
        assert a.annotations["clock"] == "transition"
        assert r.server.gets == 1


async def test_host_clock_skew_changes_no_verdict() -> None:
    """With the server ten minutes behind the host, a fresh chat is not judged ten minutes old."""
    async with rig(Budgets(running=300)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 10)
        await r.settle()
        assert r.sink.alerts == []


async def test_requires_action_is_stranded_and_unknown_uses_default() -> None:
    """requires_action raises ChatStranded; an unknown status uses the default budget."""
    async with rig(Budgets(requires_action=60, default=120, running=10_000)) as r:
        r.ready()
        now = r.clock.now()
        r.see("c1", "requires_action", now - 61)
        r.see("c2", "hibernating", now - 100)
        await r.settle()
        assert r.sink.names() == [("ChatStranded", "firing")]
        assert "stranded" in r.sink.alerts[0].annotations["hint"]
        r.advance(21)
        await r.settle()
        assert r.sink.names()[-1] == ("ChatStuck", "firing")
        assert r.sink.alerts[-1].labels["status"] == "hibernating"


async def test_idle_statuses_never_fire() -> None:
    """waiting, completed, paused and error chats are never stuck."""
    async with rig(Budgets(default=1)) as r:
        r.ready()
        for i, st in enumerate(["waiting", "completed", "paused", "error"]):
            r.see(f"c{i}", st, r.clock.now() - 10_000)
        await r.settle()
        assert r.sink.alerts == []


async def test_no_verdict_while_unready_then_fires_after_seed() -> None:
    """Due chats of an unready identity wait; they fire once it is ready again."""
    async with rig(Budgets(running=60)) as r:
        r.see("c1", "running", r.clock.now() - 120)
        await r.settle()
        assert r.sink.alerts == [] and r.server.gets == 0
        r.ready()
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]


async def test_confirmation_that_shows_progress_does_not_fire() -> None:
    """If the GET shows the chat moved on, nothing fires and the new status is tracked."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 120)
        r.server.chats["c1"] = replace(
            r.server.chats["c1"], status="waiting", updated_at=r.clock.now()
        )
        await r.settle()
        assert r.sink.alerts == []
        rec = r.store.get("a", "c1")
        assert rec is not None and rec.status == "waiting" and rec.clock == "synthesized"


async def test_failed_confirmation_fires_nothing() -> None:
    """When the re-read fails, nothing fires and the re-read is tried again later (the
    watcher notes why in the identity's health: test_watching)."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.server.fail = True
        r.see("c1", "running", r.clock.now() - 120)
        await r.settle()
        assert r.sink.alerts == []
        assert r.det.counters["confirm_failed"] == 1
        assert ("a", "c1", "status") in r.det.timers


async def test_gone_chat_is_tombstoned_on_confirmation() -> None:
    """A 404 on the confirmation GET drops the chat instead of firing."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 120)
        del r.server.chats["c1"]
        await r.settle()
        assert r.sink.alerts == [] and r.store.get("a", "c1") is None


async def test_many_due_confirm_with_one_listing() -> None:
    """Past the threshold, due chats are confirmed by one listing, not one GET each."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.health.set_state("seeding")
        for i in range(12):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        await r.settle()
        r.ready()
        await r.settle()
        assert len(r.sink.alerts) == 12
        assert r.server.lists == 1 and r.server.gets == 0


async def test_a_burst_coming_due_over_time_is_confirmed_by_one_listing() -> None:
    """Chats crossing their budget 10 ms apart are confirmed together: one listing, no GETs."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        base = r.clock.now() - 60 + 0.005
        for i in range(12):
            r.see(f"c{i}", "running", base + i * 0.01)
        await r.settle()
        assert r.sink.alerts == []
        for _ in range(13):
            r.advance(0.01)
            await asyncio.sleep(0.01)
        await r.settle()
        assert len(r.sink.alerts) == 12
        assert (r.server.lists, r.server.gets) == (1, 0)


async def test_a_burst_reads_only_a_few_workspace_builds() -> None:
    """Thirty chats due together cost at most BURST_LOOKUPS build reads; the rest say why not."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.health.set_state("seeding")
        for i in range(30):
            r.see(f"c{i}", "running", r.clock.now() - 120, workspace_id=f"ws-{i}")
        await r.settle()
        r.ready()
        await r.settle()
        assert len(r.sink.alerts) == 30
        assert r.server.lookups == BURST_LOOKUPS
        unread = [a for a in r.sink.alerts if "workspace_build" not in a.annotations]
        assert len(unread) == 30 - BURST_LOOKUPS
        assert all(
            "30 chats went past their budget together" in a.annotations["hint"] for a in unread
        )


async def test_a_burst_reads_the_workspaces_most_of_its_chats_share_first() -> None:
    """A burst whose first chats each have a workspace of their own and whose other 60
    share two: the two shared builds are read (one read each), so none of those 60 is left
    without its build, and reads stay at BURST_LOOKUPS."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.server.build_status.update({"shared-0": "pending", "shared-1": "pending"})
        for i in range(40):
            # Due first (older): the bulk of the burst's head has a workspace of its own.
            r.see(f"a{i:02d}", "running", r.clock.now() - 200 - i, workspace_id=f"ws-{i}")
        for i in range(60):
            r.see(f"z{i:02d}", "running", r.clock.now() - 120, workspace_id=f"shared-{i % 2}")
        await r.settle()
        assert len(r.sink.alerts) == 100 and r.server.lookups == BURST_LOOKUPS
        shared = [a for a in r.sink.alerts if a.labels["chat_id"].startswith("z")]
        assert {a.labels["cause"] for a in shared} == {"build_pending"}
        unread = [a for a in r.sink.alerts if "workspace_build" not in a.annotations]
        assert len(unread) == 40 - (BURST_LOOKUPS - 2)


async def test_a_burst_of_500_chats_on_20_workspaces_reads_every_build() -> None:
    """500 chats due together on 20 workspaces: 20 reads, and no chat is left without its
    workspace's build (so none is unknown for want of a read)."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.health.set_state("seeding")
        r.server.build_status.update({f"ws-{i}": "failed" for i in range(20)})
        for i in range(500):
            r.see(f"c{i}", "running", r.clock.now() - 120, workspace_id=f"ws-{(i * 7) % 20}")
        await r.settle()
        r.ready()
        await r.settle()
        assert len(r.sink.alerts) == 500 and r.server.lookups == 20
        assert {a.labels["cause"] for a in r.sink.alerts} == {"build_failed"}


async def test_a_single_due_chat_reads_its_workspace_build() -> None:
    """A chat confirmed on its own always gets its workspace build read."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 120, workspace_id="ws-1")
        await r.settle()
        assert r.server.lookups == 1
        assert r.sink.alerts[0].annotations["workspace_build"] == "running"


async def test_resolves_when_the_chat_moves_on_and_never_refires() -> None:
    """Leaving the status resolves the alert; re-reads of a firing chat do not re-fire it."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 120)
        await r.settle()
        r.see("c1", "running", r.clock.now() - 119, via="listing")  # a reconcile refresh
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]
        r.see("c1", "waiting", r.clock.now())
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing"), ("ChatStuck", "resolved")]
        assert r.det.firing == {}


async def test_archived_chat_resolves() -> None:
    """An archived chat's alert resolves."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 120)
        await r.settle()
        r.see("c1", "running", r.clock.now(), via="listing", archived=True)
        await r.settle()
        assert r.sink.names()[-1] == ("ChatStuck", "resolved")


async def test_fingerprint_is_deterministic() -> None:
    """Two detectors seeing the same chat compute the same fingerprint."""
    prints = []
    for _ in range(2):
        async with rig(Budgets(running=60)) as r:
            r.ready()
            r.see("c1", "running", 1_799_999_000.0)
            await r.settle()
            prints.append(r.sink.alerts[0].fingerprint)
    assert prints[0] == prints[1]


async def test_replicas_with_different_clock_estimates_agree_on_fingerprint_and_start() -> None:
    """Replicas whose server-clock estimates differ (a stamp ahead of one of them) compute
    the same fingerprint, labels and startsAt: both come from the server's timestamp."""
    seen = []
    for estimate_error in (0.0, -0.9):
        async with rig(Budgets(running=60)) as r:
            r.clock.offset = SKEW + estimate_error
            r.ready()
            stamp = r.clock.now() + 0.5  # the server's stamp is ahead of this estimate
            r.see("c1", "running", stamp - estimate_error)  # the same server time for both
            r.advance(70)
            await r.settle()
            (a,) = r.sink.alerts
            seen.append((a.fingerprint, dict(a.labels), a.starts_at))
    assert seen[0] == seen[1]
    assert seen[0][2] == 1_800_000_000.0 + SKEW + 0.5 + 60  # the stamp plus the budget


async def test_chats_due_at_one_server_instant_fire_together_though_the_estimate_moved() -> None:
    """Two chats that cross their budget at one server instant come due at the same wake-up
    though the clock estimate moved between their arming: clocks keep the server's time."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        stamp = r.clock.now() - 30  # both entered running 30 s ago, on the server's clock
        r.see("c1", "running", stamp)
        r.clock.offset = SKEW + 0.4  # the estimate narrows: the server is 0.4 s further on
        r.see("c2", "running", stamp)
        r.advance(29.6)  # the server's clock now reads stamp + 60, by the new estimate
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")] * 2


async def test_a_listing_that_moves_the_clock_estimate_back_still_confirms_its_burst() -> None:
    """A burst confirmed by a listing whose own Date samples move the clock estimate back
    (the chats now look a little short of their budget) fires from that one listing: its
    chats are judged no earlier than the deadline they came due by, not listed again."""
    async with rig(Budgets(running=60), listing_threshold=5) as r:
        r.ready()
        stamp = r.clock.now() - 30
        for i in range(10):
            r.see(f"c{i}", "running", stamp, workspace_id=None)
        confirmer = r.det.watched["a"].confirmer
        relist = confirmer.relist

        async def estimate_moves_back(**kw: Any) -> None:
            r.clock.offset -= 0.3  # the listing's responses say the server is a bit behind
            await relist(**kw)

        confirmer.relist = estimate_moves_back  # type: ignore[method-assign]
        r.advance(30)
        await r.settle()
        await r.settle()
        assert r.server.lists == 1 and r.det.counters["unfounded"] == 0
        assert r.sink.names() == [("ChatStuck", "firing")] * 10


async def test_restart_keeps_clock_and_does_not_refire(tmp_path: Path) -> None:
    """Clocks and firing alerts persisted in SQLite survive a restart without a second page."""
    db = StateFile(tmp_path / "state.sqlite3")
    async with rig(Budgets(running=60), db=db, crash=True) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 120)
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]
        since = r.store.get("a", "c1").since  # type: ignore[union-attr]
        db.flush()
    db.close()
    db2 = StateFile(tmp_path / "state.sqlite3")
    async with rig(Budgets(running=60), db=db2, crash=True) as r2:
        rec = r2.store.get("a", "c1")
        assert rec is not None and rec.since == since and rec.clock == "transition"
        r2.ready()
        await r2.settle()
        assert r2.sink.alerts == [] and len(r2.det.firing) == 1
    db2.close()


async def test_identity_unhealthy_fires_and_resolves() -> None:
    """An identity unready past its grace raises IdentityUnhealthy, resolved on recovery."""
    async with rig(Budgets(), unhealthy_after=0.05) as r:
        r.health.set_state("auth_failed", error="HTTP 401")
        await asyncio.sleep(1.2)
        assert r.sink.names() == [("IdentityUnhealthy", "firing")]
        assert r.sink.alerts[0].labels["severity"] == "critical"
        r.ready()
        await asyncio.sleep(1.2)
        assert r.sink.names()[-1] == ("IdentityUnhealthy", "resolved")


async def test_stalled_clock_fires_and_resets_on_progress() -> None:
    """With a stalled budget, a running chat whose updated_at stops moving raises ChatStalled."""
    async with rig(Budgets(running=10_000, stalled=60)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 61)
        await r.settle()
        assert r.sink.names() == [("ChatStalled", "firing")]
        r.see("c1", "running", r.clock.now(), via="listing")
        await r.settle()
        assert r.sink.names()[-1] == ("ChatStalled", "resolved")


@pytest.mark.parametrize("enabled", [True, False])
async def test_chat_failed_is_opt_in(enabled: bool) -> None:
    """error chats raise ChatFailed only when detection.chat_failed is on."""
    async with rig(Budgets(), chat_failed=enabled) as r:
        r.ready()
        r.see("c1", "error", r.clock.now())
        await r.settle()
        assert r.sink.names() == ([("ChatFailed", "firing")] if enabled else [])


async def test_chat_failed_hint_follows_the_error_kind() -> None:
    """A ChatFailed alert's hint follows last_error.kind and never advises an interrupt."""
    async with rig(Budgets(), chat_failed=True) as r:
        r.ready()
        err = WireError("Usage quota exceeded.", kind="usage_limit", provider="openai")
        r.see("c1", "error", r.clock.now(), last_error=err)
        await r.settle()
        (alert,) = r.sink.alerts
        assert "AI Gateway budget" in alert.annotations["hint"]
        assert "do not interrupt it" in alert.annotations["hint"]


async def test_a_running_chat_whose_updated_at_keeps_moving_is_read_as_chatds_retry_loop() -> None:
    """Past budget with updated_at still moving, the hint names chatd's retry loop and when
    it gives up, not "a wedged run: interrupt it"; with updated_at still, the old hint."""
    async with rig(Budgets(running=300)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 200)
        r.see("c2", "running", r.clock.now() - 200)
        r.see("c1", "running", r.clock.now() - 10, via="listing")
        r.advance(101)
        await r.settle()
        hints = {a.labels["chat_id"]: a.annotations["hint"] for a in r.sink.alerts}
        assert "chatd's retry loop" in hints["c1"] and "25 times" in hints["c1"]
        give_up = iso(r.clock.now() + 45 * 60)
        assert f"by {give_up[:16]}" in hints["c1"]
        assert "interrupt it" not in hints["c1"]
        assert "wedged run (interrupt it" in hints["c2"]


async def test_chat_details_become_annotations() -> None:
    """mode, client_type, context.error and warnings ride along on a stuck alert."""
    async with rig(Budgets(running=300)) as r:
        r.ready()
        r.see(
            "c1",
            "running",
            r.clock.now() - 400,
            mode="orchestrator",
            client_type="api",
            context=WireContext("context window exceeded"),
            warnings=["model deprecated"],
        )
        await r.settle()
        (alert,) = r.sink.alerts
        got = {k: alert.annotations.get(k) for k in ("mode", "client_type", "context_error")}
        assert got == {
            "mode": "orchestrator",
            "client_type": "api",
            "context_error": "context window exceeded",
        }
        assert alert.annotations["warnings"] == "model deprecated"


async def test_an_invalid_execution_state_is_said_on_the_stuck_alert() -> None:
    """When a mutation finds the state invalid, the firing alert is re-sent saying so (same
    fingerprint), and the note clears once the chat leaves the status."""
    async with rig(Budgets(running=300)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 400)
        await r.settle()
        (first,) = r.sink.alerts
        assert "execution_state" not in first.annotations
        r.det.ledger.note_invalid("a", "c1", "Chat is in an invalid state.")
        second = r.sink.alerts[-1]
        assert second.fingerprint == first.fingerprint and second.firing
        assert second.annotations["execution_state"] == "invalid: Chat is in an invalid state."
        assert "reconcile-invalid" in second.annotations["hint"]
        r.see("c1", "error", r.clock.now())
        assert ("a", "c1") not in r.det.invalid


async def test_an_event_stamped_1970_does_not_fire() -> None:
    """A watch event whose updated_at is before the chat's created_at is no clock: the chat
    is not 56 years past its budget, and nothing fires."""
    async with rig(Budgets(running=300)) as r:
        r.ready()
        r.see("c1", "running", 0.0, created_raw="2026-11-28T10:00:00Z")
        await r.settle()
        assert r.sink.alerts == []
        rec = r.store.get("a", "c1")
        assert rec is not None and rec.since > 1_000_000_000


async def test_a_confirmer_that_raises_restarts_and_the_identity_still_alerts() -> None:
    """A confirmer raising an unexpected exception crashes the confirm loop; the guard
    restarts it (counted), the chat is due again, and its alert still fires."""
    from watchd.detection.confirming import RETRY_CONFIRM_AFTER
    from watchd.kits.tasks import TASKS

    async with rig(Budgets(running=300)) as r:
        r.ready()
        confirmer = r.det.watched["a"].confirmer
        real = confirmer.reread
        calls = 0

        async def flaky(chat_id: str) -> Literal["read", "gone"]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug in the confirmer")
            return await real(chat_id)

        confirmer.reread = flaky  # type: ignore[method-assign]
        before = TASKS.restarts["confirm"]
        r.see("c1", "running", r.clock.now() - 400)
        await r.settle()
        assert r.sink.alerts == [] and calls == 1
        for _ in range(100):  # the guard's backoff (about a second, real time)
            if TASKS.restarts["confirm"] > before:
                break
            await asyncio.sleep(0.05)
        assert TASKS.restarts["confirm"] == before + 1
        await asyncio.sleep(1.5)
        r.advance(RETRY_CONFIRM_AFTER + 1)
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]


async def test_handing_an_identity_over_forgets_its_alerts_without_resolving() -> None:
    """Resharding: the alerts of an identity another replica now owns leave this detector
    silently (no resolve is sent: the new owner keeps them firing)."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 100)
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]
        fp = r.sink.alerts[0].fingerprint
        assert r.det.ledger.hand_over("a") == [fp]
        assert r.det.firing == {} and r.sink.names() == [("ChatStuck", "firing")]
        await r.det.unregister("a", reason="moved", resolve=True)
        assert r.sink.names() == [("ChatStuck", "firing")]


def now() -> float:
    return round(asyncio.get_running_loop().time(), 6)


async def test_a_burst_is_confirmed_exactly_settle_quiet_after_it_stops_growing() -> None:
    """Twelve chats due at t0 are listed at exactly t0 + SETTLE_QUIET (one quiet pause),
    not before and not one listing per chat."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        await r.settle()
        t0 = now()
        for i in range(12):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        await r.settle()
        assert r.server.reads == [(round(t0 + SETTLE_QUIET, 6), "list")]
        assert len(r.sink.alerts) == 12


async def test_the_quiet_pause_is_counted_from_the_last_chat_that_came_due() -> None:
    """Twelve chats due at t0 and one more 30 ms later are listed once, at exactly
    SETTLE_QUIET after the last one came due (not at the next look of a fixed step)."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        await r.settle()
        t0 = now()
        for i in range(12):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        await asyncio.sleep(0.03)
        r.see("c12", "running", r.clock.now() - 120)
        await r.settle()
        assert r.server.reads == [(round(t0 + 0.03 + SETTLE_QUIET, 6), "list")]
        assert len(r.sink.alerts) == 13


async def test_a_burst_that_keeps_growing_is_confirmed_at_settle_max() -> None:
    """A burst that grows by one due chat every 40 ms (under SETTLE_QUIET) is listed once,
    at exactly t0 + SETTLE_MAX: the settle gives up waiting, and confirms what it has."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        await r.settle()
        t0 = now()
        for i in range(5):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        for i in range(5, 40):
            await asyncio.sleep(0.04)
            r.see(f"c{i}", "running", r.clock.now() - 120)
        await r.settle()
        assert r.server.reads[0] == (round(t0 + SETTLE_MAX, 6), "list")
        assert len(r.sink.alerts) == 40


async def test_single_confirmations_are_paced_at_the_confirm_rate() -> None:
    """Three due chats (under the listing threshold) are read by GET after one quiet
    pause, then one every 1/confirm_rate seconds (50/s: 20 ms), at exact times."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        await r.settle()
        t0 = now()
        for i in range(3):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        await r.settle()
        first = t0 + SETTLE_QUIET
        assert r.server.reads == [
            (round(first, 6), "get"),
            (round(first + 0.02, 6), "get"),
            (round(first + 0.04, 6), "get"),
        ]
        assert len(r.sink.alerts) == 3


async def _fired_by(listing_threshold: int) -> tuple[list[Alert], Rig]:
    """Twelve overdue chats confirmed with this threshold: their alerts, by chat id."""
    async with rig(Budgets(running=60), listing_threshold=listing_threshold) as r:
        r.ready()
        for i in range(12):
            r.see(f"c{i:02}", "running", r.clock.now() - 120 - i, workspace_id=None)
        await r.settle()
        await r.settle()
        return sorted(r.sink.alerts, key=lambda a: a.labels["chat_id"]), r


async def test_a_listing_confirmation_fires_the_alerts_single_reads_fire() -> None:
    """A burst confirmed by one listing fires exactly the alerts that twelve single GET
    confirmations fire: same labels, annotations, start."""
    by_listing, r1 = await _fired_by(5)
    by_get, r2 = await _fired_by(100)
    assert (r1.server.lists, r1.server.gets) == (1, 0)
    assert (r2.server.lists, r2.server.gets) == (0, 12)
    assert [(a.labels, a.annotations, a.starts_at) for a in by_listing] == [
        (a.labels, a.annotations, a.starts_at) for a in by_get
    ]


async def test_a_chat_the_listing_changes_is_judged_on_what_the_listing_shows() -> None:
    """A burst is judged on the records as the listing leaves them: a chat it shows
    retitled fires with its new title, one it shows waiting does not fire at all."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.health.set_state("seeding")
        for i in range(12):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        r.server.chats["c0"] = replace(r.server.chats["c0"], title="renamed")
        r.server.chats["c1"] = replace(
            r.server.chats["c1"], status="waiting", updated_at=r.clock.now()
        )
        r.ready()
        await r.settle()
        assert r.server.lists == 1
        fired = {a.labels["chat_id"]: a for a in r.sink.alerts}
        assert len(fired) == 11 and "c1" not in fired
        assert fired["c0"].annotations["title"] == "renamed"
        assert fired["c0"].annotations["summary"].startswith('Chat "renamed" has been running')


def test_late_pages_confirm_only_chats_read_after_they_came_due() -> None:
    """Of the chats that come due during a confirmation listing, a page asked for after
    one came due confirms it; a chat an earlier page read, or the batch itself, is not
    counted."""
    from watchd.detection.confirming import LatePages

    pending: dict[tuple[str, str, str], float] = {}
    pages = LatePages(pending, [("a", "b1", "status")])
    pending[("a", "b1", "status")] = 0.0  # the batch's own chat, due again: not counted
    pending[("a", "x", "status")] = 1.0  # due before page 1 is asked for
    pages.seen({"b1", "y"})  # page 0 arrives: x not read yet
    pending[("a", "y", "status")] = 2.0  # due after page 0 had already read it
    pages.seen({"b1", "y", "x"})  # page 1 reads x
    pages.seen({"b1", "y", "x", "z"})
    assert pages.confirmed == [("a", "x", "status")]


async def test_a_chat_due_during_the_listing_is_confirmed_by_a_later_page() -> None:
    """A chat that comes due while a burst's listing runs, and that a page asked for
    after that reads, fires with the burst: no second listing and no GET for it."""
    async with rig(Budgets(running=60)) as r:
        r.ready()
        await r.settle()
        for i in range(6):
            r.see(f"c{i}", "running", r.clock.now() - 120)

        async def paged(*, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
            r.server.lists += 1
            assert on_page is not None
            r.see("late", "running", r.clock.now() - 120)  # due now, while page 0 is read
            await asyncio.sleep(0.01)
            on_page({"c0", "c1", "c2"})  # page 0 lacks it; page 1 is asked for after it
            on_page({f"c{i}" for i in range(6)} | {"late"})

        r.det.watched["a"].confirmer.relist = paged  # type: ignore[method-assign]
        await r.settle()
        await r.settle()
        assert (r.server.lists, r.server.gets) == (1, 0)
        assert sorted(a.labels["chat_id"] for a in r.sink.alerts) == [
            *(f"c{i}" for i in range(6)),
            "late",
        ]


# (chat, status, seconds before now of its updated_at, event kind, archived)
BURST = [
    ("c1", "running", 100, "status_change", False),  # progress on a firing chat
    ("c1", "waiting", 90, "status_change", False),  # leaves running: its alert resolves
    ("c1", "running", 80, "status_change", False),
    ("c2", "running", 100, "status_change", False),  # a firing chat refreshed ...
    ("c2", "running", 95, "status_change", True),  # ... then archived: its alert resolves
    ("c3", "running", 50, "created", False),
    ("c3", "waiting", 40, "status_change", False),
    ("c4", "requires_action", 30, "action_required", False),
    ("c3", "running", 20, "status_change", False),
    ("c5", "pending", 10, "created", False),
    ("c5", "pending", 10, "deleted", False),
]


async def _after_burst(db: StateFile, *, one_at_a_time: bool) -> tuple[object, ...]:
    async with rig(Budgets(running=60, stalled=30), db=db) as r:
        r.ready()
        now = r.clock.now()
        r.see("c1", "running", now - 120)
        r.see("c2", "running", now - 120)
        await r.settle()
        assert (
            sorted(r.sink.names())
            == [("ChatStalled", "firing")] * 2 + [("ChatStuck", "firing")] * 2
        )
        changes = []
        for cid, status, age, kind, archived in BURST:
            chat = Observation(
                id=ChatId(cid), status=status, updated_at=now - age, title=cid, archived=archived
            )
            change = r.store.observe("a", chat, now=now, via="watch", kind=kind)
            if change is not None:
                changes.append(change)
        for batch in [[c] for c in changes] if one_at_a_time else [changes]:
            r.det.apply("a", batch)
        armed = {k: v for h in r.det.timers._heaps.values() for k, v in h._live.items()}
        told = r.sink.names()
        db.flush()
        stored = sorted(db.part(ChatRows).load(), key=lambda rec: rec.chat_id)
        r.advance(100)
        await r.settle()
        return armed, told, stored, r.sink.names(), sorted(r.det.firing)


async def test_a_burst_arms_as_its_changes_one_at_a_time_would(tmp_path: Path) -> None:
    """Arming and marking once per chat per burst ends as doing it after every change does."""
    a, b = StateFile(tmp_path / "a.db"), StateFile(tmp_path / "b.db")
    try:
        assert await _after_burst(a, one_at_a_time=False) == await _after_burst(
            b, one_at_a_time=True
        )
    finally:
        a.close()
        b.close()


# -- alerts drafted while the confirmation listing's pages arrive (issue 18) ------------


def _paged(
    r: Rig, *, size: int, between: Callable[[int], None] | None = None
) -> Callable[..., Coroutine[Any, Any, None]]:
    """A listing of the server's chats in pages of ``size``, each page applied to the store
    and told to ``on_page`` before the next is "asked for" (10 ms of loop time later)."""

    async def relist(*, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
        r.server.lists += 1
        chats = list(r.server.chats.values())
        present: set[str] = set()
        for n, start in enumerate(range(0, len(chats), size)):
            now = r.clock.now()
            changes = []
            for chat in chats[start : start + size]:
                present.add(chat.id)
                change = r.store.observe("a", chat, now=now, via="listing")
                if change is not None:
                    changes.append(change)
            if changes:
                r.det.apply("a", changes)
            if on_page is not None:
                on_page(present)
            if between is not None:
                between(n)
            await asyncio.sleep(0.01)

    return relist


def _varied(r: Rig, n: int) -> None:
    """``n`` overdue chats with every detail an alert can carry, in turn."""
    now = r.clock.now()
    for i in range(n):
        extra: dict[str, Any] = {}
        if i % 2:
            extra.update(mode="orchestrator", client_type="api", warnings=["a", "b"])
        if i % 3 == 0:
            extra.update(workspace_id=f"ws-{i % 4}", labels={"team x": "y", "k": str(i)})
        if i % 4 == 1:
            extra.update(
                last_error=WireError("boom", kind="overloaded", provider="p", status_code=529),
                context=WireContext("too long"),
                parent_chat_id="p1",
            )
        if i % 5 == 2:
            extra.update(queued_for_capacity=True)
        status = "requires_action" if i % 7 == 3 else "running"
        r.see(f"c{i:02}", status, now - 120 - i, **extra)


Fired = tuple[str, list[tuple[str, str]], list[tuple[str, str]], float, float | None, float | None]


async def _burst_fired(*, size: int = 5, moves: bool = False) -> list[Fired]:
    """A burst of varied chats (two clocks each) confirmed by a listing in pages of
    ``size``: every alert put to the sink, in order (every field, annotations in order)."""
    async with rig(Budgets(running=60, stalled=90), listing_threshold=5) as r:
        r.ready()
        r.health.set_state("seeding")
        _varied(r, 24)
        r.det.ledger.note_invalid("a", "c05", "Chat is in an invalid state.")
        w = r.det.watched["a"]

        def between(page: int) -> None:
            if moves and page == 1:  # chats that page 0 read move before the listing ends
                chat = replace(r.server.chats["c00"], title="renamed")
                r.server.chats["c00"] = chat
                change = r.store.observe("a", chat, now=r.clock.now(), via="watch")
                assert change is not None
                r.det.apply("a", [change])
                r.see("c01", "waiting", r.clock.now())

        w.confirmer.relist = _paged(r, size=size, between=between)  # type: ignore[method-assign]
        r.ready()
        await r.settle()
        await r.settle()
        assert (r.server.lists, r.server.gets) == (1, 0)
        return [
            (
                a.fingerprint,
                list(a.labels.items()),
                list(a.annotations.items()),
                a.starts_at,
                a.ends_at,
                a.measured_at,
            )
            for a in r.sink.alerts
        ]


async def test_a_burst_fired_page_by_page_fires_what_one_pass_after_the_listing_fires() -> None:
    """A burst whose chats fire as the listing's pages re-read them fires the very alerts
    (labels, annotations in order, times) that firing them all after a one-page listing
    fires, each once."""
    paged = await _burst_fired(size=5)
    whole = await _burst_fired(size=1000)
    assert len(paged) >= 40  # ChatStuck/Stranded and ChatStalled each
    assert len({f[0] for f in paged}) == len(paged)
    assert sorted(paged) == sorted(whole)


async def test_a_chat_that_moves_after_its_page_fired_it_resolves() -> None:
    """A page that re-read a chat past its budget is its confirmation: the chat fires on
    that page's record (its later rename does not re-render it), and one the stream then
    moves to waiting before the listing ends resolves (under the dispatcher's hold the
    receiver hears of it only as resolved: tests/unit/test_dispatch.py)."""
    fired = await _burst_fired(moves=True)
    said = [(dict(f[1])["chat_id"], dict(f[1])["alertname"], f[4] is None) for f in fired]
    assert ("c01", "ChatStuck", True) in said and ("c01", "ChatStuck", False) in said
    titles = {dict(f[2])["title"] for f in fired if dict(f[1])["chat_id"] == "c00"}
    assert titles == {"chat c00"}
    assert sum(1 for c, name, on in said if c == "c00" and on) == 2  # ChatStuck, ChatStalled


def _listing(
    r: Rig, *, size: int, skip: AbstractSet[str] = frozenset(), fail_after: int | None = None
) -> Callable[..., Coroutine[Any, Any, None]]:
    """A paged listing that never reads the chats in ``skip`` (a moving cursor skips
    them) and, with ``fail_after``, fails once that many pages were applied."""
    paged = _paged(r, size=size)

    async def relist(*, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
        hidden = {k: r.server.chats.pop(k) for k in skip if k in r.server.chats}
        pages = 0

        def counted(present: AbstractSet[str]) -> None:
            nonlocal pages
            if fail_after is not None and pages >= fail_after:
                raise CoderError(status=502, message="bad gateway")
            pages += 1
            if on_page is not None:
                on_page(present)

        try:
            await paged(on_page=counted)
        finally:
            r.server.chats.update(hidden)

    return relist


async def test_a_burst_fired_page_by_page_holds_the_state_flush_until_the_listing_ends(
    tmp_path: Path,
) -> None:
    """While a burst's listing fires its pages, the state file's flush writes nothing
    (its rows would share the interpreter with the listing); once the listing ends, the
    alerts fired meanwhile are written."""
    db = StateFile(tmp_path / "state.sqlite3")
    seen: list[tuple[bool, int]] = []
    async with rig(Budgets(running=60), db=db, listing_threshold=5) as r:
        r.ready()
        await r.settle()
        for i in range(9):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        flushed: list[int] = []

        def between(page: int) -> None:
            seen.append((db.held, len(r.sink.alerts)))

        paged = _paged(r, size=3, between=between)

        async def relist(*, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
            await paged(on_page=on_page)
            flushed.append(await db.flush_async())  # the state watch's tick, mid-burst

        r.det.watched["a"].confirmer.relist = relist  # type: ignore[method-assign]
        await r.settle()
        assert [held for held, _ in seen] == [True, True, True] and flushed == [0]
        assert len(r.sink.alerts) == 9 and not db.held
        assert await db.flush_async() >= 9
    db.close()


async def test_a_due_chat_no_page_read_is_confirmed_by_get_not_fired_on_old_evidence() -> None:
    """A burst's chat that its confirming listing never read is not fired on the record
    from before: it is confirmed again RETRY_CONFIRM_AFTER later (by GET, being few),
    firing then if still past budget, never if that GET finds it gone; nothing is
    relisted meanwhile."""
    from watchd.detection.confirming import RETRY_CONFIRM_AFTER

    async with rig(Budgets(running=60), listing_threshold=5) as r:
        r.ready()
        await r.settle()
        for i in range(8):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        r.det.watched["a"].confirmer.relist = _listing(r, size=3, skip={"c0", "c1"})  # type: ignore[method-assign]
        r.server.chats.pop("c1")  # deleted on the server; the store still has it
        await r.settle()
        fired = sorted(a.labels["chat_id"] for a in r.sink.alerts if a.firing)
        assert fired == ["c2", "c3", "c4", "c5", "c6", "c7"]
        r.advance(RETRY_CONFIRM_AFTER - 1)
        await r.settle()
        assert (r.server.lists, r.server.gets, len(r.sink.alerts)) == (1, 0, 6)
        r.advance(2)
        await r.settle()
        fired = sorted(a.labels["chat_id"] for a in r.sink.alerts if a.firing)
        assert fired == ["c0", "c2", "c3", "c4", "c5", "c6", "c7"]
        assert (r.server.lists, r.server.gets) == (1, 2)
        assert r.store.get("a", "c1") is None


async def test_a_listing_that_fails_fires_what_its_pages_read_and_retries_the_rest() -> None:
    """A confirming listing that fails after its first page: the chats that page re-read
    past budget fire on its evidence; the others fire nothing now and are confirmed on
    the retry RETRY_CONFIRM_AFTER later."""
    from watchd.detection.confirming import RETRY_CONFIRM_AFTER

    async with rig(Budgets(running=60), listing_threshold=5) as r:
        r.ready()
        await r.settle()
        for i in range(6):
            r.see(f"c{i}", "running", r.clock.now() - 120)
        r.det.watched["a"].confirmer.relist = _listing(r, size=3, fail_after=1)  # type: ignore[method-assign]
        await r.settle()
        assert sorted(a.labels["chat_id"] for a in r.sink.alerts) == ["c0", "c1", "c2"]
        assert r.det.counters["confirm_failed"] == 1
        r.advance(RETRY_CONFIRM_AFTER + 1)
        await r.settle()
        fired = sorted(a.labels["chat_id"] for a in r.sink.alerts if a.firing)
        assert fired == [f"c{i}" for i in range(6)]
        assert r.server.gets == 3  # the three left, read one by one (below the threshold)


async def test_a_reentry_seen_on_the_stream_pages_on_the_new_episodes_clock() -> None:
    """running (event), waiting (event lost), running again (event delivered), 12 s budget:
    nothing fires at the first episode's budget; the page comes at the re-entered
    episode's, with its own clock start and fingerprint, and a listing or read that
    shows the same status with a newer stamp stays a refresh (a step commit)."""
    async with rig(Budgets(running=12)) as r:
        r.ready()
        t0 = r.clock.now()
        r.see("c1", "running", t0)
        r.advance(6)
        r.see("c1", "running", t0 + 6)  # the round trip's last event: a new clock
        rec = r.store.get("a", "c1")
        assert rec is not None and (rec.since, rec.clock, rec.version) == (t0 + 6, "transition", 2)
        r.advance(7)  # t0 + 13: past the first episode's budget, not the second's
        await r.settle()
        assert r.sink.alerts == []
        r.advance(6)  # t0 + 19
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]
        fired = r.sink.alerts[0]
        assert fired.starts_at == t0 + 6 + 12  # when the new episode crossed its budget
        assert fired.fingerprint == fingerprint(
            "https://coder.test", "c1", "ChatStuck", "running", t0 + 6
        )
        r.see("c1", "running", t0 + 20, via="listing")  # a step commit: refresh, same clock
        assert r.store.get("a", "c1").since == t0 + 6  # type: ignore[union-attr]
        r.advance(2)
        r.see("c1", "running", t0 + 22)  # another lost round trip: the page resolves
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing"), ("ChatStuck", "resolved")]


async def test_a_get_that_keeps_failing_is_confirmed_by_a_listing() -> None:
    """Only GET /chats/{id} fails (a proxy's login page): the second retry confirms the
    chat through a listing, and the page comes, not a re-arm every 30 s forever."""
    from watchd.detection.confirming import RETRY_CONFIRM_AFTER

    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.server.fail = True
        r.see("c1", "running", r.clock.now() - 120)
        await r.settle()
        for _ in range(2):
            assert r.sink.alerts == []
            r.advance(RETRY_CONFIRM_AFTER + 1)
            await r.settle()
        assert (r.server.gets, r.server.lists) == (2, 1)
        assert r.sink.names() == [("ChatStuck", "firing")]
        assert "unconfirmed" not in r.sink.alerts[0].annotations
        assert r.det.watched["a"].failures == {}


async def test_a_chat_that_cannot_be_reread_at_all_fires_unconfirmed() -> None:
    """GETs and listings both keep failing while the record says past budget: after
    three failed re-reads the chat fires with the evidence at hand, saying so."""
    from watchd.detection.confirming import RETRY_CONFIRM_AFTER

    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.server.fail = r.server.list_fail = True
        r.see("c1", "running", r.clock.now() - 120)
        await r.settle()
        for _ in range(3):
            assert r.sink.alerts == []
            r.advance(RETRY_CONFIRM_AFTER + 1)
            await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]
        alert = r.sink.alerts[0]
        assert alert.annotations["unconfirmed"] == "HTTP 502: bad gateway"
        assert "unconfirmed" in alert.annotations["hint"]
        assert r.det.counters["unconfirmed"] == 1


async def test_persistently_failing_rereads_make_the_identity_unhealthy() -> None:
    """An identity whose confirmation re-reads keep failing is unhealthy even while its
    stream is ready: IdentityUnhealthy fires, and resolves once a re-read succeeds."""
    from watchd.detection.identity_watch import CONFIRM_FAILURES_UNHEALTHY

    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.health.confirm_failures = CONFIRM_FAILURES_UNHEALTHY
        r.health.last_error = "confirmation failed: HTTP 200: not JSON"
        r.det.identity_watch.tick()
        assert r.sink.names() == [("IdentityUnhealthy", "firing")]
        assert "confirmation failed" in r.sink.alerts[0].annotations["last_error"]
        r.health.confirm_failures = 0
        r.det.identity_watch.tick()
        assert r.sink.names()[-1] == ("IdentityUnhealthy", "resolved")


async def test_chat_labels_copied_into_alerts_are_bounded() -> None:
    """A chat with 20 labels, one of them 200 000 characters long, pages with at most 16
    chat labels, each value at most 4 KiB (cut values marked), and says what was cut."""
    from watchd.store.records import LABEL_VALUE_MAX, MAX_LABELS

    labels = {f"k{i:02d}": "v" * (200_000 if i == 3 else 5) for i in range(20)}
    async with rig(Budgets(running=60)) as r:
        r.ready()
        r.see("c1", "running", r.clock.now() - 120, labels=labels)
        await r.settle()
        assert r.sink.names() == [("ChatStuck", "firing")]
        alert = r.sink.alerts[0]
        copied = {k: v for k, v in alert.labels.items() if k.startswith("chat_label_")}
        assert len(copied) == MAX_LABELS
        assert copied["chat_label_k03"] == "v" * LABEL_VALUE_MAX + "…"
        assert max(len(v) for v in alert.labels.values()) <= LABEL_VALUE_MAX + 1
        assert "first 16 labels" in alert.annotations["labels_cut"]
        assert "k03" in alert.annotations["labels_cut"]
        rec = r.store.get("a", "c1")
        assert rec is not None and len(rec.labels) == MAX_LABELS + 1


async def test_a_host_clock_step_moves_no_deadline() -> None:
    """With the daemon's clock (the host's at start, then monotonic), the host clock
    stepped back an hour (an NTP step, a VM restore) moves no deadline: a chat due in
    10 s pages in 10 s, not an hour later."""
    import time as _time
    from unittest import mock

    from watchd.kits.clock import LoopClock

    clock = LoopClock()
    server_clock = ServerClock(clock)
    store = ChatStore()
    sink = Sink()
    det = Detector(store=store, sink=sink, confirm_rate=50.0, wall=clock)
    health = IdentityHealth(
        name="a", deployment="https://coder.test", server_clock=server_clock, unhealthy_after=3600
    )
    server = Server()
    det.register(
        health,
        confirmer=FakeConfirmer(server, store, det, "a", server_clock),
        budgets=Budgets(running=60),
        labels={},
    )
    task = asyncio.create_task(det.run())
    try:
        health.set_state("ready")
        det.readiness_changed("a")
        chat = Observation(id=ChatId("c1"), status="running", updated_at=server_clock.now() - 50)
        server.chats["c1"] = chat
        det.apply("a", [store.observe("a", chat, now=server_clock.now(), via="watch")])  # type: ignore[list-item]
        real = _time.time
        with mock.patch("time.time", lambda: real() - 3600.0):
            await asyncio.sleep(9.0)
            assert sink.alerts == []
            await asyncio.sleep(2.0)
        assert sink.names() == [("ChatStuck", "firing")]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await det.unregister("a", reason="test over")


def test_the_daemon_reads_one_step_free_clock_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's detector and its identities (whose server clocks it builds) share the
    one clock a host clock step does not move (the dispatcher, made in run(), gets it
    there)."""
    from watchd.config.loading import parse_config
    from watchd.config.secrets import resolve_secrets
    from watchd.daemon.app import Daemon
    from watchd.kits.clock import LoopClock

    monkeypatch.setenv("WATCHD_TEST_TOKEN", "token-value-0123456789")
    config = parse_config(
        {
            "identities": [
                {"name": "a", "url": "https://coder.example.com", "token_env": "WATCHD_TEST_TOKEN"}
            ],
            "state_dir": str(tmp_path),
            "telemetry": {"exporter": "none"},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    try:
        assert isinstance(d.clock, LoopClock)
        assert d.detector.wall is d.clock and d.identities.clock is d.clock
    finally:
        d.db.close()
        d.state_lock.release()


async def test_a_listing_confirmed_burst_learns_capacity_flags_and_the_cause_follows() -> None:
    """Running chats a listing confirmed (list rows never carry queued_for_capacity) are
    asked a GET each and fire with their cause pending, in no FleetIncident (no "unknown"
    incident forms meanwhile); one found queued is re-said with cause capacity and the
    capacity hint under its own fingerprint, and the capacity FleetIncident forms."""
    async with rig(
        Budgets(running=60, requires_action=60), listing_threshold=5, incidents=True
    ) as r:
        r.ready()
        now = r.clock.now()
        for i in range(6):
            r.see(f"c{i}", "running", now - 120, via="listing")
        r.see("s1", "requires_action", now - 120, via="listing")
        await r.settle()
        first = {a.labels["chat_id"]: a for a in r.sink.alerts if a.name == "ChatStuck"}
        assert len(first) == 6 and {a.labels["cause"] for a in first.values()} == {"unknown"}
        assert all("cause_pending" in a.annotations for a in first.values())
        assert [a for a in r.sink.alerts if a.name == "FleetIncident"] == []
        confirmer = r.det.watched["a"].confirmer
        assert isinstance(confirmer, FakeConfirmer)
        assert sorted(confirmer.capacity_asked) == [f"c{i}" for i in range(6)]  # not s1
        r.sink.alerts.clear()
        for cid in confirmer.capacity_asked:
            r.server.chats[cid] = replace(r.server.chats[cid], queued_for_capacity=True)
            await confirmer.reread(cid)
        said = {a.labels["chat_id"]: a for a in r.sink.alerts if a.name == "ChatStuck"}
        assert set(said) == set(first)
        for cid, a in said.items():
            assert a.status == "firing" and a.fingerprint == first[cid].fingerprint
            assert a.labels["cause"] == "capacity" and a.annotations["queued_for_capacity"]
            assert a.annotations["hint"].startswith("deployment concurrency cap reached")
            assert "cause_pending" not in a.annotations
        incidents = [
            (a.labels["cause"], a.status, a.annotations.get("count"))
            for a in r.sink.alerts
            if a.name == "FleetIncident"
        ]
        assert incidents[0] == ("capacity", "firing", "5")
        assert incidents[-1] == ("capacity", "firing", "6")
        assert all(i[:2] == ("capacity", "firing") for i in incidents)


async def test_a_read_that_finds_the_chat_not_queued_ends_the_pending_cause() -> None:
    """A pending cause whose GET finds the chat not queued keeps its cause (unknown) and
    joins the incident of that cause: five such chats form the unknown FleetIncident."""
    async with rig(Budgets(running=60), listing_threshold=5, incidents=True) as r:
        r.ready()
        now = r.clock.now()
        for i in range(5):
            r.see(f"c{i}", "running", now - 120, via="listing")
        await r.settle()
        confirmer = r.det.watched["a"].confirmer
        assert isinstance(confirmer, FakeConfirmer)
        assert [a for a in r.sink.alerts if a.name == "FleetIncident"] == []
        for cid in confirmer.capacity_asked:
            r.server.chats[cid] = replace(r.server.chats[cid], queued_for_capacity=False)
            await confirmer.reread(cid)
        last = {a.labels["chat_id"]: a for a in r.sink.alerts if a.name == "ChatStuck"}
        assert all("cause_pending" not in a.annotations for a in last.values())
        assert {a.labels["cause"] for a in last.values()} == {"unknown"}
        fleet = [a for a in r.sink.alerts if a.name == "FleetIncident"]
        assert [(a.labels["cause"], a.annotations["count"]) for a in fleet] == [("unknown", "5")]


async def test_a_chat_admitted_after_all_goes_back_to_unknown() -> None:
    """A capacity cause learned by GET goes back to unknown (not a stale capacity) when a
    later GET finds the chat no longer queued while its alert still fires."""
    async with rig(Budgets(running=60), listing_threshold=5) as r:
        r.ready()
        now = r.clock.now()
        for i in range(5):
            r.see(f"c{i}", "running", now - 120, via="listing")
        await r.settle()
        confirmer = r.det.watched["a"].confirmer
        assert isinstance(confirmer, FakeConfirmer)
        r.server.chats["c0"] = replace(r.server.chats["c0"], queued_for_capacity=True)
        await confirmer.reread("c0")
        assert r.sink.alerts[-1].labels["cause"] == "capacity"
        r.server.chats["c0"] = replace(r.server.chats["c0"], queued_for_capacity=False)
        await confirmer.reread("c0")
        last = r.sink.alerts[-1]
        assert (last.labels["chat_id"], last.labels["cause"]) == ("c0", "unknown")
        assert "queued_for_capacity" not in last.annotations


async def test_a_stuck_chats_hint_says_what_its_agent_forwarded() -> None:
    """A chat whose agent's stream opened and then went silent fires ChatStuck with the
    agent_evidence annotation and the hint ending with it; the verdict itself rests on the
    server's status (the evidence only explains)."""
    async with rig(Budgets(running=300)) as r:
        r.ready()
        now = r.clock.now()
        r.see("c1", "running", now - 200)
        r.det.timelines.transport(
            {"type": "ws:open", "chatId": "c1", "attempt": 1}, now - 14 * 60 - 30
        )
        await r.settle()
        assert r.sink.alerts == []  # the events alone fire nothing
        r.advance(101)
        await r.settle()
        (alert,) = r.sink.alerts
        evidence = alert.annotations["agent_evidence"]
        assert evidence.startswith("the agent's stream has been open and silent for 16 min")
        assert alert.annotations["hint"].endswith(f"(agent events: {evidence})")
