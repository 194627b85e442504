"""What a confirmation listing does while its pages arrive.

:class:`LatePages` tells which chats that came due *during* the listing a later page
re-read (so the same listing confirms them); :class:`PagedFire` judges and fires the due
chats each page re-read, beside the listing, a few at a time. The dispatcher holds the
groups those alerts reach until the listing ends (:meth:`Ledger.holding`), so the burst
is still one notification per group; the work of firing it is done while the loop would
otherwise wait for the next page, instead of after the last one. What fires is decided by
:class:`watchd.detection.verdicts.Verdicts`; :class:`watchd.detection.confirming.Confirming`
wires the two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet

from watchd.detection.ledger import ClockKey


class LatePages:
    """Which chats that came due *during* a confirmation listing one of its later pages
    read. Pages are asked for one after another, so a page that arrives after a chat was
    already due was asked for after it came due: it re-read the chat past its budget, as
    a confirmation must. A chat the listing had read before it came due is not counted."""

    def __init__(self, pending: Mapping[ClockKey, float], batch: Iterable[ClockKey]) -> None:
        self.pending = pending
        self.known = set(batch)  # the batch (confirmed anyway), and chats sorted below
        self.waiting: list[ClockKey] = []  # due before the last page was asked for
        self.confirmed: list[ClockKey] = []

    def seen(self, present: AbstractSet[str]) -> list[ClockKey]:
        """After a page: the chats this page newly confirmed."""
        still: list[ClockKey] = []
        new: list[ClockKey] = []
        for key in self.waiting:
            (new if key[1] in present else still).append(key)
        self.waiting = still
        self.confirmed += new
        for key in self.pending:
            if key not in self.known:
                self.known.add(key)
                if key[1] not in present:  # read before it came due: not confirmed
                    self.waiting.append(key)
        return new


class PagedFire:
    """The due chats of a burst, fired as the confirmation listing's pages re-read them.

    :meth:`seen` (after each page) queues the due chats that page read, :meth:`add` the
    late ones it confirmed; :meth:`run` (a task beside the listing) first awaits
    ``prepare`` (the burst's workspace reads), then hands the queue to ``fire`` as it
    fills; :meth:`close` (after the listing) lets it finish what is queued and end.
    ``judged`` are the chats ``fire`` returned from (fired, found not past budget, or
    firing already); ``unread`` the batch's chats no page has read yet.
    """

    def __init__(
        self,
        fire: Callable[[list[ClockKey]], Awaitable[None]],
        batch: Iterable[ClockKey],
        *,
        prepare: Callable[[], Awaitable[None]],
    ) -> None:
        self.fire = fire
        self.prepare = prepare
        self.unread: dict[str, list[ClockKey]] = {}  # chat id -> its due clocks
        for key in batch:
            self.unread.setdefault(key[1], []).append(key)
        self.queue: list[ClockKey] = []
        self.judged: set[ClockKey] = set()
        self.wake = asyncio.Event()
        self.closed = False

    def seen(self, present: AbstractSet[str]) -> None:
        unread = self.unread
        for cid in [cid for cid in unread if cid in present]:
            self.queue += unread.pop(cid)
        if self.queue:
            self.wake.set()

    def add(self, keys: list[ClockKey]) -> None:
        if keys:
            self.queue += keys
            self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    async def run(self) -> None:
        await self.prepare()
        while True:
            if not self.queue:
                if self.closed:
                    return
                await self.wake.wait()
                self.wake.clear()
                continue
            taken, self.queue = self.queue, []
            await self.fire(taken)
            self.judged.update(taken)
