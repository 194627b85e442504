"""Dispatch: route → aggregation group → the stages (Alertmanager).

Each alert state change is routed; each matching route puts it into the
aggregation group for its group key. A group flushes ``group_wait`` after it
is created and every ``group_interval`` after that, through
:mod:`watchd.alerting.stages`:

    silence → inhibit → dedup (notification log) → throttle → retry + notify → record

Every group is a guarded task (:mod:`watchd.kits.tasks`), so one that raises is
logged and seen, never silently gone. The groups' alerts (:mod:`watchd.alerting.grouprows`)
and the notification log (:mod:`watchd.alerting.nflog`) keep their own tables in the
state file, so a restart neither re-pages nor forgets a pending resolve. Scheduling uses
the loop's clock; alert times come from the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from watchd.alerting import stages
from watchd.alerting.grouprows import GroupRows
from watchd.alerting.model import Alert, live
from watchd.alerting.nflog import NotificationLog
from watchd.alerting.receivers.base import Notification, Notifier
from watchd.alerting.routing import Route
from watchd.alerting.silencing import Inhibitor, Silencer
from watchd.alerting.stages import ReceiverStats
from watchd.kits import logs
from watchd.kits.clock import SystemClock, WallClock
from watchd.kits.ratelimit import RateLimiter
from watchd.kits.tasks import spawn
from watchd.store.sqlite import StateFile

log = logs.get("watchd.alerting")

MAX_GROUPS = 10_000
MAX_ALERTS_PER_GROUP = 10_000
# One flush (with its retries) may take at most this long; the next flush retries.
MAX_FLUSH = 60.0
# A notification of this many alerts (a megabyte of webhook body) is sent with the state
# file's flush held (StateFile.holding): a burst's POST and the serialising of its rows in
# the writer's thread would share the interpreter.
HOLD_WRITES_AT = 1_000
# A burst that a confirmation listing fires page by page (watchd.detection.paged) holds
# the groups it reaches until all of it is in (Dispatcher.holding), at most this long: a
# hold never keeps a group quiet for longer.
HOLD_FLUSH_MAX = 30.0


@dataclass
class Group:
    route: Route
    key: str
    labels: dict[str, str]
    alerts: dict[str, Alert] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    dirty: asyncio.Event = field(default_factory=asyncio.Event)
    held: bool = False  # an alert came in during a hold: flush when it ends


class Dispatcher:
    """The AlertSink behind the detector: groups, flushes, delivers."""

    def __init__(
        self,
        *,
        route: Route,
        notifiers: dict[str, Notifier],
        db: StateFile,
        silencer: Silencer,
        inhibitor: Inhibitor,
        external_url: str = "",
        wall: WallClock | None = None,
    ) -> None:
        self.route = route
        self.notifiers = notifiers
        self.rows = db.part(GroupRows)
        self.nflog = db.part(NotificationLog)
        self.silencer = silencer
        self.inhibitor = inhibitor
        self.external_url = external_url
        self.wall: WallClock = wall or SystemClock()
        self.groups: dict[tuple[str, str], Group] = {}
        self.alerts: dict[str, Alert] = {}
        self.stats = {name: ReceiverStats() for name in notifiers}
        self.limiters = {
            name: RateLimiter(rate=n.rate.per_second, burst=n.rate.burst)
            for name, n in notifiers.items()
        }
        self.muted = {"silenced": 0, "inhibited": 0}
        self.group_overflow = 0
        self._closing = False
        self._holds = 0
        self._released = asyncio.Event()
        self._released.set()
        # Told (receiver, seconds from first attempt to acceptance) after each delivery.
        self.on_delivered: Callable[[str, float], None] | None = None

    # -- intake ---------------------------------------------------------------------

    def put(self, alert: Alert) -> None:
        if self._closing:
            return
        self.alerts[alert.fingerprint] = alert
        for route in self.route.match(alert.labels):
            self._insert(route, alert, persist=True)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While a burst is fired piece by piece: a group an alert reaches meanwhile waits
        for the end of the hold before it flushes (at most HOLD_FLUSH_MAX), so the burst
        is one notification per group, as if it had been fired in one pass. Groups the
        hold's alerts do not reach flush as usual."""
        self._holds += 1
        self._released.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds:
                self._released.set()

    def restore(self) -> int:
        """Reload the groups' alerts from the last run (call inside the running loop)."""
        n = 0
        for _receiver, _key, body in self.rows.load():
            alert = Alert(
                fingerprint=body["fingerprint"],
                labels=body["labels"],
                annotations=body["annotations"],
                starts_at=body["starts_at"],
                ends_at=body["ends_at"],
            )
            if alert.fingerprint not in self.alerts or alert.ends_at is not None:
                self.alerts[alert.fingerprint] = alert
            for route in self.route.match(alert.labels):
                self._insert(route, alert, persist=False)
            n += 1
        return n

    def _insert(self, route: Route, alert: Alert, *, persist: bool) -> None:
        key = route.group_key(alert.labels)
        gid = (route.receiver, key)
        group = self.groups.get(gid)
        if group is None:
            if len(self.groups) >= MAX_GROUPS:
                self.group_overflow += 1
                self.stats[route.receiver].dropped += 1
                log.error("dispatch.group_overflow", receiver=route.receiver, limit=MAX_GROUPS)
                return
            group = Group(route=route, key=key, labels=route.group_labels(alert.labels))
            self.groups[gid] = group
            # Under the guard: a group whose task raised would never notify again.
            group.task = spawn(
                f"group:{route.receiver}:{key}",
                lambda: self._run_group(group),
                kind="group",
                eternal=False,
            )
        if alert.fingerprint not in group.alerts and len(group.alerts) >= MAX_ALERTS_PER_GROUP:
            self.stats[route.receiver].dropped += 1
            return
        group.alerts[alert.fingerprint] = alert
        if self._holds:
            group.held = True
        if persist:
            self.rows.save(route.receiver, key, alert.fingerprint, alert)
        group.dirty.set()

    # -- the group's life -----------------------------------------------------------

    async def _run_group(self, group: Group) -> None:
        await asyncio.sleep(group.route.group_wait)
        while True:
            if group.held:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HOLD_FLUSH_MAX):
                        await self._released.wait()
                group.held = False
            group.dirty.clear()
            await self.flush(group)
            if not group.alerts:
                self.groups.pop((group.route.receiver, group.key), None)
                if group.route.receiver in self.stats:
                    self.stats[group.route.receiver].retrying.discard(group.key)
                return
            await asyncio.sleep(group.route.group_interval)

    async def flush(self, group: Group, *, deadline: float | None = None) -> bool:
        """One pass of the stages for one group. True when nothing is left to retry."""
        receiver = group.route.receiver
        notifier = self.notifiers[receiver]
        stats = self.stats[receiver]
        now = self.wall.now()
        snapshot = dict(group.alerts)
        if notifier.resend_every is not None:
            # A receiver that keeps its own copy of the alerts (an Alertmanager, which
            # applies its own silences and inhibition) hears every alert, muted ones too:
            # one it stops hearing of it resolves by itself, a false resolve.
            alerts = list(snapshot.values())
        else:
            alerts = stages.mute(
                snapshot.values(),
                active=(a for a in self.alerts.values() if a.firing),
                silencer=self.silencer,
                inhibitor=self.inhibitor,
                now=now,
                counts=self.muted,
            )
        firing = {a.fingerprint for a in alerts if a.firing}
        resolved = {a.fingerprint for a in alerts if not a.firing}
        repeat = group.route.repeat_interval
        if notifier.resend_every is not None:
            repeat = min(repeat, notifier.resend_every)
        alerts = stages.dedup(
            alerts,
            self.nflog.get(receiver, group.key),
            firing=firing,
            resolved=resolved,
            repeat=repeat,
            send_resolved=notifier.send_resolved,
            now=now,
        )
        if not alerts:
            self._retire_resolved(group, snapshot)
            return True
        notification = Notification(
            receiver=receiver,
            group_key=group.key,
            group_labels=group.labels,
            # Time in status as of this send: a repeat says how long it has been by now.
            alerts=tuple(live(a, now) for a in sorted(alerts, key=lambda a: a.starts_at)),
            external_url=self.external_url,
        )
        loop = asyncio.get_running_loop()
        first_attempt = loop.time()
        large = len(notification.alerts) >= HOLD_WRITES_AT
        with self.rows.file.holding() if large else contextlib.nullcontext():
            sent = await stages.retry_notify(
                notification,
                notifier=notifier,
                throttle=self.limiters[receiver].acquire,
                stats=stats,
                now=self.wall.now,
                budget=deadline
                if deadline is not None
                else min(MAX_FLUSH, max(5.0, group.route.group_interval)),
            )
        if not sent:
            return False
        took = loop.time() - first_attempt
        await stages.record(
            notification,
            nflog=self.nflog,
            stats=stats,
            firing=firing,
            resolved=resolved,
            sent_at=now,
            now=self.wall.now(),
        )
        if self.on_delivered is not None:
            self.on_delivered(receiver, took)
        self._retire_resolved(group, snapshot)
        return True

    def _retire_resolved(self, group: Group, snapshot: dict[str, Alert]) -> None:
        """Resolved alerts that were in this flush and did not change since are done."""
        done = [fp for fp, a in snapshot.items() if not a.firing and group.alerts.get(fp) is a]
        for fp in done:
            del group.alerts[fp]
        if done:
            self.rows.delete(group.route.receiver, group.key, done)
        for fp in done:
            if not any(fp in g.alerts for g in self.groups.values()):
                self.alerts.pop(fp, None)

    def hand_over(self, fingerprints: Iterable[str]) -> int:
        """Drop these alerts from every group without a notification: another replica
        now owns their identity and notifies for them (resharding). Returns how many
        group entries were dropped."""
        fps = set(fingerprints)
        n = 0
        for group in self.groups.values():
            gone = [fp for fp in group.alerts if fp in fps]
            for fp in gone:
                del group.alerts[fp]
            if gone:
                n += len(gone)
                self.rows.delete(group.route.receiver, group.key, gone)
                group.dirty.set()
        for fp in fps:
            self.alerts.pop(fp, None)
        return n

    def reconfigure(
        self, *, route: Route, notifiers: dict[str, Notifier], inhibitor: Inhibitor
    ) -> None:
        """A reloaded config: new alerts follow the new tree; groups of receivers that no
        longer exist are dropped (and counted), the rest finish under their old route."""
        self.route = route
        self.inhibitor = inhibitor
        self.notifiers = notifiers
        for name, n in notifiers.items():
            self.stats.setdefault(name, ReceiverStats())
            self.limiters.setdefault(name, RateLimiter(rate=n.rate.per_second, burst=n.rate.burst))
        for gid, group in list(self.groups.items()):
            if gid[0] not in notifiers:
                if group.task is not None:
                    group.task.cancel()
                self.stats[gid[0]].dropped += len(group.alerts)
                self.rows.delete(gid[0], group.key, list(group.alerts))
                del self.groups[gid]
                log.warning(
                    "dispatch.receiver_removed",
                    receiver=gid[0],
                    group=group.key,
                    alerts=len(group.alerts),
                )

    # -- shutdown and housekeeping ---------------------------------------------------

    async def run(self) -> None:
        """Housekeeping: expire old notification-log entries and silences."""
        while True:
            now = self.wall.now()
            await self.nflog.gc(now)
            self.silencer.gc(now)
            await asyncio.sleep(600)

    async def close(self, *, deadline: float = 2.0) -> None:
        """One last flush of groups with unsent changes, then stop every group."""
        self._closing = True
        # The loop's clock, like every other schedule here (and a virtual one in tests).
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for group in list(self.groups.values()):
            left = deadline - (loop.time() - t0)
            if left <= 0:
                break
            if group.task is not None:
                group.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await group.task
            if group.dirty.is_set():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.flush(group, deadline=left), left)
        for group in self.groups.values():
            if group.task is not None and not group.task.done():
                group.task.cancel()
