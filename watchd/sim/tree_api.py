"""The simulator's per-tree routes: a chat tree's cost, and the chat-tree experiment's
tree view.

- ``GET {prefix}/chats/{chat}/cost`` (``getChatCost``, v2.37 on): what AI Gateway
  attributes to the chat's tree, resolved as coderd resolves it: the chat's
  ``root_chat_id``, else its ``parent_chat_id``, else the chat itself (a subagent
  reports its root's total). Under the experiment a named chat has no
  ``root_chat_id``, so that resolution lands on its parent; the simulator does what
  the code does.
- ``GET /api/v2/organizations/{org}/chats/tree`` (``getChatTree``, in flight): 404
  with the experiment off; with it on the read *writes* (``ensureChatTreeRoot``: the
  owner's root is made and adopts the parentless chats), which is why a monitor must
  never call it. Calls are counted in ``SimState.tree_reads``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from watchd.sim.chats import ChatsAPI
from watchd.sim.payloads import NOT_FOUND, USER_KEY, chat_json, json_response
from watchd.sim.records import SimChat, SimError
from watchd.sim.state import SimState


class TreeAPI:
    """The cost and tree handlers over one :class:`SimState` (chats found as ChatsAPI
    finds them: 404 for a missing chat or another user's)."""

    def __init__(self, state: SimState, chats: ChatsAPI) -> None:
        self.state = state
        self.chats = chats

    async def cost(self, request: web.Request) -> web.StreamResponse:
        chat = self.chats.own_chat(request)
        target = chat.root_id or chat.parent_id or chat.id
        spent = self.state.chats.get(target)
        micros, count, unpriced = (
            (spent.spend_micros, spent.spend_requests, spent.spend_unpriced) if spent else (0, 0, 0)
        )
        return json_response(
            200,
            {
                "chat_id": chat.id,
                "total_cost_micros": micros,
                "request_count": count,
                "unpriced_request_count": unpriced,
            },
        )

    async def tree(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        user = request[USER_KEY]
        if not state.chat_tree or request.match_info["org"] != user.org_id:
            raise SimError(404, NOT_FOUND)
        raw = request.query.get("archived", "false")
        if raw not in ("true", "false"):
            raise SimError(
                400,
                "Query parameters have invalid values.",
                validations=[{"field": "archived", "detail": "must be a boolean"}],
            )
        state.tree_reads += 1
        root = state.tree_root(user)
        archived = raw == "true"
        rows = [root] + [
            c
            for c in state.chats_of(user.id)
            if c.kind == "chat" and c.archived == archived and c.parent_id is not None
        ]
        return json_response(200, {"root_chat_id": root.id, "chats": [self._row(c) for c in rows]})

    def _row(self, chat: SimChat) -> dict[str, Any]:
        """A tree row (``db2sdk.ChatTreeRows``): the chat with its position."""
        state = self.state
        body = chat_json(state, chat, embed=False)
        body.pop("children", None)
        body["depth"] = state.depth(chat)
        body["child_chat_count"] = len(state.named_children(chat))
        return body
