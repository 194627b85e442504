"""The watch WebSocket (``/chats/watch``): one subscriber per socket, its events sent
as the era frames them, JSON pings on enveloped eras, and drops on demand.

The server calls CloseRead, as coderd does: a data frame from the client is a policy
violation (1008). A drop with code 1006 aborts the TCP connection, like a replica
that vanished; other codes close the socket cleanly with that code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import WSMsgType, web

from watchd.sim.payloads import USER_KEY, http_date
from watchd.sim.records import SimError, Subscriber
from watchd.sim.state import SimState


class WatchSockets:
    """The open watch sockets of one :class:`SimState`, by subscriber."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.sockets: dict[Any, web.WebSocketResponse] = {}
        state.on_drop.append(self.drop)

    def drop(self, sub: Subscriber, code: int) -> None:
        ws = self.sockets.get(sub)
        if ws is None:
            return
        if code == 1006:
            # Abrupt: the TCP connection just goes away.
            transport = ws._req.transport if ws._req is not None else None
            if transport is not None:
                transport.abort()
        with contextlib.suppress(asyncio.QueueFull):
            sub.queue.put_nowait(None)
        ws._sim_close_code = code  # type: ignore[attr-defined]

    def drop_all(self) -> None:
        for sub in list(self.sockets):
            self.drop(sub, 1001)

    async def watch(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        user = request[USER_KEY]
        if request.headers.get("Upgrade", "").lower() != "websocket":
            raise SimError(400, "Expected a WebSocket upgrade.")
        origin = request.headers.get("Origin")
        if origin and origin.split("://", 1)[-1] != request.host:
            raise SimError(403, "Origin not allowed.")
        # Subscribe before accepting: a subscribe failure is an HTTP 500, not a close.
        sub = state.subscribe(user.id, agent=request.headers.get("User-Agent", ""))
        ws = web.WebSocketResponse(heartbeat=state.ping_interval, autoping=True)
        ws.headers["Date"] = http_date(state.now() + state.faults.date_skew)
        try:
            await ws.prepare(request)
        except Exception:
            state.unsubscribe(sub)
            raise
        self.sockets[sub] = ws
        pinger: asyncio.Task[None] | None = None
        sender = asyncio.create_task(self._send_events(ws, sub))
        if state.era.envelope:
            pinger = asyncio.create_task(self._json_pings(ws))
        try:
            async for msg in ws:
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    # The server calls CloseRead: any data frame is a policy violation.
                    state.client_data_frames += 1
                    await ws.close(code=1008, message=b"unexpected data frame")
                    break
        finally:
            for task in (sender, pinger):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                        await task
            self.sockets.pop(sub, None)
            state.unsubscribe(sub)
        return ws

    async def _send_events(self, ws: web.WebSocketResponse, sub: Any) -> None:
        state = self.state
        while True:
            payload = await sub.queue.get()
            if payload is None:
                code = getattr(ws, "_sim_close_code", 1001)
                if code != 1006:
                    await ws.close(code=code, message=b"server going away")
                return
            if state.faults.malformed_next > 0:
                state.faults.malformed_next -= 1
                await ws.send_str('{"kind": "status_change", "chat": {"id": 42')
                continue
            if state.era.envelope:
                payload = {"type": "data", "data": payload}
            await ws.send_str(json.dumps(payload) + "\n")

    async def _json_pings(self, ws: web.WebSocketResponse) -> None:
        while not ws.closed:
            await asyncio.sleep(self.state.ping_interval)
            await ws.send_str(json.dumps({"type": "ping"}) + "\n")
