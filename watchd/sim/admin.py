"""The simulator's admin API under ``/__sim`` (tests, demo, benchmarks, development):
inspect the state, add and move chats, inject faults, drop or flood watch sockets,
change the era, the clock, quota and workspaces.

Every change made through it is written to a bounded journal (``GET /__sim/history``)
stamped with the simulated server's clock and the host's, and with how many of the
owner's watch sockets its event was queued to: what each chat's status was and when, as
the server knows it (the soak's oracle judges the daemon against it).

Never authenticated and never rate limited: it is not part of Coder's API, and the
middleware lets it through untouched.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from aiohttp import web

from watchd.sim import quota
from watchd.sim.payloads import json_response
from watchd.sim.records import SimChat, Step, Subscriber, iso
from watchd.sim.state import SimState
from watchd.sim.watch import WatchSockets

# Journal entries kept (the oldest go first, counted): a 30-minute soak writes ~20 000.
HISTORY_LIMIT = 500_000


class Journal:
    """What the admin API did to the world, in order: ``seq``, ``kind``, ``at`` (the
    simulated server's clock), ``wall`` (the host's) and the kind's own fields. A chat's
    entry carries its ``status`` and ``updated_at`` after the change and ``heard``: how
    many of the owner's open watch sockets its event was queued to (0 when silent, when
    nobody watched, or when a full buffer dropped it)."""

    def __init__(self, state: SimState, limit: int = HISTORY_LIMIT) -> None:
        self.state = state
        self.entries: deque[dict[str, Any]] = deque(maxlen=limit)
        self.seq = 0
        self.dropped = 0

    def write(self, kind: str, **fields: Any) -> None:
        if len(self.entries) == self.entries.maxlen:
            self.dropped += 1
        self.seq += 1
        s = self.state
        self.entries.append(
            {"seq": self.seq, "kind": kind, "at": s.now(), "wall": s.wall(), **fields}
        )

    def chat(self, kind: str, chat: SimChat, *, heard: int, **fields: Any) -> None:
        self.write(
            kind,
            chat=chat.id,
            owner=self.state.users[chat.owner_id].username,
            status=chat.status,
            updated_at=chat.updated_at,
            archived=chat.archived,
            heard=heard,
            **fields,
        )

    def queues(self, owner_id: str) -> dict[Subscriber, int]:
        """The owner's watch sockets and their queue lengths, before an event."""
        return {s: s.queue.qsize() for s in self.state.subscribers if s.user_id == owner_id}

    @staticmethod
    def heard(before: dict[Subscriber, int], events: int = 1) -> int:
        """Sockets whose queue took ``events`` more since ``before`` (no await between)."""
        return sum(1 for sub, n in before.items() if sub.queue.qsize() >= n + events)

    def after(self, seq: int) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["seq"] > seq]


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
        self.journal = Journal(state)

    def add_routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/__sim/state", self.admin_state)
        r.add_get("/__sim/history", self.admin_history)
        r.add_get("/__sim/watching", self.admin_watching)
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
                        "updated_at": c.updated_at,
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

    async def admin_history(self, request: web.Request) -> web.StreamResponse:
        """The journal after ``?after=SEQ`` (default: all of it), and how many of its
        oldest entries were dropped for room."""
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            return json_response(400, {"message": "bad admin request: after"})
        j = self.journal
        return json_response(200, {"entries": j.after(after), "seq": j.seq, "dropped": j.dropped})

    async def admin_watching(self, request: web.Request) -> web.StreamResponse:
        """Who holds a watch socket now (username → User-Agents), cheap enough to poll."""
        s = self.state
        return json_response(200, {"at": s.now(), "wall": s.wall(), "watching": _watching(s)})

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
            before = self.journal.queues(owner.id)
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
        self.journal.chat("created", chat, heard=self.journal.heard(before))
        return json_response(200, {"id": chat.id})

    async def admin_status(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return json_response(404, {"message": "no such chat"})
        chat = self.state.chats[cid]
        silent = bool(body.get("silent"))
        before = self.journal.queues(chat.owner_id)
        try:
            chat.script.clear()
            self.state.set_status(
                cid, body["status"], silent=silent, last_error=body.get("last_error")
            )
        except (KeyError, ValueError) as exc:
            return json_response(400, {"message": f"bad admin request: {exc}"})
        self.journal.chat("status", chat, heard=self.journal.heard(before), silent=silent)
        return json_response(200, {"ok": True, "updated_at": chat.updated_at})

    async def admin_archive(self, request: web.Request) -> web.StreamResponse:
        """Archive as coderd does (``deleted`` published for every family member)."""
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return json_response(404, {"message": "no such chat"})
        family = self.state.members(self.state.chats[cid])
        before = self.journal.queues(family[0].owner_id)
        self.state.archive(cid)
        heard = self.journal.heard(before, len(family))
        for member in family:
            self.journal.chat("archived", member, heard=heard)
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
            self.journal.chat("bumped", self.state.chats[cid], heard=0)
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
        """Hard delete (a retention purge): the chat and its children, no watch event."""
        cid = request.match_info["id"]
        if cid not in self.state.chats:
            return json_response(404, {"message": "no such chat"})
        family = [self.state.chats[cid], *self.state.children_of(cid)]
        self.state.delete(cid)
        for member in family:
            self.journal.chat("deleted", member, heard=0)
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
        self.journal.write("faults", faults=body)
        return json_response(200, {"ok": True})

    async def admin_drop(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        code = int(body.get("code", 1001))
        n = self.state.drop_watch(code=code)
        self.journal.write("drop", code=code, dropped=n)
        return json_response(200, {"dropped": n})

    async def admin_restart(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        downtime = float(body.get("downtime", 2.0))
        self.state.restart(downtime)
        self.journal.write("restart", downtime=downtime)
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
        before = self.state.clock_offset
        self.state.clock_offset = float(body["offset"])
        self.journal.write("clock", before=before, offset=self.state.clock_offset)
        return json_response(200, {"ok": True})
