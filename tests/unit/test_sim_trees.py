"""The simulator's families, chat trees and tree cost behave as coderd's do. Each test is
named after the coderd function whose behaviour it pins; docs/coder-api.md cites them."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.conftest import Sim
from watchd.sim.records import SimChat, SimUser
from watchd.sim.scenarios import trees

ACTIVE_REFUSAL = "Cannot archive an active chat. Interrupt or wait for the chat to finish first."


async def _call(
    sim: Sim,
    session: aiohttp.ClientSession,
    user: SimUser,
    method: str,
    path: str,
    *,
    body: Any = None,
) -> tuple[int, Any]:
    async with session.request(
        method, sim.url + path, json=body, headers={"Coder-Session-Token": user.token}
    ) as r:
        text = await r.text()
        return r.status, json.loads(text) if text else None


async def _archive(
    sim: Sim, session: aiohttp.ClientSession, user: SimUser, chat: SimChat, archived: bool = True
) -> tuple[int, Any]:
    path = f"/api/v2/chats/{chat.id}"
    return await _call(sim, session, user, "PATCH", path, body={"archived": archived})


def _tree(sim: Sim) -> tuple[SimUser, dict[str, SimChat]]:
    """The ``trees`` scenario's alice and her chats by title (the root as "Root")."""
    trees(sim.state)
    alice = sim.state.user("alice")
    return alice, {c.title: c for c in sim.state.chats_of(alice.id)}


