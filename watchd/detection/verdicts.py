"""The fire pass: what a confirmation re-read still shows past budget fires.

:class:`Verdicts` takes the chats a re-read (a GET, a listing's pages, or the evidence at
hand after failed re-reads) left in the store, keeps those still past budget and not
firing (the others are re-armed, counted as unfounded), gathers what explains each (a
burst reads at most BURST_LOOKUPS workspace builds), asks the watcher to learn the
capacity flag a listing never carries, then renders and fires the alerts. A GET's chat,
or a burst fired unconfirmed, fires in one synchronous pass (:meth:`Verdicts.fire`); a
burst that a listing confirms fires as its pages re-read it (:meth:`Verdicts.fire_read`,
driven by :class:`watchd.detection.paged.PagedFire`) while the dispatcher holds its
groups, so either way it reaches its aggregation groups together. Used by
:mod:`watchd.detection.confirming`; writes nothing but the ledger.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.errors import CoderError, PayloadError
from watchd.detection.alerts import Renderer, unconfirmed_alert, with_agent_evidence
from watchd.detection.budgets import Clock, Overdue, past_budget
from watchd.detection.diagnosis import Facts, to_read
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

# Alerts fired in one synchronous step of a burst fired as a listing's pages arrive: the
# listing's own task reads its next page between two steps. Small: it passes several loop
# turns between two pages and can wait up to one step at each; at 100 a step (≈ 2.5 ms)
# the latency case's listing read 0.2-0.4 s longer than without, at 10 it did not.
FIRE_STEP = 10

# A due chat in the fire pass: record, clock, verdict, clock start, fingerprint.
_Due = tuple[ChatRecord, Clock, Overdue, float, str]


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
        unconfirmed: Mapping[ClockKey, str] | None = None,
    ) -> None:
        """Fire what a GET shows past budget, or a burst with the evidence at hand
        (``unconfirmed``: what could not be re-read, by the error that kept it from being,
        said in the alert).

        Facts are gathered first (a burst reads at most BURST_LOOKUPS workspace builds),
        then every alert is fired in one synchronous pass, so a burst reaches its
        aggregation groups together instead of trickling in over the lookups.
        """
        due = self._overdue(w, items)
        if not due:
            return
        facts = await self._facts(w, due)
        # No await from here to the fire pass: a read cannot land before its alert fires.
        pending = self._ask_capacity(w, due)
        fired = self._fire_due(w, due, facts, burst=len(due), pending=pending, why=unconfirmed)
        self.said(w, fired, burst=len(due))

    async def read_builds(self, w: Watched, records: Sequence[ChatRecord]) -> None:
        """Before a burst's pages fire: the workspace builds that explain it, those of the
        BURST_LOOKUPS workspaces most of its chats are bound to (:func:`to_read`), each
        read once and remembered by the reader, so :meth:`fire_read` finds them without
        a read of its own. A read that fails is logged; its chats say their build was not
        read."""
        chosen = set(to_read(records, limit=BURST_LOOKUPS))
        for rec in records:
            ws = rec.workspace_id
            if ws is None or ws not in chosen:
                continue
            chosen.discard(ws)
            try:
                await w.confirmer.facts(rec, lookup=True)
            except (CoderError, PayloadError) as exc:
                log.info(
                    "diagnosis.partial", identity=rec.identity, workspace_id=ws, error=str(exc)
                )

    async def fire_read(
        self, w: Watched, items: list[tuple[ChatRecord, Clock]], *, burst: int
    ) -> list[Alert]:
        """Fire the chats of a ``burst`` that a listing's pages have just re-read, those
        still past budget, FIRE_STEP at a time (the listing reads its next page between
        two steps), with the facts the reader remembers (:meth:`read_builds` read the
        burst's workspaces first). Each is rendered from its record as it stands at its
        step. The caller settles the incidents they joined and says what fired
        (:meth:`said`) once the burst is in."""
        due = self._overdue(w, items)
        if not due:
            return []
        pending = self._ask_capacity(w, due)
        fired: list[Alert] = []
        # What the reader says without a read depends on the chat's workspace and status
        # only: asked once per pair, not once per chat.
        known: dict[tuple[str | None, str], Facts] = {}
        for at in range(0, len(due), FIRE_STEP):
            step = due[at : at + FIRE_STEP]
            facts: list[Facts] = []
            for d in step:
                rec = self.store.get(d[0].identity, d[0].chat_id) or d[0]
                got = known.get((rec.workspace_id, rec.status))
                if got is None:
                    got = known[(rec.workspace_id, rec.status)] = await self._read(w, rec)
                    facts.append(got)
                else:
                    facts.append(Facts(rec, got.build, got.quota, got.build_checked))
            fired += self._fire_due(w, step, facts, burst=burst, pending=pending, settle=False)
            await asyncio.sleep(0)
        return fired

    def said(self, w: Watched, fired: list[Alert], *, burst: int) -> None:
        """One line for a burst's alerts (each alone is a debug line)."""
        if burst > 1 and fired:
            log.warning(
                "alerts.firing",
                identity=w.health.name,
                count=len(fired),
                alertnames=dict(Counter(a.name for a in fired)),
                chat_ids=[a.labels.get("chat_id") for a in fired[:10]],
                note="went past their budgets together; one line per alert at debug level",
            )

    def _fire_due(
        self,
        w: Watched,
        due: list[_Due],
        facts: list[Facts],
        *,
        burst: int,
        pending: AbstractSet[str],
        why: Mapping[ClockKey, str] | None = None,
        settle: bool = True,
    ) -> list[Alert]:
        """Render and fire ``due`` in one synchronous pass; the alerts that fired."""
        fired: list[Alert] = []

        def rendered() -> Iterator[tuple[Alert, str, str | None]]:
            # Lazily: each alert is fired before the next is rendered, so a fingerprint
            # fired earlier in the pass is seen as firing.
            for item, got in zip(due, facts, strict=True):
                alert = self._render(w, item, got, burst=burst, pending=pending, why=why)
                if alert is not None:
                    fired.append(alert)
                    yield alert, item[0].identity, item[0].chat_id

        # A burst allocates tens of thousands of acyclic objects in one synchronous pass.
        with collector_paused(burst > 1):
            self.ledger.fire_all(rendered(), quiet=burst > 1, settle=settle)
        return fired

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
        """One due chat's alert, from its record as it stands now, or None when its status
        or clock start moved since the re-read or its fingerprint fired earlier in the
        pass (``why``: the errors of chats fired unconfirmed, by clock key)."""
        rec, clock, past, since, fp = item
        current = self.store.get(rec.identity, rec.chat_id)
        if current is None or current.status != rec.status or current.since != rec.since:
            return None
        if fp in self.ledger.firing:
            return None
        invalid = self.ledger.invalid
        alert = self.renderer.chat_alert(
            current,
            deployment=w.health.deployment,
            labels=w.labels,
            name=past.alert,
            limit=past.budget,
            since=since,
            age=past.age,
            facts=got,
            fp=fp,
            clock=clock,
            measured_at=self.wall.now(),
            invalid=invalid.get(rec.key) if invalid else None,
            burst=burst,
            # A capacity read that landed before this step: the flag is known already.
            cause_pending=rec.chat_id in pending and current.queued_for_capacity is None,
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

    def _overdue(self, w: Watched, items: list[tuple[ChatRecord, Clock]]) -> list[_Due]:
        """The re-read chats still past budget and not firing; the others are re-armed
        (counted as unfounded)."""
        firing = self.ledger.firing
        due: list[_Due] = []
        for rec, clock in items:
            past = self.past(w, rec, clock)
            if past is None:
                self.counters["unfounded"] += 1
                self.rearm(rec)
                continue
            since, fp = identified(w, rec, clock, past)
            if fp not in firing:
                due.append((rec, clock, past, since, fp))
        return due

    async def _facts(self, w: Watched, due: list[_Due]) -> list[Facts]:
        """What explains each due chat. A burst reads at most BURST_LOOKUPS workspace
        builds, those of the workspaces most of its chats are bound to (:func:`to_read`); the
        chats bound to one workspace share its one read (the reader remembers it), and
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
            facts.append(await self._read(w, rec, lookup=lookup))
        return facts

    @staticmethod
    async def _read(w: Watched, rec: ChatRecord, *, lookup: bool = False) -> Facts:
        """One chat's facts (``lookup``: its workspace's build may be read; otherwise only
        what the reader remembers); on a failed read, only the record."""
        try:
            got = await w.confirmer.facts(rec, lookup=lookup)
        except (CoderError, PayloadError) as exc:
            log.info(
                "diagnosis.partial", identity=rec.identity, chat_id=rec.chat_id, error=str(exc)
            )
            return Facts(record=rec)
        return Facts(record=rec, build=got.build, quota=got.quota, build_checked=got.build_checked)

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
