"""QuotaExhaustionForecast's arithmetic on synthetic readings (fleet.md §3).

Time here is the readings' own: each reading says when it was taken, five minutes apart
like the default quota poll, so no test waits for anything.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from watchd.watching.forecast import Forecaster, Reading, Verdict, fit

EVERY = 300.0  # the default quota interval
WINDOW = 1800.0
HORIZON = 3600.0
BUDGET = 100


def forecaster() -> Forecaster:
    return Forecaster(window=WINDOW, horizon=HORIZON)


def replay(
    f: Forecaster, readings: Iterable[Reading], *, firing: bool = False
) -> list[tuple[Reading, Verdict, bool]]:
    """Feed readings as the ledger would: each verdict's fire or resolve is remembered."""
    out = []
    for r in readings:
        v = f.add(r, firing=firing)
        if v.change == "fire":
            firing = True
        elif v.change == "resolve":
            firing = False
        out.append((r, v, firing))
    return out


def series(consumed: Callable[[int], float], n: int, budget: int = BUDGET) -> list[Reading]:
    return [Reading(at=i * EVERY, consumed=round(consumed(i)), budget=budget) for i in range(n)]


def fired(steps: list[tuple[Reading, Verdict, bool]]) -> list[Reading]:
    return [r for r, v, _ in steps if v.change == "fire"]


def test_steady_rise_fires_at_the_horizon_crossing_with_eta_within_ten_percent() -> None:
    """A steady rise fires within one reading of the true horizon crossing, eta within 10%."""
    rate = 30.0 / 3600.0  # credits per second: 10 → 100 takes 3 h
    exhausted = (BUDGET - 10) / rate
    crossing = exhausted - HORIZON
    steps = replay(forecaster(), series(lambda i: 10 + rate * i * EVERY, 40))
    first = fired(steps)[0]
    assert abs(first.at - crossing) <= EVERY
    v = next(v for r, v, _ in steps if r is first)
    true_eta = exhausted - first.at
    assert v.outlook.eta_seconds is not None
    assert abs(v.outlook.eta_seconds - true_eta) <= 0.1 * true_eta
    assert v.outlook.rate_per_hour is not None and abs(v.outlook.rate_per_hour - 30.0) < 3.0
    assert v.outlook.headroom > 0


def test_flat_and_falling_never_fire() -> None:
    """Flat consumption, and one that falls (workspaces deleted), never fire."""
    assert fired(replay(forecaster(), series(lambda i: 95, 40))) == []
    assert fired(replay(forecaster(), series(lambda i: 99 - 2 * i, 40))) == []


def test_noisy_flat_never_fires() -> None:
    """±5 % jitter about a flat consumption never projects an exhaustion, for any of 50 seeds."""
    for seed in range(50):
        jitter = random.Random(seed).uniform
        steps = replay(forecaster(), series(lambda i, j=jitter: 50 * (1 + j(-0.05, 0.05)), 60))
        assert fired(steps) == [], seed


def test_a_single_spike_never_fires_and_is_dropped() -> None:
    """A single spike on a flat line never fires: it is dropped as the outlier."""
    readings = series(lambda i: 97 if i == 20 else 60, 40)
    steps = replay(forecaster(), readings)
    assert fired(steps) == []
    at_spike = next(v for r, v, _ in steps if r.at == 20 * EVERY)
    assert at_spike.outlook.outlier and at_spike.outlook.eta is None


def test_fewer_readings_than_the_rule_never_fire() -> None:
    """Two readings, or three within a third of the window, never fire, however steep."""
    two = [Reading(0, 10, BUDGET), Reading(EVERY, 90, BUDGET)]
    assert fired(replay(forecaster(), two)) == []
    close = [Reading(t, c, BUDGET) for t, c in ((0, 10), (100, 50), (200, 90))]
    steps = replay(forecaster(), close)
    assert fired(steps) == []
    assert "needs 3" in steps[-1][1].outlook.note


def test_a_budget_raise_resolves_and_restarts_the_series() -> None:
    """A firing forecast resolves when the budget is raised: the series starts again."""
    rising = series(lambda i: 40 + 5 * i, 8)
    steps = replay(forecaster(), rising)
    assert steps[-1][2], "fires on the rise"
    f = forecaster()
    steps = replay(f, [*rising, Reading(8 * EVERY, 80, 1000)])
    _, v, firing = steps[-1]
    assert v.change == "resolve" and "budget changed" in v.why and not firing
    assert len(f.readings) == 1


def test_headroom_zero_hands_over_to_quota_low() -> None:
    """Once the headroom reaches 0 the forecast resolves (QuotaLow speaks) and stays quiet."""
    steps = replay(forecaster(), series(lambda i: min(100, 40 + 5 * i), 20))
    assert fired(steps)
    last_reading, _, firing = steps[-1]
    assert not firing and last_reading.consumed == BUDGET
    resolved = [v for _, v, _ in steps if v.change == "resolve"]
    assert len(resolved) == 1 and "QuotaLow" in resolved[0].why


def test_hysteresis_keeps_it_firing_until_eta_passes_one_and_a_quarter_horizons() -> None:
    """Firing holds while the eta is between 1 and 1.25 horizons, resolves beyond."""
    f = forecaster()
    # Rising 60 credits/h to 40 of 105: the budget is 65 min away.
    for r in [Reading(i * EVERY, 10 + 5 * i, 105) for i in range(6)]:
        f.add(r, firing=True)
    v = f.add(Reading(6 * EVERY, 40, 105), firing=True)
    assert v.outlook.eta_seconds is not None
    assert HORIZON < v.outlook.eta_seconds <= 1.25 * HORIZON and v.change is None
    flat = [Reading((7 + i) * EVERY, 40, 105) for i in range(7)]
    assert [v.change for v in (f.add(r, firing=True) for r in flat)][-1] == "resolve"


def test_restored_readings_need_no_second_window() -> None:
    """Restored readings project at once; a reading older than them is ignored."""
    rising = series(lambda i: 40 + 5 * i, 7)
    f = Forecaster(window=WINDOW, horizon=HORIZON, readings=rising)
    v = f.add(Reading(7 * EVERY, 75, BUDGET), firing=False)
    assert v.change == "fire"
    assert f.add(Reading(0, 40, BUDGET), firing=True).change is None


def test_fit_keeps_a_clean_line_whole() -> None:
    """Integer readings of a clean line drop nothing (the outlier floor)."""
    line = fit(series(lambda i: 3.3 * i, 7))
    assert line is not None and line.dropped is None
