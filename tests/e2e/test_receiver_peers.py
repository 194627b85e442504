"""An Alertmanager cluster with a dead peer, end to end: visible though delivery goes on."""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.harness import DaemonProcess, SimProcess, eventually, free_port
from tests.fakes.receivers import FakeWebhook

FAST_ROUTE = {"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"}


async def test_a_dead_alertmanager_peer_shows_in_status_metrics_and_log(
    start_sim: Callable[..., SimProcess], start_daemon: Callable[..., DaemonProcess]
) -> None:
    """With urls: [a live peer, a dead one] a stuck chat still pages through the live peer,
    and the dead one is down in /status, 1 in watchd_receiver_peer_failing and logged once."""
    live = await FakeWebhook(path="/api/v2/alerts").start()
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        sim = start_sim()
        d = start_daemon(
            sim,
            extra={
                "receivers": [{"name": "am", "alertmanager": {"urls": [live.url, dead]}}],
                "route": {"receiver": "am", **FAST_ROUTE},
            },
        )
        await d.wait_ready()
        await sim.add_chat("alice", status="running", title="wedged")
        await eventually(lambda: live.received, within=20)

        async def peers() -> list[dict[str, object]] | None:
            doc = (await d.status())["receivers"]["am"]
            return doc["peers"] if doc["peers"][1]["up"] is False else None

        live_peer, dead_peer = await eventually(peers, within=10)
        assert live_peer["up"] is True and dead_peer["host"] == dead.removeprefix("http://")
        assert "network error" in str(dead_peer["last_error"])
        _, metrics = await d.get("/metrics")
        assert 'watchd_receiver_peer_failing{peer="1",receiver="am"} 1.0' in metrics
        assert 'watchd_receiver_peer_failing{peer="0",receiver="am"} 0.0' in metrics
        failing = [e for e in d.log_events() if e.get("event") == "alertmanager.peer_failing"]
        assert [(e["receiver"], e["peer"]) for e in failing] == [("am", 1)]
    finally:
        await live.stop()
