"""The forecast's quota readings on disk, so a restart does not blind it for a window.

This module owns its table (schema and SQL here, beside the forecast that reads it);
the state DB only lends its connection (:meth:`StateDB.owned_write`, ``owned_read``).
A reading is written as it is taken (one row per identity per quota poll) and rows
older than the window are pruned on the way; a write that fails is counted by the
state DB like every other and never stops the forecast, which keeps its series in
memory.
"""

from __future__ import annotations

import asyncio

from watchd.store.persistence import StateDB
from watchd.watching.forecast import Reading

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS quota_readings ("
    "identity TEXT NOT NULL, at REAL NOT NULL, consumed INTEGER NOT NULL, "
    "budget INTEGER NOT NULL, PRIMARY KEY (identity, at))"
)
# The readings one identity may keep: a window of 1 s polls for a day is far beyond any
# sensible setting, and still a bounded table.
MAX_ROWS_PER_IDENTITY = 86_400


class ReadingBook:
    """Every identity's recent quota readings in the state DB."""

    def __init__(self, db: StateDB) -> None:
        self.db = db
        db.owned_write(SCHEMA)

    def load(self, identity: str, *, since: float) -> list[Reading]:
        """The identity's readings taken at ``since`` or later, oldest first."""
        rows = self.db.owned_read(
            "SELECT at, consumed, budget FROM quota_readings WHERE identity=? AND at>=? "
            "ORDER BY at LIMIT ?",
            (identity, since, MAX_ROWS_PER_IDENTITY),
        )
        return [Reading(at=float(at), consumed=int(c), budget=int(b)) for at, c, b in rows]

    async def add(self, identity: str, reading: Reading, *, keep_after: float) -> None:
        """Write ``reading`` and drop the identity's readings older than ``keep_after``.

        In a worker thread: the state writer holds the connection's lock through a burst's
        commit (half a second and more), and the event loop must not wait for it."""
        await asyncio.to_thread(self._add, identity, reading, keep_after)

    def _add(self, identity: str, reading: Reading, keep_after: float) -> None:
        self.db.owned_write(
            "INSERT OR REPLACE INTO quota_readings VALUES (?,?,?,?)",
            [(identity, reading.at, reading.consumed, reading.budget)],
        )
        self.db.owned_write(
            "DELETE FROM quota_readings WHERE identity=? AND at<?", [(identity, keep_after)]
        )

    def forget(self, identity: str) -> None:
        self.db.owned_write("DELETE FROM quota_readings WHERE identity=?", [(identity,)])
