"""The state file's owners: each keeps its own tables, one cannot hold back another's
writes, and a database written when one StateDB held them all opens with every owner's
rows intact."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from watchd.alerting.grouprows import GroupRows
from watchd.alerting.nflog import NflogEntry, NotificationLog
from watchd.alerting.silencing import SilenceRows
from watchd.detection.ledger import StoredAlerts
from watchd.remediation.progress import SweepEntry, SweepProgress
from watchd.store.records import ChatRecord
from watchd.store.rows import ChatRows
from watchd.store.sqlite import Part, StateFile

# The schema as the single StateDB wrote it (watchd/store/rows.py before the split).
OLD_LAYOUT = """
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
INSERT INTO meta VALUES ('schema', '1');
INSERT INTO chats VALUES ('a','c1','running',100.0,'transition',100.0,101.0,
  'alice','t',NULL,NULL,'[]',NULL,NULL,3,NULL);
INSERT INTO nflog VALUES ('hook','{}:{chat_id="c1"}','["fp1"]','[]',200.0,9e9);
INSERT INTO dispatch VALUES ('hook','{}:{chat_id="c1"}','fp1',
  '{"fingerprint":"fp1","labels":{"alertname":"ChatStuck"},"annotations":{},
    "starts_at":150.0,"ends_at":null}');
INSERT INTO sweep VALUES ('a','c1','p',100.0,'interrupt_sent',1,160.0,'sent');
INSERT INTO silences VALUES ('s1','{"id":"s1","matchers":["chat_id=c1"]}');
INSERT INTO alerts VALUES ('fp1','a','c1','{"alertname":"ChatStuck"}','{"summary":"s"}',
  150.0,NULL);
"""


def _old_database(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(OLD_LAYOUT)
    db.commit()
    db.close()


def test_a_database_of_the_old_layout_keeps_every_owners_rows(tmp_path: Path) -> None:
    """Chats, the notification log, the groups' alerts, sweep progress, silences and
    firing alerts written by the one-StateDB build are each read by their owner."""
    path = tmp_path / "watchd.sqlite3"
    _old_database(path)
    db = StateFile.open(path)
    try:
        assert db.reset_from is None
        (chat,) = db.part(ChatRows).load()
        assert (chat.chat_id, chat.since, chat.version) == ("c1", 100.0, 3)
        entry = db.part(NotificationLog).get("hook", '{}:{chat_id="c1"}')
        assert entry == NflogEntry(
            "hook", '{}:{chat_id="c1"}', frozenset({"fp1"}), frozenset(), 200.0, 9e9
        )
        ((receiver, _key, body),) = db.part(GroupRows).load()
        assert (receiver, body["fingerprint"], body["starts_at"]) == ("hook", "fp1", 150.0)
        assert db.part(SweepProgress).get("a", "c1", "p") == SweepEntry(
            "a", "c1", "p", 100.0, "interrupt_sent", 1, 160.0, "sent"
        )
        assert [b["id"] for b in db.part(SilenceRows).load()] == ["s1"]
        (alert,) = db.part(StoredAlerts).load()
        assert (alert.fingerprint, alert.labels, alert.ends_at) == (
            "fp1",
            {"alertname": "ChatStuck"},
            None,
        )
    finally:
        db.close()


def test_each_owner_writes_its_rows_and_they_survive_a_reopen(tmp_path: Path) -> None:
    """One flush writes what every owner queued (an identity forgotten, a sweep step, a
    silence) in one pass; a fresh file on the same path reads each back through its owner."""
    path = tmp_path / "watchd.sqlite3"
    _old_database(path)
    db = StateFile.open(path)
    step = SweepEntry("a", "c2", "p", 1.0, "planned", 0, 2.0)
    assert len(db.part(ChatRows).load()) == 1
    db.part(ChatRows).forget("a")
    db.part(SweepProgress).put(step)
    db.part(SilenceRows).save("s2", {"id": "s2"})
    assert db.pending == 3
    assert db.flush() == 3
    db.close()
    db = StateFile.open(path)
    try:
        assert db.part(ChatRows).load() == []
        assert db.part(SweepProgress).get("a", "c2", "p") == step
        assert {b["id"] for b in db.part(SilenceRows).load()} == {"s1", "s2"}
    finally:
        db.close()


class _Unencodable(Part):
    """An owner whose rows cannot be written (a body that is not JSON, say)."""

    def __init__(self, file: StateFile) -> None:
        super().__init__(file)
        self.rows: list[object] = []

    @property
    def pending(self) -> int:
        return len(self.rows)

    def take(self) -> list[object] | None:
        if not self.rows:
            return None
        batch, self.rows = self.rows, []
        return batch

    def restore(self, batch: list[object]) -> None:
        self.rows[:0] = batch

    def write(self, db: sqlite3.Connection, batch: list[object]) -> int:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('half', 'written')")
        raise TypeError("not JSON serialisable: object")


async def test_one_owner_that_cannot_write_never_holds_back_another(tmp_path: Path) -> None:
    """An owner whose write raises gets its rows back (counted, failing_since set, none of
    its half-written rows kept) while the chats of the same flush are committed."""
    db = StateFile(tmp_path / "watchd.sqlite3")
    try:
        broken, chats = db.part(_Unencodable), db.part(ChatRows)
        broken.rows.append(object())
        chats.mark(ChatRecord("a", "c1", "running", 1.0, "transition", 1.0, 1.0))
        assert await db.flush_async() == 1
        assert [r.chat_id for r in chats.load()] == ["c1"]
        assert broken.pending == 1 and db.write_failures == 1 and not db.persisting
        assert "TypeError" in db.last_write_error
        assert db.read("SELECT value FROM meta WHERE key='half'") == []
    finally:
        broken.rows.clear()
        db.close()


def test_a_chats_details_are_kept_as_an_object_and_older_lists_still_read() -> None:
    """A record's fields without a column round-trip through ``details`` (only those not
    at their defaults are written), and rows of the older list layouts (four, five and
    six entries) read back as the same records."""
    from watchd.coder.observing import ToolCall
    from watchd.store.rows import chat_record, chat_row

    full = ChatRecord(
        "a", "c1", "requires_action", 1.0, "transition", 1.0, 2.0, version=3,
        mode="explore", client_type="ui", context_error="e", warnings=("w",),
        pending=(ToolCall("t1", "ask"),), kind="root",
    )  # fmt: skip
    row = chat_row(full)
    assert row[-1] == (
        '{"mode":"explore","client_type":"ui","context_error":"e","warnings":["w"],'
        '"pending":[{"tool_call_id":"t1","tool_name":"ask"}],"kind":"root"}'
    )
    assert chat_record(row) == full
    plain = ChatRecord("a", "c2", "running", 1.0, "transition", 1.0, 2.0, version=1)
    assert chat_row(plain)[-1] is None and chat_record(chat_row(plain)) == plain
    base = row[:-1]
    assert chat_record((*base, '["explore","ui","e",["w"],[["t1","ask"]],"root"]')) == full
    five = chat_record((*base, '["explore","ui","e",["w"],[["t1","ask"]]]'))
    assert five.pending == full.pending and five.kind == ""
    four = chat_record((*base, '["explore","ui","e",["w"]]'))
    assert (four.mode, four.warnings, four.pending) == ("explore", ("w",), ())
