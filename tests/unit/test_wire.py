"""The fast decoder (msgspec structs) agrees with the tolerant reader on every payload."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
import pytest

from tests.unit.test_detector import Sink
from watchd.coder.errors import PayloadError
from watchd.coder.models import (
    Chat,
    MalformedFrame,
    ServerFrameError,
    WatchEvent,
    parse_chat,
    parse_watch_frame,
    timestamp,
)
from watchd.coder.wire import (
    Sighting,
    WireChat,
    decode_frame,
    decode_listing,
    read_event,
    read_frame,
    read_page,
    to_chat,
)
from watchd.config.watching import Budgets
from watchd.detection.detector import Detector
from watchd.kits.clock import ServerClock
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import Change

CHAT: dict[str, Any] = {
    "id": "0b7c0000-0000-4000-8000-000000000001",
    "status": "running",
    "updated_at": "2026-09-20T08:14:55.123456789Z",
    "created_at": "2026-09-20T08:01:12Z",
    "owner_id": "u1",
    "owner_username": "alice",
    "organization_id": "o1",
    "workspace_id": "w1",
    "title": "Fix it",
    "labels": {"ticket": "OPS-12", "a": "b"},
    "mode": "explore",
    "client_type": "ui",
    "context": {"error": "too long"},
    "warnings": ["w1", "w2"],
    "some_future_field": {"nested": [1, 2.5, None]},
}


def _with(**kw: Any) -> dict[str, Any]:
    chat = dict(CHAT)
    for k, v in kw.items():
        if v is ...:
            chat.pop(k, None)
        else:
            chat[k] = v
    return chat


# Chat payloads the fast decoder must read exactly as parse_chat does, or hand back.
CHATS: list[dict[str, Any]] = [
    CHAT,
    {"id": "c1", "status": "waiting"},  # minimal (older eras)
    _with(updated_at="2026-09-20T08:14:55+02:00"),  # an offset, as coderd may send
    _with(updated_at="2026-09-20T08:14:55"),  # zone-less: UTC
    _with(updated_at=""),
    _with(updated_at=None),
    _with(updated_at="yesterday"),
    _with(updated_at=12),
    _with(id=""),
    _with(id=None),
    _with(id=7),
    _with(status=""),
    _with(status=3),
    _with(title="x" * 250),
    _with(title=None),
    _with(title=5),
    _with(owner_id=None, owner_username=None),
    _with(owner_id=12),
    _with(workspace_id=""),
    _with(workspace_id=None),
    _with(workspace_id=3),
    _with(parent_chat_id="p1", root_chat_id=""),
    _with(archived=True),
    _with(archived=None),
    _with(archived="yes"),
    _with(labels=None),
    _with(labels={}),
    _with(labels={"n": 1}),
    _with(labels=[1]),
    _with(queued_for_capacity=True),
    _with(queued_for_capacity=False),
    _with(queued_for_capacity="yes"),
    _with(status="error", last_error="provider exploded"),
    _with(status="error", last_error=""),
    _with(status="error", last_error={}),
    _with(
        status="error",
        last_error={
            "message": "m" * 600,
            "detail": "d",
            "kind": "rate_limit",
            "provider": "anthropic",
            "retryable": True,
            "status_code": 429,
        },
    ),
    _with(status="error", last_error={"message": "m", "status_code": True}),
    _with(status="error", last_error={"message": "m", "status_code": 429.0}),
    _with(status="error", last_error={"message": 5}),
    _with(status="error", last_error=["x"]),
    _with(mode="hibernating_mode_from_the_future_with_a_long_name_indeed"),
    _with(mode=""),
    _with(mode=3),
    _with(client_type=None),
    _with(context=None),
    _with(context={"error": 4}),
    _with(context=[]),
    _with(context={"error": "e" * 400}),
    _with(warnings=None),
    _with(warnings=[]),
    _with(warnings=["w" * 300] * 7),
    _with(warnings=[1, {"a": 1}]),
    _with(warnings="one"),
    _with(created_at=None),
    _with(created_at=""),
    _with(created_at=5),
    _with(children=[_with(id="k1", parent_chat_id=CHAT["id"])]),
    _with(children=[_with(id="k1", children=[_with(id="k2")])]),
    _with(children=[None]),
    _with(children=[_with(id="k1", updated_at="yesterday")]),
    _with(children={}),
    _with(children=[]),
]

ENVELOPE = {"type": "data", "data": {"kind": "status_change", "chat": CHAT}}


def _frames() -> list[str | bytes]:
    out: list[str | bytes] = [json.dumps({"kind": "status_change", "chat": c}) for c in CHATS]
    out += [
        json.dumps({"kind": "created", "chat": CHAT, "tool_calls": [{"tool_call_id": "t1"}]}),
        json.dumps(
            {
                "kind": "action_required",
                "chat": CHAT,
                "tool_calls": [{"tool_call_id": "t1", "tool_name": "ask"}, {}],
            }
        ),
        json.dumps({"kind": "x", "chat": CHAT, "tool_calls": [5, {"tool_call_id": "t"}]}),
        json.dumps({"kind": "x", "chat": CHAT, "tool_calls": {"tool_call_id": "t"}}),
        json.dumps({"kind": "x", "chat": CHAT, "tool_calls": [{"tool_call_id": 5}]}),
        json.dumps({"kind": "x", "chat": CHAT, "tool_calls": None}),
        json.dumps({"kind": "hibernated", "chat": CHAT}) + "\n",
        json.dumps(ENVELOPE),
        json.dumps({"kind": "status_change", "type": "data", "chat": CHAT}),
        json.dumps({"kind": None, "type": "data", "data": {"kind": "x", "chat": CHAT}}),
        '{"type":"ping"}',
        '{"type":"error","data":{"message":"subscribe failed"}}',
        '{"type":"weird"}',
        '{"type":"data","data":[1]}',
        '{"kind": "status_change", "chat": {"id": 42',
        "[1,2]",
        '"hello"',
        "null",
        "",
        '{"kind": 3}',
        '{"kind": ""}',
        '{"kind": "x"}',
        '{"kind": "x", "chat": null}',
        '{"kind": "x", "chat": []}',
        '{"kind":"status_change","chat":{"status":"running"}}',
        '{"kind":"x","chat":{"id":"c1","status":"running","title":"\\ud800"}}',
        '{"kind":"x","chat":{"id":"c1","status":"running"}} trailing',
        '{"kind":"x","chat":{"id":"c1","status":"running","n":NaN}}',
        b"\xff\xfe",
        b'{"kind":"x","chat":{"id":"c1","status":"\xff"}}',
    ]
    return out


FRAMES = _frames()


def _outcome(fn: Any, frame: str | bytes) -> tuple[str, Any]:
    try:
        return ("ok", fn(frame))
    except (MalformedFrame, ServerFrameError) as exc:
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("frame", FRAMES, ids=[str(i) for i in range(len(FRAMES))])
def test_fast_frame_decoding_agrees_with_the_tolerant_reader(frame: str | bytes) -> None:
    """Every frame yields the same event, keepalive or error by either path; the fast
    decoder only ever accepts what the tolerant reader reads the same way."""
    slow = _outcome(parse_watch_frame, frame)
    assert _outcome(read_frame, frame) == slow
    fast = decode_frame(frame)
    if fast is not None:
        assert slow == ("ok", fast)
    if isinstance(frame, str):
        assert _outcome(read_frame, frame.encode()) == slow


# Rows as full structs (the watch frame's chat): to_chat's input, decoded as a frame would be.
_ROWS = msgspec.json.Decoder(list[WireChat])


@pytest.mark.parametrize("chat", CHATS, ids=[str(i) for i in range(len(CHATS))])
def test_fast_rows_agree_with_parse_chat(chat: dict[str, Any]) -> None:
    """A listing row decoded by the fast path is the record parse_chat builds, or is
    handed back (None) for parse_chat to accept, coerce or reject."""
    try:
        slow: Any = parse_chat(chat)
    except PayloadError:
        slow = PayloadError
    try:
        rows = _ROWS.decode(orjson.dumps([chat]))
    except (msgspec.DecodeError, RecursionError):
        return
    fast = to_chat(rows[0])
    if fast is not None:
        assert fast == slow


def test_the_well_typed_payloads_take_the_fast_path() -> None:
    """What coderd sends (full, minimal, offsets, errors, children) is read without the
    tolerant reader, so the fast path is the one that runs."""
    for chat in (CHATS[0], CHATS[1], CHATS[2], CHATS[-6], CHATS[-5]):
        assert decode_frame(json.dumps({"kind": "status_change", "chat": chat})) is not None
    event = decode_frame(FRAMES[len(CHATS) + 1])
    assert isinstance(event, WatchEvent)
    assert [(c.tool_call_id, c.tool_name) for c in event.tool_calls] == [("t1", "ask"), ("", "")]


def test_ignored_fields_are_not_validated_by_the_fast_path() -> None:
    """The one documented difference: an out-of-range number inside a field watchd never
    reads no longer fails the frame (coderd's encoder cannot write one)."""
    frame = '{"kind":"x","chat":{"id":"c1","status":"running","n":1e400}}'
    with pytest.raises(MalformedFrame):
        parse_watch_frame(frame)
    event = read_frame(frame)
    assert event is not None and event.chat.id == "c1"


@pytest.mark.parametrize("chat", CHATS, ids=[str(i) for i in range(len(CHATS))])
def test_listed_rows_compare_what_parse_chat_reads(chat: dict[str, Any]) -> None:
    """A listing row decoded as ListedRow holds the values parse_chat reads for the
    compared fields, or the page is handed to the tolerant path (rows None)."""
    rows = decode_listing(orjson.dumps([chat]))
    try:
        slow = parse_chat(chat)
    except PayloadError:
        return  # the store parses any row that does not match its record: this raises
    if rows is None:
        return
    row = rows[0]
    assert (row.id, row.status, row.archived is True) == (slow.id, slow.status, slow.archived)
    assert (row.title or "")[:200] == slow.title
    assert row.queued_for_capacity == slow.queued_for_capacity
    assert bool(row.children) == bool(slow.children)


def test_an_ignored_field_does_not_fail_a_listing_page_of_unchanged_rows() -> None:
    """The documented difference, on listing pages: a number out of range inside a field
    watchd never reads leaves the compared fields readable; the full decode (asked for
    only when a row is news) still refuses the page, as before."""
    page = read_page(b'[{"id":"c1","status":"running","n":1e400}]')
    assert page.rows is not None and page.ids == ["c1"]
    with pytest.raises(PayloadError, match="expected a JSON array"):
        page.full()
    with pytest.raises(PayloadError, match="expected a JSON array"):
        read_page(b'[{"id":"c1","status":"running","n":1e400}]', compared=False)


def test_a_listing_page_with_invalid_utf8_is_read_by_the_tolerant_path() -> None:
    """Bytes that are not UTF-8, even in a skipped field, hand the page to the tolerant
    path (which refuses it) rather than pass unnoticed."""
    body = b'[{"id":"c1","status":"running","n":"\xff"}]'
    assert decode_listing(body) is None
    assert decode_listing('[{"id":"c1","title":"caf\u00e9"}]'.encode()) is not None
    with pytest.raises(PayloadError, match="expected a JSON array"):
        read_page(body)


# -- the watch path past the decoder: a Sighting into the store and the detector --------

BASE = timestamp("2026-09-20T08:14:55Z")  # about CHAT's updated_at
# Server "now" for each run: just after the stamps; three days on (stamps a day old are
# checked against created_at); an hour before them (stamps from the future are clamped).
NOWS = (BASE + 5.0, BASE + 3 * 86_400.0, BASE - 3_600.0)


def _frame(chat: Any, kind: str = "status_change") -> str:
    return json.dumps({"kind": kind, "chat": chat})


# Frames whose store outcome differs by kind, status or clock, beside FRAMES.
STORE_FRAMES: list[str | bytes] = [
    *FRAMES,
    *(_frame(CHAT, kind) for kind in ("created", "action_required", "deleted", "renamed")),
    *(_frame(_with(archived=True), kind) for kind in ("created", "deleted")),
    *(_frame(_with(status=s)) for s in ("pending", "requires_action", "interrupting")),
    _frame(_with(status="hibernating")),  # a status this build does not know
    _frame(_with(status="error", last_error={"message": "m", "kind": "overloaded"})),
    _frame(_with(status="waiting", client_type=..., mode=..., warnings=..., context=...)),
    _frame(_with(updated_at="2026-09-19T08:00:00Z")),  # before created_at
    _frame(_with(updated_at="2026-09-19T08:00:00Z", created_at="yesterday")),
    _frame(_with(updated_at="2026-09-20T08:14:55.000000001Z")),  # nanoseconds
    _frame(_with(updated_at="2026-09-20T10:14:55.5+02:00")),  # an offset: the same instant
    _frame(_with(updated_at="2026-09-20T08:14:55.123Z", title="")),
    _frame(_with(queued_for_capacity=None, title="Fix it")),
    _frame({"id": CHAT["id"], "status": "running", "updated_at": CHAT["updated_at"]}),
]

# What the store may hold before the frame arrives, as overrides of CHAT for the frame's
# chat (observed as a listing row): the frame then transitions, refreshes, is seen,
# is stale, or fills in what a minimal payload leaves out.
PRIORS: list[dict[str, Any] | None] = [
    None,
    {"status": "waiting", "updated_at": "2026-09-20T08:10:00Z"},
    {"status": "running", "updated_at": "2026-09-20T08:10:00Z", "title": "old"},
    {"status": "running", "updated_at": "2026-09-20T09:00:00Z"},
    {"status": "waiting", "updated_at": "2026-09-20T09:00:00Z"},
    {"status": "error", "updated_at": None, "queued_for_capacity": True, "labels": {"x": "y"}},
    {"status": "hibernating", "updated_at": "2026-09-20T08:14:55.123456Z", "title": "Fix it"},
]


def _store_state(store: ChatStore) -> tuple[Any, ...]:
    return (
        sorted(store.records(), key=lambda r: r.chat_id),
        len(store),
        dict(store._seen),
        {i: store.absent(i) for i in store.identities()},
        store.stale_ignored,
        store.synthesized,
        dict(store.future_clamped),
        dict(store.before_created),
    )


async def _run(
    prior: Chat | None, burst: list[Any], *, now: float
) -> tuple[list[Change], tuple[Any, ...], dict[Any, Any]]:
    """Prior state, then one burst through the store and the detector: the Changes, the
    store's state and the armed timers."""
    store = ChatStore()
    if prior is not None:
        store.observe("a", prior, now=now - 1.0, via="listing")
        store.finish_listing("a", set(), started=now)  # and absent since
    det = Detector(store=store, sink=Sink(), chat_failed=True)
    health = IdentityHealth(
        name="a", deployment="https://coder.test", server_clock=ServerClock(), unhealthy_after=60
    )
    det.register(health, confirmer=_NoReads(), budgets=Budgets(stalled=300.0), labels={"team": "x"})
    try:
        changes = store.observe_events("a", burst, now=now)
        det.apply("a", changes)
        return changes, _store_state(store), dict(det.timers._live)
    finally:
        await det.unregister("a", reason="test over", resolve=False)


class _NoReads:
    """A confirmer never asked: nothing comes due while a test runs."""

    async def get_chat(self, chat_id: str) -> Chat:
        raise AssertionError("not read")

    async def relist(self, *, on_page: Any = None) -> None:
        raise AssertionError("not listed")

    async def facts(self, record: Any, *, lookup: bool = True) -> Any:
        raise AssertionError("no facts")


def _prior(frame: str | bytes, overrides: dict[str, Any] | None) -> Chat | None:
    if overrides is None:
        return None
    try:
        obj = orjson.loads(frame)
        cid = obj["chat"]["id"]
    except (ValueError, KeyError, TypeError):
        return None
    if type(cid) is not str or not cid:
        return None
    return parse_chat({**CHAT, "id": cid, **overrides})


@pytest.mark.parametrize("frame", STORE_FRAMES, ids=[str(i) for i in range(len(STORE_FRAMES))])
async def test_a_sighting_moves_the_store_and_timers_as_the_tolerant_reader_does(
    frame: str | bytes,
) -> None:
    """From any prior state and clock, a frame moves store and timers as the slow event does."""
    slow = _outcome(parse_watch_frame, frame)
    fast = _outcome(read_event, frame)
    if slow[0] != "ok" or slow[1] is None:
        assert fast == slow
        return
    event = fast[1]
    assert fast[0] == "ok" and event is not None
    if isinstance(event, Sighting):
        assert (event.kind, to_chat(event.chat)) == (slow[1].kind, slow[1].chat)
        assert event.updated_at == slow[1].chat.updated_at
    for overrides in PRIORS:
        prior = _prior(frame, overrides)
        for now in NOWS:
            assert await _run(prior, [event], now=now) == await _run(prior, [slow[1]], now=now)


def test_what_coderd_sends_is_a_sighting() -> None:
    """Full and minimal payloads become Sightings; children, envelopes and pings do not."""
    for chat in (CHATS[0], CHATS[1], CHATS[2]):
        assert isinstance(read_event(_frame(chat)), Sighting)
    assert isinstance(read_event(_frame(_with(children=[_with(id="k1")]))), WatchEvent)
    assert read_event('{"type":"ping"}') is None
    assert isinstance(read_event(json.dumps(ENVELOPE)), WatchEvent)


def _firehose(n: int, chats: int = 7) -> list[str]:
    stamps = [f"2026-09-20T08:14:{s:02d}.{f}Z" for s in range(40, 60) for f in (1, 5, 25)]
    out = []
    for i in range(n):
        status = ("running", "waiting", "requires_action", "error")[(i // chats) % 4]
        # out of order now and then: a stale stamp must be ignored the same way
        stamp = stamps[(i * 7) % len(stamps)]
        out.append(_frame({**CHAT, "id": f"c{i % chats}", "status": status, "updated_at": stamp}))
    return out


BURSTS: list[list[str]] = [
    _firehose(60),
    [
        _frame(CHAT, "created"),
        _frame(_with(children=[_with(id="k1", status="pending")])),
        _frame(_with(status="waiting", updated_at="2026-09-20T08:15:00Z")),
        _frame(_with(title="renamed", updated_at="2026-09-20T08:15:00Z")),
        _frame(_with(archived=True)),
        _frame(_with(status="pending")),
        _frame({"id": "k1", "status": "running"}, "deleted"),
        _frame({"id": "k1", "status": "running"}),
    ],
]


@pytest.mark.parametrize("burst", BURSTS, ids=["firehose", "mixed"])
async def test_a_burst_of_sightings_matches_the_tolerant_reader_event_by_event(
    burst: list[str],
) -> None:
    """A burst of Sightings and events leaves what the tolerant reader's events leave."""
    fast = [read_event(f) for f in burst]
    slow = [parse_watch_frame(f) for f in burst]
    assert any(isinstance(e, Sighting) for e in fast)
    for overrides in PRIORS:
        prior = _prior(burst[0], overrides)
        for now in NOWS:
            assert await _run(prior, fast, now=now) == await _run(prior, slow, now=now)
