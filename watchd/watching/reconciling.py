"""The reconcile beside the stream: relist periodically, and confirm what a listing lacked.

The stream drops events, so one identity's chats are relisted every
``reconcile_interval`` (jittered) regardless of it. A complete listing that lacks
a known chat only marks it *absent*; between listings the absent chats are
confirmed by GET (404 → gone, ``archived`` → archived), and an idle chat is
tombstoned without a GET only when two consecutive complete listings lack it
(docs/coder-api.md, "the moving cursor"). Chats whose events overflowed the
watcher's buffer during a listing are re-read here the same way, and the server
clock is checked here against the stamps of listings and of the stream's
transitions (warned once each). The watcher owns the socket; a reconcile that
fails asks it to drop the stream (loop 1 re-seeds).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Iterable
from collections.abc import Set as AbstractSet
from typing import Protocol

import structlog

from watchd.coder.client import CoderClient, Listing
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.models import ACTIVE_STATUSES
from watchd.coder.observing import WatchEvent
from watchd.kits import logs
from watchd.kits.clock import loop_time
from watchd.store.chats import TRANSITION_EVENTS, ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.listing import observe_page
from watchd.store.records import Change

log = logs.get("watchd.watching")

# Chats missing from a listing are confirmed by GET only when this few are missing. In
# bulk (a mass deletion, or thousands of phantom chats that only ever appeared in watch
# events) they retire when a second complete listing lacks them too, one tombstone pass
# instead of a GET storm, whatever their status, except an *active* one (running,
# pending, interrupting): the moving cursor skips exactly the rows whose updated_at moves
# while a listing pages, so those are always confirmed by GET.
ABSENT_GET_LIMIT = 20
ABSENT_GETS_PER_PASS = 100
# Capacity reads (a ``capacity_change`` event, or a running chat whose alert fired on a
# listing's evidence) waiting for their GET, at most; beyond it a chat's cause stays as
# diagnosed (counted in ``capacity_reads_dropped``).
CAPACITY_READS_MAX = 1_000
# Capacity GETs per second per identity. coderd's rate limit keys each chat's path
# separately (httpmw.RateLimit, KeyByEndpoint), so no bucket sees more than one of them;
# this pace only spares the server: 200 chats learn their cause in 20 s.
CAPACITY_READ_RATE = 10.0


class ChangeSink(Protocol):
    """Where an identity's store changes go (the daemon wires in the detector): watching
    and detection do not import each other."""

    def apply(self, identity: str, changes: Iterable[Change]) -> None: ...

    def readiness_changed(self, name: str) -> None: ...


class Reconciler:
    def __init__(
        self,
        *,
        health: IdentityHealth,
        client: CoderClient,
        store: ChatStore,
        changes: ChangeSink,
        listing_gate: asyncio.Semaphore,
        interval: float,
        absent_confirm_rate: float,
        rng: random.Random,
        drop_stream: Callable[[], Awaitable[None]],
    ) -> None:
        self.health = health
        self.name = health.name
        self.client = client
        self.store = store
        self.changes = changes
        self.gate = listing_gate
        self.interval = interval
        self.absent_confirm_rate = absent_confirm_rate
        self.rng = rng
        self.drop_stream = drop_stream
        self._relist_lock = asyncio.Lock()
        self._relist_now = False
        # Chats waiting for a GET, in order: "absent" (a listing lacked them), "dirty"
        # (their events overflowed the buffer during a listing), "capacity" (queued or
        # admitted: the event does not say which) or "contradicted" (an older stamp named
        # another status: store.take_contradicted).
        self.to_confirm: dict[str, str] = {}
        self._dropping = False  # the last capacity ask found the queue full
        self._absent_wake = asyncio.Event()
        # Which of the clock warnings this identity has said (each once): date, stamps,
        # behind (the watcher's).
        self.clock_warned: set[str] = set()

    def reread(self, dirty: set[str]) -> None:
        """Chats whose events overflowed the buffer: a few are read by GET (as absent
        chats are), many by one more listing right away."""
        if len(dirty) <= ABSENT_GET_LIMIT:
            for chat_id in dirty:
                self.to_confirm.setdefault(chat_id, "dirty")
        else:
            self._relist_now = True
        log.info("watch.reread", identity=self.name, chats=len(dirty), by_listing=self._relist_now)
        self._absent_wake.set()

    def read_contradicted(self) -> None:
        """GET the chats an older-stamped event or row said were in another status. The
        server's clock may have stepped back between two transitions, so the newer one
        carries the older stamp: without a read, the transition would wait unseen until
        updated_at passed the held one. A read that nothing overtook is authoritative."""
        contradicted = self.store.take_contradicted(self.name)
        if not contradicted:
            return  # the usual case: asked after every burst of events
        queue = self.to_confirm
        for chat_id in sorted(contradicted):
            if len(queue) >= CAPACITY_READS_MAX:
                break  # the next listing contradicts them again
            queue.setdefault(chat_id, "contradicted")
        self._absent_wake.set()

    def capacity_changed(self, chat_ids: Iterable[str]) -> set[str]:
        """Chats whose ``queued_for_capacity`` is to be learned: a ``capacity_change``
        event named them (its payload is a list row: no flag, ``updated_at`` unchanged),
        or their alerts fired on a listing's evidence. Each is read by GET, once however
        many ask, at most CAPACITY_READS_MAX waiting, at CAPACITY_READ_RATE."""
        queue = self.to_confirm
        waiting = sum(1 for why in queue.values() if why == "capacity")
        dropped = 0
        accepted = set()
        for chat_id in chat_ids:
            why = queue.get(chat_id)
            if why is not None and why != "absent":
                # Read anyway (dirty, or asked already): that GET learns the flag.
                accepted.add(chat_id)
                continue
            # An absent chat's read is skipped once a listing sees it again: a capacity
            # read is not.
            if waiting >= CAPACITY_READS_MAX:
                dropped += 1
                continue
            queue[chat_id] = "capacity"
            accepted.add(chat_id)
            waiting += 1
        if dropped:
            self.health.capacity_reads_dropped += dropped
            if not self._dropping:  # once while the queue stays full (a burst asks per page)
                log.info(
                    "capacity.reads_dropped",
                    identity=self.name,
                    chats=dropped,
                    note="the queue is full: further drops are counted in "
                    "capacity_reads_dropped, not logged, until it has room",
                )
        self._dropping = dropped > 0
        self._absent_wake.set()
        return accepted

    async def forever(self) -> None:
        """Relist every ``reconcile_interval`` (jittered); between listings, confirm the
        chats the last complete listing lacked."""
        structlog.contextvars.bind_contextvars(identity=self.name)
        interval = self.interval
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + interval * self.rng.uniform(0.9, 1.1)
            while (left := due - loop.time()) > 0:
                if self._relist_now and self.health.ready:
                    break
                if self.to_confirm and self.health.ready:
                    await self.confirm_absent()
                    continue
                self._absent_wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._absent_wake.wait()
            if not self.health.ready:
                continue
            self._relist_now = False
            try:
                await self.relist()
            except (CoderError, PayloadError) as exc:
                log.warning("reconcile.failed", identity=self.name, error=str(exc))
                # The view can't be trusted: drop the stream and let loop 1 re-seed.
                self.health.last_error = f"reconcile failed: {exc}"
                await self.drop_stream()

    async def relist(self, *, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
        """A listing applied to the store (new chats, transitions, refreshes).

        ``on_page`` is told, after each page is applied, the ids the listing has read so
        far (the detector's confirmation uses it to see which due chats a page read).

        Applied page by page as the pages arrive, so a large fleet's rows die young
        instead of piling up (and being scanned by the garbage collector) until the
        end. Only a *complete* listing says anything about chats it lacks, and then only
        that they are absent (see :meth:`_absent_found`).
        """
        async with self._relist_lock:
            clock = self.health.server_clock
            present: set[str] = set()
            listing = Listing()
            async with self.gate:
                began = loop_time()
                started = clock.now()
                # Seeding a store that holds nothing of this identity, every row is news:
                # decoding the compared fields first would only add to the full decode.
                compared = self.name in self.store.identities()
                async for page in self.client.chat_pages(listing=listing, compared=compared):
                    changes = observe_page(
                        self.store, self.name, page, now=clock.now(), present=present
                    )
                    if changes:
                        self.changes.apply(self.name, changes)
                    if on_page is not None:
                        on_page(present)
            if listing.complete:
                absent = self.store.finish_listing(self.name, present, started=started)
                if absent:
                    self._absent_found(absent)
            else:
                self.health.incomplete_listings += 1
                self.health.last_error = f"listing incomplete: {listing.incomplete}"
                log.warning(
                    "listing.incomplete",
                    identity=self.name,
                    why=listing.incomplete,
                    pages=listing.pages,
                    rows=listing.rows,
                    note="no chat is taken as missing from this listing",
                )
            self.health.last_list_seconds = round(loop_time() - began, 3)
            self.health.last_list_ok = clock.now()
            self.health.last_list_chats = len(present)
            self.health.last_list_pages = listing.pages
            self.health.relists += 1
            self._check_clock()
            self.read_contradicted()

    def check_stamps(self, events: list[WatchEvent]) -> None:
        """A transition's event arrives as coderd writes it: its stamp is the server's
        clock now, and the estimate must not run far ahead of it (a proxy's Date, no Date
        from a server behind this host would fire every running chat at once)."""
        # The last transition of the burst is the freshest (one look, not one per event).
        for e in reversed(events):
            newest = e.chat.updated_at
            if e.kind in TRANSITION_EVENTS and newest is not None:
                break
        else:
            return
        clock = self.health.server_clock
        if clock.fresh_stamp(newest) and "behind" not in self.clock_warned:
            self.clock_warned.add("behind")
            log.warning(
                "clock.ahead_of_stamps",
                identity=self.name,
                behind_seconds=round(clock.stamp_lag, 1),
                note="fresh chat stamps are far behind the Date-based server clock (a proxy's "
                "clock, or no Date header): the stamps are believed instead",
            )

    def _check_clock(self) -> None:
        """Say once per identity when the deployment's clock cannot be trusted: responses
        without a Date header, or chat timestamps ahead of it or before the chats began."""
        clock = self.health.server_clock
        said = self.clock_warned
        if clock.missing_date and "date" not in said:
            said.add("date")
            log.warning(
                "clock.no_date_header",
                identity=self.name,
                responses=clock.missing_date,
                note="the server clock is estimated from the other responses only",
            )
        ahead = self.store.future_clamped.get(self.name, 0)
        before = self.store.before_created.get(self.name, 0)
        if (ahead or before) and "stamps" not in said:
            said.add("stamps")
            log.warning(
                "clock.disagrees",
                identity=self.name,
                ahead_of_server_clock=ahead,
                before_created_at=before,
                offset_seconds=round(clock.offset, 3),
                note="such timestamps are clamped to the server clock or ignored as clocks",
            )

    def _absent_found(self, absent: dict[str, int]) -> None:
        """Sort the chats a complete listing lacked: confirm by GET, wait, or tombstone."""
        few = len(absent) <= ABSENT_GET_LIMIT
        gone: list[Change] = []
        for chat_id, missed in absent.items():
            rec = self.store.get(self.name, chat_id)
            if rec is None:
                continue
            if not few and rec.status not in ACTIVE_STATUSES:
                if missed >= 2:
                    change = self.store.tombstone(
                        self.name, chat_id, reason="gone (missing from two complete listings)"
                    )
                    if change is not None:
                        gone.append(change)
                continue
            self.to_confirm[chat_id] = "absent"
        self.health.absent = len(self.store.absent(self.name))
        if gone:
            self.changes.apply(self.name, gone)
        if self.to_confirm:
            log.info(
                "listing.absent",
                identity=self.name,
                missing=len(absent),
                to_confirm=len(self.to_confirm),
                tombstoned=len(gone),
            )
            self._absent_wake.set()

    async def confirm_absent(self) -> None:
        """GET chats a complete listing lacked, at ``absent_confirm_rate``: 404 → gone,
        ``archived`` → archived, otherwise the chat is there (the cursor skipped it) and
        keeps its clock. A failed read leaves it absent for the next listing to judge."""
        batch = list(self.to_confirm)[:ABSENT_GETS_PER_PASS]
        paces = {"capacity": 1.0 / CAPACITY_READ_RATE}
        interval = 1.0 / self.absent_confirm_rate
        clock = self.health.server_clock
        loop = asyncio.get_running_loop()
        # Paced by the clock, not by a sleep after each read: a GET's own latency is part
        # of its slot, so the rate is the rate (200 capacity reads take 20 s, not 20 s
        # plus 200 round trips).
        slot = loop.time()
        absent = self.store.absent(self.name)
        for chat_id in batch:
            why = self.to_confirm.pop(chat_id, "absent")
            if why == "absent" and chat_id not in absent:
                continue  # seen again meanwhile (an event, a later listing)
            if why != "capacity":
                self.health.absent_confirms += 1
            change: Change | None
            before = self.store.get(self.name, chat_id)
            try:
                chat = await self.client.get_chat(chat_id)
            except CoderError as exc:
                if exc.status != 404:
                    log.info(
                        "absent.confirm_failed", identity=self.name, chat_id=chat_id, error=str(exc)
                    )
                    return
                change = self.store.tombstone(self.name, chat_id, reason="gone (404)")
            except PayloadError as exc:
                log.info(
                    "absent.confirm_failed", identity=self.name, chat_id=chat_id, error=str(exc)
                )
                continue
            else:
                # A dirty re-read is no more authoritative than the events since it; a
                # contradicted one is when nothing moved the record while it was read.
                overtaken = self.store.get(self.name, chat_id) is not before
                authoritative = why == "absent" or (why == "contradicted" and not overtaken)
                via = "confirm" if authoritative else "listing"
                change = self.store.observe(self.name, chat, now=clock.now(), via=via)
                if change is None and not chat.archived:
                    log.debug("absent.still_there", identity=self.name, chat_id=chat_id)
            if change is not None:
                self.changes.apply(self.name, (change,))
            slot = max(slot + paces.get(why, interval), loop.time() - 1.0)
            await asyncio.sleep(max(0.0, slot - loop.time()))
        self.health.absent = len(self.store.absent(self.name))
