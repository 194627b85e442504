"""The timer heap: ordering, lazy invalidation, compaction."""

from __future__ import annotations

from watchd.detection.timers import TimerHeap


def test_due_in_deadline_order() -> None:
    """Due timers come out in deadline order; future ones stay."""
    h = TimerHeap()
    h.arm(("a", "1", "status"), 30.0, 1)
    h.arm(("a", "2", "status"), 10.0, 1)
    h.arm(("a", "3", "status"), 99.0, 1)
    assert [d.key[1] for d in h.pop_due(50.0)] == ["2", "1"]
    assert h.next_deadline() == 99.0


def test_rearm_invalidates_the_old_entry() -> None:
    """Re-arming a key supersedes its earlier deadline; cancel removes it."""
    h = TimerHeap()
    h.arm(("a", "1", "status"), 10.0, 1)
    h.arm(("a", "1", "status"), 20.0, 2)
    assert h.pop_due(15.0) == []
    due = h.pop_due(25.0)
    assert [(d.deadline, d.version) for d in due] == [(20.0, 2)]
    h.arm(("a", "2", "status"), 5.0, 1)
    h.cancel(("a", "2", "status"))
    assert h.pop_due(100.0) == [] and h.next_deadline() is None


def test_heap_compacts_under_churn() -> None:
    """Repeated re-arming does not grow the heap without bound."""
    h = TimerHeap()
    for i in range(10_000):
        h.arm(("a", "1", "status"), float(i), i)
    assert len(h._heap) < 200 and len(h) == 1
