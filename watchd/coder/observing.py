"""What the chat store accepts from the Coder edge: one :class:`Observation` per chat seen.

An observation is a chat as one payload stated it, in the wire's own types (every field
optional and nullable, as coderd omits false booleans and nil pointers and older eras
send minimal payloads). It has exactly two constructors, and they agree on every payload
(``tests/unit/test_wire.py``):

- the fast one: msgspec decodes a watch frame's chat straight into an observation
  (:mod:`watchd.coder.wire`), and :func:`from_wire` reads its stamp; it answers False
  where only the tolerant reader can say what a payload means;
- :func:`from_json`, the tolerant reader, from decoded JSON of any era: unknown fields
  ignored, unknown statuses kept as strings, ``last_error`` an object or a plain
  string, a value of another type coerced to the wire's (or dropped), a missing id or
  status or an unreadable stamp a :class:`PayloadError` naming the field.

Neither normalises: titles are cut, labels sorted, enumerations interned and errors
classified once, where a record is built (:func:`watchd.store.records.build`), so a
chat field is declared here and read there. This module knows nothing of the store, of
frames or of listings.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NewType

import msgspec

from watchd.coder.errors import PayloadError

ChatId = NewType("ChatId", str)

_fromiso = datetime.fromisoformat


def timestamp(text: str) -> float:
    """An RFC 3339 timestamp as epoch seconds (zone-less read as UTC); ValueError if not."""
    parsed = _fromiso(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


@dataclass(frozen=True, slots=True)
class ChatError:
    """A chat's ``last_error``, classified (``chaterror`` kinds; unknown kinds read as generic)."""

    message: str
    detail: str = ""
    kind: str = "generic"
    provider: str = ""
    retryable: bool = False
    status_code: int | None = None


@dataclass(frozen=True, slots=True)
class Quota:
    """An identity's workspace-quota reading (the other thing the store keeps from the
    edge, in the identity's health)."""

    credits_consumed: int
    budget: int  # -1: no quota configured/licensed, not "exhausted"

    @property
    def unlimited(self) -> bool:
        return self.budget < 0

    @property
    def headroom(self) -> int | None:
        return None if self.unlimited else self.budget - self.credits_consumed


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool_call_id: str
    tool_name: str


class WireError(msgspec.Struct, gc=False):
    """A ``last_error`` object as coderd sends it (classified into a :class:`ChatError`
    where the record is built)."""

    message: str | None = None
    detail: str | None = None
    kind: str | None = None
    provider: str | None = None
    retryable: bool | None = None
    status_code: int | None = None


class WireContext(msgspec.Struct, gc=False):
    error: str | None = None


class Observation(msgspec.Struct, gc=False):
    """One chat as one payload stated it (treated as immutable once its constructor
    returns). A struct, untracked by the garbage collector: one is decoded per watch
    frame and built per listing row that is news.

    Two fields are never JSON keys (their wire names, ``watchd:…``, are not the
    snake_case keys coderd's structs have): the stamp as epoch seconds, which the
    constructors read from ``updated_raw``, and the tool calls an ``action_required``
    event left pending (the event's own ``tool_calls``, put here by the event readers).
    """

    id: ChatId = ChatId("")
    status: str = ""
    updated_at: float | None = msgspec.field(default=None, name="watchd:updated_at")
    updated_raw: str | None = msgspec.field(default=None, name="updated_at")
    # Unparsed: read only when updated_at needs checking against it (created()).
    created_raw: str | None = msgspec.field(default=None, name="created_at")
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
    children: tuple[Observation, ...] | None = None
    # Carried into alerts when present: computer_use | explore | orchestrator (an
    # orchestrator is one long-lived chat per user), ui | api, context.error, warnings.
    mode: str | None = None
    client_type: str | None = None
    context: WireContext | None = None
    warnings: list[str] | None = None
    # root | chat | subagent (chat-tree experiment); None: not said (a child is a subagent).
    kind: str | None = None
    tool_calls: tuple[ToolCall, ...] = msgspec.field(default=(), name="watchd:tool_calls")

    def created(self) -> float | None:
        """created_at as epoch seconds, or None when absent or unreadable."""
        if not self.created_raw:
            return None
        try:
            return timestamp(self.created_raw)
        except ValueError:
            return None


class WatchEvent(msgspec.Struct, gc=False):
    """One watch frame: its kind and the chat it observed (one is built per frame)."""

    kind: str
    chat: Observation

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The event's ``tool_calls`` (carried on its chat)."""
        return self.chat.tool_calls


