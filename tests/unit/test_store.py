"""Chat store transitions, staleness, listings and tombstones."""

from __future__ import annotations

from watchd.coder.models import Chat, ChatId
from watchd.store.chats import ChatStore


def chat(cid: str, status: str, updated: float | None, **kw: object) -> Chat:
    return Chat(id=ChatId(cid), status=status, updated_at=updated, **kw)  # type: ignore[arg-type]


def test_watch_transition_starts_an_exact_clock() -> None:
    """A status_change on the stream starts the clock at the event's updated_at."""
    s = ChatStore()
    s.observe("a", chat("c1", "waiting", 100.0), now=100.0, via="watch", kind="created")
    ch = s.observe("a", chat("c1", "running", 150.0), now=151.0, via="watch", kind="status_change")
    assert ch is not None and ch.kind == "transition"
    assert (ch.record.since, ch.record.clock) == (150.0, "transition")


def test_listing_first_sighting_is_a_lower_bound() -> None:
    """A chat first seen in a listing uses updated_at as a lower bound."""
    s = ChatStore()
    ch = s.observe("a", chat("c1", "running", 90.0), now=200.0, via="listing")
    assert ch is not None and (ch.record.since, ch.record.clock) == (90.0, "lower_bound")


def test_same_status_keeps_the_clock() -> None:
    """Progress (updated_at moving) in the same status does not restart the clock."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", 100.0), now=100.0, via="watch", kind="status_change")
    ch = s.observe("a", chat("c1", "running", 400.0), now=400.0, via="listing")
    assert ch is not None and ch.kind == "refresh" and ch.record.since == 100.0


def test_stale_updates_are_ignored() -> None:
    """An observation older than what we hold changes nothing."""
    s = ChatStore()
    s.observe("a", chat("c1", "waiting", 200.0), now=200.0, via="watch", kind="status_change")
    assert s.observe("a", chat("c1", "running", 150.0), now=201.0, via="listing") is None
    rec = s.get("a", "c1")
    assert rec is not None and rec.status == "waiting" and s.stale_ignored == 1


def test_listing_difference_is_synthesized_transition() -> None:
    """A status change found by a listing is marked synthesized."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", 100.0), now=100.0, via="watch", kind="status_change")
    changes = s.apply_listing("a", [chat("c1", "waiting", 300.0)], now=310.0, started=305.0)
    assert [(c.kind, c.record.clock) for c in changes] == [("transition", "synthesized")]
    assert s.synthesized == 1


def test_listing_tombstones_vanished_but_spares_newer_observations() -> None:
    """A chat absent from a complete listing is tombstoned unless seen after it started."""
    s = ChatStore()
    s.observe("a", chat("old", "running", 100.0), now=100.0, via="watch", kind="created")
    s.observe("a", chat("new", "running", 300.0), now=301.0, via="watch", kind="created")
    changes = s.apply_listing("a", [], now=302.0, started=300.5)
    assert [(c.kind, c.record.chat_id, c.reason) for c in changes] == [
        ("tombstone", "old", "vanished")
    ]
    assert s.get("a", "new") is not None


def test_archived_and_deleted_tombstone() -> None:
    """Archived chats and deleted events remove the record."""
    s = ChatStore()
    s.observe("a", chat("c1", "running", 100.0), now=100.0, via="watch", kind="created")
    s.observe("a", chat("c2", "running", 100.0), now=100.0, via="watch", kind="created")
    a = s.observe("a", chat("c1", "running", 120.0, archived=True), now=120.0, via="listing")
    d = s.observe("a", chat("c2", "running", 120.0), now=120.0, via="watch", kind="deleted")
    assert a is not None and a.reason == "archived"
    assert d is not None and d.reason == "deleted"
    assert len(s) == 0


def test_minimal_payload_keeps_known_details() -> None:
    """An older era's minimal watch payload does not erase the title and labels we had."""
    s = ChatStore()
    s.observe(
        "a",
        chat("c1", "running", 100.0, title="Fix it", labels=(("t", "1"),)),
        now=100.0,
        via="listing",
    )
    s.observe("a", chat("c1", "waiting", 110.0), now=110.0, via="watch", kind="status_change")
    rec = s.get("a", "c1")
    assert rec is not None and rec.title == "Fix it" and rec.labels == (("t", "1"),)


def test_capacity_bound_counts_overflow() -> None:
    """Past its capacity the store refuses new chats and counts them."""
    s = ChatStore(capacity=2)
    for i in range(3):
        s.observe("a", chat(f"c{i}", "running", 1.0), now=1.0, via="listing")
    assert len(s) == 2 and s.overflow == 1
