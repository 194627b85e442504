"""The stuck detector (docs/alerting.md): arm, apply, and the heap loop.

Watchers feed it store changes (it is their :class:`watchd.watching.watcher.ChangeSink`);
it arms one timer per chat clock on a heap (never scans all chats), and when a clock
runs past its budget on the *server's* clock it hands the chat to the identity's
confirm loop (:mod:`watchd.detection.confirming`) before anything fires. While an
identity is not ready (unseeded, disconnected) its due chats wait; an identity unready
past its grace raises IdentityUnhealthy (:mod:`watchd.detection.identity_watch`, ticked
by this loop). Firing and resolving are the ledger's
(:mod:`watchd.detection.ledger`), the words of an alert the renderer's
(:mod:`watchd.detection.alerts`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping

from watchd.alerting.model import AlertSink
from watchd.coder.models import IDLE_STATUSES, KNOWN_STATUSES
from watchd.config.model import Config
from watchd.config.watching import Budgets, IncidentsConfig
from watchd.detection.alerts import Renderer
from watchd.detection.budgets import ERROR, RUNNING, budget
from watchd.detection.confirming import Confirming
from watchd.detection.identity_watch import IdentityWatch
from watchd.detection.incidents import Incidents
from watchd.detection.ledger import ClockKey, Ledger
from watchd.detection.timers import ServerTimers
from watchd.detection.watched import Confirmer, Watched
from watchd.kits import logs
from watchd.kits.clock import SystemClock, WallClock
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import CLOCK_SYNTHESIZED, Change, ChatRecord
from watchd.store.rows import ChatRows
from watchd.store.sqlite import StateFile
from watchd.store.timelines import Timelines

PRUNE_EVERY = 60.0  # seconds between looks for timelines past their keep

log = logs.get("watchd.detection")

# Why a tombstoned chat's alert resolved, in the words of its resolve notification.
# Others read "chat <reason>": "chat gone (404)", "chat gone (missing from two complete
# listings)" (see ChatStore.tombstone's callers).
_GONE = {
    "archived": "chat archived",
    "deleted": "chat gone (deleted)",
}


class Detector:
    def __init__(
        self,
        *,
        store: ChatStore,
        sink: AlertSink,
        db: StateFile | None = None,
        confirm_rate: float = 4.0,
        listing_threshold: int = 20,
        chat_failed: bool = False,
        link_template: str = "{deployment}/agents/{chat_id}",
        external_url: str = "",
        wall: WallClock | None = None,
        incidents: IncidentsConfig | None = None,
        on_left: Callable[[str, str, float], None] | None = None,
        timelines: Timelines | None = None,
    ) -> None:
        """``on_left(identity, status, seconds)``: a chat left a non-terminal status after
        that long on the server's clock (the SLO histogram, fleet.md §5)."""
        self.wall: WallClock = wall or SystemClock()
        self.on_left = on_left
        # Each chat's story (GET /status/chats/{id}): the store's changes, alerts, sweeps.
        self.timelines = timelines if timelines is not None else Timelines()
        self.store = store
        # The chats' part of the state file: the last record of each chat, flushed later.
        self.chat_rows = db.part(ChatRows) if db is not None else None
        self.chat_failed = chat_failed
        # The chats' clocks, each identity's in its server's time (detection/timers.py).
        self.timers = ServerTimers(
            lambda name: w.health.server_clock.offset if (w := self.watched.get(name)) else 0.0
        )
        self.watched: dict[str, Watched] = {}
        self.counters = {
            "fired": 0,
            "resolved": 0,
            "confirm_get": 0,
            "confirm_listing": 0,
            "confirm_failed": 0,
            "unconfirmed": 0,
            "deferred": 0,
            "unfounded": 0,
        }
        inc = incidents or IncidentsConfig()
        self.ledger = Ledger(
            sink=sink,
            db=db,
            timers=self.timers,
            wall=self.wall,
            counters=self.counters,
            incidents=Incidents(enabled=inc.enabled, min_chats=inc.min_chats),
            timelines=timelines,
        )
        # IdentityUnhealthy and IdentityDegraded, ticked by the loop.
        self.identity_watch = IdentityWatch(
            ledger=self.ledger, wall=self.wall, watched=self.watched
        )
        self.renderer = Renderer(link_template=link_template, external_url=external_url)
        self.confirming = Confirming(
            store=store,
            timers=self.timers,
            ledger=self.ledger,
            renderer=self.renderer,
            arming=self,
            wall=self.wall,
            counters=self.counters,
            confirm_rate=confirm_rate,
            listing_threshold=listing_threshold,
            chat_failed=chat_failed,
            timelines=self.timelines,
        )
        # The ledger's tables, under the names the daemon's view and the sweeper read.
        self.firing = self.ledger.firing
        self.history = self.ledger.history
        self.invalid = self.ledger.invalid
        self._wake = asyncio.Event()
        self._next_wake = 0.0  # wall time the loop will look at the heap next
        self._unknown_statuses: set[str] = set()

    def retune(self, config: Config) -> None:
        """A reload's new detection settings, for every identity from now on."""
        detection, incidents = config.detection, config.incidents
        self.chat_failed = self.confirming.verdicts.chat_failed = detection.chat_failed
        self.confirming.confirm_rate = detection.confirm_rate
        self.confirming.listing_threshold = detection.confirm_listing_threshold
        self.renderer.link_template = config.chat_link_template
        self.renderer.external_url = config.server.external_url
        self.ledger.incidents.retune(
            enabled=incidents.enabled, min_chats=incidents.min_chats, firing=self.firing
        )
        self.ledger.settle_incidents()

    # -- identities ---------------------------------------------------------------

    def register(
        self,
        health: IdentityHealth,
        *,
        confirmer: Confirmer,
        budgets: Budgets,
        labels: Mapping[str, str],
    ) -> None:
        w = Watched(health=health, confirmer=confirmer, budgets=budgets, labels=labels)
        self.watched[health.name] = w
        self.confirming.start(w)
        for rec in self.store.records(health.name):
            self.arm(rec)
        self._wake.set()

    async def unregister(self, name: str, *, reason: str, resolve: bool = True) -> None:
        """Stop watching an identity: its timers lapse; its alerts resolve unless the
        identity is only being restarted (``resolve=False``)."""
        w = self.watched.pop(name, None)
        self.identity_watch.degraded.discard(name)
        self.timers.drop(name)
        if w and w.task:
            w.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w.task
        if not resolve:
            return
        now = self.wall.now()
        for fp, _alert in self.ledger.of_identity(name):
            self.ledger.resolve(fp, at=now, why=reason)

    def readiness_changed(self, name: str) -> None:
        """Called by the watcher after a seed completes or the stream is lost."""
        w = self.watched.get(name)
        if w is None:
            return
        if w.health.ready:
            # First verdicts after (re)seeding: alerts for chats no longer known resolve.
            for fp, alert in self.ledger.of_identity(name):
                chat = alert.labels.get("chat_id")
                if chat is not None and self.store.get(name, chat) is None:
                    self.ledger.resolve(fp, at=w.health.server_clock.now(), why="chat gone")
            for key in w.deferred:
                w.pending[key] = 0.0
            w.deferred.clear()
            w.wake.set()
        self._wake.set()

    # -- changes from watchers ----------------------------------------------------

    def apply(self, identity: str, changes: Iterable[Change]) -> None:
        # Runs once per burst of watch events and per listing page: keep it lean. A chat's
        # clocks are armed once per batch, from its last record: arming is "the last one
        # wins" per clock, and a chat's alerts (which decide between arming and
        # cancelling) only move with its own changes, so arming after the pass ends as
        # arming after each change would (the same live timers; only which of two equal
        # deadlines pops first may differ, as after a heap compaction). Chats are armed in
        # the order of their last changes; a tombstone first arms what its chat had
        # pending, which was armed before its alerts resolved. The loop is woken once,
        # after the whole batch is armed.
        w = self.watched.get(identity)
        changes = changes if isinstance(changes, list | tuple) else list(changes)
        self.timelines.changes(
            identity, changes, clock=w.health.server_clock if w is not None else self.wall
        )
        db = self.chat_rows
        by_chat = self.ledger.by_chat
        invalid = self.ledger.invalid
        unknown = self._unknown_statuses
        on_left = self.on_left
        latest: dict[str, ChatRecord] = {}
        moved = False
        for change in changes:
            rec = change.record
            kind = change.kind
            prev = change.previous
            if kind == "transition":
                moved = True
                # The SLO histogram: leaving a non-terminal status (a round trip too), timed
                # on the server's clock from its entry stamp to the next status's.
                if (
                    on_left is not None
                    and prev is not None
                    and prev.status not in IDLE_STATUSES
                    and rec.since >= prev.since
                ):
                    on_left(identity, prev.status, rec.since - prev.since)
                if rec.clock == CLOCK_SYNTHESIZED:
                    _synthesized(identity, prev, rec)
                # A transition keeps its status only as a re-entry (watchd.store.chats):
                # the round trip ended the episode as surely as leaving the status does.
                if invalid:
                    invalid.pop(rec.key, None)
            elif kind == "tombstone":
                pending = latest.pop(rec.chat_id, None)
                if pending is not None and w is not None:
                    self._arm_all(w, (pending,))
                self._gone(identity, change)
                continue
            if prev is not None and by_chat and (identity, rec.chat_id) in by_chat:
                self._firing_moved(prev, rec, kind)
            status = rec.status
            if status not in KNOWN_STATUSES and status not in unknown:
                unknown.add(status)
                log.warning(
                    "status.unknown",
                    status=status,
                    identity=identity,
                    note="treated as active with the default budget",
                )
            cid = rec.chat_id
            latest.pop(cid, None)  # re-inserted: the order of last changes
            latest[cid] = rec
        if not latest:
            return
        if db is not None:
            # The state DB keeps the last record of each chat (its marks are "last one
            # wins" too; a tombstone above marks its chat deleted over what was pending).
            mark = db.mark
            for rec in latest.values():
                mark(rec)
            if moved:
                db.file.hurry()  # a new clock is written within milliseconds
        if w is not None:
            self._arm_all(w, latest.values())
            nxt = self.timers.next_deadline(identity)
            if nxt is not None and nxt < self._next_wake:
                # Only a deadline earlier than the loop's planned wake-up needs a wake-up.
                self._wake.set()

    def _firing_moved(self, prev: ChatRecord, rec: ChatRecord, kind: str) -> None:
        """A chat whose alerts fire changed: a transition resolves them, progress resolves
        its ChatStalled, a capacity flag read after they fired moves their cause."""
        if kind == "transition":
            why = (
                f"left {prev.status} for {rec.status}"
                if prev.status != rec.status
                else f"re-entered {rec.status} (a round trip the stream did not send)"
            )
            self.ledger.resolve_chat(prev, why=why)
        elif kind == "refresh":
            if prev.updated_at != rec.updated_at:
                # Progress on the server: the stalled clock restarts.
                self.ledger.resolve_chat(prev, why="progress", names=("ChatStalled",))
            if prev.queued_for_capacity is not rec.queued_for_capacity:
                self.ledger.recause(rec)

    def _gone(self, identity: str, change: Change) -> None:
        """A tombstone: the chat's row goes, its alerts resolve."""
        rec = change.record
        log.info("chat.tombstoned", identity=identity, chat_id=rec.chat_id, reason=change.reason)
        if self.chat_rows is not None:
            self.chat_rows.mark_deleted(identity, rec.chat_id)
        self.ledger.resolve_chat(rec, why=_GONE.get(change.reason, f"chat {change.reason}"))

    def arm(self, rec: ChatRecord) -> None:
        """Arm ``rec``'s clocks (the confirm loop re-arms a chat a re-read cleared)."""
        w = self.watched.get(rec.identity)
        if w is None:
            return
        self._arm_all(w, (rec,))
        nxt = self.timers.next_deadline(rec.identity)
        if nxt is not None and nxt < self._next_wake:
            # Only a deadline earlier than the loop's planned wake-up needs a wake-up.
            self._wake.set()

    def _arm_all(self, w: Watched, recs: Iterable[ChatRecord]) -> None:
        """Arm (or cancel) each record's status and stalled clocks, in order."""
        limits = w.limits
        stalled = w.budgets.stalled
        firing = self.ledger.firing_clocks
        timers = self.timers
        arm = timers.arm
        cancel = timers.cancel
        chat_failed = self.chat_failed
        for rec in recs:
            status = rec.status
            try:
                limit = limits[status]
            except KeyError:
                limit = limits[status] = budget(w.budgets, status)
            key = (rec.identity, rec.chat_id, "status")
            if key in firing:
                cancel(key)
            elif limit is not None:
                arm(key, rec.since + limit, rec.version)
            elif chat_failed and status == ERROR:
                arm(key, rec.since, rec.version)
            else:
                cancel(key)
            skey = (rec.identity, rec.chat_id, "stalled")
            if skey in firing:
                cancel(skey)
            elif stalled is not None and status == RUNNING and rec.updated_at:
                arm(skey, rec.updated_at + stalled, int(rec.updated_at * 1000))
            else:
                cancel(skey)

    async def run(self) -> None:
        """Fire due timers, tick identity health; sleeps until the next deadline (≤1 s)."""
        try:
            prune_at = 0.0
            while True:
                now = self.wall.now()
                for due in self.timers.pop_due(now):
                    self._due(due.key, due.deadline)
                self.identity_watch.tick()
                if now >= prune_at:  # timelines of chats quiet for a day go
                    self.timelines.prune(now)
                    prune_at = now + PRUNE_EVERY
                nxt = self.timers.next_deadline()
                timeout = 1.0 if nxt is None else max(0.0, min(1.0, nxt - now))
                self._next_wake = now + timeout
                self._wake.clear()
                # asyncio.timeout, not wait_for: on 3.11 wait_for can turn a cancellation that
                # races its own timeout into TimeoutError, and this loop would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
        finally:
            for w in self.watched.values():
                if w.task:
                    w.task.cancel()

    def wake(self) -> None:
        """Re-evaluate deadlines now (after a clock adjustment, or from tests)."""
        self._wake.set()

    def _due(self, key: ClockKey, deadline: float) -> None:
        identity, chat_id, _clock = key
        w = self.watched.get(identity)
        if (
            w is None
            or key in self.ledger.firing_clocks
            or self.store.get(identity, chat_id) is None
        ):
            return
        if not w.health.ready:
            w.deferred.add(key)
            self.counters["deferred"] += 1
            return
        w.pending[key] = deadline
        w.wake.set()


def _synthesized(identity: str, prev: ChatRecord | None, rec: ChatRecord) -> None:
    """Said of a transition a listing or a read inferred (the stream never sent it)."""
    log.info(
        "transition.synthesized",
        identity=identity,
        chat_id=rec.chat_id,
        to=rec.status,
        **{"from": prev.status if prev else None},
    )
