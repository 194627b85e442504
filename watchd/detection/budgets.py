"""Status classes, the alert each one earns, and the one "past budget" verdict
(docs/alerting.md). Pure: the detector and ``watchd scan`` both ask it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from watchd.coder.models import ACTIVE_STATUSES, BLOCKED_STATUSES, IDLE_STATUSES, ChatStatus
from watchd.config.watching import Budgets
from watchd.store.records import ChatRecord

StatusClass = Literal["active", "blocked", "idle", "unknown"]
ChatVerdict = Literal["ChatStuck", "ChatStranded", "ChatStalled", "ChatFailed"]
Clock = Literal["status", "stalled"]
# A status the stalled clock and ChatFailed are about.
RUNNING: ChatStatus = "running"
ERROR: ChatStatus = "error"


def status_class(status: str) -> StatusClass:
    """The class of a status off the wire; one this build does not know is ``unknown``."""
    if status in ACTIVE_STATUSES:
        return "active"
    if status in BLOCKED_STATUSES:
        return "blocked"
    if status in IDLE_STATUSES:
        return "idle"
    return "unknown"


def alert_name(status: str) -> Literal["ChatStuck", "ChatStranded"] | None:
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


class Overdue(NamedTuple):
    """A chat past its budget: the alert it earns, its time on that clock, the budget."""

    alert: ChatVerdict
    age: float
    budget: float


def past_budget(
    budgets: Budgets,
    rec: ChatRecord,
    *,
    now: float,
    clock: Clock = "status",
    chat_failed: bool = False,
) -> Overdue | None:
    """Whether ``rec`` is past its budget at server time ``now``, on one of its clocks.

    ``status`` (the default) is time in status against the status's budget;
    ``stalled`` is a ``running`` chat's time since its last server-side progress
    against ``budgets.stalled`` (when that is set). With ``chat_failed`` an
    ``error`` chat is overdue at once, as ChatFailed.
    """
    if clock == "stalled":
        if rec.status != RUNNING or budgets.stalled is None or rec.updated_at is None:
            return None
        age = now - rec.updated_at
        return Overdue("ChatStalled", age, budgets.stalled) if age >= budgets.stalled else None
    limit = budget(budgets, rec.status)
    age = now - rec.since
    if limit is None:
        if chat_failed and rec.status == ERROR:
            return Overdue("ChatFailed", age, 0.0)
        return None
    name = alert_name(rec.status)
    assert name is not None
    return Overdue(name, age, limit) if age >= limit else None
