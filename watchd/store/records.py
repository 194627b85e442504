"""A chat's record in the store, and how one is built from an observation.

A record is the compact form of a chat that the store keeps: its status, the clock
(``since``, and how we know it), and what alerts show. :func:`build` makes one from
an :class:`~watchd.coder.observing.Observation` (a payload in the wire's own types),
keeping what an older era's minimal payload does not say; it is the only place a record
is made, and the only place a payload is normalised (titles cut, labels sorted and
bounded, enumerations interned, errors classified). Pure: no state, no I/O (the rules
that decide *when* a record changes are :class:`watchd.store.chats.ChatStore`'s).
"""

from __future__ import annotations

from typing import Literal, NewType

import msgspec

from watchd.coder.observing import ChatError, Observation, ToolCall, WireError

Identity = NewType("Identity", str)
ChatKey = tuple[str, str]  # (identity, chat id)

# A server timestamp this far past the server-clock estimate is not believed: it is
# clamped to "now" (and counted), so one stamp from a clock that stepped cannot make
# every later observation look stale.
FUTURE_TOLERANCE = 30.0

# How the store knows a chat's clock start (see watchd.store.chats).
ClockSource = Literal["transition", "synthesized", "lower_bound"]
# A chat's labels become its alerts' labels: at most MAX_LABELS are copied, each value at
# most LABEL_VALUE_MAX characters (a 200 000-character label made 3.9 MB webhook bodies,
# which a receiver behind nginx's 1 MB default refuses for good). A record keeps one label
# more than is copied, so an alert can say that some were left out, and marks a value it
# cut with a trailing "…".
MAX_LABELS = 16
LABEL_VALUE_MAX = 4096


TITLE_MAX = 200


def title_of(title: str | None) -> str:
    """A payload's title as a record keeps it (the store compares titles so, too)."""
    return title[:TITLE_MAX] if title else ""


# The enumerations coderd sends, interned so a hundred thousand records share them; an
# unknown value is kept (truncated) rather than dropped.
class _Kinds(dict[str, str]):
    def __missing__(self, key: object) -> str:
        return str(key)[:40]


_ENUMS = ("computer_use", "explore", "orchestrator", "ui", "api", "root", "chat", "subagent")
KINDS = _Kinds({k: k for k in _ENUMS})

Details = tuple[str, str, str, tuple[str, ...]]
_NO_DETAILS: Details = ("", "", "", ())


def details(chat: Observation) -> Details:
    """What a payload says of mode, client type, context error and warnings, as a record
    keeps them."""
    mode, client_type, context, warnings = chat.mode, chat.client_type, chat.context, chat.warnings
    error = context.error if context is not None else None
    return (
        KINDS[mode] if mode else "",
        KINDS[client_type] if client_type else "",
        error[:300] if error else "",
        tuple(w[:200] for w in warnings[:5]) if warnings else (),
    )


def chat_error(err: WireError | str | None) -> ChatError | None:
    """A payload's ``last_error`` classified (null and "" are none; unknown kinds read as
    generic)."""
    if err is None or err == "":
        return None
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


