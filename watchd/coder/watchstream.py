"""One connection to ``{prefix}/chats/watch``: dial, decode frames, close.

Server-to-client only: we never send a data frame (Coder closes the socket
if we do). Death of a quiet socket is noticed by aiohttp's protocol-level
heartbeat (ping, then close if no pong), not by silence, because eras B–E
send no application keepalives. A frame we cannot understand raises
:class:`ResyncNeeded`; the caller drops the connection and relists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from watchd.coder.errors import CoderError
from watchd.coder.models import MalformedFrame, ServerFrameError
from watchd.coder.observing import WatchEvent
from watchd.coder.transport import Transport
from watchd.coder.wire import read_event
from watchd.telemetry.kinds import WsClose, WsError

# Coder pings every 15 s and gives up after 15 s without a pong; our own
# ping on a 20 s cadence notices a dead TCP path within ~30 s.
DEFAULT_HEARTBEAT = 20.0
# Events handed over in one call at most (aiohttp's read-ahead bounds a burst anyway).
MAX_BURST = 1_000


class ResyncNeeded(Exception):
    """The stream can no longer be trusted (bad frame, overflow): relist."""


class StreamClosed(Exception):
    """The server or the network ended the connection."""

    def __init__(self, code: int | None, reason: str) -> None:
        self.code = code
        self.reason = reason
        super().__init__(f"watch closed (code={code}, reason={reason!r})")


@dataclass
class WatchConnection:
    transport: Transport
    ws: aiohttp.ClientWebSocketResponse
    reader: int
    attempt: int
    events: int = 0  # said in the connection's ws:close
    malformed: int = 0
    _closed: bool = field(default=False)

    async def pump(self, on_events: Callable[[list[WatchEvent]], None]) -> None:
        """Decode frames and hand them to ``on_events`` a burst at a time until the
        connection ends (raises StreamClosed / ResyncNeeded, or whatever ``on_events``
        raises).

        A burst is what aiohttp had already read off the socket: frames are collected
        while its queue holds more, then handed over in one call, so the store and the
        detector pay their per-call costs once per burst rather than once per frame.
        Whatever ends the connection first delivers the events decoded before it. One
        coroutine for the connection's life, no async generator or future per frame.
        """
        receive = self.ws.receive
        # aiohttp's queue of messages already read off the socket (private: without it
        # every burst is one frame, which is correct, only slower). The socket is dialled
        # with autoping off, so every queued message comes out of receive() and a
        # non-empty queue means receive() returns at once.
        queue = getattr(self.ws, "_reader", None)
        if not hasattr(queue, "_size"):
            queue = None
        text, binary = aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY
        ping = aiohttp.WSMsgType.PING
        burst: list[WatchEvent] = []
        decoded = 0  # events decoded, added to self.events when the pump ends
        try:
            while True:
                try:
                    msg = await receive()
                except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                    raise StreamClosed(1006, f"{type(exc).__name__}: {exc}") from None
                kind = msg.type
                if kind is text or kind is binary:
                    try:
                        event = read_event(msg.data)
                    except (MalformedFrame, ServerFrameError) as exc:
                        raise self._unreadable(exc) from None
                    if event is not None:  # None: an era's JSON keep-alive
                        decoded += 1
                        burst.append(event)
                elif kind is ping:
                    # Answered here, not inside receive() (autoping is off): so receive()
                    # never waits while frames are queued, and a burst is never held back.
                    if burst:
                        events, burst = burst, []
                        on_events(events)
                    try:
                        await self.ws.pong(msg.data)
                    except (aiohttp.ClientError, ConnectionError) as exc:
                        # the server is already closing the transport
                        raise StreamClosed(1006, f"{type(exc).__name__}: {exc}") from None
                else:
                    self._check_open(msg)
                if burst and (len(burst) >= MAX_BURST or queue is None or not queue._size):
                    events, burst = burst, []
                    on_events(events)
        except (StreamClosed, ResyncNeeded):
            if burst:
                on_events(burst)
            raise
        finally:
            self.events += decoded

    def _unreadable(self, exc: MalformedFrame | ServerFrameError) -> ResyncNeeded:
        """A frame that cannot be read: said in a ``ws:error``; the listing resyncs."""
        if isinstance(exc, MalformedFrame):
            self.malformed += 1
            said, resync = f"malformed frame: {exc}", str(exc)
        else:
            said, resync = f"server error frame: {exc}", f"server reported: {exc}"
        self.transport.emit_ws(
            WsError, reader=self.reader, attempt=self.attempt, message=said[:300]
        )
        return ResyncNeeded(resync)

    def _check_open(self, msg: aiohttp.WSMessage) -> None:
        """Raise StreamClosed for a message that ends the connection (others pass)."""
        kind = msg.type
        if kind in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
            raise StreamClosed(self.ws.close_code, str(msg.extra or ""))
        if kind == aiohttp.WSMsgType.ERROR:
            raise StreamClosed(1006, f"{type(msg.data).__name__}: {msg.data}")

    async def close(self, *, code: int | None = None, reason: str = "") -> None:
        """Close once, emitting the connection's single ``ws:close``."""
        if self._closed:
            return
        self._closed = True
        fields: dict[str, object] = {"events": self.events}
        if code is not None:
            fields["code"] = code
            fields["reason"] = reason
        self.transport.emit_ws(WsClose, reader=self.reader, attempt=self.attempt, **fields)
        if not self.ws.closed:
            await self.ws.close()


async def open_watch(
    transport: Transport,
    prefix: str,
    *,
    reader: int,
    attempt: int,
    heartbeat: float = DEFAULT_HEARTBEAT,
) -> WatchConnection:
    """Dial the watch socket; a refused upgrade raises CoderError with its status."""
    ws = await transport.ws_connect(
        f"{prefix}/chats/watch", heartbeat=heartbeat, reader=reader, attempt=attempt
    )
    return WatchConnection(transport=transport, ws=ws, reader=reader, attempt=attempt)


__all__ = [
    "DEFAULT_HEARTBEAT",
    "CoderError",
    "ResyncNeeded",
    "StreamClosed",
    "WatchConnection",
    "open_watch",
]
