"""The opt-in sweep: interrupt and archive chats that policies say are done for.

Off by default, and dry-run by default when on. Each pass matches every ready
identity's chats against the policies (first match wins) on the server's
clock. ``requires_action`` chats are never touched. Interrupt is
asynchronous: a chat is archived only once it settled (``waiting``/``error``),
within ``settle_timeout``; a subagent's archive goes to its root. 409s are
answers, not failures to retry in a loop: "nothing to interrupt" ends the
interrupt, "still active" waits for a later pass (three tries), and "Chat is
in an invalid state." is its own answer: the chat is never recorded as
interrupted or archived, stuck alerts say so, and only with
``reconcile_invalid`` opted in is ``POST …/reconcile-invalid`` called (once,
rate-bounded, dry-run respected) before the chat is handled normally.
``orchestrator`` chats (one long-lived chat per user) are left alone unless
a policy names them with a ``mode`` matcher. Every decision and action goes
to the audit log (JSON lines), to ``/status``, and through the alert
pipeline as ChatSwept; progress lives in SQLite so a restart mid-sweep never
acts twice. A dry run's plan is not an action: it never blocks a real run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.config.sweep import SweepConfig, SweepPolicy
from watchd.detection.health import IdentityHealth
from watchd.kits import logs
from watchd.kits.matchers import Matcher, all_match, parse_matchers
from watchd.kits.ratelimit import RateLimiter
from watchd.store.chats import ChatRecord, ChatStore
from watchd.store.persistence import StateDB, SweepEntry

log = logs.get("watchd.sweep")

ACTIVE = frozenset({"running", "pending", "interrupting"})
SETTLED = frozenset({"waiting", "error", "completed", "paused"})
MAX_ATTEMPTS = 3
TERMINAL = frozenset({"interrupted", "archived", "gave_up", "planned"})
# "invalid": a mutation answered 409 "Chat is in an invalid state."; waits for the
# operator (or reconcile_invalid) and is not retried in a loop.
WAITING = frozenset({"invalid"})
AUDIT_KEEP = 200


class Ledger(Protocol):
    """What the sweep needs of the detector's firing-alert ledger."""

    @property
    def firing(self) -> Mapping[str, Alert]: ...

    def raise_alert(self, alert: Alert, *, identity: str) -> None: ...

    def clear_alert(self, fp: str, *, why: str) -> None: ...


def compile_policies(config: SweepConfig) -> list[tuple[SweepPolicy, tuple[Matcher, ...]]]:
    return [(p, parse_matchers(p.matchers)) for p in config.policies]


def match_policy(
    policies: list[tuple[SweepPolicy, tuple[Matcher, ...]]],
    rec: ChatRecord,
    *,
    now: float,
    labels: Mapping[str, str],
) -> SweepPolicy | None:
    """The first policy that applies to a chat now (never for requires_action). Pure."""
    if rec.status == "requires_action":
        return None
    all_labels = {
        **labels,
        "identity": rec.identity,
        "owner": rec.owner,
        "status": rec.status,
        "chat_id": rec.chat_id,
        "mode": rec.mode,
        **{f"chat_label_{k}": v for k, v in rec.labels},
    }
    orchestrator = rec.mode == "orchestrator"
    for policy, matchers in policies:
        if orchestrator and not any(m.name == "mode" for m in matchers):
            continue  # an orchestrator is swept only by a policy that names it
        if (
            rec.status in policy.status
            and now - rec.since >= policy.older_than
            and all_match(matchers, all_labels)
        ):
            return policy
    return None


