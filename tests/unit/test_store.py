"""Chat store transitions, staleness, listings and tombstones."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from watchd.coder.errors import PayloadError
from watchd.coder.observing import ChatId, Observation, ToolCall, flatten, from_json
from watchd.coder.pages import read_page
from watchd.store.chats import ChatStore
from watchd.store.listing import observe_page
from watchd.store.records import MAX_PENDING, PENDING_TEXT_MAX, ChatRecord
from watchd.store.rows import ChatRows
from watchd.store.sqlite import StateFile


def chat(cid: str, status: str, updated: float | None, **kw: object) -> Observation:
    return Observation(id=ChatId(cid), status=status, updated_at=updated, **kw)  # type: ignore[arg-type]


def test_watch_transition_starts_an_exact_clock() -> None:
    """A status_change on the stream starts the clock at the event's updated_at."""
    s = ChatStore()
    s.observe("a", chat("c1", "waiting", 100.0), now=100.0, via="watch", kind="created")
    ch = s.observe("a", chat("c1", "running", 150.0), now=151.0, via="watch", kind="status_change")
    assert ch is not None and ch.kind == "transition"
    assert (ch.record.since, ch.record.clock) == (150.0, "transition")


def test_listing_first_sighting_is_a_lower_bound() -> None:
    """A chat first seen in a listing uses updated_at as a lower bound."""
    s = ChatStore()
    ch = s.observe("a", chat("c1", "running", 90.0), now=200.0, via="listing")
    assert ch is not None and (ch.record.since, ch.record.clock) == (90.0, "lower_bound")


def test_same_status_keeps_the_clock() -> None:
    """Progress (updated_at moving) in the same status does not restart the clock."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", 100.0), now=100.0, via="watch", kind="status_change")
    ch = s.observe("a", chat("c1", "running", 400.0), now=400.0, via="listing")
    assert ch is not None and ch.kind == "refresh" and ch.record.since == 100.0


def test_stale_updates_are_ignored() -> None:
    """An observation older than what we hold changes nothing."""
    s = ChatStore()
    s.observe("a", chat("c1", "waiting", 200.0), now=200.0, via="watch", kind="status_change")
    assert s.observe("a", chat("c1", "running", 150.0), now=201.0, via="listing") is None
    rec = s.get("a", "c1")
    assert rec is not None and rec.status == "waiting" and s.stale_ignored == 1


def test_an_older_stamp_with_another_status_is_held_for_a_fresh_read() -> None:
    """An event or row older than the record that names another status (overtaken, or
    stamped after the server's clock stepped back) changes nothing but is handed out once
    for a re-read; an older one with the same status is plain stale."""
    s = ChatStore()
    s.observe("a", chat("c1", "error", 200.0), now=200.0, via="watch", kind="status_change")
    assert s.observe("a", chat("c1", "error", 199.0), now=201.0, via="listing") is None
    assert s.take_contradicted("a") == set()
    assert s.observe("a", chat("c1", "running", 197.5), now=201.0, via="watch") is None
    assert s.observe("a", chat("c1", "running", 197.5), now=205.0, via="listing") is None
    assert s.take_contradicted("a") == {"c1"} and s.take_contradicted("a") == set()
    rec = s.get("a", "c1")
    assert rec is not None and rec.status == "error"


def test_listing_difference_is_synthesized_transition() -> None:
    """A status change found by a listing is marked synthesized."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", 100.0), now=100.0, via="watch", kind="status_change")
    changes = s.apply_listing("a", [chat("c1", "waiting", 300.0)], now=310.0, started=305.0)
    assert [(c.kind, c.record.clock) for c in changes] == [("transition", "synthesized")]
    assert s.synthesized == 1


def test_listing_marks_missing_chats_absent_but_keeps_them() -> None:
    """A chat missing from a complete listing becomes absent, record and clock untouched;
    one seen after the listing started is spared; a second listing counts two."""
    s = ChatStore()
    s.observe("a", chat("old", "running", 100.0), now=100.0, via="watch", kind="created")
    s.observe("a", chat("new", "running", 300.0), now=301.0, via="watch", kind="created")
    before = s.get("a", "old")
    assert s.apply_listing("a", [], now=302.0, started=300.5) == []
    assert s.absent("a") == {"old": 1}
    assert s.get("a", "old") == before
    assert s.finish_listing("a", set(), started=400.0) == {"old": 2, "new": 1}


