"""Notifiers from configuration (secrets already resolved).

Each kind's module is imported when a receiver of that kind is built, so a daemon loads
only the receivers its configuration names."""

from __future__ import annotations

from typing import TextIO

import aiohttp

from watchd.alerting.receivers.base import Notifier
from watchd.config.alerting import ReceiverConfig
from watchd.config.model import Config
from watchd.config.secrets import ResolvedSecrets


def build_one(
    r: ReceiverConfig,
    secrets: ResolvedSecrets,
    session: aiohttp.ClientSession,
    *,
    stdout: TextIO | None = None,
) -> Notifier:
    if r.console is not None:
        from watchd.alerting.receivers.simple import ConsoleNotifier

        return ConsoleNotifier(r.name, stdout)
    if r.webhook is not None:
        from watchd.alerting.receivers.simple import WebhookNotifier

        hmac = secrets.receiver_hmac.get(r.name)
        return WebhookNotifier(
            r.name,
            url=r.webhook.url,
            session=session,
            timeout=r.webhook.timeout,
            hmac_secret=hmac.get_secret_value() if hmac else None,
            max_alerts=r.webhook.max_alerts,
        )
    if r.slack is not None:
        from watchd.alerting.receivers.slack import SlackNotifier

        return SlackNotifier(
            r.name,
            webhook_url=secrets.receivers[r.name].get_secret_value(),
            session=session,
            timeout=r.slack.timeout,
            max_chats=r.slack.max_chats,
        )
    if r.pagerduty is not None:
        from watchd.alerting.receivers.pagerduty import PagerDutyNotifier

        return PagerDutyNotifier(
            r.name,
            routing_key=secrets.receivers[r.name].get_secret_value(),
            url=r.pagerduty.url,
            session=session,
            timeout=r.pagerduty.timeout,
            severity=r.pagerduty.severity,
        )
    if r.alertmanager is not None:
        from watchd.alerting.receivers.simple import AlertmanagerNotifier

        return AlertmanagerNotifier(
            r.name,
            urls=r.alertmanager.targets,
            session=session,
            timeout=r.alertmanager.timeout,
        )
    raise AssertionError("validated: one kind per receiver")


def build_all(
    config: Config,
    secrets: ResolvedSecrets,
    session: aiohttp.ClientSession,
    *,
    stdout: TextIO | None = None,
) -> dict[str, Notifier]:
    return {r.name: build_one(r, secrets, session, stdout=stdout) for r in config.receivers}
