"""The aggregation groups' alerts in the state file, so a restart loses no pending resolve.

The dispatcher's part of the state file: each (receiver, group key, fingerprint) it
holds, saved and deleted as groups change and written by the once-a-second flush (an
alert is serialised then, not when queued: a burst of alerts costs one pass; while a
large notification is sent the flush waits: :meth:`watchd.store.sqlite.StateFile.holding`).
This module must not decide which group an alert belongs to.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from watchd.store.sqlite import Part, StateFile, dumps

SCHEMA = """
CREATE TABLE IF NOT EXISTS dispatch (
  receiver TEXT NOT NULL, group_key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  alert TEXT NOT NULL, PRIMARY KEY (receiver, group_key, fingerprint)
) WITHOUT ROWID;
"""

_Key = tuple[str, str, str]


class Body(Protocol):
    """Something that knows its JSON form (an alert held by an aggregation group)."""

    def to_json(self) -> dict[str, Any]: ...


class GroupRows(Part):
    schema = SCHEMA

    def __init__(self, file: StateFile) -> None:
        super().__init__(file)
        self._pending: dict[_Key, Body | None] = {}

    def save(self, receiver: str, group_key: str, fingerprint: str, alert: Body) -> None:
        """``alert`` is serialised (``to_json()``) when the batch is written."""
        self._pending[(receiver, group_key, fingerprint)] = alert

    def delete(self, receiver: str, group_key: str, fingerprints: Iterable[str]) -> None:
        for f in fingerprints:
            self._pending[(receiver, group_key, f)] = None

    def load(self) -> list[tuple[str, str, dict[str, Any]]]:
        """What the last run's groups held (anything pending is written first)."""
        self.file.flush()
        rows = self.file.read("SELECT receiver, group_key, alert FROM dispatch")
        return [(r, g, orjson.loads(a)) for r, g, a in rows]

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self) -> dict[_Key, Body | None] | None:
        if not self._pending:
            return None
        batch, self._pending = self._pending, {}
        return batch

    def restore(self, batch: dict[_Key, Body | None]) -> None:
        for k, b in batch.items():
            self._pending.setdefault(k, b)

    def write(self, db: sqlite3.Connection, batch: dict[_Key, Body | None]) -> int:
        db.executemany(
            "INSERT OR REPLACE INTO dispatch VALUES (?,?,?,?)",
            [(*k, dumps(body.to_json())) for k, body in batch.items() if body is not None],
        )
        db.executemany(
            "DELETE FROM dispatch WHERE receiver=? AND group_key=? AND fingerprint=?",
            [k for k, body in batch.items() if body is None],
        )
        return len(batch)
