"""Live time with the real daemon: /status ages firing alerts per request, and resolves say
how long the chat was stuck and why it ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tests.e2e.harness import DaemonProcess, SimProcess, eventually

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


async def test_status_time_in_status_moves_and_resolves_explain(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A firing alert's time in status grows between two /status reads (JSON and HTML);
    its resolve names the new status and how long it lasted; an archive says archived."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    left = await sim.add_chat("alice", status="running", title="turn that ends")
    archived = await sim.add_chat("alice", status="running", title="turn archived")

    async def both() -> bool:
        return {a["labels"]["chat_id"] for a in await d.firing("ChatStuck")} == {left, archived}

    await eventually(both, within=15)
    first = {a["labels"]["chat_id"]: a for a in await d.firing("ChatStuck")}[left]
    await asyncio.sleep(2.5)
    again = {a["labels"]["chat_id"]: a for a in await d.firing("ChatStuck")}[left]
    grew = int(again["annotations"]["time_in_status_seconds"]) - int(
        first["annotations"]["time_in_status_seconds"]
    )
    assert grew >= 2, (first["annotations"], again["annotations"])
    assert f"for {again['annotations']['time_in_status']}" in again["annotations"]["summary"]
    await sim.set_status(left, "waiting")
    await sim.admin("POST", f"/chats/{archived}/archive", {})

    async def resolved() -> dict[str, dict[str, str]]:
        done = {a["labels"]["chat_id"]: a["annotations"] for a in await d.resolved("ChatStuck")}
        return done if {left, archived} <= done.keys() else {}

    done = await eventually(resolved, within=15)
    assert done[left]["summary"].startswith('Chat "turn that ends" was running for ')
    assert done[left]["summary"].endswith("; resolved: left running for waiting")
    assert done[left]["resolved_reason"] == "left running for waiting"
    # Archiving publishes `deleted` with `archived: true` (as coderd does): archived, not gone.
    assert done[archived]["summary"].endswith("; resolved: chat archived")
