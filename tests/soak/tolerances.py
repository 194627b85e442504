"""How much slack the oracle gives watchd, each figure derived from the config under test
and the behaviour docs/alerting.md states (never tuned to make a run pass).

A page is owed ``budget + page`` after a chat entered its status; a resolve ``resolve``
after it left. Blind time — no watch socket, Coder answering errors, the receiver down,
the daemon killed — adds its own length and a recovery (:mod:`tests.soak.history`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tests.soak.shape import Variant
from watchd.alerting.dispatch import MAX_FLUSH
from watchd.detection.confirming import RETRY_CONFIRM_AFTER, SETTLE_MAX
from watchd.watching.settings import WatchSettings

# HTTP Date headers carry whole seconds: the server-clock estimate is good to one.
DATE_RESOLUTION = 1.0
# One listing of a soak's identity (≤ 100 chats) or one GET, applied, on a loaded
# two-core machine; and one webhook POST.
LISTING = 1.0
NOTIFY = 0.5
# The reconciler waits interval × U(0.9, 1.1) between listings.
RECONCILE_JITTER = 1.1
# The server-clock estimator follows a step that three Date samples in a row agree on.
FOLLOW_SAMPLES = 3
# A new clock is committed within 100 ms of being observed (docs/alerting.md, Clocks);
# an observation this close before a kill -9 may be lost with it.
PERSIST = 1.0
# SIGHUP to the new config applied (identities restarted if their budgets changed).
RELOAD = 2.0


@dataclass(frozen=True)
class Tolerances:
    """Every slack, in seconds, with the reason the statement gives."""

    dispatch: float  # an alert put into its group reaches the receiver within
    observe: float  # a change no event told of is seen by a listing within
    absent: float  # a chat that vanished without an event is confirmed gone within
    follow: float  # a server-clock step is followed within
    confirm_base: float  # the settle before confirming, and a GET or listing
    confirm_rate: float  # confirming GETs per second per identity
    confirm_threshold: int  # due together at least this many: one listing instead
    coder_recovery: float  # after Coder answers again, a failed re-read is retried within
    receiver_recovery: float  # after the receiver answers again, delivery within
    repeat_min: float  # the shortest repeat_interval in force
    flush_max: float  # one flush with its retries takes at most
    early: float = DATE_RESOLUTION  # before clock steps: a page can come this early
    persist: float = PERSIST
    reload: float = RELOAD
    max_clock_step: float = 0.0

    @classmethod
    def of(
        cls, variants: Sequence[Variant], *, max_clock_step: float, receiver_retry_after: float
    ) -> Tolerances:
        """The tolerances for these configs, clock steps up to ``max_clock_step`` and a
        receiver that asks for ``receiver_retry_after`` when it answers 429."""
        w = WatchSettings()
        group = max(max(v.group_wait, v.group_interval) for v in variants)
        observe = max(v.reconcile_interval for v in variants) * RECONCILE_JITTER + LISTING
        flush = max(min(MAX_FLUSH, max(5.0, v.group_interval)) for v in variants)
        return cls(
            dispatch=group + NOTIFY,
            observe=observe,
            absent=observe + 1.0 / w.absent_confirm_rate + LISTING,
            follow=FOLLOW_SAMPLES * observe,
            confirm_base=SETTLE_MAX + LISTING,
            confirm_rate=min(v.detection.confirm_rate for v in variants),
            confirm_threshold=max(v.detection.confirm_listing_threshold for v in variants),
            coder_recovery=RETRY_CONFIRM_AFTER + LISTING,
            receiver_recovery=flush
            + max(v.group_interval for v in variants)
            + receiver_retry_after,
            repeat_min=min(v.repeat_interval for v in variants),
            flush_max=flush,
            max_clock_step=max_clock_step,
        )

    def confirm(self, due_together: int) -> float:
        """Settle, then GETs one after another at confirm_rate (a listing past the
        threshold), for ``due_together`` chats of one identity coming due at once."""
        return self.confirm_base + min(due_together, self.confirm_threshold) / self.confirm_rate

    def page(self, due_together: int, steps: float) -> float:
        """From due to the page at the receiver: confirm, deliver, the Date header's
        resolution, and ``steps`` seconds of server-clock steps not yet followed."""
        return self.confirm(due_together) + self.dispatch + DATE_RESOLUTION + steps

    def resolve(self, *, heard: bool, gone: bool) -> float:
        """From leaving the status to the resolve at the receiver: at once when the event
        was heard, else by the next listing (and a GET for a chat that is gone)."""
        seen = 0.0 if heard else self.absent if gone else self.observe
        return seen + LISTING + self.dispatch

    def statement(self) -> list[str]:
        """The tolerances as the summary prints them: figure and where it comes from."""
        return [
            f"early: a page may precede due by {self.early:g}s (HTTP Date resolution) plus the "
            f"server-clock steps of the last {self.follow:g}s (followed after "
            f"{FOLLOW_SAMPLES} Date samples, one listing each: {self.observe:g}s)",
            f"page: due + settle {SETTLE_MAX:g}s + read {LISTING:g}s + n/{self.confirm_rate:g}/s "
            f"for n chats of the identity due together (≤ {self.confirm_threshold}) + "
            f"group_wait/group_interval + notify = {self.dispatch:g}s + Date {DATE_RESOLUTION:g}s"
            " + unfollowed clock steps",
            f"resolve: left + {self.dispatch + LISTING:g}s when its event was heard, "
            f"{self.resolve(heard=False, gone=False):g}s when a listing must find it "
            f"(reconcile × {RECONCILE_JITTER} + listing), "
            f"{self.resolve(heard=False, gone=True):g}s for a chat gone without an event",
            f"blind time inside a span pushes its end to the tolerance after the window and its "
            f"recovery: no watch socket, a kill -9 (from {self.persist:g}s before) or a reload "
            f"({self.reload:g}s) last until the seed listing ({LISTING:g}s); Coder errors, 429s "
            f"or a Coder restart recover {self.coder_recovery:g}s after (a failed re-read is "
            f"retried 30s later); receiver outages {self.receiver_recovery:g}s after (flush "
            "retries, group_interval, Retry-After)",
            f"an event heard within {self.persist:g}s before a kill -9 counts as unheard "
            f"(a new clock is committed within 100 ms); a reload applies within {self.reload:g}s",
            f"duplicate re-send: an unchanged group notified again within repeat_interval "
            f"({self.repeat_min:g}s) − one flush ({self.flush_max:g}s), unless a kill -9 came "
            f"within {self.persist:g}s of the first (killed between the send and its record)",
        ]
