"""Tolerant parsing of Coder payloads across eras."""

from __future__ import annotations

import json

import pytest

from watchd.coder.errors import PayloadError
from watchd.coder.models import (
    MalformedFrame,
    ServerFrameError,
    parse_quota,
    parse_watch_frame,
)
from watchd.coder.observing import Observation, flatten, from_json
from watchd.store.records import ChatRecord, build

CHAT = {
    "id": "0b7c0000-0000-4000-8000-000000000001",
    "status": "running",
    "updated_at": "2026-09-20T08:14:55.123456789Z",
    "created_at": "2026-09-20T08:01:12Z",
    "owner_username": "alice",
    "labels": {"ticket": "OPS-12"},
    "some_future_field": {"nested": [1, 2]},
}


def _record(chat: Observation) -> ChatRecord:
    return build("a", chat, since=0.0, clock="transition", now=0.0, version=1)


def test_unknown_fields_are_ignored_and_nanoseconds_parse() -> None:
    """Go's nanosecond timestamps and unknown fields parse without error."""
    chat = from_json(CHAT)
    assert chat.status == "running"
    assert _record(chat).labels == (("ticket", "OPS-12"),)
    assert chat.updated_at == pytest.approx(1789892095.123456)


def test_unknown_status_is_kept_as_a_string() -> None:
    """A status this build does not know survives parsing unchanged."""
    assert from_json({**CHAT, "status": "hibernating"}).status == "hibernating"


def test_last_error_as_object_or_string() -> None:
    """last_error is accepted as the newest object and as the early text column."""
    obj = _record(
        from_json(
            {
                **CHAT,
                "status": "error",
                "last_error": {
                    "message": "rate limited",
                    "kind": "rate_limit",
                    "provider": "anthropic",
                    "retryable": True,
                    "status_code": 429,
                },
            }
        )
    )
    assert obj.last_error is not None
    assert (obj.last_error.kind, obj.last_error.status_code, obj.last_error.retryable) == (
        "rate_limit",
        429,
        True,
    )
    text = _record(from_json({**CHAT, "status": "error", "last_error": "provider exploded"}))
    assert text.last_error is not None and text.last_error.message == "provider exploded"
    assert text.last_error.kind == "generic"
    assert _record(from_json({**CHAT, "last_error": None})).last_error is None


def test_zone_less_timestamp_reads_as_utc() -> None:
    """A timestamp without a zone is read as UTC, never as local time."""
    a = from_json({**CHAT, "updated_at": "2026-09-20T08:14:55"}).updated_at
    b = from_json({**CHAT, "updated_at": "2026-09-20T08:14:55Z"}).updated_at
    assert a == b


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({**CHAT, "id": None}, "chat.id"),
        ({**CHAT, "status": 3}, "chat.status"),
        ({**CHAT, "updated_at": "yesterday"}, "chat.updated_at"),
        ({**CHAT, "updated_at": 12}, "chat.updated_at"),
    ],
)
def test_bad_payload_names_the_field(payload: dict[str, object], field: str) -> None:
    """What we cannot do without raises an error naming the field."""
    with pytest.raises(PayloadError) as err:
        from_json(payload)
    assert err.value.field == field


def test_children_flatten_once_each() -> None:
    """Embedded subagent children are flattened after their root, duplicates dropped."""
    child = {**CHAT, "id": "c1", "parent_chat_id": CHAT["id"]}
    root = from_json({**CHAT, "children": [child]})
    again = from_json(child)
    ids = [c.id for c in flatten([root, again])]
    assert ids == [CHAT["id"], "c1"]


def test_bare_event_and_envelope_frames() -> None:
    """Era B–E bare events and era A envelopes decode to the same event."""
    bare = json.dumps({"kind": "status_change", "chat": CHAT}) + "\n"
    env = json.dumps({"type": "data", "data": {"kind": "status_change", "chat": CHAT}})
    a, b = parse_watch_frame(bare), parse_watch_frame(env)
    assert a is not None and b is not None
    assert a.chat.id == b.chat.id and a.kind == b.kind == "status_change"


def test_ping_envelope_is_a_keepalive() -> None:
    """Era A JSON pings decode to None (no event)."""
    assert parse_watch_frame('{"type":"ping"}') is None


def test_error_envelope_raises_server_error() -> None:
    """An era A error envelope surfaces the server's message."""
    with pytest.raises(ServerFrameError, match="subscribe failed"):
        parse_watch_frame('{"type":"error","data":{"message":"subscribe failed"}}')


@pytest.mark.parametrize(
    "frame",
    [
        '{"kind": "status_change", "chat": {"id": 42',
        "[1,2]",
        '"hello"',
        '{"kind": 3}',
        '{"kind":"status_change","chat":{"status":"running"}}',
        '{"type":"weird"}',
        b"\xff\xfe",
    ],
)
def test_malformed_frames_raise(frame: str | bytes) -> None:
    """Garbage, non-objects, and events without a usable chat are malformed, not crashes."""
    with pytest.raises(MalformedFrame):
        parse_watch_frame(frame)


def test_unknown_event_kind_is_kept() -> None:
    """An event kind this build does not know is passed through as a string."""
    ev = parse_watch_frame(json.dumps({"kind": "capacity_change", "chat": CHAT}))
    assert ev is not None and ev.kind == "capacity_change"


def test_quota_budget_minus_one_is_unlimited() -> None:
    """budget -1 means no quota configured, not exhausted."""
    q = parse_quota({"credits_consumed": 40, "budget": -1})
    assert q.unlimited and q.headroom is None
    assert parse_quota({"credits_consumed": 40, "budget": 100}).headroom == 60
    with pytest.raises(PayloadError):
        parse_quota({"credits_consumed": "40", "budget": 100})
