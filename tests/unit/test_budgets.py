"""The one "past budget" verdict that the detector and ``watchd scan`` share."""

from __future__ import annotations

from watchd.config.watching import Budgets
from watchd.detection.budgets import Overdue, past_budget
from watchd.store.records import ChatRecord


def record(status: str, *, since: float = 0.0, updated_at: float | None = None) -> ChatRecord:
    return ChatRecord("a", "c1", status, since, "transition", updated_at, since)


def test_status_clock_fires_at_the_budget_not_before() -> None:
    """Time in status reaches the status's budget exactly at ``since + budget``."""
    budgets = Budgets(running=600.0, requires_action=60.0)
    assert past_budget(budgets, record("running"), now=599.9) is None
    assert past_budget(budgets, record("running"), now=600.0) == Overdue("ChatStuck", 600.0, 600.0)
    assert past_budget(budgets, record("requires_action"), now=61.0) == Overdue(
        "ChatStranded", 61.0, 60.0
    )


def test_idle_statuses_are_never_overdue_unless_failed_chats_are_reported() -> None:
    """``waiting`` never alerts; ``error`` alerts (ChatFailed, at once) only when asked."""
    budgets = Budgets()
    assert past_budget(budgets, record("waiting"), now=1e9) is None
    assert past_budget(budgets, record("error"), now=5.0) is None
    assert past_budget(budgets, record("error"), now=5.0, chat_failed=True) == Overdue(
        "ChatFailed", 5.0, 0.0
    )


def test_stalled_clock_counts_from_the_last_progress_and_only_when_configured() -> None:
    """The stalled clock runs from ``updated_at`` for running chats, off unless set."""
    rec = record("running", since=0.0, updated_at=100.0)
    assert past_budget(Budgets(), rec, now=1e6, clock="stalled") is None
    stalled = Budgets(stalled=300.0)
    assert past_budget(stalled, rec, now=399.0, clock="stalled") is None
    assert past_budget(stalled, rec, now=400.0, clock="stalled") == Overdue(
        "ChatStalled", 300.0, 300.0
    )
    assert past_budget(stalled, record("waiting", updated_at=0.0), now=1e6, clock="stalled") is None
