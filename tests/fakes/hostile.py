"""Small hostile peers that speak just enough HTTP to hurt: a Coder whose bodies never end
or never start, a watch route that never finishes its handshake, a server that asks for a
day of silence, a receiver that streams forever. Every loop is bounded by its writer's
``limit`` so a test that forgets to stop it still ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

CHUNK = b"[" + b'{"id":"x","status":"running"},' * 2000


async def endless(request: web.Request) -> web.StreamResponse:
    """200 with a JSON-looking body that never ends (until 256 MiB or the client leaves)."""
    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    sent = 0
    while sent < 256 * 1024 * 1024:
        try:
            await resp.write(CHUNK)
        except (ConnectionError, RuntimeError):
            break
        sent += len(CHUNK)
    return resp


async def huge_declared(request: web.Request) -> web.Response:
    """A body whose Content-Length alone is over any bound."""
    return web.Response(
        body=b"{" + b" " * (6 * 1024 * 1024) + b"}", content_type="application/json"
    )


RELEASE: web.AppKey[asyncio.Event] = web.AppKey("release", asyncio.Event)


async def never_upgrades(request: web.Request) -> web.StreamResponse:
    """Accepts the request and never answers (a half-dead proxy) until the fake stops."""
    await request.app[RELEASE].wait()
    return web.Response()


async def one_day_please(request: web.Request) -> web.Response:
    """503 with Retry-After: 99999 seconds."""
    return web.json_response(
        {"message": "Service unavailable."}, status=503, headers={"Retry-After": "99999"}
    )


@asynccontextmanager
async def serving(routes: dict[str, object]) -> AsyncIterator[str]:
    """Serve ``{path: handler}`` on loopback; yields the base URL."""
    app = web.Application()
    app[RELEASE] = asyncio.Event()
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)  # type: ignore[arg-type]
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        app[RELEASE].set()
        await runner.cleanup()
