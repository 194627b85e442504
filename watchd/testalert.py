"""``watchd test-alert RECEIVER``: one synthetic alert, then its resolve, through a receiver.

Bypasses routing and grouping on purpose: it answers "does this receiver's
configuration work?" and exits 0 only when both sends were accepted.
"""

from __future__ import annotations

import socket
import sys
import time

import aiohttp

from watchd.alerting.model import Alert, fingerprint
from watchd.alerting.receivers.base import Notification, NotifyError
from watchd.alerting.receivers.build import build_one
from watchd.config.model import Config
from watchd.config.secrets import ResolvedSecrets


async def send(config: Config, secrets: ResolvedSecrets, receiver: str) -> int:
    rc = next(r for r in config.receivers if r.name == receiver)
    now = time.time()
    alert = Alert(
        fingerprint=fingerprint("watchd-test-alert", receiver, now),
        labels={
            "alertname": "WatchdTestAlert",
            "identity": "test",
            "severity": "info",
            "status": "running",
            "receiver": receiver,
        },
        annotations={
            "summary": f"Test alert from watchd on {socket.gethostname()}",
            "title": "watchd test alert",
            "hint": "no action needed",
        },
        starts_at=now,
    )
    async with aiohttp.ClientSession() as session:
        notifier = build_one(rc, secrets, session)
        for state in (alert, alert.resolved(time.time())):
            n = Notification(
                receiver=receiver,
                group_key=f"test-alert:{alert.fingerprint}",
                group_labels={"alertname": "WatchdTestAlert"},
                alerts=(state,),
                external_url=config.server.external_url,
            )
            try:
                await notifier.notify(n)
            except NotifyError as exc:
                kind = "transient" if exc.retryable else "permanent (configuration)"
                print(f"{state.status} notification failed, {kind}: {exc}", file=sys.stderr)
                return 1
            print(f"{state.status} notification accepted by {receiver} ({rc.kind})")
    return 0
