"""``watchd test-alert RECEIVER``: one synthetic alert, then its resolve, through a receiver.

Bypasses routing and grouping on purpose: it answers "does this receiver's
configuration work?" and exits 0 only when both sends were accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time

import aiohttp

from watchd.alerting.model import Alert, fingerprint
from watchd.alerting.receivers.base import Notification, NotifyError
from watchd.alerting.receivers.build import build_one
from watchd.commands.configuring import load_config_or_report, print_problems
from watchd.config.model import Config
from watchd.config.secrets import ResolvedSecrets, resolve_secrets


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


def main(args: argparse.Namespace) -> int:
    config = load_config_or_report(args)
    if config is None:
        return 2
    if args.receiver not in {r.name for r in config.receivers}:
        print(
            f"test-alert failed: no receiver named {args.receiver!r} (have: "
            f"{', '.join(r.name for r in config.receivers)})",
            file=sys.stderr,
        )
        return 1
    # Only this receiver's secret: no token, no other receiver's key is read.
    secrets = resolve_secrets(
        config, identities=False, receivers={args.receiver}, server=False, strict=False
    )
    if secrets.problems:
        print_problems(secrets.problems, f"test-alert failed: {args.receiver}'s secret:")
        return 1
    return asyncio.run(send(config, secrets, args.receiver))
