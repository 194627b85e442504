"""QuotaExhaustionForecast per identity: the quota poll's readings in, the alert out.

Each reading goes to the pure :class:`~watchd.watching.forecast.Forecaster` and to disk
(:mod:`watchd.watching.readings`, so a restart resumes the series), the outlook is
published on the identity's health (the status page, metrics and admission read it
there, never a Coder call), and the alert fires or resolves through the ledger like
QuotaLow. The words are here; the arithmetic is in ``forecast``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Protocol

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.observing import Quota
from watchd.config.fields import format_duration
from watchd.config.watching import ForecastConfig
from watchd.store.health import IdentityHealth, QuotaOutlook
from watchd.watching.forecast import Forecaster, Reading
from watchd.watching.readings import ReadingBook

ALERTNAME = "QuotaExhaustionForecast"


class AlertLedger(Protocol):
    """Where identity-level alerts fire and resolve (the daemon wires in the detector's
    ledger, so they are persisted like every alert)."""

    @property
    def firing(self) -> Mapping[str, Alert]: ...

    def raise_alert(self, alert: Alert, *, identity: str) -> None: ...

    def clear_alert(self, fp: str, *, why: str) -> None: ...


def forecast_fingerprint(deployment: str, identity: str) -> str:
    """The identity's QuotaExhaustionForecast (one per identity, like QuotaLow)."""
    return fingerprint(deployment, identity, ALERTNAME)


def rfc3339(epoch: float) -> str:
    """UTC, to the nearest second (not truncated: an eta is never a second early)."""
    whole = datetime.fromtimestamp(round(epoch), UTC)
    return whole.isoformat(timespec="seconds").replace("+00:00", "Z")


def fan_out_hint(*, headroom: int, rate_per_hour: float, horizon: float) -> str:
    """What fan-out the remaining headroom allows at the current rate."""
    lasts = headroom / rate_per_hour * 3600.0
    share = min(1.0, headroom / (rate_per_hour * horizon / 3600.0))
    return (
        f"at {rate_per_hour:.1f} credits/h the {headroom} credits left last about "
        f"{format_duration(lasts)}; to last {format_duration(horizon)}, hold new fan-out to "
        f"{share:.0%} of its current pace (queue new chats client-side: GET /v1/admission "
        "answers per identity), or free credits by deleting idle workspaces, or raise the "
        "group allowance"
    )


class QuotaForecast:
    """One identity's forecast: fed by its quota watcher after every successful read."""

    def __init__(
        self,
        *,
        health: IdentityHealth,
        alerts: AlertLedger,
        config: ForecastConfig,
        labels: Mapping[str, str],
        book: ReadingBook | None,
    ) -> None:
        self.health = health
        self.alerts = alerts
        self.config = config
        self.labels = dict(labels)
        self.book = book
        self.fp = forecast_fingerprint(health.deployment, health.name)
        since = health.server_clock.now() - config.window
        restored = book.load(health.name, since=since) if book is not None else []
        self.forecaster = Forecaster(
            window=config.window, horizon=config.horizon, readings=restored
        )

    async def observe(self, quota: Quota) -> None:
        """One quota reading (budget ≥ 0) taken now."""
        h = self.health
        reading = Reading(
            at=h.server_clock.now(), consumed=quota.credits_consumed, budget=quota.budget
        )
        verdict = self.forecaster.add(reading, firing=self.fp in self.alerts.firing)
        h.forecast = verdict.outlook
        if verdict.change == "fire":
            self.alerts.raise_alert(self.alert(verdict.outlook, quota), identity=h.name)
        elif verdict.change == "resolve":
            self.alerts.clear_alert(self.fp, why=verdict.why)
        if self.book is not None:
            self.book.add(h.name, reading, keep_after=reading.at - self.config.window)

    def stop(self, why: str) -> None:
        """The quota has no budget (or cannot be read from this deployment): no forecast."""
        self.health.forecast = None
        self.forecaster.readings.clear()
        self.alerts.clear_alert(self.fp, why=why)

    def alert(self, out: QuotaOutlook, quota: Quota) -> Alert:
        h = self.health
        assert out.eta is not None and out.eta_seconds is not None
        assert out.rate_per_hour is not None
        return Alert(
            fingerprint=self.fp,
            labels={
                **self.labels,
                "alertname": ALERTNAME,
                "identity": h.name,
                "deployment": h.deployment,
                "severity": "warning",
            },
            starts_at=time.time(),
            annotations={
                "summary": f"Workspace quota for {h.name} runs out in about "
                f"{format_duration(out.eta_seconds)} at the current rate "
                f"({quota.credits_consumed} of {quota.budget} credits used)",
                "eta": rfc3339(out.eta),
                "eta_seconds": str(round(out.eta_seconds)),
                "rate_per_hour": f"{out.rate_per_hour:.1f}",
                "headroom": str(out.headroom),
                "quota": f"{quota.credits_consumed}/{quota.budget}",
                "hint": fan_out_hint(
                    headroom=out.headroom,
                    rate_per_hour=out.rate_per_hour,
                    horizon=self.config.horizon,
                ),
            },
        )
