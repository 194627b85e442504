"""Transport events → spans: pairing golden tables, bounds, links, ingest validation."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from watchd.telemetry.events import EventSource
from watchd.telemetry.ingest import IngestError, parse_batch
from watchd.telemetry.spans import MS, SpanConverter, SpanRecord, template_path

SRC = EventSource("billing-agent", "pod-7f9c", "wf-1042")
OTHER = EventSource("billing-agent", "pod-7f9c", "wf-2000")
CHAT = "0b7c0000-0000-4000-8000-000000000001"
T0 = 1_764_437_000_000


def run(
    events: list[tuple[EventSource, dict[str, Any]]], **kw: Any
) -> tuple[list[SpanRecord], SpanConverter]:
    conv = SpanConverter(rng=random.Random(1), **kw)
    out: list[SpanRecord] = []
    for src, ev in events:
        out.extend(conv.feed(src, ev))
    return out, conv


def ev(kind: str, dt: int, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "timestamp": T0 + dt, **fields}


def test_http_pairs_and_templates_chat_ids() -> None:
    """Request + response make one CLIENT span named with {chat}, timed by the events."""
    spans, _ = run(
        [
            (
                SRC,
                ev(
                    "http:request",
                    0,
                    id="r1",
                    method="post",
                    path=f"/api/v2/chats/{CHAT}/messages?x=1",
                ),
            ),
            (
                SRC,
                ev(
                    "http:response",
                    120,
                    id="r1",
                    method="POST",
                    path=f"/api/v2/chats/{CHAT}/messages",
                    status=409,
                    ok=False,
                    durationMs=120,
                ),
            ),
        ]
    )
    (s,) = spans
    assert s.name == "POST /api/v2/chats/{chat}/messages" and s.kind == "CLIENT"
    assert (s.start_ns, s.end_ns) == (T0 * MS, (T0 + 120) * MS)
    assert s.attributes["coder.chat.id"] == CHAT
    assert s.attributes["http.response.status_code"] == 409
    assert s.status == "ERROR" and s.attributes["error.type"] == "409"
    assert "?" not in s.attributes["url.path"]


def test_http_error_and_unmatched_outcome() -> None:
    """A fetch failure is ERROR with error.type; an outcome with no request still spans."""
    spans, conv = run(
        [
            (SRC, ev("http:request", 0, id=1, method="GET", path="/api/v2/chats")),
            (
                SRC,
                ev(
                    "http:error",
                    50,
                    id=1,
                    method="GET",
                    path="/api/v2/chats",
                    message="TypeError: fetch failed",
                    durationMs=50,
                ),
            ),
            (
                SRC,
                ev(
                    "http:response",
                    900,
                    id=99,
                    method="GET",
                    path="/api/v2/chats",
                    status=200,
                    ok=True,
                    durationMs=300,
                ),
            ),
        ]
    )
    assert spans[0].status == "ERROR" and spans[0].attributes["error.type"] == "TypeError"
    orphan = spans[1]
    assert orphan.start_ns == (T0 + 600) * MS and orphan.attributes["coder.unmatched"] is True
    assert conv.counters["unmatched_ends"] == 1


def test_reader_race_from_the_0_7_0_readme() -> None:
    """A superseded reader's late ws:close after the next reader's ws:dial closes its own span."""
    spans, conv = run(
        [
            (SRC, ev("ws:dial", 0, chatId=CHAT, reader=1, attempt=1, url="wss://c/x")),
            (SRC, ev("ws:open", 10, chatId=CHAT, reader=1, attempt=1)),
            (SRC, ev("ws:dial", 500, chatId=CHAT, reader=2, attempt=1, url="wss://c/x")),
            (SRC, ev("ws:close", 520, chatId=CHAT, reader=1, attempt=1)),  # late, superseded
            (
                SRC,
                ev(
                    "ws:event",
                    530,
                    chatId=CHAT,
                    reader=2,
                    attempt=1,
                    event={"type": "status", "status": {"status": "running"}},
                ),
            ),
            (SRC, ev("ws:close", 900, chatId=CHAT, reader=2, attempt=1, code=1006, reason="gone")),
        ]
    )
    first, second = spans
    assert first.attributes["coder.stream.reader"] == 1
    assert (first.start_ns, first.end_ns) == (T0 * MS, (T0 + 520) * MS)
    assert second.attributes["coder.stream.reader"] == 2
    assert second.start_ns == (T0 + 500) * MS and second.attributes["coder.ws.events"] == 1
    assert second.status == "ERROR" and second.attributes["coder.ws.close_code"] == 1006
    assert [e.name for e in second.events] == ["stream.status"]
    assert first.status == "UNSET" and [e.name for e in first.events] == ["ws.open"]
    assert conv.open_pairs == 0


def test_legacy_events_without_reader_pair_when_not_interleaved() -> None:
    """SDK < 0.7.0 events (no reader) pair in sequence; an interleaved duplicate is retired."""
    spans, conv = run(
        [
            (SRC, ev("ws:dial", 0, chatId=CHAT, attempt=1, url="wss://c")),
            (SRC, ev("ws:close", 100, chatId=CHAT, attempt=1)),
            (SRC, ev("ws:dial", 200, chatId=CHAT, attempt=1, url="wss://c")),
            (SRC, ev("ws:dial", 300, chatId=CHAT, attempt=1, url="wss://c")),  # interleaved
            (SRC, ev("ws:close", 400, chatId=CHAT, attempt=1)),
        ]
    )
    assert [(s.start_ns // MS - T0, s.end_ns // MS - T0, s.status) for s in spans] == [
        (0, 100, "UNSET"),
        (200, 200, "ERROR"),
        (300, 400, "UNSET"),
    ]
    assert conv.counters["superseded"] == 1 and conv.open_pairs == 0


def test_segments_of_two_agents_do_not_cross() -> None:
    """Two agents in one process both emit segment 1: the sender's agent keeps them apart."""
    spans, _ = run(
        [
            (SRC, ev("segment:start", 0, segment=1)),
            (OTHER, ev("segment:start", 5, segment=1, chatId=CHAT)),
            (
                OTHER,
                ev(
                    "segment:settle",
                    50,
                    segment=1,
                    chatId=CHAT,
                    durationMs=45,
                    status="waiting",
                    finishReason="stop",
                ),
            ),
            (
                SRC,
                ev(
                    "segment:settle",
                    80,
                    segment=1,
                    chatId=CHAT,
                    durationMs=80,
                    error={"name": "CoderStreamError", "message": "redials exhausted"},
                ),
            ),
        ]
    )
    other, mine = spans
    assert other.source == OTHER and other.start_ns == (T0 + 5) * MS
    assert other.attributes["coder.finish_reason"] == "stop" and other.status == "UNSET"
    assert mine.source == SRC and mine.status == "ERROR"
    assert mine.attributes["error.type"] == "CoderStreamError"
    assert mine.description == "redials exhausted" and mine.kind == "INTERNAL"


