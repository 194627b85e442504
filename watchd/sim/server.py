"""The simulator's HTTP face: middleware (the sim clock's ``Date``, faults, auth, rate
limits), the routes of the configured era, and the users, quota and workspace routes.

The chats routes are :mod:`watchd.sim.chats`, the watch socket :mod:`watchd.sim.watch`
and the admin API under ``/__sim`` :mod:`watchd.sim.admin`.

Status codes and bodies follow docs/coder-api.md. Auth runs before
every handler (a bad token on the watch gets a plain 401, not a 101).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time

from aiohttp import web

from watchd.sim.admin import AdminAPI
from watchd.sim.chats import ChatsAPI
from watchd.sim.payloads import (
    NOT_FOUND,
    USER_KEY,
    Handler,
    error_response,
    http_date,
    json_response,
)
from watchd.sim.quota import consumed
from watchd.sim.records import SimError, SimUser, SimWorkspace
from watchd.sim.state import SimState
from watchd.sim.tree_api import TreeAPI
from watchd.sim.watch import WatchSockets

STATE: web.AppKey[SimState] = web.AppKey("state", SimState)


def _request_kind(method: str, path: str, is_ws: bool) -> str:
    """watch | list | get | other, for the per-user request log."""
    if is_ws or path.endswith("/chats/watch"):
        return "watch"
    if method == "GET" and path.endswith("/chats"):
        return "list"
    if method == "GET" and "/chats/" in path and path.count("/") == 4:
        return "get"
    return "other"


class SimServer:
    """Serves one :class:`SimState`. ``start()`` binds and returns the base URL."""

    def __init__(self, state: SimState, *, tick_interval: float = 0.1) -> None:
        self.state = state
        self.tick_interval = tick_interval
        self.app = web.Application(middlewares=[self._middleware])
        self.app[STATE] = state
        self.chats = ChatsAPI(state)
        self.trees = TreeAPI(state, self.chats)
        self.watching = WatchSockets(state)
        self.admin = AdminAPI(state, self.watching)
        self._runner: web.AppRunner | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.url = ""
        # Connections that carried a Coder request (not /__sim), each one TCP (and with
        # TLS one handshake): what a client's keep-alive saves shows here.
        # Held while open (so no new connection can take a closed one's identity).
        self.connections = 0
        self._open: set[web.RequestHandler] = set()
        self._routes()

    # -- lifecycle ------------------------------------------------------------------

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, tls: ssl.SSLContext | None = None
    ) -> str:
        """Listen (HTTPS with ``tls``, a server context: watchd.sim.certs)."""
        self._runner = web.AppRunner(
            self.app, handle_signals=False, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=tls)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1] if site._server else port  # type: ignore[attr-defined]
        self.url = f"{'https' if tls else 'http'}://{host}:{bound}"
        self._ticker = asyncio.create_task(self._tick_forever(), name="sim:ticker")
        return self.url

    async def stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        self.watching.drop_all()
        if self._runner:
            await self._runner.cleanup()

    async def _tick_forever(self) -> None:
        while True:
            self.state.tick()
            await asyncio.sleep(self.tick_interval)

    # -- middleware: Date from the sim clock, faults, auth, rate limits --------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        state = self.state
        if request.path.startswith("/__sim"):
            return await handler(request)
        state.requests += 1
        if request.protocol not in self._open:
            self._open = {p for p in self._open if p.transport is not None}
            self._open.add(request.protocol)
            self.connections += 1
        try:
            if time.monotonic() < state.faults.unavailable_until:
                raise SimError(503, "Coder is restarting.")
            if state.faults.latency:
                await asyncio.sleep(state.faults.latency)
            user = self._authenticate(request)
            request[USER_KEY] = user
            is_ws = request.headers.get("Upgrade", "").lower() == "websocket"
            state.log_request(
                user.username,
                kind=_request_kind(request.method, request.path, is_ws),
                agent=request.headers.get("User-Agent", ""),
            )
            if not is_ws:
                if state.faults.throttle_next > 0:
                    state.faults.throttle_next -= 1
                    raise SimError(
                        429,
                        "You've been rate limited for sending more than 512 requests in 1m0s.",
                        headers={"Retry-After": f"{state.faults.throttle_retry_after:g}"},
                    )
                if state.faults.error_rate and state.rng.random() < state.faults.error_rate:
                    raise SimError(state.faults.error_status, "Internal error.", "injected fault")
            # Keyed by the concrete path (httprate.KeyByEndpoint), not the route.
            rate_headers = state.check_rate(user.id, request.path)
            response = await handler(request)
            for k, v in rate_headers.items():
                response.headers.setdefault(k, v)
        except SimError as exc:
            if state.faults.echo_token:
                token = request.headers.get("Coder-Session-Token", "")
                exc.body["message"] = f"{exc.body['message']} (token {token})"
                exc.body["detail"] = f"request carried Coder-Session-Token: {token}"
            response = error_response(exc)
        except web.HTTPException as exc:
            response = json_response(exc.status, {"message": exc.reason})
        if not response.prepared:
            response.headers["Date"] = http_date(state.now() + state.faults.date_skew)
        return response

    def _authenticate(self, request: web.Request) -> SimUser:
        token = (
            request.headers.get("Coder-Session-Token")
            or request.cookies.get("coder_session_token")
            or request.query.get("coder_session_token")
        )
        if not token:
            raise SimError(401, 'Cookie "coder_session_token" or query parameter must be provided.')
        for user in self.state.users.values():
            if user.token == token:
                if user.revoked:
                    raise SimError(401, "API key expired.", "The API key has been revoked.")
                return user
        raise SimError(401, "API key is invalid.", "The API key secret is invalid.")

    # -- routing --------------------------------------------------------------------

    def _routes(self) -> None:
        r = self.app.router
        for prefix in ("/api/v2", "/api/experimental"):
            r.add_get(prefix + "/chats", self._era(prefix, self.chats.list_chats))
            r.add_get(prefix + "/chats/watch", self._era(prefix, self.watching.watch))
            r.add_get(prefix + "/chats/{id}", self._era(prefix, self.chats.get_chat))
            r.add_patch(prefix + "/chats/{id}", self._era(prefix, self.chats.patch_chat))
            r.add_post(prefix + "/chats/{id}/interrupt", self._era(prefix, self.chats.interrupt))
            r.add_post(prefix + "/chats/{id}/archive", self._era(prefix, self.chats.archive_post))
            r.add_get(prefix + "/chats/{id}/messages", self._era(prefix, self.chats.messages))
            r.add_post(
                prefix + "/chats/{id}/reconcile-invalid",
                self._era(prefix, self.chats.reconcile_invalid),
            )
            r.add_get(prefix + "/chats/{id}/cost", self._era(prefix, self.trees.cost))
        r.add_get("/api/v2/organizations/{org}/chats/tree", self._era("/api/v2", self.trees.tree))
        r.add_get("/api/v2/users/me", self.me)
        r.add_get("/api/v2/users/me/organizations", self.organizations)
        r.add_get("/api/v2/organizations/{org}/members/{user}/workspace-quota", self.quota)
        r.add_get("/api/v2/workspace-quota/{user}", self.quota)
        r.add_get("/api/v2/workspaces/{id}", self.workspace)
        r.add_get("/__sim/connections", self.connections_seen)
        self.admin.add_routes(r)

    def _era(self, prefix: str, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            era = self.state.era
            if prefix not in era.prefixes:
                raise SimError(404, "Route not found.")
            if handler == self.chats.archive_post and not era.archive_post:
                raise SimError(404, "Route not found.")
            if handler == self.chats.reconcile_invalid and not era.reconcile_invalid:
                raise SimError(404, "Route not found.")
            if handler == self.trees.cost and not era.chat_cost:
                raise SimError(404, "Route not found.")
            if request.method == "PATCH" and era.archive_post:
                raise SimError(405, "Method not allowed.")
            return await handler(request)

        return guarded

    async def connections_seen(self, request: web.Request) -> web.StreamResponse:
        """``GET /__sim/connections``: how many connections carried Coder requests."""
        return json_response(200, {"connections": self.connections})

    # -- users, quota, workspaces ---------------------------------------------------

    async def me(self, request: web.Request) -> web.StreamResponse:
        user = request[USER_KEY]
        return json_response(
            200,
            {
                "id": user.id,
                "username": user.username,
                "name": user.username,
                "email": f"{user.username}@example.com",
                "status": "active",
                "organization_ids": [user.org_id],
                "roles": [],
            },
        )

    async def organizations(self, request: web.Request) -> web.StreamResponse:
        user = request[USER_KEY]
        return json_response(
            200, [{"id": user.org_id, "name": "coder", "display_name": "Coder", "is_default": True}]
        )

    async def quota(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        caller = request[USER_KEY]
        if not state.faults.enterprise:
            raise SimError(404, "Route not found.")
        org = request.match_info.get("org", state.org_id)
        who = request.match_info["user"]
        target = None
        for u in state.users.values():
            if (who in ("me",) and u.id == caller.id) or who in (u.id, u.username):
                target = u
        if target is None or org != target.org_id or target.id != caller.id:
            raise SimError(404, NOT_FOUND)
        used = consumed(target, state.now())
        return json_response(200, {"credits_consumed": used, "budget": target.quota_budget})

    async def workspace(self, request: web.Request) -> web.StreamResponse:
        caller = request[USER_KEY]
        ws = self.state.workspaces.get(request.match_info["id"])
        if ws is None or ws.owner_id != caller.id:
            raise SimError(404, NOT_FOUND)
        return json_response(
            200,
            {
                "id": ws.id,
                "name": ws.name,
                "owner_id": ws.owner_id,
                "latest_build": {
                    "status": ws.build_status,
                    "transition": "start",
                    "daily_cost": ws.cost,
                    "job": _job(ws),
                    "resources": [
                        {
                            "name": "dev",
                            "agents": [
                                {
                                    "name": "main",
                                    "status": ws.agent_status,
                                    "lifecycle_state": ws.agent_lifecycle,
                                }
                            ],
                        }
                    ],
                },
            },
        )


def _job(ws: SimWorkspace) -> dict[str, str]:
    """A build's provisioner job as coderd sends it: ``error`` and ``error_code`` only
    when set (coderd omits empty ones)."""
    job = {"status": ws.job_status}
    if ws.job_error:
        job["error"] = ws.job_error
    if ws.error_code:
        job["error_code"] = ws.error_code
    return job
