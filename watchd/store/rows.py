"""The chats' table in the state file: each chat's record, so a restart keeps every
chat's clock.

One place says what a row of ``chats`` holds and turns a :class:`ChatRecord` into one
and back; :class:`ChatRows` is the chat store's part of the state file (marks taken by
the once-a-second flush). Other owners keep their tables beside their own code; this
module must not learn them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

import msgspec
import orjson

from watchd.coder.observing import ChatError
from watchd.store.records import ChatRecord
from watchd.store.sqlite import Part, StateFile, dumps

SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
  identity TEXT NOT NULL, chat_id TEXT NOT NULL, status TEXT NOT NULL,
  since REAL NOT NULL, clock TEXT NOT NULL, updated_at REAL, seen_at REAL NOT NULL,
  owner TEXT, title TEXT, workspace_id TEXT, parent_id TEXT, labels TEXT,
  last_error TEXT, queued INTEGER, version INTEGER NOT NULL, details TEXT,
  PRIMARY KEY (identity, chat_id)
) WITHOUT ROWID;
"""

_Batch = tuple[dict[tuple[str, str], ChatRecord | None], set[str]]


class ChatRows(Part):
    """The last record of each chat, marked as it changes and written by the flush
    ("last one wins": a chat marked twice between flushes is written once)."""

    schema = SCHEMA

    def __init__(self, file: StateFile) -> None:
        super().__init__(file)
        self._dirty: dict[tuple[str, str], ChatRecord | None] = {}
        self._forget: set[str] = set()

    def setup(self, db: sqlite3.Connection) -> None:
        columns = {row[1] for row in db.execute("PRAGMA table_info(chats)")}
        if "details" not in columns:
            # Before 0.2: no mode / client_type / context error / warnings per chat.
            db.execute("ALTER TABLE chats ADD COLUMN details TEXT")

    def load(self) -> list[ChatRecord]:
        return [chat_record(r) for r in self.file.read("SELECT * FROM chats")]

    def mark(self, record: ChatRecord) -> None:
        self._dirty[record.key] = record

    def mark_deleted(self, identity: str, chat_id: str) -> None:
        self._dirty[(identity, chat_id)] = None
        self.file.hurry()

    def forget(self, identity: str) -> None:
        """Every chat of an identity that is no longer configured (written by the flush,
        before anything marked after it)."""
        self._forget.add(identity)
        self._dirty = {k: v for k, v in self._dirty.items() if k[0] != identity}

    @property
    def pending(self) -> int:
        return len(self._dirty) + len(self._forget)

    def take(self) -> _Batch | None:
        if not (self._dirty or self._forget):
            return None
        batch = (self._dirty, self._forget)
        self._dirty, self._forget = {}, set()
        return batch

    def restore(self, batch: _Batch) -> None:
        dirty, forget = batch
        for k, r in dirty.items():
            if k[0] not in self._forget:
                self._dirty.setdefault(k, r)
        self._forget |= forget

    def write(self, db: sqlite3.Connection, batch: _Batch) -> int:
        dirty, forget = batch
        db.executemany("DELETE FROM chats WHERE identity=?", [(i,) for i in forget])
        upserts = [chat_row(r) for r in dirty.values() if r is not None]
        if upserts:
            db.executemany(
                "INSERT OR REPLACE INTO chats VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", upserts
            )
        deletes = [k for k, r in dirty.items() if r is None]
        if deletes:
            db.executemany("DELETE FROM chats WHERE identity=? AND chat_id=?", deletes)
        return len(dirty) + len(forget)


# -- chats ------------------------------------------------------------------------

# A record's fields that have a column of their own. Every other field travels in
# ``details``: a JSON object of those not at their defaults, so a field added to
# ChatRecord is kept across restarts with no change here.
_COLUMNS = frozenset(
    {
        "identity",
        "chat_id",
        "status",
        "since",
        "clock",
        "updated_at",
        "seen_at",
        "owner",
        "title",
        "workspace_id",
        "parent_id",
        "labels",
        "last_error",
        "queued_for_capacity",
        "version",
    }
)
_DETAILS = tuple(
    (f.name, f.type, f.default)
    for f in msgspec.structs.fields(ChatRecord)
    if f.name not in _COLUMNS
)
_DETAIL_NAMES = tuple((name, default) for name, _, default in _DETAILS)
# What ``details`` is read into (unknown keys, from a later version, are ignored).
_Details = msgspec.defstruct("_Details", list(_DETAILS), gc=False)
# Rows written before details were an object hold a list in this order (four before
# pending tool calls were kept, five before the chat's kind); its tool calls are pairs.
_LEGACY = ("mode", "client_type", "context_error", "warnings", "pending", "kind")


def chat_row(r: ChatRecord) -> tuple[Any, ...]:
    err = None
    if r.last_error is not None:
        e = r.last_error
        err = dumps(
            {
                "message": e.message,
                "detail": e.detail,
                "kind": e.kind,
                "provider": e.provider,
                "retryable": e.retryable,
                "status_code": e.status_code,
            }
        )
    details = {n: v for n, default in _DETAIL_NAMES if (v := getattr(r, n)) != default}
    return (
        r.identity,
        r.chat_id,
        r.status,
        r.since,
        r.clock,
        r.updated_at,
        r.seen_at,
        r.owner,
        r.title,
        r.workspace_id,
        r.parent_id,
        dumps(r.labels),
        err,
        None if r.queued_for_capacity is None else int(r.queued_for_capacity),
        r.version,
        dumps(details) if details else None,
    )


def _details(text: str | None) -> dict[str, Any]:
    """A row's ``details`` as the record's fields (an object, or the older list)."""
    if not text:
        return {}
    loaded = orjson.loads(text)
    if type(loaded) is not list:
        extra: Any = loaded
    else:
        extra = dict(zip(_LEGACY, loaded, strict=False))
        if "pending" in extra:
            extra["pending"] = [{"tool_call_id": i, "tool_name": n} for i, n in extra["pending"]]
    d = msgspec.convert(extra, _Details)
    return {name: getattr(d, name) for name, _ in _DETAIL_NAMES}


def chat_record(row: Iterable[Any]) -> ChatRecord:
    (
        identity,
        chat_id,
        status,
        since,
        clock,
        updated_at,
        seen_at,
        owner,
        title,
        ws,
        parent,
        labels,
        err,
        queued,
        version,
        details,
    ) = row
    return ChatRecord(
        identity=identity,
        chat_id=chat_id,
        status=status,
        since=since,
        clock=clock,
        updated_at=updated_at,
        seen_at=seen_at,
        owner=owner or "",
        title=title or "",
        workspace_id=ws,
        parent_id=parent,
        labels=tuple((str(k), str(v)) for k, v in orjson.loads(labels or "[]")),
        last_error=ChatError(**orjson.loads(err)) if err else None,
        queued_for_capacity=None if queued is None else bool(queued),
        version=version,
        **_details(details),
    )