def test_a_sighting_clears_absence_and_keeps_the_clock() -> None:
    """A chat the cursor skipped that turns up again keeps its original clock and source."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", 100.0), now=100.0, via="watch", kind="status_change")
    s.finish_listing("a", set(), started=200.0)
    change = s.observe("a", chat("c1", "running", 250.0), now=260.0, via="listing")
    rec = s.get("a", "c1")
    assert change is not None and change.kind == "refresh"
    assert rec is not None and (rec.since, rec.clock) == (100.0, "transition")
    assert s.absent("a") == {}


def test_archived_and_deleted_tombstone() -> None:
    """Archived chats and deleted events remove the record."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", 100.0), now=100.0, via="watch", kind="created")
    s.observe("a", chat("c2", "running", 100.0), now=100.0, via="watch", kind="created")
    a = s.observe("a", chat("c1", "running", 120.0, archived=True), now=120.0, via="listing")
    d = s.observe("a", chat("c2", "running", 120.0), now=120.0, via="watch", kind="deleted")
    assert a is not None and a.reason == "archived"
    assert d is not None and d.reason == "deleted"
    assert len(s) == 0


def test_minimal_payload_keeps_known_details() -> None:
    """An older era's minimal watch payload does not erase the title and labels we had."""
    s = ChatStore()
    s.observe(
        "a",
        chat("c1", "running", 100.0, title="Fix it", labels={"t": "1"}),
        now=100.0,
        via="listing",
    )
    s.observe("a", chat("c1", "waiting", 110.0), now=110.0, via="watch", kind="status_change")
    rec = s.get("a", "c1")
    assert rec is not None and rec.title == "Fix it" and rec.labels == (("t", "1"),)


def test_capacity_bound_counts_overflow() -> None:
    """Past its capacity the store refuses new chats and counts them."""
    s = ChatStore(capacity=2)
    for i in range(3):
        s.observe("a", chat(f"c{i}", "running", 1.0), now=1.0, via="listing")
    assert len(s) == 2 and s.overflow == 1


# The listing rows below are stamped 2026-11-29T10:00:00Z; observations happen just after.
T = 1_795_946_400.0


def _row(
    cid: str, status: str = "running", updated: str = "2026-11-29T10:00:00Z", **kw: object
) -> dict[str, object]:
    return {"id": cid, "status": status, "updated_at": updated, "title": "t", **kw}


ROW_VARIANTS = [
    _row("c1"),  # unchanged
    _row("c1", status="waiting"),
    _row("c1", updated="2026-11-29T10:05:00Z"),
    _row("c1", updated="2026-11-29T09:55:00Z"),  # stale
    _row("c1", title="renamed"),
    _row("c1", title=""),
    _row("c1", title="x" * 250),
    _row("c1", queued_for_capacity=True),
    _row("c1", queued_for_capacity="yes"),
    _row("c1", archived=True),
    _row("c1", children=[_row("k1")]),
    _row("c1", updated="2026-11-29T10:00:00+00:00"),  # the same instant, spelt differently
    _row("c1", updated="2026-11-29T10:00:00"),  # zone-less: read as UTC, the same instant
    _row("n1"),  # new
]


@pytest.mark.parametrize("row", ROW_VARIANTS, ids=[str(i) for i in range(len(ROW_VARIANTS))])
def test_listing_rows_fast_path_agrees_with_parse_and_observe(row: dict[str, object]) -> None:
    """A raw listing row changes the store exactly as parsing it and observing it would."""
    seeded = _row("c1")
    fast, slow = ChatStore(), ChatStore()
    for s in (fast, slow):
        s.observe("a", from_json(seeded), now=T + 100.0, via="listing")
    got = observe_page(fast, "a", read_page(_body(row)), now=T + 200.0, present=set())
    want = []
    for c in flatten([from_json(row)]):
        change = slow.observe("a", c, now=T + 200.0, via="listing")
        if change is not None:
            want.append(change)
    assert [(c.kind, c.record) for c in got] == [(c.kind, c.record) for c in want]
    assert list(fast.records()) == list(slow.records())


def _seeded() -> ChatStore:
    """A store holding c1..c3 (running, title "t"), k1 (a child of c3), q1 (queued)."""
    s = ChatStore()
    for cid in ("c1", "c2", "c3"):
        s.observe("a", from_json(_row(cid)), now=T + 100.0, via="listing")
    s.observe("a", from_json(_row("k1", parent_chat_id="c3")), now=T + 100.0, via="listing")
    s.observe("a", from_json(_row("q1", queued_for_capacity=True)), now=T + 100.0, via="listing")
    return s


