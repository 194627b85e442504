"""The real daemon in a hostile world: a dead man's switch that stops when it should, one
daemon per state directory, a Coder that echoes tokens, a dry run that blocks nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.e2e.harness import DaemonProcess, SimProcess, eventually
from tests.e2e.test_remediation import sim_state, sweep
from tests.e2e.test_scan import scan
from tests.fakes.receivers import FakeWebhook

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


class PingServer:
    """A push-style heartbeat check (healthchecks.io, Uptime Kuma): counts GETs."""

    def __init__(self) -> None:
        self.pings: list[float] = []
        self.url = ""

    async def ping(self, request: web.Request) -> web.Response:
        self.pings.append(asyncio.get_running_loop().time())
        return web.Response(text="OK")


@pytest.fixture
async def pinger() -> AsyncIterator[PingServer]:
    p = PingServer()
    app = web.Application()
    app.router.add_get("/ping/{check}", p.ping)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    p.url = f"http://127.0.0.1:{runner.addresses[0][1]}/ping/0b7c0000-check-key-0001"
    yield p
    await runner.cleanup()


def _heartbeat(tmp: Path, url: str, **extra: Any) -> dict[str, Any]:
    ref = tmp / "ping-url"
    ref.write_text(url + "\n")
    ref.chmod(0o600)
    return {"heartbeat": {"interval": "1s", "ping_url_file": str(ref), **extra}}


async def _pings_in(p: PingServer, seconds: float) -> int:
    before = len(p.pings)
    await asyncio.sleep(seconds)
    return len(p.pings) - before


async def test_the_dead_mans_switch_stops_when_the_daemon_stops(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon, pinger: PingServer
) -> None:
    """Pings arrive every interval while healthy; SIGSTOP (a wedged process) stops them;
    SIGCONT resumes them; the Watchdog alert reaches its receiver too."""
    sim = start_sim()
    hook = await FakeWebhook().start()
    try:
        d = start_daemon(
            sim,
            extra={
                **_heartbeat(tmp_path, pinger.url, receivers=["hook"]),
                "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
                "route": {"receiver": "hook"},
            },
        )
        await d.wait_ready()
        assert await _pings_in(pinger, 3.5) >= 2
        d.signal(signal.SIGSTOP)
        await asyncio.sleep(0.5)  # a ping already in flight may land
        assert await _pings_in(pinger, 3) == 0
        d.signal(signal.SIGCONT)
        assert await _pings_in(pinger, 3.5) >= 2
        watchdogs = [
            a
            for body in hook.received
            for a in body["alerts"]
            if a["labels"]["alertname"] == "Watchdog"
        ]
        assert watchdogs and all(a["status"] == "firing" for a in watchdogs)
        doc = await d.status()
        assert doc["heartbeat"]["sent"] >= 4
        assert "check-key" not in json.dumps(doc) and "check-key" not in d.logs()
    finally:
        await hook.stop()


async def test_a_blind_identity_without_its_alert_stops_the_heartbeat(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon, pinger: PingServer
) -> None:
    """While an identity cannot watch and its IdentityUnhealthy has not fired yet, no ping
    says "all is well"; once the alert fires, pings resume (the outage is now said)."""
    sim = start_sim()
    d = start_daemon(
        sim, extra=_heartbeat(tmp_path, pinger.url), identity_extra={"unhealthy_after": "6s"}
    )
    await d.wait_ready()
    assert await _pings_in(pinger, 2.5) >= 1
    await sim.admin("POST", "/restart", {"downtime": 30})
    await asyncio.sleep(1.5)
    assert await _pings_in(pinger, 3) == 0
    doc = await d.status()
    assert "not yet alerted" in doc["heartbeat"]["withheld_because"]
    await eventually(lambda: d.firing("IdentityUnhealthy"), within=15)
    assert await _pings_in(pinger, 3.5) >= 2


async def test_a_second_daemon_on_one_state_dir_exits_2_naming_the_first(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Two daemons on one state_dir: the second exits 2 with one line naming the holder's
    pid; the first keeps running."""
    sim = start_sim()
    first = start_daemon(sim)
    await first.wait_ready()
    assert first.proc is not None
    other = first.tmp / "second.yaml"
    other.write_text(yaml.safe_dump({**first.config, "server": {"listen": "127.0.0.1:0"}}))
    second = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "watchd", "run", "-c", str(other)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 2, second.stderr
    assert f"in use by another watchd (pid {first.proc.pid})" in second.stderr
    assert "Traceback" not in second.stderr
    assert first.proc.poll() is None


