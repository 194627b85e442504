"""Each chat's timeline (fleet.md §4): its entries, its bounds, and no secret in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_detector import rig
from watchd.coder.observing import ChatId, Observation
from watchd.config.fields import ConfigError
from watchd.config.loading import parse_config
from watchd.config.watching import Budgets
from watchd.store.chats import ChatStore
from watchd.store.timelines import Timelines, describe


class _At:
    """A clock stopped at one server time."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def _store_and_timelines(**kw: object) -> tuple[ChatStore, Timelines]:
    store = ChatStore()
    return store, Timelines(identity_of=store.identity_of, **kw)  # type: ignore[arg-type]


def see(store: ChatStore, tl: Timelines, status: str, at: float, *, via: str = "watch") -> None:
    chat = Observation(id=ChatId("c1"), status=status, updated_at=at, title="t")
    change = store.observe("a", chat, now=at, via=via, kind="status_change")
    if change is not None:
        tl.changes("a", [change], clock=_At(at))


def test_transitions_carry_their_server_stamp_and_how_they_were_learned() -> None:
    """A chat created on the stream, moved on the stream, then moved in a listing: three
    entries at the server's stamps, sourced stream, stream, listing; a refresh adds none."""
    store, tl = _store_and_timelines()
    see(store, tl, "pending", 1000.0)
    see(store, tl, "running", 1010.0)
    see(store, tl, "running", 1011.0, via="listing")  # progress only
    see(store, tl, "waiting", 1500.0, via="listing")
    found = tl.get("c1")
    assert found is not None
    identity, entries, dropped = found
    assert identity == "a" and dropped == 0
    assert [(e[0], e[1], e[3]) for e in entries] == [
        (1000.0, "stream", "pending"),
        (1010.0, "stream", "running"),
        (entries[2][0], "listing", "waiting"),
    ]
    assert entries[1][2] == "pending → running"


def test_at_most_200_entries_per_chat_the_oldest_dropped_and_counted() -> None:
    """250 entries keep the newest 200, oldest first; the 50 dropped are counted on the
    chat and in the snapshot."""
    tl = Timelines()
    for i in range(250):
        tl.add("c1", "a", float(i), "transport", f"e{i}")
    found = tl.get("c1")
    assert found is not None
    _, entries, dropped = found
    assert len(entries) == 200 and dropped == 50
    assert entries[0][2] == "e50" and entries[-1][2] == "e249"
    assert tl.snapshot()["entries_dropped"] == 50


def test_chats_are_bounded_and_forgotten_after_a_day() -> None:
    """Past max_chats the oldest timeline goes (counted); prune forgets timelines whose
    last entry is over 24 h old, keeps the others."""
    tl = Timelines(max_chats=3)
    for c in ("c2", "c1", "c3"):
        tl.add(c, "a", 100.0, "stream", "x")
    tl.add("c1", "a", 200.0, "stream", "y")
    tl.add("c4", "a", 300.0, "stream", "z")
    assert tl.get("c2") is None and tl.get("c1") is not None
    assert tl.snapshot()["chats_dropped"] == 1
    assert tl.prune(86_400.0 + 150.0) == 1  # c3 (last 100) goes; c1 (200), c4 (300) stay
    assert tl.get("c3") is None and len(tl) == 2


