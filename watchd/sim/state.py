"""The simulator's world: users, chats, workspaces, quota, watch subscribers,
the chat lifecycle engine, and faults on demand.

All of it is in-process and deterministic under a seed; the HTTP layer in
:mod:`watchd.sim.server` only translates requests into calls on this object.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
import zlib
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from watchd.sim.eras import ERAS, Era

ACTIVE = frozenset({"running", "pending", "interrupting"})
ARCHIVABLE = frozenset({"waiting", "error"})


def iso(ts: float, *, offset_minutes: int = 0) -> str:
    """Go's ``time.RFC3339Nano``, as coderd's ``encoding/json`` writes a ``time.Time``:
    0–9 fraction digits with trailing zeros trimmed (none at all on a whole second), and
    ``Z`` for UTC or ``±hh:mm`` for a time carried in another zone."""
    zone = UTC if not offset_minutes else timezone(timedelta(minutes=offset_minutes))
    whole = int(ts // 1)
    nanos = round((ts - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, 0
    dt = datetime.fromtimestamp(whole, tz=zone)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    if not offset_minutes:
        return text + "Z"
    sign = "+" if offset_minutes > 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    return f"{text}{sign}{hours:02d}:{minutes:02d}"


@dataclass
class Step:
    """Stay in ``status`` for ``after`` seconds, then move to the next step (None: forever)."""

    status: str
    after: float | None = None
    silent: bool = False  # the transition into this step is never published on the stream
    last_error: dict[str, Any] | None = None


@dataclass
class SimUser:
    id: str
    username: str
    token: str
    org_id: str
    revoked: bool = False
    quota_budget: int = -1
    credits_consumed: int = 0


@dataclass
class SimWorkspace:
    id: str
    owner_id: str
    name: str
    build_status: str = "running"  # pending | starting | running | failed | stopped
    job_status: str = "succeeded"
    error_code: str = ""
    cost: int = 10


@dataclass
class SimChat:
    id: str
    owner_id: str
    org_id: str
    title: str
    status: str
    created_at: float
    updated_at: float
    entered_at: float
    parent_id: str | None = None
    root_id: str | None = None
    workspace_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    last_error: Any = None
    archived: bool = False
    pin_order: int = 0
    queued_for_capacity: bool = False
    # computer_use | explore | orchestrator, or None (omitted on the wire).
    mode: str | None = None
    client_type: str = "api"
    warnings: list[str] = field(default_factory=list)
    context_error: str | None = None
    # The execution state is inconsistent: every mutation answers 409 "Chat is in an
    # invalid state." until POST …/reconcile-invalid moves the chat to `error`.
    invalid_state: bool = False
    script: deque[Step] = field(default_factory=deque)
    # While running, bump updated_at this often (CommitStep); None: no progress at all.
    progress_every: float | None = None
    # Interrupt never completes (a wedged runner): stays `interrupting`.
    wedged: bool = False
    interrupt_settle: float = 1.0
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Faults:
    event_loss: float = 0.0  # fraction of watch events silently not delivered
    error_rate: float = 0.0  # fraction of REST requests answered with error_status
    error_status: int = 500
    latency: float = 0.0  # seconds added to every REST response
    throttle_next: int = 0  # the next N REST requests answer 429
    throttle_retry_after: float = 1.0
    malformed_next: int = 0  # the next N watch frames are garbage
    unavailable_until: float = 0.0  # monotonic; 503 for everything until then (restart)
    subscribe_fail: bool = False  # the watch handler's pubsub subscribe fails (HTTP 500)
    chatd_enabled: bool = True  # False: mutations answer 503 "AI Gateway must be enabled"
    enterprise: bool = True  # False: quota routes 404 (OSS build)
    # Pooled admission (PR #27902): at most this many root / subagent chats generate at
    # once; the rest stay `running`, unowned, queued_for_capacity, without progress.
    capacity_roots: int | None = None
    capacity_children: int | None = None
    # Every error body quotes the request's token (a proxy or a debug build that echoes
    # the request): the client must keep it out of everything it shows.
    echo_token: bool = False


@dataclass(eq=False)
class Subscriber:
    user_id: str
    queue: asyncio.Queue[dict[str, Any] | None]
    dropped: int = 0
    agent: str = ""  # the watching client's User-Agent


class SimError(Exception):
    """An error answer: status and Coder's ``{message, detail}`` body."""

    def __init__(
        self,
        status: int,
        message: str,
        detail: str = "",
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        self.status = status
        self.headers = headers or {}
        self.body: dict[str, Any] = {"message": message, **extra}
        if detail:
            self.body["detail"] = detail
        super().__init__(message)


class SimState:
    def __init__(
        self,
        *,
        era: str = "E",
        seed: int = 1,
        clock_offset: float = 0.0,
        ping_interval: float = 15.0,
        rate_limit: int = 512,
        subscriber_buffer: int = 1024,
        utc_offsets: tuple[int, ...] = (0,),
    ) -> None:
        self.era: Era = ERAS[era]
        self.rng = random.Random(seed)
        self.clock_offset = clock_offset
        self.ping_interval = ping_interval
        self.rate_limit = rate_limit
        self.subscriber_buffer = subscriber_buffer
        # Zones (minutes east of UTC) timestamps are written in, one per chat by its id:
        # coderd writes whatever zone the time.Time carries (UTC unless the DB session's
        # zone differs), so a client must accept both `Z` and `±hh:mm`.
        self.utc_offsets = utc_offsets or (0,)
        self.users: dict[str, SimUser] = {}
        self.chats: dict[str, SimChat] = {}
        self.workspaces: dict[str, SimWorkspace] = {}
        self.subscribers: set[Subscriber] = set()
        self.faults = Faults()
        self.org_id = self.new_id()
        self.published = 0
        self.lost = 0
        self.oversize = 0
        self.requests = 0
        # Authenticated requests by username, kind (watch | list | get | other) and
        # User-Agent: who asked for what, e.g. which replica watches which identity.
        self.requests_by_user: dict[str, dict[str, dict[str, int]]] = {}
        self.client_data_frames = 0
        # Indexes so listings stay linear: parent → children, root → descendants.
        self._children: dict[str, list[str]] = {}
        self._family: dict[str, list[str]] = {}
        self._by_owner: dict[str, list[str]] = {}
        # Mutations that reached a handler: (method, chat id, outcome status).
        self.mutations: list[tuple[str, str, int]] = []
        # httprate's sliding window: (user, path) -> (current window start, count, previous count)
        self._rate: dict[tuple[str, str], tuple[int, int, int]] = {}
        # chat id -> page of a listing after which the chat is bumped (a step commit
        # landing while the client pages; tests use it to open the moving-cursor window).
        self.bump_after_page: dict[str, int] = {}
        self._listing_page: dict[str, int] = {}
        self._message_ids = 1000
        self.on_drop: list[Any] = []

    # -- time and ids ----------------------------------------------------------------

    def now(self) -> float:
        """The simulated server's clock (the host's, shifted by ``clock_offset``)."""
        return time.time() + self.clock_offset

    def log_request(self, username: str, *, kind: str, agent: str) -> None:
        kinds = self.requests_by_user.setdefault(username, {})
        agents = kinds.setdefault(kind, {})
        agents[agent] = agents.get(agent, 0) + 1

    def new_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def set_era(self, era: str) -> None:
        """Upgrade (or downgrade) the server in place, as a deployment would."""
        self.era = ERAS[era]

    # -- fixtures --------------------------------------------------------------------

    def add_user(
        self, username: str, *, token: str | None = None, budget: int = -1, consumed: int = 0
    ) -> SimUser:
        uid = self.new_id()
        secret = token or f"{uid[:10]}-{self.rng.getrandbits(120):030x}"
        user = SimUser(
            id=uid,
            username=username,
            token=secret,
            org_id=self.org_id,
            quota_budget=budget,
            credits_consumed=consumed,
        )
        self.users[uid] = user
        return user

    def user(self, username: str) -> SimUser:
        for u in self.users.values():
            if u.username == username:
                return u
        raise KeyError(username)

    def add_workspace(
        self,
        owner: SimUser,
        *,
        build_status: str = "running",
        job_status: str = "succeeded",
        error_code: str = "",
        cost: int = 10,
    ) -> SimWorkspace:
        ws = SimWorkspace(
            id=self.new_id(),
            owner_id=owner.id,
            name=f"ws-{len(self.workspaces)}",
            build_status=build_status,
            job_status=job_status,
            error_code=error_code,
            cost=cost,
        )
        self.workspaces[ws.id] = ws
        return ws

    def add_chat(
        self,
        owner: SimUser,
        *,
        title: str = "chat",
        status: str = "running",
        script: list[Step] | None = None,
        labels: dict[str, str] | None = None,
        workspace: SimWorkspace | None = None,
        parent: SimChat | None = None,
        age: float = 0.0,
        progress_every: float | None = None,
        queued_for_capacity: bool = False,
        publish: bool = True,
        wedged: bool = False,
        last_error: Any = None,
        mode: str | None = None,
    ) -> SimChat:
        """A chat that entered ``status`` ``age`` seconds ago, then follows ``script``."""
        self._check_status(status)
        for step in script or []:
            self._check_status(step.status)
        now = self.now()
        cid = self.new_id()
        root = parent.root_id or parent.id if parent else cid
        chat = SimChat(
            id=cid,
            owner_id=owner.id,
            org_id=owner.org_id,
            title=title,
            status=status,
            created_at=now - age,
            updated_at=now - age,
            entered_at=now - age,
            parent_id=parent.id if parent else None,
            root_id=root,
            workspace_id=workspace.id if workspace else None,
            labels=dict(labels or {}),
            script=deque(script or []),
            progress_every=progress_every,
            queued_for_capacity=queued_for_capacity,
            wedged=wedged,
            last_error=last_error,
            mode=mode,
        )
        chat.messages = [self._message(chat, "user", "Please do the thing.")]
        self.chats[cid] = chat
        self._by_owner.setdefault(owner.id, []).append(cid)
        if parent is not None:
            self._children.setdefault(parent.id, []).append(cid)
            if root != cid:
                self._family.setdefault(root, []).append(cid)
        if publish:
            self.publish(chat, "created")
        return chat

    def _message(self, chat: SimChat, role: str, text: str) -> dict[str, Any]:
        self._message_ids += 1
        return {
            "id": self._message_ids,
            "chat_id": chat.id,
            "role": role,
            "created_at": self.ts(self.now(), chat.id),
            "created_by": chat.owner_id,
            "content": [{"type": "text", "text": text}],
        }

    def _check_status(self, status: str) -> None:
        if status not in self.era.statuses:
            raise ValueError(f"status {status!r} does not exist in era {self.era.name}")

    # -- transitions -----------------------------------------------------------------

    def set_status(
        self, chat_id: str, status: str, *, silent: bool = False, last_error: Any = None
    ) -> SimChat:
        """Move a chat to ``status``, writing updated_at (every transition does)."""
        chat = self.chats[chat_id]
        self._check_status(status)
        now = self.now()
        chat.status = status
        chat.updated_at = now
        chat.entered_at = now
        chat.last_error = last_error if status == "error" else None
        if status == "error" and chat.last_error is None:
            chat.last_error = {
                "message": "The model provider failed.",
                "kind": "generic",
                "retryable": False,
            }
        if status != "running":
            chat.queued_for_capacity = False
        if status == "waiting":
            chat.messages.append(self._message(chat, "assistant", "Done."))
        if not silent:
            # Entering requires_action publishes only action_required (with the tool
            # calls), never a status_change.
            self.publish(
                chat, "action_required" if status == "requires_action" else "status_change"
            )
        return chat

    def bump(self, chat_id: str) -> None:
        """A step commit (``UpdateChatExecutionState``): ``updated_at`` moves, the status
        does not, and nothing is published on the watch stream."""
        self.chats[chat_id].updated_at = self.now()

    def listing_page(self, user_id: str, *, first: bool) -> int:
        """Called before each listing page is computed; returns its number. Chats armed
        with page 0 are bumped as a listing starts, so they sort above the rest."""
        page = 1 if first else self._listing_page.get(user_id, 0) + 1
        self._listing_page[user_id] = page
        if first:
            self._bump_armed(user_id, 0)
        return page

    def listing_page_served(self, user_id: str, page: int) -> None:
        """Called after a listing page was computed: bumps the chats armed for it."""
        self._bump_armed(user_id, page)

    def _bump_armed(self, user_id: str, page: int) -> None:
        for chat_id, after in list(self.bump_after_page.items()):
            chat = self.chats.get(chat_id)
            if chat is None:
                del self.bump_after_page[chat_id]
            elif chat.owner_id == user_id and after == page:
                self.bump(chat_id)

    def check_mutable(self, chat: SimChat) -> None:
        """``writeChatInvalidState``: every mutation of an inconsistent chat is refused."""
        if chat.invalid_state:
            raise SimError(409, "Chat is in an invalid state.")

    def reconcile_invalid(self, chat: SimChat) -> None:
        """``POST …/reconcile-invalid``: an inconsistent chat is moved to ``error``."""
        if not chat.invalid_state:
            raise SimError(409, "Chat is not in an invalid state.")
        chat.invalid_state = False
        chat.script.clear()
        self.set_status(
            chat.id,
            "error",
            last_error={
                "message": "The chat's execution state was invalid and has been reset.",
                "kind": "generic",
                "retryable": False,
            },
        )

    def _admit(self, now: float) -> None:
        """Apply the concurrency cap: the oldest running chats hold the slots."""
        f = self.faults
        if f.capacity_roots is None and f.capacity_children is None:
            return
        running = sorted(
            (c for c in self.chats.values() if c.status == "running" and not c.archived),
            key=lambda c: (c.queued_for_capacity, c.entered_at),
        )
        roots = children = 0
        for chat in running:
            if chat.parent_id is None:
                roots += 1
                over = f.capacity_roots is not None and roots > f.capacity_roots
            else:
                children += 1
                over = f.capacity_children is not None and children > f.capacity_children
            if over:
                # Capacity writes do not bump updated_at; the turn has not started.
                chat.queued_for_capacity = True
                chat.entered_at = now
            elif chat.queued_for_capacity:
                chat.queued_for_capacity = False
                chat.entered_at = now

    def tick(self) -> None:
        """Advance every scripted chat whose step has run its time."""
        now = self.now()
        self._admit(now)
        for chat in list(self.chats.values()):
            if chat.archived:
                continue
            if chat.queued_for_capacity:
                continue  # waiting for a slot: no progress, no script
            if (
                chat.status == "running"
                and chat.progress_every
                and now - chat.updated_at >= chat.progress_every
            ):
                chat.updated_at = now  # CommitStep: progress, same status, no publish
            if chat.status == "interrupting" and not chat.wedged:
                if now - chat.entered_at >= chat.interrupt_settle:
                    chat.script.clear()
                    self.set_status(chat.id, "waiting")
                continue
            if not chat.script:
                continue
            head = chat.script[0]
            if head.status != chat.status:
                # The chat was moved by hand; the script resumes from this step.
                self.set_status(
                    chat.id, head.status, silent=head.silent, last_error=head.last_error
                )
                continue
            if head.after is not None and now - chat.entered_at >= head.after:
                chat.script.popleft()
                if chat.script:
                    nxt = chat.script[0]
                    self.set_status(
                        chat.id, nxt.status, silent=nxt.silent, last_error=nxt.last_error
                    )

    def archive(self, chat_id: str) -> None:
        """Archive a family: every member publishes ``deleted`` with ``archived: true``."""
        chat = self.chats[chat_id]
        now = self.now()
        for member in self.family(chat):
            member.archived = True
            member.updated_at = now
            member.script.clear()
            self.publish(member, "deleted")

    def unarchive(self, chat_id: str) -> None:
        """Unarchive a family: every member publishes ``created``."""
        chat = self.chats[chat_id]
        now = self.now()
        for member in self.family(chat):
            member.archived = False
            member.updated_at = now
            self.publish(member, "created")

    def delete(self, chat_id: str) -> None:
        """Hard delete (retention purge): no watch event."""
        chat = self.chats.pop(chat_id)
        for child in self.children_of(chat.id):
            self.chats.pop(child.id, None)

    def family(self, chat: SimChat) -> list[SimChat]:
        return [chat, *(self.chats[c] for c in self._family.get(chat.id, ()) if c in self.chats)]

    def chats_of(self, owner_id: str) -> list[SimChat]:
        return [self.chats[c] for c in self._by_owner.get(owner_id, ()) if c in self.chats]

    def children_of(self, chat_id: str) -> list[SimChat]:
        return [self.chats[c] for c in self._children.get(chat_id, ()) if c in self.chats]

    def revoke(self, username: str) -> None:
        """Revoke a user's token. Open watch sockets stay open: coderd checks the key when
        a request arrives, never again for a socket it already upgraded."""
        self.user(username).revoked = True

    # -- watch pubsub ----------------------------------------------------------------

    def subscribe(self, user_id: str, *, agent: str = "") -> Subscriber:
        if self.faults.subscribe_fail:
            raise SimError(
                500, "Internal error subscribing to chat events.", "pubsub: connection refused"
            )
        sub = Subscriber(
            user_id=user_id, queue=asyncio.Queue(maxsize=self.subscriber_buffer), agent=agent
        )
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def publish(self, chat: SimChat, kind: str) -> None:
        payload: dict[str, Any] = {"kind": kind, "chat": self.watch_chat(chat)}
        if kind == "action_required":
            payload["tool_calls"] = [
                {
                    "tool_call_id": f"call_{self.rng.getrandbits(32):x}",
                    "tool_name": "run_query",
                    "args": '{"sql":"select 1"}',
                }
            ]
        self.published += 1
        limit = self.era.publish_limit
        if limit is not None and len(json.dumps(payload)) > limit:
            self.oversize += 1
            return
        for sub in list(self.subscribers):
            if sub.user_id != chat.owner_id:
                continue
            if self.faults.event_loss and self.rng.random() < self.faults.event_loss:
                self.lost += 1
                continue
            try:
                sub.queue.put_nowait(payload)
            except asyncio.QueueFull:
                sub.dropped += 1

    def drop_watch(self, *, user_id: str | None = None, code: int = 1001) -> int:
        """End watch sockets abruptly (replica restart, network); returns how many."""
        n = 0
        for sub in list(self.subscribers):
            if user_id is None or sub.user_id == user_id:
                n += 1
                for cb in self.on_drop:
                    cb(sub, code)
        return n

    def restart(self, downtime: float) -> None:
        """A replica restart: sockets drop, and the API answers 503 for ``downtime``."""
        self.faults.unavailable_until = time.monotonic() + downtime
        self.drop_watch(code=1001)

    # -- serialization ---------------------------------------------------------------

    def ts(self, t: float, chat_id: str = "") -> str:
        offsets = self.utc_offsets
        return iso(
            t, offset_minutes=offsets[zlib.crc32(chat_id.encode()) % len(offsets)] if chat_id else 0
        )

    def chat_json(
        self, chat: SimChat, *, single: bool = False, embed: bool = True
    ) -> dict[str, Any]:
        """``codersdk.Chat`` as Go's ``encoding/json`` writes it: nil pointers with
        ``omitempty`` are omitted (never ``null``), ``last_turn_summary``/``summary`` are
        ``null``, ``root_chat_id`` is always set, ``queued_for_capacity`` appears only on
        a single GET and only when true (``bool,omitempty``)."""
        owner = self.users.get(chat.owner_id)
        body: dict[str, Any] = {
            "id": chat.id,
            "organization_id": chat.org_id,
            "owner_id": chat.owner_id,
            "owner_username": owner.username if owner else "",
            "owner_name": owner.username if owner else "",
            "root_chat_id": chat.root_id or chat.id,
            "last_model_config_id": "e5a9c0de-0000-4000-8000-000000000001",
            "title": chat.title,
            "status": chat.status,
            "last_turn_summary": None,
            "summary": None,
            "created_at": self.ts(chat.created_at, chat.id),
            "updated_at": self.ts(chat.updated_at, chat.id),
            "archived": chat.archived,
            "shared": False,
            "pin_order": chat.pin_order,
            "mcp_server_ids": [],
            "labels": dict(chat.labels),
            "has_unread": False,
            "client_type": chat.client_type,
            "children": [],
        }
        if chat.workspace_id is not None:
            body["workspace_id"] = chat.workspace_id
        if chat.parent_id is not None:
            body["parent_chat_id"] = chat.parent_id
        if chat.mode is not None:
            body["mode"] = chat.mode
        if chat.warnings:
            body["warnings"] = list(chat.warnings)
        if chat.last_error is not None:
            body["last_error"] = chat.last_error
            if self.era.name == "A" and isinstance(chat.last_error, dict):
                # Early servers stored last_error as a text column.
                body["last_error"] = chat.last_error.get("message")
        if chat.context_error is not None or single:
            context: dict[str, Any] = {"dirty": False}
            if chat.context_error is not None:
                context["error"] = chat.context_error
            if single:
                context["resources"] = []
            body["context"] = context
        if single and chat.queued_for_capacity:
            body["queued_for_capacity"] = True
        if embed and self.era.embed_children and chat.parent_id is None:
            body["children"] = [
                self.chat_json(c, single=False, embed=False)
                for c in self.children_of(chat.id)
                if c.archived == chat.archived
            ]
        return body

    def watch_chat(self, chat: SimChat) -> dict[str, Any]:
        if self.era.full_watch_chat:
            body = self.chat_json(chat, embed=False)
            body.pop("children", None)
            return body
        body = {
            "id": chat.id,
            "owner_id": chat.owner_id,
            "title": chat.title,
            "status": chat.status,
            "created_at": self.ts(chat.created_at, chat.id),
            "updated_at": self.ts(chat.updated_at, chat.id),
            "root_chat_id": chat.root_id or chat.id,
        }
        if chat.parent_id is not None:
            body["parent_chat_id"] = chat.parent_id
        if chat.workspace_id is not None:
            body["workspace_id"] = chat.workspace_id
        return body

    # -- rate limit ------------------------------------------------------------------

    def check_rate(self, user_id: str, path: str) -> dict[str, str]:
        """``httpmw.RateLimit``: go-chi httprate keyed by user id and the concrete URL path
        (every ``/chats/<id>`` its own bucket), over a sliding one-minute window — the
        previous window's count weighs in by how much of it still overlaps. Raises 429
        with ``Retry-After: 60`` and the ``X-RateLimit-*`` headers."""
        now = time.time()
        window = int(now // 60) * 60
        key = (user_id, path)
        start, count, previous = self._rate.get(key, (window, 0, 0))
        if start != window:
            previous = count if start == window - 60 else 0
            start, count = window, 0
        weight = (60 - (now - start)) / 60
        rate = previous * weight + count
        headers = {
            "X-RateLimit-Limit": str(self.rate_limit),
            "X-RateLimit-Remaining": str(max(0, int(self.rate_limit - rate - 1))),
            "X-RateLimit-Reset": str(int(start + 60 + self.clock_offset)),
        }
        if self.rate_limit >= 0 and rate >= self.rate_limit:
            self._rate[key] = (start, count, previous)
            raise SimError(
                429,
                f"You've been rate limited for sending more than {self.rate_limit} "
                "requests in 1m0s.",
                headers={**headers, "X-RateLimit-Remaining": "0", "Retry-After": "60"},
            )
        self._rate[key] = (start, count + 1, previous)
        return headers
