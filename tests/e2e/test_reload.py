"""SIGHUP tells the truth: every changed setting is applied, or named as needing a restart
(logged and in /status) — never reported applied while ignored."""

from __future__ import annotations

import copy
import signal
from collections.abc import Callable

from tests.e2e.harness import DaemonProcess, SimProcess, eventually, free_port

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


async def test_reload_applies_detection_sweep_and_reconcile_and_names_the_rest(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """chat_failed, sweep (enabled, dry_run), reconcile_interval and external_url take effect
    on SIGHUP; server.listen and telemetry are named as needing a restart."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    await sim.add_chat("alice", status="error", title="broke")
    doc = await d.status()
    assert doc["sweep"] is None and doc["reload"]["last"] is None
    cfg = copy.deepcopy(d.config)
    cfg["detection"] = {"chat_failed": True}
    cfg["sweep"] = {"enabled": True, "dry_run": False}
    cfg["reconcile_interval"] = "7s"
    cfg["server"] = {**cfg["server"], "listen": f"127.0.0.1:{free_port()}"}
    cfg["server"]["external_url"] = "https://watchd.example.com"
    cfg["telemetry"] = {"exporter": "console"}
    d.rewrite(cfg)
    d.signal(signal.SIGHUP)

    def applied() -> dict[str, object] | None:
        return next((e for e in d.log_events() if e.get("event") == "reload.applied"), None)

    event = await eventually(applied, within=10)
    assert set(event["settings"]) == {
        "reconcile_interval",
        "detection.chat_failed",
        "sweep.enabled",
        "sweep.dry_run",
        "server.external_url",
    }
    assert event["needs_restart"] == ["server.listen", "telemetry.exporter"]
    warned = {e["setting"] for e in d.log_events() if e.get("event") == "reload.needs_restart"}
    assert warned == {"server.listen", "telemetry.exporter"}
    doc = await d.status()  # still on the old address: it was not applied
    assert doc["reload"]["last"]["needs_restart"] == ["server.listen", "telemetry.exporter"]
    assert doc["sweep"] is not None and doc["sweep"]["dry_run"] is False
    # Applied means in effect: the errored chat now alerts.
    await eventually(lambda: d.firing("ChatFailed"), within=10)


async def test_reload_of_an_unchanged_file_applies_nothing(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """SIGHUP with the same file reports no setting applied and none needing a restart."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    d.signal(signal.SIGHUP)

    def applied() -> dict[str, object] | None:
        return next((e for e in d.log_events() if e.get("event") == "reload.applied"), None)

    event = await eventually(applied, within=10)
    assert event["settings"] == [] and event["needs_restart"] == []
