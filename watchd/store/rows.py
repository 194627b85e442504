"""The state file's tables and the codecs between them and watchd's records.

One place says what a row of each table holds: chats, alerts, the notification
log, sweep progress and silences, each with its record type and the functions
that turn one into the other. Pure: no connection, no transaction, no I/O
(:mod:`watchd.store.persistence` runs the SQL).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from watchd.coder.observing import ChatError
from watchd.store.records import ChatRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chats (
  identity TEXT NOT NULL, chat_id TEXT NOT NULL, status TEXT NOT NULL,
  since REAL NOT NULL, clock TEXT NOT NULL, updated_at REAL, seen_at REAL NOT NULL,
  owner TEXT, title TEXT, workspace_id TEXT, parent_id TEXT, labels TEXT,
  last_error TEXT, queued INTEGER, version INTEGER NOT NULL, details TEXT,
  PRIMARY KEY (identity, chat_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nflog (
  receiver TEXT NOT NULL, group_key TEXT NOT NULL, firing TEXT NOT NULL,
  resolved TEXT NOT NULL, sent_at REAL NOT NULL, expires_at REAL NOT NULL,
  PRIMARY KEY (receiver, group_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dispatch (
  receiver TEXT NOT NULL, group_key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  alert TEXT NOT NULL, PRIMARY KEY (receiver, group_key, fingerprint)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sweep (
  identity TEXT NOT NULL, chat_id TEXT NOT NULL, policy TEXT NOT NULL, since REAL NOT NULL,
  state TEXT NOT NULL, attempts INTEGER NOT NULL, updated REAL NOT NULL, detail TEXT,
  PRIMARY KEY (identity, chat_id, policy)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS silences (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (
  fingerprint TEXT PRIMARY KEY, identity TEXT NOT NULL, chat_id TEXT,
  labels TEXT NOT NULL, annotations TEXT NOT NULL, starts_at REAL NOT NULL,
  ends_at REAL
);
"""
SCHEMA_VERSION = "1"


@dataclass(frozen=True, slots=True)
class StoredAlert:
    fingerprint: str
    identity: str
    chat_id: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    ends_at: float | None


@dataclass(frozen=True, slots=True)
class SweepEntry:
    identity: str
    chat_id: str
    policy: str
    since: float
    state: str  # planned | interrupt_sent | interrupted | archived | retry | gave_up
    attempts: int
    updated: float
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class NflogEntry:
    receiver: str
    group_key: str
    firing: frozenset[str]
    resolved: frozenset[str]
    sent_at: float
    expires_at: float


class Body(Protocol):
    """Something that knows its JSON form (an alert held by an aggregation group)."""

    def to_json(self) -> dict[str, Any]: ...


def dumps(obj: Any) -> str:
    """JSON text for a column (mappings such as ``MappingProxyType`` as objects)."""
    return orjson.dumps(obj, default=_plain).decode()


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# -- alerts ---------------------------------------------------------------------


def alert_row(row: StoredAlert) -> tuple[Any, ...]:
    return (
        row.fingerprint,
        row.identity,
        row.chat_id,
        dumps(row.labels),
        dumps(row.annotations),
        row.starts_at,
        row.ends_at,
    )


def stored_alert(row: Iterable[Any]) -> StoredAlert:
    f, i, c, lab, ann, s, e = row
    return StoredAlert(f, i, c, orjson.loads(lab), orjson.loads(ann), s, e)


# -- alerts held by aggregation groups -------------------------------------------


def dispatch_row(key: tuple[str, str, str], body: Body) -> tuple[Any, ...]:
    """(receiver, group key, fingerprint, the alert's JSON), serialised at flush time."""
    return (*key, dumps(body.to_json()))


# -- notification log -------------------------------------------------------------


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


# -- sweep progress ---------------------------------------------------------------


def sweep_row(e: SweepEntry) -> tuple[Any, ...]:
    return (e.identity, e.chat_id, e.policy, e.since, e.state, e.attempts, e.updated, e.detail)


# -- chats ------------------------------------------------------------------------


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
        dumps([r.mode, r.client_type, r.context_error, r.warnings])
        if r.mode or r.client_type or r.context_error or r.warnings
        else None,
    )


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
    last_error = ChatError(**orjson.loads(err)) if err else None
    mode, client_type, context_error, warnings = (
        orjson.loads(details) if details else ("", "", "", ())
    )
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
        last_error=last_error,
        queued_for_capacity=None if queued is None else bool(queued),
        version=version,
        mode=mode,
        client_type=client_type,
        context_error=context_error,
        warnings=tuple(warnings),
    )
