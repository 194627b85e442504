"""An identity's health as alerts, ticked by the detector's loop.

IdentityUnhealthy fires when an identity cannot watch its chats past its grace
(``unhealthy_after``; at once for a refused token), when its confirmation task crashes
again and again, or when its re-reads keep failing while its stream works: in each case
no verdict about its chats can be trusted. IdentityDegraded fires while it is watched by
polling (its stream refused). Each resolves when the identity recovers. The words are
:mod:`watchd.detection.identity_alerts`'; firing and resolving the ledger's.
"""

from __future__ import annotations

from collections.abc import Mapping

from watchd.detection.identity_alerts import (
    degraded_fingerprint,
    identity_degraded,
    identity_unhealthy,
    unhealthy_fingerprint,
)
from watchd.detection.ledger import Ledger
from watchd.detection.watched import Watched
from watchd.kits.clock import WallClock, loop_time
from watchd.kits.tasks import CRASH_LOOP, TASKS

# Confirmation re-reads failed in a row past which the identity is unhealthy (about two
# and a half minutes of a chat's retries at RETRY_CONFIRM_AFTER, or five chats' worth).
CONFIRM_FAILURES_UNHEALTHY = 5


class IdentityWatch:
    def __init__(self, *, ledger: Ledger, wall: WallClock, watched: Mapping[str, Watched]) -> None:
        self.ledger = ledger
        self.wall = wall
        self.watched = watched
        # Identities whose IdentityDegraded is firing (checked each tick only for them).
        self.degraded: set[str] = set()

    def tick(self) -> None:
        """Fire or resolve each watched identity's IdentityUnhealthy and IdentityDegraded."""
        loop_now = loop_time()
        firing = self.ledger.firing
        for name, w in self.watched.items():
            h = w.health
            if h.state == "polling" or name in self.degraded:
                self._degraded_tick(w)
            fp = unhealthy_fingerprint(h)
            # Its confirmations crash again and again: no verdict can come from it, so it is
            # as unhealthy as an identity that cannot list.
            confirming = TASKS.tasks.get(f"confirm:{name}")
            crashing = confirming is not None and confirming.crashes_in_a_row >= CRASH_LOOP
            # Or its re-reads keep failing while the stream works: the same, by Coder's doing.
            broken = crashing or h.confirm_failures >= CONFIRM_FAILURES_UNHEALTHY
            if h.ready and not broken:
                if fp in firing:
                    self.ledger.resolve(fp, at=self.wall.now(), why="identity recovered")
                continue
            if fp in firing or (
                not broken and not h.refused and h.unhealthy_for(loop_now) < h.unhealthy_after
            ):
                continue
            if crashing and confirming is not None:
                h.last_error = f"confirmation task keeps crashing: {confirming.last_error}"
            down_for = h.unhealthy_for(loop_now)
            alert = identity_unhealthy(
                h, labels=w.labels, down_for=down_for, starts_at=self.wall.now()
            )
            self.ledger.fire(alert, identity=name, chat_id=None)

    def _degraded_tick(self, w: Watched) -> None:
        """IdentityDegraded while the identity is watched by polling (its stream refused)."""
        h = w.health
        fp = degraded_fingerprint(h)
        if h.state == "polling":
            if fp not in self.ledger.firing:
                alert = identity_degraded(h, labels=w.labels, starts_at=self.wall.now())
                self.ledger.fire(alert, identity=h.name, chat_id=None)
                self.degraded.add(h.name)
            return
        self.degraded.discard(h.name)
        if fp in self.ledger.firing:
            self.ledger.resolve(fp, at=self.wall.now(), why="the watch stream is back")
