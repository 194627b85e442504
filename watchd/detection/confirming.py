"""Confirm before firing: one loop per identity re-reads its due chats.

A due chat is re-read by a rate-limited GET, or, when many are due together, by
one listing (a burst is let to settle first, so it takes one listing, not one per
slice; a chat that comes due while it runs is confirmed by it when a later page reads
it, :class:`LatePages`). Only what the re-read still shows past budget fires, in one synchronous
pass (:mod:`watchd.detection.verdicts`). Re-reads are *asked* of the identity's watcher through the
:class:`~watchd.detection.watched.Confirmer` port; what they find arrives as ordinary
store changes through the detector's ``apply``, so nothing here writes the store or an
identity's health. Each loop runs under the task guard (:func:`watchd.kits.tasks.spawn`):
a confirmer that raises restarts the loop (counted, logged with its traceback) and the
chats of the failed batch come due again. Fires through the ledger; arms no timer itself
except the retry after a failed re-read. What a listing does while its pages arrive is
:mod:`watchd.detection.drafting`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Set as AbstractSet

import structlog

from watchd.alerting.model import Alert
from watchd.coder.errors import CoderError, PayloadError
from watchd.detection.alerts import Renderer
from watchd.detection.budgets import Clock
from watchd.detection.ledger import ClockKey, Ledger
from watchd.detection.paged import LatePages, PagedFire
from watchd.detection.timers import ServerTimers
from watchd.detection.verdicts import Verdicts
from watchd.detection.watched import Arming, Watched
from watchd.kits import logs
from watchd.kits.clock import WallClock
from watchd.kits.tasks import spawn
from watchd.store.chats import ChatStore
from watchd.store.records import ChatRecord
from watchd.store.timelines import Timelines

log = logs.get("watchd.detection")

RETRY_CONFIRM_AFTER = 30.0
# A due chat whose GET keeps failing (a proxy's login page, a 5xx, a body that does not
# parse) while listings work is confirmed by a listing from its second failure on, and
# after its third fires with the evidence at hand, annotated "unconfirmed: <error>":
# never re-armed forever in silence.
LIST_AFTER = 2
UNCONFIRMED_AFTER = 3
# Before confirming, let a burst of due chats finish coming due: wait until no new one
# arrived for SETTLE_QUIET and no deadline is imminent (at most SETTLE_MAX), so one listing
# confirms the whole burst.
SETTLE_QUIET = 0.05
SETTLE_LOOKAHEAD = 0.25  # a deadline this close still belongs to the burst
SETTLE_MAX = 1.0


class Confirming:
    def __init__(
        self,
        *,
        store: ChatStore,
        timers: ServerTimers,
        ledger: Ledger,
        renderer: Renderer,
        arming: Arming,
        wall: WallClock,
        counters: dict[str, int],
        confirm_rate: float,
        listing_threshold: int,
        chat_failed: bool,
        timelines: Timelines | None = None,
    ) -> None:
        self.store = store
        self.timelines = timelines
        self.timers = timers
        self.ledger = ledger
        self.renderer = renderer
        self.arming = arming
        self.wall = wall
        self.counters = counters
        self.confirm_rate = confirm_rate
        self.listing_threshold = listing_threshold
        self.verdicts = Verdicts(
            store=store,
            ledger=ledger,
            renderer=renderer,
            arming=arming,
            wall=wall,
            counters=counters,
            chat_failed=chat_failed,
            timelines=timelines,
        )

    def start(self, w: Watched) -> None:
        # Under the guard: a confirmer that raises restarts (counted, logged with its
        # traceback) instead of silently ending this identity's verdicts for good.
        w.task = spawn(f"confirm:{w.health.name}", lambda: self.loop(w), kind="confirm")

    async def loop(self, w: Watched) -> None:
        interval = 1.0 / self.confirm_rate
        while True:
            await w.wake.wait()
            w.wake.clear()
            while w.pending:
                await self._settle(w)
                if not w.health.ready:
                    w.deferred.update(w.pending)
                    w.pending.clear()
                    break
                batch = list(w.pending)
                w.due_by = max(w.pending.values())
                w.pending.clear()
                try:
                    if w.failures:
                        batch = await self._persistently_failing(w, batch)
                    if len(batch) >= self.listing_threshold or any(
                        w.failures.get(k, (0, ""))[0] >= LIST_AFTER for k in batch
                    ):
                        await self._by_listing(w, batch)
                        continue
                    for i, key in enumerate(batch):
                        try:
                            await self._one(w, key)
                        except Exception:
                            batch = batch[i:]
                            raise
                        await asyncio.sleep(interval)
                except Exception as exc:
                    # A bug (a confirmer that raised): the chats of this batch are due again
                    # later, and the guard restarts this loop; nothing is silently dropped.
                    self._failed(w, batch, exc)
                    raise

    async def _settle(self, w: Watched) -> None:
        """Chats that cross their budget together come due over a few milliseconds (or a
        second): wait while the burst is still growing or more deadlines are imminent, so
        it takes one listing, not one listing per slice (a listing of a large fleet takes
        seconds). Quiet means SETTLE_QUIET since the last chat came due (each one sets
        ``w.wake``), not a look every SETTLE_QUIET. At most SETTLE_MAX."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + SETTLE_MAX
        while (left := give_up - loop.time()) > 0:
            w.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(SETTLE_QUIET, left)):
                    await w.wake.wait()
                continue  # another came due: quiet from now
            nxt = self.timers.next_deadline(w.health.name)
            if nxt is None or nxt - self.wall.now() >= SETTLE_LOOKAHEAD:
                return

    async def _by_listing(self, w: Watched, batch: list[ClockKey]) -> None:
        """Confirm ``batch`` by one listing: each chat fires as the page that re-read it
        is applied (:class:`PagedFire`), the dispatcher holding what they reach until the
        listing ends; chats that came due during the listing and a later page read are
        confirmed by it too (:class:`LatePages`). A chat no page read is confirmed again
        RETRY_CONFIRM_AFTER later; a listing that fails leaves the chats it had not read
        to be retried, those it read having fired on their pages' evidence."""
        self.counters["confirm_listing"] += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        pages = LatePages(w.pending, batch)
        fired: list[Alert] = []
        burst = len(batch)

        async def fire(keys: list[ClockKey]) -> None:
            fired.extend(await self.verdicts.fire_read(w, self._records(keys), burst=burst))

        async def prepare() -> None:
            await self.verdicts.read_builds(w, [r for r, _ in self._records(batch)])

        paged = PagedFire(fire, batch, prepare=prepare)
        late: list[ClockKey] = []

        def seen(present: AbstractSet[str]) -> None:
            confirmed = [key for key in pages.seen(present) if key in w.pending]
            for key in confirmed:
                w.due_by = max(w.due_by, w.pending.pop(key))
            late.extend(confirmed)
            paged.seen(present)
            paged.add(confirmed)

        failed: Exception | None = None
        with self.ledger.holding():
            # Under the guard, not restarted: what it leaves unjudged is judged below.
            firer = spawn(
                f"fire:{w.health.name}", paged.run, kind="confirm", eternal=False, restart=False
            )
            try:
                await w.confirmer.relist(on_page=seen)
            except (CoderError, PayloadError) as exc:
                failed = exc
            except BaseException:
                firer.cancel()
                raise
            paged.close()
            await firer
            # What the firer left (it raised): judged here, on the same pages' evidence.
            left = [
                k for k in (*batch, *late) if k not in paged.judged and k[1] not in paged.unread
            ]
            if left:
                fired += await self.verdicts.fire_read(w, self._records(left), burst=burst)
            self.ledger.settle_incidents()
        self.verdicts.said(w, fired, burst=burst)
        unread = [k for keys in paged.unread.values() for k in keys]
        if failed is not None:
            self._failed(w, unread, failed)
            return
        for key in batch:
            w.failures.pop(key, None)
        if unread:
            # Not re-read (a moving cursor skipped it, or it is gone): never fired on its
            # old record; confirmed again later, by then most likely by GET, while the
            # reconciler confirms what a complete listing lacked. Later, not at once: a
            # fleet that vanished from listings must not be relisted in a loop.
            self._retry_later(w, unread)
        log.info(
            "confirm.listed",
            identity=w.health.name,
            due=len(batch),
            late=len(late),
            unread=len(unread),
            seconds=round(loop.time() - started, 3),
        )

    def _records(self, keys: list[ClockKey]) -> list[tuple[ChatRecord, Clock]]:
        """The due chats' records as they stand, with the clock each is due on."""
        items: list[tuple[ChatRecord, Clock]] = []
        for identity, chat_id, clock in keys:
            rec = self.store.get(identity, chat_id)
            if rec is not None:
                items.append((rec, "stalled" if clock == "stalled" else "status"))
        return items

    async def _one(self, w: Watched, key: ClockKey) -> None:
        with structlog.contextvars.bound_contextvars(identity=key[0], chat_id=key[1]):
            await self._one_bound(w, key)

    async def _one_bound(self, w: Watched, key: ClockKey) -> None:
        identity, chat_id, name = key
        clock: Clock = "stalled" if name == "stalled" else "status"
        if key in self.ledger.firing_clocks:
            return  # queued before its alert fired: nothing left to confirm
        rec = self.store.get(identity, chat_id)
        if rec is None or self.verdicts.past(w, rec, clock) is None:
            self.verdicts.rearm(rec)
            return
        self.counters["confirm_get"] += 1
        try:
            if await w.confirmer.reread(chat_id) == "gone":
                w.failures.pop(key, None)
                return
        except (CoderError, PayloadError) as exc:
            self._failed(w, [key], exc)
            return
        w.failures.pop(key, None)
        rec = self.store.get(identity, chat_id)
        if rec is not None:
            await self.verdicts.fire(w, [(rec, clock)])

    def _failed(self, w: Watched, keys: list[ClockKey], exc: Exception) -> None:
        """The re-read failed: nothing fires; try again later (the watcher noted why in
        the identity's health)."""
        self.counters["confirm_failed"] += 1
        log.warning("confirm.failed", identity=w.health.name, error=str(exc), chats=len(keys))
        error = str(exc)[:300]
        for key in keys:
            w.failures[key] = (w.failures.get(key, (0, ""))[0] + 1, error)
        self._retry_later(w, keys)

    def _retry_later(self, w: Watched, keys: list[ClockKey]) -> None:
        """Arm ``keys`` to come due again RETRY_CONFIRM_AFTER from now."""
        retry = w.health.server_clock.now() + RETRY_CONFIRM_AFTER  # timers keep server time
        for identity, chat_id, clock in keys:
            rec = self.store.get(identity, chat_id)
            if rec is not None:
                version = rec.version if clock == "status" else int((rec.updated_at or 0) * 1000)
                self.timers.arm((identity, chat_id, clock), retry, version)
        self.arming.wake()

    async def _persistently_failing(self, w: Watched, batch: list[ClockKey]) -> list[ClockKey]:
        """Fire the chats of ``batch`` whose re-reads failed UNCONFIRMED_AFTER times in a
        row with the evidence at hand (the record as last seen, still past budget),
        annotated with the error; return the rest to confirm as usual."""
        rest: list[ClockKey] = []
        stuck: list[tuple[ChatRecord, Clock]] = []
        errors: dict[ClockKey, str] = {}
        for key in batch:
            count, error = w.failures.get(key, (0, ""))
            rec = self.store.get(key[0], key[1])
            if count < UNCONFIRMED_AFTER or rec is None:
                if rec is None:
                    w.failures.pop(key, None)
                rest.append(key)
                continue
            del w.failures[key]
            errors[key] = error
            stuck.append((rec, "stalled" if key[2] == "stalled" else "status"))
        if stuck:
            self.counters["unconfirmed"] += len(stuck)
            log.warning("confirm.giving_up", identity=w.health.name, chats=len(stuck))
            await self.verdicts.fire(w, stuck, unconfirmed=errors)
        return rest
