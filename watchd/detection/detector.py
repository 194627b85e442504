"""The stuck detector (docs/alerting.md).

Watchers feed it store changes; it arms one timer per chat clock on a heap
(never scans all chats), and when a clock runs past its budget on the
*server's* clock it asks the identity's :class:`Confirmer` to re-read the
chat (a rate-limited GET, or one listing when many are due together) before
anything fires. While an identity is not ready (unseeded, disconnected) its
due chats wait; an identity unready past its grace raises IdentityUnhealthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import re
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import structlog

from watchd.alerting.model import Alert, AlertSink, fingerprint, resolution
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.models import ACTIVE_STATUSES, BLOCKED_STATUSES, IDLE_STATUSES, Chat
from watchd.config.fields import format_duration
from watchd.config.watching import Budgets
from watchd.detection.budgets import budget, past_budget
from watchd.detection.diagnosis import INVALID_HINT, Facts, hint
from watchd.detection.health import IdentityHealth
from watchd.detection.timers import TimerHeap
from watchd.kits import logs
from watchd.kits.clock import SystemClock, WallClock
from watchd.kits.tasks import CRASH_LOOP, TASKS, spawn
from watchd.store.chats import (
    CLOCK_LOWER_BOUND,
    CLOCK_SYNTHESIZED,
    Change,
    ChatRecord,
    ChatStore,
)
from watchd.store.persistence import StateDB, StoredAlert

log = logs.get("watchd.detection")

CLOCK_TEXT = {
    "transition": "transition seen on the watch stream (exact)",
    CLOCK_SYNTHESIZED: "transition found by a listing; clock from updated_at (a lower bound)",
    CLOCK_LOWER_BOUND: "first seen in a listing; clock from updated_at (a lower bound: the "
    "true time in status is at least this)",
}
SEVERITY = {
    "ChatStuck": "warning",
    "ChatStranded": "warning",
    "ChatStalled": "warning",
    "ChatFailed": "info",
    "IdentityUnhealthy": "critical",
}
CHAT_VERDICTS = frozenset({"ChatStuck", "ChatStranded", "ChatStalled", "ChatFailed"})
_LABEL_KEY = re.compile(r"[^a-zA-Z0-9_]")
RETRY_CONFIRM_AFTER = 30.0
# Before confirming, let a burst of due chats finish coming due: wait until no new one
# arrived for SETTLE_QUIET and no deadline is imminent (at most SETTLE_MAX), so one listing
# confirms the whole burst.
SETTLE_QUIET = 0.05
SETTLE_LOOKAHEAD = 0.25  # a deadline this close still belongs to the burst
SETTLE_MAX = 1.0
# Workspace builds read for one burst's diagnosis; the rest use what is cached.
BURST_LOOKUPS = 20
HISTORY = 500
KNOWN_STATUSES = ACTIVE_STATUSES | BLOCKED_STATUSES | IDLE_STATUSES


class Confirmer(Protocol):
    """What the detector needs from an identity's watcher."""

    async def get_chat(self, chat_id: str) -> Chat: ...

    async def relist(self) -> None: ...

    async def facts(self, record: ChatRecord, *, lookup: bool = True) -> Facts: ...


@dataclass
class Watched:
    health: IdentityHealth
    confirmer: Confirmer
    budgets: Budgets
    labels: Mapping[str, str]
    pending: dict[tuple[str, str, str], float] = field(default_factory=dict)
    deferred: set[tuple[str, str, str]] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # status → budget seconds (None: never stuck), filled on first use per status.
    limits: dict[str, float | None] = field(default_factory=dict)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


