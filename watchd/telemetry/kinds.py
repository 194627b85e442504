"""The transport events, one record type per kind, and the one check of an event.

Each kind of ``@coder/ai-sdk-agent``'s ``onTransportEvent`` (docs/forwarding-events.md)
is a struct here: its required fields and their JSON types, beside the optional fields
any kind may carry. watchd's own traffic builds its events from these types
(:func:`own`), and the ingest endpoint checks forwarded events against the same
types (:func:`problem`), so the two can never disagree on a shape, as aiohttp's
``tracing.py`` keeps one record per signal.

``chatId`` on a ``ws:*`` event is required but may be null: the SDK's streams are one
chat's, watchd's own watch socket is every chat's of an identity and sends null.

Every SDK version's shapes are accepted (0.6.1 to 0.7.0): a field a later version added
is optional (``durationMs`` on ``segment:settle`` since 0.6.3, ``reader`` since 0.7.0),
and a well-formed event of a kind this build does not know (``type`` and ``timestamp``
as every kind has them) passes the check, to be counted and not exported by the span
converter. A malformed event (no ``type``, a ``timestamp`` that is not a number) still
refuses its batch.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import msgspec

_NUM = (int, float)


class TransportEvent(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="type"):
    """What every kind has (``type``, the tag, and ``timestamp`` in epoch milliseconds),
    and the optional fields the span converter reads from any kind."""

    timestamp: float
    reader: int | None = None
    chatId: str | None = None
    code: int | None = None
    reason: str | None = None
    ok: bool | None = None
    status: str | int | None = None
    finishReason: str | None = None
    error: dict[str, Any] | None = None
    event: dict[str, Any] | None = None


class HttpRequest(TransportEvent, kw_only=True, tag="http:request"):
    id: str | int
    method: str
    path: str


class HttpResponse(TransportEvent, kw_only=True, tag="http:response"):
    id: str | int
    method: str
    path: str
    status: int
    durationMs: float


class HttpError(TransportEvent, kw_only=True, tag="http:error"):
    id: str | int
    method: str
    path: str
    message: str
    durationMs: float


class WsDial(TransportEvent, kw_only=True, tag="ws:dial"):
    chatId: str | None
    attempt: int
    url: str


class WsOpen(TransportEvent, kw_only=True, tag="ws:open"):
    chatId: str | None
    attempt: int


class WsEvent(TransportEvent, kw_only=True, tag="ws:event"):
    chatId: str | None
    attempt: int


class WsClose(TransportEvent, kw_only=True, tag="ws:close"):
    chatId: str | None
    attempt: int
    # watchd's own watch socket says how many frames it read (agents' streams do not).
    events: int | None = None


class WsError(TransportEvent, kw_only=True, tag="ws:error"):
    chatId: str | None
    attempt: int
    message: str


class WsRedial(TransportEvent, kw_only=True, tag="ws:redial"):
    chatId: str | None
    attempt: int
    consecutiveFailures: int
    maxConsecutiveFailures: int
    backoffMs: float


class SegmentStart(TransportEvent, kw_only=True, tag="segment:start"):
    segment: int


class SegmentSettle(TransportEvent, kw_only=True, tag="segment:settle"):
    segment: int
    # Since 0.6.3; 0.6.1 settles without it.
    durationMs: float | None = None


# The kinds of a WebSocket connection's life, which watchd's own watch socket emits too.
WsKind = WsDial | WsOpen | WsEvent | WsClose | WsError | WsRedial

KINDS: tuple[type[TransportEvent], ...] = (
    HttpRequest,
    HttpResponse,
    HttpError,
    WsDial,
    WsOpen,
    WsEvent,
    WsClose,
    WsError,
    WsRedial,
    SegmentStart,
    SegmentSettle,
)


def own(event: TransportEvent) -> dict[str, Any]:
    """An event of watchd's own traffic as the sink takes it: the JSON an agent's
    forwarder would send (unset optional fields left out)."""
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out


# -- the check -----------------------------------------------------------------------


def _json_types(annotation: Any) -> tuple[tuple[type, ...], bool]:
    """A field's annotation as the JSON types it admits, and whether null is one."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    members = args or (annotation,)
    nullable = type(None) in members
    admitted: list[type] = []
    for m in members:
        if m is type(None):
            continue
        origin = typing.get_origin(m) or m
        admitted.extend(_NUM if origin is float else (origin,))
    return tuple(dict.fromkeys(admitted)), nullable


# (name, JSON types, required, null allowed) per field, per kind; timestamp apart.
_Rule = tuple[str, tuple[type, ...], bool, bool]


def _rules(kind: type[TransportEvent]) -> tuple[_Rule, ...]:
    hints = typing.get_type_hints(kind)
    declared = list(kind.__annotations__)  # the kind's own fields, in the SDK's order
    out: list[_Rule] = []
    for f in msgspec.structs.fields(kind):
        if f.name == "timestamp":
            continue
        admitted, nullable = _json_types(hints[f.name])
        out.append((f.encode_name, admitted, f.required, nullable))
    # Required fields first, in the kind's order: the first problem named is the one a
    # sender must fix first.
    order = {name: i for i, name in enumerate(declared)}
    return tuple(sorted(out, key=lambda r: (not r[2], order.get(r[0], len(order)))))


RULES: dict[str, tuple[_Rule, ...]] = {str(k.__struct_config__.tag): _rules(k) for k in KINDS}


def _names(admitted: tuple[type, ...]) -> str:
    return "/".join(t.__name__ for t in admitted)


def problem(ev: Any) -> str | None:
    """None when ``ev`` is a well-formed event of a known kind, else what is wrong with
    it, starting with the field (``.status: required for http:response (int)``). Built
    only on failure: the per-event cost of a valid batch is a few lookups per field."""
    if not isinstance(ev, dict):
        return ": expected an event object"
    kind = ev.get("type")
    if not isinstance(kind, str):
        return ".type: required, a string"
    ts = ev.get("timestamp")
    if ts is None or ts.__class__ is bool or not isinstance(ts, _NUM) or ts < 0:
        return ".timestamp: required, milliseconds since the epoch"
    # A kind this build does not know (a later SDK's): well-formed as far as every kind
    # goes, accepted, then counted and dropped by the converter.
    for name, admitted, required, nullable in RULES.get(kind, ()):
        value = ev.get(name)
        if value is None:
            if required and not (nullable and name in ev):
                null = " or null" if nullable else ""
                return f".{name}: required for {kind} ({_names(admitted)}{null})"
            continue
        if (value.__class__ is bool and bool not in admitted) or not isinstance(value, admitted):
            if required:
                return f".{name}: required for {kind} ({_names(admitted)})"
            return f".{name}: must be {_names(admitted)}"
    return None
