"""Coder over HTTPS as in production: trusted through an identity's ca_file (never by
turning verification off), and one kept-alive connection across reconciles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.e2e.harness import DaemonProcess, SimProcess, eventually

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


async def test_a_tls_simulator_is_watched_through_its_ca_file(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Against the simulator's HTTPS (a generated CA), an identity with that CA as its
    ca_file seeds, watches over wss and pages a stuck chat."""
    sim = start_sim(tls=True)
    assert sim.url.startswith("https://") and sim.ca_file
    d = start_daemon(sim, identity_extra={"ca_file": sim.ca_file})
    await d.wait_ready()
    await sim.add_chat("alice", status="running", title="stuck over TLS")
    stuck = await eventually(lambda: d.firing("ChatStuck"), within=20)
    assert stuck[0]["labels"]["identity"] == "team-a"
    doc = await d.status()
    assert doc["identities"][0]["state"] == "ready", doc["identities"][0]
    assert "alice" in (await sim.admin("GET", "/state"))["watching"]  # the wss stream


async def test_without_the_ca_file_the_identity_fails_naming_tls_verification(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """The same simulator without ca_file: the system's roots refuse its certificate, so
    the identity is unhealthy with a last_error naming TLS certificate verification —
    nothing is read insecurely."""
    sim = start_sim(tls=True)
    d = start_daemon(sim)
    await d.wait_up()
    await eventually(lambda: d.firing("IdentityUnhealthy"), within=15)

    async def said() -> str:
        error = str((await d.status())["identities"][0]["last_error"])
        return error if "TLS certificate verification failed" in error else ""

    error = await eventually(said, within=15)
    assert "ca_file" in error
    assert (await d.status())["identities"][0]["state"] == "unreachable"
    assert (await sim.admin("GET", "/connections"))["connections"] == 0


def _listings(state: dict[str, Any]) -> int:
    return sum(state["requests_by_user"].get("alice", {}).get("list", {}).values())


async def test_a_reconcile_past_the_idle_keepalive_reuses_the_connection(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """With a 20 s reconcile (past aiohttp's default 15 s idle keep-alive), the next listing
    over TLS after the seed's opens no new connection to the simulator: it reuses the pooled
    one."""
    sim = start_sim(tls=True)
    d = start_daemon(
        sim, identity_extra={"ca_file": sim.ca_file}, extra={"reconcile_interval": "20s"}
    )
    await d.wait_ready()
    first = _listings(await sim.admin("GET", "/state"))
    opened = (await sim.admin("GET", "/connections"))["connections"]
    # One reconcile is enough: the seed's connection has then sat idle 18-22 s (the
    # interval, jittered), past the 15 s after which aiohttp's own pool would have closed it.
    await eventually(lambda: _after(sim, lambda s: _listings(s) >= first + 1), within=40, step=1.0)
    assert (await sim.admin("GET", "/connections"))["connections"] == opened


async def _after(sim: SimProcess, cond: Callable[[dict[str, Any]], bool]) -> bool:
    return cond(await sim.admin("GET", "/state"))
