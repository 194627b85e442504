"""The fast decoder for watch frames and listing pages: JSON straight into the fields
the store needs (msgspec structs, untracked by the garbage collector), no dict per row.
A listing page is decoded first into the few fields that say whether a row is news
(:class:`ListedRow`); only a page with news is decoded in full, by the tolerant reader.

It only ever *accepts* what the tolerant readers in :mod:`watchd.coder.models` would
read the same way, and it never rejects anything itself: a payload that does not fit
the well-typed shape coderd sends (a number where a string belongs, an era-A envelope,
an empty id, a timestamp ``fromisoformat`` cannot read) answers None here, and the
caller hands the raw bytes to the tolerant reader, which accepts, coerces or rejects
it exactly as before. ``tests/unit/test_wire.py`` pins the two paths together.

On the watch socket (:func:`read_event`) a frame read whole stays a struct, a
:class:`Sighting`, all the way into the store, which builds its record from it; only
a chat that embeds children becomes a :class:`~watchd.coder.models.Chat` here.

One difference is deliberate: fields watchd never reads are skipped without
validating them, so a number out of double range or nesting deeper than orjson's
1 024 levels *inside an ignored field* no longer fails the frame. coderd's encoder
cannot produce either (Go's ``encoding/json`` refuses ±Inf; its structs nest a few
levels). The same holds for a listing page whose rows are all unchanged (the full
decode, which would refuse it, is never asked for).
"""

from __future__ import annotations

from typing import Any, cast

import msgspec
import orjson

from watchd.coder.errors import PayloadError
from watchd.coder.models import (
    _KINDS,
    TITLE_MAX,
    Chat,
    ChatError,
    ChatId,
    ToolCall,
    WatchEvent,
    parse_chat,
    parse_watch_frame,
    timestamp,
)

# Every field optional and nullable: coderd omits false booleans and nil pointers, and
# older eras send minimal payloads. Types are the ones coderd sends; anything else is a
# ValidationError, i.e. "ask the tolerant reader".


class WireError(msgspec.Struct, gc=False):
    message: str | None = None
    detail: str | None = None
    kind: str | None = None
    provider: str | None = None
    retryable: bool | None = None
    status_code: int | None = None


class WireContext(msgspec.Struct, gc=False):
    error: str | None = None


class WireChat(msgspec.Struct, gc=False):
    id: str | None = None
    status: str | None = None
    updated_at: str | None = None
    created_at: str | None = None
    owner_id: str | None = None
    owner_username: str | None = None
    organization_id: str | None = None
    workspace_id: str | None = None
    parent_chat_id: str | None = None
    root_chat_id: str | None = None
    title: str | None = None
    archived: bool | None = None
    labels: dict[str, str] | None = None
    last_error: WireError | str | None = None
    queued_for_capacity: bool | None = None
    children: list[WireChat] | None = None
    mode: str | None = None
    client_type: str | None = None
    context: WireContext | None = None
    warnings: list[str] | None = None


class WireToolCall(msgspec.Struct, gc=False):
    tool_call_id: str | None = None
    tool_name: str | None = None


class WireEvent(msgspec.Struct, gc=False):
    kind: str | None = None
    chat: WireChat | None = None
    tool_calls: list[WireToolCall] | None = None


_event_decoder = msgspec.json.Decoder(WireEvent)
_NO_CALLS: tuple[ToolCall, ...] = ()


def decode_frame(data: str | bytes) -> WatchEvent | None:
    """A watch frame as an event, or None when only the tolerant reader can say what it
    is (a keepalive, an envelope, anything malformed or oddly typed)."""
    try:
        w = _event_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    return _to_event(w)


def _to_event(w: WireEvent) -> WatchEvent | None:
    kind = w.kind
    wchat = w.chat
    if not kind or wchat is None:
        return None
    chat = to_chat(wchat)
    if chat is None:
        return None
    calls = w.tool_calls
    if not calls:
        return WatchEvent(kind, chat)
    return WatchEvent(
        kind,
        chat,
        tuple(ToolCall(c.tool_call_id or "", c.tool_name or "") for c in calls),
    )


def to_chat(w: WireChat) -> Chat | None:
    """The record :func:`watchd.coder.models.parse_chat` would build, or None where it
    would coerce, truncate differently or raise (then it must be asked instead)."""
    chat_id = w.id
    status = w.status
    if not chat_id or not status:
        return None
    updated_raw = w.updated_at
    updated_at: float | None = None
    if updated_raw:
        try:
            updated_at = timestamp(updated_raw)
        except ValueError:
            return None
    children: tuple[Chat, ...] = ()
    if w.children:
        kids = []
        for c in w.children:
            kid = to_chat(c)
            if kid is None:
                return None
            kids.append(kid)
        children = tuple(kids)
    labels = w.labels
    err = w.last_error
    mode = w.mode
    client_type = w.client_type
    context = w.context
    context_error = context.error if context is not None else None
    warnings = w.warnings
    title = w.title
    return Chat(
        ChatId(chat_id),
        status,
        updated_at,
        None,
        w.owner_id or "",
        w.owner_username or "",
        w.organization_id or "",
        w.workspace_id or None,
        w.parent_chat_id or None,
        w.root_chat_id or None,
        title[:TITLE_MAX] if title else "",
        w.archived is True,
        tuple(sorted(labels.items())) if labels else (),
        None if err is None or err == "" else chat_error(err),
        w.queued_for_capacity,
        children,
        _KINDS[mode] if mode else "",
        _KINDS[client_type] if client_type else "",
        context_error[:300] if context_error else "",
        tuple(x[:200] for x in warnings[:5]) if warnings else (),
        w.created_at,
    )


