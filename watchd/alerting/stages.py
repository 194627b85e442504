"""The stages one flush of an aggregation group runs through (Alertmanager's Stage).

    mute (silence, inhibit) → dedup (notification log) → throttle → retry + notify → record

Each stage has one job. A filtering stage returns fewer alerts, and an empty
result ends the flush. Retry + notify answers whether the receiver accepted the
notification; record notes a success in the notification log and the receiver's
stats (a failure is recorded by retry + notify, which knows why). Nothing here
owns a group or a task: :mod:`watchd.alerting.dispatch` composes the stages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from watchd.alerting.model import Alert
from watchd.alerting.nflog import NflogEntry, NotificationLog, needs_update
from watchd.alerting.receivers.base import Notification, Notifier, NotifyError
from watchd.alerting.silencing import Inhibitor, Silencer
from watchd.kits import logs
from watchd.kits.backoff import Backoff

log = logs.get("watchd.alerting")


@dataclass
class ReceiverStats:
    sent: int = 0
    failed: int = 0
    retried: int = 0
    dropped: int = 0
    last_error: str = ""
    last_success: float | None = None
    last_failure: float | None = None
    # Group keys whose last flush failed transiently: retried on their next flush.
    retrying: set[str] = field(default_factory=set)
    # Loop time before which the receiver asked not to be sent to (its Retry-After): it
    # holds across flushes, and for every group of the receiver.
    hold_until: float = 0.0


def mute(
    alerts: Iterable[Alert],
    *,
    active: Iterable[Alert],
    silencer: Silencer,
    inhibitor: Inhibitor,
    now: float,
    counts: dict[str, int],
) -> list[Alert]:
    """Mute: drop alerts a silence matches, and firing alerts that one of the
    ``active`` (firing) alerts inhibits; ``counts`` says how many, by reason."""
    if not silencer.silences and not inhibitor.rules:
        # Nothing can mute: no index of every firing alert to build for a burst's flush.
        return list(alerts)
    inhibited = inhibitor.prepare(active)
    silences = bool(silencer.silences)
    if not silences and not inhibited.sources:
        return list(alerts)  # no silence, and no firing alert is a source: nothing mutes
    out = []
    for a in alerts:
        if silences and silencer.muted_by(a.labels, now):
            counts["silenced"] += 1
            continue
        if a.firing and inhibited(a):
            counts["inhibited"] += 1
            continue
        out.append(a)
    return out


def dedup(
    alerts: list[Alert],
    entry: NflogEntry | None,
    *,
    firing: set[str],
    resolved: set[str],
    repeat: float,
    send_resolved: bool,
    now: float,
) -> list[Alert]:
    """Dedup: nothing when the receiver was already told all of this (and the repeat
    interval has not passed); resolved alerts go only to receivers that want them."""
    if not alerts or not needs_update(
        entry, firing, resolved, repeat=repeat, send_resolved=send_resolved, now=now
    ):
        return []
    return alerts if send_resolved else [a for a in alerts if a.firing]


async def retry_notify(
    notification: Notification,
    *,
    notifier: Notifier,
    throttle: Callable[[], Awaitable[object]],
    stats: ReceiverStats,
    now: Callable[[], float],
    budget: float,
) -> bool:
    """Throttle, then retry + notify: send (each attempt waits for the receiver's rate
    limit), retrying a retryable failure with backoff (no sooner than Retry-After)
    while within ``budget`` seconds. A Retry-After holds past the flush: a later flush
    (of any of the receiver's groups) waits for it too, or gives up at once when it lies
    beyond its budget. True when the receiver accepted it."""
    receiver, group_key = notification.receiver, notification.group_key
    loop = asyncio.get_running_loop()
    give_up = loop.time() + budget
    backoff = Backoff(base=1.0, cap=30.0)
    while True:
        hold = stats.hold_until - loop.time()
        if hold > 0:
            if loop.time() + hold > give_up:
                return False  # still asked to wait past this flush: the next one tries
            await asyncio.sleep(hold)
        await throttle()
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
            stats.last_failure = now()
            if not exc.retryable:
                stats.retrying.discard(group_key)
                stats.failed += 1
                log.error(
                    "receiver.misconfigured",
                    receiver=receiver,
                    error=str(exc),
                    note="permanent failure: fix the receiver's configuration",
                )
                return False
            stats.retrying.add(group_key)  # until a send of this group succeeds
            delay = backoff.next()
            if exc.retry_after is not None:
                delay = max(delay, exc.retry_after)
                stats.hold_until = max(stats.hold_until, loop.time() + exc.retry_after)
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
        return True


async def record(
    notification: Notification,
    *,
    nflog: NotificationLog,
    stats: ReceiverStats,
    firing: set[str],
    resolved: set[str],
    sent_at: float,
    now: float,
) -> None:
    """Record: a sent notification in the receiver's stats and the notification log
    (only ever after a success, so a failed flush is retried)."""
    receiver, group_key = notification.receiver, notification.group_key
    stats.sent += 1
    stats.retrying.discard(group_key)
    stats.last_success = now
    await nflog.record(receiver, group_key, firing=firing, resolved=resolved, sent_at=sent_at)
    log.info(
        "notification.sent",
        receiver=receiver,
        group=group_key,
        firing=len(firing),
        resolved=len(resolved),
    )