class Sweeper:
    def __init__(
        self,
        *,
        config: SweepConfig,
        store: ChatStore,
        health: Mapping[str, IdentityHealth],
        clients: Callable[[str], CoderClient | None],
        db: StateDB,
        ledger: Ledger,
        audit_path: Path,
        labels: Callable[[str], Mapping[str, str]],
        on_invalid: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.config = config
        # Told (identity, chat id, coderd's message) when a chat's state is invalid.
        self.on_invalid = on_invalid
        self._reconcile_missing: set[str] = set()  # identities whose server lacks the route
        self.store = store
        self.health = health
        self.clients = clients
        self.db = db
        # Where ChatSwept fires and resolves: the detector's persisted set of firing alerts,
        # so an announcement's resolve survives a restart (a timer would not).
        self.ledger = ledger
        self.audit_path = audit_path
        self.labels = labels
        self.recent: deque[dict[str, Any]] = deque(maxlen=AUDIT_KEEP)
        self.counts = {
            "planned": 0,
            "interrupted": 0,
            "archived": 0,
            "gave_up": 0,
            "invalid": 0,
            "reconciled": 0,
            "errors": 0,
        }
        self._limiters: dict[str, RateLimiter] = {}
        self._slots = asyncio.Semaphore(config.concurrency)
        self._policies = compile_policies(config)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        self._expire_announcements()
        jobs = []
        # Chats already interrupted by an earlier pass (or an earlier process) come first.
        for entry in self.db.sweep_in_state("interrupt_sent") + self.db.sweep_in_state("retry"):
            policy = next((p for p, _ in self._policies if p.name == entry.policy), None)
            if policy is not None and self._ready(entry.identity):
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

    def _ready(self, identity: str) -> bool:
        h = self.health.get(identity)
        return h is not None and h.ready

    def _match(self, rec: ChatRecord, now: float) -> SweepPolicy | None:
        return match_policy(self._policies, rec, now=now, labels=self.labels(rec.identity))

    # -- one chat ---------------------------------------------------------------------

    async def _start(self, rec: ChatRecord, policy: SweepPolicy) -> None:
        entry = self.db.sweep_get(rec.identity, rec.chat_id, policy.name)
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
            self._record(
                entry,
                "planned",
                rec=rec,
                policy=policy,
                action=would,
                dry_run=True,
                detail=f"would {would} ({rec.status} for "
                f"{self._age(rec):.0f}s, policy {policy.name})",
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
        except CoderError as exc:
            if exc.status == 404:
                self._record(
                    entry, "gave_up", rec=rec, policy=policy, action="none", detail="chat is gone"
                )
            else:
                self._retry(entry, rec, policy, f"read failed: {exc}")
            return
        except PayloadError as exc:
            self._retry(entry, rec, policy, f"read failed: {exc}")
            return
        status = chat.status
        if status == "requires_action" or chat.archived:
            self._record(
                entry,
                "gave_up",
                rec=rec,
                policy=policy,
                action="none",
                detail=f"left alone: chat is {'archived' if chat.archived else status}",
            )
            return
        wants_interrupt = policy.action in ("interrupt", "interrupt_then_archive")
        if wants_interrupt and status in ACTIVE and entry.state != "interrupt_sent":
            await self._limiter(entry.identity).acquire()
            try:
                after = await client.interrupt(entry.chat_id)
                status = after.status if after is not None else status
                detail = f"interrupt accepted ({status})"
            except CoderError as exc:
                if exc.invalid_state:
                    await self._invalid(entry, rec, policy, exc, client=client)
                    return
                if exc.status == 409:
                    detail = "nothing to interrupt (409)"
                else:
                    self._retry(entry, rec, policy, f"interrupt failed: {exc}")
                    return
            if policy.action == "interrupt":
                self._record(
                    entry, "interrupted", rec=rec, policy=policy, action="interrupt", detail=detail
                )
                return
            entry = replace(entry, state="interrupt_sent", updated=time.time())
            self.db.sweep_put(entry)
            self._audit(
                entry, action="interrupt", rec=rec, policy=policy, dry_run=False, detail=detail
            )
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
        await self._archive(
            entry, rec, policy, parent=chat.parent_chat_id, root=chat.root_chat_id, client=client
        )

    async def _archive(
        self,
        entry: SweepEntry,
        rec: ChatRecord | None,
        policy: SweepPolicy,
        *,
        parent: str | None,
        root: str | None,
        client: CoderClient,
    ) -> None:
        target = root if parent and root and root != entry.chat_id else entry.chat_id
        await self._limiter(entry.identity).acquire()
        try:
            await client.archive(target)
        except CoderError as exc:
            if exc.invalid_state:
                await self._invalid(entry, rec, policy, exc, client=client, target=target)
                return
            if exc.status == 400 and "already archived" in exc.message.lower():
                pass
            elif exc.status == 409 or (exc.status == 400 and "root chat" in exc.message):
                self._retry(entry, rec, policy, f"archive refused: {exc.message}")
                return
            else:
                self._retry(entry, rec, policy, f"archive failed: {exc}")
                return
        what = "archived" + (f" via its root {target}" if target != entry.chat_id else "")
        self._record(entry, "archived", rec=rec, policy=policy, action="archive", detail=what)

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
        """409 "Chat is in an invalid state.": say so (audit, stuck alerts); reconcile only
        when opted in and the server has the route; never count it as done."""
        chat_id = target or entry.chat_id
        said = f"execution state invalid: coderd answered 409 {exc.message!r}"
        if self.on_invalid is not None:
            self.on_invalid(entry.identity, entry.chat_id, exc.message)
        missing = f"{said}; this server has no reconcile-invalid route"
        if entry.identity in self._reconcile_missing:
            self._record(entry, "invalid", rec=rec, policy=policy, action="none", detail=missing)
            return
        if not self.config.reconcile_invalid:
            off = f"{said}; left alone (sweep.reconcile_invalid is off)"
            self._record(entry, "invalid", rec=rec, policy=policy, action="none", detail=off)
            return
        await self._limiter(entry.identity).acquire()
        try:
            await client.reconcile_invalid(chat_id)
        except CoderError as err:
            if err.status == 404:
                self._reconcile_missing.add(entry.identity)
                log.warning(
                    "sweep.reconcile_invalid_unsupported",
                    identity=entry.identity,
                    note="this Coder server has no POST …/reconcile-invalid; said once",
                )
                self._record(
                    entry, "invalid", rec=rec, policy=policy, action="none", detail=missing
                )
                return
            self._retry(entry, rec, policy, f"reconcile-invalid failed: {err}")
            return
        self.counts["reconciled"] += 1
        # Reconciled: the chat is now in `error`; later passes treat it like any other.
        entry = replace(entry, state="retry", updated=time.time(), detail="reconciled")
        self.db.sweep_put(entry)
        self._audit(
            entry,
            action="reconcile_invalid",
            rec=rec,
            policy=policy,
            dry_run=False,
            detail=f"{said}; reconcile-invalid accepted (the chat moves to error)",
        )

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
        self.db.sweep_put(replace(entry, state=state, attempts=attempts, detail=detail))
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
        self.db.sweep_put(entry)
        self.counts[state if state in self.counts else "errors"] += 1
        self._audit(entry, action=action, rec=rec, policy=policy, dry_run=dry_run, detail=detail)
        if action != "none" or state == "gave_up":
            self._announce(
                entry, rec=rec, policy=policy, action=action, dry_run=dry_run, detail=detail
            )

    def _audit(
        self,
        entry: SweepEntry,
        *,
        action: str,
        rec: ChatRecord | None,
        policy: SweepPolicy,
        dry_run: bool,
        detail: str,
    ) -> None:
        line = {
            "time": time.time(),
            "identity": entry.identity,
            "chat_id": entry.chat_id,
            "title": rec.title if rec else "",
            "policy": policy.name,
            "action": action,
            "state": entry.state,
            "dry_run": dry_run,
            "detail": detail,
        }
        self.recent.append(line)
        try:
            self.audit_path.parent.mkdir(parents=True, exist_ok=True)
            with self.audit_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as exc:
            log.error("sweep.audit_failed", path=str(self.audit_path), error=str(exc))
        log.warning("sweep.action" if not dry_run else "sweep.dry_run", **line)

    def _announce(
        self,
        entry: SweepEntry,
        *,
        rec: ChatRecord | None,
        policy: SweepPolicy,
        action: str,
        dry_run: bool,
        detail: str,
    ) -> None:
        h = self.health.get(entry.identity)
        deployment = h.deployment if h else ""
        labels = {
            **self.labels(entry.identity),
            "alertname": "ChatSwept",
            "identity": entry.identity,
            "deployment": deployment,
            "chat_id": entry.chat_id,
            "policy": policy.name,
            "action": action,
            "dry_run": "true" if dry_run else "false",
            "severity": "info",
            "status": entry.state,
        }
        verb = f"would {action}" if dry_run else entry.state.replace("_", " ")
        alert = Alert(
            fingerprint=fingerprint(
                deployment, entry.chat_id, "ChatSwept", policy.name, entry.since
            ),
            labels=labels,
            starts_at=time.time(),
            annotations={
                "summary": f'Sweep {verb}: chat "{rec.title if rec else entry.chat_id}" '
                f"(policy {policy.name})",
                "title": rec.title if rec else "",
                "detail": detail,
            },
        )
        self.ledger.raise_alert(alert, identity=entry.identity)

    def _expire_announcements(self) -> None:
        """ChatSwept announcements resolve after ``announce_for`` (checked every pass, on
        firing alerts the detector persisted: a restart in between resolves them too)."""
        cutoff = time.time() - self.config.announce_for
        for fp, alert in list(self.ledger.firing.items()):
            if alert.name == "ChatSwept" and alert.starts_at <= cutoff:
                self.ledger.clear_alert(fp, why="announced long enough")

    def _limiter(self, identity: str) -> RateLimiter:
        lim = self._limiters.get(identity)
        if lim is None:
            per_second = self.config.actions_per_minute / 60.0
            lim = self._limiters[identity] = RateLimiter(rate=per_second, burst=1)
        return lim

    def _age(self, rec: ChatRecord) -> float:
        h = self.health.get(rec.identity)
        return (h.server_clock.now() if h else time.time()) - rec.since
