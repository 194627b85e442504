"""The soak's receiver: an Alertmanager webhook consumer (payload version 4) that can be
taken down for a while.

It keeps what it accepted (with the host time it arrived), refuses while down —
``503``, ``429`` with ``Retry-After``, or ``reset`` (the connection closed without an
answer) — and answers 400 to a payload that breaks the webhook contract, as a strict
consumer would. ``drop_every_other`` accepts every notification but keeps only every
second one: a lossy receiver, for proving that the oracle notices.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

ALERT_KEYS = {
    "status",
    "labels",
    "annotations",
    "startsAt",
    "endsAt",
    "generatorURL",
    "fingerprint",
}
BODY_KEYS = {
    "version",
    "groupKey",
    "truncatedAlerts",
    "status",
    "receiver",
    "groupLabels",
    "commonLabels",
    "commonAnnotations",
    "externalURL",
    "alerts",
}
ZERO_TIME = "0001-01-01T00:00:00Z"


def problem(body: Any) -> str:
    """What breaks the webhook v4 contract in ``body`` ("" when nothing does)."""
    if not isinstance(body, dict) or set(body) != BODY_KEYS:
        return f"keys {sorted(body) if isinstance(body, dict) else type(body).__name__}"
    if body["version"] != "4" or not isinstance(body["groupKey"], str):
        return "version/groupKey"
    alerts = body["alerts"]
    if not isinstance(alerts, list) or not alerts:
        return "no alerts"
    for a in alerts:
        if not isinstance(a, dict) or set(a) != ALERT_KEYS:
            return f"alert keys {sorted(a) if isinstance(a, dict) else a!r}"
        if a["status"] not in ("firing", "resolved"):
            return f"alert status {a['status']!r}"
        if (a["status"] == "resolved") == (a["endsAt"] == ZERO_TIME):
            return f"{a['status']} alert with endsAt {a['endsAt']}"
    firing = any(a["status"] == "firing" for a in alerts)
    if body["status"] != ("firing" if firing else "resolved"):
        return f"group status {body['status']!r}"
    return ""


class SoakReceiver:
    def __init__(self, *, drop_every_other: bool = False, retry_after: float = 2.0) -> None:
        self.app = web.Application()
        self.app.router.add_post("/alerts", self.hook)
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.down: str | None = None  # None, "503", "429" or "reset"
        self.retry_after = retry_after
        self.drop_every_other = drop_every_other
        self.deliveries: list[tuple[float, dict[str, Any]]] = []
        self.accepted = 0
        self.refused = 0
        self.rejected: list[str] = []

    async def start(self) -> SoakReceiver:
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/alerts"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def hook(self, request: web.Request) -> web.StreamResponse:
        if self.down is not None:
            self.refused += 1
            if self.down == "reset" and request.transport is not None:
                request.transport.abort()  # the answer below goes nowhere
                return web.Response(status=503)
            if self.down == "429":
                return web.Response(status=429, headers={"Retry-After": f"{self.retry_after:g}"})
            return web.Response(status=503, text="receiver down")
        raw = await request.read()
        arrived = time.time()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        why = problem(body)
        if why:
            self.rejected.append(why)
            return web.Response(status=400, text=why)
        self.accepted += 1
        if not (self.drop_every_other and self.accepted % 2 == 0):
            self.deliveries.append((arrived, body))
        return web.Response(text="")
