"""The simulator's HTTP face: Coder's chats routes for the configured era, the
watch WebSocket, users/quota/workspace routes, and an admin API under ``/__sim``.

Status codes and bodies follow docs/coder-api.md. Auth runs before
every handler (a bad token on the watch gets a plain 401, not a 101).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from watchd.sim.state import (
    ACTIVE,
    ARCHIVABLE,
    SimChat,
    SimError,
    SimState,
    SimUser,
    Step,
    iso,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

NOT_FOUND = "Resource not found or you do not have access to this resource"
Q_KEYS = frozenset(
    {
        "archived",
        "has_unread",
        "title",
        "pr_status",
        "source",
        "diff_url",
        "pr",
        "repo",
        "pr_title",
        "search",
    }
)
USER_KEY: web.RequestKey[SimUser] = web.RequestKey("user", SimUser)
STATE: web.AppKey[SimState] = web.AppKey("state", SimState)


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )


def _error(exc: SimError) -> web.Response:
    return _json(exc.status, exc.body, exc.headers)


def _watching(state: SimState) -> dict[str, list[str]]:
    names = {u.id: u.username for u in state.users.values()}
    out: dict[str, list[str]] = {}
    for sub in state.subscribers:
        out.setdefault(names.get(sub.user_id, sub.user_id), []).append(sub.agent)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _request_kind(method: str, path: str, is_ws: bool) -> str:
    """watch | list | get | other, for the per-user request log."""
    if is_ws or path.endswith("/chats/watch"):
        return "watch"
    if method == "GET" and path.endswith("/chats"):
        return "list"
    if method == "GET" and "/chats/" in path and path.count("/") == 4:
        return "get"
    return "other"


def _date(ts: float) -> str:
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(ts))


class SimServer:
    """Serves one :class:`SimState`. ``start()`` binds and returns the base URL."""

    def __init__(self, state: SimState, *, tick_interval: float = 0.1) -> None:
        self.state = state
        self.tick_interval = tick_interval
        self.app = web.Application(middlewares=[self._middleware])
        self.app[STATE] = state
        self._sockets: dict[Any, web.WebSocketResponse] = {}
        self._runner: web.AppRunner | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.url = ""
        state.on_drop.append(self._drop)
        self._routes()

    # -- lifecycle ------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(
            self.app, handle_signals=False, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1] if site._server else port  # type: ignore[attr-defined]
        self.url = f"http://{host}:{bound}"
        self._ticker = asyncio.create_task(self._tick_forever(), name="sim:ticker")
        return self.url

    async def stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for sub in list(self._sockets):
            self._drop(sub, 1001)
        if self._runner:
            await self._runner.cleanup()

    async def _tick_forever(self) -> None:
        while True:
            self.state.tick()
            await asyncio.sleep(self.tick_interval)

    def _drop(self, sub: Any, code: int) -> None:
        ws = self._sockets.get(sub)
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

    # -- middleware: Date from the sim clock, faults, auth, rate limits --------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        state = self.state
        if request.path.startswith("/__sim"):
            return await handler(request)
        state.requests += 1
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
            response = _error(exc)
        except web.HTTPException as exc:
            response = _json(exc.status, {"message": exc.reason})
        if not response.prepared:
            response.headers["Date"] = _date(state.now())
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
            r.add_get(prefix + "/chats", self._era(prefix, self.list_chats))
            r.add_get(prefix + "/chats/watch", self._era(prefix, self.watch))
            r.add_get(prefix + "/chats/{id}", self._era(prefix, self.get_chat))
            r.add_patch(prefix + "/chats/{id}", self._era(prefix, self.patch_chat))
            r.add_post(prefix + "/chats/{id}/interrupt", self._era(prefix, self.interrupt))
            r.add_post(prefix + "/chats/{id}/archive", self._era(prefix, self.archive_post))
            r.add_get(prefix + "/chats/{id}/messages", self._era(prefix, self.messages))
            r.add_post(
                prefix + "/chats/{id}/reconcile-invalid",
                self._era(prefix, self.reconcile_invalid),
            )
        r.add_get("/api/v2/users/me", self.me)
        r.add_get("/api/v2/users/me/organizations", self.organizations)
        r.add_get("/api/v2/organizations/{org}/members/{user}/workspace-quota", self.quota)
        r.add_get("/api/v2/workspace-quota/{user}", self.quota)
        r.add_get("/api/v2/workspaces/{id}", self.workspace)
        r.add_get("/__sim/state", self.admin_state)
        r.add_post("/__sim/chats", self.admin_add_chat)
        r.add_post("/__sim/chats/{id}/status", self.admin_status)
        r.add_post("/__sim/chats/{id}/archive", self.admin_archive)
        r.add_post("/__sim/chats/{id}/bump", self.admin_bump)
        r.add_post("/__sim/chats/{id}/invalid", self.admin_invalid)
        r.add_delete("/__sim/chats/{id}", self.admin_delete)
        r.add_post("/__sim/faults", self.admin_faults)
        r.add_post("/__sim/drop-watch", self.admin_drop)
        r.add_post("/__sim/restart", self.admin_restart)
        r.add_post("/__sim/users/{username}/revoke", self.admin_revoke)
        r.add_post("/__sim/era", self.admin_era)
        r.add_post("/__sim/users/{username}/quota", self.admin_quota)
        r.add_post("/__sim/firehose", self.admin_firehose)
        r.add_post("/__sim/workspaces", self.admin_workspace)
        r.add_post("/__sim/clock", self.admin_clock)

    def _era(self, prefix: str, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            era = self.state.era
            if prefix not in era.prefixes:
                raise SimError(404, "Route not found.")
            if handler == self.archive_post and not era.archive_post:
                raise SimError(404, "Route not found.")
            if handler == self.reconcile_invalid and not era.reconcile_invalid:
                raise SimError(404, "Route not found.")
            if request.method == "PATCH" and era.archive_post:
                raise SimError(405, "Method not allowed.")
            return await handler(request)

        return guarded

    def _own_chat(self, request: web.Request) -> SimChat:
        user = request[USER_KEY]
        cid = request.match_info["id"]
        try:
            uuid.UUID(cid)
        except ValueError:
            raise SimError(
                400,
                "Invalid chat ID.",
                validations=[{"field": "chat", "detail": "must be a valid UUID"}],
            ) from None
        chat = self.state.chats.get(cid)
        if chat is None or chat.owner_id != user.id:
            raise SimError(404, NOT_FOUND)
        return chat

    # -- chats ----------------------------------------------------------------------

    def _pagination(self, request: web.Request) -> tuple[int, int, str | None]:
        errors = []
        limit_raw = request.query.get("limit")
        offset_raw = request.query.get("offset", "0")
        limit = 0
        offset = 0
        try:
            limit = int(limit_raw) if limit_raw is not None else 0
            if limit < 0 or limit > 2**31 - 1:
                raise ValueError
        except ValueError:
            errors.append(
                {
                    "field": "limit",
                    "detail": 'Query param "limit" must be a valid non-negative integer.',
                }
            )
        try:
            offset = int(offset_raw)
            if offset < 0:
                raise ValueError
        except ValueError:
            errors.append(
                {
                    "field": "offset",
                    "detail": 'Query param "offset" must be a valid non-negative integer.',
                }
            )
        after = request.query.get("after_id") or None
        if after:
            try:
                uuid.UUID(after)
            except ValueError:
                errors.append({"field": "after_id", "detail": "must be a valid UUID"})
        if errors:
            raise SimError(400, "Query parameters have invalid values.", validations=errors)
        return (limit or 50), offset, after

    def _parse_q(self, q: str) -> dict[str, str]:
        try:
            words = shlex.split(q)
        except ValueError:
            raise SimError(400, "Invalid search query.", "unbalanced quotes") from None
        out: dict[str, str] = {}
        for word in words:
            if ":" not in word:
                raise SimError(
                    400,
                    "Invalid search query.",
                    validations=[
                        {
                            "field": "q",
                            "detail": f"Query element {word!r} can only contain 1 ':'"
                            " and must be key:value",
                        }
                    ],
                )
            key, value = word.split(":", 1)
            if key not in Q_KEYS:
                raise SimError(
                    400,
                    "Invalid search query.",
                    validations=[
                        {"field": key, "detail": f"Query param {key!r} is not a valid query param"}
                    ],
                )
            out[key] = value
        if "archived" in out and out["archived"] not in ("true", "false"):
            raise SimError(
                400,
                "Invalid search query.",
                validations=[{"field": "archived", "detail": "must be a boolean"}],
            )
        return out

    async def list_chats(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        user = request[USER_KEY]
        limit, offset, after = self._pagination(request)
        q = self._parse_q(request.query.get("q", ""))
        page = state.listing_page(user.id, first=after is None and offset == 0)
        archived = q.get("archived", "false") == "true"
        wanted_labels = []
        for raw in request.query.getall("label", []):
            if ":" not in raw:
                raise SimError(
                    400,
                    "Invalid label filter.",
                    validations=[{"field": "label", "detail": "must be key:value"}],
                )
            wanted_labels.append(tuple(raw.split(":", 1)))
        rows = [
            c
            for c in state.chats_of(user.id)
            if c.archived == archived
            and (not state.era.embed_children or c.parent_id is None)
            and all(c.labels.get(k) == v for k, v in wanted_labels)
            and ("title" not in q or q["title"].lower() in c.title.lower())
        ]

        def order(c: SimChat) -> tuple[int, int, float]:
            return (0 if c.pin_order > 0 else 1, c.pin_order, -c.updated_at)

        # pinned first, pin_order, updated_at DESC, then id DESC: two stable sorts.
        rows.sort(key=lambda c: c.id, reverse=True)
        rows.sort(key=order)
        if after:
            cursor = state.chats.get(after)
            if cursor is None:
                rows = []
            else:
                # Keyset: rows strictly after the cursor's current position in this order.
                key = (*order(cursor), cursor.id)
                rows = [
                    c
                    for c in rows
                    if order(c) > key[:3] or (order(c) == key[:3] and c.id < cursor.id)
                ]
        rows = rows[offset : offset + limit]
        body = [state.chat_json(c) for c in rows]
        state.listing_page_served(user.id, page)
        return _json(200, body)

    async def get_chat(self, request: web.Request) -> web.StreamResponse:
        chat = self._own_chat(request)
        return _json(200, self.state.chat_json(chat, single=True))

    async def interrupt(self, request: web.Request) -> web.StreamResponse:
        try:
            response = await self._interrupt(request)
        except SimError as exc:
            self.state.mutations.append(("interrupt", request.match_info["id"], exc.status))
            raise
        self.state.mutations.append(("interrupt", request.match_info["id"], response.status))
        return response

    async def _interrupt(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        chat = self._own_chat(request)
        if not state.faults.chatd_enabled:
            raise SimError(503, "AI Gateway must be enabled to use chats.")
        if chat.archived:
            raise SimError(400, "Cannot interrupt an archived chat.")
        state.check_mutable(chat)
        if state.era.state_machine:
            if chat.status not in ("running", "requires_action"):
                raise SimError(
                    409,
                    "Chat is not in an interruptible state.",
                    f"transition not allowed: Interrupt from {chat.status}",
                )
            state.set_status(chat.id, "interrupting")
        elif chat.status in ACTIVE or chat.status == "requires_action":
            chat.script.clear()
            state.set_status(chat.id, "waiting")
        return _json(200, state.chat_json(chat, single=True))

    async def patch_chat(self, request: web.Request) -> web.StreamResponse:
        chat = self._own_chat(request)
        try:
            body = await request.json()
        except ValueError:
            raise SimError(400, "Request body must be valid JSON.") from None
        if not isinstance(body, dict):
            raise SimError(400, "Request body must be a JSON object.")
        allowed = {"archived", "title", "labels", "pin_order", "plan_mode", "workspace_id"}
        unknown = set(body) - allowed
        if unknown:
            raise SimError(
                400,
                "Invalid request body.",
                validations=[{"field": k, "detail": "unknown field"} for k in sorted(unknown)],
            )
        self.state.check_mutable(chat)
        if "archived" in body:
            if not isinstance(body["archived"], bool):
                raise SimError(
                    400,
                    "Invalid request body.",
                    validations=[{"field": "archived", "detail": "must be a boolean"}],
                )
            if body["archived"]:
                self._archive(chat)
            else:
                if chat.parent_id is not None:
                    raise SimError(400, "Chat archive state can only be changed on the root chat.")
                if not chat.archived:
                    raise SimError(400, "Chat is not archived.")
                self.state.unarchive(chat.id)
        if "title" in body and isinstance(body["title"], str):
            chat.title = body["title"]
        return web.Response(status=204)

    def _archive(self, chat: SimChat) -> None:
        try:
            self._archive_checked(chat)
        except SimError as exc:
            self.state.mutations.append(("archive", chat.id, exc.status))
            raise
        self.state.mutations.append(("archive", chat.id, 204))

    def _archive_checked(self, chat: SimChat) -> None:
        state = self.state
        if not state.faults.chatd_enabled:
            raise SimError(503, "AI Gateway must be enabled to use chats.")
        if chat.parent_id is not None:
            raise SimError(400, "Chat archive state can only be changed on the root chat.")
        if chat.archived:
            raise SimError(400, "Chat is already archived.")
        if state.era.state_machine:
            if chat.status not in ARCHIVABLE:
                raise SimError(
                    409,
                    "Cannot archive an active chat. Interrupt or wait for the "
                    "chat to finish first.",
                )
        else:
            for member in state.family(chat):
                if member.status in ACTIVE or member.status == "requires_action":
                    member.script.clear()
                    state.set_status(member.id, "waiting")
        state.archive(chat.id)

    async def archive_post(self, request: web.Request) -> web.StreamResponse:
        chat = self._own_chat(request)
        self.state.check_mutable(chat)
        self._archive(chat)
        return web.Response(status=204)

    async def reconcile_invalid(self, request: web.Request) -> web.StreamResponse:
        """``POST …/reconcile-invalid`` (newest servers): an inconsistent chat → ``error``.
        The answer for a consistent chat is not known from coderd's source; the simulator
        refuses it with 409 so a client cannot rely on it being harmless."""
        chat = self._own_chat(request)
        try:
            self.state.reconcile_invalid(chat)
        except SimError as exc:
            self.state.mutations.append(("reconcile_invalid", chat.id, exc.status))
            raise
        self.state.mutations.append(("reconcile_invalid", chat.id, 200))
        return _json(200, self.state.chat_json(chat, single=True))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        chat = self._own_chat(request)
        q = request.query
        try:
            limit = int(q.get("limit", "50"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= 200:
            raise SimError(400, "Invalid limit parameter (1-200).")
        before = after = None
        for name in ("before_id", "after_id"):
            if name in q:
                try:
                    value = int(q[name])
                    if value <= 0:
                        raise ValueError
                except ValueError:
                    raise SimError(400, f"Invalid {name} parameter.") from None
                if name == "before_id":
                    before = value
                else:
                    after = value
        if before is not None and after is not None and after >= before:
            raise SimError(400, "after_id must be less than before_id.")
        msgs = chat.messages
        if before is not None:
            msgs = [m for m in msgs if m["id"] < before]
        if after is not None:
            msgs = [m for m in msgs if m["id"] > after]
        ascending = after is not None and before is None
        msgs = sorted(msgs, key=lambda m: m["id"], reverse=not ascending)
        page = msgs[:limit]
        return _json(
            200,
            {
                "messages": page,
                "queued_messages": [],
                "has_more": len(msgs) > limit,
            },
        )

    # -- the watch socket -----------------------------------------------------------

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
        ws.headers["Date"] = _date(state.now())
        try:
            await ws.prepare(request)
        except Exception:
            state.unsubscribe(sub)
            raise
        self._sockets[sub] = ws
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
            self._sockets.pop(sub, None)
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

    # -- users, quota, workspaces ---------------------------------------------------

    async def me(self, request: web.Request) -> web.StreamResponse:
        user = request[USER_KEY]
        return _json(
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
        return _json(
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
        return _json(
            200, {"credits_consumed": target.credits_consumed, "budget": target.quota_budget}
        )

    async def workspace(self, request: web.Request) -> web.StreamResponse:
        caller = request[USER_KEY]
        ws = self.state.workspaces.get(request.match_info["id"])
        if ws is None or ws.owner_id != caller.id:
            raise SimError(404, NOT_FOUND)
        return _json(
            200,
            {
                "id": ws.id,
                "name": ws.name,
                "owner_id": ws.owner_id,
                "latest_build": {
                    "status": ws.build_status,
                    "transition": "start",
                    "daily_cost": ws.cost,
                    "job": {"status": ws.job_status, "error_code": ws.error_code},
                },
            },
        )

    # -- admin API (tests, demo, development) ---------------------------------------

    async def admin_state(self, request: web.Request) -> web.StreamResponse:
        s = self.state
        return _json(
            200,
            {
                "era": s.era.name,
                "users": [
                    {"id": u.id, "username": u.username, "revoked": u.revoked}
                    for u in s.users.values()
                ],
                "chats": [
                    {
                        "id": c.id,
                        "owner": s.users[c.owner_id].username,
                        "status": c.status,
                        "archived": c.archived,
                        "title": c.title,
                        "parent_id": c.parent_id,
                    }
                    for c in s.chats.values()
                ],
                "client_data_frames": s.client_data_frames,
                "mutations": [list(m) for m in s.mutations],
                "published": s.published,
                "lost": s.lost,
                "requests": s.requests,
                "requests_by_user": s.requests_by_user,
                # Open watch sockets now: username → the User-Agents holding them.
                "watching": _watching(s),
                "watchers": len(s.subscribers),
            },
        )

    async def admin_add_chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        s = self.state
        try:
            owner = s.user(body["owner"])
            script = [
                Step(st["status"], st.get("after"), st.get("silent", False))
                for st in body.get("script", [])
            ]
            parent = s.chats[body["parent_id"]] if body.get("parent_id") else None
            workspace = s.workspaces[body["workspace_id"]] if body.get("workspace_id") else None
            chat = s.add_chat(
                owner,
                title=body.get("title", "chat"),
                status=body.get("status", "running"),
                script=script,
                labels=body.get("labels"),
                parent=parent,
                age=float(body.get("age", 0)),
                queued_for_capacity=bool(body.get("queued_for_capacity")),
                progress_every=body.get("progress_every"),
                workspace=workspace,
                wedged=bool(body.get("wedged")),
                publish=bool(body.get("publish", True)),
                mode=body.get("mode"),
            )
        except (KeyError, ValueError) as exc:
            return _json(400, {"message": f"bad admin request: {exc}"})
        return _json(200, {"id": chat.id})

    async def admin_status(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return _json(404, {"message": "no such chat"})
        try:
            self.state.chats[cid].script.clear()
            self.state.set_status(
                cid,
                body["status"],
                silent=bool(body.get("silent")),
                last_error=body.get("last_error"),
            )
        except (KeyError, ValueError) as exc:
            return _json(400, {"message": f"bad admin request: {exc}"})
        return _json(200, {"ok": True})

    async def admin_archive(self, request: web.Request) -> web.StreamResponse:
        """Archive as coderd does (``deleted`` published for every family member)."""
        self.state.archive(request.match_info["id"])
        return _json(200, {"ok": True})

    async def admin_bump(self, request: web.Request) -> web.StreamResponse:
        """A step commit now, or (``{"after_page": N}``) after page N of every later
        listing by its owner (0: as each listing starts; null: disarm): the chat moves in
        the order, nothing is published."""
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return _json(404, {"message": "no such chat"})
        body = await request.json() if request.can_read_body else {}
        after = body.get("after_page")
        if after is None:
            self.state.bump(cid)
        elif isinstance(after, int) and after >= 0:
            self.state.bump_after_page[cid] = after
        else:
            self.state.bump_after_page.pop(cid, None)
        return _json(200, {"ok": True})

    async def admin_invalid(self, request: web.Request) -> web.StreamResponse:
        """Put a chat's execution state out of joint (``{"invalid": false}`` to undo)."""
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return _json(404, {"message": "no such chat"})
        body = await request.json() if request.can_read_body else {}
        self.state.chats[cid].invalid_state = bool(body.get("invalid", True))
        return _json(200, {"ok": True})

    async def admin_delete(self, request: web.Request) -> web.StreamResponse:
        self.state.delete(request.match_info["id"])
        return _json(200, {"ok": True})

    async def admin_faults(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        faults = self.state.faults
        for key, value in body.items():
            if not hasattr(faults, key):
                return _json(400, {"message": f"unknown fault {key!r}"})
            if key == "unavailable_for":
                continue
            setattr(faults, key, value)
        return _json(200, {"ok": True})

    async def admin_drop(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        n = self.state.drop_watch(code=int(body.get("code", 1001)))
        return _json(200, {"dropped": n})

    async def admin_restart(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        self.state.restart(float(body.get("downtime", 2.0)))
        return _json(200, {"ok": True})

    async def admin_revoke(self, request: web.Request) -> web.StreamResponse:
        self.state.revoke(request.match_info["username"])
        return _json(200, {"ok": True})

    async def admin_firehose(self, request: web.Request) -> web.StreamResponse:
        """Benchmarks: send ``count`` status_change frames to every watch socket, as fast as
        the socket takes them. Frames are encoded up front so the producer is cheap."""
        body = await request.json()
        count = int(body.get("count", 10_000))
        chats = max(1, int(body.get("chats", 100)))
        # Stamped up to now, never ahead: a client rightly clamps stamps from the future.
        start = self.state.now() - count * 1e-3
        jobs = []
        for sub, ws in list(self._sockets.items()):
            user = self.state.users[sub.user_id]
            ids = [f"{user.id[:8]}-0000-4000-8000-{i:012d}" for i in range(chats)]
            frames = []
            for n in range(count):
                status = "running" if (n // chats) % 2 == 0 else "waiting"
                ts = iso(start + n * 1e-3)
                frames.append(
                    '{"kind":"status_change","chat":{"id":"'
                    + ids[n % chats]
                    + '","owner_id":"'
                    + user.id
                    + '","title":"bench","status":"'
                    + status
                    + '","created_at":"'
                    + ts
                    + '","updated_at":"'
                    + ts
                    + '","root_chat_id":"'
                    + ids[n % chats]
                    + '"}}\n'
                )
            jobs.append(self._blast(ws, frames))
        t0 = time.monotonic()
        await asyncio.gather(*jobs)
        return _json(
            200,
            {
                "sockets": len(jobs),
                "frames": count * len(jobs),
                "seconds": round(time.monotonic() - t0, 3),
            },
        )

    @staticmethod
    async def _blast(ws: web.WebSocketResponse, frames: list[str]) -> None:
        for frame in frames:
            await ws.send_str(frame)

    async def admin_quota(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        user = self.state.user(request.match_info["username"])
        if "budget" in body:
            user.quota_budget = int(body["budget"])
        if "consumed" in body:
            user.credits_consumed = int(body["consumed"])
        return _json(200, {"budget": user.quota_budget, "consumed": user.credits_consumed})

    async def admin_workspace(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ws = self.state.add_workspace(
            self.state.user(body["owner"]),
            build_status=body.get("build_status", "running"),
            job_status=body.get("job_status", "succeeded"),
            error_code=body.get("error_code", ""),
        )
        return _json(200, {"id": ws.id})

    async def admin_era(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.state.set_era(body["era"])
        self.state.drop_watch(code=1001)
        return _json(200, {"ok": True})

    async def admin_clock(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.state.clock_offset = float(body["offset"])
        return _json(200, {"ok": True})
