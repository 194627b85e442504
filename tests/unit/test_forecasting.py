"""QuotaExhaustionForecast through the real ledger and state DB, on a stepped server clock.

The clock is the identity's ServerClock over a wall clock the test moves by one quota
interval per reading, so five-minute polls take no time at all.
"""

from __future__ import annotations

from pathlib import Path

from watchd.alerting.model import Alert
from watchd.coder.observing import Quota
from watchd.config.watching import ForecastConfig
from watchd.detection.ledger import Ledger
from watchd.detection.timers import ServerTimers
from watchd.kits.clock import ServerClock
from watchd.store.health import IdentityHealth
from watchd.store.sqlite import StateFile
from watchd.watching.forecasting import QuotaForecast
from watchd.watching.readings import ReadingBook

EVERY = 300.0
T0 = 1_800_000_000.0


class SteppedWall:
    def __init__(self) -> None:
        self.t = T0

    def now(self) -> float:
        return self.t


class ListSink:
    def __init__(self) -> None:
        self.got: list[Alert] = []

    def put(self, alert: Alert) -> None:
        self.got.append(alert)


class World:
    """One identity's health, ledger and forecast over a state DB at ``path``."""

    def __init__(self, path: Path, wall: SteppedWall) -> None:
        self.wall = wall
        self.db = StateFile.open(path)
        self.sink = ListSink()
        self.ledger = Ledger(
            sink=self.sink,
            db=self.db,
            timers=ServerTimers(lambda _: 0.0),
            wall=wall,
            counters={"fired": 0, "resolved": 0},
        )
        self.health = IdentityHealth(
            name="team-a",
            deployment="https://coder.example",
            server_clock=ServerClock(wall),
            unhealthy_after=60.0,
        )
        self.forecast = QuotaForecast(
            health=self.health,
            alerts=self.ledger,
            config=ForecastConfig(),
            labels={"team": "a"},
            book=self.db.part(ReadingBook),
        )

    async def read(self, consumed: int, budget: int = 100) -> None:
        await self.forecast.observe(Quota(credits_consumed=consumed, budget=budget))
        self.wall.t += EVERY

    def close(self) -> None:
        self.db.close()

    def firing(self) -> list[Alert]:
        return [a for a in self.ledger.firing.values() if a.name == "QuotaExhaustionForecast"]


async def test_fires_through_the_ledger_with_the_contract_annotations(tmp_path: Path) -> None:
    """A rise fires one persisted alert with the spec's labels and annotations."""
    w = World(tmp_path / "s.sqlite3", SteppedWall())
    for c in (40, 45, 50):
        await w.read(c)
    (alert,) = w.firing()
    assert {k: alert.labels[k] for k in ("alertname", "identity", "deployment", "severity")} == {
        "alertname": "QuotaExhaustionForecast",
        "identity": "team-a",
        "deployment": "https://coder.example",
        "severity": "warning",
    }
    a = alert.annotations
    assert a["eta"].endswith("Z") and a["headroom"] == "50" and a["rate_per_hour"] == "60.0"
    # 50 credits at 60/h from the last reading: 50 minutes; to last the hour, 83 % of the pace.
    assert a["eta_seconds"] == "3000" and "83%" in a["hint"]
    assert w.health.forecast is not None and w.health.forecast.firing


async def test_a_restart_keeps_the_series(tmp_path: Path) -> None:
    """A restart keeps the series (one more reading completes it) and the firing alert."""
    wall = SteppedWall()
    w = World(tmp_path / "s.sqlite3", wall)
    for c in (40, 42):
        await w.read(c)
    w.close()
    again = World(tmp_path / "s.sqlite3", wall)
    await again.read(44)
    assert again.health.forecast is not None and again.health.forecast.readings == 3
    for c in (50, 60):
        await again.read(c)
    assert again.firing()
    again.close()
    third = World(tmp_path / "s.sqlite3", wall)
    assert third.firing(), "the ledger restored the firing alert"
    await third.read(70, budget=1000)
    assert not third.firing()
    assert "budget changed" in third.sink.got[-1].annotations["resolved_reason"]


async def test_no_budget_stops_the_forecast(tmp_path: Path) -> None:
    """A quota without a budget (-1) clears the outlook and resolves a firing forecast."""
    w = World(tmp_path / "s.sqlite3", SteppedWall())
    for c in (40, 45, 50, 55):
        await w.read(c)
    assert w.firing()
    w.forecast.stop("no quota")
    assert not w.firing() and w.health.forecast is None
