"""FleetIncident (fleet.md §2): one alert per (deployment, cause) over the ledger's chat alerts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from watchd.alerting.model import Alert, fingerprint
from watchd.config.watching import IncidentsConfig
from watchd.daemon.admission import fleet_incidents
from watchd.detection.incidents import Incidents
from watchd.detection.ledger import Ledger
from watchd.detection.timers import ServerTimers
from watchd.store.sqlite import StateFile

DEPLOYMENT = "https://coder.test"
INCIDENT_FP = fingerprint(DEPLOYMENT, "capacity", "FleetIncident")


class Wall:
    """The host clock, set by the test (a virtual clock: nothing here sleeps)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


class ListSink:
    def __init__(self) -> None:
        self.got: list[Alert] = []

    def put(self, alert: Alert) -> None:
        self.got.append(alert)

    def incidents(self) -> list[Alert]:
        return [a for a in self.got if a.name == "FleetIncident"]


def chat_alert(
    i: int, *, identity: str = "a", cause: str = "capacity", name: str = "ChatStuck"
) -> Alert:
    labels = {
        "alertname": name,
        "identity": identity,
        "deployment": DEPLOYMENT,
        "chat_id": f"c{i:02d}",
        "cause": cause,
        "severity": "info" if name == "ChatFailed" else "warning",
    }
    return Alert(f"fp{i}", labels, {"summary": f"s{i}"}, starts_at=1000.0 + i)


def ledger(
    sink: ListSink, wall: Wall, db: StateFile | None = None, *, min_chats: int = 5
) -> Ledger:
    return Ledger(
        sink=sink,
        db=db,
        timers=ServerTimers(lambda _: 0.0),
        wall=wall,
        counters={"fired": 0, "resolved": 0},
        incidents=Incidents(min_chats=min_chats),
    )


def fire(led: Ledger, *alerts: Alert) -> None:
    led.fire_all(((a, a.labels["identity"], a.labels["chat_id"]) for a in alerts), quiet=True)


def test_the_incident_fires_at_min_chats_with_the_specs_labels_and_annotations() -> None:
    """Four members fire nothing; the fifth fires one FleetIncident with the spec's labels
    and annotations, across identities, under the (deployment, cause) fingerprint."""
    sink, wall = ListSink(), Wall(2000.0)
    led = ledger(sink, wall)
    fire(led, *(chat_alert(i, identity="a" if i < 3 else "b") for i in range(4)))
    fire(led, chat_alert(9, cause="quota"))
    assert sink.incidents() == []
    fire(led, chat_alert(4, identity="b", name="ChatFailed"))
    [inc] = sink.incidents()
    assert inc.fingerprint == INCIDENT_FP and INCIDENT_FP in led.firing
    assert inc.labels == {
        "alertname": "FleetIncident",
        "deployment": DEPLOYMENT,
        "cause": "capacity",
        "severity": "warning",  # the highest of warning and info
    }
    ann = inc.annotations
    assert ann["summary"] == "5 chats stuck: deployment concurrency cap reached"
    assert (ann["count"], ann["identities"], ann["chats"]) == ("5", "a,b", "c00,c01,c02,c03,c04")
    assert ann["since"] == "1970-01-01T00:16:44Z" and inc.starts_at == 1004.0
    assert "raise the cap" in ann["hint"]


def test_members_joining_and_leaving_update_it_in_place_and_it_resolves_once() -> None:
    """A join or leave re-raises the same incident (same fingerprint and since, new count,
    not counted as fired); under the threshold it still fires; the last leave resolves it
    exactly once."""
    sink, wall = ListSink(), Wall(2000.0)
    led = ledger(sink, wall)
    fire(led, *(chat_alert(i) for i in range(5)))
    fired = led.counters["fired"]
    fire(led, chat_alert(5, identity="b"))
    assert led.counters["fired"] == fired + 1  # the member only: the incident is re-raised
    latest = sink.incidents()[-1]
    assert (latest.annotations["count"], latest.annotations["identities"]) == ("6", "a,b")
    assert latest.starts_at == 1004.0 and latest.firing
    for i in range(5):
        led.resolve(f"fp{i}", at=wall.now(), why="moved on")
    latest = sink.incidents()[-1]
    assert latest.firing and latest.annotations["count"] == "1"
    assert latest.annotations["identities"] == "b" and latest.annotations["chats"] == "c05"
    wall.t = 2100.0
    led.resolve("fp5", at=wall.now(), why="moved on")
    resolved = [a for a in sink.incidents() if not a.firing]
    assert len(resolved) == 1 and resolved[0].ends_at == 2100.0
    assert INCIDENT_FP not in led.firing and led.counters["resolved"] == 7


def test_chats_annotation_holds_at_most_twenty_ids() -> None:
    """``chats`` names the first 20 members; ``count`` says how many there are."""
    sink = ListSink()
    led = ledger(sink, Wall(2000.0))
    fire(led, *(chat_alert(i) for i in range(30)))
    ann = sink.incidents()[-1].annotations
    assert ann["count"] == "30" and len(ann["chats"].split(",")) == 20


