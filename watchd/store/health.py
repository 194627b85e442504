"""Per-identity health: can we trust this identity's view of its chats right now?

The watcher writes it; the detector reads it (no verdicts from stale data)
and turns a long-unhealthy identity into IdentityUnhealthy; the status page
and metrics show it. It lives below both watching and detection (which must
not import each other), beside the chats it describes. Durations are on the
loop clock (:func:`watchd.kits.clock.loop_time`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from watchd.coder.observing import Quota
from watchd.kits.clock import ServerClock, loop_time

# What an identity's watcher is doing; the words are shown in /status and IdentityUnhealthy.
WatchState = Literal[
    "starting",
    "seeding",
    "ready",
    # Listing on a timer because the watch stream is refused (a proxy that will not
    # upgrade): verdicts go on, changes are seen a poll late.
    "polling",
    "reconnecting",
    "auth_failed",
    "unreachable",
    "not_found",
    "stopped",
]
QuotaState = Literal["ok", "unlimited", "unavailable", "error", "unknown"]


@dataclass(frozen=True, slots=True)
class QuotaOutlook:
    """What the identity's quota readings project (the forecast writes it, the status
    page, metrics and admission read it). Times are on the server's clock."""

    at: float  # when the latest reading was taken
    readings: int  # in the window
    span_seconds: float
    headroom: int
    firing: bool  # QuotaExhaustionForecast fires
    rate_per_hour: float | None = None  # the fitted rise (None: too few readings)
    eta: float | None = None  # when the line reaches the budget (None: not rising)
    eta_seconds: float | None = None
    note: str = ""  # why there is no forecast, or what it says
    outlier: bool = False  # a reading was dropped as an outlier


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """One identity's health at one moment, as plain data (``/status`` and ``/metrics``
    read this). ``server_now`` is the identity's server clock when it was taken."""

    name: str
    deployment: str
    state: WatchState
    ready: bool
    seeded: bool
    prefix: str
    server_now: float
    server_clock_offset: float
    last_list_ok: float | None
    last_list_seconds: float | None
    last_list_pages: int
    incomplete_listings: int
    absent: int
    absent_confirms: int
    capacity_reads_dropped: int
    refused: bool
    last_error: str
    reconnects: int
    relists: int
    events: int
    quota: Quota | None
    quota_state: QuotaState
    quota_error: str
    forecast: QuotaOutlook | None


@dataclass
class IdentityHealth:
    name: str
    deployment: str
    server_clock: ServerClock
    unhealthy_after: float
    state: WatchState = "starting"
    ready: bool = False
    seeded_once: bool = False
    # The first seed attempt has ended, seeded or not: what READY=1 and /readyz wait for.
    attempted_once: bool = False
    not_ready_since: float = field(default_factory=loop_time)
    last_error: str = ""
    last_list_ok: float | None = None  # server time of the last complete listing
    last_list_chats: int = 0
    last_list_pages: int = 0
    # Listings that could not prove they covered everything (nothing inferred from them).
    incomplete_listings: int = 0
    # Chats missing from recent complete listings, not yet confirmed gone.
    absent: int = 0
    absent_confirms: int = 0
    # Capacity reads not queued (CAPACITY_READS_MAX were waiting): those chats keep the
    # cause a listing's evidence gave them.
    capacity_reads_dropped: int = 0
    # Confirmation re-reads (GETs, listings) that failed in a row: past a few, the identity
    # is unhealthy even while its stream and listings work (no verdict can be trusted).
    confirm_failures: int = 0
    # Coder refused the token twice (401/403): IdentityUnhealthy without waiting for
    # unhealthy_after, which is for outages that may pass.
    refused: bool = False
    reconnects: int = 0
    relists: int = 0
    events: int = 0
    malformed: int = 0
    overflow: int = 0
    prefix: str = ""
    quota: Quota | None = None
    quota_state: QuotaState = "unknown"
    quota_checked: float | None = None  # loop clock
    quota_error: str = ""
    forecast: QuotaOutlook | None = None

    # Told each complete listing's duration (the daemon's histogram); not compared or shown.
    on_listing: Callable[[float], None] | None = field(default=None, repr=False, compare=False)
    # Told each confirmation read's duration (the daemon's histogram), likewise.
    on_confirmation: Callable[[float], None] | None = field(default=None, repr=False, compare=False)
    _last_list_seconds: float | None = field(default=None, repr=False)

    @property
    def last_list_seconds(self) -> float | None:
        """How long the last complete listing took."""
        return self._last_list_seconds

    @last_list_seconds.setter
    def last_list_seconds(self, seconds: float | None) -> None:
        self._last_list_seconds = seconds
        if seconds is not None and self.on_listing is not None:
            self.on_listing(seconds)

    def snapshot(self) -> HealthSnapshot:
        return HealthSnapshot(
            name=self.name,
            deployment=self.deployment,
            state=self.state,
            ready=self.ready,
            seeded=self.seeded_once,
            prefix=self.prefix,
            server_now=self.server_clock.now(),
            server_clock_offset=self.server_clock.offset,
            last_list_ok=self.last_list_ok,
            last_list_seconds=self.last_list_seconds,
            last_list_pages=self.last_list_pages,
            incomplete_listings=self.incomplete_listings,
            absent=self.absent,
            absent_confirms=self.absent_confirms,
            capacity_reads_dropped=self.capacity_reads_dropped,
            refused=self.refused,
            last_error=self.last_error,
            reconnects=self.reconnects,
            relists=self.relists,
            events=self.events,
            quota=self.quota,
            quota_state=self.quota_state,
            quota_error=self.quota_error,
            forecast=self.forecast,
        )

    def set_state(self, state: WatchState, *, error: str = "") -> None:
        was_ready = self.ready
        self.state = state
        self.ready = state in ("ready", "polling")
        if error:
            self.last_error = error
        if was_ready and not self.ready:
            self.not_ready_since = loop_time()
        if self.ready:
            self.seeded_once = True
        if state in ("ready", "polling", "auth_failed", "not_found", "unreachable"):
            # Seeded, or the attempt failed conclusively (a stream that merely closed
            # mid-seed is retried at once and does not count).
            self.attempted_once = True
        if state != "auth_failed":
            self.refused = False

    def unhealthy_for(self, now: float) -> float:
        return 0.0 if self.ready else now - self.not_ready_since
