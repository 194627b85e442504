"""QuotaExhaustionForecast's arithmetic: a line through one identity's quota readings.

Pure and synchronous: readings in (server-clock time, credits consumed, budget), a
verdict out (fire, resolve or nothing) with the outlook behind it. No I/O and no clock of
its own: the caller says when each reading was taken and whether the alert fires now
(the ledger knows). :mod:`watchd.watching.forecasting` feeds it from the quota poll.

The fit is ordinary least squares over the readings of the last window, made robust to
one outlier: the reading with the largest residual is tested against the line through
the others, and dropped when it stands well clear of their scatter (a build that held
credits for one poll, a misread). A rise must also stand clear of the scatter (a slope of
at least ``MIN_T`` standard errors), so jitter around a flat consumption never projects
an exhaustion. A budget change restarts the series: a line fitted under the old budget
says nothing about the new one.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from watchd.store.health import QuotaOutlook

MIN_READINGS = 3  # and spanning a third of the window (fleet.md §3)
# Integer readings of a clean line are off it by under one credit: a deviation below
# this is never an outlier, however tidy the other readings are.
OUTLIER_FLOOR = 2.0
# A reading this many times further off the others' line than their typical scatter is
# an outlier (and at most one per window is dropped).
OUTLIER_RATIO = 4.0
# How many standard errors a rising slope must clear (a t statistic): noise about a flat
# line reaches 2 now and then, a real rise over three readings clears it easily.
MIN_T = 2.0
# Hysteresis: fires at eta ≤ horizon, resolves only once eta > 1.25 × horizon (or none).
RESOLVE_FACTOR = 1.25


@dataclass(frozen=True, slots=True)
class Reading:
    at: float  # server clock, epoch seconds
    consumed: int
    budget: int


@dataclass(frozen=True, slots=True)
class Line:
    """A fitted line, its slope's standard error, and the reading dropped as an outlier."""

    slope: float  # credits per second
    mean_t: float
    mean_y: float  # the line's value at mean_t
    stderr: float
    dropped: Reading | None = None

    def value(self, t: float) -> float:
        return self.mean_y + self.slope * (t - self.mean_t)

    def reaches(self, level: float) -> float | None:
        """When the line reaches ``level`` (None unless it rises)."""
        if self.slope <= 0:
            return None
        return self.mean_t + (level - self.mean_y) / self.slope


def _lsq(points: Sequence[Reading]) -> Line | None:
    n = len(points)
    mean_t = math.fsum(p.at for p in points) / n
    mean_y = math.fsum(p.consumed for p in points) / n
    sxx = math.fsum((p.at - mean_t) ** 2 for p in points)
    if n < 2 or sxx <= 0:
        return None
    slope = math.fsum((p.at - mean_t) * (p.consumed - mean_y) for p in points) / sxx
    sse = math.fsum((p.consumed - mean_y - slope * (p.at - mean_t)) ** 2 for p in points)
    stderr = math.sqrt(sse / (n - 2) / sxx) if n > 2 else math.inf
    return Line(slope=slope, mean_t=mean_t, mean_y=mean_y, stderr=stderr)


def fit(points: Sequence[Reading]) -> Line | None:
    """Least squares through ``points``, without the one reading that is an outlier."""
    line = _lsq(points)
    if line is None or len(points) <= MIN_READINGS:
        # Three readings cannot say which of them is the odd one.
        return line
    worst = max(
        range(len(points)), key=lambda i: abs(points[i].consumed - line.value(points[i].at))
    )
    rest = [p for i, p in enumerate(points) if i != worst]
    other = _lsq(rest)
    if other is None:
        return line
    scatter = statistics.median(abs(p.consumed - other.value(p.at)) for p in rest)
    off = abs(points[worst].consumed - other.value(points[worst].at))
    if off > max(OUTLIER_FLOOR, OUTLIER_RATIO * scatter):
        return Line(
            slope=other.slope,
            mean_t=other.mean_t,
            mean_y=other.mean_y,
            stderr=other.stderr,
            dropped=points[worst],
        )
    return line


