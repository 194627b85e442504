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
from watchd.coder.models import MalformedFrame, ServerFrameError, WatchEvent, parse_watch_frame
from watchd.coder.transport import Transport

# Coder pings every 15 s and gives up after 15 s without a pong; our own
# ping on a 20 s cadence notices a dead TCP path within ~30 s.
DEFAULT_HEARTBEAT = 20.0


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
    events: int = 0
    pings: int = 0
    malformed: int = 0
    _closed: bool = field(default=False)

    async def pump(self, on_event: Callable[[WatchEvent], None]) -> None:
        """Decode frames and hand each event to ``on_event`` until the connection ends
        (raises StreamClosed / ResyncNeeded, or whatever ``on_event`` raises).

        One coroutine for the connection's life, a plain call per event: no async
        generator or future per frame on the hot path.
        """
        receive = self.ws.receive
        text, binary = aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY
        while True:
            try:
                msg = await receive()
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                # e.g. answering a ping on a transport the server is already closing
                raise StreamClosed(1006, f"{type(exc).__name__}: {exc}") from None
            kind = msg.type
            if kind is text or kind is binary:
                try:
                    event = parse_watch_frame(msg.data)
                except MalformedFrame as exc:
                    self.malformed += 1
                    self.transport.emit_ws(
                        "ws:error",
                        reader=self.reader,
                        attempt=self.attempt,
                        message=f"malformed frame: {exc}"[:300],
                    )
                    raise ResyncNeeded(str(exc)) from None
                except ServerFrameError as exc:
                    self.transport.emit_ws(
                        "ws:error",
                        reader=self.reader,
                        attempt=self.attempt,
                        message=f"server error frame: {exc}"[:300],
                    )
                    raise ResyncNeeded(f"server reported: {exc}") from None
                if event is None:
                    self.pings += 1
                    continue
                self.events += 1
                on_event(event)
            elif kind in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
            ):
                code = self.ws.close_code
                raise StreamClosed(code, str(msg.extra or ""))
            elif kind == aiohttp.WSMsgType.ERROR:
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
        self.transport.emit_ws("ws:close", reader=self.reader, attempt=self.attempt, **fields)
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
