"""watchd's configuration: YAML validated at the edge into pydantic models.

Every field says why its default is what it is. Unknown keys are errors that
name their path; durations, URLs and matchers are checked at load; secrets
are references (``*_file``, ``*_env``, ``*_credential``) resolved by
:func:`resolve_secrets`, whose errors name the reference, never the value.
Environment variables override nothing here (OpenTelemetry's ``OTEL_*`` are
read by the telemetry module).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from watchd import secrets
from watchd.kits import sharding
from watchd.kits.matchers import MatcherError, parse_matcher

DEFAULT_CONFIG_PATH = "/etc/watchd/watchd.yaml"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """``90s``, ``15m``, ``2h``, ``1h30m``, ``500ms`` (or a bare number of seconds)."""
    if isinstance(value, bool):
        raise ValueError("a duration like 90s, 15m or 2h is required")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("durations cannot be negative")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a duration like 90s, 15m or 2h is required")
    text = value.strip()
    pos = 0
    total = 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"{value!r} is not a duration (use e.g. 90s, 15m, 2h, 1h30m)")
    return total


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _floor(seconds: float, why: str) -> AfterValidator:
    """A duration's lower bound, stated (with the reason) in the error."""

    def check(value: float | None) -> float | None:
        if value is not None and value < seconds:
            raise ValueError(
                f"{format_duration(value, exact=True)} is below the minimum of "
                f"{format_duration(seconds, exact=True)} ({why})"
            )
        return value

    return AfterValidator(check)


# Floors: each stops a setting from turning into a busy loop or a hair trigger.
_TICK = "anything shorter is a busy loop"
Budget = Annotated[
    float, BeforeValidator(parse_duration), _floor(1.0, "a budget is time in status")
]
Timeout = Annotated[
    float, BeforeValidator(parse_duration), _floor(0.1, "no request completes that fast")
]


def format_duration(seconds: float, *, exact: bool = False) -> str:
    if exact and seconds < 60 and seconds != round(seconds):
        return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:g}s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            n, seconds = divmod(seconds, size)
            parts.append(f"{n}{unit}")
    return "".join(parts[:2])


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _exactly_one_ref(model: BaseModel, stem: str) -> None:
    """A secret is given by exactly one of ``{stem}_file``, ``_env``, ``_credential``."""
    names = [f"{stem}_{kind}" for kind in ("file", "env", "credential")]
    if sum(1 for n in names if getattr(model, n)) != 1:
        raise ValueError(f"give exactly one of {', '.join(names)}")


