"""The dead man's switch: "alive and seeing", said every interval, only while true.

A monitor that stops is silent, and silence reads as "all is well". Every
``heartbeat.interval`` watchd asks itself whether it is healthy — the event loop
responsive, no root task dead, every identity ready or already alerted (its
IdentityUnhealthy firing), state persisting — and only then sends the always-firing
``Watchdog`` alert to the configured receivers (the Prometheus convention that dead man's
switch services and PagerDuty-style heartbeat integrations expect) and GETs the ping URL
(the push style of healthchecks.io and Uptime Kuma). A wedged, stopped or blind watchd
sends nothing, and the service on the other side raises the alarm.

Beats keep a fixed cadence: each is scheduled from the last *scheduled* time, never from
when the last send returned, and the ping runs as its own guarded task that no beat
waits for — a ping URL that hangs must not stretch the Watchdog alert's interval. A ping
still in flight when the next is due is skipped and counted, never stacked.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from watchd.alerting.model import Alert, fingerprint
from watchd.alerting.receivers.base import MAX_ANSWER, Notification, Notifier, NotifyError
from watchd.config.process import HeartbeatConfig
from watchd.kits import logs
from watchd.kits.tasks import spawn

log = logs.get("watchd.heartbeat")

GROUP_KEY = '{}:{alertname="Watchdog"}'


@dataclass(frozen=True, slots=True)
class HeartbeatSnapshot:
    """The dead man's switch's beats so far, as plain data."""

    interval_seconds: float
    sent: int
    failed: int
    withheld: int
    withheld_because: str
    last_sent: float | None
    pings_skipped: int


class Heartbeat:
    def __init__(
        self,
        *,
        config: HeartbeatConfig,
        url: str | None,
        notifiers: Mapping[str, Notifier],
        session: aiohttp.ClientSession,
        healthy: Callable[[], str | None],
    ) -> None:
        """``healthy()`` returns None when all is well, else why not (for the log)."""
        self.config = config
        self._url = url
        self.notifiers = {n: notifiers[n] for n in config.receivers}
        self.session = session
        self.healthy = healthy
        self.instance = socket.gethostname()
        self.started = time.time()
        self.sent = 0
        self.failed = 0
        self.withheld = 0
        # Pings not started because the previous one was still in flight (a hanging URL).
        self.pings_skipped = 0
        self._pinging: asyncio.Task[None] | None = None
        self.last_sent: float | None = None
        self.withheld_because = ""

    def snapshot(self) -> HeartbeatSnapshot:
        return HeartbeatSnapshot(
            interval_seconds=self.config.interval,
            sent=self.sent,
            failed=self.failed,
            withheld=self.withheld,
            withheld_because=self.withheld_because,
            last_sent=self.last_sent,
            pings_skipped=self.pings_skipped,
        )

    def alert(self) -> Alert:
        return Alert(
            fingerprint=fingerprint(self.instance, "Watchdog"),
            labels={"alertname": "Watchdog", "severity": "none", "instance": self.instance},
            starts_at=self.started,
            annotations={
                "summary": "watchd is alive and seeing: its loop runs, every identity is "
                "watched or already alerted, and its state persists",
                "description": "An always-firing heartbeat. Route it to a dead man's switch: "
                "when it stops arriving, watchd has stopped, wedged or gone blind.",
            },
        )

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.interval
        due = loop.time()
        try:
            while True:
                await self.tick()
                # The next beat is due one interval after this one was *due*: a slow send
                # does not push every later beat back. Beats already missed are not
                # made up in a burst; the cadence resumes at the next slot.
                due += interval
                now = loop.time()
                if due < now:
                    due += (now - due) // interval * interval + interval
                await asyncio.sleep(due - now)
        finally:
            await self._stop_ping()

    async def tick(self) -> None:
        """One beat, when healthy; why not logged once per change of reason."""
        why = self.healthy()
        if why is not None:
            self.withheld += 1
            if why != self.withheld_because:
                log.warning("heartbeat.withheld", because=why)
            self.withheld_because = why
            return
        if self.withheld_because:
            log.info("heartbeat.resumed", after=self.withheld_because)
            self.withheld_because = ""
        await self.beat()

    async def beat(self) -> None:
        if self._url is not None:
            self._start_ping(self._url)
        jobs = [self._notify(name, n) for name, n in self.notifiers.items()]
        results = await asyncio.gather(*jobs)
        if any(results):
            self.last_sent = time.time()

    def _start_ping(self, url: str) -> None:
        """The ping in its own guarded task, bounded by ``timeout``; never two at once."""
        if self._pinging is not None and not self._pinging.done():
            self.pings_skipped += 1
            log.warning("heartbeat.ping_skipped", because="the previous ping is still in flight")
            return

        async def ping() -> None:
            if await self._ping(url):
                self.last_sent = time.time()

        self._pinging = spawn("deadman-ping", ping, eternal=False, restart=False)

    async def _stop_ping(self) -> None:
        """The ping task is ours: cancelled and awaited when the beats stop."""
        task, self._pinging = self._pinging, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _notify(self, name: str, notifier: Notifier) -> bool:
        n = Notification(
            receiver=name,
            group_key=GROUP_KEY,
            group_labels={"alertname": "Watchdog"},
            alerts=(self.alert(),),
        )
        try:
            async with asyncio.timeout(self.config.timeout):
                await notifier.notify(n)
        except (NotifyError, TimeoutError) as exc:
            self.failed += 1
            log.warning("heartbeat.failed", receiver=name, error=str(exc)[:300])
            return False
        self.sent += 1
        return True

    async def _ping(self, url: str) -> bool:
        try:
            async with self.session.get(
                url,
                timeout=aiohttp.ClientTimeout(total=self.config.timeout),
                allow_redirects=False,
            ) as r:
                await r.content.read(MAX_ANSWER)
                ok = 200 <= r.status < 300
                status = f"HTTP {r.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok, status = False, type(exc).__name__
        if not ok:
            self.failed += 1
            # The URL carries its check's key: never logged.
            log.warning("heartbeat.ping_failed", answer=status)
            return False
        self.sent += 1
        return True