def chat_error(err: WireError | str) -> ChatError:
    """A ``last_error`` that is present (not null, not ""), as parse_chat_error reads it."""
    if type(err) is str:
        return ChatError(message=err[:500])
    assert isinstance(err, WireError)
    return ChatError(
        message=(err.message or "")[:500],
        detail=(err.detail or "")[:500],
        kind=err.kind or "generic",
        provider=err.provider or "",
        retryable=err.retryable is True,
        status_code=err.status_code,
    )


def read_frame(data: str | bytes) -> WatchEvent | None:
    """One watch-socket message → an event, or None for a keepalive: the fast decoder
    when the frame fits it, else the tolerant reader (which raises MalformedFrame or
    ServerFrameError exactly as :func:`watchd.coder.models.parse_watch_frame` does)."""
    event = decode_frame(data)
    return event if event is not None else parse_watch_frame(data)


# -- listing pages: the fields that say whether a row is news --------------------------


class ListedRow(msgspec.Struct, gc=False):
    """What the store compares to decide that a listing row says nothing new about a chat
    it holds (``watchd.store.chats``): the rest of the row is skipped, not built."""

    id: str | None = None
    status: str | None = None
    updated_at: str | None = None
    title: str | None = None
    archived: bool | None = None
    queued_for_capacity: bool | None = None
    # Only whether there are any: a row with children is always read in full.
    children: list[msgspec.Raw] | None = None


_listing_decoder = msgspec.json.Decoder(list[ListedRow])


class ListingPage:
    """One page of a listing: its ``ids`` (checked: non-empty strings), the compared
    fields of each row (``rows``, or None when only the tolerant reader can judge the
    page), and the rows in full, decoded from ``body`` only if someone asks."""

    __slots__ = ("_full", "body", "ids", "rows")

    def __init__(
        self,
        body: bytes,
        *,
        rows: list[ListedRow] | None,
        ids: list[str],
        full: list[Any] | None = None,
    ) -> None:
        self.body = body
        self.rows = rows
        self.ids = ids
        self._full = full

    def __len__(self) -> int:
        return len(self.ids)

    def full(self) -> list[Any]:
        """The rows as the tolerant reader takes them (decoded dicts, for ``parse_chat``)."""
        if self._full is None:
            # As Response.json() has it: no body is None, a body not JSON is its text.
            decoded: Any = None
            if self.body:
                try:
                    decoded = orjson.loads(self.body)
                except ValueError:
                    decoded = self.body.decode("utf-8", "replace")
            if not isinstance(decoded, list):
                raise PayloadError("chats", f"expected a JSON array, got {type(decoded).__name__}")
            self._full = decoded
        return self._full


def decode_listing(body: bytes) -> list[ListedRow] | None:
    """A listing page's compared fields, or None when only the tolerant reader can judge
    the page (not an array of objects, a compared field of another type, malformed)."""
    if not body.isascii():
        # msgspec skips an ignored string without checking its UTF-8; orjson refuses the
        # whole body. Checking here keeps the two paths agreeing on every byte string.
        try:
            body.decode()
        except UnicodeDecodeError:
            return None
    try:
        return _listing_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None


def read_page(body: bytes, *, compared: bool = True) -> ListingPage:
    """A listing response body as a page; raises PayloadError naming a bad row (or the
    listing, when the body is not an array). With ``compared`` the rows are decoded as
    :class:`ListedRow` where msgspec can, else (and without it) in full."""
    rows = decode_listing(body) if compared else None
    if rows is not None:
        ids = [r.id for r in rows]
        if not all(ids):  # an id that is None or ""
            i = next(i for i, cid in enumerate(ids) if not cid)
            raise PayloadError(f"chats[{i}].id", "missing or not a string")
        return ListingPage(body, rows=rows, ids=cast("list[str]", ids))
    page = ListingPage(body, rows=None, ids=[])
    checked: list[str] = []
    for i, row in enumerate(page.full()):
        chat_id = row.get("id") if isinstance(row, dict) else None
        if not isinstance(chat_id, str) or not chat_id:
            parse_chat(row, where=f"chats[{i}]")  # raises, naming what is wrong
            raise PayloadError(f"chats[{i}].id", "missing or not a string")
        checked.append(chat_id)
    page.ids = checked
    return page


class Sighting(msgspec.Struct, gc=False):
    """A watch frame the fast decoder read whole, kept as decoded: the event's kind, its
    chat (one that embeds no children) and that chat's ``updated_at`` already parsed.

    The store builds records straight from it (no :class:`Chat` in between);
    ``to_chat(chat)`` is the Chat the tolerant reader makes of the same frame. Tool calls
    are not carried: nothing past the decoder reads them.
    """

    kind: str
    chat: WireChat
    updated_at: float | None


# What the pump hands on, one per frame that is not a keepalive.
Event = WatchEvent | Sighting


def read_event(data: str | bytes) -> Event | None:
    """One watch-socket message → a :class:`Sighting` when the fast decoder reads it whole
    and its chat embeds no children, else what :func:`read_frame` makes of it (an event,
    None for a keepalive, or MalformedFrame / ServerFrameError raised by the tolerant
    reader). A Sighting is accepted exactly when :func:`decode_frame` would accept it."""
    try:
        w = _event_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return parse_watch_frame(data)
    kind = w.kind
    chat = w.chat
    if kind and chat is not None and chat.id and chat.status and not chat.children:
        raw = chat.updated_at
        if not raw:
            return Sighting(kind, chat, None)
        try:
            return Sighting(kind, chat, timestamp(raw))
        except ValueError:
            pass  # the tolerant reader says what is wrong with it
    event = _to_event(w)
    return event if event is not None else parse_watch_frame(data)


def event_chat_id(event: Event) -> str:
    """The id of the chat an event is about."""
    return event.chat.id or ""
