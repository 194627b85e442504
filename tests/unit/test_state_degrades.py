"""State degrades instead of dying: one daemon per state_dir, a corrupt database moved
aside, a full disk that keeps watching and alerting and says so until writes succeed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from pathlib import Path

import pytest

from tests.unit.test_detector import Sink
from watchd.alerting.nflog import NflogEntry, NotificationLog
from watchd.daemon.statewatch import StateWatch
from watchd.detection.detector import Detector
from watchd.store.chats import ChatStore
from watchd.store.lock import StateInUse, StateLock
from watchd.store.records import ChatRecord
from watchd.store.rows import ChatRows
from watchd.store.sqlite import StateFile


def test_a_second_holder_of_the_state_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    """The state directory is locked for the holder's life; a second lock names its pid;
    once released (as the kernel does when a process dies) it can be taken again."""
    first = StateLock.acquire(tmp_path)
    with pytest.raises(StateInUse, match=rf"in use by another watchd \(pid {os.getpid()}\)"):
        StateLock.acquire(tmp_path)
    first.release()
    StateLock.acquire(tmp_path).release()


def test_the_state_dir_stays_locked_when_its_lock_file_is_deleted(tmp_path: Path) -> None:
    """``rm watchd.lock`` beneath a running daemon does not let a second one in: the
    directory itself is locked, and the refusal still says the directory is in use."""
    first = StateLock.acquire(tmp_path)
    (tmp_path / "watchd.lock").unlink()
    with pytest.raises(StateInUse, match=r"in use by another watchd"):
        StateLock.acquire(tmp_path)
    first.release()
    StateLock.acquire(tmp_path).release()


def test_a_corrupt_database_is_moved_aside_and_state_starts_empty(tmp_path: Path) -> None:
    """A file that is not a database is kept aside (never deleted), a fresh database is
    started, and reset_from says where the old one went and why."""
    path = tmp_path / "watchd.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    db = StateFile.open(path)
    try:
        assert db.reset_from is not None
        aside, why = db.reset_from
        assert aside.read_bytes().startswith(b"this is not sqlite")
        assert "not a database" in why
        assert db.part(ChatRows).load() == []
        db.part(ChatRows).mark(ChatRecord("a", "c1", "running", 1.0, "transition", 1.0, 1.0))
        db.flush()
        assert len(db.part(ChatRows).load()) == 1
    finally:
        db.close()


def _fill_the_disk(db: StateFile) -> None:
    """SQLite's own ceiling: past max_page_count every write fails with SQLITE_FULL, as on
    a full disk."""
    pages = db._db.execute("PRAGMA page_count").fetchone()[0]
    db._db.execute(f"PRAGMA max_page_count = {pages}")


def _free_the_disk(db: StateFile) -> None:
    db._db.execute("PRAGMA max_page_count = 1073741823")


async def test_a_full_disk_keeps_state_pending_and_says_so_until_writes_succeed(
    tmp_path: Path,
) -> None:
    """Writes failing with 'database or disk is full' never stop the flusher: the batch
    stays pending, StateNotPersisted (critical) fires once, the notification log still
    deduplicates in memory, and when space returns the batch is written and it resolves."""
    db = StateFile.open(tmp_path / "watchd.sqlite3")
    sink = Sink()
    det = Detector(store=ChatStore(), sink=sink, db=db)
    watch = StateWatch(db=db, detector=det, state_dir=str(tmp_path))
    watch.backoff.cap = 0.2
    chats, nflog = db.part(ChatRows), db.part(NotificationLog)
    _fill_the_disk(db)
    for i in range(2_000):
        chats.mark(
            ChatRecord("a", f"c{i}", "running", 1.0, "transition", 1.0, 1.0, title="x" * 200)
        )
    entry = NflogEntry("hook", "g1", frozenset({"fp"}), frozenset(), 1.0, 9e9)
    await nflog.put(entry)
    task = asyncio.create_task(watch.run())
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if sink.alerts:
                break
        assert sink.names() == [("StateNotPersisted", "firing")]
        assert sink.alerts[0].labels["severity"] == "critical"
        assert db.pending >= 2_000 and db.write_failures >= 1 and not db.persisting
        assert db.part(NotificationLog).get("hook", "g1") == entry
        _free_the_disk(db)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if len(sink.alerts) > 1:
                break
        assert sink.names() == [("StateNotPersisted", "firing"), ("StateNotPersisted", "resolved")]
        assert db.persisting
        assert len(db.part(ChatRows).load()) == 2_000
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        db.close()


async def test_state_reset_is_announced_after_a_corrupt_start(tmp_path: Path) -> None:
    """A start that moved a corrupt database aside raises StateReset naming where it went."""
    path = tmp_path / "watchd.sqlite3"
    path.write_bytes(b"\x00garbage" * 512)
    db = StateFile.open(path)
    sink = Sink()
    det = Detector(store=ChatStore(), sink=sink, db=db)
    StateWatch(db=db, detector=det, state_dir=str(tmp_path)).start()
    try:
        assert sink.names() == [("StateReset", "firing")]
        assert ".corrupt-" in sink.alerts[0].annotations["summary"]
    finally:
        db.close()


async def test_the_notification_log_is_read_without_waiting_for_the_state_writer(
    tmp_path: Path,
) -> None:
    """Entries written before a restart are found after it (an unreadable one as never
    sent), and reading one never waits for the lock the state writer holds through a
    commit: a flush asks before every send, on the event loop."""
    import threading

    path = tmp_path / "watchd.sqlite3"
    entry = NflogEntry("hook", "g1", frozenset({"fp1", "fp2"}), frozenset({"fp0"}), 1.0, 9e9)
    db = StateFile(path)
    await db.part(NotificationLog).put(entry)
    await db.part(NotificationLog).put(
        NflogEntry("hook", "bad", frozenset(), frozenset(), 1.0, 9e9)
    )
    db._db.execute("UPDATE nflog SET firing='not json' WHERE group_key='bad'")
    db.close()
    db = StateFile(path)
    nflog = db.part(NotificationLog)
    got: list[object] = []
    gate = threading.Event()
    db._writer.submit(gate.wait)  # the state writer's thread, mid-commit
    try:
        reader = threading.Thread(
            target=lambda: got.extend(
                [
                    nflog.get("hook", "g1"),
                    nflog.get("hook", "g2"),
                    nflog.get("hook", "bad"),
                ]
            )
        )
        reader.start()
        reader.join(5)
        assert not reader.is_alive()
    finally:
        gate.set()
    assert got == [entry, None, None]
    db.close()


async def test_a_foreign_lock_on_the_database_never_blocks_the_loop(tmp_path: Path) -> None:
    """A second connection holding BEGIN IMMEDIATE (an operator's sqlite3 shell): flushes,
    the probe and a notification-log write wait on the writer thread, not the loop, which
    keeps ticking; each failure is counted (never raised into the alert path), the batch
    stays pending and is written once the lock goes."""
    path = tmp_path / "watchd.sqlite3"
    db = StateFile(path, busy_timeout=1.0)
    chats, nflog = db.part(ChatRows), db.part(NotificationLog)
    outside = sqlite3.connect(path, isolation_level=None)
    outside.execute("BEGIN IMMEDIATE")
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    tick = asyncio.create_task(ticker())
    try:
        chats.mark(ChatRecord("a", "c1", "running", 1.0, "transition", 1.0, 1.0))
        first = asyncio.create_task(db.flush_async())
        await asyncio.sleep(0.1)  # the writer thread now waits on the outside lock
        chats.mark(ChatRecord("a", "c2", "running", 1.0, "transition", 1.0, 1.0))
        second = asyncio.create_task(db.flush_async())
        for flush in (first, second):
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                await flush
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await db.probe()
        sent = NflogEntry("hook", "g1", frozenset({"fp"}), frozenset(), 1.0, 9e9)
        await nflog.put(sent)
        assert nflog.get("hook", "g1") == sent
        assert db.write_failures == 4 and not db.persisting and db.pending == 2
        # Each busy wait is a second long: a loop that waited for one would show it.
        assert len(gaps) > 20 and max(gaps) < 0.5
        outside.execute("ROLLBACK")
        assert await db.flush_async() == 2
        assert db.persisting and {r.chat_id for r in chats.load()} == {"c1", "c2"}
    finally:
        tick.cancel()
        with pytest.raises(asyncio.CancelledError):
            await tick
        outside.close()
        db.close()


async def test_an_observed_transition_is_on_disk_within_milliseconds(tmp_path: Path) -> None:
    """A transition the store observed is committed at once (the flusher is hurried), not
    within the second: a kill -9 right after it cannot forget the episode it began."""
    from watchd.coder.observing import ChatId, Observation

    db = StateFile.open(tmp_path / "watchd.sqlite3")
    store = ChatStore()
    det = Detector(store=store, sink=Sink(), db=db)
    watch = StateWatch(db=db, detector=det, state_dir=str(tmp_path))
    task = asyncio.create_task(watch.run())

    def on_disk() -> list[tuple[str, str]]:
        with sqlite3.connect(tmp_path / "watchd.sqlite3") as other:
            return other.execute("SELECT chat_id, status FROM chats").fetchall()

    async def within(seconds: float, want: list[tuple[str, str]]) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if on_disk() == want:
                return True
            await asyncio.sleep(0.01)
        return False

    try:
        await asyncio.sleep(1.2)  # past the first regular flush: nothing pending
        first = Observation(id=ChatId("c1"), status="running", updated_at=100.0)
        det.apply("a", [store.observe("a", first, now=100.0, via="watch", kind="created")])  # type: ignore[list-item]
        await asyncio.sleep(1.1)
        assert on_disk() == [("c1", "running")]
        moved = Observation(id=ChatId("c1"), status="waiting", updated_at=101.0)
        det.apply("a", [store.observe("a", moved, now=101.0, via="listing")])  # type: ignore[list-item]
        assert await within(0.3, [("c1", "waiting")])
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        db.close()
