"""Re-reads that detection asks for before it fires: the watching side of confirmation.

Detection never reads Coder, writes the store or touches an identity's health: it
asks this port (:class:`Rereads`, one per identity) to re-read a chat or to list
again. The answer comes back the ordinary way, as store changes handed to the
identity's :class:`~watchd.watching.reconciling.ChangeSink`, tagged ``via="confirm"``
(a chat that answers 404 is tombstoned, ``reason="gone"``); what detection gets back
is only whether the chat was read or gone. A failed re-read is noted here, in the
identity's health (``last_error``), and raised for detection to retry later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal

from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.kits.clock import loop_time
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import ChatRecord
from watchd.watching.diagnosing import Diagnosing, Readings
from watchd.watching.reconciling import ChangeSink, Reconciler

Reread = Literal["read", "gone"]


class Rereads:
    """One identity's confirmation reads (what detection's ``Confirmer`` port asks)."""

    def __init__(
        self,
        *,
        health: IdentityHealth,
        client: CoderClient,
        store: ChatStore,
        changes: ChangeSink,
        reconciler: Reconciler,
        diagnosing: Diagnosing,
    ) -> None:
        self.health = health
        self.name = health.name
        self.client = client
        self.store = store
        self.changes = changes
        self.reconciler = reconciler
        self.diagnosing = diagnosing

    async def reread(self, chat_id: str) -> Reread:
        """Read one chat again (a GET, authoritative: ``via="confirm"``) into the store;
        "gone" when Coder answers 404. Raises CoderError or PayloadError, noted."""
        started = loop_time()
        try:
            chat = await self.client.get_chat(chat_id)
        except CoderError as exc:
            if exc.status == 404:
                self._timed(started)
                self.health.confirm_failures = 0
                gone = self.store.tombstone(self.name, chat_id, reason="gone", via="confirm")
                if gone is not None:
                    self.changes.apply(self.name, (gone,))
                return "gone"
            self._failed(exc, started)
            raise
        except PayloadError as exc:
            self._failed(exc, started)
            raise
        self._timed(started)
        self.health.confirm_failures = 0
        now = self.health.server_clock.now()
        change = self.store.observe(self.name, chat, now=now, via="confirm")
        if change is not None:
            self.changes.apply(self.name, (change,))
        return "read"

    async def relist(self, *, on_page: Callable[[AbstractSet[str]], None] | None = None) -> None:
        """List the identity's chats into the store (one listing confirms a burst);
        ``on_page(ids read so far)`` after each page. Raises CoderError or PayloadError,
        noted."""
        try:
            await self.reconciler.relist(on_page=on_page)
        except (CoderError, PayloadError) as exc:
            self._note(exc)
            raise
        self.health.confirm_failures = 0

    async def facts(self, record: ChatRecord, *, lookup: bool = True) -> Readings:
        """The reads that explain a stuck chat (its workspace's build, the quota)."""
        return await self.diagnosing.read(record, lookup=lookup)

    def learn_capacity(self, chat_ids: Sequence[str]) -> AbstractSet[str]:
        """Queue these chats' GETs for their capacity flag (paced by the reconciler);
        the ids it will read."""
        return self.reconciler.capacity_changed(chat_ids)

    def _timed(self, started: float) -> None:
        h = self.health
        if h.on_confirmation is not None:
            h.on_confirmation(loop_time() - started)

    def _failed(self, exc: Exception, started: float) -> None:
        self._timed(started)
        self._note(exc)

    def _note(self, exc: Exception) -> None:
        self.health.last_error = f"confirmation failed: {exc}"
        self.health.confirm_failures += 1
