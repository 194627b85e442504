"""The simulator's chats routes: list (filters, order, keyset and offset paging), get,
interrupt, PATCH and POST archive, reconcile-invalid, messages.

Each answers as coderd does for the era in force (docs/coder-api.md); the server
has already authenticated the caller and checked that the era has the route.
"""

from __future__ import annotations

import shlex
import uuid

from aiohttp import web

from watchd.sim.payloads import NOT_FOUND, USER_KEY, chat_json, json_response
from watchd.sim.records import ACTIVE, SimChat, SimError
from watchd.sim.state import SimState

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


class ChatsAPI:
    """The handlers of ``/api/{v2,experimental}/chats…`` over one :class:`SimState`."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    def own_chat(self, request: web.Request) -> SimChat:
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
            and (not state.era.embed_children or state.listed_as_row(c))
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
        body = [chat_json(state, c) for c in rows]
        state.listing_page_served(user.id, page)
        return json_response(200, body)

    async def get_chat(self, request: web.Request) -> web.StreamResponse:
        chat = self.own_chat(request)
        return json_response(200, chat_json(self.state, chat, single=True))

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
        chat = self.own_chat(request)
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
        return json_response(200, chat_json(state, chat, single=True))

    async def patch_chat(self, request: web.Request) -> web.StreamResponse:
        chat = self.own_chat(request)
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
                self.state.check_unarchive(chat)
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
        state.check_archive(chat, state_machine=state.era.state_machine)
        if not state.era.state_machine:
            # Era B: archive stopped active processing itself.
            for member in state.members(chat):
                if member.status in ACTIVE or member.status == "requires_action":
                    member.script.clear()
                    state.set_status(member.id, "waiting")
        state.archive(chat.id)

    async def archive_post(self, request: web.Request) -> web.StreamResponse:
        chat = self.own_chat(request)
        self.state.check_mutable(chat)
        self._archive(chat)
        return web.Response(status=204)

    async def reconcile_invalid(self, request: web.Request) -> web.StreamResponse:
        """``POST …/reconcile-invalid`` (newest servers): an inconsistent chat → ``error``
        (200 with the chat); 409 "Chat is not in an invalid state." for a consistent one;
        400 for an archived chat; 404 for a chat that is missing or not the caller's; 503
        with chatd off."""
        chat = self.own_chat(request)
        try:
            if not self.state.faults.chatd_enabled:
                raise SimError(503, "AI Gateway must be enabled to use chats.")
            if chat.archived:
                raise SimError(400, "Cannot mutate an archived chat.")
            if not chat.invalid_state:
                raise SimError(409, "Chat is not in an invalid state.")
        except SimError as exc:
            self.state.mutations.append(("reconcile_invalid", chat.id, exc.status))
            raise
        chat.invalid_state = False
        chat.script.clear()
        self.state.set_status(
            chat.id,
            "error",
            last_error={
                "message": "The chat's execution state was invalid and has been reset.",
                "kind": "generic",
                "retryable": False,
            },
        )
        self.state.mutations.append(("reconcile_invalid", chat.id, 200))
        return json_response(200, chat_json(self.state, chat, single=True))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        chat = self.own_chat(request)
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
        return json_response(
            200,
            {
                "messages": page,
                "queued_messages": [],
                "has_more": len(msgs) > limit,
            },
        )
