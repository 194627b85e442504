"""Bounds on inbound connections to ``server.listen``: file descriptors are shared.

Every socket watchd holds — inbound HTTP connections, the watch streams and REST
connections to Coder, receiver POSTs, the state files — takes a file descriptor from one
process-wide limit (``RLIMIT_NOFILE``, 1 024 by default under systemd). Idle inbound
connections must never use them all: then ``accept()`` fails (asyncio logs a traceback
per retry), ``/healthz`` is unreachable and no receiver POST can open a socket. So:

* at start the soft limit is raised to the hard one (:func:`raise_fd_limit`);
* a connection that has not sent a request within :data:`HEADER_TIMEOUT` is closed
  (aiohttp's keep-alive timer, which also starts when a connection is accepted), and a
  request not answered within :data:`REQUEST_TIMEOUT` (a body trickled in) gets a 408;
* at most :func:`inbound_cap` connections are open at once, a reserve of descriptors
  kept for everything else. One more takes the place of the oldest connection with no
  request in progress (idle: it has nothing to lose but a reconnect), so a probe gets
  in at once during a flood of idle connections; only when every connection is busy is
  the newcomer answered ``503`` and closed. Each drop is counted by reason and logged
  at most once per :data:`OVERFLOW_LOG_EVERY`;
* an ``accept()`` that still fails for want of descriptors is counted and logged the
  same way, never as a traceback per retry.

Knows nothing of the routes: :mod:`watchd.daemon.server` builds its site through here.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from watchd.kits import logs

log = logs.get("watchd.server")

# A probe or a scrape sends its request at once; a client that has not within 5 s is
# idle or trickling bytes (slowloris) and is holding a descriptor for nothing.
HEADER_TIMEOUT = 5.0
# A request (its body read included) that takes longer holds a connection that cannot be
# evicted: 408. The slowest honest answer, /metrics of a large fleet, takes seconds.
REQUEST_TIMEOUT = 30.0
# Connections accepted in one go before any is looked at: part of the reserve.
ACCEPT_BACKLOG = 64
# Descriptors kept for everything but inbound connections: the state database and its
# journal, stdio, the OTLP exporter, receiver POSTs, DNS, one accept burst...
RESERVE_FIXED = 128 + ACCEPT_BACKLOG
# ...and per configured identity: its watch stream, pooled REST connections and
# confirmation reads in flight.
RESERVE_PER_IDENTITY = 4
# Probes, scrapes, silences and transport-event senders never need more at once.
MAX_INBOUND = 1024
# Below this the daemon cannot be operated; a lower fd limit is warned about.
MIN_INBOUND = 16
# Overflow is logged once per this many seconds at most (with the count since).
OVERFLOW_LOG_EVERY = 60.0
# What a refused connection is told before it is closed.
_WHY = b"too many connections to watchd\n"
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(_WHY), _WHY)
)
ACCEPT_FAILED = "socket.accept() out of system resource"
REASONS = ("evicted_idle", "over_limit", "slow_request", "accept_failed")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one; (soft before, soft now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        # Linux refuses an infinite soft limit (fs.nr_open bounds it): ask for a large one.
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, hard
    return soft, soft


def inbound_cap(fd_limit: int, identities: int) -> int:
    """Inbound connections allowed at once under ``fd_limit``, with the reserve kept."""
    room = fd_limit - RESERVE_FIXED - RESERVE_PER_IDENTITY * identities
    return max(MIN_INBOUND, min(MAX_INBOUND, room))


class Refused(asyncio.Protocol):
    """A connection over the cap: told why, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(BUSY)
        transport.close()


class Inbound(Collector):
    """The cap, what was dropped and why, and ``/metrics``' view of both."""

    def __init__(self, *, identities: int) -> None:
        self.fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.cap = inbound_cap(self.fd_limit, identities)
        self.dropped = dict.fromkeys(REASONS, 0)
        self._server: web.Server | None = None
        # Connections with a request in progress (never evicted).
        self._busy: set[object] = set()
        self._unlogged = dict.fromkeys(REASONS, 0)
        self._logged_at = float("-inf")
        self._previous: Any = None

    @property
    def open(self) -> int:
        return len(self._server.connections) if self._server is not None else 0

    def factory(self, server: web.Server) -> Callable[[], asyncio.BaseProtocol]:
        """aiohttp's protocol factory, refusing connections over the cap. The count can
        lag by one accept burst (:data:`ACCEPT_BACKLOG`), which the reserve covers."""
        self._server = server

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) >= self.cap and not self._evict_idle(server):
                self._overflow("over_limit")
                return Refused()
            return server()

        return protocol

    def _evict_idle(self, server: web.Server) -> bool:
        """Close the oldest connection with no request in progress; False if none is."""
        for handler in server.connections:  # in the order they were accepted
            # A handler already closed has no transport; it leaves the list shortly.
            if handler not in self._busy and handler.transport is not None:
                handler.force_close()
                self._overflow("evicted_idle")
                return True
        return False

    def middleware(self) -> Middleware:
        """The app's middleware: a connection is busy (never evicted) while a request is
        handled on it, for at most REQUEST_TIMEOUT."""
        busy = self._busy

        @web.middleware
        async def mark_busy(request: web.Request, handler: Handler) -> web.StreamResponse:
            protocol = request.protocol
            busy.add(protocol)
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT) as deadline:
                    return await handler(request)
            except TimeoutError:
                if not deadline.expired():
                    raise
                self._overflow("slow_request")
                return web.Response(
                    status=408, text="request took too long\n", headers={"Connection": "close"}
                )
            finally:
                busy.discard(protocol)

        return mark_busy

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Catch asyncio's failed-accept report (a traceback per retry otherwise)."""
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self._exception)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(self._previous)

    def _exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_FAILED:
            self._overflow("accept_failed", error=str(context.get("exception")))
        elif self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def _overflow(self, reason: str, **extra: str) -> None:
        self.dropped[reason] += 1
        self._unlogged[reason] += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at < OVERFLOW_LOG_EVERY:
            return
        self._logged_at = now
        counts = {k: v for k, v in self._unlogged.items() if v}
        self._unlogged = dict.fromkeys(REASONS, 0)
        log.warning(
            "server.connections_dropped",
            since_last=counts,
            open=self.open,
            cap=self.cap,
            fd_limit=self.fd_limit,
            **extra,
        )

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        dropped = CounterMetricFamily(
            "watchd_inbound_connections_dropped",
            "Inbound connections closed by watchd's bounds, by reason (docs/limits.md).",
            labels=["reason"],
        )
        for reason in REASONS:
            dropped.add_metric([reason], self.dropped[reason])
        yield dropped
        yield GaugeMetricFamily(
            "watchd_inbound_connections", "Inbound connections open.", value=self.open
        )
        yield GaugeMetricFamily(
            "watchd_inbound_connections_limit",
            "Inbound connections allowed at once (the fd limit less the reserve).",
            value=self.cap,
        )
