"""Validating transport-event batches from agents (``POST /v1/transport-events``).

A batch is a JSON envelope ``{"source": {...}, "events": [...]}`` or
newline-delimited JSON, each line an envelope or a bare event (bare events
take their sender from the ``service``/``instance``/``agent`` query
parameters). The whole batch is validated before any of it is accepted; the
first problem is reported naming its line (NDJSON) or index and its field.

Decoded with orjson; whatever orjson refuses goes to the stdlib decoder, so what was
accepted before (``NaN``, integers past 64 bits, lone surrogates) still is and every
error reads as before. The daemon parses large bodies in one worker thread
(:func:`parse_batch_off_loop`): a flood of batches then costs the event loop GIL
turns of at most the switch interval, not whole batches.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from watchd.telemetry.events import EventSource

MAX_EVENTS_PER_BATCH = 10_000
# Bodies at least this large are parsed off the loop (a small one costs less than the
# hand-off to the thread).
OFF_LOOP_BYTES = 16 * 1024
_NUM = (int, float)

# Required fields per type, and their JSON types (bool excluded from numbers).
REQUIRED: dict[str, dict[str, tuple[type, ...]]] = {
    "http:request": {"id": (str, int), "method": (str,), "path": (str,)},
    "http:response": {
        "id": (str, int),
        "method": (str,),
        "path": (str,),
        "status": (int,),
        "durationMs": _NUM,
    },
    "http:error": {
        "id": (str, int),
        "method": (str,),
        "path": (str,),
        "message": (str,),
        "durationMs": _NUM,
    },
    "ws:dial": {"chatId": (str,), "attempt": (int,), "url": (str,)},
    "ws:open": {"chatId": (str,), "attempt": (int,)},
    "ws:event": {"chatId": (str,), "attempt": (int,)},
    "ws:close": {"chatId": (str,), "attempt": (int,)},
    "ws:error": {"chatId": (str,), "attempt": (int,), "message": (str,)},
    "ws:redial": {
        "chatId": (str,),
        "attempt": (int,),
        "consecutiveFailures": (int,),
        "maxConsecutiveFailures": (int,),
        "backoffMs": _NUM,
    },
    "segment:start": {"segment": (int,)},
    "segment:settle": {"segment": (int,), "durationMs": _NUM},
}
OPTIONAL: dict[str, tuple[type, ...]] = {
    "reader": (int,),
    "chatId": (str,),
    "code": (int,),
    "reason": (str,),
    "ok": (bool,),
    "status": (str, int),
    "finishReason": (str,),
    "error": (dict,),
    "event": (dict,),
}


# The same rules as check_event, as tables for the fast path (valid_event).
_CHECKS: dict[str, tuple[tuple[str, tuple[type, ...]], ...]] = {
    kind: tuple(
        (name, types)
        for name, types in fields.items()
        if not (kind == "segment:start" and name == "chatId")
    )
    for kind, fields in REQUIRED.items()
}
_OPTIONAL = tuple(OPTIONAL.items())


class IngestError(ValueError):
    """A batch that cannot be accepted; the message names where and what."""


def _source(obj: Any, where: str) -> EventSource:
    if not isinstance(obj, dict):
        raise IngestError(f"{where}.source: expected an object with service and instance")
    service, instance, agent = obj.get("service"), obj.get("instance"), obj.get("agent")
    if not isinstance(service, str) or not service.strip():
        raise IngestError(f"{where}.source.service: required, a non-empty string")
    if not isinstance(instance, str) or not instance.strip():
        raise IngestError(f"{where}.source.instance: required, a non-empty string")
    if agent is not None and not isinstance(agent, str):
        raise IngestError(f"{where}.source.agent: must be a string")
    return EventSource(
        service=service[:200], instance=instance[:200], agent=agent[:200] if agent else None
    )


def check_event(ev: Any, where: str) -> dict[str, Any]:
    if not isinstance(ev, dict):
        raise IngestError(f"{where}: expected an event object")
    kind = ev.get("type")
    if not isinstance(kind, str):
        raise IngestError(f"{where}.type: required, a string")
    if kind not in REQUIRED:
        raise IngestError(f"{where}.type: unknown event type {kind[:40]!r}")
    ts = ev.get("timestamp")
    if not isinstance(ts, _NUM) or isinstance(ts, bool) or ts < 0:
        raise IngestError(f"{where}.timestamp: required, milliseconds since the epoch")
    for name, types in REQUIRED[kind].items():
        value = ev.get(name)
        if kind == "segment:start" and name == "chatId":
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, types):
            raise IngestError(
                f"{where}.{name}: required for {kind} ({'/'.join(t.__name__ for t in types)})"
            )
    for name, types in OPTIONAL.items():
        value = ev.get(name)
        if value is not None and (
            (isinstance(value, bool) and bool not in types) or not isinstance(value, types)
        ):
            raise IngestError(f"{where}.{name}: must be {'/'.join(t.__name__ for t in types)}")
    return ev


def valid_event(ev: Any) -> bool:
    """Whether :func:`check_event` would accept ``ev``, without building the name of
    where it is: the per-event cost of a batch that is all valid (the usual one). A
    False answer is explained by calling check_event (tests pin the two together)."""
    if not isinstance(ev, dict):
        return False
    kind = ev.get("type")
    if not isinstance(kind, str):
        return False
    checks = _CHECKS.get(kind)
    if checks is None:
        return False
    ts = ev.get("timestamp")
    if ts is None or ts.__class__ is bool or not isinstance(ts, _NUM) or ts < 0:
        return False
    for name, types in checks:
        value = ev.get(name)
        if value is None or value.__class__ is bool or not isinstance(value, types):
            return False
    for name, types in _OPTIONAL:
        value = ev.get(name)
        if value is not None and (
            (value.__class__ is bool and bool not in types) or not isinstance(value, types)
        ):
            return False
    return True


def parse_batch(
    body: bytes, *, content_type: str, query: Mapping[str, str]
) -> list[tuple[EventSource, dict[str, Any]]]:
    """All events of a batch with their senders, or IngestError for the first problem."""
    try:
        return _parse_batch(body, content_type=content_type, query=query)
    except RecursionError:
        # json's decoder recurses per nesting level: a body nested thousands deep is an
        # operator's (or an attacker's) mistake, answered 400, never a 500 with a traceback.
        raise IngestError("body: JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise IngestError(f"body: not UTF-8 (byte {exc.start})") from None


_executor: ThreadPoolExecutor | None = None


async def parse_batch_off_loop(
    body: bytes, *, content_type: str, query: Mapping[str, str]
) -> list[tuple[EventSource, dict[str, Any]]]:
    """:func:`parse_batch` in the one ingest worker thread for a large body (inline for a
    small one): the same result and the same IngestError, without holding the loop."""
    if len(body) < OFF_LOOP_BYTES:
        return parse_batch(body, content_type=content_type, query=query)
    global _executor
    if _executor is None:
        # One thread: batches queue behind each other there, and the loop competes for the
        # GIL with one parser rather than a pool of them.
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-parse")
    sender = {k: query[k] for k in ("service", "instance", "agent") if k in query}
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        _executor,
        # Plain values, not aiohttp's proxy: the thread must not touch loop objects.
        lambda: parse_batch(body, content_type=content_type, query=sender),
    )


def _loads(text: str) -> Any:
    """orjson, or the stdlib's answer where orjson refuses (see the module docstring)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _parse_batch(
    body: bytes, *, content_type: str, query: Mapping[str, str]
) -> list[tuple[EventSource, dict[str, Any]]]:
    text = body.decode("utf-8", "strict") if body else ""
    out: list[tuple[EventSource, dict[str, Any]]] = []
    if (
        "ndjson" in content_type
        or "jsonlines" in content_type
        or ("\n" in text.strip() and not text.lstrip().startswith('{"source"'))
    ):
        fallback: EventSource | None = None
        if query.get("service") and query.get("instance"):
            fallback = EventSource(query["service"], query["instance"], query.get("agent"))
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = _loads(line)
            except json.JSONDecodeError as exc:
                raise IngestError(f"line {n}: not JSON ({exc.msg})") from None
            if isinstance(obj, dict) and "events" in obj:
                out.extend(_envelope(obj, f"line {n}"))
            else:
                if fallback is None:
                    raise IngestError(
                        f"line {n}: a bare event needs ?service=…&instance=… (or send envelopes)"
                    )
                out.append((fallback, check_event(obj, f"line {n}")))
            if len(out) > MAX_EVENTS_PER_BATCH:
                raise IngestError(f"batch: more than {MAX_EVENTS_PER_BATCH} events")
        if not out:
            raise IngestError("batch: no events")
        return out
    try:
        obj = _loads(text)
    except json.JSONDecodeError as exc:
        raise IngestError(f"body: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(obj, dict):
        raise IngestError("body: expected an object {source, events}")
    return _envelope(obj, "body")


def _envelope(obj: dict[str, Any], where: str) -> list[tuple[EventSource, dict[str, Any]]]:
    source = _source(obj.get("source"), where)
    events = obj.get("events")
    if not isinstance(events, list):
        raise IngestError(f"{where}.events: expected a list")
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise IngestError(f"{where}.events: more than {MAX_EVENTS_PER_BATCH} events")
    for i, ev in enumerate(events):
        if not valid_event(ev):
            check_event(ev, f"{where}.events[{i}]")  # raises, naming the field
    return [(source, ev) for ev in events]
