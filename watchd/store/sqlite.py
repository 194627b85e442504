"""A small SQLite kit: one state file, shared by owners who each keep their own tables.

The file holds the connection, runs every statement on one writer thread, commits the
owners' batched rows once a flush is asked for, and tracks failures. Each owner (the
chat store, the notification log, the dispatch groups, the sweep, the silences, the
detector's alerts) subclasses :class:`Part` beside its own code: its schema, its SQL, its
row codecs and what it keeps pending. It degrades instead of dying: a write that fails
(disk full, read-only, I/O error, another process's lock) is counted and remembered in
``failing_since``, and a failed batch is given back to its owners to be written by the
next flush. Each owner writes behind its own savepoint, so one whose rows fail never
holds back another's. A database that cannot be read at all is moved aside by
:meth:`StateFile.open`.

It must not know any owner's tables, and must not run SQL on the event loop or make it
wait for a lock: the loop only takes batches (plain dicts) and awaits the writer thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import orjson

# How long a write waits for another process's lock on the file (an operator's sqlite3
# shell, a backup) before it fails, is counted and is retried by the next flush.
# SQLite's default is 5 s; every write runs on the writer thread, never on the loop.
BUSY_TIMEOUT = 0.5
SCHEMA_VERSION = "1"
META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"

T = TypeVar("T")
P = TypeVar("P", bound="Part")


def dumps(obj: Any) -> str:
    """JSON text for a column (mappings such as ``MappingProxyType`` as objects)."""
    return orjson.dumps(obj, default=_plain).decode()


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class Part:
    """One owner's tables in the state file. ``take`` and ``restore`` run on the loop,
    ``setup`` and ``write`` on the writer thread (``write`` inside the flush's
    transaction, with every other owner's rows of that flush)."""

    schema: ClassVar[str] = ""

    def __init__(self, file: StateFile) -> None:
        self.file = file

    def setup(self, db: sqlite3.Connection) -> None:
        """Once, after the schema: bring older tables up to date, read what is kept in
        memory."""

    @property
    def pending(self) -> int:
        return 0

    def take(self) -> Any:
        """Hand over what is pending (None: nothing to write now)."""
        return None

    def write(self, db: sqlite3.Connection, batch: Any) -> int:
        """Write a taken batch; returns how many rows it was."""
        return 0

    def restore(self, batch: Any) -> None:
        """Take a batch back whose write failed, under anything marked since."""


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """Whether state persists, and how it failed, as plain data."""

    persisting: bool
    failing_since: float | None
    write_failures: int
    last_write_error: str
    pending: int
    reset_from: str | None  # where a corrupt database was moved aside


# The longest a hold (StateFile.holding) keeps the flush from writing; then it writes.
HOLD_MAX = 2.0


class StateFile:
    """The state file and its writer thread."""

    def __init__(self, path: str | Path, *, busy_timeout: float = BUSY_TIMEOUT) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection, used by one writer thread: what is submitted to it runs in the
        # order submitted, so a later batch never lands under an earlier one, and the
        # event loop never waits for it (nor for SQLite's busy wait on another process).
        self._db = sqlite3.connect(
            str(self.path), isolation_level=None, check_same_thread=False, timeout=busy_timeout
        )
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="watchd-state")
        self._flushing = asyncio.Lock()
        self._holds = 0  # bursts being fired, large notifications being sent, now
        self._held_since = 0.0  # the loop's time the first of them began
        self._parts: dict[type[Part], Part] = {}
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(META)
            self._db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,)
            )
        except BaseException:
            self._shut()
            raise
        # Set by open() when a corrupt database was moved aside: (where it went, why).
        self.reset_from: tuple[Path, str] | None = None
        self.failing_since: float | None = None  # wall time of the first failed write
        # Set by an owner whose rows should not wait for the once-a-second flush (a chat's
        # observed transition): the state watch flushes at once (see daemon.statewatch).
        self.hurried = asyncio.Event()
        self.write_failures = 0
        self.last_write_error = ""

    @classmethod
    def open(cls, path: str | Path) -> StateFile:
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
            db._shut()
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

    def part(self, kind: type[P]) -> P:
        """The owner's part of this file: one per owner, made (its tables created, its
        ``setup`` run, waited for here) the first time it is asked for, so ask while
        wiring, at start-up; later asks return the same part."""
        found = self._parts.get(kind)
        if found is None:
            made = kind(self)

            def setup() -> None:
                if made.schema:
                    self._db.executescript(made.schema)
                made.setup(self._db)

            self._on_writer(setup)
            self._parts[kind] = found = made
        assert isinstance(found, kind)
        return found

    # -- health ---------------------------------------------------------------------

    @property
    def persisting(self) -> bool:
        return self.failing_since is None

    def snapshot(self) -> StateSnapshot:
        return StateSnapshot(
            persisting=self.persisting,
            failing_since=self.failing_since,
            write_failures=self.write_failures,
            last_write_error=self.last_write_error,
            pending=self.pending,
            reset_from=str(self.reset_from[0]) if self.reset_from else None,
        )

    def hurry(self) -> None:
        """Ask for a flush now rather than within the second (cheap; coalesced)."""
        self.hurried.set()

    @property
    def pending(self) -> int:
        return sum(p.pending for p in self._parts.values())

    def _failed(self, exc: BaseException) -> None:
        self.write_failures += 1
        self.last_write_error = f"{type(exc).__name__}: {exc}"[:300]
        if self.failing_since is None:
            self.failing_since = time.time()

    def _succeeded(self) -> None:
        self.failing_since = None

    async def probe(self) -> None:
        """One small write on the writer thread, to learn whether writing works again
        (raises if not)."""

        def probe() -> None:
            with self._begin():
                self._db.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('probe', ?)",
                    (str(time.time()),),
                )

        try:
            await self._off_loop(probe)
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
            raise
        self._succeeded()

    # -- the batched flush ------------------------------------------------------------

    def flush(self) -> int:
        """Write what is pending now and wait for it (start-up, shutdown); raises if it
        cannot, and what was pending stays pending."""
        batch = self._take()
        try:
            written, failed = self._on_writer(lambda: self._write(batch))
        except (sqlite3.Error, OSError):
            self._restore(batch)
            raise
        self._restore(failed)
        return written

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While a burst is fired or a large notification is built and sent: the flush
        writes nothing, for at most HOLD_MAX. Serialising ten thousand rows in the
        writer's thread would share the interpreter with them (0.6 s of CPU for a
        burst of 10 000 alerts). Nothing is dropped; it is written a little later."""
        if not self._holds:
            self._held_since = asyncio.get_running_loop().time()
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1

    @property
    def held(self) -> bool:
        """A hold is on, not for HOLD_MAX yet (a flush outside the loop, at start or
        stop, is never held)."""
        if not self._holds:
            return False
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            return False
        return now - self._held_since < HOLD_MAX

    async def flush_async(self) -> int:
        """Write what is pending on the writer thread, so a burst (ten thousand alerts
        and their groups) does not stall the event loop while it commits. Raises when
        the transaction failed (everything stays pending); an owner whose own rows
        failed gets them back, counted, while the others' are committed."""
        # One flush at a time, taken on the loop (no thread lock to wait for) and put back
        # on the loop if it failed, before the next one is taken: a later flush never
        # commits older data over newer.
        if self.held:
            return 0
        async with self._flushing:
            batch = self._take()
            if not batch:
                return 0
            try:
                written, failed = await self._off_loop(lambda: self._write(batch))
            except (sqlite3.Error, OSError):
                self._restore(batch)
                raise
            self._restore(failed)
            return written

    def _take(self) -> list[tuple[Part, Any]]:
        taken = ((p, p.take()) for p in self._parts.values())
        return [(p, b) for p, b in taken if b is not None]

    def _restore(self, batch: list[tuple[Part, Any]]) -> None:
        for part, rows in batch:
            part.restore(rows)

    def _write(self, batch: list[tuple[Part, Any]]) -> tuple[int, list[tuple[Part, Any]]]:
        """On the writer thread: every owner's rows in one transaction, each behind its
        own savepoint, so one owner's failure (a row that cannot be encoded, say) never
        holds back another's. Returns rows written and the owners' batches that failed;
        raises (counted) when the transaction itself failed."""
        if not batch:
            return 0, []
        n = 0
        failed: list[tuple[Part, Any]] = []
        try:
            with self._begin():
                for part, rows in batch:
                    self._db.execute("SAVEPOINT part")
                    try:
                        n += part.write(self._db, rows)
                    except Exception as exc:
                        self._db.execute("ROLLBACK TO part")
                        self._failed(exc)
                        failed.append((part, rows))
                    self._db.execute("RELEASE part")
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
            raise
        if n and not failed:
            self._succeeded()
        return n, failed

    # -- direct statements ------------------------------------------------------------

    async def commit(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        """One statement in its own transaction on the writer thread, awaited. A write
        that fails is counted (the state watch says so), never raised into the caller's
        path: the daemon keeps alerting while its disk is full. Returns rows changed (0
        when it failed)."""

        def write() -> int:
            with self._begin():
                return self._db.execute(sql, params).rowcount

        try:
            n = await self._off_loop(write)
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
            return 0
        self._succeeded()
        return n

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of a query, waited for (start-up: loading what a part keeps)."""
        return self._on_writer(lambda: self._db.execute(sql, params).fetchall())

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._shut()

    def _shut(self) -> None:
        with contextlib.suppress(RuntimeError):  # shut already
            self._on_writer(self._db.close)
        self._writer.shutdown()

    # -- plumbing -----------------------------------------------------------------

    def _on_writer(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the writer thread and wait for it here."""
        return self._writer.submit(fn).result()

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the writer thread; the loop goes on meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn)

    @contextlib.contextmanager
    def _begin(self) -> Iterator[None]:
        """BEGIN … COMMIT (ROLLBACK on error), on the writer thread."""
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
