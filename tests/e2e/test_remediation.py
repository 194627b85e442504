"""Quota headroom, diagnosis hints and the sweep, with the real daemon and simulator."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.harness import DaemonProcess, SimProcess, eventually
from tests.fakes.receivers import FakeWebhook

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]
QUOTA_FAST = {"quota": {"interval": "1s", "low": "10%"}}


def sweep(
    *,
    dry_run: bool,
    action: str = "interrupt_then_archive",
    status: list[str] | None = None,
    older_than: str = "1s",
    settle_timeout: str = "20s",
) -> dict[str, Any]:
    return {
        "sweep": {
            "enabled": True,
            "dry_run": dry_run,
            "interval": "1s",
            "settle_timeout": settle_timeout,
            "actions_per_minute": 600,
            "policies": [
                {
                    "name": "wedged",
                    "status": status or ["running"],
                    "older_than": older_than,
                    "action": action,
                }
            ],
        }
    }


async def sim_state(sim: SimProcess) -> dict[str, Any]:
    return dict(await sim.admin("GET", "/state"))


async def chat_in_sim(sim: SimProcess, chat_id: str) -> dict[str, Any]:
    return next(c for c in (await sim_state(sim))["chats"] if c["id"] == chat_id)


async def test_quota_low_fires_and_resolves(start_sim: StartSim, start_daemon: StartDaemon) -> None:
    """Headroom under 10% raises QuotaLow; freeing credits resolves it; /status shows it."""
    sim = start_sim()
    await sim.admin("POST", "/users/alice/quota", {"budget": 100, "consumed": 95})
    d = start_daemon(sim, extra=QUOTA_FAST)
    await d.wait_ready()
    firing = await eventually(lambda: d.firing("QuotaLow"), within=10)
    assert firing[0]["annotations"]["headroom"] == "5"
    quota = (await d.status())["identities"][0]["quota"]
    assert (quota["state"], quota["headroom"]) == ("ok", 5)
    await sim.admin("POST", "/users/alice/quota", {"consumed": 50})
    await eventually(lambda: d.resolved("QuotaLow"), within=10)
    _, metrics = await d.get("/metrics")
    assert 'watchd_quota_headroom_credits{identity="team-a"} 50' in str(metrics)


async def test_unlimited_and_missing_quota(start_sim: StartSim, start_daemon: StartDaemon) -> None:
    """budget -1 is 'unlimited' (no alert); a 404 route is 'unavailable', said once."""
    sim = start_sim()
    d = start_daemon(sim, identities=[("team-a", "alice")], extra=QUOTA_FAST)
    await d.wait_ready()

    async def state() -> str:
        return str((await d.status())["identities"][0]["quota"]["state"])

    await eventually(lambda: _is(state(), "unlimited"), within=10)
    await sim.admin("POST", "/faults", {"enterprise": False})
    await eventually(lambda: _is(state(), "unavailable"), within=10)
    await asyncio.sleep(3)
    said = [
        e
        for e in d.log_events()
        if e.get("event") == "quota.state" and e.get("state") == "unavailable"
    ]
    assert len(said) == 1 and await d.firing("QuotaLow") == []


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def test_hints_match_the_situation(start_sim: StartSim, start_daemon: StartDaemon) -> None:
    """A chat queued behind the concurrency cap and one on an exhausted quota get their hints."""
    sim = start_sim()
    await sim.admin("POST", "/faults", {"capacity_roots": 1})
    await sim.admin("POST", "/users/alice/quota", {"budget": 50, "consumed": 50})
    slow = await sim.add_chat("alice", status="running", title="slow", age=30)
    queued = await sim.add_chat("alice", status="running", title="queued")
    d = start_daemon(sim, identities=[("team-a", "alice")], extra=QUOTA_FAST)
    await d.wait_ready()

    async def hints() -> dict[str, str]:
        return {
            a["labels"]["chat_id"]: a["annotations"]["hint"] for a in await d.firing("ChatStuck")
        }

    got = await eventually(lambda: _len(hints(), 2), within=15)
    assert "concurrency cap" in got[queued]
    assert "quota is exhausted" in got[slow]


async def _len(value: Any, n: int) -> Any:
    v = await value
    return v if len(v) >= n else None


async def test_hint_for_a_quota_failed_build(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A chat whose workspace build failed with INSUFFICIENT_QUOTA is called unschedulable."""
    sim = start_sim()
    ws = (
        await sim.admin(
            "POST",
            "/workspaces",
            {
                "owner": "alice",
                "build_status": "failed",
                "job_status": "failed",
                "error_code": "INSUFFICIENT_QUOTA",
            },
        )
    )["id"]
    await sim.add_chat("alice", status="running", workspace_id=ws)
    d = start_daemon(sim)
    await d.wait_ready()
    firing = await eventually(lambda: d.firing("ChatStuck"), within=10)
    ann = firing[0]["annotations"]
    assert "INSUFFICIENT_QUOTA" in ann["hint"] and "deleting" in ann["hint"]
    assert ann["workspace_build"] == "failed (INSUFFICIENT_QUOTA)"


