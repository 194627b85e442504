"""Opt-in remediation: the sweep's schedule, pace and policies (docs/remediation.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from watchd.config.fields import (
    AS_DURATION,
    TICK,
    Matchers,
    Strict,
    check_matchers,
    floor,
)

# Never paused: its owner is editing a queued message (and coderd refuses to archive
# its family).
SWEEPABLE = frozenset({"running", "pending", "interrupting", "waiting", "error", "completed"})


class SweepPolicy(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    # Alert-style labels: identity, owner, status, chat_label_<key>, and identity labels.
    matchers: Matchers
    status: list[str]
    # Time in status (server clock) before the policy applies, e.g. 2h, or 7d for orphans.
    older_than: Annotated[
        float,
        AS_DURATION,
        floor(1.0, "a policy acts on time in status"),
    ]
    # interrupt: stop the run; archive: archive idle chats; interrupt_then_archive: both,
    # archiving only once the chat settled (waiting/error).
    action: Literal["interrupt", "archive", "interrupt_then_archive"]

    _v = field_validator("matchers")(check_matchers)

    @field_validator("status")
    @classmethod
    def _status(cls, v: list[str]) -> list[str]:
        if "requires_action" in v:
            raise ValueError(
                "requires_action chats are never swept: the pause may be the only "
                "record of a committed client-tool effect"
            )
        if "paused" in v:
            raise ValueError("paused chats are never swept: the owner is editing a queued message")
        unknown = sorted(set(v) - SWEEPABLE)
        if unknown or not v:
            raise ValueError(f"statuses must be among {sorted(SWEEPABLE)} (got {unknown or v})")
        return v


class SweepConfig(Strict):
    """Opt-in remediation. Off by default; dry-run by default when on."""

    enabled: bool = False
    dry_run: bool = True
    interval: Annotated[float, AS_DURATION, floor(1.0, TICK)] = 60.0
    # Mutations per identity per minute: sweeping must never look like an attack.
    actions_per_minute: Annotated[int, Field(ge=1, le=600)] = 30
    concurrency: Annotated[int, Field(ge=1, le=32)] = 2
    # How long an interrupted chat may take to settle before the sweep gives up on it.
    settle_timeout: Annotated[float, AS_DURATION, floor(1.0, "a chat cannot settle faster")] = 120.0
    # Announcements (ChatSwept) stay firing this long, then resolve.
    announce_for: Annotated[float, AS_DURATION, floor(1.0, "shorter is never seen")] = 600.0
    # A chat whose execution state is invalid (409 "Chat is in an invalid state." on
    # every mutation) is only reported unless this is on; then the sweep calls
    # POST …/reconcile-invalid once (moving it to `error`) and handles it normally.
    reconcile_invalid: bool = False
    policies: list[SweepPolicy] = Field(default_factory=list)
