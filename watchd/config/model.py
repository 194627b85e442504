"""watchd's whole configuration: the top-level model and its cross-field checks.

Every field says why its default is what it is; unknown keys are errors that name
their path. The parts live beside it, one module per subsystem (``watching``,
``alerting``, ``sweep``, ``telemetry``, ``process``); loading YAML into it is
``loading``'s job and reading the secrets it references is ``secrets``'.
Environment variables override nothing here (OpenTelemetry's ``OTEL_*`` are read
by the telemetry module).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from watchd.config.alerting import (
    DIRECT_KINDS,
    ROUTE_FLOORS,
    ConsoleReceiver,
    InhibitRule,
    ReceiverConfig,
    RouteConfig,
    SilenceConfig,
    default_inhibit,
    route_receivers,
)
from watchd.config.fields import (
    AS_DURATION,
    ConfigError,
    Strict,
    floor,
    format_duration,
)
from watchd.config.process import HeartbeatConfig, ServerConfig, ShardingConfig
from watchd.config.sweep import SweepConfig
from watchd.config.telemetry import TelemetryConfig
from watchd.config.watching import (
    AdmissionConfig,
    Budgets,
    CostConfig,
    DetectionConfig,
    ForecastConfig,
    IdentityConfig,
    IncidentsConfig,
    QuotaConfig,
)
from watchd.kits import sharding


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
        AS_DURATION,
        floor(5.0, "a full listing per identity more often only burns Coder's rate budget"),
    ] = 60.0
    detection: DetectionConfig = Field(default_factory=DetectionConfig)
    incidents: IncidentsConfig = Field(default_factory=IncidentsConfig)
    receivers: list[ReceiverConfig] = Field(
        default_factory=lambda: [ReceiverConfig(name="console", console=ConsoleReceiver())]
    )
    route: RouteConfig = Field(default_factory=lambda: RouteConfig(receiver="console", matchers=[]))
    silences: list[SilenceConfig] = Field(default_factory=list)
    inhibit_rules: list[InhibitRule] = Field(default_factory=default_inhibit)
    server: ServerConfig = Field(default_factory=ServerConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    forecast: ForecastConfig = Field(default_factory=ForecastConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
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
        routed = set(route_receivers(self.route))
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
        for key, minimum, why in ROUTE_FLOORS:
            value = getattr(route, key)
            if value is not None and value < minimum:
                raise ValueError(
                    f"{path}.{key}: {format_duration(value, exact=True)} is below the minimum "
                    f"of {format_duration(minimum, exact=True)} ({why})"
                )
        for i, child in enumerate(route.routes):
            self._check_route(child, known, f"{path}.routes.{i}")

    def budgets_for(self, identity: IdentityConfig) -> Budgets:
        return identity.budgets or self.budgets


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
