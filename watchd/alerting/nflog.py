"""The notification log: what each receiver was last told about each group.

Alertmanager's nflog. An entry is written only after a send succeeded, so a
failed flush is simply tried again on the next one; entries live in SQLite
(and in memory, through :class:`~watchd.store.persistence.StateDB`), so a
restart does not page twice. :func:`needs_update` is the Dedup stage's verdict
on it. This module decides nothing about routing or retries.
"""

from __future__ import annotations

import asyncio

from watchd.store.persistence import StateDB
from watchd.store.rows import NflogEntry

# A group's notification-log entry is kept this long after its last send.
RETENTION = 5 * 24 * 3600.0


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


class NotificationLog:
    """The log over the state file: read before a send, written after one succeeded."""

    def __init__(self, db: StateDB) -> None:
        self.db = db

    def get(self, receiver: str, group_key: str) -> NflogEntry | None:
        return self.db.nflog_get(receiver, group_key)

    async def record(
        self,
        receiver: str,
        group_key: str,
        *,
        firing: set[str],
        resolved: set[str],
        sent_at: float,
    ) -> None:
        """Note a successful send (in a worker thread: it may wait for the state
        flusher's commit)."""
        entry = NflogEntry(
            receiver,
            group_key,
            frozenset(firing),
            frozenset(resolved),
            sent_at=sent_at,
            expires_at=sent_at + RETENTION,
        )
        await asyncio.to_thread(self.db.nflog_put, entry)

    def gc(self, now: float) -> int:
        """Forget entries past their retention; returns how many rows went."""
        return self.db.nflog_gc(now)