def test_segment_teardown_and_unmatched_settle() -> None:
    """A settle with neither status nor error is a teardown; one with no start still spans."""
    spans, _ = run(
        [
            (SRC, ev("segment:start", 0, segment=3)),
            (SRC, ev("segment:settle", 10, segment=3, durationMs=10)),
            (
                SRC,
                ev(
                    "segment:settle",
                    100,
                    segment=9,
                    durationMs=40,
                    status="error",
                    error={"name": "TimeoutError", "message": "deadline"},
                ),
            ),
        ]
    )
    assert spans[0].attributes["coder.segment.outcome"] == "teardown"
    assert spans[1].start_ns == (T0 + 60) * MS and spans[1].attributes["coder.unmatched"]


def test_segment_links_to_its_connections_and_carries_redials() -> None:
    """A segment links to the connections (same chat, reader, overlapping time) that served
    it; a redial during the segment is one of its span events."""
    spans, _ = run(
        [
            (SRC, ev("segment:start", 0, segment=1, chatId=CHAT)),
            (SRC, ev("ws:dial", 5, chatId=CHAT, reader=4, attempt=1, url="wss://c")),
            (SRC, ev("ws:close", 100, chatId=CHAT, reader=4, attempt=1, code=1006, reason="")),
            (
                SRC,
                ev(
                    "ws:redial",
                    101,
                    chatId=CHAT,
                    reader=4,
                    attempt=1,
                    consecutiveFailures=1,
                    maxConsecutiveFailures=5,
                    backoffMs=1000,
                ),
            ),
            (SRC, ev("ws:dial", 1101, chatId=CHAT, reader=4, attempt=2, url="wss://c")),
            (
                SRC,
                ev(
                    "segment:settle",
                    1500,
                    segment=1,
                    chatId=CHAT,
                    reader=4,
                    durationMs=1500,
                    status="waiting",
                    finishReason="stop",
                ),
            ),
            (SRC, ev("ws:dial", 9000, chatId=CHAT, reader=5, attempt=1, url="wss://c")),
            (SRC, ev("ws:close", 9100, chatId=CHAT, reader=5, attempt=1)),
        ]
    )
    conn1, segment, unrelated = spans
    linked = {lk.span_id for lk in segment.links}
    assert conn1.span_id in linked and unrelated.span_id not in linked
    assert len(segment.links) == 2, "the closed and the still-open attempt"
    redial = [e for e in segment.events if e.name == "ws.redial"]
    assert redial and redial[0].attributes["coder.backoffMs"] == 1000


