"""Dispatch: route → aggregation group → a pipeline of small stages (Alertmanager).

Each alert state change is routed; each matching route puts it into the
aggregation group for its group key. A group flushes ``group_wait`` after it
is created and every ``group_interval`` after that, through the stages:

    silence → inhibit → dedup (notification log) → throttle → retry + notify → record

A stage filters by returning fewer alerts; an empty result ends the flush.
The notification log is written only after a successful send, so a failed
flush is simply tried again on the next one; it and the groups' alerts live
in SQLite, so a restart neither re-pages nor forgets a pending resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from watchd.alerting.model import Alert, live
from watchd.alerting.receivers.base import Notification, Notifier, NotifyError
from watchd.alerting.routing import Route
from watchd.alerting.silencing import Inhibitor, Silencer
from watchd.kits import logs
from watchd.kits.backoff import Backoff
from watchd.kits.clock import SystemClock, WallClock
from watchd.kits.ratelimit import RateLimiter
from watchd.kits.tasks import spawn
from watchd.store.persistence import NflogEntry, StateDB

log = logs.get("watchd.alerting")

# A group and its notification-log entry are kept this long after the last send.
NFLOG_RETENTION = 5 * 24 * 3600.0
MAX_GROUPS = 10_000
MAX_ALERTS_PER_GROUP = 10_000
# One flush (with its retries) may take at most this long; the next flush retries.
MAX_FLUSH = 60.0


@dataclass
class ReceiverStats:
    sent: int = 0
    failed: int = 0
    retried: int = 0
    dropped: int = 0
    last_error: str = ""
    last_success: float | None = None
    last_failure: float | None = None
    permanent_failures: int = 0
    # Group keys whose last flush failed transiently: retried on their next flush.
    retrying: set[str] = field(default_factory=set)


@dataclass
class Group:
    route: Route
    key: str
    labels: dict[str, str]
    alerts: dict[str, Alert] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    dirty: asyncio.Event = field(default_factory=asyncio.Event)


def needs_update(
    entry: NflogEntry | None,
    firing: set[str],
    resolved: set[str],
    *,
    repeat: float,
    send_resolved: bool,
    now: float,
) -> bool:
    """Alertmanager's DedupStage.needsUpdate."""
    if entry is None:
        return bool(firing)
    if not firing <= entry.firing:
        return True
    if not firing:
        # Everything resolved: tell the receiver only if it knew of firing alerts.
        return bool(entry.firing)
    if send_resolved and not resolved <= entry.resolved:
        return True
    return entry.sent_at < now - repeat


