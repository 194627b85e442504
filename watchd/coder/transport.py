"""The one I/O seam for everything watchd says to Coder.

Every request and every watch dial passes through :class:`Transport`, which
adds the token (only ever in the ``Coder-Session-Token`` header), learns the
deployment's clock from ``Date``, paces requests through the identity's
limiter, emits ``http:*`` / ``ws:*`` transport events, and tells its
:class:`Meter` (the daemon's ``/metrics``) of every request's answer and time and of
every wait for the limiter. Nothing above this module touches aiohttp's client
directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from dataclasses import dataclass
from ssl import SSLContext
from typing import Any, Protocol
from urllib.parse import urlencode

import aiohttp
import orjson

from watchd.coder.connections import ATTEMPT, REPEATABLE, STALE, Attempt, describe
from watchd.coder.errors import CoderError, PayloadError, error_from_body
from watchd.kits import logs
from watchd.kits.backoff import retry_hint
from watchd.kits.clock import ServerClock
from watchd.kits.ratelimit import RateLimiter
from watchd.telemetry.events import EventSink, EventSource, NullSink, now_ms
from watchd.telemetry.kinds import (
    HttpError,
    HttpRequest,
    HttpResponse,
    TransportEvent,
    WsClose,
    WsDial,
    WsError,
    WsKind,
    WsOpen,
    own,
)

USER_AGENT = "watchd/0.1 (+https://github.com/coder/coder chats monitor)"
# Every body read from Coder is bounded: a server (or a proxy) that streams forever must
# not fill our memory. Listing pages get a bound scaled to the page size by the client.
MAX_BODY = 4 * 1024 * 1024
# The watch upgrade must complete in this long (a server that accepts the TCP connection
# and never answers would otherwise hold the dial for aiohttp's five-minute default).
HANDSHAKE_TIMEOUT = 30.0

log = logs.get("watchd.coder")

# What ``urlencode`` (``quote_plus``) leaves as it is: a query made only of these (every
# listing page's: ``limit``, a chat-UUID cursor) is joined directly.
_PLAIN = re.compile(r"[A-Za-z0-9_.~-]*")


class Meter(Protocol):
    """Told the plain facts of each request; it labels them (bounded: coder.routes)."""

    def request(self, method: str, path: str, status: int | None, seconds: float) -> None:
        """One exchange: its path without the query, the answer's status (None: none came),
        and its time from sending to the body read (the limiter's wait excluded)."""

    def waited(self, identity: str, seconds: float) -> None:
        """A request of ``identity`` waited this long for its rate limiter."""

    def stale(self, identity: str) -> None:
        """A request of ``identity`` met a pooled connection the server had closed and
        was sent again on a fresh one (not an outage)."""


class OversizeResponse(PayloadError):
    """A response body longer than the bound for its kind of request."""


def query(params: list[tuple[str, str]]) -> str:
    """``urlencode(params)``: the same text, joined directly when no key or value needs
    quoting (a listing page's ``limit`` and cursor), encoded by ``urlencode`` otherwise."""
    plain = _PLAIN.fullmatch
    for key, value in params:
        if not (plain(key) and plain(value)):
            return urlencode(params)
    return "&".join([f"{key}={value}" for key, value in params])


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        if not self.body:
            return None
        try:
            return orjson.loads(self.body)
        except ValueError:
            return self.body.decode("utf-8", "replace")


class Transport:
    """HTTP and WebSocket access to one Coder deployment as one identity."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        session: aiohttp.ClientSession,
        identity: str = "",
        events: EventSink | None = None,
        source: EventSource | None = None,
        server_clock: ServerClock | None = None,
        limiter: RateLimiter | None = None,
        timeout: float = 30.0,
        user_agent: str = USER_AGENT,
        meter: Meter | None = None,
        ssl: SSLContext | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.user_agent = user_agent
        self._token = token
        self._session = session
        self.identity = identity
        self._events: EventSink = events or NullSink()
        self._source = source or EventSource(
            service="watchd", instance="local", agent=identity, own=True
        )
        self.server_clock = server_clock or ServerClock()
        self.limiter = limiter or RateLimiter(rate=6.0, burst=30)
        self.meter = meter
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, 10.0))
        # Nothing is built for events nobody will read (the daemon without own_events).
        self._quiet = type(self._events) is NullSink
        self._ids = itertools.count(1)
        self.requests = 0
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        # Reads cut at their bound, and watch upgrades that never completed.
        self.oversize = 0
        self.handshake_timeouts = 0
        # Requests sent again after their pooled connection turned out closed.
        self.stale = 0
        # The identity's trust (its ca_file), else aiohttp's default: the system's roots.
        self._ssl: SSLContext | bool = ssl if ssl is not None else True

    def set_token(self, token: str) -> None:
        self._token = token

    def _headers(self) -> dict[str, str]:
        return {
            "Coder-Session-Token": self._token,
            "Accept": "application/json",
            "User-Agent": self.user_agent,
        }

    def _emit(self, event: TransportEvent) -> None:
        with contextlib.suppress(Exception):
            self._events.emit(self._source, own(event))

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: list[tuple[str, str]] | None = None,
        json_body: Any = None,
        max_body: int = MAX_BODY,
    ) -> Response:
        """One HTTP exchange. Non-2xx answers raise :class:`CoderError` (with hints); a
        body over ``max_body`` bytes raises :class:`OversizeResponse` (counted).

        A GET that finds its pooled connection closed by the server (an idle timer firing
        as the request went out) is sent once more, at once, on a fresh connection:
        counted in ``stale``, not an error. Any other method is not sent twice (it may
        have been applied), and a fresh connection that fails is an error."""
        await self._pace()
        full_path = path + ("?" + query(params) if params else "")
        rid = f"{self.identity}-{next(self._ids)}"
        self.requests += 1
        quiet = self._quiet
        if not quiet:
            self._emit(HttpRequest(timestamp=now_ms(), id=rid, method=method, path=full_path))
        sent_wall = self.server_clock.wall_now()
        started = time.monotonic()
        attempt = Attempt()
        try:
            try:
                headers, body = await self._send(method, full_path, json_body, max_body, attempt)
            except STALE:
                if not (attempt.reused and method in REPEATABLE):
                    raise
                self._stale(method, path)
                attempt = Attempt(fresh=True)
                headers, body = await self._send(method, full_path, json_body, max_body, attempt)
        except OversizeResponse as exc:
            self._meter(method, path, attempt.status, started)
            self._cut(method, path, max_body)
            self._emit_error(rid, method, full_path, str(exc), started)
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._meter(method, path, None, started)
            message = describe(exc, method=method, reused=attempt.reused)
            self._emit_error(rid, method, full_path, message, started)
            raise CoderError(
                status=None, message=message[:300], method=method, path=full_path
            ) from None
        status = attempt.status
        assert status is not None
        duration = self._meter(method, path, status, started) * 1000
        self.server_clock.observe(
            headers.get("Date"), sent_at=sent_wall, received_at=self.server_clock.wall_now()
        )
        ok = 200 <= status < 300
        if not quiet:
            self._emit(
                HttpResponse(
                    timestamp=now_ms(),
                    id=rid,
                    method=method,
                    path=full_path,
                    status=status,
                    ok=ok,
                    durationMs=round(duration, 1),
                )
            )
        response = Response(status=status, headers=headers, body=body)
        if not ok:
            hint = retry_hint(headers, server_now=self.server_clock.now())
            raise error_from_body(
                status=status,
                body=response.json(),
                method=method,
                path=full_path,
                retry_after=hint,
            )
        return response

    async def _send(
        self, method: str, full_path: str, json_body: Any, max_body: int, attempt: Attempt
    ) -> tuple[dict[str, str], bytes]:
        """One try on the wire: the answer's headers and body (its status in ``attempt``,
        as is whether the pool lent an idle connection)."""
        token = ATTEMPT.set(attempt)
        try:
            async with self._session.request(
                method,
                self.base_url + full_path,
                headers=self._headers(),
                json=json_body,
                timeout=self._timeout,
                allow_redirects=False,
                ssl=self._ssl,
            ) as resp:
                attempt.status = resp.status
                headers = dict(resp.headers.items())
                return headers, await self._read(resp, max_body)
        finally:
            ATTEMPT.reset(token)

    def _stale(self, method: str, path: str) -> None:
        """A pooled connection the server had closed: counted, logged, sent again."""
        self.stale += 1
        if self.meter is not None:
            self.meter.stale(self.identity)
        log.debug("coder.stale_connection", identity=self.identity, method=method, path=path)

    async def _pace(self) -> None:
        """Wait for the identity's limiter (the wait told to the meter)."""
        waited = await self.limiter.acquire()
        if waited and self.meter is not None:
            self.meter.waited(self.identity, waited)

    def _meter(self, method: str, path: str, status: int | None, started: float) -> float:
        """Tell the meter of one exchange (``status`` None: no answer); its seconds."""
        elapsed = time.monotonic() - started
        if self.meter is not None:
            self.meter.request(method, path, status, elapsed)
        return elapsed

    def _cut(self, method: str, path: str, limit: int) -> None:
        """A body over its bound: counted and logged (the caller raises)."""
        self.oversize += 1
        log.warning(
            "coder.response_too_large",
            identity=self.identity,
            method=method,
            path=path,
            limit_bytes=limit,
        )

    def _emit_error(self, rid: str, method: str, path: str, message: str, started: float) -> None:
        self._emit(
            HttpError(
                timestamp=now_ms(),
                id=rid,
                method=method,
                path=path,
                message=message[:300],
                durationMs=round((time.monotonic() - started) * 1000, 1),
            )
        )

    @staticmethod
    async def _read(resp: aiohttp.ClientResponse, limit: int) -> bytes:
        length = resp.content_length
        if length is not None and length > limit:
            raise OversizeResponse(
                resp.url.path, f"response body of {length} bytes exceeds the {limit}-byte bound"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise OversizeResponse(
                    resp.url.path, f"response body exceeds the {limit}-byte bound (cut)"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def ws_connect(
        self, path: str, *, heartbeat: float, reader: int, attempt: int
    ) -> aiohttp.ClientWebSocketResponse:
        """Dial a WebSocket. Upgrade refusals raise :class:`CoderError` with the HTTP status.

        No ``Origin`` header is sent: Coder's accept rejects foreign origins.
        """
        url = self.base_url + path
        ws_url = "ws" + url[4:] if url.startswith("http") else url
        self._emit(
            WsDial(timestamp=now_ms(), reader=reader, attempt=attempt, url=ws_url, chatId=None)
        )
        sent_wall = self.server_clock.wall_now()
        try:
            try:
                async with asyncio.timeout(self.handshake_timeout):
                    ws = await self._session.ws_connect(
                        url,
                        headers=self._headers(),
                        heartbeat=heartbeat,
                        # Pings are answered by the reader (watchstream.pump).
                        autoping=False,
                        timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0),
                        max_msg_size=1 << 20,
                        ssl=self._ssl,
                    )
            except TimeoutError:
                self.handshake_timeouts += 1
                raise TimeoutError(
                    f"upgrade not completed within {self.handshake_timeout:g}s"
                ) from None
        except aiohttp.WSServerHandshakeError as exc:
            self.emit_ws(
                WsError,
                reader=reader,
                attempt=attempt,
                message=f"upgrade refused: HTTP {exc.status}",
            )
            self.emit_ws(
                WsClose, reader=reader, attempt=attempt, code=exc.status, reason="upgrade refused"
            )
            headers = dict(exc.headers or {})
            hint = retry_hint(headers, server_now=self.server_clock.now())
            raise CoderError(
                status=exc.status,
                message=exc.message or "upgrade refused",
                method="GET",
                path=path,
                retry_after=hint,
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            message = describe(exc, method="GET", reused=False)[:300]
            self.emit_ws(WsError, reader=reader, attempt=attempt, message=message)
            self.emit_ws(WsClose, reader=reader, attempt=attempt, code=1006, reason="dial failed")
            raise CoderError(status=None, message=message, method="GET", path=path) from None
        date = ws._response.headers.get("Date") if ws._response is not None else None
        self.server_clock.observe(date, sent_at=sent_wall, received_at=self.server_clock.wall_now())
        self.emit_ws(WsOpen, reader=reader, attempt=attempt)
        return ws

    def emit_ws(self, kind: type[WsKind], *, reader: int, attempt: int, **fields: Any) -> None:
        """Emit a ``ws:*`` event for a connection dialed through :meth:`ws_connect` (the
        watch socket is every chat's of the identity: ``chatId`` is null)."""
        if self._quiet:
            return
        self._emit(kind(timestamp=now_ms(), reader=reader, attempt=attempt, chatId=None, **fields))
