"""The one connection pool to Coder: kept open across reconciles, one fresh dial on demand.

aiohttp closes an idle pooled connection after 15 s, so against a 60 s reconcile every
listing dialled again: a TCP and, in production, a TLS handshake per identity per minute.
The pool here keeps idle connections for :func:`keepalive_for` the reconcile interval.

A connection kept that long may be closed by the server (or a proxy's idle timer) at the
very moment a request goes out on it. :class:`Pool` tells the transport whether a request
went out on a pooled connection (:class:`Attempt`), and hands a repeat a fresh one: the
transport repeats a request there once, under the rule stated here (:data:`REPEATABLE`,
:data:`STALE`); aiohttp's own repeat — on the next pooled connection, and PUT/DELETE too
— is turned off in :func:`open_session`, so that rule is the only one.

What it must not do: verify less. Each identity's TLS context is passed per request and
is part of the pool's key; nothing here builds one.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from aiohttp.client_reqrep import ConnectionKey
    from aiohttp.connector import Connection
    from aiohttp.tracing import Trace

# What a pooled connection closed under a request raises (a refused dial is a
# ClientConnectorError, a subclass, but only a pooled connection is ever sent again).
STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
# Methods sent again after a closed pooled connection: reads, which change nothing.
REPEATABLE = frozenset({"GET", "HEAD"})

# aiohttp's own idle keep-alive: the floor, for reconcile intervals shorter than it.
DEFAULT_KEEPALIVE = 15.0


def keepalive_for(reconcile_interval: float) -> float:
    """How long an idle connection is kept: twice the reconcile interval, past the longest
    jittered gap between two listings (1.1 times the interval), never under aiohttp's 15 s."""
    return max(DEFAULT_KEEPALIVE, 2.0 * reconcile_interval)


@dataclass(slots=True)
class Attempt:
    """One request's dial, between the transport and the pool."""

    # Asked by the transport: do not hand out an idle pooled connection.
    fresh: bool = False
    # Told by the pool: the request went out on a connection that had been idle in it.
    reused: bool = False
    # The answer's status once it came (the transport's meter reads it).
    status: int | None = None


# The attempt of the request the current task is sending (aiohttp takes the connection
# in the same task that sends, so the pool reads it there).
ATTEMPT: ContextVar[Attempt | None] = ContextVar("watchd_coder_attempt", default=None)


class Pool(aiohttp.TCPConnector):
    """aiohttp's connector, told per request whether it may reuse an idle connection."""

    async def _get(self, key: ConnectionKey, traces: list[Trace]) -> Connection | None:
        attempt = ATTEMPT.get()
        if attempt is not None and attempt.fresh:
            return None
        conn = await super()._get(key, traces)
        if attempt is not None and conn is not None:
            attempt.reused = True
        return conn

    def keep_for(self, seconds: float) -> None:
        """A new idle keep-alive (a reload changed the reconcile interval)."""
        self._keepalive_timeout = seconds

    async def close(self, *, abort_ssl: bool = True) -> None:
        """Close every connection at once: TLS ones without waiting for the peer's
        close_notify (a server that is gone must not hold the daemon's stop)."""
        await super().close(abort_ssl=abort_ssl)


def open_session(*, keepalive: float) -> aiohttp.ClientSession:
    """The daemon's one session: no pool limit (every identity holds one watch socket for
    good, so a per-host cap below the identity count would starve REST calls forever;
    requests are bounded per identity by its rate limiter instead)."""
    session = aiohttp.ClientSession(
        connector=Pool(limit=0, limit_per_host=0, keepalive_timeout=keepalive),
    )
    # The transport repeats a request that met a closed pooled connection, once, on a
    # fresh one; aiohttp's own repeat (on the next pooled connection) would be a second.
    session._retry_connection = False
    return session


def retune(session: aiohttp.ClientSession, reconcile_interval: float) -> None:
    """Keep idle connections for the (reloaded) reconcile interval."""
    if isinstance(session.connector, Pool):
        session.connector.keep_for(keepalive_for(reconcile_interval))


def describe(exc: BaseException, *, method: str, reused: bool) -> str:
    """What a failed exchange says in ``last_error``: a refused certificate names TLS
    verification and the fix; a write that met a closed pooled connection says it was
    not sent again."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        why = getattr(exc.certificate_error, "verify_message", "") or exc.certificate_error
        return (
            f"TLS certificate verification failed for {exc.host}:{exc.port}: {why} "
            "(a private CA is trusted with the identity's ca_file)"
        )
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if reused and method not in REPEATABLE and isinstance(exc, STALE):
        message += f" (a pooled connection; a {method} is not sent twice: it may have been applied)"
    return message
