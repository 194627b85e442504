"""The Observation's two constructors (msgspec's decode finished by from_wire, tolerant
JSON) agree on every payload, so do the records built from them, and the frame and
listing decoders built on them agree with the tolerant reader."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
import pytest

from watchd.coder.errors import PayloadError
from watchd.coder.models import MalformedFrame, ServerFrameError, parse_watch_frame
from watchd.coder.observing import Observation, WatchEvent, from_json, from_wire
from watchd.coder.pages import decode_listing, read_page
from watchd.coder.wire import WireEvent, read_event
from watchd.store.records import ChatRecord, build, title_of

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


# Chat payloads the fast constructor must read exactly as from_json does, or hand back.
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
    """Every frame yields the same event, keepalive or error by the fast decoder (with its
    fallback) as by the tolerant reader alone, as text and as bytes."""
    slow = _outcome(parse_watch_frame, frame)
    assert _outcome(read_event, frame) == slow
    if isinstance(frame, str):
        assert _outcome(read_event, frame.encode()) == slow


# Chats as a watch frame's chat is decoded: from_wire's input.
_ROWS = msgspec.json.Decoder(list[Observation])
_EVENT = msgspec.json.Decoder(WireEvent)


def _record(chat: Observation) -> ChatRecord:
    return build("a", chat, since=0.0, clock="transition", now=0.0, version=1)


@pytest.mark.parametrize("chat", CHATS, ids=[str(i) for i in range(len(CHATS))])
def test_both_constructors_give_the_same_observation(chat: dict[str, Any]) -> None:
    """msgspec's decode finished by from_wire is the Observation from_json builds from the
    same payload (and so is the record built from it), or is handed back (False) for
    from_json to accept, coerce or reject."""
    try:
        slow: Any = from_json(chat)
    except PayloadError:
        slow = PayloadError
    try:
        rows = _ROWS.decode(orjson.dumps([chat]))
    except (msgspec.DecodeError, RecursionError):
        return
    fast = rows[0]
    if from_wire(fast):
        assert fast == slow
        assert _record(fast) == _record(slow)


def test_the_well_typed_payloads_take_the_fast_path() -> None:
    """What coderd sends (full, minimal, offsets, errors, children) is built by from_wire,
    so the fast path is the one that runs; tool calls come through it too."""
    for chat in (CHATS[0], CHATS[1], CHATS[2], CHATS[-6], CHATS[-5]):
        wire = _EVENT.decode(json.dumps({"kind": "status_change", "chat": chat})).chat
        assert wire is not None and from_wire(wire)
    event = read_event(FRAMES[len(CHATS) + 1])
    assert isinstance(event, WatchEvent)
    assert [(c.tool_call_id, c.tool_name) for c in event.tool_calls] == [("t1", "ask"), ("", "")]


def test_ignored_fields_are_not_validated_by_the_fast_path() -> None:
    """The one documented difference: an out-of-range number inside a field watchd never
    reads does not fail the frame (coderd's encoder cannot write one)."""
    frame = '{"kind":"x","chat":{"id":"c1","status":"running","n":1e400}}'
    with pytest.raises(MalformedFrame):
        parse_watch_frame(frame)
    event = read_event(frame)
    assert event is not None and event.chat.id == "c1"


@pytest.mark.parametrize("chat", CHATS, ids=[str(i) for i in range(len(CHATS))])
def test_listed_rows_compare_what_from_json_reads(chat: dict[str, Any]) -> None:
    """A listing row decoded as ListedRow holds the values from_json reads for the
    compared fields, or the page is handed to the tolerant path (rows None)."""
    rows = decode_listing(orjson.dumps([chat]))
    try:
        slow = from_json(chat)
    except PayloadError:
        return  # the store parses any row that does not match its record: this raises
    if rows is None:
        return
    row = rows[0]
    assert (row.id, row.status, row.archived) == (slow.id, slow.status, slow.archived)
    assert title_of(row.title) == title_of(slow.title)
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
