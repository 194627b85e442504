"""The notification log: what each receiver was last told about each group.

Alertmanager's nflog, owning its table in the state file. An entry is written only
after a send succeeded, so a failed flush is simply tried again on the next one;
entries live in SQLite and in memory (the whole log, read once at start), so a restart
does not page twice and a disk that refuses the write cannot make the next flush
re-page. :func:`needs_update` is the Dedup stage's verdict on it. This module decides
nothing about routing or retries, and reads nothing from disk after start.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from watchd.store.sqlite import Part, StateFile, dumps

# A group's notification-log entry is kept this long after its last send.
RETENTION = 5 * 24 * 3600.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS nflog (
  receiver TEXT NOT NULL, group_key TEXT NOT NULL, firing TEXT NOT NULL,
  resolved TEXT NOT NULL, sent_at REAL NOT NULL, expires_at REAL NOT NULL,
  PRIMARY KEY (receiver, group_key)
) WITHOUT ROWID;
"""


@dataclass(frozen=True, slots=True)
class NflogEntry:
    receiver: str
    group_key: str
    firing: frozenset[str]
    resolved: frozenset[str]
    sent_at: float
    expires_at: float


def nflog_row(entry: NflogEntry) -> tuple[Any, ...]:
    return (
        entry.receiver,
        entry.group_key,
        dumps(sorted(entry.firing)),
        dumps(sorted(entry.resolved)),
        entry.sent_at,
        entry.expires_at,
    )


def nflog_entry(receiver: str, group_key: str, row: Iterable[Any]) -> NflogEntry:
    """``row`` is (firing, resolved, sent_at, expires_at)."""
    firing, resolved, sent_at, expires_at = row
    return NflogEntry(
        receiver,
        group_key,
        frozenset(orjson.loads(firing)),
        frozenset(orjson.loads(resolved)),
        sent_at,
        expires_at,
    )


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


class NotificationLog(Part):
    """The log: read before a send (from memory), written after one succeeded."""

    schema = SCHEMA

    def __init__(self, file: StateFile) -> None:
        super().__init__(file)
        # The whole log: a flush asks it before every send, and asking SQLite would wait
        # for the writer thread, busy with a burst's commit (half a second and more).
        self._entries: dict[tuple[str, str], NflogEntry] = {}

    def setup(self, db: sqlite3.Connection) -> None:
        rows = db.execute(
            "SELECT receiver, group_key, firing, resolved, sent_at, expires_at FROM nflog"
        ).fetchall()
        for receiver, group_key, *rest in rows:
            try:
                entry = nflog_entry(receiver, group_key, rest)
            except ValueError:
                continue  # unreadable: as if never sent (the group notifies again)
            self._entries[(receiver, group_key)] = entry

    def get(self, receiver: str, group_key: str) -> NflogEntry | None:
        return self._entries.get((receiver, group_key))

    async def record(
        self,
        receiver: str,
        group_key: str,
        *,
        firing: set[str],
        resolved: set[str],
        sent_at: float,
    ) -> None:
        """Note a successful send: in memory at once, on disk by the writer thread
        (waited for, so the entry is durable before the group moves on)."""
        entry = NflogEntry(
            receiver,
            group_key,
            frozenset(firing),
            frozenset(resolved),
            sent_at=sent_at,
            expires_at=sent_at + RETENTION,
        )
        await self.put(entry)

    async def put(self, entry: NflogEntry) -> None:
        self._entries[(entry.receiver, entry.group_key)] = entry
        await self.file.commit(
            "INSERT OR REPLACE INTO nflog VALUES (?,?,?,?,?,?)", nflog_row(entry)
        )

    async def gc(self, now: float) -> int:
        """Forget entries past their retention; returns how many rows went."""
        for key in [k for k, e in self._entries.items() if e.expires_at < now]:
            del self._entries[key]
        return await self.file.commit("DELETE FROM nflog WHERE expires_at < ?", (now,))
