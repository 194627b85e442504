"""Operations with the real process: sd_notify, signals, reload, probes, metrics, status page."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e import browser
from tests.e2e.harness import DaemonProcess, SimProcess, eventually

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


class NotifySocket:
    """A Unix datagram socket standing in for systemd's notify socket; a thread stamps
    each message as it arrives."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.messages.append((time.monotonic(), fields))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def drain(self) -> list[tuple[float, dict[str, str]]]:
        return list(self.messages)

    def has(self, key: str) -> bool:
        return any(key in m for _, m in self.drain())


@pytest.fixture(params=["path", "abstract"])
def notify_socket(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, NotifySocket]]:
    if request.param == "path":
        address, ns = str(tmp_path / "notify.sock"), NotifySocket(str(tmp_path / "notify.sock"))
    else:
        name = f"watchd-test-{time.monotonic_ns()}"
        address, ns = "@" + name, NotifySocket("\0" + name)
    yield address, ns
    ns.close()


async def test_sd_notify_ready_status_watchdog_stopping(
    notify_socket: tuple[str, NotifySocket], start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """READY=1 after the first seed, STATUS=, WATCHDOG=1 at half WATCHDOG_USEC, STOPPING=1."""
    address, ns = notify_socket
    sim = start_sim()
    sim_latency = {"latency": 1.0}
    await sim.admin("POST", "/faults", sim_latency)
    d = start_daemon(sim, env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "2000000"})
    await d.wait_up()
    assert not ns.has("READY"), "READY before the first seed"
    await d.wait_ready()
    await eventually(lambda: ns.has("READY"), within=5)
    await asyncio.sleep(3.2)
    assert d.terminate() == 0
    await asyncio.sleep(0.3)
    msgs = ns.drain()
    ready = next(m for _, m in msgs if "READY" in m)
    assert "team-a ready" in ready["STATUS"]
    pings = [t for t, m in msgs if m.get("WATCHDOG") == "1"]
    assert len(pings) >= 3
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert all(0.8 <= g <= 1.6 for g in gaps), gaps  # every 1 s: half of 2 s
    assert "STOPPING" in msgs[-1][1]


