"""The fire pass: what a confirmation re-read still shows past budget fires, together.

:class:`Verdicts` takes the chats a re-read (a GET, a listing, or the evidence at hand
after failed re-reads) left in the store, keeps those still past budget and not firing
(the others are re-armed, counted as unfounded), gathers what explains each (a burst
reads at most BURST_LOOKUPS workspace builds), asks the watcher to learn the capacity
flag a listing never carries, then renders and fires every alert in one synchronous
pass, so a burst reaches its aggregation groups together. Used by
:mod:`watchd.detection.confirming`; writes nothing but the ledger.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.errors import CoderError, PayloadError
from watchd.detection.alerts import Draft, Renderer, unconfirmed_alert, with_agent_evidence
from watchd.detection.budgets import Clock, Overdue, past_budget
from watchd.detection.diagnosis import Facts, to_read
from watchd.detection.drafting import Drafted
from watchd.detection.ledger import ClockKey, Ledger
from watchd.detection.watched import Arming, Watched
from watchd.kits import logs
from watchd.kits.clock import WallClock
from watchd.kits.heap import collector_paused
from watchd.store.chats import ChatStore
from watchd.store.records import ChatRecord
from watchd.store.timelines import Timelines

log = logs.get("watchd.detection")

# Workspace builds read for one burst's diagnosis (the workspaces most of its chats are
# bound to); chats bound to one workspace share its read; the rest use what is cached.
BURST_LOOKUPS = 20

# How far the clock estimate may have moved back between a batch coming due and its
# re-read and the batch still be judged at the deadline it came due by: the resolution
# of the HTTP Date headers the estimate rests on. A larger correction (a proxy's clock
# found out) is believed: the chats are judged on it.
ESTIMATE_SLACK = 1.0

# A due chat in the fire pass: record, clock, verdict, clock start, fingerprint, draft.
_Due = tuple[ChatRecord, Clock, Overdue, float, str, "Draft | None"]


def identified(w: Watched, rec: ChatRecord, clock: Clock, past: Overdue) -> tuple[float, str]:
    """The clock start an alert of ``rec`` past ``past`` states, and its fingerprint."""
    since = rec.updated_at if clock == "stalled" and rec.updated_at else rec.since
    return since, fingerprint(w.health.deployment, rec.chat_id, past.alert, rec.status, since)


class Verdicts:
    def __init__(
        self,
        *,
        store: ChatStore,
        ledger: Ledger,
        renderer: Renderer,
        arming: Arming,
        wall: WallClock,
        counters: dict[str, int],
        chat_failed: bool,
        timelines: Timelines | None = None,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.renderer = renderer
        self.arming = arming
        self.wall = wall
        self.counters = counters
        self.chat_failed = chat_failed
        self.timelines = timelines

    def past(self, w: Watched, rec: ChatRecord, clock: Clock) -> Overdue | None:
        """(alert name, time in clock, budget) when ``rec`` is past its budget now: judged
        no earlier than the deadline its batch came due by (:attr:`Watched.due_by`) where
        that is within ESTIMATE_SLACK of the clock estimate now."""
        now = w.health.server_clock.now()
        now = max(now, min(w.due_by, now + ESTIMATE_SLACK))
        return past_budget(w.budgets, rec, now=now, clock=clock, chat_failed=self.chat_failed)

    def rearm(self, rec: ChatRecord | None) -> None:
        if rec is not None:
            self.arming.arm(rec)
            self.arming.wake()

    async def fire(
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
        (:class:`~watchd.detection.drafting.Drafting`) spare that pass the work already
        done for a chat whose record has not moved since its page re-read it.
        """
        due = self._overdue(w, items, drafts)
        if not due:
            return
        burst = len(due)
        facts = await self._facts(w, due)
        # No await from here to the fire pass: a read cannot land before its alert fires.
        pending = self._ask_capacity(w, due)
        fired: list[Alert] = []

        def rendered() -> Iterator[tuple[Alert, str, str | None]]:
            # Lazily: each alert is fired before the next is rendered, so a fingerprint
            # fired earlier in the pass is seen as firing.
            for item, got in zip(due, facts, strict=True):
                alert = self._render(w, item, got, burst=burst, pending=pending, why=unconfirmed)
                if alert is not None:
                    fired.append(alert)
                    yield alert, item[0].identity, item[0].chat_id

        # A burst allocates tens of thousands of acyclic objects in one synchronous pass.
        with collector_paused(burst > 1):
            self.ledger.fire_all(rendered(), quiet=burst > 1)
        if burst > 1 and fired:
            log.warning(
                "alerts.firing",
                identity=w.health.name,
                count=len(fired),
                alertnames=dict(Counter(a.name for a in fired)),
                chat_ids=[a.labels.get("chat_id") for a in fired[:10]],
                note="went past their budgets together; one line per alert at debug level",
            )

    def _render(
        self,
        w: Watched,
        item: _Due,
        got: Facts,
        *,
        burst: int,
        pending: AbstractSet[str],
        why: Mapping[ClockKey, str] | None,
    ) -> Alert | None:
        """One due chat's alert, or None when its record moved while the facts were
        gathered or its fingerprint fired earlier in the pass (``why``: the errors of
        chats fired unconfirmed, by clock key)."""
        rec, clock, past, since, fp, draft = item
        current = self.store.get(rec.identity, rec.chat_id)
        if current is None or current.status != rec.status or current.since != rec.since:
            return None
        if fp in self.ledger.firing:
            return None
        if draft is None or draft.template is not self.renderer.link_template:
            # Not drafted during the listing (or under another link template): drafted
            # now, so ``finish`` is Renderer.chat_alert either way.
            draft = self.renderer.draft(
                rec,
                deployment=w.health.deployment,
                labels=w.labels,
                name=past.alert,
                limit=past.budget,
                since=since,
            )
        invalid = self.ledger.invalid
        alert = self.renderer.finish(
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
        if why:
            error = why.get((rec.identity, rec.chat_id, clock))
            if error is not None:
                alert = unconfirmed_alert(alert, error)
        return alert

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
            past = self.past(w, rec, clock)
            if past is None:
                self.counters["unfounded"] += 1
                self.rearm(rec)
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
                since, fp = identified(w, rec, clock, past)
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
