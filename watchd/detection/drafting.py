"""Work a confirmation listing can do while its pages arrive.

:class:`LatePages` tells which chats that came due *during* the listing a later page
re-read (so the same listing confirms them); :class:`Drafting` drafts the due chats'
alerts page by page, so the fire pass after the listing only checks and finishes them.
Neither decides what fires: :class:`watchd.detection.confirming.Confirming` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import NamedTuple

from watchd.detection.alerts import Draft
from watchd.detection.budgets import Overdue
from watchd.detection.ledger import ClockKey
from watchd.store.records import ChatRecord

# Alerts drafted between two looks at the loop while a listing's pages arrive. Small: the
# listing's own task passes several loop turns between two pages and can wait up to one
# step at each; at 100 a step (≈ 2.5 ms) the latency case's listing read 0.2-0.4 s
# longer with drafting than without, at 10 it did not.
DRAFT_STEP = 10


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

    def seen(self, present: AbstractSet[str]) -> None:
        still: list[ClockKey] = []
        for key in self.waiting:
            (self.confirmed if key[1] in present else still).append(key)
        self.waiting = still
        for key in self.pending:
            if key not in self.known:
                self.known.add(key)
                if key[1] not in present:  # read before it came due: not confirmed
                    self.waiting.append(key)


class Drafted(NamedTuple):
    """A due chat's verdict and alert as drafted from the record a page re-read."""

    rec: ChatRecord
    past: Overdue
    since: float
    fp: str
    draft: Draft


class Drafting:
    """Alerts drafted while a confirmation listing's pages arrive, so the fire pass after
    it only checks and finishes them (issue 18: the pass ran after the last page, while the
    loop had waited idle for each page before).

    :meth:`seen` (after each page) queues the due chats that page read; :meth:`run` (a
    task beside the listing) drafts them a few at a time, so a page that arrives is read
    after at most DRAFT_STEP drafts. A draft is only work done early: the fire pass uses
    it for a chat whose record is still the very one it was drafted from, with the same
    verdict, and renders every other chat as it always did, so what fires is the same.
    """

    def __init__(
        self, draft: Callable[[ClockKey], Drafted | None], batch: Iterable[ClockKey]
    ) -> None:
        # The confirming loop's drafter: None when the chat is no longer due or fires.
        self.draft = draft
        self.unread: dict[str, list[ClockKey]] = {}  # chat id -> its due clocks
        for key in batch:
            self.unread.setdefault(key[1], []).append(key)
        self.queue: list[ClockKey] = []
        self.drafts: dict[ClockKey, Drafted] = {}
        self.wake = asyncio.Event()

    def seen(self, present: AbstractSet[str]) -> None:
        unread = self.unread
        read = [cid for cid in unread if cid in present]
        for cid in read:
            self.queue += unread.pop(cid)
        if self.queue:
            self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            queue = self.queue
            while queue:
                step = queue[-DRAFT_STEP:]
                del queue[-DRAFT_STEP:]
                for key in step:
                    drafted = self.draft(key)
                    if drafted is not None:
                        self.drafts[key] = drafted
                await asyncio.sleep(0)