def bounded_labels(labels: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    """A payload's ``labels`` as a record keeps them: sorted by name (see MAX_LABELS)."""
    if not labels:
        return ()
    kept = tuple(sorted(labels.items()))[: MAX_LABELS + 1]
    if any(len(v) > LABEL_VALUE_MAX or len(k) > LABEL_VALUE_MAX for k, v in kept):
        kept = tuple(
            (k[:LABEL_VALUE_MAX], v if len(v) <= LABEL_VALUE_MAX else v[:LABEL_VALUE_MAX] + "…")
            for k, v in kept
        )
    return kept


# The tool calls a record keeps for a stranded chat (ChatStranded names them): at most
# MAX_PENDING, each id and name cut to PENDING_TEXT_MAX characters.
MAX_PENDING = 8
PENDING_TEXT_MAX = 128


def bounded_calls(calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    """``calls`` as a record keeps them (see MAX_PENDING)."""
    if not calls:
        return calls
    n = PENDING_TEXT_MAX
    kept = calls[:MAX_PENDING]
    if all(len(c.tool_call_id) <= n and len(c.tool_name) <= n for c in kept):
        return kept
    return tuple(ToolCall(c.tool_call_id[:n], c.tool_name[:n]) for c in kept)


CLOCK_TRANSITION: ClockSource = "transition"
CLOCK_SYNTHESIZED: ClockSource = "synthesized"
CLOCK_LOWER_BOUND: ClockSource = "lower_bound"
ChangeKind = Literal["new", "transition", "refresh", "tombstone"]


# A struct, not a dataclass: one is built per transition, which a struct does in a third
# of the time, and it is not tracked by the garbage collector (a store holds a hundred
# thousand). Records are replaced, never mutated in place.
class ChatRecord(msgspec.Struct, gc=False):
    identity: str
    chat_id: str
    status: str
    since: float  # server epoch seconds the chat entered `status`
    clock: ClockSource
    updated_at: float | None
    seen_at: float  # server time of our last observation
    owner: str = ""
    title: str = ""
    workspace_id: str | None = None
    parent_id: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    last_error: ChatError | None = None
    queued_for_capacity: bool | None = None
    version: int = 0  # bumps on every clock change; timers compare it
    mode: str = ""
    client_type: str = ""
    context_error: str = ""
    warnings: tuple[str, ...] = ()
    # requires_action only: the tool calls its action_required event left pending.
    pending: tuple[ToolCall, ...] = ()
    # root | chat | subagent (the chat-tree experiment); "" where the server does not say.
    kind: str = ""

    @property
    def key(self) -> ChatKey:
        return (self.identity, self.chat_id)


# One is built per change (every transition on the stream): a struct, which builds in a
# third of a dataclass's time and is not tracked by the garbage collector (it refers to
# records, which never refer back, so it cannot be part of a cycle).
class Change(msgspec.Struct, gc=False):
    """What an observation did to the store (treated as immutable)."""

    kind: ChangeKind
    record: ChatRecord
    previous: ChatRecord | None
    reason: str = ""  # for tombstones: archived | gone (404) | missing from two listings
    # How it was learned: watch | listing | confirm (a re-read detection asked for).
    via: str = ""


def build(
    identity: str,
    chat: Observation,
    *,
    since: float,
    clock: ClockSource,
    now: float,
    version: int,
    previous: ChatRecord | None = None,
) -> ChatRecord:
    # Positional (in field order): this runs once per transition. Every field is read
    # (and normalised) once, above both branches.
    status = chat.status
    labels = bounded_labels(chat.labels) if chat.labels else ()
    # An older era's payload (and every benchmark frame) has none of them: no call.
    if chat.mode or chat.client_type or chat.context or chat.warnings:
        mode, client_type, context_error, warnings = details(chat)
    else:
        mode, client_type, context_error, warnings = _NO_DETAILS
    calls = bounded_calls(chat.tool_calls) if chat.tool_calls else ()
    kind = chat.kind
    kind = KINDS[kind] if kind else ""
    title = title_of(chat.title)
    queued = chat.queued_for_capacity
    if previous is not None:
        # Older eras' watch payloads are minimal: keep what we knew rather than erase it.
        p = previous
        full = bool(client_type)  # only a full payload says these are now clear
        return ChatRecord(
            p.identity,
            p.chat_id,
            status,
            since,
            clock,
            chat.updated_at if chat.updated_at is not None else p.updated_at,
            now,
            chat.owner_username or p.owner,
            title or p.title,
            chat.workspace_id or p.workspace_id,
            chat.parent_chat_id or p.parent_id,
            labels or p.labels,
            chat_error(chat.last_error) if status == "error" else None,
            queued if queued is not None else p.queued_for_capacity,
            version,
            mode or p.mode,
            client_type or p.client_type,
            context_error if full else p.context_error,
            warnings if full else p.warnings,
            # Only an action_required event names them; a later sighting in the same
            # status keeps them.
            calls or (p.pending if status == p.status == "requires_action" else ()),
            kind or p.kind,
        )
    return ChatRecord(
        identity,
        chat.id,
        status,
        since,
        clock,
        chat.updated_at,
        now,
        chat.owner_username or chat.owner_id or "",
        title,
        chat.workspace_id or None,
        chat.parent_chat_id or None,
        labels,
        chat_error(chat.last_error),
        queued,
        version,
        mode,
        client_type,
        context_error,
        warnings,
        calls if status == "requires_action" else (),
        kind,
    )


def clock_start(chat: Observation, now: float) -> float:
    """The clock start as the server stated it: ``updated_at`` (already sane); only a
    payload without one falls back to our estimate (``created_at`` would overstate the
    time in status: the chat may have entered it long after it was created).

    Never clamped to this replica's server-clock estimate: that estimate differs between
    replicas (and restarts) by up to a second of Date-header resolution, and the clock
    start feeds the fingerprint and ``startsAt`` — replicas owning one identity must
    compute the same ones (docs/kubernetes.md). A start slightly ahead of our estimate
    only means the timer arms a moment later.
    """
    return chat.updated_at if chat.updated_at is not None else now
