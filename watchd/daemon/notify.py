"""sd_notify without a dependency: the datagram protocol of sd_notify(3).

``NOTIFY_SOCKET`` names a Unix datagram socket (a path, or ``@name`` for
the abstract namespace). Messages are newline-separated ``KEY=VALUE``
lines. The watchdog interval is half of ``WATCHDOG_USEC`` (when
``WATCHDOG_PID`` is unset or ours). Outside systemd every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

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
