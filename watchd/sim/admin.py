"""The simulator's admin API under ``/__sim`` (tests, demo, benchmarks, development):
inspect the state, add and move chats, inject faults, drop or flood watch sockets,
change the era, the clock, quota and workspaces.

Never authenticated and never rate limited: it is not part of Coder's API, and the
middleware lets it through untouched.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from watchd.sim import quota
from watchd.sim.payloads import json_response
from watchd.sim.records import Step, iso
from watchd.sim.state import SimState
from watchd.sim.watch import WatchSockets


def _watching(state: SimState) -> dict[str, list[str]]:
    names = {u.id: u.username for u in state.users.values()}
    out: dict[str, list[str]] = {}
    for sub in state.subscribers:
        out.setdefault(names.get(sub.user_id, sub.user_id), []).append(sub.agent)
    return {k: sorted(v) for k, v in sorted(out.items())}


class AdminAPI:
    """The ``/__sim`` handlers over one :class:`SimState` and its watch sockets."""

    def __init__(self, state: SimState, sockets: WatchSockets) -> None:
        self.state = state
        self.sockets = sockets

    def add_routes(self, r: web.UrlDispatcher) -> None:
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

    async def admin_state(self, request: web.Request) -> web.StreamResponse:
        s = self.state
        return json_response(
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
            return json_response(400, {"message": f"bad admin request: {exc}"})
        return json_response(200, {"id": chat.id})

    async def admin_status(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return json_response(404, {"message": "no such chat"})
        try:
            self.state.chats[cid].script.clear()
            self.state.set_status(
                cid,
                body["status"],
                silent=bool(body.get("silent")),
                last_error=body.get("last_error"),
            )
        except (KeyError, ValueError) as exc:
            return json_response(400, {"message": f"bad admin request: {exc}"})
        return json_response(200, {"ok": True})

    async def admin_archive(self, request: web.Request) -> web.StreamResponse:
        """Archive as coderd does (``deleted`` published for every family member)."""
        self.state.archive(request.match_info["id"])
        return json_response(200, {"ok": True})

    async def admin_bump(self, request: web.Request) -> web.StreamResponse:
        """A step commit now, or (``{"after_page": N}``) after page N of every later
        listing by its owner (0: as each listing starts; null: disarm): the chat moves in
        the order, nothing is published."""
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return json_response(404, {"message": "no such chat"})
        body = await request.json() if request.can_read_body else {}
        after = body.get("after_page")
        if after is None:
            self.state.bump(cid)
        elif isinstance(after, int) and after >= 0:
            self.state.bump_after_page[cid] = after
        else:
            self.state.bump_after_page.pop(cid, None)
        return json_response(200, {"ok": True})

    async def admin_invalid(self, request: web.Request) -> web.StreamResponse:
        """Put a chat's execution state out of joint (``{"invalid": false}`` to undo)."""
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return json_response(404, {"message": "no such chat"})
        body = await request.json() if request.can_read_body else {}
        self.state.chats[cid].invalid_state = bool(body.get("invalid", True))
        return json_response(200, {"ok": True})

    async def admin_delete(self, request: web.Request) -> web.StreamResponse:
        self.state.delete(request.match_info["id"])
        return json_response(200, {"ok": True})

    async def admin_faults(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        faults = self.state.faults
        for key, value in body.items():
            if not hasattr(faults, key):
                return json_response(400, {"message": f"unknown fault {key!r}"})
            if key == "unavailable_for":
                continue
            setattr(faults, key, value)
        return json_response(200, {"ok": True})

    async def admin_drop(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        n = self.state.drop_watch(code=int(body.get("code", 1001)))
        return json_response(200, {"dropped": n})

    async def admin_restart(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        self.state.restart(float(body.get("downtime", 2.0)))
        return json_response(200, {"ok": True})

    async def admin_revoke(self, request: web.Request) -> web.StreamResponse:
        self.state.revoke(request.match_info["username"])
        return json_response(200, {"ok": True})

    async def admin_firehose(self, request: web.Request) -> web.StreamResponse:
        """Benchmarks: send ``count`` status_change frames to every watch socket, as fast as
        the socket takes them. Frames are encoded up front so the producer is cheap."""
        body = await request.json()
        count = int(body.get("count", 10_000))
        chats = max(1, int(body.get("chats", 100)))
        # Stamped up to now, never ahead: a client rightly clamps stamps from the future.
        start = self.state.now() - count * 1e-3
        jobs = []
        for sub, ws in list(self.sockets.sockets.items()):
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
        return json_response(
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
        return json_response(200, quota.configure(user, body, self.state.now()))

    async def admin_workspace(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ws = self.state.add_workspace(
            self.state.user(body["owner"]),
            build_status=body.get("build_status", "running"),
            job_status=body.get("job_status", "succeeded"),
            error_code=body.get("error_code", ""),
            job_error=body.get("job_error", ""),
        )
        ws.agent_status = body.get("agent_status", ws.agent_status)
        ws.agent_lifecycle = body.get("agent_lifecycle", ws.agent_lifecycle)
        return json_response(200, {"id": ws.id})

    async def admin_era(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.state.set_era(body["era"])
        self.state.drop_watch(code=1001)
        return json_response(200, {"ok": True})

    async def admin_clock(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.state.clock_offset = float(body["offset"])
        return json_response(200, {"ok": True})