def test_a_restart_keeps_the_incident_under_the_same_fingerprint_without_resending(
    tmp_path: Path,
) -> None:
    """After a restart the incident fires on from the state file (same fingerprint and
    since, nothing re-sent), and resolves when its members do."""
    db = StateFile(tmp_path / "s.sqlite3")
    first = ListSink()
    fire(ledger(first, Wall(2000.0), db), *(chat_alert(i) for i in range(5)))
    db.flush()
    db.close()
    db = StateFile(tmp_path / "s.sqlite3")
    sink, wall = ListSink(), Wall(3000.0)
    led = ledger(sink, wall, db)
    assert sink.got == []
    assert led.firing[INCIDENT_FP].starts_at == first.incidents()[0].starts_at
    for i in range(5):
        led.resolve(f"fp{i}", at=wall.now(), why="moved on")
    assert [a.ends_at for a in sink.incidents() if not a.firing] == [3000.0]
    assert {a.fingerprint for a in sink.incidents()} == {INCIDENT_FP}
    db.close()


def test_a_restart_resolves_an_incident_whose_members_are_gone(tmp_path: Path) -> None:
    """A stored incident with no member left firing resolves when the ledger starts."""
    db = StateFile(tmp_path / "s.sqlite3")
    led = ledger(ListSink(), Wall(2000.0), db)
    fire(led, *(chat_alert(i) for i in range(5)))
    for i in range(5):
        led.stored.delete(f"fp{i}")  # type: ignore[union-attr]
    db.flush()
    db.close()
    db = StateFile(tmp_path / "s.sqlite3")
    sink = ListSink()
    led = ledger(sink, Wall(3000.0), db)
    assert [(a.fingerprint, a.ends_at) for a in sink.got] == [(INCIDENT_FP, 3000.0)]
    db.close()


def test_two_replicas_fire_the_same_incident_whatever_the_order() -> None:
    """Two ledgers (two replicas) seeing the same members in different orders fire the
    same fingerprint, labels, since and count."""
    one, two = ListSink(), ListSink()
    fire(ledger(one, Wall(2000.0)), *(chat_alert(i) for i in range(6)))
    fire(ledger(two, Wall(2500.0)), *(chat_alert(i) for i in reversed(range(6))))
    a, b = one.incidents()[-1], two.incidents()[-1]
    assert (a.fingerprint, a.labels, a.starts_at) == (b.fingerprint, b.labels, b.starts_at)
    assert a.annotations["count"] == b.annotations["count"] == "6"


def test_the_admission_endpoint_finds_the_incident_by_its_fingerprint() -> None:
    """The admission hook's (deployment, cause) lookup finds a firing capacity incident."""
    led = ledger(ListSink(), Wall(2000.0))
    assert fleet_incidents(led.firing, DEPLOYMENT) == []
    fire(led, *(chat_alert(i) for i in range(5)))
    assert fleet_incidents(led.firing, DEPLOYMENT) == ["capacity"]


def test_turned_off_nothing_fires_and_a_reload_off_resolves_it() -> None:
    """enabled: false fires no incident; turning it off by a reload resolves a firing one,
    turning it on again fires it from what fires."""
    sink = ListSink()
    off = Ledger(
        sink=sink,
        db=None,
        timers=ServerTimers(lambda _: 0.0),
        wall=Wall(2000.0),
        counters={"fired": 0, "resolved": 0},
        incidents=Incidents(enabled=False),
    )
    fire(off, *(chat_alert(i) for i in range(6)))
    assert sink.incidents() == []
    off.incidents.retune(enabled=True, min_chats=5, firing=off.firing)
    off.settle_incidents()
    assert [a.firing for a in sink.incidents()] == [True]
    off.incidents.retune(enabled=False, min_chats=5, firing=off.firing)
    off.settle_incidents()
    assert [a.firing for a in sink.incidents()] == [True, False]


def test_a_reload_that_lowers_min_chats_fires_the_incident_now() -> None:
    """Three members fire nothing at min_chats 5; a reload to 3 fires the incident."""
    sink = ListSink()
    led = ledger(sink, Wall(2000.0))
    fire(led, *(chat_alert(i) for i in range(3)))
    led.incidents.retune(enabled=True, min_chats=3, firing=led.firing)
    led.settle_incidents()
    assert [a.annotations["count"] for a in sink.incidents()] == ["3"]


def test_min_chats_must_be_at_least_two() -> None:
    """incidents.min_chats below 2 is refused; extra keys are refused."""
    assert IncidentsConfig().min_chats == 5
    with pytest.raises(ValidationError):
        IncidentsConfig(min_chats=1)
    with pytest.raises(ValidationError):
        IncidentsConfig.model_validate({"enabled": True, "threshold": 3})


def test_a_member_whose_cause_moves_leaves_its_old_incident_as_it_joins_the_new() -> None:
    """A member re-said with another cause counts once: it leaves the old incident (which
    resolves when it was the last) and joins the new, under the same member fingerprint."""
    sink, wall = ListSink(), Wall(2000.0)
    led = ledger(sink, wall)
    fire(led, *(chat_alert(i, cause="unknown") for i in range(5)))
    unknown_fp = fingerprint(DEPLOYMENT, "unknown", "FleetIncident")
    assert unknown_fp in led.firing
    for i in range(5):
        moved = chat_alert(i, cause="capacity")
        led._resay(moved, "a", moved.labels["chat_id"])
    led.settle_incidents()
    assert unknown_fp not in led.firing
    incident = led.firing[INCIDENT_FP]
    assert incident.annotations["count"] == "5"
    assert [len(i.members) for i in led.incidents.firing()] == [5]
