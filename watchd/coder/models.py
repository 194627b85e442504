"""Tolerant readers for Coder's chat payloads, across every API era.

Unknown fields are ignored, unknown statuses and event kinds are kept as
strings, ``last_error`` may be an object or a plain string, ``null`` and
absent mean the same, and timestamps become epoch seconds (timezone-aware;
a zone-less one is read as UTC, which is what Coder writes). What we cannot
do without (a chat id, a status) raises :class:`PayloadError` naming the field.

Plain functions over dicts, not pydantic: this is the hot path of the watch
stream and must stay cheap per event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NewType, TypeGuard, get_args

import orjson

from watchd.coder.errors import PayloadError

ChatId = NewType("ChatId", str)

# The one status vocabulary. The wire keeps ``str`` (Chat.status, ChatRecord.status): a
# server may send a status this build does not know, and it is kept, armed with the
# default budget and counted as ``status="other"``; code that names a status uses these.
ActiveStatus = Literal["running", "pending", "interrupting"]
BlockedStatus = Literal["requires_action"]
IdleStatus = Literal["waiting", "completed", "paused", "error"]
ChatStatus = Literal[ActiveStatus, BlockedStatus, IdleStatus]

ACTIVE_STATUSES: frozenset[ChatStatus] = frozenset(get_args(ActiveStatus))
BLOCKED_STATUSES: frozenset[ChatStatus] = frozenset(get_args(BlockedStatus))
IDLE_STATUSES: frozenset[ChatStatus] = frozenset(get_args(IdleStatus))
KNOWN_STATUSES: frozenset[ChatStatus] = ACTIVE_STATUSES | BLOCKED_STATUSES | IDLE_STATUSES


def is_known(status: str) -> TypeGuard[ChatStatus]:
    """Whether this build knows ``status`` (the rest are kept as strings, as ``other``)."""
    return status in KNOWN_STATUSES


@dataclass(frozen=True, slots=True)
class ChatError:
    """A chat's ``last_error``, classified (``chaterror`` kinds; unknown kinds read as generic)."""

    message: str
    detail: str = ""
    kind: str = "generic"
    provider: str = ""
    retryable: bool = False
    status_code: int | None = None


# Not frozen: frozen dataclasses pay object.__setattr__ per field, and this is built once
# per watch event. Treated as immutable by convention (nothing assigns to a Chat).
@dataclass(slots=True)
class Chat:
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
    children: tuple[Chat, ...] = field(default=())
    # Carried into alerts when present: computer_use | explore | orchestrator (an
    # orchestrator is one long-lived chat per user), ui | api, context.error, warnings.
    mode: str = ""
    client_type: str = ""
    context_error: str = ""
    warnings: tuple[str, ...] = ()
    # created_at unparsed: read only when updated_at needs checking against it.
    created_raw: str | None = None

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


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool_call_id: str
    tool_name: str


# Not frozen, like Chat: one is built per watch frame.
@dataclass(slots=True)
class WatchEvent:
    kind: str
    chat: Chat
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class User:
    id: str
    username: str
    organization_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Quota:
    credits_consumed: int
    budget: int  # -1: no quota configured/licensed, not "exhausted"

    @property
    def unlimited(self) -> bool:
        return self.budget < 0

    @property
    def headroom(self) -> int | None:
        return None if self.unlimited else self.budget - self.credits_consumed


@dataclass(frozen=True, slots=True)
class WorkspaceBuild:
    workspace_id: str
    status: str
    job_status: str = ""
    error_code: str = ""


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


_fromiso = datetime.fromisoformat
TITLE_MAX = 200


def timestamp(text: str) -> float:
    """An RFC 3339 timestamp as epoch seconds (zone-less read as UTC); ValueError if not."""
    parsed = _fromiso(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _str(obj: dict[str, Any], key: str) -> str:
    v = obj.get(key)
    if v is None:
        return ""
    return v if isinstance(v, str) else str(v)


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
        message=_str(value, "message")[:500],
        detail=_str(value, "detail")[:500],
        kind=_str(value, "kind") or "generic",
        provider=_str(value, "provider"),
        retryable=value.get("retryable") is True,
        status_code=status_code if isinstance(status_code, int) else None,
    )