async def test_SetFamilyArchived_refuses_while_any_member_is_active(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Without the experiment: an idle root whose subagent still runs is refused with 409
    "Cannot archive an active chat." (the cascade is atomic), and nothing is archived."""
    alice = sim.state.add_user("alice")
    root = sim.state.add_chat(alice, status="waiting")
    child = sim.state.add_chat(alice, status="running", parent=root)
    status, body = await _archive(sim, session, alice, root)
    assert (status, body["message"]) == (409, ACTIVE_REFUSAL)
    assert child.id not in body["detail"] and root.id not in body["detail"]
    assert not root.archived and not child.archived


async def test_SetFamilyArchived_tree_cascades_over_the_subtree_never_the_root(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Under chat-tree: archiving a depth-2 chat archives its depth-3 named child and its
    subagent, publishes deleted for each, and leaves the tree root alone."""
    alice, chats = _tree(sim)
    sim.state.subscribe(alice.id)
    shelf, nested = chats["tree: shelf"], chats["tree: nested"]
    status, _ = await _archive(sim, session, alice, shelf)
    assert status == 204
    assert shelf.archived and nested.archived and not chats["Root"].archived
    sub = next(iter(sim.state.subscribers))
    deleted = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert [(e["kind"], e["chat"]["id"]) for e in deleted if e] == [
        ("deleted", shelf.id),
        ("deleted", nested.id),
    ]


async def test_SetFamilyArchived_refuses_the_tree_root_and_subagents(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """The tree root answers 400 "Chat tree root cannot be archived."; a subagent 400
    "…only be changed on the root chat."; a named chat with a parent is archived itself."""
    alice, chats = _tree(sim)
    status, body = await _archive(sim, session, alice, chats["Root"])
    assert (status, body["message"]) == (400, "Chat tree root cannot be archived.")
    status, body = await _archive(sim, session, alice, chats["tree: done/explore"])
    assert (status, body["message"]) == (
        400,
        "Chat archive state can only be changed on the root chat.",
    )
    status, _ = await _archive(sim, session, alice, chats["tree: nested"])
    assert status == 204 and not chats["tree: shelf"].archived


async def test_SetFamilyArchived_a_running_grandchild_blocks_the_cascade(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Under chat-tree a running named descendant refuses the whole archive with 409, and
    the detail does not say which member it was."""
    alice, chats = _tree(sim)
    parent, child = chats["tree: busy parent"], chats["tree: busy child"]
    status, body = await _archive(sim, session, alice, parent)
    assert (status, body["message"]) == (409, ACTIVE_REFUSAL)
    assert child.id not in json.dumps(body) and not parent.archived


async def test_SetFamilyArchived_unarchive_restores_the_chat_and_its_subagents_only(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Unarchiving a depth-2 chat restores it and its subagent, not its named child; the
    named child cannot be unarchived while its parent is archived."""
    alice, chats = _tree(sim)
    done, explore = chats["tree: done"], chats["tree: done/explore"]
    shelf, nested = chats["tree: shelf"], chats["tree: nested"]
    for chat in (done, shelf):
        assert (await _archive(sim, session, alice, chat))[0] == 204
    status, body = await _archive(sim, session, alice, nested, archived=False)
    assert status == 400 and "parent chat is archived" in body["message"]
    assert (await _archive(sim, session, alice, done, archived=False))[0] == 204
    assert (await _archive(sim, session, alice, shelf, archived=False))[0] == 204
    assert not done.archived and not explore.archived
    assert not shelf.archived and nested.archived


async def test_listChats_under_chat_tree_never_lists_the_root(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Rows are the named chats at every depth with their kind (no depth on a row), each
    embedding only its subagents; the root is never listed. A named chat's root_chat_id
    is its parent (db2sdk.Chat's fallback); a single GET adds depth and child_chat_count,
    never for a subagent."""
    alice, chats = _tree(sim)
    status, rows = await _call(sim, session, alice, "GET", "/api/v2/chats")
    assert status == 200
    by_title = {r["title"]: r for r in rows}
    assert "Root" not in by_title and "tree: done/explore" not in by_title
    assert {"tree: shelf", "tree: nested", "tree: busy child"} <= by_title.keys()
    done = by_title["tree: done"]
    assert done["kind"] == "chat" and "depth" not in done
    assert done["parent_chat_id"] == done["root_chat_id"] == chats["Root"].id
    assert [c["title"] for c in done["children"]] == ["tree: done/explore"]
    assert done["children"][0]["root_chat_id"] == chats["tree: done"].id
    assert by_title["tree: busy parent"]["children"] == []
    _, shelf = await _call(sim, session, alice, "GET", f"/api/v2/chats/{chats['tree: shelf'].id}")
    _, nested = await _call(sim, session, alice, "GET", f"/api/v2/chats/{chats['tree: nested'].id}")
    _, root = await _call(sim, session, alice, "GET", f"/api/v2/chats/{chats['Root'].id}")
    _, sub = await _call(
        sim, session, alice, "GET", f"/api/v2/chats/{chats['tree: done/explore'].id}"
    )
    assert (shelf["depth"], shelf["child_chat_count"], nested["depth"]) == (2, 1, 3)
    assert nested["root_chat_id"] == nested["parent_chat_id"] == chats["tree: shelf"].id
    assert (root["kind"], root["depth"], root["root_chat_id"]) == ("root", 1, chats["Root"].id)
    assert sub["kind"] == "subagent" and "depth" not in sub


async def test_getChatTree_is_404_without_the_experiment_and_writes_with_it(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Experiment off: 404. On: the read makes the owner's root and adopts the owner's
    parentless chats (parent set, updated_at unchanged), counted in tree_reads."""
    bob = sim.state.add_user("bob")
    path = f"/api/v2/organizations/{bob.org_id}/chats/tree"
    assert (await _call(sim, session, bob, "GET", path))[0] == 404
    sim.state.enable_chat_tree()
    legacy = sim.state.add_chat(bob, status="waiting", age=60)
    before = legacy.updated_at
    status, tree = await _call(sim, session, bob, "GET", path)
    assert status == 200 and sim.state.tree_reads == 1
    assert legacy.parent_id == tree["root_chat_id"] and legacy.updated_at == before
    assert [c["kind"] for c in tree["chats"]] == ["root", "chat"]
    assert [c["depth"] for c in tree["chats"]] == [1, 2]


async def test_getChatCost_resolves_root_then_parent(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A root reports its own spend and a subagent its root's; a missing chat or another
    user's is 404. Under chat-tree a named chat has no root_chat_id, so coderd's
    resolution lands on its parent: its read reports the parent's spend (here the root's,
    nothing)."""
    alice, chats = _tree(sim)
    bob = sim.state.user("bob")

    async def cost(user: SimUser, chat_id: str) -> tuple[int, Any]:
        return await _call(sim, session, user, "GET", f"/api/v2/chats/{chat_id}/cost")

    pricey = next(c for c in sim.state.chats_of(bob.id) if c.title == "bob: pricey")
    status, body = await cost(bob, pricey.id)
    assert status == 200
    assert body == {
        "chat_id": pricey.id,
        "total_cost_micros": 12_000_000,
        "request_count": 90,
        "unpriced_request_count": 0,
    }
    worker = chats["tree: costly/worker"]
    assert (await cost(alice, worker.id))[1]["total_cost_micros"] == 42_000_000
    assert (await cost(alice, chats["tree: costly"].id))[1]["total_cost_micros"] == 0
    assert (await cost(alice, pricey.id))[0] == 404
    assert (await cost(alice, "00000000-0000-4000-8000-000000000000"))[0] == 404


@pytest.mark.parametrize("era", ["C"])
async def test_getChatCost_is_absent_before_v2_37(sim: Sim, session: aiohttp.ClientSession) -> None:
    """Era C has no cost route: 404 (not the chat's)."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    status, body = await _call(
        sim, session, alice, "GET", f"/api/experimental/chats/{chat.id}/cost"
    )
    assert (status, body["message"]) == (404, "Route not found.")


def test_CreateChat_tree_depth_and_parent_rules(sim: Sim) -> None:
    """Named chats nest to depth 5 (the root is 1); a sixth level and a child of a
    subagent are refused as coderd refuses them."""
    state = sim.state
    state.enable_chat_tree()
    alice = state.add_user("alice")
    parent = state.tree_root(alice)
    for _ in range(4):
        parent = state.add_chat(alice, status="waiting", parent=parent, kind="chat")
    assert state.depth(parent) == 5
    with pytest.raises(ValueError, match="depth limit"):
        state.add_chat(alice, status="waiting", parent=parent, kind="chat")
    sub = state.add_chat(alice, status="waiting", parent=parent)
    with pytest.raises(ValueError, match="Subagent chats cannot have child chats"):
        state.add_chat(alice, status="waiting", parent=sub)