def test_transport_events_land_on_known_chats_only_and_never_carry_secrets() -> None:
    """An event naming a chat watchd knows (chatId, or /chats/<id> in an http path) is
    one entry, summarised from typed fields: no query string, no headers, no error
    text, no close reason; an event for an unknown chat adds nothing."""
    store, tl = _store_and_timelines()
    see(store, tl, "running", 1000.0, via="listing")
    assert tl.get("c1") is None  # first seen in a listing: nothing recorded
    tl.transport({"type": "ws:redial", "chatId": "c1", "attempt": 3, "reason": "tok=SECRET"}, 1001)
    tl.transport(
        {
            "type": "http:response",
            "id": 1,
            "method": "GET",
            "path": "/api/v2/chats/c1/stream?token=SECRET",
            "status": 503,
            "durationMs": 1500,
        },
        1002,
    )
    tl.transport({"type": "segment:settle", "chatId": "c1", "error": {"message": "SECRET"}}, 1003)
    tl.transport({"type": "ws:open", "chatId": "elsewhere", "attempt": 1}, 1004)
    found = tl.get("c1")
    assert found is not None
    texts = [e[2] for e in found[1]]
    assert texts == [
        "ws:redial attempt=3",
        "http:response status=503 GET /api/v2/chats/c1/stream 1.5s",
        "segment:settle error",
    ]
    tl.transport(
        {
            "type": "segment:settle",
            "chatId": "c1",
            "error": {"name": "CoderChatError", "message": "SECRET requestTimeoutMs budget"},
        },
        1005,
    )
    found = tl.get("c1")
    assert found is not None
    assert found[1][-1][2] == "segment:settle error CoderChatError (ran into requestTimeoutMs)"
    assert tl.agent_said("c1", now=1010) == "the agent's last segment ran into its requestTimeoutMs"
    assert all("SECRET" not in t for t in texts)
    assert tl.get("elsewhere") is None
    assert describe({"type": "ws:close", "code": 1006, "reason": "x"}) == "ws:close code=1006"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("watchd.example.com", "not an http(s) URL"),
        ("https://u:p@watchd.example.com", "credentials in URLs"),
        ("https://watchd.example.com/?x=1", "query or fragment"),
        ("https://watchd.example.com/status", "ends in /status"),
    ],
)
def test_external_url_is_validated(tmp_path: Path, url: str, words: str) -> None:
    """server.external_url must be a base http(s) URL: the error says what is wrong."""
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "identities": [{"name": "a", "url": "https://c.test", "token_env": "T"}],
                "state_dir": str(tmp_path),
                "server": {"external_url": url},
            }
        )
    assert words in str(err.value)


def test_agent_evidence_says_a_redial_storm_and_a_silent_open_stream() -> None:
    """Four redials in the last 5 min and an open stream quiet for 14 min are said in
    words; old redials, a short quiet and a closed stream are not."""
    tl = Timelines()
    for i, at in enumerate((100.0, 1000.0, 1010.0, 1020.0, 1030.0)):
        tl.add("c1", "a", at, "transport", f"ws:redial attempt={i}")
    tl.add("c1", "a", 1040.0, "transport", "ws:open attempt=5")
    said = tl.agent_said("c1", now=1040.0 + 14 * 60)
    assert "redialled" not in said  # the window has moved past them by then
    assert said == "the agent's stream has been open and silent for 14 min (last event: ws:open)"
    said = tl.agent_said("c1", now=1100.0)
    assert said == "the agent redialled its stream 4 times in the last 5 min"
    tl.add("c1", "a", 1200.0, "transport", "ws:close code=1006")
    assert tl.agent_said("c1", now=5000.0) == ""
    assert tl.agent_said("nobody", now=5000.0) == ""


def test_a_chat_that_moved_a_few_times_is_one_flat_tuple_and_reads_the_same() -> None:
    """A chat with a few transitions is kept as one flat tuple, and reads back as the
    entries the endpoint shows, oldest first, with nothing dropped."""
    store, tl = _store_and_timelines()
    for i, status in enumerate(("pending", "running", "waiting", "running")):
        see(store, tl, status, 1000.0 + i)
    assert isinstance(tl._by_chat["c1"], tuple)
    found = tl.get("c1")
    assert found is not None
    identity, entries, dropped = found
    assert identity == "a" and dropped == 0
    assert entries == [
        (1000.0, "stream", "created: pending", "pending"),
        (1001.0, "stream", "pending → running", "running"),
        (1002.0, "stream", "running → waiting", "waiting"),
        (1003.0, "stream", "waiting → running", "running"),
    ]