class Dispatcher:
    """The AlertSink behind the detector: groups, flushes, delivers."""

    def __init__(
        self,
        *,
        route: Route,
        notifiers: dict[str, Notifier],
        db: StateDB,
        silencer: Silencer,
        inhibitor: Inhibitor,
        external_url: str = "",
        wall: WallClock | None = None,
    ) -> None:
        self.route = route
        self.notifiers = notifiers
        self.db = db
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
        # Told (receiver, seconds from first attempt to acceptance) after each delivery.
        self.on_delivered: Callable[[str, float], None] | None = None

    # -- intake ---------------------------------------------------------------------

    def put(self, alert: Alert) -> None:
        if self._closing:
            return
        self.alerts[alert.fingerprint] = alert
        for route in self.route.match(alert.labels):
            self._insert(route, alert, persist=True)

    def restore(self) -> int:
        """Reload the groups' alerts from the last run (call inside the running loop)."""
        n = 0
        for _receiver, _key, body in self.db.dispatch_load():
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
        if persist:
            self.db.dispatch_save(route.receiver, key, alert.fingerprint, alert)
        group.dirty.set()

    # -- the group's life -----------------------------------------------------------

    async def _run_group(self, group: Group) -> None:
        await asyncio.sleep(group.route.group_wait)
        while True:
            group.dirty.clear()
            await self.flush(group)
            if not group.alerts:
                self.groups.pop((group.route.receiver, group.key), None)
                if group.route.receiver in self.stats:
                    self.stats[group.route.receiver].retrying.discard(group.key)
                return
            await asyncio.sleep(group.route.group_interval)

    async def flush(self, group: Group, *, deadline: float | None = None) -> bool:
        """One pass of the pipeline for one group. True when nothing is left to retry."""
        receiver = group.route.receiver
        notifier = self.notifiers[receiver]
        stats = self.stats[receiver]
        now = self.wall.now()
        snapshot = dict(group.alerts)
        alerts = self._mute(snapshot.values(), now)
        firing = {a.fingerprint for a in alerts if a.firing}
        resolved = {a.fingerprint for a in alerts if not a.firing}
        entry = self.db.nflog_get(receiver, group.key)
        repeat = group.route.repeat_interval
        if notifier.resend_every is not None:
            repeat = min(repeat, notifier.resend_every)
        if not alerts or not needs_update(
            entry, firing, resolved, repeat=repeat, send_resolved=notifier.send_resolved, now=now
        ):
            self._retire_resolved(group, snapshot)
            return True
        if not notifier.send_resolved:
            alerts = [a for a in alerts if a.firing]
        notification = Notification(
            receiver=receiver,
            group_key=group.key,
            group_labels=group.labels,
            # Time in status as of this send: a repeat says how long it has been by now.
            alerts=tuple(live(a, now) for a in sorted(alerts, key=lambda a: a.starts_at)),
            external_url=self.external_url,
        )
        loop = asyncio.get_running_loop()
        give_up = loop.time() + (
            deadline
            if deadline is not None
            else min(MAX_FLUSH, max(5.0, group.route.group_interval))
        )
        backoff = Backoff(base=1.0, cap=30.0)
        first_attempt = loop.time()
        while True:
            await self.limiters[receiver].acquire()
            try:
                try:
                    await notifier.notify(notification)
                except (NotifyError, asyncio.CancelledError):
                    raise
                except Exception as bug:
                    # A notifier raising anything else (a bug, a library surprise) is a
                    # retryable failure, never a dead group.
                    log.exception("receiver.raised", receiver=receiver)
                    raise NotifyError(
                        f"{receiver}: {type(bug).__name__}: {bug}"[:300], retryable=True
                    ) from bug
            except NotifyError as exc:
                stats.last_error = str(exc)
                stats.last_failure = self.wall.now()
                if not exc.retryable:
                    stats.retrying.discard(group.key)
                    stats.failed += 1
                    stats.permanent_failures += 1
                    log.error(
                        "receiver.misconfigured",
                        receiver=receiver,
                        error=str(exc),
                        note="permanent failure: fix the receiver's configuration",
                    )
                    return False
                stats.retrying.add(group.key)  # until a send of this group succeeds
                delay = backoff.next()
                if exc.retry_after is not None:
                    delay = max(delay, exc.retry_after)
                if loop.time() + delay > give_up:
                    stats.failed += 1
                    log.warning(
                        "receiver.failed",
                        receiver=receiver,
                        error=str(exc),
                        note="will retry on the next flush",
                    )
                    return False
                stats.retried += 1
                await asyncio.sleep(delay)
                continue
            break
        stats.sent += 1
        stats.retrying.discard(group.key)
        stats.last_success = self.wall.now()
        if self.on_delivered is not None:
            self.on_delivered(receiver, loop.time() - first_attempt)
        # In a worker thread: it may wait for the state flusher's commit.
        await asyncio.to_thread(
            self.db.nflog_put,
            NflogEntry(
                receiver,
                group.key,
                frozenset(firing),
                frozenset(resolved),
                sent_at=now,
                expires_at=now + NFLOG_RETENTION,
            ),
        )
        log.info(
            "notification.sent",
            receiver=receiver,
            group=group.key,
            firing=len(firing),
            resolved=len(resolved),
        )
        self._retire_resolved(group, snapshot)
        return True

    def _mute(self, alerts: Iterable[Alert], now: float) -> list[Alert]:
        inhibited = self.inhibitor.prepare(a for a in self.alerts.values() if a.firing)
        out = []
        for a in alerts:
            if self.silencer.muted_by(a.labels, now):
                self.muted["silenced"] += 1
                continue
            if a.firing and inhibited(a):
                self.muted["inhibited"] += 1
                continue
            out.append(a)
        return out

    def _retire_resolved(self, group: Group, snapshot: dict[str, Alert]) -> None:
        """Resolved alerts that were in this flush and did not change since are done."""
        done = [fp for fp, a in snapshot.items() if not a.firing and group.alerts.get(fp) is a]
        for fp in done:
            del group.alerts[fp]
        if done:
            self.db.dispatch_delete(group.route.receiver, group.key, done)
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
                self.db.dispatch_delete(group.route.receiver, group.key, gone)
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
                self.db.dispatch_delete(gid[0], group.key, list(group.alerts))
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
            self.db.nflog_gc(now)
            self.silencer.gc(now)
            await asyncio.sleep(600)

    async def close(self, *, deadline: float = 2.0) -> None:
        """One last flush of groups with unsent changes, then stop every group."""
        self._closing = True
        t0 = time.monotonic()
        for group in list(self.groups.values()):
            left = deadline - (time.monotonic() - t0)
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