async def test_a_deleted_lock_file_does_not_let_a_second_daemon_in(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """``rm watchd.lock`` beneath a running daemon: a second one on the same state_dir
    still exits 2 (the directory itself is locked); the first keeps running."""
    sim = start_sim()
    first = start_daemon(sim)
    await first.wait_ready()
    assert first.proc is not None
    (Path(first.config["state_dir"]) / "watchd.lock").unlink()
    other = first.tmp / "second.yaml"
    other.write_text(yaml.safe_dump({**first.config, "server": {"listen": "127.0.0.1:0"}}))
    second = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "watchd", "run", "-c", str(other)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 2, second.stderr
    assert "in use by another watchd" in second.stderr
    assert first.proc.poll() is None


async def test_a_token_echoed_by_coder_never_leaves(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A Coder that quotes the request's token in every error body: the token appears in
    no log line, not in /status (JSON or HTML), not in the IdentityUnhealthy notification,
    and not in scan output."""
    sim = start_sim()
    await sim.admin("POST", "/faults", {"echo_token": True})
    hook = await FakeWebhook().start()
    try:
        d = start_daemon(
            sim,
            identities=[("team-a", "alice"), ("team-b", "bob")],
            extra={
                "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
                "route": {"receiver": "hook", "group_wait": "1s", "group_interval": "1s"},
            },
        )
        await d.wait_ready()
        await sim.admin("POST", "/users/bob/revoke")
        await eventually(lambda: d.firing("IdentityUnhealthy"), within=30)
        await eventually(lambda: hook.received, within=15)
        token = sim.token("bob")
        _, html = await d.get("/status?format=html")
        _, doc = await d.get("/status")
        out = await scan(d.config_path, "--json")
        text = await scan(d.config_path)
        assert "401" in json.dumps(doc) and "401" in out.stdout
        for where, body in (
            ("log", d.logs()),
            ("status json", json.dumps(doc)),
            ("status html", str(html)),
            ("webhook", json.dumps(hook.received)),
            ("scan json", out.stdout + out.stderr),
            ("scan text", text.stdout + text.stderr),
        ):
            assert token not in body, f"the token leaked through the {where}"
    finally:
        await hook.stop()


async def test_a_dry_run_plan_does_not_block_the_real_run(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """After a dry-run pass, restarting with dry_run: false on the same state_dir interrupts
    the chat the dry run reported (its plan was not an action)."""
    sim = start_sim()
    chat = await sim.add_chat("alice", status="running", age=60, title="wedged")
    dry = start_daemon(sim, extra=sweep(dry_run=True, action="interrupt"))
    await dry.wait_ready()
    await eventually(lambda: _planned(dry), within=10)
    dry.stop()
    assert (await sim_state(sim))["mutations"] == []
    real = start_daemon(
        sim, extra=sweep(dry_run=False, action="interrupt"), state_dir=dry.tmp / "state"
    )
    await real.wait_ready()
    await eventually(lambda: _interrupted(sim, chat), within=10)


async def _planned(d: DaemonProcess) -> bool:
    doc = await d.status()
    return bool(doc["sweep"] and doc["sweep"]["recent"])


async def _interrupted(sim: SimProcess, chat: str) -> bool:
    return ["interrupt", chat, 200] in (await sim_state(sim))["mutations"]
