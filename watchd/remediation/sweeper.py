"""The sweeper: one pass after another over the ready identities' chats, and the
actions on one chat (interrupt, wait to settle, archive, the invalid-state answer),
within the identity's action rate and ``concurrency``; progress is kept in SQLite so
a restart never acts twice. The package docstring says what the sweep does and why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from msgspec.structs import replace as amend

from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.observing import Observation
from watchd.config.sweep import SweepConfig, SweepPolicy
from watchd.kits import logs
from watchd.kits.ratelimit import RateLimiter
from watchd.remediation.announcing import Ledger, announcement, expire_announcements
from watchd.remediation.archiving import OWNER_EDITING, archive
from watchd.remediation.audit import AuditLog
from watchd.remediation.families import Kin, Member
from watchd.remediation.policies import LEFT_ALONE, compile_policies, match_policy
from watchd.remediation.progress import SweepEntry, SweepProgress
from watchd.remediation.recovering import recover
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import ChatRecord
from watchd.store.sqlite import StateFile

log = logs.get("watchd.sweep")

ACTIVE = frozenset({"running", "pending", "interrupting"})
SETTLED = frozenset({"waiting", "error", "completed"})
MAX_ATTEMPTS = 3
# "healed": reconcile-invalid found the chat consistent again; this episode is over.
# "owner_editing": left alone for this episode, not a failure.
TERMINAL = frozenset({"interrupted", "archived", "gave_up", "planned", "healed", "owner_editing"})
# What /status and watchd_sweep_total count.
OUTCOMES: tuple[str, ...] = ("planned", "interrupted", "archived", "gave_up", "invalid")
OUTCOMES += ("reconciled", "healed", "owner_editing", "blocked", "errors")
# Taken up again on later passes: sent an interrupt, a failure to retry, an archive its
# family holds up (that one only once the store shows the family idle).
CONTINUED = ("interrupt_sent", "retry", "blocked")
# "invalid": a mutation answered 409 "Chat is in an invalid state."; waits for the
# operator (or reconcile_invalid) and is not retried in a loop.
WAITING = frozenset({"invalid"})


class Sweeper:
    """One sweep pass after another: match, then act on each chat within its limits."""

    def __init__(
        self,
        *,
        config: SweepConfig,
        store: ChatStore,
        health: Mapping[str, IdentityHealth],
        clients: Callable[[str], CoderClient | None],
        db: StateFile,
        ledger: Ledger,
        audit_path: Path,
        labels: Callable[[str], Mapping[str, str]],
        on_invalid: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.config = config
        # Told (identity, chat id, coderd's message) when a chat's state is invalid.
        self.on_invalid = on_invalid
        self.store = store
        self.health = health
        self.clients = clients
        self.progress = db.part(SweepProgress)
        # Where ChatSwept fires and resolves: the detector's persisted set of firing alerts,
        # so an announcement's resolve survives a restart (a timer would not).
        self.ledger = ledger
        self.audit = AuditLog(audit_path)
        self.labels = labels
        # The audit's last lines, for /status (a reload carries them over).
        self.recent = self.audit.recent
        self.counts = dict.fromkeys(OUTCOMES, 0)
        self._limiters: dict[str, RateLimiter] = {}
        self._slots = asyncio.Semaphore(config.concurrency)
        self._policies = compile_policies(config)
        # Each identity's parent links, indexed once per pass (families.Kin).
        self._kin: dict[str, Kin] = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        expire_announcements(self.ledger, announce_for=self.config.announce_for)
        self._kin.clear()  # the store moved since the last pass
        jobs = []
        # Chats already taken up by an earlier pass (or an earlier process) come first.
        for entry in (e for state in CONTINUED for e in self.progress.in_state(state)):
            policy = next((p for p, _ in self._policies if p.name == entry.policy), None)
            if policy is None or not self._ready(entry.identity):
                continue
            if entry.state == "blocked" and self._held(entry.identity, entry.chat_id):
                continue  # its family is still busy: no reads until it looks idle
            jobs.append(self._continue(entry, policy))
        for identity, h in self.health.items():
            if not h.ready:
                continue
            now = h.server_clock.now()
            for rec in self.store.records(identity):
                policy = self._match(rec, now)
                if policy is not None:
                    jobs.append(self._start(rec, policy))
        if jobs:
            await asyncio.gather(*jobs)

    def _held(self, identity: str, chat_id: str) -> Member | None:
        """The busy member the store shows in the family an archive of the chat covers."""
        kin = self._kin.get(identity)
        if kin is None:
            kin = self._kin[identity] = Kin(self.store, identity)
        return kin.blocker(chat_id)

    def _ready(self, identity: str) -> bool:
        h = self.health.get(identity)
        return h is not None and h.ready

    def _match(self, rec: ChatRecord, now: float) -> SweepPolicy | None:
        return match_policy(self._policies, rec, now=now, labels=self.labels(rec.identity))

    # -- one chat ---------------------------------------------------------------------

    async def _start(self, rec: ChatRecord, policy: SweepPolicy) -> None:
        entry = self.progress.get(rec.identity, rec.chat_id, policy.name)
        if entry is not None and entry.since == rec.since and not self.config.dry_run:
            if entry.state == "planned":
                entry = None  # a dry run's plan is not an action
            elif entry.state in WAITING and self.config.reconcile_invalid:
                entry = None  # opted in since: try again
        if entry is not None and (entry.state not in TERMINAL or entry.since == rec.since):
            return  # in progress, or this episode was already handled
        entry = SweepEntry(rec.identity, rec.chat_id, policy.name, rec.since, "new", 0, time.time())
        if self.config.dry_run:
            would = (
                policy.action if rec.status in ACTIVE or policy.action == "archive" else "archive"
            )
            held = self._held(rec.identity, rec.chat_id)
            detail = f"would {would} ({rec.status} for {self._age(rec):.0f}s, policy {policy.name})"
            if held is not None and policy.action != "interrupt":
                detail += f"; the archive would wait: {held.says()}"
            self._record(
                entry, "planned", rec=rec, policy=policy, action=would, dry_run=True, detail=detail
            )
            return
        async with self._slots:
            await self._act(entry, rec, policy)

    async def _continue(self, entry: SweepEntry, policy: SweepPolicy) -> None:
        rec = self.store.get(entry.identity, entry.chat_id)
        async with self._slots:
            await self._act(entry, rec, policy)

    async def _act(self, entry: SweepEntry, rec: ChatRecord | None, policy: SweepPolicy) -> None:
        client = self.clients(entry.identity)
        if client is None:
            return
        try:
            chat = await client.get_chat(entry.chat_id)
        except (CoderError, PayloadError) as exc:
            if isinstance(exc, CoderError) and exc.status == 404:
                self._record(
                    entry, "gave_up", rec=rec, policy=policy, action="none", detail="chat is gone"
                )
            else:
                self._retry(entry, rec, policy, f"read failed: {exc}")
            return
        status = chat.status
        if entry.state == "blocked" and status not in SETTLED:
            detail = f"left alone: chat is {status} again while its archive waited"
            self._record(entry, "gave_up", rec=rec, policy=policy, action="none", detail=detail)
            return
        if status in LEFT_ALONE or chat.archived:
            said = "archived" if chat.archived else status
            editing = said == "paused"  # the owner's, not a failure
            self._record(
                entry,
                "owner_editing" if editing else "gave_up",
                rec=rec,
                policy=policy,
                action="none",
                detail=f"left alone: chat is {said}" + (f" ({OWNER_EDITING})" if editing else ""),
            )
            return
        wants_interrupt = policy.action in ("interrupt", "interrupt_then_archive")
        if wants_interrupt and status in ACTIVE and entry.state != "interrupt_sent":
            sent = await self._interrupt(entry, rec, policy, status, client=client)
            if sent is None:
                return
            entry, status = sent
            if status not in SETTLED:
                return
        if policy.action == "interrupt":
            self._record(
                entry,
                "interrupted",
                rec=rec,
                policy=policy,
                action="none",
                detail=f"nothing to interrupt: chat is {status}",
            )
            return
        if status not in SETTLED:
            if (
                entry.state == "interrupt_sent"
                and time.time() - entry.updated > self.config.settle_timeout
            ):
                self._record(
                    entry,
                    "gave_up",
                    rec=rec,
                    policy=policy,
                    action="archive",
                    detail=f"did not settle within {self.config.settle_timeout:.0f}s "
                    f"(still {status}): the run may be wedged; stop its "
                    "workspace",
                )
            return
        # The chat as it is now (an interrupt above may have settled it since the read).
        chat = chat if chat.status == status else amend(chat, status=status)
        await self._archive(entry, rec, policy, chat=chat, client=client)

    async def _interrupt(
        self,
        entry: SweepEntry,
        rec: ChatRecord | None,
        policy: SweepPolicy,
        status: str,
        *,
        client: CoderClient,
    ) -> tuple[SweepEntry, str] | None:
        """Interrupt an active chat: its entry marked interrupt_sent and the status after,
        or None when that ended this episode (interrupt only, invalid, a retry)."""
        await self._limiter(entry.identity).acquire()
        try:
            after = await client.interrupt(entry.chat_id)
            status = after.status if after is not None else status
            detail = f"interrupt accepted ({status})"
        except CoderError as exc:
            if exc.invalid_state:
                await self._invalid(entry, rec, policy, exc, client=client)
                return None
            if exc.status != 409:
                self._retry(entry, rec, policy, f"interrupt failed: {exc}")
                return None
            detail = "nothing to interrupt (409)"
        if policy.action == "interrupt":
            self._record(
                entry, "interrupted", rec=rec, policy=policy, action="interrupt", detail=detail
            )
            return None
        entry = replace(entry, state="interrupt_sent", updated=time.time())
        self.progress.put(entry)
        self.audit.write(
            entry, action="interrupt", rec=rec, policy=policy.name, dry_run=False, detail=detail
        )
        return entry, status

    async def _archive(
        self,
        entry: SweepEntry,
        rec: ChatRecord | None,
        policy: SweepPolicy,
        *,
        chat: Observation,
        client: CoderClient,
    ) -> None:
        acquire = self._limiter(entry.identity).acquire
        out = await archive(client, self.store, entry.identity, chat, acquire=acquire)
        if out.error is not None:
            await self._invalid(entry, rec, policy, out.error, client=client, target=out.target)
        elif out.state == "retry":
            self._retry(entry, rec, policy, out.detail)
        elif not (out.state == entry.state == "blocked" and out.detail == entry.detail):
            # (Still held up by the same member: said already.)
            action = "archive" if out.state == "archived" else "none"
            self._record(entry, out.state, rec=rec, policy=policy, action=action, detail=out.detail)

    async def _invalid(
        self,
        entry: SweepEntry,
        rec: ChatRecord | None,
        policy: SweepPolicy,
        exc: CoderError,
        *,
        client: CoderClient,
        target: str | None = None,
    ) -> None:
        """409 "Chat is in an invalid state.": say so (audit, stuck alerts); recover only
        when opted in (:func:`recover`); never count it as done."""
        if self.on_invalid is not None:
            self.on_invalid(entry.identity, entry.chat_id, exc.message)
        out = await recover(
            client,
            target or entry.chat_id,
            said=f"execution state invalid: coderd answered 409 {exc.message!r}",
            opted_in=self.config.reconcile_invalid,
            acquire=self._limiter(entry.identity).acquire,
        )
        if out.state == "retry":
            self._retry(entry, rec, policy, out.detail)
        elif out.state == "reconciled":
            self.counts["reconciled"] += 1
            # Now in `error`: later passes treat it like any other chat.
            entry = replace(entry, state="retry", updated=time.time(), detail="reconciled")
            self.progress.put(entry)
            self.audit.write(
                entry,
                action="reconcile_invalid",
                rec=rec,
                policy=policy.name,
                dry_run=False,
                detail=out.detail,
            )
        else:
            self._record(entry, out.state, rec=rec, policy=policy, action="none", detail=out.detail)

    def _retry(
        self, entry: SweepEntry, rec: ChatRecord | None, policy: SweepPolicy, detail: str
    ) -> None:
        attempts = entry.attempts + 1
        self.counts["errors"] += 1
        if attempts >= MAX_ATTEMPTS:
            self._record(
                replace(entry, attempts=attempts),
                "gave_up",
                rec=rec,
                policy=policy,
                action="none",
                detail=f"gave up after {attempts} tries: {detail}",
            )
            return
        state = "interrupt_sent" if entry.state == "interrupt_sent" else "retry"
        self.progress.put(replace(entry, state=state, attempts=attempts, detail=detail))
        log.info(
            "sweep.retry_later",
            identity=entry.identity,
            chat_id=entry.chat_id,
            detail=detail,
            attempts=attempts,
        )

    # -- bookkeeping ------------------------------------------------------------------

    def _record(
        self,
        entry: SweepEntry,
        state: str,
        *,
        rec: ChatRecord | None,
        policy: SweepPolicy,
        action: str,
        detail: str,
        dry_run: bool = False,
    ) -> None:
        entry = replace(entry, state=state, updated=time.time(), detail=detail)
        self.progress.put(entry)
        self.counts[state if state in self.counts else "errors"] += 1
        self.audit.write(
            entry, action=action, rec=rec, policy=policy.name, dry_run=dry_run, detail=detail
        )
        if action == "none" and state not in ("gave_up", "blocked"):
            return
        # Announced as ChatSwept: every action, every chat given up on, every archive its
        # family holds up (naming the member).
        h = self.health.get(entry.identity)
        alert = announcement(
            entry,
            rec=rec,
            policy=policy.name,
            action=action,
            dry_run=dry_run,
            detail=detail,
            deployment=h.deployment if h else "",
            labels=self.labels(entry.identity),
        )
        self.ledger.raise_alert(alert, identity=entry.identity)

    def _limiter(self, identity: str) -> RateLimiter:
        lim = self._limiters.get(identity)
        if lim is None:
            per_second = self.config.actions_per_minute / 60.0
            lim = self._limiters[identity] = RateLimiter(rate=per_second, burst=1)
        return lim

    def _age(self, rec: ChatRecord) -> float:
        h = self.health.get(rec.identity)
        return (h.server_clock.now() if h else time.time()) - rec.since
