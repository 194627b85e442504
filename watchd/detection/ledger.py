"""The firing alerts of every kind, and nothing else: remember, fire, resolve, persist.

Chat verdicts, IdentityUnhealthy, QuotaLow and QuotaExhaustionForecast (the quota
watcher), ChatSwept (the sweeper) and FleetIncident (what
:mod:`watchd.detection.incidents` answers after each fire and resolve of a chat alert)
all go through here, so every firing alert is in the state file (its own ``alerts``
table, :class:`StoredAlerts`) and resolves after a restart
as it would have before it. A chat verdict also *holds its clock*: its timer is cancelled
while it fires (no re-confirm loop), and re-armed by the detector only once it resolves.
Renders nothing (:mod:`watchd.detection.alerts`) and decides nothing
(:mod:`watchd.detection.detector`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from logging import DEBUG
from typing import Any, get_args

import orjson

from watchd.alerting.model import Alert, AlertSink, HoldingSink, resolution
from watchd.detection import telling
from watchd.detection.alerts import recaused, said_invalid
from watchd.detection.budgets import ChatVerdict
from watchd.detection.incidents import Incidents
from watchd.detection.timers import ServerTimers
from watchd.kits import logs
from watchd.kits.clock import WallClock
from watchd.store.records import ChatRecord
from watchd.store.sqlite import Part, StateFile, dumps
from watchd.store.timelines import Timelines

log = logs.get("watchd.detection")

HISTORY = 500
CHAT_VERDICTS: frozenset[str] = frozenset(get_args(ChatVerdict))
ClockKey = tuple[str, str, str]  # (identity, chat id, clock name)


SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
  fingerprint TEXT PRIMARY KEY, identity TEXT NOT NULL, chat_id TEXT,
  labels TEXT NOT NULL, annotations TEXT NOT NULL, starts_at REAL NOT NULL,
  ends_at REAL
);
"""


@dataclass(frozen=True, slots=True)
class StoredAlert:
    fingerprint: str
    identity: str
    chat_id: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    ends_at: float | None


class StoredAlerts(Part):
    """The firing alerts on disk, written by the once-a-second flush (a crash re-fires
    at most a second's worth; the notification log keeps that from paging twice).
    Serialised at flush time, not when saved: a burst of alerts costs one pass."""

    schema = SCHEMA

    def __init__(self, file: StateFile) -> None:
        super().__init__(file)
        self._pending: dict[str, StoredAlert | None] = {}

    def save(self, row: StoredAlert) -> None:
        self._pending[row.fingerprint] = row

    def delete(self, fingerprint: str) -> None:
        self._pending[fingerprint] = None

    def load(self) -> list[StoredAlert]:
        """What the last run had firing (anything pending is written first)."""
        self.file.flush()
        rows = self.file.read(
            "SELECT fingerprint, identity, chat_id, labels, annotations, starts_at, ends_at "
            "FROM alerts"
        )
        return [
            StoredAlert(f, i, c, orjson.loads(lab), orjson.loads(ann), s, e)
            for f, i, c, lab, ann, s, e in rows
        ]

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self) -> dict[str, StoredAlert | None] | None:
        if not self._pending:
            return None
        batch, self._pending = self._pending, {}
        return batch

    def restore(self, batch: dict[str, StoredAlert | None]) -> None:
        for f, a in batch.items():
            self._pending.setdefault(f, a)

    def write(self, db: sqlite3.Connection, batch: dict[str, StoredAlert | None]) -> int:
        db.executemany(
            "INSERT OR REPLACE INTO alerts VALUES (?,?,?,?,?,?,?)",
            [_alert_row(r) for r in batch.values() if r is not None],
        )
        db.executemany(
            "DELETE FROM alerts WHERE fingerprint=?",
            [(fp,) for fp, row in batch.items() if row is None],
        )
        return len(batch)


def _alert_row(r: StoredAlert) -> tuple[Any, ...]:
    labels, annotations = dumps(r.labels), dumps(r.annotations)
    return (r.fingerprint, r.identity, r.chat_id, labels, annotations, r.starts_at, r.ends_at)


def clock_of(name: str) -> str:
    """The chat clock a verdict is about."""
    return "stalled" if name == "ChatStalled" else "status"