def _body(*rows: object) -> bytes:
    return orjson.dumps(list(rows))


# Listing pages (raw bodies) the compared-fields path must apply exactly as the tolerant
# path does: ordinary, odd, hostile. Rows around a variant are unchanged.
PAGES: list[bytes] = [
    _body(_row("c1"), _row("c2"), _row("c3")),
    *(_body(_row("c2"), variant, _row("c3")) for variant in ROW_VARIANTS),
    _body(_row("c1", title=5)),
    _body(_row("c1", status=3)),
    _body(_row("c1", status=None)),
    _body(_row("c1", updated=12)),
    _body(_row("c1", updated=None)),
    _body(_row("c1", updated="")),
    _body(_row("c1", updated="yesterday")),
    _body(_row("c1", updated="2026-11-29T10:00:00.000000000Z")),  # nanoseconds, same instant
    _body(_row("c1", updated="2026-11-29T10:00:00.000000999Z")),  # finer than microseconds
    _body(_row("c1", updated="2026-11-29T12:00:00+02:00")),  # the same instant at an offset
    _body(_row("c1", updated="2026-11-29T10:00:00.5-00:30")),
    # Spellings the stamp check must read exactly as models.timestamp does (same
    # instant, other instants, or not a stamp at all to one of the two readers).
    _body(_row("c1", updated="2026-11-29T10:00:00.0000001Z")),
    _body(_row("c1", updated="2026-11-29T10:00:00.9999999Z")),
    _body(_row("c1", updated="2026-11-29T09:59:59.9999999Z")),
    _body(_row("c1", updated="2026-11-29 10:00:00Z")),
    _body(_row("c1", updated="2026-11-29t10:00:00z")),
    _body(_row("c1", updated="2026-11-29T10:00:00,0Z")),
    _body(_row("c1", updated="20261129T100000Z")),
    _body(_row("c1", updated="2026-11-29T10:00Z")),
    _body(_row("c1", updated="2026-11-29")),
    _body(_row("c1", updated="2026-11-29T09:59:60Z")),
    _body(_row("c1", updated="2026-11-29T10:00:00+00:00:00")),
    _body(_row("c1", updated="2026-11-29T10:00:00-00:00")),
    _body(_row("c1", updated="2026-11-29T10:00:00 ")),
    _body(_row("c1", updated="２０２６-11-29T10:00:00Z")),
    _body(_row("c1", archived=False), _row("c2", archived=None), _row("c3", archived="yes")),
    _body(_row("c1", queued_for_capacity=None), _row("q1", queued_for_capacity=False)),
    _body(_row("q1"), _row("q1", queued_for_capacity=True)),
    _body(_row("c1", children=[]), _row("c2", children=None), _row("c3", children={})),
    _body(_row("c3", children=[_row("k1", parent_chat_id="c3")])),
    _body(_row("c3", children=[_row("k1", status="waiting", updated="2026-11-29T10:01:00Z")])),
    _body(_row("c3", children=[None])),
    _body(_row("c3", children="k1")),
    _body(_row("k1"), _row("c3", children=[_row("k1", status="error")])),  # child listed twice
    _body(_row("c1", status="waiting"), _row("c1")),  # a row repeated within a page
    _body(_row("c1", title="t" * 5000), _row("c2", title="")),
    _body(_row("c1", title=None, status=None, updated=None, archived=None)),
    _body({"id": "c1"}),
    _body({"id": "c1", "status": "running"}),
    _body(_row("c1"), {"status": "running"}),
    _body(_row("c1"), _row("")),
    _body(_row("c1"), {**_row("c2"), "id": 7}),
    _body(_row("c1"), None),
    _body(_row("c1"), ["c2"]),
    _body(_row("c1"), _row("c2", updated="yesterday")),
    _body(_row("c1", labels=5, last_error=[1], mode=3, context="x", warnings={})),
    _body(_row("n1"), _row("n2", status="error", last_error={"message": "m"})),
    b'[{"id":"c1","status":"running","updated_at":"2026-11-29T10:00:00Z","title":"t",'
    b'"title":"renamed"}]',  # a repeated key: the last one counts, on either path
    b'[{"id":"c1","status":"running","updated_at":"2026-11-29T10:00:00Z","x":"\xff"}]',
    b'[{"id":"c1","status":"running","updated_at":"2026-11-29T10:00:00Z","x":"\\u00e9"}]',
    b'[{"id":"c1","status":"running","updated_at":"2026-11-29T10:00:00Z","x":"\\ud800"}]',
    b'[{"id":"c1","status":"running","updated_at":"2026-11-29T10:00:00Z","x":"\xc3\xa9"}]',
    b'[{"id":"c1","status":"running","updated_at":"2026-11-29T10:00:00Z","x":NaN}]',
    b'[{"id":"c1","status":"running","x":' + b"[" * 2000 + b"]" * 2000 + b"}]",
    b"[]",
    b"",
    b"null",
    b"{}",
    b'{"chats": []}',
    b"<html>login</html>",
    b'[{"id":"c1"}] trailing',
    b"[" + b",".join([_body(_row(f"c{i % 3 + 1}"))[1:-1] for i in range(600)]) + b"]",
]


