"""PagerDuty Events API v2: one incident per alert group.

``dedup_key`` is a hash of the group key, stable across restarts and
replicas, and the resolve uses the same routing key — so a re-sent trigger
(after a crash between send and record) updates the same incident instead of
paging twice. A FleetIncident is its own PagerDuty incident, ``dedup_key`` its
fingerprint (a function of deployment and cause alone), whatever group it is in, with
the count, identities, member ids and fix in ``custom_details``. Summary ≤ 1024
characters, event ≤ 512 KB (custom_details are shrunk to fit). 202 is accepted; 400 is
permanent; 429 and 5xx are retried.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import aiohttp

from watchd.alerting.model import Alert
from watchd.alerting.receivers.base import (
    Notification,
    NotifyError,
    Rate,
    dumps,
    post,
    retry_after,
    rfc3339,
)

SUMMARY_LIMIT = 1024
EVENT_LIMIT = 512 * 1024
SEVERITIES = ("critical", "error", "warning", "info")
LINKS = 10
INCIDENT = "FleetIncident"


def dedup_key(group_key: str) -> str:
    return hashlib.sha256(group_key.encode()).hexdigest()


def events(n: Notification, *, routing_key: str, default_severity: str) -> list[dict[str, Any]]:
    """The events a notification sends: one per FleetIncident in it (its own PagerDuty
    incident, ``dedup_key`` its fingerprint: the same on every replica and after a
    restart), and one for the group's other alerts, if any."""
    incidents = [a for a in n.alerts if a.name == INCIDENT]
    out = [incident_event(a, routing_key=routing_key, status_url=n.status_url) for a in incidents]
    if len(incidents) < len(n.alerts):
        rest = (
            n
            if not incidents
            else replace(n, alerts=tuple(a for a in n.alerts if a.name != INCIDENT))
        )
        out.append(event(rest, routing_key=routing_key, default_severity=default_severity))
    return out


def incident_event(a: Alert, *, routing_key: str, status_url: str = "") -> dict[str, Any]:
    """A FleetIncident as one PagerDuty incident: the cause, the count, the identities,
    the member ids and the fix in ``custom_details``, the first members as links."""
    key = a.fingerprint
    if not a.firing:
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": key}
    ann, lab = a.annotations, a.labels
    chats = [c for c in ann.get("chats", "").split(",") if c]
    hrefs = ann.get("links", "").split(" ")
    details: dict[str, Any] = {
        "cause": lab.get("cause", ""),
        "count": int(ann["count"]) if ann.get("count", "").isdigit() else len(chats),
        "identities": [i for i in ann.get("identities", "").split(",") if i],
        "chats": chats,
        "fix": ann.get("hint", ""),
        "since": ann.get("since", ""),
        "deployment": lab.get("deployment", ""),
    }
    payload = {
        "summary": ann.get("summary", INCIDENT)[:SUMMARY_LIMIT],
        "source": lab.get("deployment", "watchd") or "watchd",
        "severity": lab.get("severity", "warning")
        if lab.get("severity") in SEVERITIES
        else "warning",
        "timestamp": rfc3339(a.starts_at),
        "component": lab.get("cause", "") or "watchd",
        "group": lab.get("deployment", "") or INCIDENT,
        "class": INCIDENT,
        "custom_details": details,
    }
    links = [
        {"href": href, "text": chat[:100]}
        for chat, href in zip(chats[:LINKS], hrefs, strict=False)
        if href and href != "-"
    ]
    return _trigger(routing_key, key, payload, links, status_url=status_url)


