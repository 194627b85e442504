"""One identity's watcher: three nested loops with one job each.

1. :meth:`IdentityWatcher.watch_forever` reconnects forever with jittered
   backoff (1 s doubling to 30 s; reset only after a connection stayed
   healthy, so a server that accepts and drops at once cannot make us spin).
2. :meth:`IdentityWatcher._session` opens the socket *first*, then lists
   (so nothing falls between), applies the listing, then the events that
   arrived meanwhile, and only then marks the identity ready.
3. The connection itself (:mod:`watchd.coder.watchstream`) with aiohttp's
   ping/pong heartbeat as its inactivity timer.

A periodic full reconcile runs beside it regardless of the stream, because
the stream drops events. A complete listing that lacks a known chat only
marks it *absent*; the reconcile loop confirms absent chats by GET between
listings (404 → gone, ``archived`` → archived) and tombstones an idle chat
without a GET only when two consecutive complete listings lack it
(docs/coder-api.md, "the moving cursor").

A 401/403 on any call is a permanent refusal, not an outage: one
confirming retry a few seconds later, then the identity is marked refused
(IdentityUnhealthy fires at once, not after ``unhealthy_after``), and the
token is re-read every ``auth_retry``, so a rotated token heals by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from watchd.coder.client import CoderClient, Listing
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.models import IDLE_STATUSES, Chat, Quota, WatchEvent, WorkspaceBuild
from watchd.coder.watchstream import (
    DEFAULT_HEARTBEAT,
    ResyncNeeded,
    StreamClosed,
    WatchConnection,
    open_watch,
)
from watchd.detection.detector import Detector
from watchd.detection.diagnosis import Facts
from watchd.detection.health import IdentityHealth
from watchd.kits import logs
from watchd.kits.backoff import Backoff
from watchd.store.chats import Change, ChatRecord, ChatStore

log = logs.get("watchd.watching")

BUILD_CACHE = 1_000  # workspace builds remembered for diagnosis (oldest dropped first)
# Idle chats missing from a listing are confirmed by GET only when this few are missing
# (a mass deletion waits for a second listing instead of a GET storm); a chat whose
# status has a budget is always confirmed by GET.
ABSENT_GET_LIMIT = 20
ABSENT_GETS_PER_PASS = 100


@dataclass(frozen=True)
class WatchSettings:
    reconcile_interval: float = 60.0
    heartbeat: float = DEFAULT_HEARTBEAT
    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    # A connection that lived this long proves the path works: the backoff resets.
    healthy_after: float = 30.0
    auth_retry: float = 300.0
    # GETs per second confirming chats a listing lacked.
    absent_confirm_rate: float = 4.0
    # A refused token (401/403) is tried once more after this long before it counts as
    # refused: a proxy hiccup or a rotation mid-flight can refuse once.
    auth_confirm_after: float = 5.0
    # Events buffered while a listing runs; past this only the ids of the chats they were
    # about are kept (as Coder's web client does) and re-read once the listing is applied.
    buffer_limit: int = 20_000
    # Dirty chat ids kept past the buffer; past this the stream is dropped and relisted.
    dirty_limit: int = 200_000
    quota_ttl: float = 60.0


class IdentityWatcher:
    def __init__(
        self,
        *,
        health: IdentityHealth,
        client: CoderClient,
        store: ChatStore,
        detector: Detector,
        listing_gate: asyncio.Semaphore,
        settings: WatchSettings,
        token_provider: Callable[[], str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.health = health
        self.name = health.name
        self.client = client
        self.store = store
        self.detector = detector
        self.gate = listing_gate
        self.settings = settings
        self.token_provider = token_provider
        self.rng = rng or random.Random()
        self.attempt = 0
        self._conn: WatchConnection | None = None
        self._relist_lock = asyncio.Lock()
        self._quota: tuple[float, Quota | None] | None = None
        self._buffer: list[WatchEvent] | None = None
        # Chats whose events overflowed the buffer during a listing: re-read after it.
        self._dirty: set[str] | None = None
        self._relist_now = False
        # Chats waiting for a GET, in order: "absent" (a listing lacked them) or "dirty"
        # (their events overflowed the buffer during a listing).
        self._to_confirm: dict[str, str] = {}
        self._absent_wake = asyncio.Event()
        # Set by any call that Coder refused with 401/403 (the client's on_refused).
        self._refused = asyncio.Event()
        self._refusal: CoderError | None = None
        client.on_refused = self._on_refused
        # workspace id -> (monotonic time read, latest build): shared by a burst's verdicts.
        self._builds: dict[str, tuple[float, WorkspaceBuild]] = {}
        self._clock_warned: set[str] = set()

    # -- loop 1: reconnect forever ------------------------------------------------

    async def watch_forever(self) -> None:
        structlog.contextvars.bind_contextvars(identity=self.name)
        s = self.settings
        backoff = Backoff(base=s.backoff_base, cap=s.backoff_cap, rng=self.rng)
        transport = self.client.transport
        while True:
            started = time.monotonic()
            delay: float | None = None
            try:
                await self._session()
            except CoderError as exc:
                delay = self._on_coder_error(exc)
            except ResyncNeeded as exc:
                self._lost("reconnecting", f"resync: {exc}")
            except StreamClosed as exc:
                self._lost("reconnecting", str(exc))
            except PayloadError as exc:
                self._lost("unreachable", f"unexpected listing payload: {exc}")
            lived = time.monotonic() - started
            if lived >= s.healthy_after:
                backoff.reset()
            wait = backoff.next()
            if delay is not None:
                # A refusal keeps its own schedule (confirm soon, then auth_retry): an
                # outage just before it must not stretch the confirming retry.
                wait = delay if self.health.state == "auth_failed" else max(wait, delay)
            self.health.reconnects += 1
            transport.emit_ws(
                "ws:redial",
                reader=1,
                attempt=self.attempt,
                consecutiveFailures=backoff.failures,
                maxConsecutiveFailures=0,
                backoffMs=round(wait * 1000),
            )
            log.info(
                "watch.redial",
                identity=self.name,
                state=self.health.state,
                in_seconds=round(wait, 2),
                lived=round(lived, 2),
            )
            await asyncio.sleep(wait)
            if self.health.state == "auth_failed" and self.token_provider is not None:
                try:
                    transport.set_token(self.token_provider())
                except Exception as exc:
                    log.warning("token.reread_failed", identity=self.name, error=str(exc))

    def _on_refused(self, exc: CoderError) -> None:
        """A REST call was refused (401/403): coderd never re-checks an open watch socket,
        so a revoked token is noticed here, and the session ends to confirm it."""
        self._refusal = exc
        self._refused.set()

    def _on_coder_error(self, exc: CoderError) -> float | None:
        if exc.is_auth:
            first = self.health.state != "auth_failed"
            self._lost("auth_failed", str(exc))
            if first:
                # One confirming retry: a proxy or a token rotation mid-flight can refuse
                # once; two refusals a few seconds apart are a refusal.
                log.warning(
                    "identity.refused_once",
                    identity=self.name,
                    status=exc.status,
                    meaning=exc.meaning,
                    confirm_in=self.settings.auth_confirm_after,
                )
                return self.settings.auth_confirm_after
            self.health.refused = True
            self.detector.readiness_changed(self.name)
            log.error(
                "identity.auth_failed",
                identity=self.name,
                status=exc.status,
                meaning=exc.meaning,
                retry_in=self.settings.auth_retry,
            )
            return self.settings.auth_retry
        if exc.status == 404:
            self._lost("not_found", str(exc))
            return None
        self._lost("unreachable", str(exc))
        return exc.retry_after

    def _lost(self, state: str, error: str) -> None:
        self.health.set_state(state, error=error)
        self.detector.readiness_changed(self.name)
        log.warning("watch.lost", identity=self.name, state=state, error=error)

    # -- loop 2: one session (socket, then listing, then stream) ------------------

    async def _session(self) -> None:
        prefix = await self.client.resolve_prefix()
        self.health.prefix = prefix
        self.attempt += 1
        try:
            conn = await open_watch(
                self.client.transport,
                prefix,
                reader=1,
                attempt=self.attempt,
                heartbeat=self.settings.heartbeat,
            )
        except CoderError as exc:
            if exc.status == 404:
                # The route moved (server upgrade): probe again before the next dial.
                await self.client.resolve_prefix(force=True)
            raise
        self._conn = conn
        self._refused.clear()
        self._refusal = None
        self.health.set_state("seeding")
        close_code: int | None = None
        reason = ""
        # Events that arrive while the listing runs wait here; past the limit the
        # stream is dropped and relisted.
        self._buffer = []
        self._dirty = None
        pump = asyncio.create_task(conn.pump(self._on_events), name=f"watch:{self.name}")
        listing: asyncio.Task[None] | None = None
        try:
            listing = asyncio.create_task(self.relist(), name=f"seed:{self.name}")
            await asyncio.wait({pump, listing}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                pump.result()  # the stream ended or broke during the listing: raises
            listing.result()
            buffered, self._buffer = self._buffer, None
            if buffered:
                self._apply_burst(buffered)
            dirty, self._dirty = self._dirty, None
            if dirty:
                self._reread(dirty)
            self.health.set_state("ready")
            self.detector.readiness_changed(self.name)
            log.info(
                "identity.ready",
                identity=self.name,
                chats=self.health.last_list_chats,
                prefix=prefix,
            )
            refused = asyncio.create_task(self._refused.wait(), name=f"refused:{self.name}")
            try:
                await asyncio.wait({pump, refused}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                refused.cancel()
            if self._refusal is not None:
                # The token was refused on some REST call (the reconcile may also have
                # closed the socket meanwhile): the refusal is what ended this session.
                if pump.done() and not pump.cancelled():
                    pump.exception()
                raise self._refusal
            await pump
            raise StreamClosed(None, "stream ended")
        except StreamClosed as exc:
            close_code, reason = exc.code, exc.reason
            raise
        finally:
            self._buffer = None
            self._dirty = None
            for task in (pump, listing):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            self._conn = None
            await conn.close(code=close_code, reason=reason)
            self.health.malformed += conn.malformed

    def _on_events(self, events: list[WatchEvent]) -> None:
        """A burst of events from the socket: applied together, or held while a listing
        runs."""
        buffer = self._buffer
        if buffer is None:
            self._apply_burst(events)
            return
        for event in events:
            dirty = self._dirty
            if dirty is not None:
                dirty.add(event.chat.id)
                if len(dirty) > self.settings.dirty_limit:
                    raise ResyncNeeded("too many chats changed during the listing")
                continue
            buffer.append(event)
            if len(buffer) > self.settings.buffer_limit:
                # Keep which chats moved, not every event: they are re-read after the listing.
                self.health.overflow += 1
                self._dirty = {e.chat.id for e in buffer}
                buffer.clear()
                log.info(
                    "watch.buffer_overflow",
                    identity=self.name,
                    buffered=self.settings.buffer_limit,
                    note="keeping the ids of the chats that change; they are re-read after",
                )

    def _reread(self, dirty: set[str]) -> None:
        """Chats whose events overflowed the buffer: a few are read by GET (as absent
        chats are), many by one more listing right away."""
        if len(dirty) <= ABSENT_GET_LIMIT:
            for chat_id in dirty:
                self._to_confirm.setdefault(chat_id, "dirty")
        else:
            self._relist_now = True
        log.info("watch.reread", identity=self.name, chats=len(dirty), by_listing=self._relist_now)
        self._absent_wake.set()

    def _apply_burst(self, events: list[WatchEvent]) -> None:
        """Events read in one go: one store pass and one detector pass, observed at one
        server-clock instant (they arrived together)."""
        self.health.events += len(events)
        changes = self.store.observe_events(self.name, events, now=self.health.server_clock.now())
        if changes:
            self.detector.apply(self.name, changes)

    # -- reconcile ----------------------------------------------------------------

    async def reconcile_forever(self) -> None:
        """Relist every ``reconcile_interval`` (jittered); between listings, confirm the
        chats the last complete listing lacked."""
        structlog.contextvars.bind_contextvars(identity=self.name)
        interval = self.settings.reconcile_interval
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + interval * self.rng.uniform(0.9, 1.1)
            while (left := due - loop.time()) > 0:
                if self._relist_now and self.health.ready:
                    break
                if self._to_confirm and self.health.ready:
                    await self._confirm_absent()
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
                conn = self._conn
                if conn is not None:
                    await conn.ws.close(code=1000, message=b"reconcile failed")

    async def relist(self) -> None:
        """A listing applied to the store (new chats, transitions, refreshes).

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
                began = time.monotonic()
                started = clock.now()
                async for rows in self.client.chat_rows(listing=listing):
                    changes = self.store.observe_rows(
                        self.name, rows, now=clock.now(), present=present
                    )
                    if changes:
                        self.detector.apply(self.name, changes)
            if listing.complete:
                absent = self.store.finish_listing(self.name, present, started=started)
                if absent:
                    self._absent_found(absent)
            else:
                self.health.incomplete_listings += 1
                log.warning(
                    "listing.incomplete",
                    identity=self.name,
                    why=listing.incomplete,
                    pages=listing.pages,
                    rows=listing.rows,
                    note="no chat is taken as missing from this listing",
                )
            self.health.last_list_seconds = round(time.monotonic() - began, 3)
            self.health.last_list_ok = clock.now()
            self.health.last_list_chats = len(present)
            self.health.last_list_pages = listing.pages
            self.health.relists += 1
            self._check_clock()

    def _check_clock(self) -> None:
        """Say once per identity when the deployment's clock cannot be trusted: responses
        without a Date header, or chat timestamps ahead of it or before the chats began."""
        clock = self.health.server_clock
        said = self._clock_warned
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
            if rec.status in IDLE_STATUSES and not few:
                if missed >= 2:
                    change = self.store.tombstone(
                        self.name, chat_id, reason="gone (missing from two complete listings)"
                    )
                    if change is not None:
                        gone.append(change)
                continue
            self._to_confirm[chat_id] = "absent"
        self.health.absent = len(self.store.absent(self.name))
        if gone:
            self.detector.apply(self.name, gone)
        if self._to_confirm:
            log.info(
                "listing.absent",
                identity=self.name,
                missing=len(absent),
                to_confirm=len(self._to_confirm),
                tombstoned=len(gone),
            )
            self._absent_wake.set()

    async def _confirm_absent(self) -> None:
        """GET chats a complete listing lacked, at ``absent_confirm_rate``: 404 → gone,
        ``archived`` → archived, otherwise the chat is there (the cursor skipped it) and
        keeps its clock. A failed read leaves it absent for the next listing to judge."""
        batch = list(self._to_confirm)[:ABSENT_GETS_PER_PASS]
        interval = 1.0 / self.settings.absent_confirm_rate
        clock = self.health.server_clock
        absent = self.store.absent(self.name)
        for chat_id in batch:
            why = self._to_confirm.pop(chat_id, "absent")
            if why == "absent" and chat_id not in absent:
                continue  # seen again meanwhile (an event, a later listing)
            self.health.absent_confirms += 1
            change: Change | None
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
                # A dirty re-read is no more authoritative than the events since it.
                via = "confirm" if why == "absent" else "listing"
                change = self.store.observe(self.name, chat, now=clock.now(), via=via)
                if change is None and not chat.archived:
                    log.debug("absent.still_there", identity=self.name, chat_id=chat_id)
            if change is not None:
                self.detector.apply(self.name, (change,))
            await asyncio.sleep(interval)
        self.health.absent = len(self.store.absent(self.name))

    # -- Confirmer ----------------------------------------------------------------

    async def get_chat(self, chat_id: str) -> Chat:
        return await self.client.get_chat(chat_id)

    async def facts(self, record: ChatRecord, *, lookup: bool = True) -> Facts:
        """What explains a stuck chat. ``lookup=False`` (the bulk of a burst) uses only
        what is cached, so ten thousand verdicts never queue ten thousand GETs."""
        build = None
        ws = record.workspace_id
        checked = True
        if ws and record.status != "requires_action":
            cached = self._builds.get(ws)
            if cached is not None and time.monotonic() - cached[0] < self.settings.quota_ttl:
                build = cached[1]
            elif lookup:
                build = await self.client.workspace(ws)
                if len(self._builds) >= BUILD_CACHE:
                    self._builds.pop(next(iter(self._builds)))
                self._builds[ws] = (time.monotonic(), build)
            else:
                checked = False
        quota = await self._quota_now()
        return Facts(record=record, build=build, quota=quota, build_checked=checked)

    async def _quota_now(self) -> Quota | None:
        now = time.monotonic()
        h = self.health
        if h.quota_state in ("unavailable", "unlimited") and h.quota_checked is not None:
            return h.quota
        if (
            h.quota is not None
            and h.quota_checked is not None
            and now - h.quota_checked < 2 * self.settings.quota_ttl
        ):
            return h.quota
        if self._quota is not None and now - self._quota[0] < self.settings.quota_ttl:
            return self._quota[1]
        quota = None
        me = await self.client.me()
        if me.organization_ids:
            quota = await self.client.workspace_quota(me.organization_ids[0], "me")
        self._quota = (now, quota)
        return quota