def _http_url(value: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    if parts.username or parts.password:
        raise ValueError("credentials in URLs are not allowed; use a *_file reference")
    return value.rstrip("/")


HttpUrl = Annotated[str, BeforeValidator(lambda v: _http_url(v) if isinstance(v, str) else v)]


class Budgets(Strict):
    """Time in status before ChatStuck / ChatStranded fires."""

    # Older servers' queue state; a chat waiting this long for a worker is not scheduling.
    pending: Budget = 600.0
    # A turn with model and tool steps rarely exceeds 30 min; fleets set requestTimeoutMs below it.
    running: Budget = 1800.0
    # Interrupt finalisation is seconds; 2 min covers a dead runner's lease expiry + rescan.
    interrupting: Budget = 120.0
    # The server cancels client-tool pauses after 5 min; 15 min means that failed too.
    requires_action: Budget = 900.0
    # Statuses this build does not know are treated as active with this budget.
    default: Budget = 1800.0
    # Optional second clock: `running` with no server-side progress (updated_at unmoved).
    # Off by default: capacity queueing legitimately makes no progress for a long time.
    stalled: Budget | None = None
    # Budgets for statuses that are not named above (a newer server's statuses).
    other: dict[str, Budget] = Field(default_factory=dict)

    def for_status(self, status: str) -> float:
        fixed = {
            "pending": self.pending,
            "running": self.running,
            "interrupting": self.interrupting,
            "requires_action": self.requires_action,
        }
        if status in fixed:
            return fixed[status]
        return self.other.get(status, self.default)


class IdentityConfig(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    url: HttpUrl
    token_file: str | None = None
    token_env: str | None = None
    token_credential: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    # Coder allows ~512 req/min per user per endpoint; 300 across all endpoints leaves room
    # for the agents that share the token.
    requests_per_minute: Annotated[int, Field(ge=10, le=6000)] = 300
    # How long an identity may fail to watch or list before IdentityUnhealthy fires:
    # long enough to ride out a Coder rolling restart, short enough to matter.
    unhealthy_after: Annotated[float, BeforeValidator(parse_duration), _floor(1.0, _TICK)] = 120.0
    # Chats per listing page. coderd has no maximum; 500 lists 50 000 chats in 100
    # requests and keeps the moving-cursor window short (docs/coder-api.md).
    page_size: Annotated[int, Field(ge=1, le=2**31 - 1)] = 500
    budgets: Budgets | None = None

    @model_validator(mode="after")
    def _one_token(self) -> IdentityConfig:
        _exactly_one_ref(self, "token")
        return self


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
        _exactly_one_ref(self, "routing_key")
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
        _exactly_one_ref(self, "webhook_url")
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


def _check_matchers(values: list[str]) -> list[str]:
    for v in values:
        try:
            parse_matcher(v)
        except MatcherError as exc:
            raise ValueError(str(exc)) from None
    return values


Matchers = Annotated[list[str], BeforeValidator(lambda v: v), Field(default_factory=list)]


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

    _v = field_validator("matchers")(_check_matchers)


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

    _v = field_validator("matchers")(_check_matchers)
    _t = field_validator("starts_at", "ends_at")(_check_time)


class InhibitRule(Strict):
    source_matchers: Matchers
    target_matchers: Matchers
    equal: list[str] = Field(default_factory=list)

    _v1 = field_validator("source_matchers")(_check_matchers)
    _v2 = field_validator("target_matchers")(_check_matchers)


def _default_inhibit() -> list[InhibitRule]:
    # An identity that cannot watch has no trustworthy verdicts; its ChatStuck is noise.
    return [
        InhibitRule(
            source_matchers=['alertname="IdentityUnhealthy"'],
            target_matchers=['alertname=~"ChatStuck|ChatStranded"'],
            equal=["identity"],
        )
    ]


class ServerConfig(Strict):
    listen: str = "127.0.0.1:9310"
    ingest_token_file: str | None = None
    ingest_token_env: str | None = None
    ingest_token_credential: str | None = None
    # Bearer token for the runtime silence API; without it silences are read-only.
    admin_token_file: str | None = None
    admin_token_env: str | None = None
    admin_token_credential: str | None = None
    # The link to this daemon's status page put into notifications (optional).
    external_url: str = ""
    # An agent batch is a few KB; 1 MiB allows big batches without letting one request
    # pin memory.
    max_body_bytes: Annotated[int, Field(ge=1024)] = 1 << 20

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{v!r} is not HOST:PORT")
        return v


class DetectionConfig(Strict):
    # Confirmation GETs per identity per second: a burst of due chats must not exhaust
    # Coder's per-endpoint budget (512/min) that the agents also draw on.
    confirm_rate: Annotated[float, Field(gt=0, le=50)] = 4.0
    # When this many chats of one identity are due together, one listing is cheaper
    # than that many GETs.
    confirm_listing_threshold: Annotated[int, Field(ge=1)] = 20
    # Report `error` chats as ChatFailed (off: an errored chat is the user's to resume).
    chat_failed: bool = False


class QuotaConfig(Strict):
    """Workspace-quota headroom per identity (premium deployments)."""

    enabled: bool = True
    # Quota moves with workspace builds, not chat events; every 5 min keeps the
    # diagnosis current at one request per identity.
    interval: Annotated[float, BeforeValidator(parse_duration), _floor(1.0, _TICK)] = 300.0
    # Org and user default to the token's own (users/me); set them to watch another.
    organization: str | None = None
    user: str = "me"
    # QuotaLow when budget − consumed drops under this: credits ("20") or percent ("10%").
    low: str | None = "10%"

    @field_validator("low")
    @classmethod
    def _low(cls, v: str | None) -> str | None:
        if v is None:
            return v
        text = v.strip()
        number = text[:-1] if text.endswith("%") else text
        try:
            if float(number) < 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"{v!r} is neither a credit count nor a percentage") from None
        return text

    def threshold(self, budget: int) -> float | None:
        if self.low is None or budget < 0:
            return None
        if self.low.endswith("%"):
            return budget * float(self.low[:-1]) / 100.0
        return float(self.low)


SWEEPABLE = frozenset(
    {"running", "pending", "interrupting", "waiting", "error", "completed", "paused"}
)


class SweepPolicy(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    # Alert-style labels: identity, owner, status, chat_label_<key>, and identity labels.
    matchers: Matchers
    status: list[str]
    # Time in status (server clock) before the policy applies, e.g. 2h, or 7d for orphans.
    older_than: Annotated[
        float,
        BeforeValidator(parse_duration),
        _floor(1.0, "a policy acts on time in status"),
    ]
    # interrupt: stop the run; archive: archive idle chats; interrupt_then_archive: both,
    # archiving only once the chat settled (waiting/error).
    action: Literal["interrupt", "archive", "interrupt_then_archive"]

    _v = field_validator("matchers")(_check_matchers)

    @field_validator("status")
    @classmethod
    def _status(cls, v: list[str]) -> list[str]:
        if "requires_action" in v:
            raise ValueError(
                "requires_action chats are never swept: the pause may be the only "
                "record of a committed client-tool effect"
            )
        unknown = sorted(set(v) - SWEEPABLE)
        if unknown or not v:
            raise ValueError(f"statuses must be among {sorted(SWEEPABLE)} (got {unknown or v})")
        return v


class SweepConfig(Strict):
    """Opt-in remediation. Off by default; dry-run by default when on."""

    enabled: bool = False
    dry_run: bool = True
    interval: Annotated[float, BeforeValidator(parse_duration), _floor(1.0, _TICK)] = 60.0
    # Mutations per identity per minute: sweeping must never look like an attack.
    actions_per_minute: Annotated[int, Field(ge=1, le=600)] = 30
    concurrency: Annotated[int, Field(ge=1, le=32)] = 2
    # How long an interrupted chat may take to settle before the sweep gives up on it.
    settle_timeout: Annotated[
        float, BeforeValidator(parse_duration), _floor(1.0, "a chat cannot settle faster")
    ] = 120.0
    # Announcements (ChatSwept) stay firing this long, then resolve.
    announce_for: Annotated[
        float, BeforeValidator(parse_duration), _floor(1.0, "shorter is never seen")
    ] = 600.0
    # A chat whose execution state is invalid (409 "Chat is in an invalid state." on
    # every mutation) is only reported unless this is on; then the sweep calls
    # POST …/reconcile-invalid once (moving it to `error`) and handles it normally.
    reconcile_invalid: bool = False
    policies: list[SweepPolicy] = Field(default_factory=list)


class FileSourceConfig(Strict):
    path: str
    service: str
    instance: str
    agent: str | None = None
    # Start at the end like `tail -F` (a restart must not replay a day of events).
    from_start: bool = False


class TelemetryConfig(Strict):
    """Spans from transport events. Standard OTEL_EXPORTER_OTLP_* variables override these."""

    # otlp | console | none; unset: otlp when an endpoint is configured (here or via
    # OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT), else none.
    exporter: Literal["otlp", "console", "none"] | None = None
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    endpoint: str | None = None
    timeout: Timeout = 10.0
    # Spans in flight to the exporter; past it new spans are refused and counted.
    max_queue_size: Annotated[int, Field(ge=16)] = 20_000
    batch_size: Annotated[int, Field(ge=1)] = 512
    schedule_delay: Annotated[float, BeforeValidator(parse_duration), _floor(0.01, _TICK)] = 1.0
    # An open request/connection/segment older than this is closed as unsettled.
    pair_horizon: Annotated[
        float, BeforeValidator(parse_duration), _floor(1.0, "shorter closes live requests")
    ] = 600.0
    max_open_pairs: Annotated[int, Field(ge=16)] = 20_000
    # Events waiting for the converter (ingest + file sources + watchd's own traffic).
    ingest_queue: Annotated[int, Field(ge=16)] = 50_000
    # Turn watchd's own HTTP and WebSocket traffic into spans too.
    own_events: bool = True
    sources: list[FileSourceConfig] = Field(default_factory=list)

    def exporter_kind(self, env: dict[str, str]) -> str:
        if (
            env.get("OTEL_SDK_DISABLED", "").lower() == "true"
            or env.get("OTEL_TRACES_EXPORTER", "") == "none"
        ):
            return "none"
        if self.exporter is not None:
            return self.exporter
        has_env = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return "otlp" if (self.endpoint or has_env) else "none"


class HeartbeatConfig(Strict):
    """A dead man's switch: silence from a monitor reads as "all is well", so watchd says
    "I am alive and seeing" every ``interval`` — and only while that is true: the loop
    responsive, every identity ready or already alerted (IdentityUnhealthy), state
    persisting. Off unless ``receivers`` or a ping URL is given."""

    # Dead man's switch services expect a beat every minute or so; they alert after a
    # few missed ones (configure their grace at 2-3 intervals).
    interval: Annotated[float, BeforeValidator(parse_duration), _floor(1.0, _TICK)] = 60.0
    # Receivers that get the always-firing `Watchdog` alert directly every interval
    # (Prometheus' convention: an Alertmanager route to a DMS, a webhook to a heartbeat
    # integration). Sent outside aggregation groups: a group would repeat it by itself.
    receivers: list[str] = Field(default_factory=list)
    # A push-style ping (healthchecks.io, Uptime Kuma): a GET every interval. Such URLs
    # carry their check's key, so the URL is a secret reference.
    ping_url_file: str | None = None
    ping_url_env: str | None = None
    ping_url_credential: str | None = None
    timeout: Timeout = 10.0

    @property
    def enabled(self) -> bool:
        return bool(
            self.receivers or self.ping_url_file or self.ping_url_env or self.ping_url_credential
        )

    @model_validator(mode="after")
    def _one_url(self) -> HeartbeatConfig:
        refs = [self.ping_url_file, self.ping_url_env, self.ping_url_credential]
        if sum(1 for r in refs if r) > 1:
            raise ValueError("give at most one of ping_url_file, ping_url_env, ping_url_credential")
        return self


class ShardingConfig(Strict):
    """Many replicas (docs/kubernetes.md, docs/scaling.md): each owns the identities that
    rendezvous hashing gives it; ``replication_factor`` replicas own each identity."""

    # One replica owns everything: the single-process default.
    replicas: Annotated[int, Field(ge=1, le=1000)] = 1
    # This replica's number, 0 … replicas-1. Or read it from the pod (index_from).
    index: Annotated[int, Field(ge=0)] | None = None
    # hostname: a StatefulSet pod's hostname ends in its ordinal (watchd-2);
    # pod_name: the POD_NAME environment variable (the Downward API's metadata.name).
    index_from: Literal["hostname", "pod_name"] | None = None
    # Replicas per identity: 1 shards, 2 makes HA pairs (both alert, through an
    # Alertmanager cluster that deduplicates).
    replication_factor: Annotated[int, Field(ge=1)] = 1
    # With replication_factor ≥ 2 every owner notifies: webhook, Slack and PagerDuty
    # receivers would page once per replica, so they are refused unless allowed here.
    ha_direct_receivers: Literal["deny", "allow"] = "deny"

    @property
    def ha(self) -> bool:
        return self.replication_factor >= 2

    @property
    def everyone_owns_all(self) -> bool:
        return self.replication_factor == self.replicas

    @model_validator(mode="after")
    def _shape(self) -> ShardingConfig:
        if self.replication_factor > self.replicas:
            raise ValueError(
                f"replication_factor ({self.replication_factor}) cannot exceed "
                f"replicas ({self.replicas})"
            )
        if self.index is not None and self.index_from is not None:
            raise ValueError("give index or index_from, not both")
        if self.index is not None and self.index >= self.replicas:
            raise ValueError(
                f"index {self.index} is out of range for replicas {self.replicas} "
                f"(0 … {self.replicas - 1})"
            )
        if self.index is None and self.index_from is None and not self.everyone_owns_all:
            raise ValueError(
                "this replica's number is needed when replicas own different identities: "
                "give index, or index_from: hostname (a StatefulSet) or pod_name (POD_NAME)"
            )
        return self


class Config(Strict):
    # Empty only with watching: false (a spans-only sidecar).
    identities: list[IdentityConfig] = Field(default_factory=list)
    # false: no Coder identity is watched; the daemon only converts transport events to
    # spans (a sidecar beside an agent while a central watchd does the watching).
    watching: bool = True
    sharding: ShardingConfig = Field(default_factory=ShardingConfig)
    budgets: Budgets = Field(default_factory=Budgets)
    # The stream drops events (NOTIFY is best-effort): a full listing every minute bounds
    # how long a lost transition stays unseen.
    reconcile_interval: Annotated[
        float,
        BeforeValidator(parse_duration),
        _floor(5.0, "a full listing per identity more often only burns Coder's rate budget"),
    ] = 60.0
    detection: DetectionConfig = Field(default_factory=DetectionConfig)
    receivers: list[ReceiverConfig] = Field(
        default_factory=lambda: [ReceiverConfig(name="console", console=ConsoleReceiver())]
    )
    route: RouteConfig = Field(default_factory=lambda: RouteConfig(receiver="console", matchers=[]))
    silences: list[SilenceConfig] = Field(default_factory=list)
    inhibit_rules: list[InhibitRule] = Field(default_factory=_default_inhibit)
    server: ServerConfig = Field(default_factory=ServerConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    sweep: SweepConfig = Field(default_factory=SweepConfig)
    heartbeat: HeartbeatConfig = Field(default_factory=HeartbeatConfig)
    state_dir: str = "/var/lib/watchd"
    # The link in alerts; the Coder UI shows a chat at {deployment}/agents/{chat_id}.
    chat_link_template: str = "{deployment}/agents/{chat_id}"

    @model_validator(mode="after")
    def _cross(self) -> Config:
        names = [i.name for i in self.identities]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"identity names must be unique: {', '.join(dupes)}")
        if not self.identities and self.watching:
            raise ValueError(
                "identities: at least one identity is required "
                "(or watching: false for a spans-only sidecar)"
            )
        if self.identities and not self.watching:
            raise ValueError("identities: watching is false, so no identity would be watched")
        receivers = [r.name for r in self.receivers]
        rdupes = sorted({n for n in receivers if receivers.count(n) > 1})
        if rdupes:
            raise ValueError(f"receiver names must be unique: {', '.join(rdupes)}")
        if self.route.receiver is None:
            raise ValueError("route.receiver: the root route needs a receiver")
        self._check_route(self.route, set(receivers), "route")
        unknown = sorted(set(self.heartbeat.receivers) - set(receivers))
        if unknown:
            raise ValueError(f"heartbeat.receivers: no receiver named {', '.join(unknown)}")
        self._check_ha()
        return self

    def _check_ha(self) -> None:
        sh = self.sharding
        if not sh.ha or sh.ha_direct_receivers == "allow":
            return
        # Receivers alerts are routed to. One used only by `heartbeat` gets each replica's
        # own Watchdog, which is meant to come from every replica.
        routed = set(_route_receivers(self.route))
        for i, r in enumerate(self.receivers):
            if r.kind in DIRECT_KINDS and r.name in routed:
                raise ValueError(
                    f"receivers.{i}.{r.kind}: receiver {r.name!r} would page once per replica: "
                    f"sharding.replication_factor is {sh.replication_factor}, so "
                    f"{sh.replication_factor} replicas alert for every identity. Send alerts "
                    "to an Alertmanager cluster (an alertmanager receiver), which keeps one "
                    "notification per group across its peers, or set "
                    "sharding.ha_direct_receivers: allow (PagerDuty merges by dedup_key; "
                    "Slack and webhooks do not)"
                )

    def owned_identities(self, index: int) -> list[IdentityConfig]:
        """The identities replica ``index`` watches (all of them with one replica)."""
        sh = self.sharding
        if sh.everyone_owns_all:
            return list(self.identities)
        return [
            i
            for i in self.identities
            if index in sharding.owners(i.name, replicas=sh.replicas, factor=sh.replication_factor)
        ]

    def identity_owners(self) -> dict[str, list[int]]:
        """identity → the replicas that own it."""
        sh = self.sharding
        return sharding.assignment(
            (i.name for i in self.identities), replicas=sh.replicas, factor=sh.replication_factor
        )

    def _check_route(self, route: RouteConfig, known: set[str], path: str) -> None:
        if route.receiver is not None and route.receiver not in known:
            raise ValueError(f"{path}.receiver: no receiver named {route.receiver!r}")
        # Floors live here, not on RouteConfig, so the alert engine's own tests may run
        # it faster; an operator's tree never does.
        for key, floor, why in _ROUTE_FLOORS:
            value = getattr(route, key)
            if value is not None and value < floor:
                raise ValueError(
                    f"{path}.{key}: {format_duration(value, exact=True)} is below the minimum "
                    f"of {format_duration(floor, exact=True)} ({why})"
                )
        for i, child in enumerate(route.routes):
            self._check_route(child, known, f"{path}.routes.{i}")

    def budgets_for(self, identity: IdentityConfig) -> Budgets:
        return identity.budgets or self.budgets


def _route_receivers(route: RouteConfig) -> list[str]:
    out = [route.receiver] if route.receiver else []
    for child in route.routes:
        out += _route_receivers(child)
    return out


# Receivers that notify people directly (no deduplication across senders).
DIRECT_KINDS = ("webhook", "slack", "pagerduty")


def shard_index(
    config: Config, *, env: dict[str, str] | None = None, hostname: str | None = None
) -> int:
    """This replica's number: ``sharding.index``, or the ordinal of the pod's hostname
    or ``POD_NAME``. Raises ConfigError naming ``sharding.index_from``."""
    import os
    import socket

    sh = config.sharding
    if sh.index is not None:
        return sh.index
    if sh.index_from is None:
        return 0  # every replica owns every identity; the number is only a label
    if sh.index_from == "hostname":
        name = hostname if hostname is not None else socket.gethostname()
        where = f"the hostname {name!r}"
    else:
        source = env if env is not None else dict(os.environ)
        name = source.get("POD_NAME", "")
        if not name:
            raise ConfigError(
                [
                    "sharding.index_from: pod_name, but POD_NAME is not set (map it from "
                    "the Downward API: fieldRef metadata.name)"
                ]
            )
        where = f"POD_NAME {name!r}"
    n = sharding.ordinal(name)
    if n is None:
        raise ConfigError(
            [
                f"sharding.index_from: {where} does not end in a pod ordinal "
                "(-0, -1, …, as a StatefulSet's pods do)"
            ]
        )
    if n >= sh.replicas:
        raise ConfigError(
            [
                f"sharding.index_from: {where} gives replica {n}, but sharding.replicas "
                f"is {sh.replicas} (0 … {sh.replicas - 1}): scale the StatefulSet and "
                "sharding.replicas together"
            ]
        )
    return n


_ROUTE_FLOORS = (
    ("group_interval", 1.0, "a group is re-notified no faster than once a second"),
    ("repeat_interval", 1.0, "a repeat sooner than that is a notification storm"),
)


class ConfigError(Exception):
    """Invalid configuration: ``problems`` has one line per problem, each naming its path."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def _format_errors(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        msg = msg.removeprefix("Value error, ")
        if not err["loc"] and re.match(r"^[a-z_][a-z0-9_.]*: ", msg):
            out.append(msg)  # a cross-field check that names its own path
            continue
        out.append(f"{path}: {msg}")
    return out


def parse_config(data: Any, *, source: str = "config") -> Config:
    if data is None:
        raise ConfigError([f"{source}: empty configuration"])
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: top level must be a mapping"])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML says keys are
    unique; PyYAML silently keeps the last, hiding a typo)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateKey(key, line, seen[key])
                    seen[key] = line
                except TypeError:  # an unhashable key: the normal path reports it
                    continue
        return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


def load_yaml(text: str, *, source: str) -> Any:
    """YAML with unique keys; errors are ConfigError lines naming the place."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except _DuplicateKey as dup:
        raise ConfigError(
            [
                f"{source}: line {dup.line}: duplicate key {dup.key!r} "
                f"(first given at line {dup.first})"
            ]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError([f"{source}: not valid YAML{where}"]) from None


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read ({exc.strerror or type(exc).__name__})"]) from None
    return parse_config(load_yaml(text, source=str(p)), source=str(p))


class ResolvedSecrets(BaseModel):
    """Secret values, held as SecretStr so that repr/str/logging never show them.

    ``problems`` lists the references that could not be read when resolved with
    ``strict=False`` (each naming its path, never a value); their secrets are absent.
    """

    model_config = ConfigDict(frozen=True)
    tokens: dict[str, SecretStr]
    receivers: dict[str, SecretStr]
    receiver_hmac: dict[str, SecretStr]
    ingest_token: SecretStr | None
    admin_token: SecretStr | None = None
    heartbeat_url: SecretStr | None = None
    problems: tuple[str, ...] = ()


def resolve_secrets(
    config: Config,
    *,
    identities: bool = True,
    receivers: Collection[str] | None = None,
    server: bool = True,
    strict: bool = True,
) -> ResolvedSecrets:
    """Read the referenced secrets; all problems are collected, each naming its path.

    A command reads only what it uses: ``identities`` (tokens), ``receivers`` (these
    receivers' secrets; None means all), ``server`` (ingest and admin tokens). With
    ``strict`` a problem raises ConfigError; without, it is listed in ``problems``.
    """
    problems: list[str] = []
    tokens: dict[str, SecretStr] = {}
    recv: dict[str, SecretStr] = {}
    hmac: dict[str, SecretStr] = {}

    def take(path: str, *, file: str | None, env: str | None, cred: str | None) -> str | None:
        try:
            return secrets.resolve(file=file, env=env, credential=cred, what=path)
        except secrets.SecretError as exc:
            problems.append(str(exc))
            return None

    for i, ident in enumerate(config.identities if identities else []):
        v = take(
            f"identities.{i}.token ({ident.name})",
            file=ident.token_file,
            env=ident.token_env,
            cred=ident.token_credential,
        )
        if v is not None:
            tokens[ident.name] = SecretStr(v)
    for i, r in enumerate(config.receivers):
        if receivers is not None and r.name not in receivers:
            continue
        path = f"receivers.{i}.{r.kind} ({r.name})"
        if r.pagerduty:
            p = r.pagerduty
            v = take(
                path + ".routing_key",
                file=p.routing_key_file,
                env=p.routing_key_env,
                cred=p.routing_key_credential,
            )
            if v is not None:
                if not re.fullmatch(r"[A-Za-z0-9]{32}", v):
                    problems.append(f"{path}.routing_key: must be 32 alphanumeric characters")
                else:
                    recv[r.name] = SecretStr(v)
        elif r.slack:
            s = r.slack
            v = take(
                path + ".webhook_url",
                file=s.webhook_url_file,
                env=s.webhook_url_env,
                cred=s.webhook_url_credential,
            )
            if v is not None:
                try:
                    _http_url(v)
                except ValueError:
                    problems.append(
                        f"{path}.webhook_url: the referenced value is not an http(s) URL"
                    )
                else:
                    recv[r.name] = SecretStr(v)
        elif r.webhook and (
            r.webhook.hmac_secret_file
            or r.webhook.hmac_secret_env
            or r.webhook.hmac_secret_credential
        ):
            w = r.webhook
            v = take(
                path + ".hmac_secret",
                file=w.hmac_secret_file,
                env=w.hmac_secret_env,
                cred=w.hmac_secret_credential,
            )
            if v is not None:
                hmac[r.name] = SecretStr(v)
    ingest = None
    admin = None
    srv = config.server
    if server and (srv.ingest_token_file or srv.ingest_token_env or srv.ingest_token_credential):
        v = take(
            "server.ingest_token",
            file=srv.ingest_token_file,
            env=srv.ingest_token_env,
            cred=srv.ingest_token_credential,
        )
        if v is not None:
            ingest = SecretStr(v)
    if server and (srv.admin_token_file or srv.admin_token_env or srv.admin_token_credential):
        admin = resolve_admin_token(config, problems)
    beat = None
    hb = config.heartbeat
    if server and (hb.ping_url_file or hb.ping_url_env or hb.ping_url_credential):
        v = take(
            "heartbeat.ping_url",
            file=hb.ping_url_file,
            env=hb.ping_url_env,
            cred=hb.ping_url_credential,
        )
        if v is not None:
            try:
                _http_url(v)
            except ValueError:
                problems.append("heartbeat.ping_url: the referenced value is not an http(s) URL")
            else:
                beat = SecretStr(v)
    if problems and strict:
        raise ConfigError(problems)
    return ResolvedSecrets(
        tokens=tokens,
        receivers=recv,
        receiver_hmac=hmac,
        ingest_token=ingest,
        admin_token=admin,
        heartbeat_url=beat,
        problems=tuple(problems),
    )


def resolve_admin_token(config: Config, problems: list[str]) -> SecretStr | None:
    """The admin token alone (what ``watchd silence`` needs), or None if not configured."""
    srv = config.server
    if not (srv.admin_token_file or srv.admin_token_env or srv.admin_token_credential):
        return None
    try:
        value = secrets.resolve(
            file=srv.admin_token_file,
            env=srv.admin_token_env,
            credential=srv.admin_token_credential,
            what="server.admin_token",
        )
    except secrets.SecretError as exc:
        problems.append(str(exc))
        return None
    return SecretStr(value)
