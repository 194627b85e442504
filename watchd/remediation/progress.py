"""Sweep progress in the state file: what was done to which chat, so a restart never
acts twice.

The sweeper's part of the state file, its ``sweep`` table. Every entry is kept in memory
(read once at start) and is the truth for this process, so a write that fails never
makes the sweep act twice; the rows reach disk with the once-a-second flush. A crash
inside that second loses at most the last step, and the sweep reads the chat before it
acts again (an interrupted chat is no longer active, so it is not interrupted twice).
This module decides nothing about policies or actions.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from watchd.store.sqlite import Part, StateFile

SCHEMA = """
CREATE TABLE IF NOT EXISTS sweep (
  identity TEXT NOT NULL, chat_id TEXT NOT NULL, policy TEXT NOT NULL, since REAL NOT NULL,
  state TEXT NOT NULL, attempts INTEGER NOT NULL, updated REAL NOT NULL, detail TEXT,
  PRIMARY KEY (identity, chat_id, policy)
) WITHOUT ROWID;
"""

_Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class SweepEntry:
    identity: str
    chat_id: str
    policy: str
    since: float
    state: str  # planned | interrupt_sent | interrupted | archived | retry | gave_up | invalid
    # | healed | owner_editing | blocked (a busy family member holds the archive up)
    attempts: int
    updated: float
    detail: str | None = None


def sweep_row(e: SweepEntry) -> tuple[Any, ...]:
    return (e.identity, e.chat_id, e.policy, e.since, e.state, e.attempts, e.updated, e.detail)


class SweepProgress(Part):
    schema = SCHEMA

    def __init__(self, file: StateFile) -> None:
        super().__init__(file)
        self._entries: dict[_Key, SweepEntry] = {}
        self._pending: dict[_Key, SweepEntry] = {}

    def setup(self, db: sqlite3.Connection) -> None:
        rows = db.execute(
            "SELECT identity, chat_id, policy, since, state, attempts, updated, detail FROM sweep"
        ).fetchall()
        for row in rows:
            e = SweepEntry(*row)
            self._entries[(e.identity, e.chat_id, e.policy)] = e

    def get(self, identity: str, chat_id: str, policy: str) -> SweepEntry | None:
        return self._entries.get((identity, chat_id, policy))

    def put(self, e: SweepEntry) -> None:
        key = (e.identity, e.chat_id, e.policy)
        self._entries[key] = self._pending[key] = e

    def in_state(self, state: str) -> list[SweepEntry]:
        return [e for e in self._entries.values() if e.state == state]

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self) -> dict[_Key, SweepEntry] | None:
        if not self._pending:
            return None
        batch, self._pending = self._pending, {}
        return batch

    def restore(self, batch: dict[_Key, SweepEntry]) -> None:
        for k, e in batch.items():
            self._pending.setdefault(k, e)

    def write(self, db: sqlite3.Connection, batch: dict[_Key, SweepEntry]) -> int:
        db.executemany(
            "INSERT OR REPLACE INTO sweep VALUES (?,?,?,?,?,?,?,?)",
            [sweep_row(e) for e in batch.values()],
        )
        return len(batch)