def test_out_of_order_close_before_dial() -> None:
    """A close that overtakes its dial spans on its own; the late dial is later unsettled."""
    spans, conv = run(
        [
            (SRC, ev("ws:close", 10, chatId=CHAT, reader=1, attempt=1)),
            (SRC, ev("ws:dial", 0, chatId=CHAT, reader=1, attempt=1, url="wss://c")),
        ],
        horizon_ms=1000,
    )
    assert spans[0].attributes["coder.unmatched"] is True
    late = conv.expire(T0 + 5000)
    assert late[0].status == "ERROR" and late[0].attributes["coder.unsettled.reason"] == "horizon"
    assert conv.open_pairs == 0


def test_open_pairs_are_capped_oldest_evicted() -> None:
    """Past max_open, the oldest open pair is emitted as an unsettled ERROR span and counted."""
    events = [(SRC, ev("http:request", i, id=i, method="GET", path="/x")) for i in range(20)]
    spans, conv = run(events, max_open=16)
    assert len(spans) == 4 and conv.open_pairs == 16 and conv.counters["evicted"] == 4
    assert all(s.attributes["coder.unsettled.reason"] == "evicted" for s in spans)
    assert [s.start_ns // MS - T0 for s in spans] == [0, 1, 2, 3]


def test_ws_events_are_counted_not_spanned() -> None:
    """Hundreds of frames make one span with a count and a few meaningful events."""
    frames = [
        (
            SRC,
            ev(
                "ws:event",
                i,
                chatId=CHAT,
                reader=1,
                attempt=1,
                event={"type": "message_part", "message_part": {}},
            ),
        )
        for i in range(1, 300)
    ]
    spans, conv = run(
        [
            (SRC, ev("ws:dial", 0, chatId=CHAT, reader=1, attempt=1, url="u")),
            *frames,
            (
                SRC,
                ev(
                    "ws:event",
                    301,
                    chatId=CHAT,
                    reader=1,
                    attempt=1,
                    event={"type": "error", "error": {"message": "boom"}},
                ),
            ),
            (SRC, ev("ws:close", 400, chatId=CHAT, reader=1, attempt=1)),
        ]
    )
    (s,) = spans
    assert s.attributes["coder.ws.events"] == 300 and conv.counters["ws_events"] == 300
    assert [e.name for e in s.events] == ["stream.error"]


@pytest.mark.parametrize(
    ("path", "templated", "chat"),
    [
        (f"/api/v2/chats/{CHAT}", "/api/v2/chats/{chat}", CHAT),
        ("/api/v2/chats?limit=100&after_id=" + CHAT, "/api/v2/chats", None),
        (f"/api/v2/workspaces/{CHAT}", "/api/v2/workspaces/{id}", None),
    ],
)
def test_path_templating(path: str, templated: str, chat: str | None) -> None:
    """Chat ids become {chat}, other ids {id}; queries never reach a span name."""
    assert template_path(path) == (templated, chat)


def test_ndjson_batch_names_line_and_field() -> None:
    """A bad NDJSON line is reported by number and field; nothing of the batch is returned."""
    good = json.dumps({"type": "segment:start", "timestamp": T0, "segment": 1})
    bad = json.dumps(
        {"type": "ws:dial", "timestamp": T0, "chatId": CHAT, "attempt": "1", "url": "u"}
    )
    body = f"{good}\n{bad}\n".encode()
    with pytest.raises(IngestError, match=r"line 2\.attempt"):
        parse_batch(
            body, content_type="application/x-ndjson", query={"service": "s", "instance": "i"}
        )
    ok = parse_batch(
        f"{good}\n{good}\n".encode(),
        content_type="application/x-ndjson",
        query={"service": "s", "instance": "i"},
    )
    assert len(ok) == 2 and ok[0][0] == EventSource("s", "i", None)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"events": []}, "body.source"),
        ({"source": {"service": "s"}, "events": []}, "body.source.instance"),
        (
            {"source": {"service": "s", "instance": "i"}, "events": [{"type": 5, "timestamp": 1}]},
            "events[0].type",
        ),
        (
            {"source": {"service": "s", "instance": "i"}, "events": [{"type": "segment:start"}]},
            "events[0].timestamp",
        ),
        (
            {
                "source": {"service": "s", "instance": "i"},
                "events": [
                    {
                        "type": "http:response",
                        "timestamp": 1,
                        "id": "x",
                        "method": "GET",
                        "path": "/",
                        "status": True,
                        "durationMs": 1,
                    }
                ],
            },
            "events[0].status",
        ),
    ],
)
def test_envelope_validation(body: dict[str, Any], problem: str) -> None:
    """Envelope problems name the field."""
    with pytest.raises(IngestError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_batch(json.dumps(body).encode(), content_type="application/json", query={})


def test_bare_ndjson_events_need_a_sender() -> None:
    """A bare event without ?service=&instance= is refused."""
    with pytest.raises(IngestError, match="service"):
        parse_batch(
            b'{"type":"segment:start","timestamp":1,"segment":1}\n{"type":"x"}\n',
            content_type="application/x-ndjson",
            query={},
        )


def test_work_per_event_does_not_grow_with_open_pairs() -> None:
    """With 20 000 open request pairs and 200 open segments, 1 000 redials and 200 settles
    look at O(1) open pairs each (the converter indexes by sender and chat)."""
    conv = SpanConverter(rng=random.Random(1), max_open=50_000)
    chats = [f"0b7c0000-0000-4000-8000-{i:012d}" for i in range(200)]
    for i in range(20_000):
        conv.feed(SRC, ev("http:request", i, id=f"r{i}", method="GET", path="/api/v2/chats"))
    for i, chat in enumerate(chats):
        conv.feed(SRC, ev("segment:start", i, segment=i, chatId=chat))
        conv.feed(SRC, ev("ws:dial", i, chatId=chat, reader=1, attempt=1))
    for i in range(1_000):
        conv.feed(SRC, ev("ws:redial", 100 + i, chatId=chats[i % 200], reader=1, attempt=2))
    assert conv.counters["scanned"] <= 1_000
    for i, chat in enumerate(chats):
        (span,) = conv.feed(SRC, ev("segment:settle", 2_000 + i, segment=i, chatId=chat, reader=1))
        assert len(span.links) == 1 and len(span.events) == 5
    assert conv.counters["scanned"] <= 1_000 + 2 * 200


def test_redials_waiting_for_a_connection_are_capped() -> None:
    """Redials with no segment or connection to carry them keep only the latest few."""
    conv = SpanConverter(rng=random.Random(1))
    for i in range(100):
        conv.feed(SRC, ev("ws:redial", i, chatId=CHAT, reader=1, attempt=i))
    conv.feed(SRC, ev("ws:dial", 200, chatId=CHAT, reader=1, attempt=100))
    (span,) = conv.feed(SRC, ev("ws:close", 300, chatId=CHAT, reader=1, attempt=100, code=1000))
    assert len(span.events) == 32 and conv.counters["redials_dropped"] == 68
    assert span.events[-1].attributes["coder.attempt"] == 99


async def test_the_pipeline_gives_the_loop_back_between_batches() -> None:
    """A queue of 5 000 events is converted in batches with the loop running in between,
    so a flood never holds the event loop (and /healthz) for its whole length."""
    import asyncio

    from watchd.telemetry.pipeline import BATCH, SpanPipeline

    pipeline = SpanPipeline(converter=SpanConverter(rng=random.Random(1)), export=None)
    for i in range(5_000):
        pipeline.sink.queue.put_nowait((SRC, ev("http:request", i, id=f"r{i}", path="/x")))
    ticks = 0
    task = asyncio.create_task(pipeline.run())
    try:
        while not pipeline.sink.queue.empty():
            ticks += 1
            await asyncio.sleep(0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert pipeline.batches >= 5_000 // (BATCH + 1)
    assert ticks >= pipeline.batches - 1


def test_a_secret_echoed_into_an_error_never_reaches_a_span() -> None:
    """An error event quoting a registered secret (a server echoing the token) becomes a
    span whose description has it redacted."""
    from watchd.kits.redaction import REGISTRY

    secret = "tok-9f8e7d6c5b4a3210fedcba"
    REGISTRY.add(secret)
    spans, _ = run(
        [
            (SRC, ev("http:request", 0, id="r1", method="GET", path="/api/v2/chats")),
            (SRC, ev("http:error", 5, id="r1", message=f"ClientError: bad token {secret}")),
        ]
    )
    assert secret not in spans[0].description and "[REDACTED]" in spans[0].description


def _event_corpus() -> list[Any]:
    """Valid events of every type, and each one broken every way a field can be."""
    base: dict[str, dict[str, Any]] = {
        "http:request": {"id": "r1", "method": "GET", "path": "/api/v2/chats"},
        "http:response": {"id": 7, "method": "GET", "path": "/x", "status": 200, "durationMs": 3},
        "http:error": {"id": "r", "method": "GET", "path": "/x", "message": "m", "durationMs": 1.5},
        "ws:dial": {"chatId": "c", "attempt": 1, "url": "wss://x"},
        "ws:open": {"chatId": "c", "attempt": 1},
        "ws:event": {"chatId": "c", "attempt": 1, "event": {"kind": "status_change"}},
        "ws:close": {"chatId": "c", "attempt": 1, "code": 1000, "reason": "bye"},
        "ws:error": {"chatId": "c", "attempt": 2, "message": "m"},
        "ws:redial": {
            "chatId": "c",
            "attempt": 2,
            "consecutiveFailures": 1,
            "maxConsecutiveFailures": 5,
            "backoffMs": 250,
        },
        "segment:start": {"segment": 1, "chatId": "c"},
        "segment:settle": {"segment": 1, "durationMs": 9, "ok": True, "finishReason": "stop"},
    }
    wrong: list[Any] = [None, True, False, "s", 3, -1, 2.5, [], {}]
    out: list[Any] = [None, "event", 3, [], {"timestamp": 1}, {"type": 5, "timestamp": 1}]
    out.append({"type": "nope", "timestamp": 1})
    for kind, fields in base.items():
        good = {"type": kind, "timestamp": 1_764_437_000_000, **fields}
        out.append(good)
        for name in [*good, "reader", "code", "reason", "ok", "status", "error", "event"]:
            out.append({k: v for k, v in good.items() if k != name})
            out.extend({**good, name: value} for value in wrong)
    return out


def test_the_event_check_follows_the_kinds() -> None:
    """Every kind's well-formed event is accepted; each of its required fields missing,
    and each field set to a JSON type its kind does not admit, is refused naming the field."""
    from watchd.telemetry.ingest import check_event
    from watchd.telemetry.kinds import RULES

    answers = []
    for ev in _event_corpus():
        try:
            check_event(ev, "e")
            accepted = True
        except IngestError as exc:
            accepted = False
            assert str(exc).startswith("e.") or str(exc) == "e: expected an event object", exc
        answers.append(accepted)
        kind = ev.get("type") if isinstance(ev, dict) else None
        rules = RULES.get(kind) if isinstance(kind, str) else None
        for name, admitted, required, nullable in rules or ():
            value = ev.get(name)
            missing = value is None and required and not (nullable and name in ev)
            mistyped = value is not None and (
                (type(value) is bool and bool not in admitted) or not isinstance(value, admitted)
            )
            if missing or mistyped:
                assert not accepted, ev
    assert answers.count(True) > 100 and answers.count(False) > 500  # both sides exercised


FIXTURES = Path(__file__).parent.parent / "fixtures" / "sdk-events"


@pytest.mark.parametrize("version", ["0.6.1", "0.6.3", "0.7.0"])
def test_every_sdk_versions_events_are_accepted_and_become_spans(version: str) -> None:
    """The events each SDK version documents (0.6.1 settles without durationMs, before
    0.7.0 no reader) pass ingest validation and become the same spans: two stream
    connections, two segments (one ERROR with the error's name), two HTTP spans."""
    body = (FIXTURES / f"{version}.ndjson").read_bytes()
    batch = parse_batch(
        body, content_type="application/x-ndjson", query={"service": "agent", "instance": "i"}
    )
    spans, conv = run([(src, e) for src, e in batch])
    names = sorted(s.name for s in spans)
    assert names == [
        "POST /api/experimental/chats",
        "POST /api/experimental/chats/{chat}/messages",
        "chat.segment",
        "chat.segment",
        "chat.stream",
        "chat.stream",
    ], names
    failed = [s for s in spans if s.name == "chat.segment" and s.status == "ERROR"]
    assert [s.attributes.get("error.type") for s in failed] == ["CoderChatError"]
    assert conv.counters["unknown_type"] == 0


def test_an_unknown_kind_is_accepted_counted_and_not_exported() -> None:
    """A well-formed event of a kind this build does not know (a later SDK's) is accepted
    with its batch, counted by the converter and turned into no span; an event with no
    type or a timestamp that is not a number still refuses the whole batch."""
    later = {"type": "turn:checkpoint", "timestamp": 1_764_437_000_000, "anything": [1]}
    start = {"type": "segment:start", "timestamp": 1_764_437_000_001, "segment": 1}
    body = json.dumps({"source": {"service": "s", "instance": "i"}, "events": [later, start]})
    batch = parse_batch(body.encode(), content_type="application/json", query={})
    assert [e["type"] for _, e in batch] == ["turn:checkpoint", "segment:start"]
    spans, conv = run(batch)
    assert spans == [] and conv.counters["unknown_type"] == 1
    for bad in ({"timestamp": 1}, {"type": "turn:checkpoint", "timestamp": "soon"}):
        body = json.dumps({"source": {"service": "s", "instance": "i"}, "events": [start, bad]})
        with pytest.raises(IngestError, match=r"events\[1\]\.(type|timestamp)"):
            parse_batch(body.encode(), content_type="application/json", query={})
