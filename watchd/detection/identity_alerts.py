"""What watchd says about an identity it cannot watch as usual: IdentityUnhealthy (no
verdict can be trusted) and IdentityDegraded (watched by polling). Pure: the health is
read, never written; the detector decides when (:mod:`watchd.detection.detector`).
"""

from __future__ import annotations

from collections.abc import Mapping

from watchd.alerting.model import Alert, fingerprint
from watchd.config.fields import format_duration
from watchd.store.health import IdentityHealth


def unhealthy_fingerprint(h: IdentityHealth) -> str:
    """IdentityUnhealthy's fingerprint for this identity: the detector fires it under this,
    admission and readiness look it up by it."""
    return fingerprint(h.deployment, h.name, "IdentityUnhealthy")


def degraded_fingerprint(h: IdentityHealth) -> str:
    """IdentityDegraded's fingerprint for this identity."""
    return fingerprint(h.deployment, h.name, "IdentityDegraded")


def identity_unhealthy(
    h: IdentityHealth,
    *,
    labels: Mapping[str, str],
    down_for: float,
    starts_at: float,
) -> Alert:
    """IdentityUnhealthy for an identity that cannot watch its chats for ``down_for``."""
    return Alert(
        fingerprint=unhealthy_fingerprint(h),
        labels=_labels(h, labels, "IdentityUnhealthy", "critical"),
        starts_at=starts_at,
        annotations={
            "summary": f"Identity {h.name} cannot watch its chats ({h.state}) for "
            f"{format_duration(down_for)}",
            # Lets renderers keep "for …" live (alerting.model.live).
            "time_in_status": format_duration(down_for),
            "time_in_status_seconds": f"{down_for:.0f}",
            "last_error": h.last_error or "(none)",
            "hint": _identity_hint(h),
            "effect": "no ChatStuck verdicts for this identity until it recovers",
        },
    )


def identity_degraded(h: IdentityHealth, *, labels: Mapping[str, str], starts_at: float) -> Alert:
    """IdentityDegraded: the identity is watched by listing only (its stream is refused)."""
    return Alert(
        fingerprint=degraded_fingerprint(h),
        labels=_labels(h, labels, "IdentityDegraded", "warning"),
        starts_at=starts_at,
        annotations={
            "summary": f"Identity {h.name} is watched by polling: its watch stream is refused",
            "last_error": h.last_error or "(none)",
            "hint": "a proxy or load balancer in front of Coder refuses WebSocket upgrades "
            "on /chats/watch: allow them (Upgrade and Connection headers, long idle timeouts)",
            "effect": "verdicts go on from listings; changes are seen up to a poll late",
        },
    )


def _identity_hint(h: IdentityHealth) -> str:
    if h.state == "auth_failed":
        return (
            "the token was refused (401/403): rotate it and update the token file; "
            "watchd re-reads it on retry"
        )
    if h.state == "not_found":
        return "no chats API at this URL under /api/v2 or /api/experimental: check the url"
    return "Coder is unreachable or failing: check the deployment and the network path"


def _labels(
    h: IdentityHealth, labels: Mapping[str, str], name: str, severity: str
) -> dict[str, str]:
    """An identity alert's labels: the identity's configured ones, then its own."""
    out = dict(labels)
    out.update(
        {
            "alertname": name,
            "identity": h.name,
            "deployment": h.deployment,
            "severity": severity,
            "status": h.state,
        }
    )
    return out
