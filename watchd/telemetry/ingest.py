"""Validating transport-event batches from agents (``POST /v1/transport-events``).

A batch is a JSON envelope ``{"source": {...}, "events": [...]}`` or
newline-delimited JSON, each line an envelope or a bare event (bare events
take their sender from the ``service``/``instance``/``agent`` query
parameters). The whole batch is validated before any of it is accepted; the
first problem is reported naming its line (NDJSON) or index and its field.

Decoded with orjson; whatever orjson refuses goes to the stdlib decoder, so what was
accepted before (``NaN``, integers past 64 bits, lone surrogates) still is and every
error reads as before. The daemon parses on the event loop in steps
(:func:`parse_batch_stepwise`): it yields to the loop every :data:`STEP` events, so a
flood of batches interleaves with ``/healthz`` and the watchers instead of holding the
loop for whole batches. (A worker thread was measured worse: orjson holds the GIL for a
whole decode anyway, and every socket call the loop made then waited up to a switch
interval to get the GIL back from the parser.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Generator, Mapping
from typing import Any

import orjson

from watchd.telemetry.events import EventSource
from watchd.telemetry.kinds import problem

MAX_EVENTS_PER_BATCH = 10_000
# Events (or NDJSON lines) validated between two yields to the loop: ~0.1-0.2 ms of work.
STEP = 100


class IngestError(ValueError):
    """A batch that cannot be accepted; the message names where and what."""


class NoRoom(Exception):
    """A batch larger than the room left in the event queue, found before its events
    were validated: under a flood, a batch that would be refused costs only its decode."""

    def __init__(self, events: int) -> None:
        super().__init__(f"{events} events do not fit the event queue")
        self.events = events


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
    """``ev`` if it is a well-formed event of a known kind (the one check,
    :func:`watchd.telemetry.kinds.problem`), else IngestError naming ``where`` and the field."""
    wrong = problem(ev)
    if wrong is not None:
        raise IngestError(f"{where}{wrong}")
    result: dict[str, Any] = ev
    return result


Batch = list[tuple[EventSource, dict[str, Any]]]
_Steps = Generator[None, None, Batch]


def parse_batch(body: bytes, *, content_type: str, query: Mapping[str, str]) -> Batch:
    """All events of a batch with their senders, or IngestError for the first problem."""
    steps = _steps(body, content_type=content_type, query=query)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            batch: Batch = done.value
            return batch


async def parse_batch_stepwise(
    body: bytes,
    *,
    content_type: str,
    query: Mapping[str, str],
    room: Callable[[], int] | None = None,
) -> Batch:
    """:func:`parse_batch` on the loop, yielding to it every :data:`STEP` events: the
    same result and the same IngestError, without holding the loop for a whole batch.

    With ``room``, an envelope whose events outnumber ``room()`` raises :class:`NoRoom`
    as soon as it is decoded, before any event is validated (so a malformed batch may
    first be answered "full" and, retried, then "bad")."""
    steps = _steps(body, content_type=content_type, query=query, room=room)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            batch: Batch = done.value
            return batch
        await asyncio.sleep(0)


def _steps(
    body: bytes,
    *,
    content_type: str,
    query: Mapping[str, str],
    room: Callable[[], int] | None = None,
) -> _Steps:
    """The batch parser as a generator: it yields between steps of :data:`STEP` events
    and returns the batch, or raises IngestError (also for what the decoders raise)."""
    try:
        return (yield from _parse(body, content_type=content_type, query=query, room=room))
    except RecursionError:
        # json's decoder recurses per nesting level: a body nested thousands deep is an
        # operator's (or an attacker's) mistake, answered 400, never a 500 with a traceback.
        raise IngestError("body: JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise IngestError(f"body: not UTF-8 (byte {exc.start})") from None


def _loads(text: str) -> Any:
    """orjson, or the stdlib's answer where orjson refuses (see the module docstring)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _parse(
    body: bytes,
    *,
    content_type: str,
    query: Mapping[str, str],
    room: Callable[[], int] | None = None,
) -> _Steps:
    """:func:`_steps` without the decoders' own exceptions mapped."""
    text = body.decode("utf-8", "strict") if body else ""
    out: Batch = []
    if (
        "ndjson" in content_type
        or "jsonlines" in content_type
        or ("\n" in text.strip() and not text.lstrip().startswith('{"source"'))
    ):
        fallback: EventSource | None = None
        if query.get("service") and query.get("instance"):
            fallback = EventSource(query["service"], query["instance"], query.get("agent"))
        for n, line in enumerate(text.splitlines(), start=1):
            if n % STEP == 0:
                yield
            if not line.strip():
                continue
            try:
                obj = _loads(line)
            except json.JSONDecodeError as exc:
                raise IngestError(f"line {n}: not JSON ({exc.msg})") from None
            if isinstance(obj, dict) and "events" in obj:
                out.extend((yield from _envelope(obj, f"line {n}")))
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
    return (yield from _envelope(obj, "body", room))


def _envelope(obj: dict[str, Any], where: str, room: Callable[[], int] | None = None) -> _Steps:
    source = _source(obj.get("source"), where)
    events = obj.get("events")
    if not isinstance(events, list):
        raise IngestError(f"{where}.events: expected a list")
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise IngestError(f"{where}.events: more than {MAX_EVENTS_PER_BATCH} events")
    if room is not None and len(events) > room():
        raise NoRoom(len(events))
    for start in range(0, len(events), STEP):
        if start:
            yield
        for i, ev in enumerate(events[start : start + STEP], start):
            wrong = problem(ev)
            if wrong is not None:
                raise IngestError(f"{where}.events[{i}]{wrong}")
    return [(source, ev) for ev in events]