async def test_hint_for_an_unhealthy_agent(start_sim: StartSim, start_daemon: StartDaemon) -> None:
    """A chat whose workspace built but whose agent is disconnected is called agent-unhealthy,
    and the alert lists the workspace's agents."""
    sim = start_sim()
    body = {"owner": "alice", "agent_status": "disconnected", "agent_lifecycle": "ready"}
    ws = (await sim.admin("POST", "/workspaces", body))["id"]
    await sim.add_chat("alice", status="running", workspace_id=ws)
    d = start_daemon(sim)
    await d.wait_ready()
    firing = await eventually(lambda: d.firing("ChatStuck"), within=10)
    ann = firing[0]["annotations"]
    assert "workspace agent main is unhealthy" in ann["hint"]
    assert ann["workspace_agents"] == "main: disconnected/ready"


async def test_dry_run_changes_nothing_and_reports(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """In dry-run the sweep audits and announces what it would do; Coder is untouched."""
    sim = start_sim()
    hook = await FakeWebhook().start()
    try:
        chat = await sim.add_chat("alice", status="running", title="wedged")
        stranded = await sim.add_chat("alice", status="requires_action")
        d = start_daemon(
            sim,
            extra={
                **sweep(dry_run=True, status=["running", "waiting"]),
                "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
                "route": {"receiver": "hook", "group_wait": "1s", "group_interval": "1s"},
            },
        )
        await d.wait_ready()

        async def planned() -> list[dict[str, Any]]:
            doc = await d.status()
            return list(doc["sweep"]["recent"]) if doc["sweep"] else []

        recent = await eventually(planned, within=10)
        assert recent[0]["dry_run"] is True and recent[0]["chat_id"] == chat
        assert "would interrupt_then_archive" in recent[0]["detail"]
        await asyncio.sleep(2)
        state = await sim_state(sim)
        assert state["mutations"] == []
        assert (await chat_in_sim(sim, chat))["status"] == "running"
        assert all(r["chat_id"] != stranded for r in await planned())
        audit = (d.tmp / "state" / "sweep-audit.jsonl").read_text().splitlines()
        assert len(audit) == 1 and json.loads(audit[0])["dry_run"] is True
        await eventually(
            lambda: any(
                a["labels"]["alertname"] == "ChatSwept" for b in hook.received for a in b["alerts"]
            ),
            within=10,
        )
    finally:
        await hook.stop()


@pytest.mark.parametrize("era", ["A", "B", "E"])
async def test_sweep_interrupts_waits_and_archives(
    era: str, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """For real: interrupt, wait for the chat to settle, archive — in every era; a
    requires_action chat is never touched."""
    sim = start_sim(era=era)
    chat = await sim.add_chat("alice", status="running", title="wedged")
    stranded = None if era == "A" else await sim.add_chat("alice", status="requires_action")
    d = start_daemon(sim, extra=sweep(dry_run=False))
    await d.wait_ready()
    await eventually(lambda: _archived(sim, chat), within=20)
    muts = [(m[0], m[1]) for m in (await sim_state(sim))["mutations"]]
    assert muts == [("interrupt", chat), ("archive", chat)]
    if stranded:
        assert (await chat_in_sim(sim, stranded))["status"] == "requires_action"
    recent = (await d.status())["sweep"]["recent"]
    assert [r["action"] for r in recent if r["chat_id"] == chat] == ["interrupt", "archive"]


async def _archived(sim: SimProcess, chat: str) -> bool:
    return bool((await chat_in_sim(sim, chat))["archived"])


async def test_409_is_an_answer_not_a_retry_storm(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A wedged interrupt (409 on a second try would be wrong) is sent once, then the sweep
    gives up after the settle timeout and says why."""
    sim = start_sim(era="E")
    chat = await sim.add_chat("alice", status="running", wedged=True)
    d = start_daemon(sim, extra=sweep(dry_run=False, settle_timeout="3s"))
    await d.wait_ready()

    async def gave_up() -> bool:
        doc = await d.status()
        return any(r["state"] == "gave_up" for r in doc["sweep"]["recent"])

    await eventually(gave_up, within=20)
    await asyncio.sleep(2)
    muts = [m for m in (await sim_state(sim))["mutations"] if m[1] == chat]
    assert [m[0] for m in muts] == ["interrupt"]
    detail = next(r for r in (await d.status())["sweep"]["recent"] if r["state"] == "gave_up")
    assert "did not settle" in detail["detail"]


async def test_sweep_survives_restart_without_acting_twice(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Killed between interrupt and archive, the restarted daemon archives without a second
    interrupt."""
    sim = start_sim(era="E")
    chat = await sim.add_chat("alice", status="running", wedged=True)
    extra = sweep(dry_run=False, settle_timeout="60s")
    d1 = start_daemon(sim, extra=extra)
    await d1.wait_ready()

    async def interrupted() -> bool:
        return any(m[0] == "interrupt" for m in (await sim_state(sim))["mutations"])

    await eventually(interrupted, within=15)
    await asyncio.sleep(1.5)
    d1.kill9()
    await sim.set_status(chat, "waiting")
    d2 = start_daemon(sim, extra=extra, state_dir=d1.tmp / "state")
    await d2.wait_ready()
    await eventually(lambda: _archived(sim, chat), within=15)
    muts = [(m[0], m[1]) for m in (await sim_state(sim))["mutations"]]
    assert muts == [("interrupt", chat), ("archive", chat)]


async def test_sweep_under_chat_tree(start_sim: StartSim, start_daemon: StartDaemon) -> None:
    """Under the chat-tree experiment the sweep archives named chats at depth 2 and 3
    themselves, holds a family whose depth-3 child runs (naming it) until it is idle,
    never archives the tree root, and never reads the tree (bob's root is never made)."""
    sim = start_sim(scenario="trees")
    d = start_daemon(
        sim,
        identities=[("team-a", "alice"), ("team-b", "bob")],
        extra=sweep(dry_run=False, action="archive", status=["waiting"]),
    )
    await d.wait_ready()
    ids = {c["title"]: c["id"] for c in (await sim_state(sim))["chats"]}
    for title in ("tree: done", "tree: done/explore", "tree: shelf", "tree: nested"):
        await eventually(lambda t=title: _archived(sim, ids[t]), within=20)

    async def held() -> list[dict[str, Any]]:
        return [
            r
            for r in (await d.status())["sweep"]["recent"]
            if r["chat_id"] == ids["tree: busy parent"] and r["state"] == "blocked"
        ]

    (line,) = await eventually(held, within=10)
    assert f'{ids["tree: busy child"]} "tree: busy child" is running' in line["detail"]
    assert not await _archived(sim, ids["tree: busy parent"])
    await eventually(lambda: _archived(sim, ids["tree: busy parent"]), within=40)
    state = await sim_state(sim)
    roots = [c for c in state["chats"] if c["title"] == "Root"]
    assert [c["owner"] for c in roots] == ["alice"] and not roots[0]["archived"]
    assert all(m[1] != roots[0]["id"] for m in state["mutations"])
    # No archive a busy family refuses is sent (a 400 "already archived" can happen: two
    # chats of one subtree matched in one pass).
    assert [m for m in state["mutations"] if m[0] == "archive" and m[2] == 409] == []


async def test_chat_tree_cost_high_fires_for_costly_stuck_trees(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """With cost.threshold_usd 10, the daemon fires ChatTreeCostHigh for alice's $42 stuck
    tree (read through its subagent) and bob's $12 one, not for bob's $1 one."""
    sim = start_sim(scenario="trees")
    cost = {"cost": {"threshold_usd": 10, "interval": "1s"}}
    d = start_daemon(sim, identities=[("team-a", "alice"), ("team-b", "bob")], extra=cost)
    await d.wait_ready()
    ids = {c["title"]: c["id"] for c in (await sim_state(sim))["chats"]}

    async def costly() -> dict[str, dict[str, Any]]:
        return {a["labels"]["chat_id"]: a for a in await d.firing("ChatTreeCostHigh")}

    got = await eventually(lambda: _len(costly(), 2), within=20)
    assert set(got) == {ids["tree: costly"], ids["bob: pricey"]}
    ann = got[ids["tree: costly"]]["annotations"]
    assert ann["total_cost_usd"] == "42.00" and ann["unpriced_request_count"] == "2"
    assert ann["runbook_url"] == "docs/runbooks.md#chattreecosthigh"
    await asyncio.sleep(2)
    assert ids["bob: cheap"] not in await costly()
