"""The admission answer: should a dispatcher start more chats for this identity now?

``GET /v1/admission?identity=NAME`` (fleet.md §3) and ``/status`` both ask
:func:`admission`. It reads only what the daemon already holds in memory (the
identity's health and quota outlook, the ledger's firing alerts, the chat store):
never a Coder call on the request path, and never a secret. Chat counts are a pass
over the identity's chats, remembered for a second per identity (:class:`Counts`), so
a dispatcher asking in a tight loop costs one pass a second, not one per request.

``admit`` is false while the identity is unhealthy (IdentityUnhealthy fires, or it was
never seeded), its headroom is at or under ``admission.min_headroom``, a capacity or
quota FleetIncident fires for its deployment, or its QuotaExhaustionForecast fires.
Each reason is ``"code: words"``; the codes are ``identity_unhealthy``,
``quota_headroom``, ``fleet_incident`` and ``quota_forecast``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from watchd.alerting.model import Alert
from watchd.config.fields import format_duration
from watchd.daemon.view import DaemonView
from watchd.detection.identity_alerts import unhealthy_fingerprint
from watchd.detection.incidents import incident_fingerprint
from watchd.kits.clock import loop_time
from watchd.store.chats import ChatStore
from watchd.watching.forecasting import forecast_fingerprint, rfc3339

COUNTS_FOR = 1.0  # seconds a chat count is reused
# FleetIncidents whose cause means "no room for another chat" (fleet.md §2, §3).
BLOCKING_CAUSES = ("capacity", "quota")


def fleet_incidents(firing: Mapping[str, Alert], deployment: str) -> list[str]:
    """The capacity and quota FleetIncidents firing for ``deployment``: looked up by the
    incident's fingerprint (a function of deployment and cause alone), two dict lookups."""
    found = []
    for cause in BLOCKING_CAUSES:
        alert = firing.get(incident_fingerprint(deployment, cause))
        if alert is not None and alert.name == "FleetIncident":
            found.append(cause)
    return found


class Counts:
    """Running and queued-for-capacity chats per identity, reused for ``COUNTS_FOR``."""

    def __init__(self) -> None:
        self._memo: dict[str, tuple[float, int, int]] = {}

    def of(self, store: ChatStore, identity: str) -> tuple[int, int]:
        now = loop_time()
        memo = self._memo.get(identity)
        if memo is not None and now - memo[0] < COUNTS_FOR:
            return memo[1], memo[2]
        running = queued = 0
        for r in store.records(identity):
            if r.status == "running":
                running += 1
            if r.queued_for_capacity:
                queued += 1
        if len(self._memo) > 10_000:
            self._memo.clear()
        self._memo[identity] = (now, running, queued)
        return running, queued


def admission(d: DaemonView, name: str, counts: Counts) -> dict[str, Any] | None:
    """The answer for identity ``name``, or None when this daemon does not watch it."""
    h = d.health.get(name)
    if h is None:
        return None
    firing = d.detector.firing
    reasons = []
    if unhealthy_fingerprint(h) in firing:
        reasons.append(f"identity_unhealthy: watchd cannot watch it ({h.state})")
    elif not h.seeded_once:
        reasons.append(f"identity_unhealthy: not yet seeded ({h.state})")
    headroom = h.quota.headroom if h.quota is not None else None
    floor = d.config.admission.min_headroom
    if headroom is not None and headroom <= floor:
        reasons.append(
            f"quota_headroom: {headroom} credits left (admission.min_headroom is {floor})"
        )
    reasons.extend(
        f"fleet_incident: a {cause} FleetIncident fires for {h.deployment}"
        for cause in fleet_incidents(firing, h.deployment)
    )
    out = h.forecast
    if forecast_fingerprint(h.deployment, name) in firing:
        words = "the quota is projected to run out within the forecast horizon"
        if out is not None and out.eta_seconds is not None and out.rate_per_hour is not None:
            words = (
                f"the quota runs out in about {format_duration(out.eta_seconds)} "
                f"at {out.rate_per_hour:.1f} credits/h"
            )
        reasons.append(f"quota_forecast: {words}")
    running, queued = counts.of(d.store, name)
    eta = out.eta if out is not None else None
    return {
        "identity": name,
        "admit": not reasons,
        "reasons": reasons,
        "headroom": headroom,
        "running": running,
        "queued_for_capacity": queued,
        "forecast_eta": None if eta is None else rfc3339(eta),
    }
