"""Where alerts go: receivers, the route tree, silences and inhibit rules."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from watchd.config.fields import (
    Duration,
    HttpUrl,
    Matchers,
    Strict,
    Timeout,
    check_matchers,
    exactly_one_ref,
)

# Receivers that notify people directly (no deduplication across senders).
DIRECT_KINDS = ("webhook", "slack", "pagerduty")


class WebhookReceiver(Strict):
    url: HttpUrl
    # Optional HMAC-SHA256 signature of the body in X-Watchd-Signature.
    hmac_secret_file: str | None = None
    hmac_secret_env: str | None = None
    hmac_secret_credential: str | None = None
    # Alertmanager's default; a big group can be cut without losing the count.
    max_alerts: Annotated[int, Field(ge=0)] = 0
    timeout: Timeout = 10.0


class PagerDutyReceiver(Strict):
    routing_key_file: str | None = None
    routing_key_env: str | None = None
    routing_key_credential: str | None = None
    url: HttpUrl = "https://events.pagerduty.com/v2/enqueue"
    # Severity for alerts whose `severity` label is missing or not a PagerDuty one.
    severity: Literal["critical", "error", "warning", "info"] = "error"
    timeout: Timeout = 10.0

    @model_validator(mode="after")
    def _one_key(self) -> PagerDutyReceiver:
        exactly_one_ref(self, "routing_key")
        return self


class SlackReceiver(Strict):
    webhook_url_file: str | None = None
    webhook_url_env: str | None = None
    webhook_url_credential: str | None = None
    # Chats listed per message before "+N more": keeps messages readable and under 50 blocks.
    max_chats: Annotated[int, Field(ge=1, le=40)] = 10
    timeout: Timeout = 10.0

    @model_validator(mode="after")
    def _one_url(self) -> SlackReceiver:
        exactly_one_ref(self, "webhook_url")
        return self


class AlertmanagerReceiver(Strict):
    # One Alertmanager, or every peer of an Alertmanager cluster in `urls`: like
    # Prometheus, watchd sends each alert to every peer (never through a load balancer);
    # the peers' gossip keeps one notification per group.
    url: HttpUrl | None = None
    urls: list[HttpUrl] = Field(default_factory=list)
    timeout: Timeout = 10.0

    @model_validator(mode="after")
    def _one_target(self) -> AlertmanagerReceiver:
        if (self.url is None) == (not self.urls):
            raise ValueError("give exactly one of url (one Alertmanager) or urls (its peers)")
        if len(set(self.urls)) != len(self.urls):
            raise ValueError("urls: each Alertmanager peer once")
        return self

    @property
    def targets(self) -> list[str]:
        return [self.url] if self.url is not None else list(self.urls)


class ConsoleReceiver(Strict):
    pass


class ReceiverConfig(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    webhook: WebhookReceiver | None = None
    pagerduty: PagerDutyReceiver | None = None
    slack: SlackReceiver | None = None
    alertmanager: AlertmanagerReceiver | None = None
    console: ConsoleReceiver | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ReceiverConfig:
        kinds = [
            k
            for k in ("webhook", "pagerduty", "slack", "alertmanager", "console")
            if getattr(self, k) is not None
        ]
        if len(kinds) != 1:
            raise ValueError("give exactly one of webhook, pagerduty, slack, alertmanager, console")
        return self

    @property
    def kind(self) -> str:
        for k in ("webhook", "pagerduty", "slack", "alertmanager", "console"):
            if getattr(self, k) is not None:
                return k
        raise AssertionError("validated")


class RouteConfig(Strict):
    """A node of the route tree; unset options inherit from the parent (Alertmanager)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    receiver: str | None = None
    matchers: Matchers
    continue_: bool = Field(default=False, alias="continue")
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    routes: list[RouteConfig] = Field(default_factory=list)

    _v = field_validator("matchers")(check_matchers)


def _check_time(value: str | None) -> str | None:
    from datetime import datetime

    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not an ISO 8601 time (e.g. 2026-12-01T08:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} needs a timezone (e.g. a trailing Z)")
    return value


class SilenceConfig(Strict):
    matchers: Matchers
    starts_at: str | None = None
    ends_at: str
    comment: str = ""
    created_by: str = "config"

    _v = field_validator("matchers")(check_matchers)
    _t = field_validator("starts_at", "ends_at")(_check_time)


class InhibitRule(Strict):
    source_matchers: Matchers
    target_matchers: Matchers
    equal: list[str] = Field(default_factory=list)

    _v1 = field_validator("source_matchers")(check_matchers)
    _v2 = field_validator("target_matchers")(check_matchers)


def default_inhibit() -> list[InhibitRule]:
    return [
        # An identity that cannot watch has no trustworthy verdicts; its ChatStuck is noise.
        InhibitRule(
            source_matchers=['alertname="IdentityUnhealthy"'],
            target_matchers=['alertname=~"ChatStuck|ChatStranded"'],
            equal=["identity"],
        ),
        # One page per cause: a FleetIncident holds back its members' pages (they stay on
        # /status, as inhibited). With incidents off none fires, so every chat pages.
        InhibitRule(
            source_matchers=['alertname="FleetIncident"'],
            target_matchers=['alertname=~"ChatStuck|ChatStranded"'],
            equal=["deployment", "cause"],
        ),
    ]


def route_receivers(route: RouteConfig) -> list[str]:
    out = [route.receiver] if route.receiver else []
    for child in route.routes:
        out += route_receivers(child)
    return out


ROUTE_FLOORS = (
    ("group_interval", 1.0, "a group is re-notified no faster than once a second"),
    ("repeat_interval", 1.0, "a repeat sooner than that is a notification storm"),
)
