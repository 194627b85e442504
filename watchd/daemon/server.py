"""The daemon's HTTP server: ``/healthz``, ``/readyz``, ``/status``, ``/metrics``, the
transport-event ingest and the admission answer (both behind the ingest bearer token),
and ``POST /-/reload`` (behind the admin token) for config-reloader sidecars.

Liveness is proved by the loop answering at all, by a heartbeat task the loop
must keep running and by no process-wide task crash-looping
(``view.liveness_problems``); readiness means what READY=1 means: every identity has
had its first seed attempt (one that failed is reported by IdentityUnhealthy and
/status).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
from aiohttp import web

from watchd.daemon.admission import Counts, admission
from watchd.daemon.inbound import ACCEPT_BACKLOG, HEADER_TIMEOUT, Inbound
from watchd.daemon.ingesting import IngestPort
from watchd.daemon.metrics import CONTENT_TYPE
from watchd.daemon.reloading import Outcome
from watchd.daemon.silences_api import AdminToken, SilencesApi
from watchd.daemon.status import StatusQuery, status_document
from watchd.daemon.timeline import timeline_document, timeline_html
from watchd.daemon.view import DaemonView, liveness_problems
from watchd.kits.redaction import REGISTRY
from watchd.telemetry.ingest import IngestError, NoRoom, parse_batch_stepwise

# Ingest batches read and waiting for the parse slot at most (each up to max_body_bytes);
# one more is answered 503 and counted as refused_busy.
MAX_WAITING_BATCHES = 64
RELOAD_OFF = (
    "reloading over HTTP needs the admin token: set server.admin_token_file (or _env, "
    "_credential); SIGHUP reloads without it"
)


class Server:
    """The routes, bound to the daemon's read-only view; the ingest port, the silences API
    and the metrics renderer are handed in, so nothing here reaches into the daemon to
    change it, and no secret passes through the view."""

    def __init__(
        self,
        daemon: DaemonView,
        *,
        ingest: IngestPort,
        listen: str,
        max_body_bytes: int,
        identities: int,
        silences: SilencesApi,
        render_metrics: Callable[[], bytes],
        admin: AdminToken,
        reload: Callable[[], Awaitable[Outcome]],
    ) -> None:
        self.daemon = daemon
        self.admin = admin
        self._reload = reload
        self.intake = ingest
        self.max_body_bytes = max_body_bytes
        self.render_metrics = render_metrics
        host, _, port = listen.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        # Inbound connections capped below the fd limit (docs/limits.md); its counters
        # are registered on /metrics by the daemon.
        self.inbound = Inbound(identities=identities)
        self.app = web.Application(
            client_max_size=max_body_bytes,
            middlewares=[self.inbound.middleware()],
        )
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/readyz", self.readyz)
        self.app.router.add_get("/status", self.status)
        self.app.router.add_get("/status/chats/{chat_id}", self.timeline)
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_post("/v1/transport-events", self.ingest)
        self.app.router.add_get("/v1/admission", self.admission)
        self.app.router.add_post("/-/reload", self.reload)
        self.counts = Counts()
        # Batches are parsed one at a time (the others wait their turn, already read):
        # each loop turn then holds one parse step, not one per sender, and /healthz and
        # the watchers keep their turns during a flood. The wait is bounded too.
        self._parsing = asyncio.Semaphore(1)
        self._waiting = 0
        silences.routes(self.app)
        if os.environ.get("WATCHD_DEBUG_ENDPOINTS") == "1":
            # For testing probes: wedge the event loop on purpose (never on by default).
            self.app.router.add_post("/debug/block", self.debug_block)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.bound = ""

    async def start(self) -> str:
        # keepalive_timeout: aiohttp starts it when a connection is accepted, so it is also
        # the time a new connection has to send its request (inbound.HEADER_TIMEOUT).
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=1.0,
            keepalive_timeout=HEADER_TIMEOUT,
        )
        await self._runner.setup()
        assert self._runner.server is not None
        loop = asyncio.get_running_loop()
        # Our own listener rather than a TCPSite: its protocol factory enforces the cap.
        self._listener = await loop.create_server(
            self.inbound.factory(self._runner.server),
            self.host,
            self.port,
            backlog=ACCEPT_BACKLOG,
        )
        self.inbound.install(loop)
        port = self._listener.sockets[0].getsockname()[1]
        self.bound = f"{self.host}:{port}"
        return self.bound

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self.inbound.uninstall(asyncio.get_running_loop())
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None

    async def healthz(self, request: web.Request) -> web.Response:
        problems = liveness_problems(self.daemon)
        if problems:
            return web.json_response({"ok": False, "problems": problems}, status=503)
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        d = self.daemon
        unseeded = sorted(n for n, h in d.health.items() if not h.seeded_once)
        if not d.settled():
            return web.json_response({"ready": False, "unseeded": unseeded}, status=503)
        if unseeded:
            # Started, as READY=1 says: these are IdentityUnhealthy's and /status's business.
            return web.json_response({"ready": True, "unseeded": unseeded})
        return web.json_response({"ready": True})

    async def status(self, request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        wants_html = request.query.get("format") == "html" or (
            "text/html" in accept and request.query.get("format") != "json"
        )
        query = StatusQuery.from_query(request.query, html_page=wants_html)
        doc = await status_document(self.daemon, query, self.counts)
        # Last line of defence: nothing a server echoed (a token) leaves through /status.
        if wants_html:
            # The page's renderer loads with the first page asked for, not with the daemon.
            from watchd.daemon.status_page import status_html

            return web.Response(text=REGISTRY.scrub(status_html(doc)), content_type="text/html")
        # orjson: encoding a full page is ~10x faster than json, and it runs on the loop.
        # The scrub is the last line of defence: nothing a server echoed (a token) leaves.
        return web.Response(
            text=REGISTRY.scrub(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()),
            content_type="application/json",
        )

    async def timeline(self, request: web.Request) -> web.Response:
        """One chat's timeline (fleet.md §4): JSON, or HTML for a browser."""
        accept = request.headers.get("Accept", "")
        wants_html = request.query.get("format") == "html" or (
            "text/html" in accept and request.query.get("format") != "json"
        )
        doc = timeline_document(self.daemon, request.match_info["chat_id"][:200])
        if doc is None:
            return web.json_response({"error": "watchd knows no chat of that id"}, status=404)
        if wants_html:
            return web.Response(text=REGISTRY.scrub(timeline_html(doc)), content_type="text/html")
        return web.Response(
            text=REGISTRY.scrub(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()),
            content_type="application/json",
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.render_metrics(),
            headers={"Content-Type": CONTENT_TYPE, "X-Content-Type-Options": "nosniff"},
        )

    async def reload(self, request: web.Request) -> web.Response:
        """The SIGHUP path over HTTP, answered as Prometheus' ``/-/reload``: 200 with what
        was applied and what needs a restart, 400 with the file's problems (nothing
        changed), 500 when applying failed."""
        refused = self.admin.refusal(request, off=RELOAD_OFF)
        if refused is not None:
            return refused
        outcome = await self._reload()
        return web.Response(
            text=REGISTRY.scrub(orjson.dumps(outcome.body, option=orjson.OPT_INDENT_2).decode()),
            status=outcome.status,
            content_type="application/json",
        )

    async def debug_block(self, request: web.Request) -> web.Response:
        seconds = min(float(request.query.get("seconds", "5")), 60.0)
        time.sleep(seconds)  # deliberately blocks the event loop  # noqa: ASYNC251
        return web.json_response({"blocked": seconds})

    # -- transport-event ingest ---------------------------------------------------------

    def _refused(self, request: web.Request) -> web.Response | None:
        """401 unless the request bears the ingest token (when one is set)."""
        if self.intake.authorized(request.headers.get("Authorization", "")):
            return None
        return web.json_response(
            {"error": "missing or wrong bearer token"},
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    async def admission(self, request: web.Request) -> web.Response:
        """Whether a dispatcher should start more chats for ``?identity=`` now (from
        memory: no Coder call)."""
        refused = self._refused(request)
        if refused is not None:
            return refused
        name = request.query.get("identity", "")
        if not name:
            return web.json_response({"error": "?identity=NAME is required"}, status=400)
        answer = admission(self.daemon, name, self.counts)
        if answer is None:
            return web.json_response(
                {"error": "this daemon watches no identity of that name"}, status=404
            )
        return web.json_response(answer, headers={"Cache-Control": "no-store"})

    async def ingest(self, request: web.Request) -> web.Response:
        intake = self.intake
        refused = self._refused(request)
        if refused is not None:
            intake.count("unauthorized")
            return refused
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            intake.count("too_large")
            limit = self.max_body_bytes
            return web.json_response({"error": f"body larger than {limit} bytes"}, status=413)
        if self._waiting >= MAX_WAITING_BATCHES:
            intake.count("refused_busy")
            return web.json_response(
                {"error": f"{MAX_WAITING_BATCHES} batches already wait to be parsed; retry later"},
                status=503,
                headers={"Retry-After": "1"},
            )
        try:
            async with self._parse_turn():
                batch = await parse_batch_stepwise(
                    body, content_type=request.content_type, query=request.query, room=intake.room
                )
        except (IngestError, UnicodeDecodeError) as exc:
            intake.count("rejected")
            return web.json_response({"error": str(exc)}, status=400)
        except NoRoom as full:
            return self._full(full.events)
        if len(batch) > intake.room():  # NDJSON is counted only once parsed
            return self._full(len(batch))
        intake.put(batch)
        return web.json_response({"accepted": len(batch)}, status=202)

    @contextlib.asynccontextmanager
    async def _parse_turn(self) -> AsyncIterator[None]:
        """Wait for the one parse slot, counted in ``_waiting`` until it is ours (also when
        the wait is cancelled)."""
        self._waiting += 1
        try:
            await self._parsing.acquire()
        finally:
            self._waiting -= 1
        try:
            yield
        finally:
            self._parsing.release()

    def _full(self, events: int) -> web.Response:
        """503 for a batch the event queue has no room for: counted, and its events too."""
        self.intake.refuse_full(events)
        return web.json_response(
            {"error": "event queue full; retry later"}, status=503, headers={"Retry-After": "1"}
        )
