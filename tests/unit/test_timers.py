"""The timer heap: ordering, lazy invalidation, compaction."""

from __future__ import annotations

from watchd.detection.timers import ServerTimers, TimerHeap


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


def test_a_burst_armed_while_the_offset_moved_comes_due_together() -> None:
    """Chats due at one server instant pop together, however the offset estimate moved
    while they were armed: deadlines are converted at wake-up, not at arming."""
    offsets = {"a": 0.0}
    t = ServerTimers(offsets.__getitem__)
    t.arm(("a", "1", "status"), 100.0, 1)
    offsets["a"] = 0.4  # the estimate narrowed: the server is 0.4 s ahead
    t.arm(("a", "2", "status"), 100.0, 1)
    assert t.next_deadline() == 99.6
    assert t.pop_due(99.59) == []
    assert sorted(d.key[1] for d in t.pop_due(99.6)) == ["1", "2"]


def test_each_identity_is_judged_on_its_own_servers_time() -> None:
    """Two deployments with different clocks: each identity's deadlines convert with its
    own offset; an identity that is dropped takes its clocks with it."""
    offsets = {"a": 10.0, "b": -10.0}
    t = ServerTimers(offsets.__getitem__)
    t.arm(("a", "1", "status"), 100.0, 1)
    t.arm(("b", "1", "status"), 100.0, 1)
    assert t.next_deadline() == 90.0 and t.next_deadline("b") == 110.0
    assert [d.key[0] for d in t.pop_due(90.0)] == ["a"]
    assert ("b", "1", "status") in t and len(t) == 1
    t.drop("b")
    assert t.next_deadline() is None and len(t) == 0


def test_the_due_limit_holds_across_identities() -> None:
    """pop_due's limit bounds one wake-up's work over all identities together."""
    t = ServerTimers(lambda _: 0.0)
    for ident in ("a", "b", "c"):
        for i in range(5):
            t.arm((ident, str(i), "status"), 1.0, 1)
    assert len(t.pop_due(2.0, limit=7)) == 7 and len(t) == 8
