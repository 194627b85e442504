"""Status classes and the alert each one earns (docs/alerting.md)."""

from __future__ import annotations

from watchd.coder.models import ACTIVE_STATUSES, BLOCKED_STATUSES, IDLE_STATUSES
from watchd.config.watching import Budgets


def status_class(status: str) -> str:
    if status in ACTIVE_STATUSES:
        return "active"
    if status in BLOCKED_STATUSES:
        return "blocked"
    if status in IDLE_STATUSES:
        return "idle"
    return "unknown"


def alert_name(status: str) -> str | None:
    """ChatStuck for active (and unknown) statuses, ChatStranded for client pauses."""
    cls = status_class(status)
    if cls in ("active", "unknown"):
        return "ChatStuck"
    if cls == "blocked":
        return "ChatStranded"
    return None


def budget(budgets: Budgets, status: str) -> float | None:
    """Seconds allowed in ``status``; None for idle statuses (never stuck)."""
    if alert_name(status) is None:
        return None
    return budgets.for_status(status)