def flatten(chats: list[Observation]) -> list[Observation]:
    """Roots followed by their embedded ``children``, each once (first occurrence wins)."""
    seen: set[str] = set()
    out: list[Observation] = []
    stack = list(reversed(chats))
    while stack:
        chat = stack.pop()
        if chat.id in seen:
            continue
        seen.add(chat.id)
        out.append(chat)
        if chat.children:
            stack.extend(reversed(chat.children))
    return out


# -- the fast constructor ------------------------------------------------------------


def from_wire(chat: Observation) -> bool:
    """Finish an observation msgspec decoded: its stamp (and its children's) read, in
    place. False where :func:`from_json` would coerce or raise (an empty id or status,
    an unreadable stamp): then it must be asked instead."""
    if not chat.id or not chat.status:
        return False
    raw = chat.updated_raw
    if raw:
        try:
            chat.updated_at = timestamp(raw)
        except ValueError:
            return False
    kids = chat.children
    if kids:
        for kid in kids:
            if not from_wire(kid):
                return False
    return True


# -- the tolerant constructor --------------------------------------------------------


def as_text(obj: dict[str, Any], key: str) -> str:
    """A field as text: absent and null are "", anything else its ``str``."""
    v = obj.get(key)
    if v is None:
        return ""
    return v if isinstance(v, str) else str(v)


def _text(v: Any) -> str | None:
    """A value where the wire has a string: null stays null, anything else its ``str``."""
    return v if v is None or type(v) is str else str(v)


def _word(v: Any) -> str | None:
    """An enumeration's value: a string, or nothing (another type says nothing)."""
    return v if type(v) is str else None


def parse_time(value: Any, *, field_name: str) -> float | None:
    if value is None or value == "":
        return None
    if type(value) is not str:
        raise PayloadError(
            field_name, f"expected an RFC 3339 timestamp, got {type(value).__name__}"
        )
    try:
        return timestamp(value)
    except ValueError:
        raise PayloadError(field_name, f"not an RFC 3339 timestamp: {value[:40]!r}") from None


def _wire_error(value: Any) -> WireError | str | None:
    """``last_error`` as an object (newest), a plain string (early text column), or null;
    anything else reads as its text."""
    if value is None or type(value) is str:
        return value
    if type(value) is not dict:
        return str(value)
    get = value.get
    retryable = get("retryable")
    status_code = get("status_code")
    return WireError(
        _text(get("message")),
        _text(get("detail")),
        _text(get("kind")),
        _text(get("provider")),
        retryable if type(retryable) is bool else None,
        status_code if isinstance(status_code, int) else None,
    )


def from_json(obj: Any, *, where: str = "chat") -> Observation:
    """A decoded chat payload of any era as an observation; PayloadError names what is
    missing or unreadable (``where`` prefixes the field: ``chats[3].updated_at``)."""
    # The path of every listing row that is news and every GET: one lookup per field,
    # type checks inline.
    if type(obj) is not dict:
        raise PayloadError(where, f"expected an object, got {type(obj).__name__}")
    get = obj.get
    chat_id = get("id")
    if type(chat_id) is not str or not chat_id:
        raise PayloadError(f"{where}.id", "missing or not a string")
    status = get("status")
    if type(status) is not str or not status:
        raise PayloadError(f"{where}.status", "missing or not a string")
    updated_raw = get("updated_at")
    updated_at: float | None
    if type(updated_raw) is str and updated_raw:
        try:
            updated_at = timestamp(updated_raw)  # the common case: no field name built
        except ValueError:
            updated_at = parse_time(updated_raw, field_name=f"{where}.updated_at")  # raises
    else:
        updated_at = parse_time(updated_raw, field_name=f"{where}.updated_at")
    labels = get("labels")
    children = get("children")
    context = get("context")
    warnings = get("warnings")
    archived = get("archived")
    queued = get("queued_for_capacity")
    return Observation(
        chat_id,  # type: ignore[arg-type]  # a ChatId: NewType's call costs a call per row
        status,
        updated_at,
        updated_raw,
        _word(get("created_at")),
        _text(get("owner_id")),
        _text(get("owner_username")),
        _text(get("organization_id")),
        _text(get("workspace_id")),
        _text(get("parent_chat_id")),
        _text(get("root_chat_id")),
        _text(get("title")),
        archived if type(archived) is bool else None,
        {str(k): str(v) for k, v in labels.items()} if type(labels) is dict else None,
        _wire_error(get("last_error")),
        queued if type(queued) is bool else None,
        tuple(from_json(c, where=f"{where}.children[{i}]") for i, c in enumerate(children))
        if type(children) is list
        else None,
        _word(get("mode")),
        _word(get("client_type")),
        WireContext(_word(context.get("error"))) if type(context) is dict else None,
        [str(w) for w in warnings] if type(warnings) is list else None,
        _word(get("kind")),
    )
