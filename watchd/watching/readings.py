"""The forecast's quota readings on disk, so a restart does not blind it for a window.

The forecast's part of the state file (:class:`watchd.store.sqlite.Part`): its
``quota_readings`` table, schema and SQL here, beside the forecast that reads it. Every
reading is kept in memory too (read once at start, pruned to the window as readings
arrive), so the forecast never waits on the database; rows reach disk with the state
file's flush, and a write that fails is counted there and retried, never stopping the
forecast.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from watchd.store.sqlite import Part, StateFile
from watchd.watching.forecast import Reading

SCHEMA = """
CREATE TABLE IF NOT EXISTS quota_readings (
  identity TEXT NOT NULL, at REAL NOT NULL, consumed INTEGER NOT NULL,
  budget INTEGER NOT NULL, PRIMARY KEY (identity, at)
);
"""
# The readings one identity may keep: a window of 1 s polls for a day is far beyond any
# sensible setting, and still a bounded table.
MAX_ROWS_PER_IDENTITY = 86_400

# What a flush writes: readings to add, (identity → prune before) and identities to drop.
_Batch = tuple[list[tuple[str, Reading]], dict[str, float], set[str]]


class ReadingBook(Part):
    """Every identity's recent quota readings, in memory and in the state file."""

    schema = SCHEMA

    def __init__(self, file: StateFile) -> None:
        super().__init__(file)
        self._kept: dict[str, list[Reading]] = {}
        self._added: list[tuple[str, Reading]] = []
        self._prune: dict[str, float] = {}
        self._forget: set[str] = set()

    def setup(self, db: sqlite3.Connection) -> None:
        rows = db.execute(
            "SELECT identity, at, consumed, budget FROM quota_readings ORDER BY identity, at"
        ).fetchall()
        for identity, at, consumed, budget in rows:
            kept = self._kept.setdefault(identity, [])
            if len(kept) < MAX_ROWS_PER_IDENTITY:
                kept.append(Reading(at=float(at), consumed=int(consumed), budget=int(budget)))

    def load(self, identity: str, *, since: float) -> list[Reading]:
        """The identity's readings taken at ``since`` or later, oldest first."""
        return [r for r in self._kept.get(identity, ()) if r.at >= since]

    def add(self, identity: str, reading: Reading, *, keep_after: float) -> None:
        """Keep ``reading`` and drop the identity's readings older than ``keep_after``."""
        kept = [r for r in self._kept.get(identity, ()) if r.at >= keep_after]
        kept.append(reading)
        self._kept[identity] = kept[-MAX_ROWS_PER_IDENTITY:]
        self._added.append((identity, reading))
        self._prune[identity] = keep_after

    def forget(self, identity: str) -> None:
        self._kept.pop(identity, None)
        self._added = [(i, r) for i, r in self._added if i != identity]
        self._prune.pop(identity, None)
        self._forget.add(identity)

    @property
    def pending(self) -> int:
        return len(self._added) + len(self._prune) + len(self._forget)

    def take(self) -> _Batch | None:
        if not (self._added or self._prune or self._forget):
            return None
        batch = (self._added, self._prune, self._forget)
        self._added, self._prune, self._forget = [], {}, set()
        return batch

    def restore(self, batch: _Batch) -> None:
        added, prune, forget = batch
        self._added[:0] = added
        for identity, before in prune.items():
            self._prune.setdefault(identity, before)
        self._forget |= forget

    def write(self, db: sqlite3.Connection, batch: _Batch) -> int:
        added, prune, forget = batch
        db.executemany(
            "DELETE FROM quota_readings WHERE identity=?", [(i,) for i in sorted(forget)]
        )
        rows: list[tuple[Any, ...]] = [
            (i, r.at, r.consumed, r.budget) for i, r in added if i not in forget
        ]
        db.executemany("INSERT OR REPLACE INTO quota_readings VALUES (?,?,?,?)", rows)
        db.executemany("DELETE FROM quota_readings WHERE identity=? AND at<?", list(prune.items()))
        return len(rows) + len(prune) + len(forget)