def parse_chat(obj: Any, *, where: str = "chat") -> Chat:
    # The hot path of both the watch stream and listings: one dict lookup per field,
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
    children: tuple[Chat, ...] = ()
    if children_raw and type(children_raw) is list:
        children = tuple(
            parse_chat(c, where=f"{where}.children[{i}]") for i, c in enumerate(children_raw)
        )
    queued = get("queued_for_capacity")
    last_error = get("last_error")
    owner_id = get("owner_id")
    owner_username = get("owner_username")
    org = get("organization_id")
    workspace = get("workspace_id")
    parent = get("parent_chat_id")
    root = get("root_chat_id")
    title = get("title")
    mode = get("mode")
    client_type = get("client_type")
    context = get("context")
    context_error = context.get("error") if type(context) is dict else None
    warnings = get("warnings")
    return Chat(
        ChatId(chat_id),
        status,
        updated_at,
        # created_at is never used for verdicts; not parsing it halves the cost per chat.
        None,
        owner_id if type(owner_id) is str else ("" if owner_id is None else str(owner_id)),
        owner_username if type(owner_username) is str else _str(obj, "owner_username"),
        org if type(org) is str else _str(obj, "organization_id"),
        None
        if workspace is None
        else (workspace or None)
        if type(workspace) is str
        else str(workspace),
        None if parent is None else (parent or None) if type(parent) is str else str(parent),
        None if root is None else (root or None) if type(root) is str else str(root),
        title[:TITLE_MAX] if type(title) is str else _str(obj, "title")[:TITLE_MAX],
        get("archived") is True,
        labels,
        None if last_error is None else parse_chat_error(last_error),
        queued if type(queued) is bool else None,
        children,
        _KINDS[mode] if type(mode) is str and mode else "",
        _KINDS[client_type] if type(client_type) is str and client_type else "",
        context_error[:300] if type(context_error) is str else "",
        tuple(str(w)[:200] for w in warnings[:5]) if warnings and type(warnings) is list else (),
        created if type(created := get("created_at")) is str else None,
    )


# The enumerations coderd sends, interned so a hundred thousand records share them; an
# unknown value is kept (truncated) rather than dropped.
class _Kinds(dict[str, str]):
    def __missing__(self, key: object) -> str:
        return str(key)[:40]


_KINDS = _Kinds({k: k for k in ("computer_use", "explore", "orchestrator", "ui", "api")})


def flatten(chats: list[Chat]) -> list[Chat]:
    """Roots followed by their embedded ``children``, each once (first occurrence wins)."""
    seen: set[str] = set()
    out: list[Chat] = []
    stack = list(reversed(chats))
    while stack:
        chat = stack.pop()
        if chat.id in seen:
            continue
        seen.add(chat.id)
        out.append(chat)
        stack.extend(reversed(chat.children))
    return out


class MalformedFrame(ValueError):
    """A watch frame that cannot be understood; the connection should resync."""


class ServerFrameError(Exception):
    """An era-A ``{"type":"error"}`` envelope: the server reports a subscription failure."""


def parse_watch_frame(text: str | bytes) -> WatchEvent | None:
    """One watch-socket message → an event, or None for a keepalive.

    Bare ``ChatWatchEvent`` objects (eras B–E) and ``{type, data}`` envelopes
    (era A) are both accepted.
    """
    try:
        obj = orjson.loads(text)
    except ValueError as exc:
        raise MalformedFrame(f"not JSON: {exc}") from None
    if type(obj) is not dict:
        raise MalformedFrame(f"expected a JSON object, got {type(obj).__name__}")
    if "kind" not in obj and "type" in obj:
        frame_type = obj.get("type")
        if frame_type == "ping":
            return None
        if frame_type == "error":
            data = obj.get("data")
            message = data.get("message") if isinstance(data, dict) else data
            raise ServerFrameError(str(message)[:300])
        if frame_type != "data":
            raise MalformedFrame(f"unknown envelope type {str(frame_type)[:40]!r}")
        obj = obj.get("data")
        if not isinstance(obj, dict):
            raise MalformedFrame("envelope data is not an object")
    kind = obj.get("kind")
    if type(kind) is not str or not kind:
        raise MalformedFrame("event.kind missing or not a string")
    try:
        chat = parse_chat(obj.get("chat"), where="event.chat")
    except PayloadError as exc:
        raise MalformedFrame(str(exc)) from None
    raw_calls = obj.get("tool_calls")
    if not raw_calls or type(raw_calls) is not list:
        return WatchEvent(kind, chat)
    calls = tuple(
        ToolCall(_str(c, "tool_call_id"), _str(c, "tool_name"))
        for c in raw_calls
        if isinstance(c, dict)
    )
    return WatchEvent(kind, chat, calls)


def parse_user(obj: Any) -> User:
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise PayloadError("user.id", "missing or not a string")
    orgs = obj.get("organization_ids")
    return User(
        id=obj["id"],
        username=_str(obj, "username"),
        organization_ids=tuple(o for o in orgs if isinstance(o, str))
        if isinstance(orgs, list)
        else (),
    )


def parse_quota(obj: Any) -> Quota:
    if not isinstance(obj, dict):
        raise PayloadError("quota", "expected an object")
    consumed = obj.get("credits_consumed")
    budget = obj.get("budget")
    if not isinstance(consumed, int) or isinstance(consumed, bool):
        raise PayloadError("quota.credits_consumed", "missing or not an integer")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise PayloadError("quota.budget", "missing or not an integer")
    return Quota(credits_consumed=consumed, budget=budget)


def parse_workspace_build(obj: Any) -> WorkspaceBuild:
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise PayloadError("workspace.id", "missing or not a string")
    build = obj.get("latest_build")
    if not isinstance(build, dict):
        raise PayloadError("workspace.latest_build", "missing or not an object")
    job = build.get("job") if isinstance(build.get("job"), dict) else {}
    assert isinstance(job, dict)
    return WorkspaceBuild(
        workspace_id=obj["id"],
        status=_str(build, "status"),
        job_status=_str(job, "status"),
        error_code=_str(job, "error_code"),
    )