@dataclass(frozen=True, slots=True)
class Verdict:
    change: Literal["fire", "resolve"] | None
    why: str
    outlook: QuotaOutlook


class Forecaster:
    """One identity's readings over the window, and what they project."""

    def __init__(self, *, window: float, horizon: float, readings: Iterable[Reading] = ()) -> None:
        self.window = window
        self.horizon = horizon
        self.readings: deque[Reading] = deque()
        for r in readings:
            self._keep(r)

    def _keep(self, r: Reading) -> bool:
        """Add ``r`` to the series and say whether a budget change restarted it. A reading
        not newer than the last (a duplicate, one from before a restart) is left out."""
        series = self.readings
        if series and r.at <= series[-1].at:
            return False
        restarted = bool(series) and series[-1].budget != r.budget
        if restarted:
            series.clear()
        series.append(r)
        while series[0].at < r.at - self.window:
            series.popleft()
        return restarted

    def add(self, r: Reading, *, firing: bool) -> Verdict:
        """Take one reading; say whether QuotaExhaustionForecast fires or resolves now."""
        last = self.readings[-1] if self.readings else None
        if last is not None and r.at <= last.at:
            return Verdict(None, "not newer than the last reading", self.outlook(r, firing=firing))
        restarted = self._keep(r)
        headroom = r.budget - r.consumed
        if headroom <= 0:
            why = "the headroom reached 0: QuotaLow says so"
            return Verdict("resolve" if firing else None, why, self.outlook(r, firing=False))
        if restarted and firing:
            assert last is not None
            why = f"the budget changed from {last.budget} to {r.budget}: the series starts again"
            return Verdict("resolve", why, self.outlook(r, firing=False))
        out = self.outlook(r, firing=firing)
        if out.eta_seconds is None and out.rate_per_hour is None:
            return Verdict(None, out.note, out)  # too few readings: neither fires nor resolves
        if not firing and out.eta_seconds is not None and out.eta_seconds <= self.horizon:
            return Verdict("fire", out.note, replace(out, firing=True))
        if firing and (out.eta_seconds is None or out.eta_seconds > RESOLVE_FACTOR * self.horizon):
            why = (
                "consumption no longer rises"
                if out.eta_seconds is None
                else f"the projection reaches the budget only in {out.eta_seconds:.0f}s"
            )
            return Verdict("resolve", why, replace(out, firing=False))
        return Verdict(None, out.note, out)

    def outlook(self, now: Reading, *, firing: bool) -> QuotaOutlook:
        """What the series projects as of the reading ``now``."""
        series = list(self.readings)
        span = series[-1].at - series[0].at if series else 0.0
        base = QuotaOutlook(
            at=now.at,
            readings=len(series),
            span_seconds=span,
            headroom=now.budget - now.consumed,
            firing=firing,
        )
        need = self.window / 3
        if len(series) < MIN_READINGS or span < need:
            note = (
                f"{len(series)} reading(s) over {span:.0f}s: a trend needs "
                f"{MIN_READINGS} over at least {need:.0f}s"
            )
            return replace(base, note=note)
        line = fit(series)
        if line is None:
            return replace(base, note="the readings share one instant: no line")
        rate = line.slope * 3600.0
        base = replace(base, outlier=line.dropped is not None)
        rising = line.slope > 0 and line.slope >= MIN_T * line.stderr
        crossing = line.reaches(now.budget) if rising else None
        if crossing is None:
            note = "consumption is not rising" if line.slope <= 0 else "no rise clear of jitter"
            return replace(base, rate_per_hour=rate, note=note)
        eta = max(crossing, now.at)
        note = f"the budget is reached in {eta - now.at:.0f}s at {rate:.1f} credits/h"
        return replace(
            base,
            rate_per_hour=rate,
            eta=eta,
            eta_seconds=eta - now.at,
            note=note,
        )