def _apply(s: ChatStore, body: bytes, *, compared: bool) -> tuple[object, ...]:
    """Everything observable about applying one page: the changes (or the error), what
    the listing read, and the store afterwards, including what a later listing infers."""
    present: set[str] = set()
    try:
        changes: object = [
            (c.kind, c.record, c.previous, c.reason)
            for c in observe_page(
                s, "a", read_page(body, compared=compared), now=T + 200.0, present=present
            )
        ]
    except PayloadError as exc:
        changes = ("error", str(exc))
    return (
        changes,
        present,
        list(s.records()),
        (s.stale_ignored, s.synthesized, s.overflow, s.future_clamped, s.before_created),
        s.finish_listing("a", present, started=T + 150.0),
        s.finish_listing("a", set(), started=T + 199.0),
        s.finish_listing("a", set(), started=T + 201.0),
        len(s),
    )


@pytest.mark.parametrize("body", PAGES, ids=[str(i) for i in range(len(PAGES))])
def test_compared_fields_path_agrees_with_the_tolerant_path(body: bytes) -> None:
    """A listing page changes the store (records, changes, errors naming the row, what
    the listing read, later absence) exactly as decoding it in full and parsing it does."""
    assert _apply(_seeded(), body, compared=True) == _apply(_seeded(), body, compared=False)


def test_coderd_pages_take_the_compared_fields_path() -> None:
    """Well-typed pages (children, nulls, offsets) are read without the full decode, and
    a page of unchanged rows is never decoded in full."""
    for body in (
        PAGES[0],
        _body(_row("c3", children=[_row("k1", parent_chat_id="c3")]), _row("c1", children=[])),
        _body(_row("c1", title=None, status=None, updated=None, archived=None)),
        _body(_row("c1", updated="2026-11-29T12:00:00.000000001+02:00")),
        PAGES[-1],
    ):
        assert read_page(body).rows is not None
    page = read_page(PAGES[0])
    assert observe_page(_seeded(), "a", page, now=T + 200.0, present=set()) == []
    assert page._full is None


def test_unchanged_listing_row_is_seen_without_parsing() -> None:
    """An unchanged row only moves the last-seen time, so the listing spares it from tombstoning."""
    s = ChatStore()
    s.observe("a", from_json(_row("c1")), now=T + 100.0, via="listing")
    present: set[str] = set()
    assert observe_page(s, "a", read_page(_body(_row("c1"))), now=T + 200.0, present=present) == []
    assert present == {"c1"}
    assert s.finish_listing("a", present, started=T + 150.0) == {}
    assert s.finish_listing("a", set(), started=T + 250.0) == {"c1": 1}


def test_bad_listing_row_names_its_index() -> None:
    """A row that cannot be read raises a PayloadError naming it."""
    s = ChatStore()
    with pytest.raises(PayloadError, match=r"chats\[1\]\.updated_at"):
        observe_page(
            s,
            "a",
            read_page(_body(_row("c1"), _row("c2", updated="yesterday"))),
            now=T + 1.0,
            present=set(),
        )


def test_long_title_does_not_refresh_every_listing() -> None:
    """A title longer than what is kept compares equal to itself on the next listing."""
    s = ChatStore()
    s.observe("a", from_json(_row("c1", title="y" * 400)), now=T + 100.0, via="listing")
    assert (
        s.observe("a", from_json(_row("c1", title="y" * 400)), now=T + 200.0, via="listing") is None
    )


