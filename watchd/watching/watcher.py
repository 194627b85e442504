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
the stream drops events (:mod:`watchd.watching.reconciling`: listings, absent
chats); the reads that explain a stuck chat are :mod:`watchd.watching.diagnosing`.
The watcher feeds a :class:`~watchd.watching.reconciling.ChangeSink` (the
daemon wires in the detector); it never imports detection.

A 401/403 on any call is a permanent refusal, not an outage: one
confirming retry a few seconds later, then the identity is marked refused
(IdentityUnhealthy fires at once, not after ``unhealthy_after``), and the
token is re-read every ``auth_retry``, so a rotated token heals by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from collections.abc import Set as AbstractSet

import structlog

from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.observing import WatchEvent
from watchd.coder.watchstream import ResyncNeeded, StreamClosed, WatchConnection, open_watch
from watchd.kits import logs
from watchd.kits.backoff import Backoff
from watchd.kits.clock import loop_time
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth, WatchState
from watchd.telemetry.kinds import WsRedial
from watchd.watching.diagnosing import Diagnosing
from watchd.watching.reconciling import ChangeSink, Reconciler
from watchd.watching.rereading import Rereads
from watchd.watching.settings import WatchSettings

log = logs.get("watchd.watching")


class IdentityWatcher:
    def __init__(
        self,
        *,
        health: IdentityHealth,
        client: CoderClient,
        store: ChatStore,
        changes: ChangeSink,
        listing_gate: asyncio.Semaphore,
        settings: WatchSettings,
        token_provider: Callable[[], str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.health = health
        self.name = health.name
        self.client = client
        self.store = store
        self.changes = changes
        self.gate = listing_gate
        self.settings = settings
        self.token_provider = token_provider
        self.rng = rng or random.Random()
        self.attempt = 0
        self._conn: WatchConnection | None = None
        self._buffer: list[WatchEvent] | None = None
        # Chats whose events overflowed the buffer during a listing: re-read after it.
        self._dirty: set[str] | None = None
        # Set by any call that Coder refused with 401/403 (the client's on_refused).
        self._refused = asyncio.Event()
        self._refusal: CoderError | None = None
        # Watch upgrades refused in a row (not auth, not 404): past poll_after, polling.
        self._stream_refusals = 0
        client.on_refused = self._on_refused
        self.diagnosing = Diagnosing(health=health, client=client, quota_ttl=settings.quota_ttl)
        self.reconciler = Reconciler(
            health=health,
            client=client,
            store=store,
            changes=changes,
            listing_gate=listing_gate,
            interval=settings.reconcile_interval,
            absent_confirm_rate=settings.absent_confirm_rate,
            rng=self.rng,
            drop_stream=self._drop_stream,
        )
        # What detection asks before it fires (its Confirmer port): answered through the
        # store and ``changes``, as every other read is.
        self.rereads = Rereads(
            health=health,
            client=client,
            store=store,
            changes=changes,
            reconciler=self.reconciler,
            diagnosing=self.diagnosing,
        )

    # -- loop 1: reconnect forever ------------------------------------------------

    async def watch_forever(self) -> None:
        structlog.contextvars.bind_contextvars(identity=self.name)
        s = self.settings
        backoff = Backoff(base=s.backoff_base, cap=s.backoff_cap, rng=self.rng)
        transport = self.client.transport
        while True:
            started = loop_time()
            delay: float | None = None
            try:
                if await self._session():
                    continue  # polling found the stream back: dial it at once
            except CoderError as exc:
                delay = self._on_coder_error(exc)
            except ResyncNeeded as exc:
                self._lost("reconnecting", f"resync: {exc}")
            except StreamClosed as exc:
                self._lost("reconnecting", str(exc))
            except PayloadError as exc:
                self._lost("unreachable", f"unexpected listing payload: {exc}")
            lived = loop_time() - started
            if lived >= s.healthy_after:
                backoff.reset()
            wait = backoff.next()
            if delay is not None:
                # A refusal keeps its own schedule (confirm soon, then auth_retry): an
                # outage just before it must not stretch the confirming retry.
                wait = delay if self.health.state == "auth_failed" else max(wait, delay)
            self.health.reconnects += 1
            transport.emit_ws(
                WsRedial,
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
            self.changes.readiness_changed(self.name)
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

    def _lost(self, state: WatchState, error: str) -> None:
        self.health.set_state(state, error=error)
        self.changes.readiness_changed(self.name)
        log.warning("watch.lost", identity=self.name, state=state, error=error)

    # -- loop 2: one session (socket, then listing, then stream) ------------------

    async def _session(self) -> bool:
        """One session; it ends by raising, or returns True when polling (the stream was
        refused) found the stream back and it should be dialled at once."""
        prefix = await self.client.resolve_prefix()
        self.health.prefix = prefix
        conn = await self._dial(prefix)
        if conn is None:
            return True
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
            listing = asyncio.create_task(self.reconciler.relist(), name=f"seed:{self.name}")
            await asyncio.wait({pump, listing}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                pump.result()  # the stream ended or broke during the listing: raises
            listing.result()
            self._seeded(prefix)
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

    async def _dial(self, prefix: str) -> WatchConnection | None:
        """Open the watch socket; None when it was refused often enough that polling ran
        instead and found the stream back (dial again at once)."""
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
            elif not exc.is_auth:
                self._stream_refusals += 1
                if self._stream_refusals >= self.settings.poll_after:
                    await self._poll(exc)
                    return None
            raise
        self._stream_refusals = 0
        return conn

    def _seeded(self, prefix: str) -> None:
        """The seed listing is applied: then the events held meanwhile (or a re-read of
        the chats they were about), and only then is the identity ready."""
        buffered, self._buffer = self._buffer, None
        if buffered:
            self._apply_burst(buffered)
        dirty, self._dirty = self._dirty, None
        if dirty:
            self.reconciler.reread(dirty)
        self.health.set_state("ready")
        self.changes.readiness_changed(self.name)
        log.info(
            "identity.ready",
            identity=self.name,
            chats=self.health.last_list_chats,
            prefix=prefix,
        )

    async def _poll(self, refusal: CoderError) -> None:
        """Watch by listing: the stream keeps being refused while REST may answer. Lists
        every poll_interval (verdicts go on: the identity is ready, in state
        ``polling``) and tries the stream after each listing, returning as soon as it
        opens (the next session streams). A listing that fails ends it as any session's
        failure does (so a full outage is never taken for a refused stream)."""
        s = self.settings
        why = f"watch stream refused ({refusal}): polling by listing every {s.poll_interval:g}s"
        first = True
        while True:
            await self.reconciler.relist()
            if first:
                first = False
                self.health.set_state("polling", error=why)
                self.changes.readiness_changed(self.name)
                log.warning("watch.polling", identity=self.name, every=s.poll_interval, why=why)
            if await self._stream_opens():
                self._stream_refusals = 0
                return
            await asyncio.sleep(s.poll_interval)

    async def _stream_opens(self) -> bool:
        """Whether the watch upgrade goes through now (the connection is closed again)."""
        self.attempt += 1
        try:
            conn = await open_watch(
                self.client.transport, self.health.prefix, reader=1, attempt=self.attempt
            )
        except CoderError:
            return False
        await conn.close(code=1000, reason="the stream is back: watching it again")
        return True

    def _on_events(self, events: list[WatchEvent]) -> None:
        """A burst of events from the socket: applied together, or held while a listing
        runs."""
        buffer = self._buffer
        if buffer is None:
            self.reconciler.check_stamps(events)
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

    def _apply_burst(self, events: list[WatchEvent]) -> None:
        """Events read in one go: one store pass and one detector pass, observed at one
        server-clock instant (they arrived together)."""
        self.health.events += len(events)
        changes = self.store.observe_events(self.name, events, now=self.health.server_clock.now())
        if changes:
            self.changes.apply(self.name, changes)
        self.reconciler.read_contradicted()
        if moved := [e.chat.id for e in events if e.kind == "capacity_change"]:
            self.reconciler.capacity_changed(moved)

    # -- the reconcile beside the stream, and what the detector's confirmer reads -------

    async def reconcile_forever(self) -> None:
        await self.reconciler.forever()

    async def relist(self, *, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
        await self.reconciler.relist(on_page=on_page)

    async def _drop_stream(self) -> None:
        """The reconcile failed: the view can't be trusted; loop 1 re-seeds."""
        conn = self._conn
        if conn is not None:
            await conn.ws.close(code=1000, message=b"reconcile failed")