def test_transitions_past_200_keep_the_newest_and_count_the_rest() -> None:
    """A chat moving 250 times on the server's clock keeps its newest 200 transitions,
    oldest first, past the flat form; the 50 dropped are counted on it and in total."""
    store, tl = _store_and_timelines()
    for i in range(250):
        see(store, tl, ("running", "waiting")[i % 2], 1000.0 + i)
    found = tl.get("c1")
    assert found is not None
    _, entries, dropped = found
    assert len(entries) == 200 and dropped == 50
    assert [e[0] for e in entries] == [1000.0 + i for i in range(50, 250)]
    assert tl.snapshot()["entries_dropped"] == 50


def test_a_late_stamp_lands_in_order_in_either_form() -> None:
    """An entry stamped before the last one lands after its equals and before later
    ones, whether the chat is still a flat tuple or already past it."""
    tl = Timelines()
    for at in (10.0, 30.0):
        tl.add("small", "a", at, "stream", f"at {at}")
    tl.add("small", "a", 20.0, "listing", "late")
    for i in range(20):
        tl.add("busy", "a", float(i * 10), "stream", f"at {i}")
    tl.add("busy", "a", 55.0, "listing", "late")
    for chat in ("small", "busy"):
        found = tl.get(chat)
        assert found is not None
        times = [e[0] for e in found[1]]
        assert times == sorted(times)
        assert ("late" in [e[2] for e in found[1]]) and found[2] == 0


def test_a_day_after_its_last_entry_a_timeline_goes_in_either_form() -> None:
    """prune, on the server's clock, forgets the flat and the busy timelines whose last
    entry is over 24 h old, and keeps those with a newer one."""
    tl = Timelines()
    tl.add("old-small", "a", 100.0, "stream", "x")
    tl.add("new-small", "a", 50_000.0, "stream", "x")
    for i in range(30):
        tl.add("old-busy", "a", float(i), "transport", "ws:open attempt=1")
        tl.add("new-busy", "a", 60_000.0 + i, "transport", "ws:open attempt=1")
    assert tl.prune(86_400.0 + 1_000.0) == 2
    assert tl.get("old-small") is None and tl.get("old-busy") is None
    assert tl.get("new-small") is not None and tl.get("new-busy") is not None


def test_a_transport_event_is_kept_as_typed_fields_without_query_or_error_text() -> None:
    """What a timeline keeps of a forwarded event holds neither a path's query nor an
    error's message (only the words the endpoint shows are made of it, when read)."""
    store, tl = _store_and_timelines()
    see(store, tl, "running", 1000.0)
    see(store, tl, "waiting", 1001.0)
    for i in range(10):
        tl.transport({"type": "ws:event", "chatId": "c1"}, 1002.0 + i)
    event = {
        "type": "http:error",
        "method": "GET",
        "path": "/api/v2/chats/c1?token=SECRET",
        "message": "SECRET",
        "error": {"name": "AbortError", "message": "SECRET"},
        "durationMs": 250,
    }
    tl.transport(event, 1020.0)
    assert "SECRET" not in repr(tl._by_chat)
    found = tl.get("c1")
    assert found is not None
    assert (
        found[1][-1][2]
        == describe(event)
        == "http:error GET /api/v2/chats/c1 0.2s error AbortError"
    )


@pytest.mark.looptime
async def test_on_the_virtual_clock_the_detector_forgets_a_timeline_after_a_day() -> None:
    """The detector's minute look forgets a chat's timeline a day after its last entry
    and keeps a chat that moved since (virtual clock: looptime, the rig's wall)."""
    async with rig(Budgets(pending=10**7, running=10**7, default=10**7)) as r:
        r.ready()
        r.see("old", "pending", r.clock.now())
        r.see("old", "running", r.clock.now() + 1)
        assert r.det.timelines.get("old") is not None
        r.advance(86_400 + 120)
        r.see("new", "pending", r.clock.now())
        await r.settle()
        assert r.det.timelines.get("old") is None
        assert r.det.timelines.get("new") is not None
