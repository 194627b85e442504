"""What the detector keeps per watched identity, and the ports it works through.

:class:`Watched` is one identity's registration: its health (read, never written
here), its budgets and labels, and the confirm loop's queue. :class:`Confirmer` is the
port detection asks the identity's watcher to re-read through (the answers come back
as ordinary store changes, not through this port); :class:`Arming` is what confirming
needs back from the detector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal, Protocol

from watchd.config.watching import Budgets
from watchd.detection.diagnosis import Reading
from watchd.detection.ledger import ClockKey
from watchd.store.health import IdentityHealth
from watchd.store.records import ChatRecord


class Confirmer(Protocol):
    """The port detection asks an identity's watcher to re-read through. Whatever a
    re-read finds comes back as ordinary store changes through the watcher's change sink
    (the detector's ``apply``), tagged ``via="confirm"``; detection itself never writes
    the store or the identity's health. Failures raise CoderError or PayloadError."""

    async def reread(self, chat_id: str) -> Literal["read", "gone"]:
        """Read one chat again into the store ("gone": Coder answered 404)."""

    async def relist(self, *, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
        """List the identity's chats into the store; ``on_page(ids read so far)`` after
        each page."""

    async def facts(self, record: ChatRecord, *, lookup: bool = True) -> Reading: ...

    def learn_capacity(self, chat_ids: Sequence[str]) -> AbstractSet[str]:
        """Read these chats by GET, paced, for their ``queued_for_capacity`` (a listing
        never carries it); what is learned comes back as store changes. Returns the ids
        it will read (the queue is bounded)."""


class Arming(Protocol):
    """What confirming needs back from the detector: a clock to arm again, a look at the
    heap."""

    def arm(self, rec: ChatRecord) -> None: ...

    def wake(self) -> None: ...


@dataclass
class Watched:
    health: IdentityHealth
    confirmer: Confirmer
    budgets: Budgets
    labels: Mapping[str, str]
    # Due chats waiting for their re-read → the deadline (server time) each came due at.
    pending: dict[ClockKey, float] = field(default_factory=dict)
    # The latest deadline of the batch being confirmed: its chats are judged no earlier
    # than that (within a second of the estimate: verdicts.ESTIMATE_SLACK), so Date
    # samples of the confirming listing itself that move the clock estimate back cannot
    # make the burst "not yet due" and cost a second listing.
    due_by: float = 0.0
    deferred: set[ClockKey] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # status → budget seconds (None: never stuck), filled on first use per status.
    limits: dict[str, float | None] = field(default_factory=dict)
    # Due chats whose re-reads failed in a row: (failures, the last error). Bounded by the
    # chats that came due; cleared by a re-read that succeeds or by the verdict.
    failures: dict[ClockKey, tuple[int, str]] = field(default_factory=dict)
