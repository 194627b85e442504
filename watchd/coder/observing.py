"""What the chat store accepts from the Coder edge: one :class:`Observation` per chat seen.

An observation is a chat as one payload stated it (a watch frame, a listing row, a
single GET), read into the fields watchd uses and nothing else. It has exactly two
constructors, and they agree on every payload (``tests/unit/test_wire.py``):

- :func:`from_wire`, from the fast decoder's msgspec struct (:class:`WireChat`), for
  payloads of the well-typed shape coderd sends; it answers None where only the
  tolerant reader can say what a payload means;
- :func:`from_json`, the tolerant reader, from decoded JSON of any era: unknown fields
  ignored, unknown statuses kept as strings, ``last_error`` an object or a plain
  string, ``null`` and absent the same, a missing id or status a
  :class:`PayloadError` naming the field.

Both normalise the same way (titles cut to ``TITLE_MAX``, labels sorted, enumerations
interned, timestamps as epoch seconds), so what the store builds from an observation
never depends on which decoder read it. This module knows nothing of the store, of
frames or of listings.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NewType

import msgspec

from watchd.coder.errors import PayloadError

ChatId = NewType("ChatId", str)

TITLE_MAX = 200
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


class Observation(msgspec.Struct, gc=False):
    """One chat as one payload stated it (treated as immutable: nothing assigns to one).

    A struct, untracked by the garbage collector: one is built per watch frame and per
    listing row that is news.
    """

    id: ChatId
    status: str
    updated_at: float | None = None
    created_at: float | None = None
    owner_id: str = ""
    owner_username: str = ""
    organization_id: str = ""
    workspace_id: str | None = None
    parent_chat_id: str | None = None
    root_chat_id: str | None = None
    title: str = ""
    archived: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    last_error: ChatError | None = None
    queued_for_capacity: bool | None = None
    children: tuple[Observation, ...] = ()
    # Carried into alerts when present: computer_use | explore | orchestrator (an
    # orchestrator is one long-lived chat per user), ui | api, context.error, warnings.
    mode: str = ""
    client_type: str = ""
    context_error: str = ""
    warnings: tuple[str, ...] = ()
    # root | chat | subagent (chat-tree experiment); "": not said (a child is a subagent).
    kind: str = ""
    # created_at unparsed: read only when updated_at needs checking against it.
    created_raw: str | None = None
    # The tool calls left pending: only an action_required watch event names them (the
    # event's own ``tool_calls``, put here by the event readers).
    tool_calls: tuple[ToolCall, ...] = ()

    def created(self) -> float | None:
        """created_at as epoch seconds, or None when absent or unreadable."""
        if self.created_at is not None:
            return self.created_at
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
        stack.extend(reversed(chat.children))
    return out


# The enumerations coderd sends, interned so a hundred thousand records share them; an
# unknown value is kept (truncated) rather than dropped.
class _Kinds(dict[str, str]):
    def __missing__(self, key: object) -> str:
        return str(key)[:40]


_ENUMS = ("computer_use", "explore", "orchestrator", "ui", "api", "root", "chat", "subagent")
KINDS = _Kinds({k: k for k in _ENUMS})


# -- the tolerant constructor --------------------------------------------------------


def as_text(obj: dict[str, Any], key: str) -> str:
    """A field as text: absent and null are "", anything else its ``str``."""
    v = obj.get(key)
    if v is None:
        return ""
    return v if isinstance(v, str) else str(v)


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


def parse_chat_error(value: Any) -> ChatError | None:
    """``last_error`` as an object (newest), a plain string (early text column), or null."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return ChatError(message=value[:500])
    if not isinstance(value, dict):
        return ChatError(message=str(value)[:500])
    status_code = value.get("status_code")
    return ChatError(
        message=as_text(value, "message")[:500],
        detail=as_text(value, "detail")[:500],
        kind=as_text(value, "kind") or "generic",
        provider=as_text(value, "provider"),
        retryable=value.get("retryable") is True,
        status_code=status_code if isinstance(status_code, int) else None,
    )


