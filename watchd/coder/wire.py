"""The fast decoder for watch frames: JSON straight into msgspec structs (untracked by
the garbage collector), no dict per frame.

A watch frame becomes a :class:`~watchd.coder.observing.WatchEvent` whose chat msgspec
decodes straight into an :class:`~watchd.coder.observing.Observation`, finished by
:func:`~watchd.coder.observing.from_wire` (listing pages are read by
:mod:`watchd.coder.pages`).

It never rejects anything itself: a payload that does not fit the well-typed shape
coderd sends (a number where a string belongs, an era-A envelope, an empty id, a
timestamp ``fromisoformat`` cannot read) is handed to the tolerant reader
(:func:`watchd.coder.models.parse_watch_frame`), which accepts, coerces or rejects it.
``tests/unit/test_wire.py`` pins the two constructors together.

One difference is deliberate: fields watchd never reads are skipped without
validating them, so a number out of double range or nesting deeper than orjson's
1 024 levels *inside an ignored field* does not fail the frame. coderd's encoder
cannot produce either (Go's ``encoding/json`` refuses ±Inf; its structs nest a few
levels).
"""

from __future__ import annotations

import msgspec

from watchd.coder.models import parse_watch_frame
from watchd.coder.observing import Observation, ToolCall, WatchEvent, from_wire


class WireToolCall(msgspec.Struct, gc=False):
    tool_call_id: str | None = None
    tool_name: str | None = None


class WireEvent(msgspec.Struct, gc=False):
    kind: str | None = None
    chat: Observation | None = None
    tool_calls: list[WireToolCall] | None = None


_event_decoder = msgspec.json.Decoder(WireEvent)


def read_event(data: str | bytes) -> WatchEvent | None:
    """One watch-socket message → an event, or None for a keepalive: the fast decoder
    when the frame fits it, else the tolerant reader (which raises MalformedFrame or
    ServerFrameError for what cannot be read)."""
    try:
        w = _event_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return parse_watch_frame(data)
    kind = w.kind
    chat = w.chat
    if not kind or chat is None or not from_wire(chat):
        return parse_watch_frame(data)
    calls = w.tool_calls
    if calls:
        # The chat was decoded for this event alone: nothing else holds it yet.
        chat.tool_calls = tuple(ToolCall(c.tool_call_id or "", c.tool_name or "") for c in calls)
    return WatchEvent(kind, chat)
