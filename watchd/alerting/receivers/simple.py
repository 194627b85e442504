"""The console, webhook (Alertmanager webhook v4) and Alertmanager (API v2) notifiers."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import sys
import time
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from watchd.alerting.model import Alert, ConsoleSink
from watchd.alerting.receivers.base import (
    Notification,
    NotifyError,
    Rate,
    classify_http,
    dumps,
    post,
    rfc3339,
)
from watchd.kits import logs
from watchd.kits.heap import collector_paused

log = logs.get("watchd.alerting")

SIGNATURE_HEADER = "X-Watchd-Signature"


class ConsoleNotifier:
    kind = "console"
    send_resolved = True
    resend_every: float | None = None

    def __init__(self, name: str, stream: TextIO | None = None) -> None:
        self.name = name
        self.rate = Rate(per_second=1000.0, burst=1000)
        self.stream = stream or sys.stdout
        self._sink = ConsoleSink(self.stream)

    async def notify(self, n: Notification) -> None:
        where = " ".join(f"{k}={v}" for k, v in n.group_labels.items() if v)
        print(
            f"--- notification to {self.name}: {where}: {len(n.firing)} firing, "
            f"{len(n.resolved)} resolved",
            file=self.stream,
            flush=True,
        )
        for alert in n.alerts:
            self._sink.put(alert)


def am_alert(a: Alert, *, generator_url: str) -> dict[str, Any]:
    return {
        "status": a.status,
        "labels": a.labels,
        "annotations": a.annotations,
        "startsAt": rfc3339(a.starts_at),
        "endsAt": rfc3339(a.ends_at),
        "generatorURL": generator_url,
        "fingerprint": a.fingerprint,
    }


def webhook_body(n: Notification) -> dict[str, Any]:
    """Alertmanager's webhook payload, version 4."""
    url = n.status_url
    return {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": n.truncated,
        "status": n.status,
        "receiver": n.receiver,
        "groupLabels": dict(n.group_labels),
        "commonLabels": n.common_labels(),
        "commonAnnotations": n.common_annotations(),
        "externalURL": n.external_url,
        # An alert's generatorURL: its chat's timeline, else the status page.
        "alerts": [
            am_alert(a, generator_url=a.annotations.get("timeline") or url) for a in n.alerts
        ],
    }


def webhook_json(n: Notification) -> bytes:
    """The webhook body, encoded."""
    with collector_paused(len(n.alerts) > 1):  # tens of thousands of acyclic dicts
        return dumps(webhook_body(n))


class WebhookNotifier:
    kind = "webhook"
    send_resolved = True
    resend_every: float | None = None

    def __init__(
        self,
        name: str,
        *,
        url: str,
        session: aiohttp.ClientSession,
        timeout: float,
        hmac_secret: str | None = None,
        max_alerts: int = 0,
    ) -> None:
        self.name = name
        self.url = url
        self.session = session
        self.timeout = timeout
        self.hmac_secret = hmac_secret
        self.max_alerts = max_alerts
        self.rate = Rate(per_second=50.0, burst=50)

    async def notify(self, n: Notification) -> None:
        if self.max_alerts and len(n.alerts) > self.max_alerts:
            n = Notification(
                n.receiver,
                n.group_key,
                n.group_labels,
                n.alerts[: self.max_alerts],
                n.external_url,
                truncated=len(n.alerts) - self.max_alerts,
            )
        body = webhook_json(n)
        headers = {}
        if self.hmac_secret:
            digest = hmac.new(self.hmac_secret.encode(), body, hashlib.sha256).hexdigest()
            headers[SIGNATURE_HEADER] = f"sha256={digest}"
        who = f"webhook receiver {self.name!r}"
        answer = await post(
            self.session, self.url, body=body, headers=headers, deadline=self.timeout, who=who
        )
        classify_http(answer, who=who)


# How far ahead a firing alert's endsAt is posted to an Alertmanager: an outage of watchd
# this long (less a minute) leaves its alerts firing there; a watchd gone for good lets
# them lapse after it (the Watchdog heartbeat says watchd is gone long before).
ENDS_AT_HORIZON = 900.0


