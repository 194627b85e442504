"""Confirm before firing: one loop per identity re-reads its due chats.

A due chat is re-read by a rate-limited GET, or, when many are due together, by
one listing (a burst is let to settle first, so it takes one listing, not one per
slice; a chat that comes due while it runs is confirmed by it when a later page reads
it, :class:`LatePages`). Only what the re-read still shows past budget fires, in one synchronous
pass. Re-reads are *asked* of the identity's watcher through the
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
from collections import Counter
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet

import structlog

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.errors import CoderError, PayloadError
from watchd.detection.alerts import Draft, Renderer, unconfirmed_alert, with_agent_evidence
from watchd.detection.budgets import Clock, Overdue, past_budget
from watchd.detection.diagnosis import Facts, to_read
from watchd.detection.drafting import Drafted, Drafting, LatePages
from watchd.detection.ledger import ClockKey, Ledger
from watchd.detection.timers import ServerTimers
from watchd.detection.watched import Arming, Watched
from watchd.kits import logs
from watchd.kits.clock import WallClock
from watchd.kits.heap import collector_paused
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
# Workspace builds read for one burst's diagnosis (the workspaces most of its chats are
# bound to); chats bound to one workspace share its read; the rest use what is cached.
BURST_LOOKUPS = 20


# A due chat in the fire pass: record, clock, verdict, clock start, fingerprint, draft.
_Due = tuple[ChatRecord, Clock, Overdue, float, str, "Draft | None"]


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
        self.counters["confirm_listing"] += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        pages = LatePages(w.pending, batch)
        drafting = Drafting(lambda key: self._draft(w, key), batch)

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
        for key in batch:
            w.failures.pop(key, None)
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

    def _draft(self, w: Watched, key: ClockKey) -> Drafted | None:
        """A due chat's alert drafted from its record as a page re-read it, or None when
        the chat is no longer past budget (the fire pass says "unfounded") or fires."""
        rec = self.store.get(key[0], key[1])
        if rec is None:
            return None
        clock: Clock = "stalled" if key[2] == "stalled" else "status"
        past = self._past(w, rec, clock)
        if past is None:
            return None
        since, fp = self._identified(w, rec, clock, past)
        if fp in self.ledger.firing:
            return None
        draft = self.renderer.draft(
            rec,
            deployment=w.health.deployment,
            labels=w.labels,
            name=past.alert,
            limit=past.budget,
            since=since,
        )
        return Drafted(rec, past, since, fp, draft)

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
            if await w.confirmer.reread(chat_id) == "gone":
                w.failures.pop(key, None)
                return
        except (CoderError, PayloadError) as exc:
            self._failed(w, [key], exc)
            return
        w.failures.pop(key, None)
        rec = self.store.get(identity, chat_id)
        if rec is not None:
            await self._verdicts(w, [(rec, clock)])

    def _failed(self, w: Watched, keys: list[ClockKey], exc: Exception) -> None:
        """The re-read failed: nothing fires; try again later (the watcher noted why in
        the identity's health)."""
        self.counters["confirm_failed"] += 1
        log.warning("confirm.failed", identity=w.health.name, error=str(exc), chats=len(keys))
        retry = self.wall.now() + w.health.server_clock.offset + RETRY_CONFIRM_AFTER  # server time
        error = str(exc)[:300]
        for key in keys:
            w.failures[key] = (w.failures.get(key, (0, ""))[0] + 1, error)
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
            await self._verdicts(w, stuck, unconfirmed=errors)
        return rest

    def _rearm(self, rec: ChatRecord | None) -> None:
        if rec is not None:
            self.arming.arm(rec)
            self.arming.wake()

    def _overdue(
        self,
        w: Watched,
        items: list[tuple[ChatRecord, Clock]],
        drafts: Mapping[ClockKey, Drafted] | None,
    ) -> list[_Due]:
        """The re-read chats still past budget and not firing, each with its draft where
        the draft still fits; the others are re-armed (counted as unfounded)."""
        firing = self.ledger.firing
        due: list[_Due] = []
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
        return due

    async def _facts(self, w: Watched, due: list[_Due]) -> list[Facts]:
        """What explains each due chat. A burst reads at most BURST_LOOKUPS workspace
        builds, those of the workspaces most of its chats are bound to (:func:`to_read`);
        the chats bound to one workspace share its one read (the reader remembers it), and
        a workspace whose read failed is not read again in this burst. A chat alone reads
        its own."""
        chosen = to_read((d[0] for d in due), limit=BURST_LOOKUPS) if len(due) > 1 else None
        read: set[str] = set()
        facts: list[Facts] = []
        for rec, *_ in due:
            ws = rec.workspace_id
            lookup = chosen is None or (ws is not None and ws in chosen and ws not in read)
            if lookup and ws:
                read.add(ws)
            try:
                got = await w.confirmer.facts(rec, lookup=lookup)
            except (CoderError, PayloadError) as exc:
                log.info(
                    "diagnosis.partial", identity=rec.identity, chat_id=rec.chat_id, error=str(exc)
                )
                facts.append(Facts(record=rec))
                continue
            facts.append(
                Facts(record=rec, build=got.build, quota=got.quota, build_checked=got.build_checked)
            )
        return facts

    @staticmethod
    def _ask_capacity(w: Watched, due: list[_Due]) -> AbstractSet[str]:
        """A listing never carries ``queued_for_capacity`` (only a GET does): the running
        chats it confirmed are asked a GET each, paced by the watcher, so the likeliest
        cause of a burst (the deployment's concurrency cap) is learned; what the watcher
        accepted to read has its cause pending until then (:meth:`Ledger.recause`)."""
        ask = [
            rec.chat_id
            for rec, *_ in due
            if rec.status == "running" and rec.queued_for_capacity is None
        ]
        return w.confirmer.learn_capacity(ask) if ask else frozenset()

    async def _verdicts(
        self,
        w: Watched,
        items: list[tuple[ChatRecord, Clock]],
        *,
        drafts: Mapping[ClockKey, Drafted] | None = None,
        unconfirmed: Mapping[ClockKey, str] | None = None,
    ) -> None:
        """Fire what the confirmation shows past budget (``unconfirmed``: what could not
        be re-read, by the error that kept it from being, said in the alert).

        Facts are gathered first (a burst reads at most BURST_LOOKUPS workspace builds),
        then every alert is fired in one synchronous pass, so a burst reaches its
        aggregation groups together instead of trickling in over the lookups. ``drafts``
        (:class:`Drafting`) spare that pass the work already done for a chat whose record
        has not moved since its page re-read it.
        """
        due = self._overdue(w, items, drafts)
        if not due:
            return
        burst = len(due)
        facts = await self._facts(w, due)
        # No await from here to the fire pass: a read cannot land before its alert fires.
        pending = self._ask_capacity(w, due)
        firing = self.ledger.firing
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
                    cause_pending=rec.chat_id in pending,
                )
                if self.timelines is not None and (
                    said := self.timelines.agent_said(rec.chat_id, now=rec.since + past.age)
                ):
                    alert = with_agent_evidence(alert, said)
                if unconfirmed:
                    error = unconfirmed.get((rec.identity, rec.chat_id, clock))
                    if error is not None:
                        alert = unconfirmed_alert(alert, error)
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
