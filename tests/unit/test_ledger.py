"""The ledger's firing of a burst: as one fire after another, lines or none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from structlog.testing import capture_logs

from watchd.alerting.model import Alert
from watchd.detection.ledger import Ledger, StoredAlerts
from watchd.detection.timers import ServerTimers
from watchd.kits.clock import SystemClock
from watchd.store.sqlite import StateFile


class ListSink:
    def __init__(self) -> None:
        self.got: list[Alert] = []

    def put(self, alert: Alert) -> None:
        self.got.append(alert)


def _alert(i: int) -> Alert:
    labels = {"alertname": "ChatStuck", "identity": "a", "chat_id": f"c{i}"}
    return Alert(f"fp{i}", labels, {"summary": f"s{i}", "clock": "transition"}, 1.0)


def _ledger(sink: ListSink, db: StateFile | None = None) -> Ledger:
    counters = {"fired": 0, "resolved": 0}
    return Ledger(
        sink=sink, db=db, timers=ServerTimers(lambda _: 0.0), wall=SystemClock(), counters=counters
    )


def test_fire_all_fires_each_before_the_next_is_made(tmp_path: Path) -> None:
    """fire_all fires, counts, persists and hands on each alert before asking for the next."""
    sink = ListSink()
    db = StateFile(tmp_path / "s.sqlite3")
    ledger = _ledger(sink, db)
    seen: list[bool] = []

    def alerts() -> Iterator[tuple[Alert, str, str | None]]:
        for i in range(3):
            seen.append(f"fp{i - 1}" in ledger.firing if i else True)
            yield _alert(i), "a", f"c{i}"

    ledger.fire_all(alerts(), quiet=True)
    assert seen == [True, True, True]
    assert [a.fingerprint for a in sink.got] == ["fp0", "fp1", "fp2"]
    assert ledger.counters["fired"] == 3
    assert set(ledger.firing_clocks) == {("a", f"c{i}", "status") for i in range(3)}
    db.flush()
    assert sorted(r.fingerprint for r in db.part(StoredAlerts).load()) == ["fp0", "fp1", "fp2"]
    db.close()


def test_fire_all_says_each_alert_unless_quiet() -> None:
    """Not quiet: one alert.firing warning per alert, as fire() writes it."""
    ledger = _ledger(ListSink())
    with capture_logs() as lines:
        ledger.fire_all(((_alert(i), "a", f"c{i}") for i in range(2)), quiet=False)
        ledger.fire(_alert(9), identity="a", chat_id="c9")
    firing = [e for e in lines if e["event"] == "alert.firing"]
    assert [(e["log_level"], e["chat_id"], e["summary"]) for e in firing] == [
        ("warning", "c0", "s0"),
        ("warning", "c1", "s1"),
        ("warning", "c9", "s9"),
    ]
