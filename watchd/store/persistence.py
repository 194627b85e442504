"""watchd's state on disk: one SQLite file (standard library, WAL mode).

Holds each chat's clock, so a restart keeps every chat's time in status, and the
alerts the detector has fired, so a restart does not fire them again. Owns the
connection, the batched flush (committed from a worker thread), failure tracking
and each owner's SQL; the tables and row codecs are :mod:`watchd.store.rows`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from watchd.store.records import ChatRecord
from watchd.store.rows import (
    SCHEMA,
    SCHEMA_VERSION,
    Body,
    NflogEntry,
    StoredAlert,
    SweepEntry,
    alert_row,
    chat_record,
    chat_row,
    dispatch_row,
    dumps,
    nflog_entry,
    nflog_row,
    stored_alert,
    sweep_row,
)

# A batched write waits while a large notification is being built and sent (at most this
# long): the writer's worker thread serialising a burst's rows and the POST of its
# megabytes of body would otherwise share the interpreter in the same second.
HOLD_MAX = 2.0

_Batch = tuple[
    dict[tuple[str, str], ChatRecord | None], dict[str, StoredAlert | None], dict[Any, Body | None]
]


class StateDB:
    """The daemon's state in SQLite.

    It degrades instead of dying: a write that fails (disk full, read-only, I/O error)
    is counted and remembered in ``failing_since``, a failed batch is put back to be
    written by the next flush, and the notification log and sweep progress are kept in
    memory too, so a daemon that cannot write still never pages twice or acts twice.
    A database that cannot be read at all is moved aside by :meth:`open`.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection, guarded by one lock: the big once-a-second write runs in a
        # worker thread (sqlite releases the GIL), everything else on the event loop.
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        # The whole notification log, read once here: a flush asks it before every send,
        # and asking SQLite would wait on the loop for the lock that the state writer's
        # worker thread holds through a burst's commit (half a second and more).
        self._nflog_mem: dict[tuple[str, str], NflogEntry] = {}
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            self._migrate()
            self._db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,)
            )
            self._load_nflog()
        except BaseException:
            self._db.close()
            raise
        # Set by open() when a corrupt database was moved aside: (where it went, why).
        self.reset_from: tuple[Path, str] | None = None
        self.failing_since: float | None = None  # wall time of the first failed write
        self.write_failures = 0
        self.last_write_error = ""
        self._sweep_mem: dict[tuple[str, str, str], SweepEntry] = {}
        self._dirty: dict[tuple[str, str], ChatRecord | None] = {}
        # Alert and group state ride the same once-a-second transaction: a crash re-fires
        # at most a second's worth (up to HOLD_MAX more while a burst's notification is on
        # the wire), and the notification log (written synchronously after every send)
        # keeps that from paging twice.
        # Serialised at flush time, not when queued: a burst of alerts costs one pass.
        self._alerts: dict[str, StoredAlert | None] = {}
        self._dispatch: dict[tuple[str, str, str], Body | None] = {}
        self._holds = 0  # large notifications being sent now (see holding())
        self._unheld = asyncio.Event()
        self._unheld.set()

    @classmethod
    def open(cls, path: str | Path) -> StateDB:
        """Open (or create) the database. One that is not a database, or fails SQLite's
        quick check, is moved aside (kept, never deleted) and a fresh one started; the
        caller sees ``reset_from``. Permission and I/O errors are raised: those are the
        operator's to fix, not a reason to forget state."""
        path = Path(path)
        try:
            db = cls(path)
            problem = db._quick_check()
            if problem is None:
                return db
            db._db.close()
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as exc:
            problem = str(exc)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = path.with_name(f"{path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(path) + suffix)
            if src.exists():
                src.rename(Path(str(aside) + suffix))
        db = cls(path)
        db.reset_from = (aside, problem)
        return db

    def _quick_check(self) -> str | None:
        row = self._db.execute("PRAGMA quick_check(1)").fetchone()
        result = row[0] if row else "no answer"
        return None if result == "ok" else str(result)

    @property
    def persisting(self) -> bool:
        return self.failing_since is None

    def _failed(self, exc: BaseException) -> None:
        self.write_failures += 1
        self.last_write_error = f"{type(exc).__name__}: {exc}"[:300]
        if self.failing_since is None:
            self.failing_since = time.time()

    def _succeeded(self) -> None:
        self.failing_since = None

    def probe(self) -> None:
        """One small write, to learn whether writing works again (raises if not)."""
        try:
            with self._lock, self._begin():
                self._db.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('probe', ?)",
                    (str(time.time()),),
                )
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
            raise
        self._succeeded()

    def _migrate(self) -> None:
        """Bring a database written by an older build up to this schema in place."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(chats)")}
        if "details" not in columns:
            # Before 0.2: no mode / client_type / context error / warnings per chat.
            self._db.execute("ALTER TABLE chats ADD COLUMN details TEXT")

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._db.close()

    # -- chats --------------------------------------------------------------------

    def mark(self, record: ChatRecord) -> None:
        self._dirty[record.key] = record

    def mark_deleted(self, identity: str, chat_id: str) -> None:
        self._dirty[(identity, chat_id)] = None

    @property
    def pending(self) -> int:
        return len(self._dirty) + len(self._alerts) + len(self._dispatch)

    def flush(self) -> int:
        """Write what is pending now, on the calling thread (raises if it cannot; what
        was pending stays pending)."""
        with self._lock:
            return self._write_or_restore(self._take())

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While a large notification is built and sent: :meth:`flush_async` waits for it
        to end, at most HOLD_MAX (then writes anyway). Nothing pending is dropped; it is
        written a little later."""
        self._holds += 1
        self._unheld.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds:
                self._unheld.set()

    async def flush_async(self) -> int:
        """Write what is pending in a worker thread, so a burst (ten thousand alerts and
        their groups) does not stall the event loop while it commits; after any large
        notification being sent now (:meth:`holding`, at most HOLD_MAX)."""
        if not (self._dirty or self._alerts or self._dispatch):
            return 0
        if self._holds:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HOLD_MAX):
                    await self._unheld.wait()
        # Taken under the lock on the loop thread and written before it is released, so a
        # later flush can never commit older data over newer.
        self._lock.acquire()
        try:
            batch = self._take()
        except BaseException:
            self._lock.release()
            raise
        return await asyncio.to_thread(self._write_and_release, batch)

    def _write_and_release(self, batch: _Batch) -> int:
        try:
            return self._write_or_restore(batch)
        finally:
            self._lock.release()

    def _write_or_restore(self, batch: _Batch) -> int:
        try:
            n = self._write(batch)
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
            # Put the batch back under anything marked since (newer wins).
            dirty, alerts, dispatch = batch
            for k, r in dirty.items():
                self._dirty.setdefault(k, r)
            for f, a in alerts.items():
                self._alerts.setdefault(f, a)
            for d, b in dispatch.items():
                self._dispatch.setdefault(d, b)
            raise
        if n:
            self._succeeded()
        return n

    def _take(self) -> _Batch:
        batch = (self._dirty, self._alerts, self._dispatch)
        self._dirty, self._alerts, self._dispatch = {}, {}, {}
        return batch

    def _write(self, batch: _Batch) -> int:
        """Commit one batch (the lock is held)."""
        dirty, alerts, dispatch = batch
        if not (dirty or alerts or dispatch):
            return 0
        upserts = [chat_row(r) for r in dirty.values() if r is not None]
        deletes = [k for k, r in dirty.items() if r is None]
        with self._begin():
            if upserts:
                self._db.executemany(
                    "INSERT OR REPLACE INTO chats VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", upserts
                )
            if deletes:
                self._db.executemany("DELETE FROM chats WHERE identity=? AND chat_id=?", deletes)
            self._db.executemany(
                "INSERT OR REPLACE INTO alerts VALUES (?,?,?,?,?,?,?)",
                [alert_row(row) for row in alerts.values() if row is not None],
            )
            self._db.executemany(
                "DELETE FROM alerts WHERE fingerprint=?",
                [(fp,) for fp, row in alerts.items() if row is None],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO dispatch VALUES (?,?,?,?)",
                [dispatch_row(k, body) for k, body in dispatch.items() if body is not None],
            )
            self._db.executemany(
                "DELETE FROM dispatch WHERE receiver=? AND group_key=? AND fingerprint=?",
                [k for k, body in dispatch.items() if body is None],
            )
        return len(dirty) + len(alerts) + len(dispatch)

    def load_chats(self) -> list[ChatRecord]:
        rows = self._query("SELECT * FROM chats")
        return [chat_record(r) for r in rows]

    def forget_identity(self, identity: str) -> None:
        with self._tx():
            self._db.execute("DELETE FROM chats WHERE identity=?", (identity,))
        self._dirty = {k: v for k, v in self._dirty.items() if k[0] != identity}

    # -- alerts -------------------------------------------------------------------

    def save_alert(self, row: StoredAlert) -> None:
        self._alerts[row.fingerprint] = row

    def delete_alert(self, fingerprint: str) -> None:
        self._alerts[fingerprint] = None

    def load_alerts(self) -> list[StoredAlert]:
        self.flush()
        rows = self._query(
            "SELECT fingerprint, identity, chat_id, labels, annotations, starts_at, ends_at "
            "FROM alerts"
        )
        return [stored_alert(r) for r in rows]

    # -- notification log: what each receiver was last told, per group ----------

    def _load_nflog(self) -> None:
        rows = self._db.execute(
            "SELECT receiver, group_key, firing, resolved, sent_at, expires_at FROM nflog"
        ).fetchall()
        for receiver, group_key, *rest in rows:
            try:
                entry = nflog_entry(receiver, group_key, rest)
            except ValueError:
                continue  # unreadable: as if never sent (the group notifies again)
            self._nflog_mem[(receiver, group_key)] = entry

    def nflog_get(self, receiver: str, group_key: str) -> NflogEntry | None:
        """From memory, which holds every entry (loaded at open, then kept with each
        write): never waits for the state writer."""
        return self._nflog_mem.get((receiver, group_key))

    def nflog_put(self, entry: NflogEntry) -> None:
        """Written only after a successful send: a failed flush is simply retried. Kept in
        memory too, so a disk that refuses the write cannot make the next flush re-page."""
        self._nflog_mem[(entry.receiver, entry.group_key)] = entry
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO nflog VALUES (?,?,?,?,?,?)", nflog_row(entry))

    def nflog_gc(self, now: float) -> int:
        for key in [k for k, e in self._nflog_mem.items() if e.expires_at < now]:
            del self._nflog_mem[key]
        cur = None
        with self._tx():
            cur = self._db.execute("DELETE FROM nflog WHERE expires_at < ?", (now,))
        return cur.rowcount if cur is not None else 0

    # -- alerts held by aggregation groups, so a restart loses no pending resolve --

    def dispatch_save(self, receiver: str, group_key: str, fingerprint: str, alert: Body) -> None:
        """``alert`` is serialised (``to_json()``) when the batch is written."""
        self._dispatch[(receiver, group_key, fingerprint)] = alert

    def dispatch_delete(self, receiver: str, group_key: str, fingerprints: Iterable[str]) -> None:
        for f in fingerprints:
            self._dispatch[(receiver, group_key, f)] = None

    def dispatch_load(self) -> list[tuple[str, str, dict[str, Any]]]:
        self.flush()
        rows = self._query("SELECT receiver, group_key, alert FROM dispatch")
        return [(r, g, orjson.loads(a)) for r, g, a in rows]

    # -- sweep progress: what was done to which chat, so a restart never acts twice ---

    def sweep_get(self, identity: str, chat_id: str, policy: str) -> SweepEntry | None:
        mem = self._sweep_mem.get((identity, chat_id, policy))
        if mem is not None:
            return mem
        rows = self._query(
            "SELECT since, state, attempts, updated, detail FROM sweep "
            "WHERE identity=? AND chat_id=? AND policy=?",
            (identity, chat_id, policy),
        )
        return SweepEntry(identity, chat_id, policy, *rows[0]) if rows else None

    def sweep_put(self, e: SweepEntry) -> None:
        # In memory too: a sweep must never act twice because a write failed.
        self._sweep_mem[(e.identity, e.chat_id, e.policy)] = e
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO sweep VALUES (?,?,?,?,?,?,?,?)", sweep_row(e))

    def sweep_in_state(self, state: str) -> list[SweepEntry]:
        rows = self._query(
            "SELECT identity, chat_id, policy, since, state, attempts, updated, detail "
            "FROM sweep WHERE state=?",
            (state,),
        )
        mem = self._sweep_mem
        stored = [SweepEntry(*r) for r in rows]
        out = [e for e in stored if (e.identity, e.chat_id, e.policy) not in mem]
        return out + [e for e in mem.values() if e.state == state]

    # -- runtime silences -----------------------------------------------------------

    def silence_save(self, silence_id: str, body: dict[str, Any]) -> None:
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO silences VALUES (?,?)", (silence_id, dumps(body))
            )

    def silences_load(self) -> list[dict[str, Any]]:
        return [orjson.loads(b) for (b,) in self._query("SELECT body FROM silences")]

    # -- tables their owners keep (schema and SQL beside the owner) ----------------

    def owned_write(self, sql: str, rows: Iterable[tuple[Any, ...]] = ((),)) -> None:
        """Run ``sql`` once per row in one transaction; a failure is counted, not raised."""
        with self._tx():
            for params in rows:
                self._db.execute(sql, params)

    def owned_read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return self._query(sql, params)

    # -- plumbing -----------------------------------------------------------------

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        """A write transaction on the calling thread. A write that fails is counted and
        logged by the caller's state watch, never raised into the alert path: the daemon
        keeps watching and alerting while its disk is full."""
        try:
            with self._lock, self._begin():
                yield
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
        else:
            self._succeeded()

    @contextlib.contextmanager
    def _begin(self) -> Iterator[None]:
        """BEGIN … COMMIT (ROLLBACK on error); the caller holds the lock."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise
        try:
            self._db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise
