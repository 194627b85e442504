"""sd_notify without a dependency: the datagram protocol of sd_notify(3).

``NOTIFY_SOCKET`` names a Unix datagram socket (a path, or ``@name`` for
the abstract namespace). Messages are newline-separated ``KEY=VALUE``
lines. The watchdog interval is half of ``WATCHDOG_USEC`` (when
``WATCHDOG_PID`` is unset or ours). Outside systemd every call is a no-op.
``keep_informed`` is the daemon's loop that says READY, STATUS and WATCHDOG.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Mapping

from watchd.kits import logs

log = logs.get("watchd.notify")


class SdNotifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if raw.startswith("@"):
            self.address = "\0" + raw[1:]
        elif raw.startswith("/"):
            self.address = raw
        self.watchdog_usec: int | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_usec = int(usec)
        # Counted, not kept: a list of every message grew by one per watchdog ping, forever.
        self.messages = 0
        self.failures = 0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half the configured timeout."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2 / 1_000_000

    def notify(self, **fields: str) -> bool:
        if self.address is None:
            return False
        message = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(message, self.address)
        except OSError as exc:
            self.failures += 1
            log.warning("sd_notify.failed", error=str(exc))
            return False
        self.messages += 1
        return True

    def ready(self, status: str) -> bool:
        return self.notify(READY="1", STATUS=status)

    def status(self, status: str) -> bool:
        return self.notify(STATUS=status)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG="1")

    def stopping(self) -> bool:
        return self.notify(STOPPING="1", STATUS="stopping")

    def reloading(self) -> bool:
        return self.notify(RELOADING="1", STATUS="reloading configuration")


async def keep_informed(
    n: SdNotifier,
    *,
    status_line: Callable[[], str],
    settled: Callable[[], bool],
    progressing: Callable[[], bool],
) -> None:
    """READY=1 once settled, STATUS= on change, WATCHDOG=1 while the loop progresses."""
    loop = asyncio.get_running_loop()
    interval = n.watchdog_interval
    tick = min(0.5, interval / 2) if interval else 0.5
    announced = False
    last_status = ""
    last_ping = -float("inf")  # the first ping goes out at once
    while True:
        status = status_line()
        if not announced and settled():
            n.ready(status)
            announced, last_status = True, status
        elif announced and status != last_status:
            n.status(status)
            last_status = status
        now = loop.time()
        if interval and now - last_ping >= interval and progressing():
            n.watchdog()
            last_ping = now
        await asyncio.sleep(tick)
