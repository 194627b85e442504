"""The daemon's HTTP server: ``/healthz``, ``/readyz``, ``/status``, ``/metrics``.

Liveness is proved by the loop answering at all and by a heartbeat task the
loop must keep running; readiness means every identity has been seeded once.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from aiohttp import web

from watchd.daemon.status import metrics_text, status_document, status_html

if TYPE_CHECKING:
    from watchd.daemon.app import Daemon

# The heartbeat ticks every second; missing 5 means the loop or the supervisor is wedged.
STALE_HEARTBEAT = 5.0


class Server:
    def __init__(self, daemon: Daemon, *, listen: str) -> None:
        self.daemon = daemon
        host, _, port = listen.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self.app = web.Application(client_max_size=daemon.config.server.max_body_bytes)
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/readyz", self.readyz)
        self.app.router.add_get("/status", self.status)
        self.app.router.add_get("/metrics", self.metrics)
        self._runner: web.AppRunner | None = None
        self.bound = ""

    async def start(self) -> str:
        self._runner = web.AppRunner(
            self.app, handle_signals=False, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = server.sockets if server is not None else []  # type: ignore[attr-defined]
        port = sockets[0].getsockname()[1] if sockets else self.port
        self.bound = f"{self.host}:{port}"
        return self.bound

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def healthz(self, request: web.Request) -> web.Response:
        d = self.daemon
        problems = []
        age = time.monotonic() - d.last_beat
        if age > STALE_HEARTBEAT:
            problems.append(f"event loop heartbeat is {age:.1f}s old")
        dead = d.supervisor.dead_roots()
        if dead:
            problems.append(f"root tasks ended: {', '.join(sorted(dead))}")
        if problems:
            return web.json_response({"ok": False, "problems": problems}, status=503)
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        d = self.daemon
        unseeded = sorted(n for n, h in d.health.items() if not h.seeded_once)
        if unseeded:
            return web.json_response({"ready": False, "unseeded": unseeded}, status=503)
        return web.json_response({"ready": True})

    async def status(self, request: web.Request) -> web.Response:
        doc = status_document(self.daemon)
        accept = request.headers.get("Accept", "")
        wants_html = request.query.get("format") == "html" or (
            "text/html" in accept and request.query.get("format") != "json"
        )
        if wants_html:
            return web.Response(text=status_html(doc), content_type="text/html")
        return web.Response(text=json.dumps(doc, indent=1), content_type="application/json")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=metrics_text(self.daemon),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )
