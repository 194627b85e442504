"""The simulator's journal (``GET /__sim/history``): every change made through the admin
API, stamped with the server's clock, and whether its event reached a watch socket."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import Sim


async def _admin(
    sim: Sim, session: aiohttp.ClientSession, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    async with session.request(method, sim.url + "/__sim" + path, json=body) as r:
        return r.status, await r.json()


async def _history(sim: Sim, session: aiohttp.ClientSession, after: int = 0) -> list[Any]:
    status, doc = await _admin(sim, session, "GET", f"/history?after={after}")
    assert status == 200 and doc["dropped"] == 0
    return list(doc["entries"])


async def test_status_changes_are_journaled_with_the_server_stamp_and_who_heard_them(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A published transition is journaled as heard by the one open socket, a silent one
    as heard by none, each with the status and updated_at the server wrote."""
    alice = sim.state.add_user("alice")
    _, made = await _admin(sim, session, "POST", "/chats", {"owner": "alice", "status": "waiting"})
    chat = made["id"]
    async with session.ws_connect(
        sim.url + "/api/v2/chats/watch", headers={"Coder-Session-Token": alice.token}
    ):
        await asyncio.sleep(0.1)
        await _admin(sim, session, "POST", f"/chats/{chat}/status", {"status": "running"})
        await _admin(
            sim, session, "POST", f"/chats/{chat}/status", {"status": "waiting", "silent": True}
        )
    created, heard, silent = await _history(sim, session)
    assert (created["kind"], created["status"], created["heard"]) == ("created", "waiting", 0)
    assert (heard["kind"], heard["status"], heard["heard"], heard["silent"]) == (
        "status",
        "running",
        1,
        False,
    )
    assert (silent["status"], silent["heard"], silent["silent"]) == ("waiting", 0, True)
    assert silent["updated_at"] == sim.state.chats[chat].updated_at <= silent["at"]
    assert created["seq"] < heard["seq"] < silent["seq"]


async def test_archive_delete_bump_and_clock_steps_are_journaled(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Archive, hard delete, a step commit and a clock step each leave one entry, after
    ``?after=`` only the later ones; a missing chat answers 404 and leaves none."""
    sim.state.add_user("alice")
    _, a = await _admin(sim, session, "POST", "/chats", {"owner": "alice", "status": "running"})
    _, b = await _admin(sim, session, "POST", "/chats", {"owner": "alice", "status": "waiting"})
    first = (await _history(sim, session))[-1]["seq"]
    await _admin(sim, session, "POST", f"/chats/{a['id']}/bump", {})
    await _admin(sim, session, "POST", f"/chats/{b['id']}/archive")
    await _admin(sim, session, "DELETE", f"/chats/{a['id']}")
    await _admin(sim, session, "POST", "/clock", {"offset": -3.0})
    assert (await _admin(sim, session, "DELETE", f"/chats/{a['id']}"))[0] == 404
    entries = await _history(sim, session, after=first)
    assert [(e["kind"], e.get("chat")) for e in entries] == [
        ("bumped", a["id"]),
        ("archived", b["id"]),
        ("deleted", a["id"]),
        ("clock", None),
    ]
    assert entries[1]["archived"] is True
    assert (entries[3]["before"], entries[3]["offset"]) == (0.0, -3.0)


async def test_watching_answers_who_holds_a_socket(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """``GET /__sim/watching`` names the users with an open watch socket, and no one after
    it closed."""
    alice = sim.state.add_user("alice")
    async with session.ws_connect(
        sim.url + "/api/v2/chats/watch",
        headers={"Coder-Session-Token": alice.token, "User-Agent": "probe"},
    ):
        await asyncio.sleep(0.1)
        _, doc = await _admin(sim, session, "GET", "/watching")
        assert doc["watching"] == {"alice": ["probe"]}
    await asyncio.sleep(0.1)
    _, doc = await _admin(sim, session, "GET", "/watching")
    assert doc["watching"] == {}
