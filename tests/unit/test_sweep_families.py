"""The sweep against the simulator's families and chat trees: an archive goes to the chat
it must (a subagent's to its root, a named chat's to itself, never to a tree root), and a
busy member is named instead of being discovered by three refused PATCHes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import Sim
from tests.unit.test_client import client_for
from tests.unit.test_ledger import ListSink
from watchd.coder.client import CoderClient
from watchd.coder.observing import ChatId, Observation, from_json
from watchd.config.sweep import SweepConfig
from watchd.config.watching import Budgets
from watchd.detection.detector import Detector
from watchd.kits.clock import ServerClock
from watchd.remediation.policies import compile_policies, match_policy
from watchd.remediation.sweeper import Sweeper
from watchd.sim.records import SimChat, SimUser
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import build
from watchd.store.rows import chat_record, chat_row
from watchd.store.sqlite import StateFile

BUSY = "archive waits for the family"


class Swept:
    """A real sweep over alice's chats as a listing put them in her store."""

    def __init__(self, sweeper: Sweeper, det: Detector, client: CoderClient, tmp: Path) -> None:
        self.sweeper, self.det, self.client, self.tmp = sweeper, det, client, tmp

    async def passes(self, n: int = 1) -> None:
        for _ in range(n):
            await self.sweeper.sweep_once()

    async def relist(self) -> None:
        now = self.sweeper.health["alice"].server_clock.now()
        chats = await self.client.list_chats()
        self.sweeper.store.apply_listing("alice", chats, now=now, started=now)

    async def observe(self, chat_id: str) -> None:
        now = self.sweeper.health["alice"].server_clock.now()
        chat = await self.client.get_chat(chat_id)
        self.sweeper.store.observe("alice", chat, now=now, via="watch")

    def audit(self) -> list[dict[str, Any]]:
        path = self.tmp / "audit.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def swept(self) -> list[dict[str, str]]:
        return [
            {**a.labels, **a.annotations} for a in self.det.firing.values() if a.name == "ChatSwept"
        ]


@asynccontextmanager
async def sweeping(
    sim: Sim,
    session: aiohttp.ClientSession,
    tmp: Path,
    alice: SimUser,
    *,
    statuses: Iterable[str] = ("waiting",),
    matchers: Iterable[str] = (),
    dry_run: bool = False,
    listed: bool = True,
) -> AsyncIterator[Swept]:
    """Archive policy over ``statuses`` (older than 30 s: the chats here are a minute old,
    ``matchers``); the store holds what alice's listing shows (nothing with
    ``listed=False``)."""
    client = client_for(sim, alice, session)
    store = ChatStore()
    health = IdentityHealth(
        name="alice", deployment=sim.url, server_clock=ServerClock(), unhealthy_after=60
    )
    health.set_state("ready")
    db = StateFile(tmp / "state.db")
    det = Detector(store=store, sink=ListSink(), db=db)
    det.register(health, confirmer=None, budgets=Budgets(running=3600), labels={})  # type: ignore[arg-type]
    policy = {
        "name": "p",
        "status": list(statuses),
        "older_than": "30s",
        "action": "archive",
        "matchers": list(matchers),
    }
    config = SweepConfig.model_validate({"enabled": True, "dry_run": dry_run, "policies": [policy]})
    sweeper = Sweeper(
        config=config,
        store=store,
        health={"alice": health},
        clients=lambda _n: client,
        db=db,
        ledger=det.ledger,
        audit_path=tmp / "audit.jsonl",
        labels=lambda _n: {},
    )
    swept = Swept(sweeper, det, client, tmp)
    if listed:
        await swept.relist()
    try:
        yield swept
    finally:
        await det.unregister("alice", reason="test over")
        db.close()


def _archives(sim: Sim) -> list[tuple[str, int]]:
    return [(chat, status) for what, chat, status in sim.state.mutations if what == "archive"]


def _tree(sim: Sim) -> tuple[SimUser, SimChat]:
    sim.state.enable_chat_tree()
    alice = sim.state.add_user("alice")
    return alice, sim.state.tree_root(alice)