def _trigger(
    routing_key: str,
    dedup: str,
    payload: dict[str, Any],
    links: list[dict[str, str]],
    *,
    status_url: str,
) -> dict[str, Any]:
    """A trigger event, its ``custom_details.chats`` halved until it fits EVENT_LIMIT."""
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup,
        "client": "watchd",
        "payload": payload,
        "links": links,
    }
    if status_url:
        body["client_url"] = status_url
    details = payload["custom_details"]
    while len(dumps(body)) > EVENT_LIMIT and details["chats"]:
        details["chats"] = details["chats"][: len(details["chats"]) // 2]
        details["chats_truncated"] = True
    return body


def event(n: Notification, *, routing_key: str, default_severity: str) -> dict[str, Any]:
    key = dedup_key(n.group_key)
    if not n.firing:
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": key}
    firing = n.firing
    sevs = [a.labels.get("severity", "") for a in firing]
    severity = next((s for s in SEVERITIES if s in sevs), default_severity)
    common = n.common_labels()
    name = common.get("alertname", "alerts")
    identity = common.get("identity", "")
    if len(firing) == 1:
        summary = firing[0].annotations.get("summary", name)
    else:
        summary = f"{len(firing)} chats {name}"
        if identity:
            summary += f" on identity {identity}"
        titles = "; ".join(a.annotations.get("title", "") for a in firing[:5])
        summary += f": {titles}"
    details: dict[str, Any] = {
        "firing": len(firing),
        "resolved": len(n.resolved),
        "group": dict(n.group_labels),
        "chats": [
            {
                "chat_id": a.labels.get("chat_id", ""),
                "title": a.annotations.get("title", ""),
                "status": a.labels.get("status", ""),
                "time_in_status": a.annotations.get("time_in_status", ""),
                "hint": a.annotations.get("hint", ""),
                "link": a.annotations.get("link", ""),
                "timeline": a.annotations.get("timeline", ""),
            }
            for a in firing
        ],
    }
    payload = {
        "summary": summary[:SUMMARY_LIMIT],
        "source": common.get("deployment", "watchd") or "watchd",
        "severity": severity,
        "timestamp": rfc3339(min(a.starts_at for a in firing)),
        "component": identity or "watchd",
        "group": identity or name,
        "class": name,
        "custom_details": details,
    }
    links = [
        {"href": href, "text": f"{prefix}{a.annotations.get('title', 'chat')}"[:100]}
        for a in firing[:LINKS]
        for which, prefix in (("link", ""), ("timeline", "timeline: "))
        if (href := a.annotations.get(which))
    ][:LINKS]
    return _trigger(routing_key, key, payload, links, status_url=n.status_url)


class PagerDutyNotifier:
    kind = "pagerduty"
    send_resolved = True
    resend_every: float | None = None

    def __init__(
        self,
        name: str,
        *,
        routing_key: str,
        url: str,
        session: aiohttp.ClientSession,
        timeout: float,
        severity: str = "error",
    ) -> None:
        self.name = name
        self._key = routing_key
        self.url = url
        self.session = session
        self.timeout = timeout
        self.severity = severity
        # PagerDuty: about 120 events per minute per routing key.
        self.rate = Rate(per_second=2.0, burst=10)

    async def notify(self, n: Notification) -> None:
        who = f"pagerduty receiver {self.name!r}"
        # Each event is idempotent under its dedup_key: a retry after a partial send
        # re-sends the ones that went through as updates, never as second pages.
        for body in events(n, routing_key=self._key, default_severity=self.severity):
            await self._send(body, who)

    async def _send(self, body: dict[str, Any], who: str) -> None:
        answer = await post(
            self.session, self.url, body=dumps(body), headers={}, deadline=self.timeout, who=who
        )
        if answer.status == 202:
            return
        snippet = answer.text.strip().replace(self._key, "[REDACTED]")[:200]
        if answer.status == 429 or answer.status >= 500:
            raise NotifyError(
                f"{who}: HTTP {answer.status}: {snippet}",
                retryable=True,
                retry_after=retry_after(answer.headers),
            )
        raise NotifyError(
            f"{who}: HTTP {answer.status} (event rejected, check the routing "
            f"key and payload): {snippet}",
            retryable=False,
        )
