"""The process around the watching: its HTTP server, heartbeat and sharding.

Also :func:`shard_index`, this replica's number read from the config, the
hostname or ``POD_NAME``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from watchd.config.fields import (
    AS_DURATION,
    TICK,
    SecretRef,
    Strict,
    Timeout,
    floor,
    http_url,
)


class ServerConfig(Strict):
    listen: str = "127.0.0.1:9310"
    ingest_token_file: str | None = None
    ingest_token_env: str | None = None
    ingest_token_credential: str | None = None
    # Bearer token for the runtime silence API and POST /-/reload; without it silences are
    # read-only and only SIGHUP reloads.
    admin_token_file: str | None = None
    admin_token_env: str | None = None
    admin_token_credential: str | None = None
    # The URL people reach this daemon at (as Alertmanager's --web.external-url): its
    # status page ({external_url}/status) and each chat's timeline
    # ({external_url}/status/chats/{chat_id}) are linked from notifications. Optional.
    external_url: str = ""
    # An agent batch is a few KB; 1 MiB allows big batches without letting one request
    # pin memory.
    max_body_bytes: Annotated[int, Field(ge=1024)] = 1 << 20

    @field_validator("external_url")
    @classmethod
    def _external_url(cls, v: str) -> str:
        if not v:
            return v
        from urllib.parse import urlsplit

        url = http_url(v)
        parts = urlsplit(url)
        if parts.query or parts.fragment:
            raise ValueError(
                f"{v!r} has a query or fragment: give the base URL people reach watchd at "
                "(e.g. https://watchd.example.com or https://example.com/watchd)"
            )
        if url.endswith("/status"):
            raise ValueError(
                f"{v!r} ends in /status: give the base URL (watchd adds /status and "
                "/status/chats/<id>)"
            )
        return url

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{v!r} is not HOST:PORT")
        return v


class HeartbeatConfig(Strict):
    """A dead man's switch: silence from a monitor reads as "all is well", so watchd says
    "I am alive and seeing" every ``interval`` — and only while that is true: the loop
    responsive, every identity ready or already alerted (IdentityUnhealthy), state
    persisting. Off unless ``receivers`` or a ping URL is given."""

    # Dead man's switch services expect a beat every minute or so; they alert after a
    # few missed ones (configure their grace at 2-3 intervals).
    interval: Annotated[float, AS_DURATION, floor(1.0, TICK)] = 60.0
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
        return bool(self.receivers or SecretRef.of(self, "ping_url").given)

    @model_validator(mode="after")
    def _one_url(self) -> HeartbeatConfig:
        if SecretRef.of(self, "ping_url").given > 1:
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
