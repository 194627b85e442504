"""Confirm before firing: one loop per identity re-reads its due chats.

A due chat is re-read by a rate-limited GET, or, when many are due together, by
one listing (a burst is let to settle first, so it takes one listing, not one per
slice; a chat that comes due while it runs is confirmed by it when a later page reads
it, :class:`LatePages`). Only what the re-read still shows past budget fires, in one synchronous
pass. Each loop runs under the task guard (:func:`watchd.kits.tasks.spawn`): a
confirmer that raises restarts the loop (counted, logged with its traceback) and
the chats of the failed batch come due again. Fires through the ledger; arms no
timer itself except the retry after a failed re-read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import structlog

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.observing import Observation
from watchd.config.watching import Budgets
from watchd.detection.alerts import Draft, Renderer
from watchd.detection.budgets import Clock, Overdue, past_budget
from watchd.detection.diagnosis import Facts
from watchd.detection.ledger import ClockKey, Ledger
from watchd.detection.timers import TimerHeap
from watchd.kits import logs
from watchd.kits.clock import WallClock
from watchd.kits.heap import collector_paused
from watchd.kits.tasks import spawn
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import Change, ChatRecord

log = logs.get("watchd.detection")

RETRY_CONFIRM_AFTER = 30.0
# Before confirming, let a burst of due chats finish coming due: wait until no new one
# arrived for SETTLE_QUIET and no deadline is imminent (at most SETTLE_MAX), so one listing
# confirms the whole burst.
SETTLE_QUIET = 0.05
SETTLE_LOOKAHEAD = 0.25  # a deadline this close still belongs to the burst
SETTLE_MAX = 1.0
# Workspace builds read for one burst's diagnosis; the rest use what is cached.
BURST_LOOKUPS = 20
# Alerts drafted between two looks at the loop while a listing's pages arrive. Small: the
# listing's own task passes several loop turns between two pages and can wait up to one
# step at each; at 100 a step (≈ 2.5 ms) the latency case's listing read 0.2-0.4 s
# longer with drafting than without, at 10 it did not.
DRAFT_STEP = 10


class Confirmer(Protocol):
    """What the detector needs from an identity's watcher."""

    async def get_chat(self, chat_id: str) -> Observation: ...

    async def relist(self, *, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
        """List the identity's chats into the store; ``on_page(ids read so far)`` after
        each page."""

    async def facts(self, record: ChatRecord, *, lookup: bool = True) -> Facts: ...


class Arming(Protocol):
    """What confirming needs back from the detector: changes a re-read found, a clock to
    arm again, a look at the heap."""

    def apply(self, identity: str, changes: Iterable[Change]) -> None: ...

    def arm(self, rec: ChatRecord) -> None: ...

    def wake(self) -> None: ...


@dataclass
class Watched:
    health: IdentityHealth
    confirmer: Confirmer
    budgets: Budgets
    labels: Mapping[str, str]
    pending: dict[ClockKey, float] = field(default_factory=dict)
    deferred: set[ClockKey] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # status → budget seconds (None: never stuck), filled on first use per status.
    limits: dict[str, float | None] = field(default_factory=dict)


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

    def __init__(self, confirming: Confirming, w: Watched, batch: Iterable[ClockKey]) -> None:
        self.confirming = confirming
        self.w = w
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
                    self._draft(key)
                await asyncio.sleep(0)

    def _draft(self, key: ClockKey) -> None:
        c, w = self.confirming, self.w
        rec = c.store.get(key[0], key[1])
        if rec is None:
            return
        clock: Clock = "stalled" if key[2] == "stalled" else "status"
        past = c._past(w, rec, clock)
        if past is None:
            return  # the fire pass says "unfounded" (and re-arms) as it always did
        since, fp = c._identified(w, rec, clock, past)
        if fp in c.ledger.firing:
            return
        draft = c.renderer.draft(
            rec,
            deployment=w.health.deployment,
            labels=w.labels,
            name=past.alert,
            limit=past.budget,
            since=since,
        )
        self.drafts[key] = Drafted(rec, past, since, fp, draft)


class Confirming:
    def __init__(
        self,
        *,
        store: ChatStore,
        timers: TimerHeap,
        ledger: Ledger,
        renderer: Renderer,
        arming: Arming,
        wall: WallClock,
        counters: dict[str, int],
        confirm_rate: float,
        listing_threshold: int,
        chat_failed: bool,
    ) -> None:
        self.store = store
        self.timers = timers
        self.ledger = ledger
        self.renderer = renderer
        self.arming = arming
        self.wall = wall
        self.counters = counters
        self.confirm_rate = confirm_rate
        self.listing_threshold = listing_threshold
        self.chat_failed = chat_failed

    def start(self, w: Watched) -> None:
        # Under the guard: a confirmer that raises restarts (counted, logged with its
        # traceback) instead of silently ending this identity's verdicts for good.
        w.task = spawn(f"confirm:{w.health.name}", lambda: self.loop(w), kind="confirm")

    def _past(self, w: Watched, rec: ChatRecord, clock: Clock) -> Overdue | None:
        """(alert name, time in clock, budget) when ``rec`` is past its budget now."""
        now = w.health.server_clock.now()
        return past_budget(w.budgets, rec, now=now, clock=clock, chat_failed=self.chat_failed)

    @staticmethod
    def _identified(w: Watched, rec: ChatRecord, clock: Clock, past: Overdue) -> tuple[float, str]:
        """The clock start an alert of ``rec`` past ``past`` states, and its fingerprint."""
        since = rec.updated_at if clock == "stalled" and rec.updated_at else rec.since
        return since, fingerprint(w.health.deployment, rec.chat_id, past.alert, rec.status, since)

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
                w.pending.clear()
                try:
                    if len(batch) >= self.listing_threshold:
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
            nxt = self.timers.next_deadline()
            if nxt is None or nxt - self.wall.now() >= SETTLE_LOOKAHEAD:
                return

    async def _by_listing(self, w: Watched, batch: list[ClockKey]) -> None:
        self.counters["confirm_listing"] += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        pages = LatePages(w.pending, batch)
        drafting = Drafting(self, w, batch)

        def seen(present: AbstractSet[str]) -> None:
            pages.seen(present)
            drafting.seen(present)

        # Under the guard, not restarted: a drafter that raised leaves fewer drafts, and
        # the fire pass renders the rest itself.
        drafter = spawn(
            f"draft:{w.health.name}", drafting.run, kind="confirm", eternal=False, restart=False
        )
        try:
            await w.confirmer.relist(on_page=seen)
        except (CoderError, PayloadError) as exc:
            self._failed(w, batch, exc)
            return
        finally:
            drafter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drafter
        # Chats that came due while the listing ran and that a later page read: this
        # listing confirms them too (no second listing a second later).
        late = [key for key in pages.confirmed if w.pending.pop(key, None) is not None]
        log.info(
            "confirm.listed",
            identity=w.health.name,
            due=len(batch),
            late=len(late),
            seconds=round(loop.time() - started, 3),
        )
        items: list[tuple[ChatRecord, Clock]] = []
        for identity, chat_id, clock in (*batch, *late):
            rec = self.store.get(identity, chat_id)
            if rec is not None:
                items.append((rec, "stalled" if clock == "stalled" else "status"))
        await self._verdicts(w, items, drafts=drafting.drafts)

    async def _one(self, w: Watched, key: ClockKey) -> None:
        with structlog.contextvars.bound_contextvars(identity=key[0], chat_id=key[1]):
            await self._one_bound(w, key)

    async def _one_bound(self, w: Watched, key: ClockKey) -> None:
        identity, chat_id, name = key
        clock: Clock = "stalled" if name == "stalled" else "status"
        if key in self.ledger.firing_clocks:
            return  # queued before its alert fired: nothing left to confirm
        rec = self.store.get(identity, chat_id)
        if rec is None or self._past(w, rec, clock) is None:
            self._rearm(rec)
            return
        self.counters["confirm_get"] += 1
        try:
            chat = await w.confirmer.get_chat(chat_id)
        except CoderError as exc:
            if exc.status == 404:
                gone = self.store.tombstone(identity, chat_id, reason="gone")
                if gone is not None:
                    self.arming.apply(identity, [gone])
                return
            self._failed(w, [key], exc)
            return
        except PayloadError as exc:
            self._failed(w, [key], exc)
            return
        change = self.store.observe(identity, chat, now=w.health.server_clock.now(), via="confirm")
        if change is not None:
            self.arming.apply(identity, [change])
        rec = self.store.get(identity, chat_id)
        if rec is not None:
            await self._verdicts(w, [(rec, clock)])

    def _failed(self, w: Watched, keys: list[ClockKey], exc: Exception) -> None:
        """The re-read failed: nothing fires; try again later; the identity says why."""
        self.counters["confirm_failed"] += 1
        w.health.last_error = f"confirmation failed: {exc}"
        log.warning("confirm.failed", identity=w.health.name, error=str(exc), chats=len(keys))
        retry = self.wall.now() + RETRY_CONFIRM_AFTER
        for identity, chat_id, clock in keys:
            rec = self.store.get(identity, chat_id)
            if rec is not None:
                version = rec.version if clock == "status" else int((rec.updated_at or 0) * 1000)
                self.timers.arm((identity, chat_id, clock), retry, version)
        self.arming.wake()

    def _rearm(self, rec: ChatRecord | None) -> None:
        if rec is not None:
            self.arming.arm(rec)
            self.arming.wake()

    async def _verdicts(
        self,
        w: Watched,
        items: list[tuple[ChatRecord, Clock]],
        *,
        drafts: Mapping[ClockKey, Drafted] | None = None,
    ) -> None:
        """Fire what the confirmation shows past budget.

        Facts are gathered first (a burst reads at most BURST_LOOKUPS workspace builds),
        then every alert is fired in one synchronous pass, so a burst reaches its
        aggregation groups together instead of trickling in over the lookups. ``drafts``
        (:class:`Drafting`) spare that pass the work already done for a chat whose record
        has not moved since its page re-read it.
        """
        firing = self.ledger.firing
        due: list[tuple[ChatRecord, Clock, Overdue, float, str, Draft | None]] = []
        for rec, clock in items:
            past = self._past(w, rec, clock)
            if past is None:
                self.counters["unfounded"] += 1
                self._rearm(rec)
                continue
            d = drafts.get((rec.identity, rec.chat_id, clock)) if drafts else None
            if (
                d is not None
                and d.rec is rec
                and d.past.alert == past.alert
                and d.past.budget == past.budget
            ):
                since, fp, draft = d.since, d.fp, d.draft
            else:
                since, fp = self._identified(w, rec, clock, past)
                draft = None
            if fp not in firing:
                due.append((rec, clock, past, since, fp, draft))
        if not due:
            return
        burst = len(due)
        looked: set[str] = set()
        facts: list[Facts] = []
        for rec, *_ in due:
            ws = rec.workspace_id
            lookup = burst == 1 or (ws is not None and ws not in looked)
            lookup = lookup and len(looked) < BURST_LOOKUPS
            if lookup and ws:
                looked.add(ws)
            try:
                got = await w.confirmer.facts(rec, lookup=lookup)
            except (CoderError, PayloadError) as exc:
                log.info(
                    "diagnosis.partial", identity=rec.identity, chat_id=rec.chat_id, error=str(exc)
                )
                got = Facts(record=rec)
            facts.append(got)
        fired: list[Alert] = []
        invalid = self.ledger.invalid
        draft_of = self.renderer.draft
        finish = self.renderer.finish
        template = self.renderer.link_template
        deployment = w.health.deployment

        def rendered() -> Iterator[tuple[Alert, str, str | None]]:
            # Lazily: each alert is fired before the next is rendered, so a fingerprint
            # fired earlier in the pass is seen as firing.
            for (rec, clock, past, since, fp, drafted), got in zip(due, facts, strict=True):
                # The record may have moved while we gathered facts.
                current = self.store.get(rec.identity, rec.chat_id)
                if current is None or current.status != rec.status or current.since != rec.since:
                    continue
                if fp in firing:
                    continue
                draft = drafted
                if draft is None or draft.template is not template:
                    # Not drafted during the listing (or under another link template):
                    # drafted now, so ``finish`` is Renderer.chat_alert either way.
                    draft = draft_of(
                        rec,
                        deployment=deployment,
                        labels=w.labels,
                        name=past.alert,
                        limit=past.budget,
                        since=since,
                    )
                alert = finish(
                    draft,
                    age=past.age,
                    facts=got,
                    fp=fp,
                    clock=clock,
                    measured_at=self.wall.now(),
                    invalid=invalid.get(rec.key) if invalid else None,
                    burst=burst,
                )
                fired.append(alert)
                yield alert, rec.identity, rec.chat_id

        # A burst allocates tens of thousands of acyclic objects in one synchronous pass.
        with collector_paused(burst > 1):
            self.ledger.fire_all(rendered(), quiet=burst > 1)
        if burst > 1 and fired:
            names = Counter(a.name for a in fired)
            log.warning(
                "alerts.firing",
                identity=w.health.name,
                count=len(fired),
                alertnames=dict(names),
                chat_ids=[a.labels.get("chat_id") for a in fired[:10]],
                note="went past their budgets together; one line per alert at debug level",
            )
