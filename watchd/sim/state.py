"""The simulator's world: users, chats, workspaces, quota, watch subscribers,
the chat lifecycle engine, and faults on demand.

All of it is in-process and deterministic under a seed; the HTTP layer in
:mod:`watchd.sim.server` only translates requests into calls on this object. The
records are :mod:`watchd.sim.records`, their JSON :mod:`watchd.sim.payloads`, the
watch subscribers :mod:`watchd.sim.pubsub`, the rate limit :mod:`watchd.sim.httprate`.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from watchd.sim.eras import ERAS, Era
from watchd.sim.httprate import HttpRate
from watchd.sim.payloads import message
from watchd.sim.pubsub import PubSub
from watchd.sim.records import (
    Faults,
    SimChat,
    SimError,
    SimUser,
    SimWorkspace,
    Step,
    Subscriber,
)
from watchd.sim.trees import ChatTrees


class SimState(PubSub, HttpRate, ChatTrees):
    """The simulated deployment: its records, the chat lifecycle engine, faults on demand."""

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
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.era: Era = ERAS[era]
        # The host clock the simulated server's is shifted from (tests pass one that
        # follows a virtual event loop, so that time in status runs on the loop's clock).
        self.wall = wall
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
        # The chat-tree experiment (off, as on a deployment that does not opt in): see
        # watchd.sim.trees. Owner id → that owner's tree root; GET …/chats/tree calls.
        self.chat_tree = False
        self.tree_roots: dict[str, str] = {}
        self.tree_reads = 0
        # Mutations that reached a handler: (method, chat id, outcome status).
        self.mutations: list[tuple[str, str, int]] = []
        # httprate's sliding window: (user, path) -> (current window start, count, previous count)
        self._rate: dict[tuple[str, str], tuple[int, int, int]] = {}
        # chat id -> page of a listing after which the chat is bumped (a step commit
        # landing while the client pages; tests use it to open the moving-cursor window).
        self.bump_after_page: dict[str, int] = {}
        self._listing_page: dict[str, int] = {}
        self._message_ids = 1000
        self.on_drop: list[Callable[[Subscriber, int], Any]] = []

    # -- time and ids ----------------------------------------------------------------

    def now(self) -> float:
        """The simulated server's clock (the host's, shifted by ``clock_offset``)."""
        return self.wall() + self.clock_offset

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
        job_error: str = "",
        cost: int = 10,
    ) -> SimWorkspace:
        ws = SimWorkspace(
            id=self.new_id(),
            owner_id=owner.id,
            name=f"ws-{len(self.workspaces)}",
            build_status=build_status,
            job_status=job_status,
            error_code=error_code,
            job_error=job_error,
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
        kind: str | None = None,
    ) -> SimChat:
        """A chat that entered ``status`` ``age`` seconds ago, then follows ``script``.
        ``kind`` matters under the chat-tree experiment: a chat given a ``parent`` is a
        subagent unless ``kind="chat"`` (a named child); one without a parent goes under
        its owner's tree root when there is one (:meth:`ChatTrees.placement`)."""
        self._check_status(status)
        for step in script or []:
            self._check_status(step.status)
        kind, parent = self.placement(owner, parent, kind)
        now = self.now()
        cid = self.new_id()
        if parent is None:
            root: str | None = cid
        elif kind == "subagent":
            root = parent.root_id or parent.id
        else:
            root = None  # a named chat under the tree: no root_chat_id
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
            kind=kind,
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
            if root is not None and root != cid:
                self._family.setdefault(root, []).append(cid)
        if publish:
            self.publish(chat, "created")
        return chat

    def _message(self, chat: SimChat, role: str, text: str) -> dict[str, Any]:
        self._message_ids += 1
        return message(self, chat, id=self._message_ids, role=role, text=text)

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
            if chat.kind != "subagent":
                roots += 1
                over = f.capacity_roots is not None and roots > f.capacity_roots
            else:
                children += 1
                over = f.capacity_children is not None and children > f.capacity_children
            if over == chat.queued_for_capacity:
                if over:
                    chat.entered_at = now
                continue
            # Capacity writes do not bump updated_at; the turn has not started. The event
            # carries the list-row shape: no flag (in flight upstream).
            chat.queued_for_capacity = over
            chat.entered_at = now
            self.publish(chat, "capacity_change")

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
        """Archive a family (or, under the chat-tree experiment, a subtree): every member
        publishes ``deleted`` with ``archived: true``."""
        chat = self.chats[chat_id]
        now = self.now()
        for member in self.members(chat):
            # A member archived already is not written again, but is published with the
            # rest (chatstate.SetFamilyArchived returns every member).
            if not member.archived:
                member.archived = True
                member.updated_at = now
                member.script.clear()
            self.publish(member, "deleted")

    def unarchive(self, chat_id: str) -> None:
        """Unarchive a family (under the chat-tree experiment: the chat and its direct
        subagents): every member publishes ``created``."""
        chat = self.chats[chat_id]
        now = self.now()
        for member in self.unarchive_members(chat):
            member.archived = False
            member.updated_at = now
            self.publish(member, "created")

    def delete(self, chat_id: str) -> None:
        """Hard delete (retention purge): no watch event."""
        chat = self.chats.pop(chat_id)
        for child in self.children_of(chat.id):
            self.chats.pop(child.id, None)

    def chats_of(self, owner_id: str) -> list[SimChat]:
        return [self.chats[c] for c in self._by_owner.get(owner_id, ()) if c in self.chats]

    def children_of(self, chat_id: str) -> list[SimChat]:
        return [self.chats[c] for c in self._children.get(chat_id, ()) if c in self.chats]

    def revoke(self, username: str) -> None:
        """Revoke a user's token. Open watch sockets stay open: coderd checks the key when
        a request arrives, never again for a socket it already upgraded."""
        self.user(username).revoked = True

    def restart(self, downtime: float) -> None:
        """A replica restart: sockets drop, and the API answers 503 for ``downtime``."""
        self.faults.unavailable_until = time.monotonic() + downtime
        self.drop_watch(code=1001)
