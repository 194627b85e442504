"""What a soak runs: its size, and the watchd configurations it switches between.

A soak alternates (by SIGHUP) between :data:`VARIANTS`; the oracle reads its budgets and
delivery timings from the same objects, so the tolerances it states are those of the
config under test, never numbers of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchd.config.watching import DetectionConfig

# The statuses a soak moves chats through (era E): three with a budget, three idle.
WATCHED = ("running", "requires_action", "interrupting")
IDLE = ("waiting", "error", "paused")
ALERTNAME = {"running": "ChatStuck", "interrupting": "ChatStuck", "requires_action": "ChatStranded"}


@dataclass(frozen=True)
class Variant:
    """One watchd configuration of the soak: budgets and the route's timings."""

    budgets: Mapping[str, float]
    group_wait: float
    group_interval: float
    repeat_interval: float
    reconcile_interval: float = 5.0
    unhealthy_after: float = 60.0
    detection: DetectionConfig = field(default_factory=DetectionConfig)

    def budget(self, status: str) -> float:
        return self.budgets.get(status, self.budgets["default"])

    def config(self, receiver_url: str, *, budget_scale: float = 1.0) -> dict[str, Any]:
        """The top-level config entries (the harness adds identities, server, state_dir).
        ``budget_scale`` gives watchd budgets other than the oracle's (proving it fails)."""
        return {
            "budgets": {
                k: f"{v * budget_scale:g}s"
                for k, v in {"pending": self.budgets["default"], **self.budgets}.items()
            },
            "reconcile_interval": f"{self.reconcile_interval:g}s",
            "receivers": [{"name": "soak", "webhook": {"url": receiver_url}}],
            "route": {
                "receiver": "soak",
                "group_by": ["identity", "alertname", "status"],
                "group_wait": f"{self.group_wait:g}s",
                "group_interval": f"{self.group_interval:g}s",
                "repeat_interval": f"{self.repeat_interval:g}s",
            },
            # Per-chat pages are what the soak judges: one page per cause would hold
            # members back (docs/alerting.md); that path has its own tests.
            "incidents": {"enabled": False},
            "quota": {"enabled": False},
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "budgets": dict(self.budgets),
            "group_wait": self.group_wait,
            "group_interval": self.group_interval,
            "repeat_interval": self.repeat_interval,
            "reconcile_interval": self.reconcile_interval,
            "unhealthy_after": self.unhealthy_after,
            "confirm_rate": self.detection.confirm_rate,
            "confirm_listing_threshold": self.detection.confirm_listing_threshold,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Variant:
        return cls(
            budgets=dict(d["budgets"]),
            group_wait=d["group_wait"],
            group_interval=d["group_interval"],
            repeat_interval=d["repeat_interval"],
            reconcile_interval=d["reconcile_interval"],
            unhealthy_after=d["unhealthy_after"],
            detection=DetectionConfig(
                confirm_rate=d["confirm_rate"],
                confirm_listing_threshold=d["confirm_listing_threshold"],
            ),
        )


# Budgets of seconds so that a minute holds episodes of every class; the second variant
# moves each budget (up for two, down for one) and the route's timings, so a SIGHUP
# changes what the oracle must hold watchd to.
VARIANTS = (
    Variant(
        budgets={"running": 20, "requires_action": 25, "interrupting": 15, "default": 20},
        group_wait=1.0,
        group_interval=2.0,
        repeat_interval=60.0,
    ),
    Variant(
        budgets={"running": 24, "requires_action": 21, "interrupting": 18, "default": 24},
        group_wait=1.0,
        group_interval=3.0,
        repeat_interval=45.0,
    ),
)


@dataclass(frozen=True)
class Shape:
    """A soak's size: identities, chats per identity, and how often each fault comes."""

    minutes: float
    identities: int
    chats: int  # per identity, kept up as chats are archived and deleted
    # Faults per minute of the fault span; at least one of each in any soak.
    per_minute: Mapping[str, float]
    quiet_start: float = 15.0  # seconds without faults after the start
    quiet_end: float = 45.0  # and before the end, so their recoveries finish in the run
    max_clock_step: float = 3.0
    max_clock_offset: float = 6.0
    receiver_retry_after: float = 2.0

    @classmethod
    def of(cls, minutes: float) -> Shape:
        small = minutes <= 3
        return cls(
            minutes=minutes,
            identities=2 if small else 4,
            chats=10 if small else 25,
            per_minute={
                "kill": 1 / 3,
                "sighup": 1 / 2.5,
                "receiver_outage": 1 / 2.5,
                "coder_errors": 1 / 2,
                "throttle": 1 / 3,
                "sim_restart": 1 / 4,
                "drop_watch": 1 / 2,
                "clock_step": 1 / 2,
            },
        )

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0
