"""What the simulator puts on the wire: ``codersdk.Chat`` per era, the watch stream's
chat, timestamps in the chat's zone, messages, and the JSON/error answers with the
``Date`` header.

Bodies follow Go's ``encoding/json`` as coderd writes them (docs/coder-api.md):
``omitempty`` pointers omitted, never ``null``; the era decides the shape.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from watchd.sim.eras import Era
from watchd.sim.records import SimChat, SimError, SimUser, iso


class Records(Protocol):
    """What the payloads read from the simulator's state (``SimState`` is one)."""

    era: Era
    utc_offsets: tuple[int, ...]
    users: dict[str, SimUser]
    chat_tree: bool

    def children_of(self, chat_id: str) -> list[SimChat]: ...
    def now(self) -> float: ...
    def depth(self, chat: SimChat) -> int: ...
    def named_children(self, chat: SimChat) -> list[SimChat]: ...


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

NOT_FOUND = "Resource not found or you do not have access to this resource"
# The authenticated user, set by the server's middleware before any handler runs.
USER_KEY: web.RequestKey[SimUser] = web.RequestKey("user", SimUser)


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )


def error_response(exc: SimError) -> web.Response:
    return json_response(exc.status, exc.body, exc.headers)


def http_date(ts: float) -> str:
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(ts))


def timestamp(state: Records, t: float, chat_id: str = "") -> str:
    """``t`` in the zone the chat's timestamps are written in (UTC without a chat)."""
    offsets = state.utc_offsets
    return iso(
        t, offset_minutes=offsets[zlib.crc32(chat_id.encode()) % len(offsets)] if chat_id else 0
    )


def chat_json(
    state: Records, chat: SimChat, *, single: bool = False, embed: bool = True
) -> dict[str, Any]:
    """``codersdk.Chat`` as Go's ``encoding/json`` writes it: nil pointers with
    ``omitempty`` are omitted (never ``null``), ``last_turn_summary``/``summary`` are
    ``null``, ``root_chat_id`` is always set (``db2sdk.Chat``: the chat's root, else its
    parent, else itself, so a named chat under the chat-tree experiment names its
    parent); ``queued_for_capacity``
    appears only on a single GET and only when true (``bool,omitempty``). Under the
    experiment every chat says its ``kind``, and a single GET of a root or named chat
    attached to a tree adds ``depth`` and ``child_chat_count``
    (``attachChatTreePosition``); list rows embed only subagents."""
    owner = state.users.get(chat.owner_id)
    body: dict[str, Any] = {
        "id": chat.id,
        "organization_id": chat.org_id,
        "owner_id": chat.owner_id,
        "owner_username": owner.username if owner else "",
        "owner_name": owner.username if owner else "",
        "last_model_config_id": "e5a9c0de-0000-4000-8000-000000000001",
        "title": chat.title,
        "status": chat.status,
        "last_turn_summary": None,
        "summary": None,
        "created_at": timestamp(state, chat.created_at, chat.id),
        "updated_at": timestamp(state, chat.updated_at, chat.id),
        "archived": chat.archived,
        "shared": False,
        "pin_order": chat.pin_order,
        "mcp_server_ids": [],
        "labels": dict(chat.labels),
        "has_unread": False,
        "client_type": chat.client_type,
        "children": [],
    }
    # db2sdk.Chat: root_chat_id, else parent_chat_id, else the chat's own id. A named chat
    # under the chat-tree experiment (no root_chat_id of its own) so names its parent.
    body["root_chat_id"] = chat.root_id or chat.parent_id or chat.id
    if chat.workspace_id is not None:
        body["workspace_id"] = chat.workspace_id
    if chat.parent_id is not None:
        body["parent_chat_id"] = chat.parent_id
    if state.chat_tree:
        body["kind"] = chat.kind
        depth = state.depth(chat) if single else 0
        if depth:
            body["depth"] = depth
            body["child_chat_count"] = len(state.named_children(chat))
    if chat.mode is not None:
        body["mode"] = chat.mode
    if chat.warnings:
        body["warnings"] = list(chat.warnings)
    if chat.last_error is not None:
        body["last_error"] = chat.last_error
        if state.era.name == "A" and isinstance(chat.last_error, dict):
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
    if embed and state.era.embed_children and chat.kind != "subagent":
        body["children"] = [
            chat_json(state, c, single=False, embed=False)
            for c in state.children_of(chat.id)
            if c.archived == chat.archived and c.kind == "subagent"
        ]
    return body


def watch_chat(state: Records, chat: SimChat) -> dict[str, Any]:
    """The chat as a watch event carries it: the full Chat from era D on, else a subset."""
    if state.era.full_watch_chat:
        body = chat_json(state, chat, embed=False)
        body.pop("children", None)
        return body
    body = {
        "id": chat.id,
        "owner_id": chat.owner_id,
        "title": chat.title,
        "status": chat.status,
        "created_at": timestamp(state, chat.created_at, chat.id),
        "updated_at": timestamp(state, chat.updated_at, chat.id),
        "root_chat_id": chat.root_id or chat.id,
    }
    if chat.parent_id is not None:
        body["parent_chat_id"] = chat.parent_id
    if chat.workspace_id is not None:
        body["workspace_id"] = chat.workspace_id
    return body


def message(state: Records, chat: SimChat, *, id: int, role: str, text: str) -> dict[str, Any]:
    """One ``codersdk.ChatMessage`` with a text part."""
    return {
        "id": id,
        "chat_id": chat.id,
        "role": role,
        "created_at": timestamp(state, state.now(), chat.id),
        "created_by": chat.owner_id,
        "content": [{"type": "text", "text": text}],
    }
