"""What is watched and how it is judged: identities, status budgets, detection, quota."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StringConstraints, field_validator, model_validator

from watchd.config.fields import (
    AS_DURATION,
    TICK,
    Budget,
    HttpUrl,
    Strict,
    exactly_one_ref,
    floor,
)


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
        # Asked once per verdict (ten thousand in a burst): no mapping built per call.
        if status == "running":
            return self.running
        if status == "pending":
            return self.pending
        if status == "interrupting":
            return self.interrupting
        if status == "requires_action":
            return self.requires_action
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
    unhealthy_after: Annotated[float, AS_DURATION, floor(1.0, TICK)] = 120.0
    # Chats per listing page. coderd has no maximum; 500 lists 50 000 chats in 100
    # requests and keeps the moving-cursor window short (docs/coder-api.md).
    page_size: Annotated[int, Field(ge=1, le=2**31 - 1)] = 500
    budgets: Budgets | None = None
    # A PEM file of the certificate authority that signed the deployment's certificate
    # (a private CA or a self-signed certificate): then only it is trusted for this
    # identity, instead of the system's roots. Verification is never turned off.
    ca_file: str | None = None

    @model_validator(mode="after")
    def _one_token(self) -> IdentityConfig:
        exactly_one_ref(self, "token")
        return self


class DetectionConfig(Strict):
    # Confirmation GETs per identity per second: a burst of due chats must not exhaust
    # Coder's per-endpoint budget (512/min) that the agents also draw on.
    confirm_rate: Annotated[float, Field(gt=0, le=50)] = 4.0
    # When this many chats of one identity are due together, one listing is cheaper
    # than that many GETs.
    confirm_listing_threshold: Annotated[int, Field(ge=1)] = 20
    # Report `error` chats as ChatFailed (off: an errored chat is the user's to resume).
    chat_failed: bool = False


class IncidentsConfig(Strict):
    """FleetIncident: one alert per (deployment, cause) over its firing chat alerts."""

    # On: when the deployment's concurrency cap or a group's quota sticks 200 chats
    # together, the on-call gets one page naming the cause, not 200 (the default
    # inhibit_rules mute the members). false restores one page per chat.
    enabled: bool = True
    # Five chats of one cause at once is past coincidence (an unlicensed deployment runs 5
    # root chats at a time, so a full cap queues at least that many). At least 2: a lone
    # chat is already paged by its own alert.
    min_chats: Annotated[int, Field(ge=2)] = 5


class QuotaConfig(Strict):
    """Workspace-quota headroom per identity (premium deployments)."""

    enabled: bool = True
    # Quota moves with workspace builds, not chat events; every 5 min keeps the
    # diagnosis current at one request per identity.
    interval: Annotated[float, AS_DURATION, floor(1.0, TICK)] = 300.0
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


class ForecastConfig(Strict):
    """QuotaExhaustionForecast: a linear projection of each identity's quota consumption
    (docs/alerting.md). It rides the quota poll: its readings are ``quota.interval`` apart."""

    enabled: bool = True
    # Half an hour of readings: six at the default 5m quota interval, enough to fit a line
    # through a fleet's fan-out, short enough that a change of pace shows within the hour.
    window: Annotated[float, AS_DURATION, floor(3.0, "a line needs readings over time")] = 1800.0
    # Page an hour ahead: time to delete idle workspaces or raise an allowance before new
    # builds fail with INSUFFICIENT_QUOTA.
    horizon: Annotated[float, AS_DURATION, floor(1.0, TICK)] = 3600.0


class AdmissionConfig(Strict):
    """What ``GET /v1/admission`` answers (docs/forwarding-events.md)."""

    # 0: admit while any credit is left. A dispatcher whose new chats each build a
    # workspace raises it to one workspace's cost, so the last admitted chat can still build.
    min_headroom: Annotated[int, Field(ge=0)] = 0


# An amount as the file may write it, for the JSON Schema: a number, or text as ``usd`` reads.
UsdInput = (
    Annotated[float, Field(gt=0, le=1_000_000)]
    | Annotated[str, StringConstraints(pattern=r"^\s*\$?\d+(?:\.\d+)?\s*$")]
    | None
)


def usd(value: Any) -> float | None:
    """An amount of US dollars: a number or a string like ``"25"`` or ``"$2.50"``."""
    if value is None:
        return None
    text = value.strip().removeprefix("$") if isinstance(value, str) else value
    try:
        if isinstance(text, bool):
            raise ValueError
        amount = float(text)
    except (TypeError, ValueError):
        raise ValueError(f'{value!r} is not an amount of US dollars (e.g. 25 or "$2.50")') from None
    if not 0 < amount <= 1_000_000:  # NaN fails it too
        raise ValueError(
            f"{value!r} must be more than $0 and at most $1,000,000 (US dollars per chat tree)"
        )
    return amount


class CostConfig(Strict):
    """ChatTreeCostHigh: what a chat tree has cost (AI Gateway), read only for chats past
    their budgets (docs/alerting.md). Off unless ``threshold_usd`` is set."""

    # US dollars one chat tree (a root and its subagents) may have cost before a stuck
    # chat in it pages. No default: what is too much is the deployment's call.
    threshold_usd: Annotated[
        float | None, BeforeValidator(usd, json_schema_input_type=UsdInput)
    ] = None
    # A tree past budget is read again this often: cost moves with a turn's requests, and
    # a stuck tree is already paged; every 5 min keeps the read cheap.
    interval: Annotated[float, AS_DURATION, floor(1.0, TICK)] = 300.0
    # Cost reads per identity per minute, from the identity's request budget (coderd
    # limits each /chats/<id>/cost path on its own, 512 a minute).
    reads_per_minute: Annotated[int, Field(ge=1, le=600)] = 30
    # Trees read per pass and identity (the rest wait for a later pass): a fleet stuck
    # together must not turn into a burst of cost reads.
    max_trees: Annotated[int, Field(ge=1, le=1000)] = 50

    @property
    def enabled(self) -> bool:
        return self.threshold_usd is not None

    @property
    def threshold_micros(self) -> int:
        return round((self.threshold_usd or 0) * 1_000_000)
