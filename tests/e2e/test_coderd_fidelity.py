"""The real daemon against the simulator where coderd is awkward: the moving cursor, deleted
and archived chats, refused tokens, outages that pass, and the invalid execution state."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from tests.e2e.harness import DaemonProcess, SimProcess, eventually
from tests.e2e.test_remediation import sim_state, sweep

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


def _resolve_reasons(d: DaemonProcess) -> dict[str, str]:
    return {
        e["chat_id"]: e["reason"]
        for e in d.log_events()
        if e.get("event") == "alert.resolved" and e.get("chat_id")
    }


async def test_a_stuck_chat_the_cursor_skips_keeps_one_alert_for_ten_reconciles(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A running chat past budget, bumped while every listing pages (3+ pages), keeps one
    firing alert for ten reconciles — no resolve, no second firing, same fingerprint —
    while a hard-deleted stuck chat resolves as gone (404) and an archived one as archived."""
    sim = start_sim()
    moving = await sim.add_chat("alice", status="running", age=500, title="long turn")
    others = [await sim.add_chat("alice", status="waiting", age=10) for _ in range(8)]
    deleted = await sim.add_chat("alice", status="running", age=400, title="to delete")
    archived = await sim.add_chat("alice", status="running", age=300, title="to archive")
    d = start_daemon(sim, identity_extra={"page_size": 3})
    await d.wait_ready()
    firing = await eventually(lambda: _stuck(d, moving, deleted, archived), within=15)
    fingerprint = firing[moving]
    await sim.admin("POST", f"/chats/{moving}/bump", {"after_page": 1})
    for other in others:
        await sim.admin("POST", f"/chats/{other}/bump", {"after_page": 0})
    start = (await d.status())["identities"][0]["relists"]
    await sim.admin("DELETE", f"/chats/{deleted}")
    await sim.admin("POST", f"/chats/{archived}/archive")
    while (doc := await d.status())["identities"][0]["relists"] < start + 10:
        ours = [a for a in doc["alerts"]["firing"] if a["labels"].get("chat_id") == moving]
        assert [a["fingerprint"] for a in ours] == [fingerprint]
        await asyncio.sleep(0.5)
    ident = doc["identities"][0]
    assert ident["last_list_pages"] >= 3 and ident["absent_confirms"] >= 8
    events = d.log_events()
    fired = [e for e in events if e.get("event") == "alert.firing" and e.get("chat_id") == moving]
    assert len(fired) == 1
    reasons = _resolve_reasons(d)
    assert moving not in reasons, reasons[moving]
    assert reasons[deleted] == "chat gone (404)"
    assert reasons[archived] == "chat archived"
    missed = [e for e in events if e.get("event") == "listing.absent"]
    assert missed, "the cursor never skipped the chat: the test did not test anything"


async def _stuck(d: DaemonProcess, *chats: str) -> dict[str, str] | None:
    got = {a["labels"]["chat_id"]: a["fingerprint"] for a in await d.firing("ChatStuck")}
    return got if all(c in got for c in chats) else None


async def test_outage_rides_the_grace_but_a_revoked_token_fires_within_30s(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """With the default unhealthy_after (2 m) a 10 s 503 storm raises nothing; a revoked
    token (open sockets stay open, as in coderd) raises IdentityUnhealthy within 30 s."""
    sim = start_sim()
    d = start_daemon(sim, identity_extra={"unhealthy_after": "2m"})
    await d.wait_ready()
    await sim.admin("POST", "/restart", {"downtime": 10})
    await asyncio.sleep(12)
    await eventually(lambda: _ready(d), within=20)
    assert await d.firing("IdentityUnhealthy") == []
    revoked = time.monotonic()
    await sim.admin("POST", "/users/alice/revoke")
    assert (await sim_state(sim))["watchers"] == 1, "revocation must not close the socket"
    firing = await eventually(lambda: d.firing("IdentityUnhealthy"), within=30)
    assert time.monotonic() - revoked < 30
    assert "401" in firing[0]["annotations"]["last_error"]
    assert sim.token("alice") not in json.dumps(firing)


async def _ready(d: DaemonProcess) -> bool:
    return bool((await d.status())["identities"][0]["ready"])


def _invalid_sweep(*, dry_run: bool, reconcile: bool) -> dict[str, Any]:
    config = sweep(dry_run=dry_run)
    config["sweep"]["reconcile_invalid"] = reconcile
    return config


async def test_the_invalid_state_is_reported_and_reconciled_only_when_opted_in(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Against an invalid execution state: a dry run sends nothing; a real run records
    'execution state invalid' (never interrupted/archived) and says so on the stuck alert;
    with reconcile_invalid the chat is reconciled once and then archived normally."""
    sim = start_sim()
    chat = await sim.add_chat("alice", status="running", age=60, title="inconsistent")
    await sim.admin("POST", f"/chats/{chat}/invalid")
    extra = {"budgets": {"running": "3s"}}
    dry = start_daemon(sim, extra={**extra, **_invalid_sweep(dry_run=True, reconcile=True)})
    await dry.wait_ready()
    await eventually(lambda: _audit(dry, "planned"), within=10)
    assert (await sim_state(sim))["mutations"] == []
    dry.stop()

    real = start_daemon(
        sim,
        extra={**extra, **_invalid_sweep(dry_run=False, reconcile=False)},
        state_dir=dry.tmp / "state",
    )
    await real.wait_ready()
    line = await eventually(lambda: _audit(real, "invalid"), within=15)
    assert "Chat is in an invalid state." in line["detail"]
    stuck = await eventually(lambda: _annotated(real, chat), within=10)
    assert stuck["annotations"]["execution_state"] == "invalid: Chat is in an invalid state."
    assert "reconcile-invalid" in stuck["annotations"]["hint"]
    await asyncio.sleep(3)  # more sweep passes: the answer is not retried in a loop
    mutations = (await sim_state(sim))["mutations"]
    assert mutations == [["interrupt", chat, 409]]
    real.stop()

    fix = start_daemon(
        sim,
        extra={**extra, **_invalid_sweep(dry_run=False, reconcile=True)},
        state_dir=dry.tmp / "state",
    )
    await fix.wait_ready()
    await eventually(lambda: _audit(fix, "archived"), within=20)
    mutations = (await sim_state(sim))["mutations"]
    assert [m[0] for m in mutations].count("reconcile_invalid") == 1
    assert mutations[-1] == ["archive", chat, 204]


def _audit(d: DaemonProcess, state: str) -> dict[str, Any] | None:
    path = d.tmp / "state" / "sweep-audit.jsonl"
    if not path.exists():
        return None
    lines = [json.loads(x) for x in path.read_text().splitlines() if x]
    return next((x for x in reversed(lines) if x["state"] == state), None)


async def _annotated(d: DaemonProcess, chat: str) -> dict[str, Any] | None:
    for alert in await d.firing("ChatStuck"):
        if alert["labels"]["chat_id"] == chat and "execution_state" in alert["annotations"]:
            return alert
    return None