async def test_threaded_state_flush_commits_off_the_loop_and_in_order(tmp_path: Path) -> None:
    """Every flush commits on the state writer's thread, in the order taken: a flush queued
    behind a running one writes after it."""
    db = StateFile(tmp_path / "state.sqlite3")
    threads: list[int] = []
    write = db._write

    def spy(batch: Any) -> int:
        threads.append(threading.get_ident())
        return write(batch)

    db._write = spy  # type: ignore[method-assign]
    first = ChatRecord("a", "c1", "running", 1.0, "transition", 1.0, 1.0, version=1)
    db.part(ChatRows).mark(first)
    task = asyncio.ensure_future(db.flush_async())
    await asyncio.sleep(0)  # the batch is taken (and the connection held) by the worker
    db.part(ChatRows).mark(msgspec.structs.replace(first, status="waiting", version=2))
    db.flush()  # waits for the worker's commit, then commits the newer record
    assert await task == 1
    assert [(r.status, r.version) for r in db.part(ChatRows).load()] == [("waiting", 2)]
    assert threads[0] == threads[1] != threading.get_ident()
    db.close()


def test_a_stamp_from_the_future_is_clamped_and_cannot_freeze_a_chat() -> None:
    """An updated_at an hour ahead of the server clock is clamped to now (counted), so later
    events and listing rows still apply instead of looking stale."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", T + 3600), now=T, via="watch", kind="status_change")
    rec = s.get("a", "c1")
    assert rec is not None and rec.updated_at == T and s.future_clamped == {"a": 1}
    s.observe("a", chat("c1", "waiting", T + 5), now=T + 6, via="watch", kind="status_change")
    rec = s.get("a", "c1")
    assert rec is not None and (rec.status, rec.since) == ("waiting", T + 5)


def test_a_stamp_before_the_chat_was_created_is_not_a_clock() -> None:
    """An event stamped 1970 for a chat created yesterday starts its clock at the
    observation, not 56 years ago (counted)."""
    s = ChatStore()
    c = msgspec.structs.replace(chat("c1", "running", 0.0), created_raw="2026-11-28T10:00:00Z")
    s.observe("a", c, now=T, via="watch", kind="status_change")
    rec = s.get("a", "c1")
    assert rec is not None and rec.since == T and s.before_created == {"a": 1}


def test_a_confirmation_read_is_authoritative() -> None:
    """A GET whose updated_at is older than what we hold still applies: the server's answer
    now is the truth about the status."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", T + 10), now=T + 10, via="watch", kind="status_change")
    assert s.observe("a", chat("c1", "waiting", T), now=T + 20, via="listing") is None
    change = s.observe("a", chat("c1", "waiting", T), now=T + 20, via="confirm")
    assert change is not None and change.kind == "transition"


def test_a_clock_start_slightly_ahead_of_the_estimate_is_kept_as_the_server_said() -> None:
    """A stamp a second ahead of this replica's server-clock estimate stays the clock start
    (not clamped to the estimate, which differs between replicas), new or transition."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", T + 0.8), now=T, via="listing")
    rec = s.get("a", "c1")
    assert rec is not None and rec.since == T + 0.8
    s.observe("a", chat("c1", "waiting", T + 2.3), now=T + 1, via="watch", kind="status_change")
    rec = s.get("a", "c1")
    assert rec is not None and rec.since == T + 2.3


def test_pending_tool_calls_are_kept_bounded_and_persisted(tmp_path: Path) -> None:
    """An action_required event's tool calls stay on the record (a few, ids and names cut)
    through a later listing of the same status and a restart, and leave with the status;
    the event still tells them after a listing showed the same stamp."""
    calls = tuple(ToolCall(f"call_{i}" + "x" * 300, "run_query") for i in range(20))
    s = ChatStore()
    s.observe("a", chat("c1", "requires_action", 100.0), now=100.0, via="listing")
    ch = s.observe(
        "a",
        chat("c1", "requires_action", 100.0, tool_calls=calls),
        now=101.0,
        via="watch",
        kind="action_required",
    )
    assert ch is not None
    pending = ch.record.pending
    assert len(pending) == MAX_PENDING and pending[0].tool_name == "run_query"
    assert all(len(c.tool_call_id) == PENDING_TEXT_MAX for c in pending)
    s.observe("a", chat("c1", "requires_action", 120.0), now=120.0, via="listing")
    rec = s.get("a", "c1")
    assert rec is not None and rec.pending == pending
    db = StateFile(tmp_path / "s.sqlite3")
    rows = db.part(ChatRows)
    rows.mark(rec)
    db.flush()
    (loaded,) = rows.load()
    assert loaded.pending == pending
    db.close()
    ch = s.observe("a", chat("c1", "running", 130.0), now=130.0, via="watch", kind="status_change")
    assert ch is not None and ch.record.pending == ()
