"""Transport and segment events → span records (docs/forwarding-events.md). Pure.

Pairs are keyed so that concurrency cannot cross wires:

- HTTP: (sender, request id);
- connections: (sender, chatId, reader, attempt) — never (chatId, attempt): a superseded
  reader's late ``ws:close`` after the next reader's ``ws:dial`` closes its own span.
  Events without ``reader`` (SDK < 0.7.0) key on reader ``None``; a second dial on the same
  key retires the first as unsettled rather than guessing;
- segments: (sender incl. agent, segment).

Open pairs are bounded by a horizon and a cap; what falls out becomes an ERROR span marked
unsettled and is counted. Every event costs O(1) however many pairs are open: open
segments and connections are indexed by (sender, chat), so a redial or a segment's links
never scan the open table, and redials waiting for their connection are capped per
connection. Ends with no start still become spans (start = end − durationMs).
Timestamps come from the events, never from when we processed them. IDs are allocated
here, so a segment can link to the connections that served it.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchd.kits.redaction import REGISTRY
from watchd.telemetry.events import EventSource

MS = 1_000_000  # ns per ms
UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
CHAT_IN_PATH = re.compile(r"/chats/(" + UUID.pattern + r")")
MEANINGFUL_STREAM_EVENTS = frozenset({"status", "error", "retry", "action_required"})
MAX_SPAN_EVENTS = 32
RECENT_CONNECTIONS = 8
# Redial events kept per (sender, chat, reader) until a dial picks them up.
MAX_PENDING_REDIALS = MAX_SPAN_EVENTS


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanLink:
    trace_id: int
    span_id: int
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRecord:
    trace_id: int
    span_id: int
    name: str
    kind: str  # CLIENT | INTERNAL
    start_ns: int
    end_ns: int
    source: EventSource
    attributes: Mapping[str, Any]
    status: str = "UNSET"  # UNSET | ERROR
    description: str = ""
    events: tuple[SpanEvent, ...] = ()
    links: tuple[SpanLink, ...] = ()


@dataclass
class _Open:
    trace_id: int
    span_id: int
    name: str
    kind: str
    start_ns: int
    source: EventSource
    attributes: dict[str, Any]
    events: list[SpanEvent] = field(default_factory=list)
    last_ns: int = 0
    error: str = ""

    def finish(
        self,
        end_ns: int,
        status: str = "UNSET",
        description: str = "",
        links: tuple[SpanLink, ...] = (),
    ) -> SpanRecord:
        return SpanRecord(
            self.trace_id,
            self.span_id,
            self.name,
            self.kind,
            self.start_ns,
            max(end_ns, self.start_ns),
            self.source,
            self.attributes,
            status,
            # An error text may quote what a server echoed (a token): scrubbed here, the
            # one place every span description passes.
            REGISTRY.scrub(description) if description else description,
            tuple(self.events),
            links,
        )


def template_path(path: str) -> tuple[str, str | None]:
    """(low-cardinality path with ids templated out and no query, the chat id if any)."""
    bare = path.split("?", 1)[0]
    m = CHAT_IN_PATH.search(bare)
    chat = m.group(1) if m else None
    templated = CHAT_IN_PATH.sub("/chats/{chat}", bare)
    templated = UUID.sub("{id}", templated)
    return templated, chat


def _error_type(message: str) -> str:
    m = re.match(r"([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception|Timeout))\b", message)
    return m.group(1) if m else "_OTHER"


class SpanConverter:
    """Feed events in; get finished span records out."""

    def __init__(
        self, *, horizon_ms: int = 600_000, max_open: int = 20_000, rng: random.Random | None = None
    ) -> None:
        self.horizon_ms = horizon_ms
        self.max_open = max_open
        self._rng = rng or random.Random()
        self._open: OrderedDict[tuple[Any, ...], _Open] = OrderedDict()
        self._recent: OrderedDict[tuple[Any, ...], deque[tuple[int, int, int, int]]] = OrderedDict()
        self._pending_redials: OrderedDict[tuple[Any, ...], deque[SpanEvent]] = OrderedDict()
        # (kind, sender, chat) -> keys of open segments / connections, oldest first.
        self._index: dict[tuple[Any, ...], dict[tuple[Any, ...], None]] = {}
        self.counters = {
            "events": 0,
            "spans": 0,
            "unmatched_ends": 0,
            "evicted": 0,
            "unsettled": 0,
            "superseded": 0,
            "ws_events": 0,
            "unknown_type": 0,  # accepted at ingest (a later SDK's kind), not exported
            "redials_dropped": 0,
            # Open pairs looked at while handling events: stays O(events), never O(open).
            "scanned": 0,
        }

    # -- ids --------------------------------------------------------------------------

    def _ids(self) -> tuple[int, int]:
        return self._rng.getrandbits(128) or 1, self._rng.getrandbits(64) or 1

    @staticmethod
    def _who(source: EventSource) -> tuple[str, str, str | None]:
        return (source.service, source.instance, source.agent)

    # -- intake -----------------------------------------------------------------------

    def feed(self, source: EventSource, event: Mapping[str, Any]) -> list[SpanRecord]:
        self.counters["events"] += 1
        kind = str(event.get("type", ""))
        ts = int(event.get("timestamp", 0)) * MS
        handler = {
            "http:request": self._http_request,
            "http:response": self._http_end,
            "http:error": self._http_end,
            "ws:dial": self._ws_dial,
            "ws:open": self._ws_mark,
            "ws:error": self._ws_mark,
            "ws:event": self._ws_event,
            "ws:close": self._ws_close,
            "ws:redial": self._ws_redial,
            "segment:start": self._segment_start,
            "segment:settle": self._segment_settle,
        }.get(kind)
        if handler is None:
            self.counters["unknown_type"] += 1
            return []
        out = handler(source, event, ts)
        self.counters["spans"] += len(out)
        return out

    @staticmethod
    def _index_key(key: tuple[Any, ...], item: _Open) -> tuple[Any, ...] | None:
        if key[0] == "segment":
            return ("segment", key[1], item.attributes.get("coder.chat.id"))
        if key[0] == "ws":
            return ("ws", key[1], key[2])
        return None

    def _pop(self, key: tuple[Any, ...]) -> _Open | None:
        item = self._open.pop(key, None)
        if item is not None:
            ikey = self._index_key(key, item)
            if ikey is not None:
                keys = self._index.get(ikey)
                if keys is not None:
                    keys.pop(key, None)
                    if not keys:
                        del self._index[ikey]
        return item

    def _store(self, key: tuple[Any, ...], item: _Open) -> list[SpanRecord]:
        out: list[SpanRecord] = []
        if key in self._open:
            # Same key while open: only possible for legacy (reader-less) interleaving.
            self.counters["superseded"] += 1
            old = self._pop(key)
            assert old is not None
            out.append(self._unsettled(old, "superseded"))
        self._open[key] = item
        ikey = self._index_key(key, item)
        if ikey is not None:
            self._index.setdefault(ikey, {})[key] = None
        while len(self._open) > self.max_open:
            oldest_key = next(iter(self._open))
            oldest = self._pop(oldest_key)
            assert oldest is not None
            self.counters["evicted"] += 1
            out.append(self._unsettled(oldest, "evicted"))
        return out

    def _indexed(self, kind: str, src: EventSource, chat: Any) -> list[tuple[Any, ...]]:
        keys = list(self._index.get((kind, self._who(src), chat), ()))
        self.counters["scanned"] += len(keys)
        return keys

    def _unsettled(self, o: _Open, why: str) -> SpanRecord:
        self.counters["unsettled"] += 1
        attrs = {**o.attributes, "coder.unsettled": True, "coder.unsettled.reason": why}
        o.attributes = attrs
        return o.finish(o.last_ns, "ERROR", f"no end event ({why})")

    def expire(self, now_ms: int) -> list[SpanRecord]:
        """Close pairs open longer than the horizon as unsettled ERROR spans."""
        limit = (now_ms - self.horizon_ms) * MS
        out = []
        for key in [k for k, o in self._open.items() if o.start_ns < limit]:
            item = self._pop(key)
            assert item is not None
            out.append(self._unsettled(item, "horizon"))
        self.counters["spans"] += len(out)
        return out

    @property
    def open_pairs(self) -> int:
        return len(self._open)

    # -- http -------------------------------------------------------------------------

    def _http_request(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        method = str(ev.get("method", "GET")).upper()
        path, chat = template_path(str(ev.get("path", "")))
        attrs: dict[str, Any] = {"http.request.method": method, "url.path": path}
        if chat:
            attrs["coder.chat.id"] = chat
        trace, span = self._ids()
        key = ("http", self._who(src), str(ev.get("id")))
        return self._store(
            key, _Open(trace, span, f"{method} {path}", "CLIENT", ts, src, attrs, last_ns=ts)
        )

    def _http_end(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        key = ("http", self._who(src), str(ev.get("id")))
        o = self._pop(key)
        if o is None:
            self.counters["unmatched_ends"] += 1
            method = str(ev.get("method", "GET")).upper()
            path, chat = template_path(str(ev.get("path", "")))
            duration = ev.get("durationMs")
            start = ts - int(float(duration) * MS) if isinstance(duration, int | float) else ts
            trace, span = self._ids()
            attrs: dict[str, Any] = {
                "http.request.method": method,
                "url.path": path,
                "coder.unmatched": True,
            }
            if chat:
                attrs["coder.chat.id"] = chat
            o = _Open(trace, span, f"{method} {path}", "CLIENT", start, src, attrs)
        status, description = "UNSET", ""
        if ev.get("type") == "http:response":
            code = ev.get("status")
            if isinstance(code, int):
                o.attributes["http.response.status_code"] = code
                if code >= 400:
                    status = "ERROR"
                    o.attributes["error.type"] = str(code)
        else:
            message = str(ev.get("message", ""))[:300]
            status, description = "ERROR", message
            o.attributes["error.type"] = _error_type(message)
        return [o.finish(ts, status, description)]

    # -- websocket connections ----------------------------------------------------------

    @staticmethod
    def _reader(ev: Mapping[str, Any]) -> int | None:
        r = ev.get("reader")
        return r if isinstance(r, int) else None

    def _conn_key(self, src: EventSource, ev: Mapping[str, Any]) -> tuple[Any, ...]:
        return ("ws", self._who(src), ev.get("chatId"), self._reader(ev), ev.get("attempt"))

    def _ws_dial(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        chat = ev.get("chatId")
        reader = self._reader(ev)
        attrs: dict[str, Any] = {"coder.stream.attempt": ev.get("attempt", 0), "coder.ws.events": 0}
        if chat:
            attrs["coder.chat.id"] = chat
        if reader is not None:
            attrs["coder.stream.reader"] = reader
        url = ev.get("url")
        if isinstance(url, str):
            attrs["url.full"] = url.split("?", 1)[0]
        trace, span = self._ids()
        o = _Open(
            trace,
            span,
            "chat.stream" if chat else "chat.watch",
            "CLIENT",
            ts,
            src,
            attrs,
            last_ns=ts,
        )
        o.events.extend(self._pending_redials.pop(("redial", self._who(src), chat, reader), ()))
        return self._store(self._conn_key(src, ev), o)

    def _event(self, o: _Open, e: SpanEvent) -> None:
        if len(o.events) < MAX_SPAN_EVENTS:
            o.events.append(e)
        o.last_ns = max(o.last_ns, e.time_ns)

    def _ws_mark(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        o = self._open.get(self._conn_key(src, ev))
        if o is None:
            return []
        if ev.get("type") == "ws:error":
            message = str(ev.get("message", ""))[:300]
            o.error = message
            self._event(o, SpanEvent("ws.error", ts, {"message": message}))
        else:
            self._event(o, SpanEvent("ws.open", ts))
        return []

    def _ws_event(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        self.counters["ws_events"] += 1
        o = self._open.get(self._conn_key(src, ev))
        if o is None:
            return []
        o.attributes["coder.ws.events"] = int(o.attributes.get("coder.ws.events", 0)) + 1
        o.last_ns = max(o.last_ns, ts)
        inner = ev.get("event")
        if isinstance(inner, Mapping) and inner.get("type") in MEANINGFUL_STREAM_EVENTS:
            attrs: dict[str, Any] = {"coder.stream.event": str(inner.get("type"))}
            payload = inner.get(str(inner.get("type")))
            if isinstance(payload, Mapping):
                for k in ("status", "message", "kind", "attempt", "delay_ms"):
                    v = payload.get(k)
                    if isinstance(v, str | int | float | bool):
                        attrs[f"coder.{k}"] = v if not isinstance(v, str) else v[:200]
            self._event(o, SpanEvent(f"stream.{inner.get('type')}", ts, attrs))
        return []

    def _ws_close(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        o = self._pop(self._conn_key(src, ev))
        if o is None:
            self.counters["unmatched_ends"] += 1
            trace, span = self._ids()
            chat = ev.get("chatId")
            attrs: dict[str, Any] = {
                "coder.stream.attempt": ev.get("attempt", 0),
                "coder.unmatched": True,
            }
            if chat:
                attrs["coder.chat.id"] = chat
            if self._reader(ev) is not None:
                attrs["coder.stream.reader"] = self._reader(ev)
            o = _Open(
                trace, span, "chat.stream" if chat else "chat.watch", "CLIENT", ts, src, attrs
            )
        code = ev.get("code")
        if isinstance(code, int):
            o.attributes["coder.ws.close_code"] = code
            reason = ev.get("reason")
            if isinstance(reason, str) and reason:
                o.attributes["coder.ws.close_reason"] = reason[:200]
        status, description = "UNSET", ""
        if o.error or (isinstance(code, int) and code not in (1000, 1001)):
            status = "ERROR"
            description = o.error or f"closed with {code}"
            o.attributes["error.type"] = "ws_error" if o.error else f"ws_close_{code}"
        end = max(ts, o.start_ns)
        recent_key = (
            self._who(src),
            o.attributes.get("coder.chat.id"),
            o.attributes.get("coder.stream.reader"),
        )
        ring = self._recent.setdefault(recent_key, deque(maxlen=RECENT_CONNECTIONS))
        ring.append((o.trace_id, o.span_id, o.start_ns, end))
        self._recent.move_to_end(recent_key)
        while len(self._recent) > self.max_open:
            self._recent.popitem(last=False)
        return [o.finish(end, status, description)]

    def _ws_redial(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        attrs = {
            k: ev[k]
            for k in ("attempt", "consecutiveFailures", "maxConsecutiveFailures", "backoffMs")
            if isinstance(ev.get(k), int | float)
        }
        e = SpanEvent("ws.redial", ts, {f"coder.{k}": v for k, v in attrs.items()})
        chat, reader = ev.get("chatId"), self._reader(ev)
        seg = self._segment_for(src, chat, reader)
        if seg is not None:
            self._event(seg, e)
        else:
            key = ("redial", self._who(src), chat, reader)
            pending = self._pending_redials.get(key)
            if pending is None:
                pending = self._pending_redials[key] = deque(maxlen=MAX_PENDING_REDIALS)
            if len(pending) == MAX_PENDING_REDIALS:
                self.counters["redials_dropped"] += 1  # the oldest goes; the latest matter
            pending.append(e)
            self._pending_redials.move_to_end(key)
            while len(self._pending_redials) > self.max_open:
                self._pending_redials.popitem(last=False)
        return []

    # -- segments ---------------------------------------------------------------------

    def _segment_for(self, src: EventSource, chat: Any, reader: int | None) -> _Open | None:
        for key in reversed(self._indexed("segment", src, chat)):
            o = self._open[key]
            if o.attributes.get("coder.stream.reader", reader) == reader:
                return o
        return None

    def _segment_start(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        attrs: dict[str, Any] = {"coder.segment": ev.get("segment", 0)}
        if ev.get("chatId"):
            attrs["coder.chat.id"] = ev["chatId"]
        trace, span = self._ids()
        key = ("segment", self._who(src), ev.get("segment"))
        return self._store(
            key, _Open(trace, span, "chat.segment", "INTERNAL", ts, src, attrs, last_ns=ts)
        )

    def _segment_settle(self, src: EventSource, ev: Mapping[str, Any], ts: int) -> list[SpanRecord]:
        key = ("segment", self._who(src), ev.get("segment"))
        o = self._pop(key)
        if o is None:
            self.counters["unmatched_ends"] += 1
            duration = ev.get("durationMs")
            start = ts - int(float(duration) * MS) if isinstance(duration, int | float) else ts
            trace, span = self._ids()
            o = _Open(
                trace,
                span,
                "chat.segment",
                "INTERNAL",
                start,
                src,
                {"coder.segment": ev.get("segment", 0), "coder.unmatched": True},
            )
        chat = ev.get("chatId")
        if chat:
            o.attributes["coder.chat.id"] = chat
        reader = self._reader(ev)
        if reader is not None:
            o.attributes["coder.stream.reader"] = reader
        status, description = "UNSET", ""
        if isinstance(ev.get("status"), str):
            o.attributes["coder.chat.status"] = ev["status"]
        error = ev.get("error")
        if isinstance(error, Mapping):
            status = "ERROR"
            o.attributes["error.type"] = str(error.get("name", "Error"))
            description = str(error.get("message", ""))[:500]
            o.attributes["coder.segment.outcome"] = "failure"
        elif isinstance(ev.get("finishReason"), str):
            o.attributes["coder.finish_reason"] = ev["finishReason"]
            o.attributes["coder.segment.outcome"] = "settled"
        else:
            o.attributes["coder.segment.outcome"] = "teardown"
        end = max(ts, o.start_ns)
        links = []
        for trace_id, span_id, c_start, c_end in self._recent.get(
            (self._who(src), chat, reader), ()
        ):
            if c_start <= end and c_end >= o.start_ns:
                links.append(SpanLink(trace_id, span_id, {"coder.link": "served_by"}))
        for ckey in self._indexed("ws", src, chat):
            c = self._open[ckey]
            if ckey[3] == reader and c.start_ns <= end:
                links.append(SpanLink(c.trace_id, c.span_id, {"coder.link": "served_by"}))
        return [o.finish(end, status, description, tuple(links))]