class Ledger:
    def __init__(
        self,
        *,
        sink: AlertSink,
        db: StateFile | None,
        timers: ServerTimers,
        wall: WallClock,
        counters: dict[str, int],
        incidents: Incidents | None = None,
        timelines: Timelines | None = None,
    ) -> None:
        self.sink = sink
        # Each chat's story: alerts fired and resolved, causes that moved, sweep actions.
        self.timelines = timelines
        self.stored = db.part(StoredAlerts) if db is not None else None
        self.timers = timers
        self.wall = wall
        self.counters = counters
        self.firing: dict[str, Alert] = {}
        self.by_chat: dict[tuple[str, str], set[str]] = {}
        # Clocks whose alert is firing: not re-armed until it resolves (no re-confirm loop).
        self.firing_clocks: dict[ClockKey, str] = {}
        self.history: deque[Alert] = deque(maxlen=HISTORY)
        # (identity, chat id) -> coderd's message, for chats whose execution state a
        # mutation found invalid (told by the sweep); cleared when the chat moves.
        self.invalid: dict[tuple[str, str], str] = {}
        if self.stored is not None:
            for row in self.stored.load():
                if row.ends_at is None:
                    self._remember(
                        Alert(
                            fingerprint=row.fingerprint,
                            labels=row.labels,
                            annotations=row.annotations,
                            starts_at=row.starts_at,
                        )
                    )
        # FleetIncidents over the chat alerts: fed by every fire and resolve below.
        self.incidents = incidents if incidents is not None else Incidents()
        self.incidents.restore(self.firing)
        self.settle_incidents()

    # -- firing -------------------------------------------------------------------

    def fire(
        self, alert: Alert, *, identity: str, chat_id: str | None, quiet: bool = False
    ) -> None:
        self._fire(alert, identity, chat_id, say=log.debug if quiet else log.warning)
        self.settle_incidents()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While a burst is fired piece by piece: the sink sends none of it (a sink that
        cannot hold sends as it goes) and the state file writes nothing (for at most its
        HOLD_MAX) until the block ends."""
        with contextlib.ExitStack() as held:
            if isinstance(self.sink, HoldingSink):
                held.enter_context(self.sink.holding())
            if self.stored is not None:
                held.enter_context(self.stored.file.holding())
            yield

    def fire_all(
        self, alerts: Iterable[tuple[Alert, str, str | None]], *, quiet: bool, settle: bool = True
    ) -> None:
        """Fire each (alert, identity, chat id) in turn, as :meth:`fire` would; ``alerts``
        may be a generator that renders the next only once the last has fired. Without
        ``settle``, the incidents they join are settled by the caller's
        :meth:`settle_incidents` (a burst fired piece by piece settles once)."""
        # Whether a quiet line is written at all is asked once, not per alert: building
        # the filtered debug line was a tenth of a ten-thousand-alert burst's fire pass.
        say = log.warning if not quiet else log.debug if log.is_enabled_for(DEBUG) else None
        for alert, identity, chat_id in alerts:
            self._fire(alert, identity, chat_id, say=say)
        if settle:
            self.settle_incidents()

    def _fire(
        self, alert: Alert, identity: str, chat_id: str | None, *, say: Callable[..., Any] | None
    ) -> None:
        self._remember(alert)
        self._save(alert, identity, chat_id)
        self.counters["fired"] += 1
        self.history.append(alert)
        if say is not None:
            say(
                "alert.firing",
                alertname=alert.name,
                identity=identity,
                chat_id=chat_id,
                fingerprint=alert.fingerprint,
                summary=alert.annotations.get("summary"),
                clock=alert.annotations.get("clock"),
            )
        self.sink.put(alert)
        self.incidents.join(alert)
        if self.timelines is not None and chat_id:
            telling.fired(self.timelines, alert, identity, chat_id)

    def _save(self, alert: Alert, identity: str, chat_id: str | None) -> None:
        if self.stored is not None:
            self.stored.save(
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

    def settle_incidents(self) -> None:
        """Fire, re-raise or resolve the FleetIncidents the last fires and resolves
        changed. A re-raise (members joined or left) updates the firing alert in place:
        the group's next notification carries it, and it is no new page."""
        fire, resolve = self.incidents.settle()
        for alert in fire:
            if alert.fingerprint in self.firing:
                self.firing[alert.fingerprint] = alert
                self._save(alert, "", None)
                self.sink.put(alert)
            else:
                self._fire(alert, "", None, say=log.warning)
        for fp in resolve:
            self.resolve(fp, at=self.wall.now(), why="no member chat alert fires any more")

    def raise_alert(self, alert: Alert, *, identity: str) -> None:
        """Fire an identity-level alert once (persisted like every other)."""
        if alert.fingerprint not in self.firing:
            self.fire(alert, identity=identity, chat_id=None)

    def _remember(self, alert: Alert) -> None:
        self.firing[alert.fingerprint] = alert
        chat = alert.labels.get("chat_id")
        # Only verdicts about a chat's state hold its clock (ChatSwept, an announcement,
        # must neither stop the chat's timer nor resolve when the chat moves).
        if chat and alert.name in CHAT_VERDICTS:
            identity = alert.labels.get("identity", "")
            self.by_chat.setdefault((identity, chat), set()).add(alert.fingerprint)
            clock = clock_of(alert.name)
            self.firing_clocks[(identity, chat, clock)] = alert.fingerprint
            self.timers.cancel((identity, chat, clock))

    def note_invalid(self, identity: str, chat_id: str, message: str) -> None:
        """A mutation found this chat's execution state invalid (409 "Chat is in an invalid
        state."): later alerts say so, and alerts already firing are re-sent saying so."""
        key = (identity, chat_id)
        if self.invalid.get(key) == message:
            return
        if len(self.invalid) >= 10_000:
            self.invalid.pop(next(iter(self.invalid)))
        self.invalid[key] = message
        for fp in list(self.by_chat.get(key, ())):
            alert = self.firing.get(fp)
            if alert is None or alert.name == "ChatStalled":
                continue
            self._resay(said_invalid(alert, message), identity, chat_id)
        self.settle_incidents()

    def recause(self, rec: ChatRecord) -> None:
        """The chat's capacity flag moved while its alerts fire: their ``cause`` and hint
        follow it, and so does their incident membership (re-said in place: the group's
        next notification carries it, no new page)."""
        for fp in list(self.by_chat.get(rec.key, ())):
            alert = self.firing.get(fp)
            if alert is None:
                continue
            updated = recaused(alert, rec)
            if updated is not alert:
                self._resay(updated, rec.identity, rec.chat_id)
                if self.timelines is not None:
                    telling.recaused(self.timelines, alert, updated, rec, at=self.wall.now())
        self.settle_incidents()

    def _resay(self, alert: Alert, identity: str, chat_id: str | None) -> None:
        """A firing alert's labels or annotations changed (never its fingerprint): kept,
        persisted and sent again."""
        self.firing[alert.fingerprint] = alert
        self._save(alert, identity, chat_id)
        self.sink.put(alert)
        self.incidents.join(alert)

    # -- resolving ----------------------------------------------------------------

    def clear_alert(self, fp: str, *, why: str) -> None:
        self.resolve(fp, at=self.wall.now(), why=why)

    def resolve_chat(
        self, rec: ChatRecord, *, why: str, names: tuple[str, ...] | None = None
    ) -> None:
        fps = self.by_chat.get(rec.key)
        if not fps:
            return
        now = self.wall.now()
        for fp in list(fps):
            alert = self.firing.get(fp)
            if alert is None or (names is not None and alert.name not in names):
                continue
            self.resolve(fp, at=now, why=why)

    def of_identity(self, name: str) -> Iterable[tuple[str, Alert]]:
        """The identity's firing alerts (a snapshot: safe to resolve while iterating)."""
        return [(fp, a) for fp, a in self.firing.items() if a.labels.get("identity") == name]

    def resolve(self, fp: str, *, at: float, why: str) -> None:
        alert = self.firing.pop(fp, None)
        if alert is None:
            return
        chat = alert.labels.get("chat_id")
        if chat:
            self._forget_chat(alert.labels.get("identity", ""), chat, fp, alert.name)
            self.incidents.leave(alert)
        # A chat alert starts at a server time; a host clock behind the server must not
        # end it before it started (Alertmanager refuses endsAt < startsAt).
        resolved = resolution(alert, at=max(at, alert.starts_at), why=why)
        if self.stored is not None:
            self.stored.delete(fp)
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
        if chat and self.timelines is not None:
            telling.resolved(self.timelines, resolved, why=why)
        self.settle_incidents()

    def hand_over(self, name: str) -> list[str]:
        """Forget an identity's firing alerts without resolving them: another replica owns
        the identity now (resharding) and keeps them firing under the same fingerprints.
        Returns the fingerprints dropped."""
        dropped = []
        for fp, alert in self.of_identity(name):
            del self.firing[fp]
            chat = alert.labels.get("chat_id")
            if chat:
                # Unconditionally (not only when this fingerprint holds the clock): the
                # identity's clocks are this replica's no longer.
                self.firing_clocks.pop((name, chat, clock_of(alert.name)), None)
                self._forget_chat(name, chat, fp, None)
                self.incidents.leave(alert)
            if self.stored is not None:
                self.stored.delete(fp)
            dropped.append(fp)
        # This replica counts only the chats of identities it owns (docs/alerting.md).
        self.settle_incidents()
        return dropped

    def _forget_chat(self, identity: str, chat: str, fp: str, name: str | None) -> None:
        if name is not None:
            key = (identity, chat, clock_of(name))
            if self.firing_clocks.get(key) == fp:
                del self.firing_clocks[key]
        fps = self.by_chat.get((identity, chat))
        if fps is not None:
            fps.discard(fp)
            if not fps:
                del self.by_chat[(identity, chat)]
