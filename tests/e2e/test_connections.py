"""Idle inbound connections against a low file-descriptor limit: the daemon stays sighted."""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Callable, Iterator

from tests.e2e.harness import DaemonProcess, SimProcess, eventually
from tests.fakes.receivers import FakeWebhook

FAST_ROUTE = {"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"}
# systemd's default is soft 1 024 under a larger hard limit: the same shape, smaller.
NOFILE = (128, 320)
IDLE = 400  # more than the soft limit, and than the hard one less the reserve


@contextlib.contextmanager
def idle_connections(listen: str, n: int) -> Iterator[list[socket.socket]]:
    """``n`` TCP connections that never send a byte (non-blocking connects)."""
    host, _, port = listen.rpartition(":")
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((host, int(port)))
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


async def test_idle_connections_over_the_fd_limit_leave_health_and_paging_working(
    start_sim: Callable[..., SimProcess], start_daemon: Callable[..., DaemonProcess]
) -> None:
    """With soft/hard fd limits 128/320 and 400 idle connections held open, /healthz
    answers, a stuck chat pages the receiver, stderr stays small (no accept-traceback
    flood) and the refusals are counted in /metrics."""
    hook = await FakeWebhook().start()
    try:
        sim = start_sim()
        d = start_daemon(
            sim,
            nofile=NOFILE,
            extra={
                "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
                "route": {"receiver": "hook", **FAST_ROUTE},
            },
        )
        await d.wait_ready()
        with idle_connections(d.listen, IDLE):
            await d.wait_up(within=15)
            await sim.add_chat("alice", status="running", title="stuck behind the flood")
            await eventually(lambda: hook.received, within=30)
            _, metrics = await d.get("/metrics")
        dropped = r'^watchd_inbound_connections_dropped_total\{reason="evicted_idle"\} (\S+)$'
        evicted = re.search(dropped, metrics, re.M)
        assert evicted and float(evicted.group(1)) > 0, metrics
        events = d.log_events()
        (limit,) = [e for e in events if e.get("event") == "process.fd_limit"]
        assert limit["soft"] == NOFILE[1] and limit["raised_from"] == NOFILE[0]
        assert [e for e in events if e.get("event") == "server.connections_dropped"]
        assert d.stderr_path.stat().st_size < 200_000
        assert d.logs().count("out of system resource") <= 5
    finally:
        await hook.stop()