async def test_a_busy_subagent_holds_the_archive_and_is_named(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """An idle root whose subagent runs is not PATCHed: the audit and ChatSwept name the
    subagent; later passes read nothing while the store shows it busy; once it is idle
    the root is archived."""
    alice = sim.state.add_user("alice")
    root = sim.state.add_chat(alice, status="waiting", age=60, title="lead")
    child = sim.state.add_chat(alice, status="running", age=60, parent=root, title="explore: db")
    async with sweeping(sim, session, tmp_path, alice) as s:
        await s.passes(2)
        reads = sim.state.requests_by_user["alice"]["get"]
        await s.passes(2)
        assert sim.state.requests_by_user["alice"]["get"] == reads
        assert _archives(sim) == []
        (line,) = s.audit()
        assert line["state"] == "blocked" and line["chat_id"] == root.id
        assert f'{child.id} "explore: db" is running' in line["detail"]
        (swept,) = s.swept()
        assert swept["status"] == "blocked" and child.id in swept["detail"]
        sim.state.set_status(child.id, "waiting")
        await s.relist()
        await s.passes()
        assert _archives(sim) == [(root.id, 204)]
        assert [x["state"] for x in s.audit()] == ["blocked", "archived"]
        assert s.sweeper.counts["errors"] == s.sweeper.counts["gave_up"] == 0


async def test_a_running_depth_3_chat_holds_its_depth_2_parent(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Under chat-tree, a depth-2 chat whose named depth-3 child runs is held (the child
    named), never PATCHed, and never sent to the tree root its root_chat_id names."""
    alice, root = _tree(sim)
    parent = sim.state.add_chat(alice, status="waiting", age=60, title="plan")
    child = sim.state.add_chat(alice, status="running", parent=parent, kind="chat", title="do")
    async with sweeping(sim, session, tmp_path, alice) as s:
        await s.passes(2)
        assert _archives(sim) == [] and not root.archived
        (line,) = s.audit()
        assert line["chat_id"] == parent.id and f'{child.id} "do" is running' in line["detail"]


async def test_archive_at_depth_2_goes_to_the_chat_not_the_tree_root(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A named chat directly under the tree root (root_chat_id = the root) is archived
    itself, with its subagent; the root stays."""
    alice, root = _tree(sim)
    chat = sim.state.add_chat(alice, status="waiting", age=60, title="done")
    sub = sim.state.add_chat(alice, status="error", age=60, parent=chat)
    async with sweeping(sim, session, tmp_path, alice) as s:
        await s.passes()
        assert _archives(sim) == [(chat.id, 204)]
        assert chat.archived and sub.archived and not root.archived
        assert s.audit()[0]["detail"] == "archived"


async def test_archive_at_depth_3_goes_to_the_chat_and_a_subagent_through_it(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A depth-3 named chat (root_chat_id = its depth-2 parent) is archived itself, never
    its parent (whose archive would take the siblings); a subagent under a named chat is
    archived through that chat."""
    alice, _root = _tree(sim)
    shelf = sim.state.add_chat(alice, status="waiting", age=60, title="shelf")
    nested = sim.state.add_chat(
        alice, status="waiting", age=60, parent=shelf, kind="chat", labels={"sweep": "y"}
    )
    sibling = sim.state.add_chat(alice, status="waiting", age=60, parent=shelf, kind="chat")
    top = sim.state.add_chat(alice, status="error", age=60, title="top")
    worker = sim.state.add_chat(alice, status="waiting", age=60, parent=top, labels={"sweep": "y"})
    async with sweeping(sim, session, tmp_path, alice, matchers=['chat_label_sweep="y"']) as s:
        await s.passes()
        assert sorted(_archives(sim)) == sorted([(nested.id, 204), (top.id, 204)])
        assert nested.archived and top.archived and worker.archived
        assert not shelf.archived and not sibling.archived
        details = {x["chat_id"]: x["detail"] for x in s.audit()}
        assert details == {nested.id: "archived", worker.id: f"archived via its root {top.id}"}


async def test_the_tree_root_is_never_archived(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A tree root in the store matches no policy; one whose record does not say its kind
    is read, found to be the root, and left alone without a PATCH."""
    alice, root = _tree(sim)
    async with sweeping(sim, session, tmp_path, alice) as s:
        await s.observe(root.id)
        rec = s.sweeper.store.get("alice", root.id)
        assert rec is not None and rec.kind == "root"
        await s.passes()
        assert s.audit() == []
        s.sweeper.store.drop_identity("alice")
        anonymous = Observation(id=ChatId(root.id), status="waiting", updated_at=1.0)
        s.sweeper.store.observe("alice", anonymous, now=2.0, via="listing")
        await s.passes(2)
        assert _archives(sim) == [] and not root.archived
        (line,) = s.audit()
        assert line["state"] == "gave_up" and "chat-tree root is never archived" in line["detail"]


async def test_a_paused_member_is_named_before_any_patch(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A root whose subagent is paused is left as owner editing, the paused member named,
    without sending the PATCH coderd would refuse."""
    alice = sim.state.add_user("alice")
    root = sim.state.add_chat(alice, status="waiting", age=60)
    paused = sim.state.add_chat(alice, status="paused", age=60, parent=root)
    async with sweeping(sim, session, tmp_path, alice) as s:
        await s.passes(2)
        assert _archives(sim) == []
        (line,) = s.audit()
        assert line["state"] == "owner_editing" and f"{paused.id}" in line["detail"]
        assert s.swept() == []


async def test_members_the_store_does_not_hold_meet_coderds_own_409s(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A busy or paused named child watchd has not seen gets coderd's 409: a paused one is
    owner editing (once: no retry, no gave_up, no ChatSwept, the paused chat untouched), a
    running one a retry that says a member it cannot see is busy."""
    alice, _root = _tree(sim)
    editing = sim.state.add_chat(alice, status="waiting", age=60, labels={"sweep": "y"})
    sim.state.add_chat(alice, status="paused", age=60, parent=editing, kind="chat")
    busy = sim.state.add_chat(alice, status="waiting", age=60, labels={"sweep": "y"})
    sim.state.add_chat(alice, status="running", age=60, parent=busy, kind="chat")
    async with sweeping(
        sim, session, tmp_path, alice, matchers=['chat_label_sweep="y"'], listed=False
    ) as s:
        for chat in (editing, busy):
            await s.observe(chat.id)
        await s.passes(2)
        assert sorted(_archives(sim)) == sorted([(editing.id, 409)] + [(busy.id, 409)] * 2)
        lines = {x["chat_id"]: x for x in s.audit()}
        assert lines[editing.id]["state"] == "owner_editing"
        assert "paused at a queued message under edit" in lines[editing.id]["detail"]
        assert s.sweeper.counts["gave_up"] == 0 and s.swept() == []
        entry = s.sweeper.progress.get("alice", busy.id, "p")
        assert entry is not None and entry.state == "retry"
        assert "a family member watchd does not see is busy" in (entry.detail or "")


async def test_a_dry_run_plan_says_which_member_the_archive_would_wait_for(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A dry run's plan for an idle root whose subagent runs names the subagent."""
    alice = sim.state.add_user("alice")
    root = sim.state.add_chat(alice, status="waiting", age=60)
    child = sim.state.add_chat(alice, status="running", age=60, parent=root)
    async with sweeping(sim, session, tmp_path, alice, dry_run=True) as s:
        await s.passes()
        (line,) = s.audit()
        assert line["state"] == "planned"
        assert f"the archive would wait: family member {child.id}" in line["detail"]


@pytest.mark.parametrize("kind", ["root", "chat", "subagent"])
def test_a_chats_kind_is_read_kept_and_stored(kind: str) -> None:
    """Both decoders read `kind`; a later minimal payload keeps it; the state file keeps
    it; a tree root never matches a policy (the others do)."""
    body = {"id": "c1", "status": "waiting", "kind": kind, "updated_at": "2026-01-01T00:00:00Z"}
    seen = from_json(body)
    assert seen.kind == kind
    rec = build("alice", seen, since=1.0, clock="lower_bound", now=2.0, version=1)
    later = build(
        "alice",
        Observation(id=ChatId("c1"), status="waiting"),
        since=1.0,
        clock="lower_bound",
        now=3.0,
        version=1,
        previous=rec,
    )
    assert later.kind == kind == chat_record(chat_row(later)).kind
    config = SweepConfig.model_validate(
        {
            "policies": [
                {"name": "p", "status": ["waiting"], "older_than": "1s", "action": "archive"}
            ]
        }
    )
    matched = match_policy(compile_policies(config), later, now=100.0, labels={})
    assert (matched is None) == (kind == "root")