class Detector:
    def __init__(
        self,
        *,
        store: ChatStore,
        sink: AlertSink,
        db: StateDB | None = None,
        confirm_rate: float = 4.0,
        listing_threshold: int = 20,
        chat_failed: bool = False,
        link_template: str = "{deployment}/agents/{chat_id}",
        wall: WallClock | None = None,
    ) -> None:
        self.wall: WallClock = wall or SystemClock()
        self.store = store
        self.sink = sink
        self.db = db
        self.confirm_rate = confirm_rate
        self.listing_threshold = listing_threshold
        self.chat_failed = chat_failed
        self.link_template = link_template
        self.timers = TimerHeap()
        self.watched: dict[str, Watched] = {}
        self.firing: dict[str, Alert] = {}
        self._by_chat: dict[tuple[str, str], set[str]] = {}
        # Clocks whose alert is firing: not re-armed until it resolves (no re-confirm loop).
        self._firing_clocks: dict[tuple[str, str, str], str] = {}
        self.history: deque[Alert] = deque(maxlen=HISTORY)
        self._wake = asyncio.Event()
        self._next_wake = 0.0  # wall time the loop will look at the heap next
        self._unknown_statuses: set[str] = set()
        self._label_keys: dict[str, str] = {}  # chat label key -> alert label name
        self._durations: dict[int, str] = {}
        # (identity, chat id) -> coderd's message, for chats whose execution state a
        # mutation found invalid (told by the sweep); cleared when the chat moves.
        self.invalid: dict[tuple[str, str], str] = {}
        self.counters = {
            "fired": 0,
            "resolved": 0,
            "confirm_get": 0,
            "confirm_listing": 0,
            "confirm_failed": 0,
            "deferred": 0,
            "unfounded": 0,
        }
        if db is not None:
            for row in db.load_alerts():
                if row.ends_at is None:
                    self._remember(
                        Alert(
                            fingerprint=row.fingerprint,
                            labels=row.labels,
                            annotations=row.annotations,
                            starts_at=row.starts_at,
                        )
                    )

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
        # Under the guard: a confirmer that raises restarts (counted, logged with its
        # traceback) instead of silently ending this identity's verdicts for good.
        w.task = spawn(f"confirm:{health.name}", lambda: self._confirm_loop(w), kind="confirm")
        for rec in self.store.records(health.name):
            self._arm(rec)
        self._wake.set()

    async def unregister(self, name: str, *, reason: str, resolve: bool = True) -> None:
        """Stop watching an identity: its timers lapse; its alerts resolve unless the
        identity is only being restarted (``resolve=False``)."""
        w = self.watched.pop(name, None)
        if w and w.task:
            w.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w.task
        if not resolve:
            return
        now = self.wall.now()
        for fp, alert in list(self.firing.items()):
            if alert.labels.get("identity") == name:
                self._resolve(fp, at=now, why=reason)

    def hand_over(self, name: str) -> list[str]:
        """Forget an identity's firing alerts without resolving them: another replica owns
        the identity now (resharding) and keeps them firing under the same fingerprints.
        Returns the fingerprints dropped."""
        dropped = []
        for fp, alert in list(self.firing.items()):
            if alert.labels.get("identity") != name:
                continue
            del self.firing[fp]
            chat = alert.labels.get("chat_id")
            if chat:
                clock = "stalled" if alert.name == "ChatStalled" else "status"
                self._firing_clocks.pop((name, chat, clock), None)
                fps = self._by_chat.get((name, chat))
                if fps is not None:
                    fps.discard(fp)
                    if not fps:
                        del self._by_chat[(name, chat)]
            if self.db is not None:
                self.db.delete_alert(fp)
            dropped.append(fp)
        return dropped

    def readiness_changed(self, name: str) -> None:
        """Called by the watcher after a seed completes or the stream is lost."""
        w = self.watched.get(name)
        if w is None:
            return
        if w.health.ready:
            # First verdicts after (re)seeding: alerts for chats no longer known resolve.
            for fp, alert in list(self.firing.items()):
                if alert.labels.get("identity") != name or "chat_id" not in alert.labels:
                    continue
                if self.store.get(name, alert.labels["chat_id"]) is None:
                    self._resolve(fp, at=w.health.server_clock.now(), why="chat gone")
            for key in w.deferred:
                w.pending[key] = 0.0
            w.deferred.clear()
            w.wake.set()
        self._wake.set()

    # -- changes from watchers ----------------------------------------------------

    def apply(self, identity: str, changes: Iterable[Change]) -> None:
        # Runs once per burst of watch events and per listing page: keep it lean, and
        # decide about waking the loop once, after the whole batch is armed.
        db = self.db
        by_chat = self._by_chat
        w = self.watched.get(identity)
        arm = self._arm_clocks
        armed = False
        for change in changes:
            rec = change.record
            kind = change.kind
            if kind == "tombstone":
                log.info(
                    "chat.tombstoned", identity=identity, chat_id=rec.chat_id, reason=change.reason
                )
                if db is not None:
                    db.mark_deleted(identity, rec.chat_id)
                self._resolve_chat(rec, why=_GONE.get(change.reason, f"chat {change.reason}"))
                continue
            if db is not None:
                db.mark(rec)
            prev = change.previous
            if kind == "transition" and rec.clock == CLOCK_SYNTHESIZED:
                log.info(
                    "transition.synthesized",
                    identity=identity,
                    chat_id=rec.chat_id,
                    to=rec.status,
                    **{"from": prev.status if prev else None},
                )
            if prev is not None and prev.status != rec.status and self.invalid:
                self.invalid.pop(rec.key, None)
            if prev is not None and (identity, rec.chat_id) in by_chat:
                if prev.status != rec.status:
                    self._resolve_chat(prev, why=f"left {prev.status} for {rec.status}")
                elif kind == "refresh" and prev.updated_at != rec.updated_at:
                    # Progress on the server: the stalled clock restarts.
                    self._resolve_chat(prev, why="progress", names=("ChatStalled",))
            if rec.status not in KNOWN_STATUSES and rec.status not in self._unknown_statuses:
                self._unknown_statuses.add(rec.status)
                log.warning(
                    "status.unknown",
                    status=rec.status,
                    identity=identity,
                    note="treated as active with the default budget",
                )
            if w is not None:
                arm(w, rec)
                armed = True
        if armed:
            nxt = self.timers.next_deadline()
            if nxt is not None and nxt < self._next_wake:
                # Only a deadline earlier than the loop's planned wake-up needs a wake-up.
                self._wake.set()

    def _arm(self, rec: ChatRecord) -> None:
        w = self.watched.get(rec.identity)
        if w is None:
            return
        self._arm_clocks(w, rec)
        nxt = self.timers.next_deadline()
        if nxt is not None and nxt < self._next_wake:
            # Only a deadline earlier than the loop's planned wake-up needs a wake-up.
            self._wake.set()

    def _arm_clocks(self, w: Watched, rec: ChatRecord) -> None:
        offset = w.health.server_clock.offset
        status = rec.status
        try:
            limit = w.limits[status]
        except KeyError:
            limit = w.limits[status] = budget(w.budgets, status)
        key = (rec.identity, rec.chat_id, "status")
        firing = self._firing_clocks
        timers = self.timers
        if key in firing:
            timers.cancel(key)
        elif limit is not None:
            timers.arm(key, rec.since + limit - offset, rec.version)
        elif self.chat_failed and status == "error":
            timers.arm(key, rec.since - offset, rec.version)
        else:
            timers.cancel(key)
        stalled = w.budgets.stalled
        skey = (rec.identity, rec.chat_id, "stalled")
        if skey in firing:
            timers.cancel(skey)
        elif stalled is not None and status == "running" and rec.updated_at:
            timers.arm(skey, rec.updated_at + stalled - offset, int(rec.updated_at * 1000))
        else:
            timers.cancel(skey)

    # -- the loop -----------------------------------------------------------------

    async def run(self) -> None:
        """Fire due timers, tick identity health; sleeps until the next deadline (≤1 s)."""
        try:
            while True:
                now = self.wall.now()
                for due in self.timers.pop_due(now):
                    self._due(due.key)
                self._health_tick()
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

    def _due(self, key: tuple[str, str, str]) -> None:
        identity, chat_id, _clock = key
        w = self.watched.get(identity)
        if w is None or key in self._firing_clocks or self.store.get(identity, chat_id) is None:
            return
        if not w.health.ready:
            w.deferred.add(key)
            self.counters["deferred"] += 1
            return
        w.pending[key] = self.wall.now()
        w.wake.set()

    def _past(self, w: Watched, rec: ChatRecord, clock: str) -> tuple[str, float, float] | None:
        """(alert name, time in clock, budget) when ``rec`` is past its budget now."""
        now = w.health.server_clock.now()
        return past_budget(w.budgets, rec, now=now, clock=clock, chat_failed=self.chat_failed)

    async def _confirm_loop(self, w: Watched) -> None:
        interval = 1.0 / self.confirm_rate
        while True:
            await w.wake.wait()
            w.wake.clear()
            while w.pending:
                await self._settle(w)
                if not w.health.ready:
                    w.deferred.update(w.pending)
                    w.pending.clear()
                    break
                batch = list(w.pending)
                w.pending.clear()
                try:
                    if len(batch) >= self.listing_threshold:
                        await self._confirm_by_listing(w, batch)
                        continue
                    for i, key in enumerate(batch):
                        try:
                            await self._confirm_one(w, key)
                        except Exception:
                            batch = batch[i:]
                            raise
                        await asyncio.sleep(interval)
                except Exception as exc:
                    # A bug (a confirmer that raised): the chats of this batch are due again
                    # later, and the guard restarts this loop; nothing is silently dropped.
                    self._confirm_failed(w, batch, exc)
                    raise

    async def _settle(self, w: Watched) -> None:
        """Chats that cross their budget together come due over a few milliseconds (or a
        second): wait while the burst is still growing or more deadlines are imminent, so
        it takes one listing, not one listing per slice (a listing of a large fleet takes
        seconds). At most SETTLE_MAX."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + SETTLE_MAX
        seen = len(w.pending)
        while loop.time() < give_up:
            await asyncio.sleep(SETTLE_QUIET)
            nxt = self.timers.next_deadline()
            imminent = nxt is not None and nxt - self.wall.now() < SETTLE_LOOKAHEAD
            if len(w.pending) == seen and not imminent:
                return
            seen = len(w.pending)

    async def _confirm_by_listing(self, w: Watched, batch: list[tuple[str, str, str]]) -> None:
        self.counters["confirm_listing"] += 1
        started = time.monotonic()
        try:
            await w.confirmer.relist()
        except (CoderError, PayloadError) as exc:
            self._confirm_failed(w, batch, exc)
            return
        log.info(
            "confirm.listed",
            identity=w.health.name,
            due=len(batch),
            seconds=round(time.monotonic() - started, 3),
        )
        items = []
        for identity, chat_id, clock in batch:
            rec = self.store.get(identity, chat_id)
            if rec is not None:
                items.append((rec, clock))
        await self._verdicts(w, items)

    async def _confirm_one(self, w: Watched, key: tuple[str, str, str]) -> None:
        with structlog.contextvars.bound_contextvars(identity=key[0], chat_id=key[1]):
            await self._confirm_one_bound(w, key)

    async def _confirm_one_bound(self, w: Watched, key: tuple[str, str, str]) -> None:
        identity, chat_id, clock = key
        if key in self._firing_clocks:
            return  # queued before its alert fired: nothing left to confirm
        rec = self.store.get(identity, chat_id)
        if rec is None or self._past(w, rec, clock) is None:
            self._rearm(rec)
            return
        self.counters["confirm_get"] += 1
        try:
            chat = await w.confirmer.get_chat(chat_id)
        except CoderError as exc:
            if exc.status == 404:
                gone = self.store.tombstone(identity, chat_id, reason="gone")
                if gone is not None:
                    self.apply(identity, [gone])
                return
            self._confirm_failed(w, [key], exc)
            return
        except PayloadError as exc:
            self._confirm_failed(w, [key], exc)
            return
        change = self.store.observe(identity, chat, now=w.health.server_clock.now(), via="confirm")
        if change is not None:
            self.apply(identity, [change])
        rec = self.store.get(identity, chat_id)
        if rec is not None:
            await self._verdicts(w, [(rec, clock)])

    def _confirm_failed(self, w: Watched, keys: list[tuple[str, str, str]], exc: Exception) -> None:
        """The re-read failed: nothing fires; try again later; the identity says why."""
        self.counters["confirm_failed"] += 1
        w.health.last_error = f"confirmation failed: {exc}"
        log.warning("confirm.failed", identity=w.health.name, error=str(exc), chats=len(keys))
        retry = self.wall.now() + RETRY_CONFIRM_AFTER
        for identity, chat_id, clock in keys:
            rec = self.store.get(identity, chat_id)
            if rec is not None:
                version = rec.version if clock == "status" else int((rec.updated_at or 0) * 1000)
                self.timers.arm((identity, chat_id, clock), retry, version)
        self._wake.set()

    def _rearm(self, rec: ChatRecord | None) -> None:
        if rec is not None:
            self._arm(rec)
            self._wake.set()

    async def _verdicts(self, w: Watched, items: list[tuple[ChatRecord, str]]) -> None:
        """Fire what the confirmation shows past budget.

        Facts are gathered first (a burst reads at most BURST_LOOKUPS workspace builds),
        then every alert is fired in one synchronous pass, so a burst reaches its
        aggregation groups together instead of trickling in over the lookups.
        """
        due: list[tuple[ChatRecord, str, str, float, float, float, str]] = []
        for rec, clock in items:
            past = self._past(w, rec, clock)
            if past is None:
                self.counters["unfounded"] += 1
                self._rearm(rec)
                continue
            name, age, limit = past
            since = rec.updated_at if clock == "stalled" and rec.updated_at else rec.since
            fp = fingerprint(w.health.deployment, rec.chat_id, name, rec.status, since)
            if fp not in self.firing:
                due.append((rec, clock, name, age, limit, since, fp))
        if not due:
            return
        burst = len(due)
        looked: set[str] = set()
        facts: list[Facts] = []
        for rec, *_ in due:
            ws = rec.workspace_id
            lookup = burst == 1 or (ws is not None and ws not in looked)
            lookup = lookup and len(looked) < BURST_LOOKUPS
            if lookup and ws:
                looked.add(ws)
            try:
                got = await w.confirmer.facts(rec, lookup=lookup)
            except (CoderError, PayloadError) as exc:
                log.info(
                    "diagnosis.partial", identity=rec.identity, chat_id=rec.chat_id, error=str(exc)
                )
                got = Facts(record=rec)
            facts.append(got)
        fired: list[Alert] = []
        # A burst allocates tens of thousands of acyclic objects in one synchronous pass:
        # the cyclic collector would rescan the whole heap several times meanwhile.
        collecting = gc.isenabled() and burst > 1
        if collecting:
            gc.disable()
        try:
            for (rec, clock, name, age, limit, since, fp), got in zip(due, facts, strict=True):
                # The record may have moved while we gathered facts.
                current = self.store.get(rec.identity, rec.chat_id)
                if current is None or current.status != rec.status or current.since != rec.since:
                    continue
                if fp in self.firing:
                    continue
                alert = self._chat_alert(
                    w,
                    rec,
                    name=name,
                    age=age,
                    limit=limit,
                    since=since,
                    facts=got,
                    fp=fp,
                    clock=clock,
                    burst=burst,
                )
                self._fire(alert, identity=rec.identity, chat_id=rec.chat_id, quiet=burst > 1)
                fired.append(alert)
        finally:
            if collecting:
                gc.enable()
        if burst > 1 and fired:
            names = Counter(a.name for a in fired)
            log.warning(
                "alerts.firing",
                identity=w.health.name,
                count=len(fired),
                alertnames=dict(names),
                chat_ids=[a.labels.get("chat_id") for a in fired[:10]],
                note="went past their budgets together; one line per alert at debug level",
            )

    def _chat_alert(
        self,
        w: Watched,
        rec: ChatRecord,
        *,
        name: str,
        age: float,
        limit: float,
        since: float,
        facts: Facts,
        fp: str,
        clock: str,
        burst: int = 1,
    ) -> Alert:
        deployment = w.health.deployment
        labels: dict[str, str] = {}
        keys = self._label_keys
        for k, v in rec.labels:
            key = keys.get(k)
            if key is None:
                key = keys[k] = f"chat_label_{_LABEL_KEY.sub('_', k)}"
                if len(keys) > 10_000:
                    keys.clear()
            labels[key] = v
        labels.update(w.labels)
        labels["alertname"] = name
        labels["identity"] = rec.identity
        labels["deployment"] = deployment
        labels["status"] = rec.status
        labels["severity"] = SEVERITY[name]
        labels["owner"] = rec.owner
        labels["chat_id"] = rec.chat_id
        title = rec.title or "(untitled)"
        age_text = self._duration(age)
        limit_text = self._duration(limit)
        if name == "ChatStalled":
            summary = (
                f'Chat "{title}" has made no server-side progress for '
                f"{age_text} while running (budget {limit_text})"
            )
            clock_text = "stalled: time since updated_at last moved"
        elif name == "ChatFailed":
            summary = f'Chat "{title}" failed'
            clock_text = CLOCK_TEXT.get(rec.clock, rec.clock)
        else:
            summary = f'Chat "{title}" has been {rec.status} for {age_text} (budget {limit_text})'
            clock_text = CLOCK_TEXT.get(rec.clock, rec.clock)
        invalid = self.invalid.get(rec.key) if self.invalid else None
        annotations = {
            "summary": summary,
            "title": title,
            "time_in_status": age_text,
            "time_in_status_seconds": f"{age:.0f}",
            "budget": limit_text,
            "since": iso(since),
            "clock": rec.clock if clock == "status" else "stalled",
            "clock_description": clock_text,
            "link": self.link_template.format(deployment=deployment, chat_id=rec.chat_id),
            "hint": hint(facts, burst=burst, invalid_state=invalid),
        }
        if rec.workspace_id:
            annotations["workspace_id"] = rec.workspace_id
        if facts.build is not None:
            annotations["workspace_build"] = facts.build.status + (
                f" ({facts.build.error_code})" if facts.build.error_code else ""
            )
        if facts.quota is not None:
            annotations["quota"] = (
                "unlimited"
                if facts.quota.unlimited
                else f"{facts.quota.credits_consumed}/{facts.quota.budget}"
            )
        if rec.queued_for_capacity:
            annotations["queued_for_capacity"] = "true"
        if invalid is not None:
            annotations["execution_state"] = f"invalid: {invalid}"
        if rec.mode:
            annotations["mode"] = rec.mode
        if rec.client_type:
            annotations["client_type"] = rec.client_type
        if rec.context_error:
            annotations["context_error"] = rec.context_error
        if rec.warnings:
            annotations["warnings"] = "; ".join(rec.warnings)
        if rec.parent_id:
            annotations["parent_chat_id"] = rec.parent_id
        if rec.last_error is not None:
            e = rec.last_error
            annotations["last_error"] = (
                f"{e.message} (kind={e.kind}, provider={e.provider or '-'}, "
                f"status={e.status_code if e.status_code is not None else '-'}, "
                f"retryable={'yes' if e.retryable else 'no'})"
            )
        # startsAt from what the server said (the clock start plus the budget: when the
        # chat went past it), never from this replica's clock: every replica owning the
        # identity sends the same one, as it sends the same fingerprint (docs/kubernetes.md).
        return Alert(
            fingerprint=fp,
            labels=labels,
            annotations=annotations,
            starts_at=since + limit,
            measured_at=self.wall.now(),
        )

    def _duration(self, seconds: float) -> str:
        """format_duration, remembered: a burst repeats the same few values."""
        whole = round(seconds)
        text = self._durations.get(whole)
        if text is None:
            if len(self._durations) > 4096:
                self._durations.clear()
            text = self._durations[whole] = format_duration(whole)
        return text

    def note_invalid(self, identity: str, chat_id: str, message: str) -> None:
        """A mutation found this chat's execution state invalid (409 "Chat is in an invalid
        state."): later alerts say so, and alerts already firing are re-sent saying so."""
        key = (identity, chat_id)
        if self.invalid.get(key) == message:
            return
        if len(self.invalid) >= 10_000:
            self.invalid.pop(next(iter(self.invalid)))
        self.invalid[key] = message
        for fp in list(self._by_chat.get(key, ())):
            alert = self.firing.get(fp)
            if alert is None or alert.name == "ChatStalled":
                continue
            annotations = dict(alert.annotations)
            annotations["execution_state"] = f"invalid: {message}"
            annotations["hint"] = INVALID_HINT
            updated = dataclasses.replace(alert, annotations=annotations)
            self.firing[fp] = updated
            if self.db is not None:
                self.db.save_alert(
                    StoredAlert(
                        fp, identity, chat_id, updated.labels, annotations, updated.starts_at, None
                    )
                )
            self.sink.put(updated)

    # -- identity health ----------------------------------------------------------

    def _health_tick(self) -> None:
        loop_now = time.monotonic()
        for name, w in self.watched.items():
            h = w.health
            fp = fingerprint(h.deployment, name, "IdentityUnhealthy")
            # Its confirmations crash again and again: no verdict can come from it, so it is
            # as unhealthy as an identity that cannot list.
            confirming = TASKS.tasks.get(f"confirm:{name}")
            broken = confirming is not None and confirming.crashes_in_a_row >= CRASH_LOOP
            if h.ready and not broken:
                if fp in self.firing:
                    self._resolve(fp, at=self.wall.now(), why="identity recovered")
                continue
            if fp in self.firing or (
                not broken and not h.refused and h.unhealthy_for(loop_now) < h.unhealthy_after
            ):
                continue
            if broken and confirming is not None:
                h.last_error = f"confirmation task keeps crashing: {confirming.last_error}"
            labels = dict(w.labels)
            labels.update(
                {
                    "alertname": "IdentityUnhealthy",
                    "identity": name,
                    "deployment": h.deployment,
                    "severity": "critical",
                    "status": h.state,
                }
            )
            down_for = h.unhealthy_for(loop_now)
            alert = Alert(
                fingerprint=fp,
                labels=labels,
                starts_at=self.wall.now(),
                annotations={
                    "summary": f"Identity {name} cannot watch its chats ({h.state}) for "
                    f"{format_duration(down_for)}",
                    # Lets renderers keep "for …" live (alerting.model.live).
                    "time_in_status": format_duration(down_for),
                    "time_in_status_seconds": f"{down_for:.0f}",
                    "last_error": h.last_error or "(none)",
                    "hint": _identity_hint(h),
                    "effect": "no ChatStuck verdicts for this identity until it recovers",
                },
            )
            self._fire(alert, identity=name, chat_id=None)

    # -- alerts raised by other parts of the daemon (QuotaLow) -------------------------

    def raise_alert(self, alert: Alert, *, identity: str) -> None:
        """Fire an identity-level alert once (persisted like every other)."""
        if alert.fingerprint not in self.firing:
            self._fire(alert, identity=identity, chat_id=None)

    def clear_alert(self, fp: str, *, why: str) -> None:
        self._resolve(fp, at=self.wall.now(), why=why)

    # -- firing and resolving -----------------------------------------------------

    def _remember(self, alert: Alert) -> None:
        self.firing[alert.fingerprint] = alert
        chat = alert.labels.get("chat_id")
        # Only verdicts about a chat's state hold its clock (ChatSwept, an announcement,
        # must neither stop the chat's timer nor resolve when the chat moves).
        if chat and alert.name in CHAT_VERDICTS:
            identity = alert.labels.get("identity", "")
            self._by_chat.setdefault((identity, chat), set()).add(alert.fingerprint)
            clock = "stalled" if alert.name == "ChatStalled" else "status"
            self._firing_clocks[(identity, chat, clock)] = alert.fingerprint
            self.timers.cancel((identity, chat, clock))

    def _fire(
        self, alert: Alert, *, identity: str, chat_id: str | None, quiet: bool = False
    ) -> None:
        self._remember(alert)
        if self.db is not None:
            self.db.save_alert(
                StoredAlert(
                    alert.fingerprint,
                    identity,
                    chat_id,
                    alert.labels,
                    alert.annotations,
                    alert.starts_at,
                    alert.ends_at,
                )
            )
        self.counters["fired"] += 1
        self.history.append(alert)
        (log.debug if quiet else log.warning)(
            "alert.firing",
            alertname=alert.name,
            identity=identity,
            chat_id=chat_id,
            fingerprint=alert.fingerprint,
            summary=alert.annotations.get("summary"),
            clock=alert.annotations.get("clock"),
        )
        self.sink.put(alert)

    def _resolve_chat(
        self, rec: ChatRecord, *, why: str, names: tuple[str, ...] | None = None
    ) -> None:
        fps = self._by_chat.get(rec.key)
        if not fps:
            return
        now = self.wall.now()
        for fp in list(fps):
            alert = self.firing.get(fp)
            if alert is None or (names is not None and alert.name not in names):
                continue
            self._resolve(fp, at=now, why=why)

    def _resolve(self, fp: str, *, at: float, why: str) -> None:
        alert = self.firing.pop(fp, None)
        if alert is None:
            return
        chat = alert.labels.get("chat_id")
        if chat:
            key = (alert.labels.get("identity", ""), chat)
            clock = "stalled" if alert.name == "ChatStalled" else "status"
            if self._firing_clocks.get((*key, clock)) == fp:
                del self._firing_clocks[(*key, clock)]
            fps = self._by_chat.get(key)
            if fps is not None:
                fps.discard(fp)
                if not fps:
                    del self._by_chat[key]
        # A chat alert starts at a server time; a host clock behind the server must not
        # end it before it started (Alertmanager refuses endsAt < startsAt).
        resolved = resolution(alert, at=max(at, alert.starts_at), why=why)
        if self.db is not None:
            self.db.delete_alert(fp)
        self.counters["resolved"] += 1
        self.history.append(resolved)
        log.info(
            "alert.resolved",
            alertname=alert.name,
            identity=alert.labels.get("identity"),
            chat_id=chat,
            fingerprint=fp,
            reason=why,
        )
        self.sink.put(resolved)


# Why a tombstoned chat's alert resolved, in the words of its resolve notification.
# Others read "chat <reason>": "chat gone (404)", "chat gone (missing from two complete
# listings)" (see ChatStore.tombstone's callers).
_GONE = {
    "archived": "chat archived",
    "deleted": "chat gone (deleted)",
}


def _identity_hint(h: IdentityHealth) -> str:
    if h.state == "auth_failed":
        return (
            "the token was refused (401/403): rotate it and update the token file; "
            "watchd re-reads it on retry"
        )
    if h.state == "not_found":
        return "no chats API at this URL under /api/v2 or /api/experimental: check the url"
    return "Coder is unreachable or failing: check the deployment and the network path"