class AlertmanagerNotifier:
    """Pushes alerts into an existing Alertmanager (``POST /api/v2/alerts``).

    As Alertmanager's clients must: every firing alert is posted (those watchd silences
    or inhibits too: Alertmanager applies its own), re-posted every minute, with an
    ``endsAt`` ENDS_AT_HORIZON ahead, so that only a real resolve (which carries the
    resolve time as ``endsAt``) ends it there. A watchd outage shorter than the horizon
    (less the minute since the last post) resolves nothing; ``resolve_timeout`` never
    applies to watchd's alerts.

    With several ``urls`` (the peers of one Alertmanager cluster) every alert goes to
    every peer, as Prometheus sends them: peers do not share alerts, only silences and
    the notification log. One peer accepting is a delivery (its cluster notifies once);
    only all of them failing is a failure — so a dead peer is tracked per peer: its last
    error (``peers()``, in ``/status`` and ``/metrics``) and one log line when it starts
    failing and one when it recovers.
    """

    kind = "alertmanager"
    send_resolved = True
    resend_every: float | None = 60.0

    def __init__(
        self,
        name: str,
        *,
        urls: list[str],
        session: aiohttp.ClientSession,
        timeout: float,
    ) -> None:
        self.name = name
        self.urls = [api_url(u) for u in urls]
        self.url = self.urls[0]
        # Where each peer is, for people: host and port only (a URL may carry credentials).
        self.hosts = [urlsplit(u).netloc.rpartition("@")[2] for u in urls]
        # Per peer, by index: the last error, "" when its last push was accepted, None
        # before its first push.
        self.peer_errors: list[str | None] = [None] * len(self.urls)
        self.session = session
        self.timeout = timeout
        self.rate = Rate(per_second=20.0, burst=20)

    async def notify(self, n: Notification) -> None:
        body = []
        # Alertmanager compares endsAt with its own clock: the host's, not watchd's.
        horizon = time.time() + ENDS_AT_HORIZON
        for a in n.alerts:
            item: dict[str, Any] = {
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": rfc3339(a.starts_at),
                "generatorURL": a.annotations.get("timeline") or n.status_url or "http://watchd/",
            }
            item["endsAt"] = rfc3339(a.ends_at if a.ends_at is not None else horizon)
            body.append(item)
        who = f"alertmanager receiver {self.name!r}"
        data = dumps(body)
        if len(self.urls) == 1:
            await self._push(0, data=data, who=who)
            return
        results = await asyncio.gather(
            *(self._push(i, data=data, who=f"{who} peer {i}") for i in range(len(self.urls))),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if len(errors) < len(results):
            return  # at least one peer has it: the cluster notifies once
        notify_errors = [e for e in errors if isinstance(e, NotifyError)]
        if len(notify_errors) < len(errors):
            raise next(e for e in errors if not isinstance(e, NotifyError))
        retryable = any(e.retryable for e in notify_errors)
        raise NotifyError(
            f"{who}: every peer failed: " + "; ".join(str(e) for e in notify_errors),
            retryable=retryable,
        )

    async def _push(self, peer: int, *, data: bytes, who: str) -> None:
        try:
            answer = await post(
                self.session, self.urls[peer], body=data, headers={}, deadline=self.timeout, who=who
            )
            classify_http(answer, who=who)
        except NotifyError as exc:
            self._peer_result(peer, str(exc))
            raise
        self._peer_result(peer, "")

    def _peer_result(self, peer: int, error: str) -> None:
        """Note a peer's last push; log only when it starts failing or recovers."""
        before, self.peer_errors[peer] = self.peer_errors[peer], error
        if error and not before:
            log.warning(
                "alertmanager.peer_failing",
                receiver=self.name,
                peer=peer,
                host=self.hosts[peer],
                error=error[:300],
            )
        elif before and not error:
            log.info(
                "alertmanager.peer_recovered", receiver=self.name, peer=peer, host=self.hosts[peer]
            )

    def peers(self) -> list[dict[str, Any]]:
        """Each peer's state, for /status: host, whether its last push was accepted (None
        before the first) and its last error."""
        return [
            {
                "peer": i,
                "host": host,
                "up": None if err is None else not err,
                "last_error": err or "",
            }
            for i, (host, err) in enumerate(zip(self.hosts, self.peer_errors, strict=True))
        ]


def api_url(base: str) -> str:
    """``/api/v2/alerts`` under an Alertmanager's base URL: appended to its path, before
    any query string (a proxy's parameter), never after it."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/api/v2/alerts"))