async def test_sigterm_stops_in_order_and_quickly(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """SIGTERM: intake stops, watchers stop, state is flushed, exit 0 well inside 10 s."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    await sim.add_chat("alice", status="running")
    await eventually(lambda: d.firing("ChatStuck"), within=10)
    t0 = time.monotonic()
    assert d.terminate() == 0
    assert time.monotonic() - t0 < 10
    events = [e.get("event") for e in d.log_events()]
    order = [events.index(e) for e in ("signal.received", "daemon.stopped")]
    assert order == sorted(order)
    with pytest.raises(aiohttp.ClientError):
        await d.get("/healthz")


async def test_sighup_adds_removes_and_rejects(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """SIGHUP starts a new identity and stops a removed one without touching the other;
    an invalid config keeps the old one running and says why."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    cfg = copy.deepcopy(d.config)
    cfg["identities"].append(d.identity_entry("team-b", "bob"))
    d.rewrite(cfg)
    before = (await d.status())["identities"][0]
    d.signal(signal.SIGHUP)

    async def names() -> list[str]:
        return [i["name"] for i in (await d.status())["identities"]]

    await eventually(lambda: _eq(names(), ["team-a", "team-b"]), within=10)
    after = (await d.status())["identities"][0]
    assert after["reconnects"] == before["reconnects"], "team-a was disturbed"
    cfg["identities"] = cfg["identities"][:1]
    d.rewrite(cfg)
    d.signal(signal.SIGHUP)
    await eventually(lambda: _eq(names(), ["team-a"]), within=10)
    d.config_path.write_text("identities: [{name: x, url: ftp://nope}]\n")
    d.signal(signal.SIGHUP)
    await eventually(
        lambda: any(e.get("event") == "reload.rejected" for e in d.log_events()), within=10
    )
    rejected = next(e for e in d.log_events() if e.get("event") == "reload.rejected")
    assert any("identities.0.url" in p for p in rejected["problems"])
    assert await names() == ["team-a"]
    _, ready = await d.get("/readyz")
    assert ready == {"ready": True}


async def _eq(value: object, expected: object) -> bool:
    return await value == expected  # type: ignore[misc]


async def test_healthz_fails_while_the_loop_is_blocked(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A wedged event loop fails /healthz (the probe times out), and it recovers after."""
    sim = start_sim()
    d = start_daemon(sim, env={"WATCHD_DEBUG_ENDPOINTS": "1"})
    await d.wait_ready()
    assert (await d.get("/healthz"))[0] == 200

    async def block() -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"http://{d.listen}/debug/block?seconds=4"),
            ):
                pass

    blocker = asyncio.create_task(block())
    await asyncio.sleep(0.5)
    with pytest.raises((aiohttp.ClientError, TimeoutError)):
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://{d.listen}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            await r.read()
    await blocker
    await eventually(lambda: _status_is(d, "/healthz", 200), within=5)


async def _status_is(d: DaemonProcess, path: str, code: int) -> bool:
    return (await d.get(path))[0] == code


async def test_readyz_flips_after_the_seed(start_sim: StartSim, start_daemon: StartDaemon) -> None:
    """/readyz answers 503 naming the unseeded identity, then 200 once it is seeded."""
    sim = start_sim()
    await sim.admin("POST", "/faults", {"latency": 2.0})
    d = start_daemon(sim)
    await d.wait_up()
    status, body = await d.get("/readyz")
    assert status == 503 and body["unseeded"] == ["team-a"]
    await d.wait_ready()


async def test_metrics_present_and_moving(start_sim: StartSim, start_daemon: StartDaemon) -> None:
    """Prometheus metrics exist and count watch events and chats as they happen."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()

    async def sample(name: str) -> float:
        _, text = await d.get("/metrics")
        total = 0.0
        for line in str(text).splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    events0 = await sample("watchd_watch_events_total")
    chat = await sim.add_chat("alice", status="running")
    await sim.set_status(chat, "waiting")
    await eventually(lambda: _gt(sample("watchd_watch_events_total"), events0 + 1), within=5)
    _, text = await d.get("/metrics")
    for family in [
        "watchd_chats",
        "watchd_identity_ready",
        "watchd_last_list_age_seconds",
        "watchd_relists_total",
        "watchd_notifications_total",
        "watchd_timers",
    ]:
        assert f"# TYPE {family} " in str(text)
    assert 'watchd_chats{identity="team-a",status="waiting"} 1' in str(text)


async def _gt(value: object, floor: float) -> bool:
    return await value > floor  # type: ignore[misc,operator]


async def test_status_page_renders_in_chromium(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Headless Chromium renders /status with the identities and a firing alert."""
    sim = start_sim()
    await sim.admin("POST", "/users/bob/revoke")
    d = start_daemon(
        sim,
        identities=[("team-a", "alice"), ("team-b", "bob")],
        extra={
            "silences": [
                {
                    "matchers": ['identity="team-z"'],
                    "ends_at": "2099-01-01T00:00:00Z",
                    "comment": "planned maintenance",
                }
            ]
        },
    )
    await d.wait_up()
    await sim.add_chat("alice", status="running", title="Render <b>me</b> safely")
    await eventually(lambda: d.firing("ChatStuck"), within=10)
    url = f"http://{d.listen}/status?format=html"
    html = await browser.dom(tmp_path, url)
    assert "team-a" in html and "team-b" in html and "auth_failed" in html
    assert "ChatStuck" in html and "Render &lt;b&gt;me&lt;/b&gt; safely" in html
    assert "planned maintenance" in html and 'identity="team-z"' in html
    for token in (sim.token("alice"), sim.token("bob")):
        assert token not in html
    await browser.screenshot(tmp_path, url, "status-operations.png", size="1280,800")
