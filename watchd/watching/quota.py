"""Workspace-quota headroom per identity, and the QuotaLow alert.

``budget: -1`` means no quota is configured or licensed — not "exhausted".
A 404 means the route does not exist on this deployment (OSS): said once,
then quietly remembered. Headroom below the configured threshold fires
QuotaLow; recovering resolves it. Every reading with a budget also feeds the identity's
QuotaExhaustionForecast (:mod:`watchd.watching.forecasting`), when one is configured.
"""

from __future__ import annotations

import asyncio
import time

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.config.watching import QuotaConfig
from watchd.kits import logs
from watchd.kits.clock import loop_time
from watchd.store.health import IdentityHealth, QuotaState
from watchd.watching.forecasting import AlertLedger, QuotaForecast

log = logs.get("watchd.quota")


class QuotaWatcher:
    def __init__(
        self,
        *,
        health: IdentityHealth,
        client: CoderClient,
        alerts: AlertLedger,
        config: QuotaConfig,
        labels: dict[str, str],
        forecast: QuotaForecast | None = None,
    ) -> None:
        self.health = health
        self.client = client
        self.alerts = alerts
        self.config = config
        self.labels = labels
        self.forecast = forecast
        self.fp = fingerprint(health.deployment, health.name, "QuotaLow")

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.config.interval)

    async def check(self) -> None:
        h = self.health
        try:
            org = self.config.organization
            if org is None:
                me = await self.client.me()
                if not me.organization_ids:
                    self._state("unavailable", "the token's user belongs to no organization")
                    return
                org = me.organization_ids[0]
            quota = await self.client.workspace_quota(org, self.config.user)
        except (CoderError, PayloadError) as exc:
            # The same failure poll after poll (a revoked token) is said once; /status
            # keeps the latest, and IdentityUnhealthy pages for a token that is refused.
            again = h.quota_state == "error" and h.quota_error == str(exc)
            say = log.debug if again else log.warning
            h.quota_error = str(exc)
            h.quota_state = "error"
            say("quota.failed", identity=h.name, error=str(exc))
            return
        h.quota_checked = loop_time()
        if quota is None:
            self._state(
                "unavailable",
                "workspace quota is not available on this deployment "
                "(no premium license, or an OSS build)",
            )
            self.alerts.clear_alert(self.fp, why="quota unavailable")
            if self.forecast is not None:
                self.forecast.stop("quota unavailable")
            return
        h.quota = quota
        h.quota_error = ""
        if quota.unlimited:
            self._state("unlimited", "budget -1: no quota configured for this user")
            self.alerts.clear_alert(self.fp, why="no quota")
            if self.forecast is not None:
                self.forecast.stop("no quota")
            return
        h.quota_state = "ok"
        if self.forecast is not None:
            await self.forecast.observe(quota)
        threshold = self.config.threshold(quota.budget)
        headroom = quota.headroom
        assert headroom is not None
        if threshold is not None and headroom < threshold:
            labels = {
                **self.labels,
                "alertname": "QuotaLow",
                "identity": h.name,
                "deployment": h.deployment,
                "severity": "warning",
                "status": "quota",
            }
            self.alerts.raise_alert(
                Alert(
                    fingerprint=self.fp,
                    labels=labels,
                    starts_at=time.time(),
                    annotations={
                        "summary": f"Workspace quota for {h.name} is low: {headroom} of "
                        f"{quota.budget} credits left",
                        "quota": f"{quota.credits_consumed}/{quota.budget}",
                        "headroom": str(headroom),
                        "threshold": self.config.low or "",
                        "hint": "new workspace builds will fail with INSUFFICIENT_QUOTA: delete "
                        "idle workspaces (stopping frees only stop-scoped costs) or raise "
                        "the group allowance; keep fan-out within the headroom",
                    },
                ),
                identity=h.name,
            )
        else:
            self.alerts.clear_alert(self.fp, why="quota headroom recovered")

    def _state(self, state: QuotaState, message: str) -> None:
        if self.health.quota_state != state:
            log.info("quota.state", identity=self.health.name, state=state, note=message)
        self.health.quota_state = state
