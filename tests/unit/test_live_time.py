"""Time in status is computed when an alert is rendered or sent, never frozen at fire time;
a resolve says how long the condition lasted and why it ended."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_dispatch import Recorder
from watchd.alerting import routing
from watchd.alerting.dispatch import Dispatcher
from watchd.alerting.model import Alert, live, resolution
from watchd.alerting.silencing import Inhibitor, Silencer
from watchd.config.alerting import RouteConfig
from watchd.store.sqlite import StateFile

FIRED_AT = 1_000_000.0


class Wall:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def stuck(age: float = 69.0) -> Alert:
    """A ChatStuck as the detector builds it: age measured at fire time on the server clock."""
    return Alert(
        fingerprint="fp1",
        labels={"alertname": "ChatStuck", "identity": "a", "status": "running", "chat_id": "c"},
        annotations={
            "summary": 'Chat "wedged" has been running for 1m9s (budget 1m)',
            "title": "wedged",
            "time_in_status": "1m9s",
            "time_in_status_seconds": f"{age:.0f}",
            "budget": "1m",
        },
        starts_at=FIRED_AT,
    )


def test_live_adds_the_time_since_it_fired() -> None:
    """Two minutes after firing at 1m9s, the alert says 3m9s (summary included)."""
    a = live(stuck(), FIRED_AT + 120)
    assert a.annotations["time_in_status"] == "3m9s"
    assert a.annotations["time_in_status_seconds"] == "189"
    assert a.annotations["summary"] == 'Chat "wedged" has been running for 3m9s (budget 1m)'


def test_live_never_goes_backwards_on_a_host_clock_step() -> None:
    """A host clock stepped back before the fire time leaves the fire-time age, not less."""
    assert live(stuck(), FIRED_AT - 500).annotations["time_in_status"] == "1m9s"


def test_live_sent_within_the_measured_second_is_the_same_alert() -> None:
    """Sent 0.4 s after it was measured, the texts would not change: the alert itself is
    sent, not a copy; 0.6 s after, the rounded second moves and a copy says so."""
    a = stuck()
    assert live(a, FIRED_AT + 0.4) is a
    later = live(a, FIRED_AT + 0.6)
    assert later is not a and later.annotations["time_in_status_seconds"] == "70"
    assert later.annotations["time_in_status"] == "1m10s"


def test_live_leaves_alerts_without_a_clock_alone() -> None:
    """An alert with no time in status (e.g. QuotaLow) is returned unchanged."""
    a = Alert(fingerprint="q", labels={"alertname": "QuotaLow"}, starts_at=FIRED_AT)
    assert live(a, FIRED_AT + 60) is a


def test_resolution_says_how_long_and_why() -> None:
    """A chat that left running after 4m9s resolves with that duration and the reason."""
    r = resolution(stuck(), at=FIRED_AT + 180, why="left running for waiting")
    assert not r.firing and r.ends_at == FIRED_AT + 180
    assert r.annotations["summary"] == (
        'Chat "wedged" was running for 4m9s (budget 1m); resolved: left running for waiting'
    )
    assert r.annotations["resolved_reason"] == "left running for waiting"
    assert r.annotations["lasted"] == "4m9s"


def test_resolution_of_archived_and_gone_chats_and_identities() -> None:
    """Archived and vanished chats, and a recovered identity, each say so."""
    assert (
        resolution(stuck(), at=FIRED_AT, why="chat archived")
        .annotations["summary"]
        .endswith("for 1m9s (budget 1m); resolved: chat archived")
    )
    ident = Alert(
        fingerprint="u",
        labels={"alertname": "IdentityUnhealthy", "identity": "team-c"},
        annotations={"summary": "x", "time_in_status_seconds": "2"},
        starts_at=FIRED_AT,
    )
    r = resolution(ident, at=FIRED_AT + 58, why="identity recovered")
    assert r.annotations["summary"] == (
        "Identity team-c could not watch for 1m; resolved: identity recovered"
    )


def test_a_resolved_alert_stops_its_clock() -> None:
    """Rendering a resolved alert later does not keep counting."""
    r = resolution(stuck(), at=FIRED_AT + 60, why="chat gone")
    assert live(r, FIRED_AT + 3600).annotations["time_in_status"] == "2m9s"


async def test_a_repeat_notification_says_how_long_by_now(tmp_path: Path) -> None:
    """The dispatcher renders time in status at send time: a repeat an hour later says so."""
    wall = Wall(FIRED_AT)
    rec = Recorder()
    db = StateFile(tmp_path / "s.sqlite3")
    d = Dispatcher(
        route=routing.build(RouteConfig.model_validate({"receiver": "r", "group_wait": "0s"})),
        notifiers={"r": rec},
        db=db,
        silencer=Silencer([]),
        inhibitor=Inhibitor([]),
        wall=wall,
    )
    a = stuck()
    d.alerts[a.fingerprint] = a
    route = d.route.match(a.labels)[0]
    d._insert(route, a, persist=False)
    group = next(iter(d.groups.values()))
    if group.task is not None:
        group.task.cancel()
    wall.t = FIRED_AT + 10
    await d.flush(group)
    wall.t = FIRED_AT + 5 * 3600 + 10  # past repeat_interval (4h)
    await d.flush(group)
    said = [n.alerts[0].annotations["time_in_status"] for n in rec.sent]
    assert said == ["1m19s", "5h1m"]
    await d.close(deadline=0.5)
    db.close()


def test_a_restored_alert_keeps_counting_from_when_it_was_measured() -> None:
    """A chat alert starts at clock start + budget (a server time) but was measured later
    (here two hours in); restored from disk without measured_at, it still counts on from
    clock start + measured age, not from startsAt (which would double the wait)."""
    since = 1_800_000_000.0
    fired = Alert(
        fingerprint="fp2",
        labels={"alertname": "ChatStuck", "identity": "a", "status": "running", "chat_id": "c"},
        annotations={
            "summary": 'Chat "late" has been running for 2h (budget 1m)',
            "time_in_status": "2h",
            "time_in_status_seconds": "7200",
            "since": "2027-01-15T08:00:00Z",
        },
        starts_at=since + 60,
        measured_at=since + 7200,
    )
    restored = Alert(
        fingerprint=fired.fingerprint,
        labels=fired.labels,
        annotations=fired.annotations,
        starts_at=fired.starts_at,
    )
    for a in (fired, restored):
        assert live(a, since + 7200 + 120).annotations["time_in_status_seconds"] == "7320"