def _opt_id(value: Any) -> str | None:
    if value is None:
        return None
    return (value or None) if type(value) is str else str(value)


def from_json(obj: Any, *, where: str = "chat") -> Observation:
    """A decoded chat payload of any era as an observation; PayloadError names what is
    missing or unreadable (``where`` prefixes the field: ``chats[3].updated_at``)."""
    # The path of every listing row that is news and every GET: one lookup per field,
    # type checks inline, no helper calls for the common (well-typed) case.
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
    labels_raw = get("labels")
    labels: tuple[tuple[str, str], ...] = ()
    if labels_raw and type(labels_raw) is dict:
        labels = tuple(sorted((str(k), str(v)) for k, v in labels_raw.items()))
    children_raw = get("children")
    children: tuple[Observation, ...] = ()
    if children_raw and type(children_raw) is list:
        children = tuple(
            from_json(c, where=f"{where}.children[{i}]") for i, c in enumerate(children_raw)
        )
    queued = get("queued_for_capacity")
    last_error = get("last_error")
    owner_id = get("owner_id")
    title = get("title")
    mode = get("mode")
    client_type = get("client_type")
    context = get("context")
    context_error = context.get("error") if type(context) is dict else None
    warnings = get("warnings")
    kind = get("kind")
    created = get("created_at")
    return Observation(
        chat_id,  # type: ignore[arg-type]  # a ChatId: NewType's call costs a call per frame
        status,
        updated_at,
        # created_at is never used for verdicts; not parsing it halves the cost per chat.
        None,
        owner_id if type(owner_id) is str else ("" if owner_id is None else str(owner_id)),
        as_text(obj, "owner_username"),
        as_text(obj, "organization_id"),
        _opt_id(get("workspace_id")),
        _opt_id(get("parent_chat_id")),
        _opt_id(get("root_chat_id")),
        title[:TITLE_MAX] if type(title) is str else as_text(obj, "title")[:TITLE_MAX],
        get("archived") is True,
        labels,
        None if last_error is None else parse_chat_error(last_error),
        queued if type(queued) is bool else None,
        children,
        KINDS[mode] if type(mode) is str and mode else "",
        KINDS[client_type] if type(client_type) is str and client_type else "",
        context_error[:300] if type(context_error) is str else "",
        tuple(str(w)[:200] for w in warnings[:5]) if warnings and type(warnings) is list else (),
        KINDS[kind] if type(kind) is str and kind else "",
        created if type(created) is str else None,
    )


# -- the fast constructor ------------------------------------------------------------
# The fast decoder's shape of a chat: every field optional and nullable (coderd omits
# false booleans and nil pointers, and older eras send minimal payloads). Types are the
# ones coderd sends; anything else fails msgspec's decode, i.e. "ask the tolerant reader".


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
    kind: str | None = None


def _wire_error(err: WireError | str) -> ChatError:
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


def from_wire(w: WireChat) -> Observation | None:
    """The observation :func:`from_json` makes of the same payload, or None where it would
    coerce, truncate differently or raise (then it must be asked instead)."""
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
    children: tuple[Observation, ...] = ()
    if w.children:
        kids = []
        for c in w.children:
            kid = from_wire(c)
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
    kind = w.kind
    title = w.title
    return Observation(
        chat_id,  # type: ignore[arg-type]  # a ChatId: NewType's call costs a call per frame
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
        None if err is None or err == "" else _wire_error(err),
        w.queued_for_capacity,
        children,
        KINDS[mode] if mode else "",
        KINDS[client_type] if client_type else "",
        context_error[:300] if context_error else "",
        tuple(x[:200] for x in warnings[:5]) if warnings else (),
        KINDS[kind] if kind else "",
        w.created_at,
    )
