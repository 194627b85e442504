"""The chat store: one compact record per chat, and the rules that move it.

Pure and synchronous. Observations come in three flavours — a watch event,
a listing row, a confirmation GET — and each either starts a new clock (a
status transition), refreshes the record, or is ignored as stale (older
``updated_at`` than we already hold).

Absence is not deletion. coderd's keyset cursor skips a chat whose
``updated_at`` moves while a listing pages (docs/coder-api.md, "the moving
cursor"), so a chat missing from a complete listing only becomes *absent*:
its record, clock and alerts stay exactly as they were until the watcher
confirms it (a GET answering 404 or ``archived``, or a second complete
listing that lacks it too) and tombstones it; any sighting meanwhile clears
the absence.

The clock (``since``) is the server time the chat entered its current
status. Its ``source`` says how we know:

- ``transition``: seen on the watch stream; ``since`` is the event's ``updated_at``;
- ``synthesized``: a listing or GET shows a status different from ours, so the
  transition happened while we were not looking; ``since`` = ``updated_at``,
  which is ≥ the true entry time (a lower bound on age);
- ``lower_bound``: first sighting in a listing; same reasoning.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from msgspec.structs import replace

from watchd.coder.observing import Observation, WatchEvent
from watchd.store.records import (
    CLOCK_LOWER_BOUND,
    CLOCK_SYNTHESIZED,
    CLOCK_TRANSITION,
    FUTURE_TOLERANCE,
    Change,
    ChatRecord,
    bounded_calls,
    build,
    clock_start,
    details,
    title_of,
)

# A stamp older than this is checked against the chat's created_at (see ChatStore._sane).
_OLD_STAMP = 86_400.0
# Watch events coderd publishes only when a chat enters a status (pubsub.ChatEventKind).
TRANSITION_EVENTS = frozenset({"status_change", "created", "action_required"})


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """The store's counters as plain data (``/status`` and ``/metrics`` read this)."""

    chats: int
    stale_ignored: int
    synthesized: int
    overflow: int
    future_clamped: int
    before_created: int


class ChatStore:
    """Records by identity; bounded by ``capacity`` (overflow counted, never silent).
    What a listing's pages do to them is in :mod:`watchd.store.listing`, through
    :meth:`observe`, :meth:`note_listed` and :meth:`finish_listing`."""

    def __init__(self, *, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self._by_identity: dict[str, dict[str, ChatRecord]] = {}
        self._count = 0
        # Later sightings of unchanged chats (records are only replaced on change): by a
        # watch event or a confirmation, and (per identity, no key tuple per row) by a
        # listing.
        self._seen: dict[tuple[str, str], float] = {}
        self._listed: dict[str, dict[str, float]] = {}
        # identity -> chat id -> consecutive complete listings that lacked it.
        self._absent: dict[str, dict[str, int]] = {}
        # identity -> chats a stale-stamped observation said were in another status.
        self._contradicted: dict[str, set[str]] = {}
        self.overflow = 0
        self.stale_ignored = 0
        self.synthesized = 0
        # Timestamps not believed: ahead of the server clock (clamped), or before the
        # chat was created (not a clock at all), by identity.
        self.future_clamped: dict[str, int] = {}
        self.before_created: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    def snapshot(self) -> StoreSnapshot:
        return StoreSnapshot(
            chats=self._count,
            stale_ignored=self.stale_ignored,
            synthesized=self.synthesized,
            overflow=self.overflow,
            future_clamped=sum(self.future_clamped.values()),
            before_created=sum(self.before_created.values()),
        )

    def by_status(self, identity: str) -> dict[str, int]:
        """How many of the identity's chats are in each status (a copy)."""
        return {status: n for status, (n, _) in self.census(identity).items()}

    def census(self, identity: str) -> dict[str, tuple[int, float]]:
        """Per status: how many of the identity's chats are in it, and the earliest clock
        start among them (server time: the oldest chat's entry into that status). One
        pass, for a scrape."""
        out: dict[str, tuple[int, float]] = {}
        for r in self._by_identity.get(identity, {}).values():
            seen = out.get(r.status)
            out[r.status] = (1, r.since) if seen is None else (seen[0] + 1, min(seen[1], r.since))
        return out

    def get(self, identity: str, chat_id: str) -> ChatRecord | None:
        return self._by_identity.get(identity, {}).get(chat_id)

    def identity_of(self, chat_id: str) -> str | None:
        """The identity a chat belongs to (a look in each identity's table), or None."""
        for identity, recs in self._by_identity.items():
            if chat_id in recs:
                return identity
        return None

    def records(self, identity: str | None = None) -> Iterator[ChatRecord]:
        if identity is not None:
            yield from list(self._by_identity.get(identity, {}).values())
            return
        for recs in list(self._by_identity.values()):
            yield from list(recs.values())

    def identities(self) -> list[str]:
        return list(self._by_identity)

    def load(self, records: Iterable[ChatRecord]) -> int:
        n = 0
        for rec in records:
            self._by_identity.setdefault(rec.identity, {})[rec.chat_id] = rec
            n += 1
        self._count = sum(len(v) for v in self._by_identity.values())
        return n

    def absent(self, identity: str) -> dict[str, int]:
        """Chats missing from recent complete listings, not yet confirmed gone."""
        return dict(self._absent.get(identity, {}))

    def take_contradicted(self, identity: str) -> set[str]:
        """Chats an observation older than their record said were in another status, since
        the last call: overtaken (a read that raced an event), or stamped after the
        server's clock stepped back. Only a fresh read can tell; the watcher asks one."""
        return self._contradicted.pop(identity, set())

    def drop_identity(self, identity: str) -> list[ChatRecord]:
        self._absent.pop(identity, None)
        self._contradicted.pop(identity, None)
        self._listed.pop(identity, None)
        dropped = list(self._by_identity.pop(identity, {}).values())
        self._count -= len(dropped)
        for rec in dropped:
            self._seen.pop(rec.key, None)
        return dropped

    # -- observations -------------------------------------------------------------

    def observe(
        self, identity: str, chat: Observation, *, now: float, via: str, kind: str = ""
    ) -> Change | None:
        """Apply one observation of ``chat``. ``via`` is watch | listing | confirm; ``kind``
        is the watch event's.

        Archived (or deleted) chats are tombstoned. Returns None when nothing changed or
        the observation was stale.
        """
        recs = self._by_identity.get(identity)
        if recs is None:
            recs = self._by_identity[identity] = {}
        old = recs.get(chat.id)
        ts = chat.updated_at
        if ts is not None and (ts > now + FUTURE_TOLERANCE or ts < now - _OLD_STAMP):
            chat = self._sane(identity, chat, now=now)
        if self._absent:
            absent = self._absent.get(identity)
            if absent:
                absent.pop(chat.id, None)
        if chat.archived or kind == "deleted":
            if old is None:
                return None
            reason = "archived" if chat.archived else "deleted"
            return self._remove(identity, old, reason=reason, via=via)
        if old is None:
            return self._new(identity, chat, now=now, via=via, kind=kind)
        stamp, held = chat.updated_at, old.updated_at
        if stamp is not None and held is not None:
            if stamp < held and via != "confirm":  # a confirmation read is authoritative
                self.stale_ignored += 1
                if chat.status != old.status:
                    self._contradicted.setdefault(identity, set()).add(chat.id)
                return None
            if stamp > held and via == "watch" and kind in TRANSITION_EVENTS:
                # coderd publishes these only on a transition: the same status with a newer
                # stamp proves a round trip whose other events were lost (a re-entry).
                return self._transition(identity, chat, old, now, via)
        if chat.status != old.status:
            return self._transition(identity, chat, old, now, via)
        if (
            says_nothing_new(
                old,
                status=chat.status,
                updated_at=stamp,
                title=title_of(chat.title),
                queued=chat.queued_for_capacity,
            )
            and (
                via != "confirm"
                or details(chat) == (old.mode, old.client_type, old.context_error, old.warnings)
            )
            and (
                # The action_required event can come after a listing showed the same stamp:
                # it still says what is pending.
                not chat.tool_calls or bounded_calls(chat.tool_calls) == old.pending
            )
        ):
            # Nothing but our sighting moved: keep the record, note when we saw it.
            self._seen[(identity, chat.id)] = now
            return None
        rec = build(
            identity,
            chat,
            since=old.since,
            clock=old.clock,
            now=now,
            version=old.version,
            previous=old,
        )
        recs[chat.id] = rec
        return Change("refresh", rec, old, via=via)

    def _new(
        self, identity: str, chat: Observation, *, now: float, via: str, kind: str
    ) -> Change | None:
        if self._count >= self.capacity:
            self.overflow += 1
            return None
        clock = (
            CLOCK_TRANSITION if via == "watch" and kind in TRANSITION_EVENTS else CLOCK_LOWER_BOUND
        )
        rec = build(identity, chat, since=clock_start(chat, now), clock=clock, now=now, version=1)
        self._by_identity[identity][chat.id] = rec
        self._count += 1
        return Change("new", rec, None, via=via)

    def _transition(
        self, identity: str, chat: Observation, old: ChatRecord, now: float, via: str
    ) -> Change:
        """A new clock: seen on the stream (``transition``), or inferred from a listing or
        a read that shows another status (``synthesized``)."""
        if via == "watch":
            clock = CLOCK_TRANSITION
        else:
            clock = CLOCK_SYNTHESIZED
            self.synthesized += 1
        rec = build(
            identity,
            chat,
            since=clock_start(chat, now),
            clock=clock,
            now=now,
            version=old.version + 1,
            previous=old,
        )
        self._by_identity[identity][old.chat_id] = rec
        return Change("transition", rec, old, via=via)

    def _remove(self, identity: str, old: ChatRecord, *, reason: str, via: str) -> Change:
        del self._by_identity[identity][old.chat_id]
        self._count -= 1
        self._seen.pop((identity, old.chat_id), None)
        return Change("tombstone", old, old, reason=reason, via=via)

    def observe_events(
        self, identity: str, events: Iterable[WatchEvent], *, now: float
    ) -> list[Change]:
        """A burst of watch events, in order: what :meth:`observe` makes of each."""
        observe = self.observe
        changes: list[Change] = []
        for event in events:
            change = observe(identity, event.chat, now=now, via="watch", kind=event.kind)
            if change is not None:
                changes.append(change)
        return changes

    def _sane(self, identity: str, chat: Observation, *, now: float) -> Observation:
        """``chat`` with an ``updated_at`` that can serve as a clock: one past server-now
        (beyond the tolerance) is clamped to now; one before the chat's ``created_at`` is
        dropped (the observation time stands in). Both are counted by identity. Asked by
        :meth:`observe` only for a stamp past the tolerance or more than a day old (then
        ``created_at`` is read): the usual stamp costs no call."""
        ts = chat.updated_at
        assert ts is not None
        if ts > now + FUTURE_TOLERANCE:
            self.future_clamped[identity] = self.future_clamped.get(identity, 0) + 1
            return replace(chat, updated_at=now)
        created = chat.created()
        if created is not None and ts < created - FUTURE_TOLERANCE:
            self.before_created[identity] = self.before_created.get(identity, 0) + 1
            return replace(chat, updated_at=None)
        return chat

    # -- listings (the pages themselves are read by watchd.store.listing) ----------

    def note_listed(self, identity: str, chat_ids: Iterable[str], *, now: float) -> None:
        """A listing showed these chats unchanged: a sighting, for :meth:`finish_listing`."""
        listed = self._listed.setdefault(identity, {})
        for cid in chat_ids:
            listed[cid] = now

    def finish_listing(self, identity: str, present: set[str], *, started: float) -> dict[str, int]:
        """A *complete* listing ended: every known chat it lacked becomes (or stays)
        absent. Returns those chats with how many consecutive complete listings lacked
        them. Nothing is tombstoned here: absence is only a reason to confirm.

        Records observed after the listing ``started`` are spared: an event that
        arrived mid-listing is newer than the listing's view of absence.
        """
        recs = self._by_identity.get(identity, {})
        seen = self._seen
        listed = self._listed.get(identity, {})
        before = self._absent.get(identity, {})
        absent = {
            cid: before.get(cid, 0) + 1
            for cid, r in recs.items()
            if cid not in present
            and max(seen.get((identity, cid), 0.0), listed.get(cid, 0.0), r.seen_at) < started
        }
        if absent:
            self._absent[identity] = absent
        else:
            self._absent.pop(identity, None)
        if len(listed) > len(recs):
            # Sightings of chats since tombstoned: harmless (a record built later has a
            # later seen_at), but not kept forever.
            for cid in listed.keys() - recs.keys():
                del listed[cid]
        return dict(absent)

    def apply_listing(
        self, identity: str, chats: Iterable[Observation], *, now: float, started: float
    ) -> list[Change]:
        """A complete listing of observed chats: upsert every one and note what it lacks
        as absent. (The watcher applies raw pages with ``listing.observe_page``.)"""
        present: set[str] = set()
        changes: list[Change] = []
        for chat in chats:
            present.add(chat.id)
            change = self.observe(identity, chat, now=now, via="listing")
            if change is not None:
                changes.append(change)
        self.finish_listing(identity, present, started=started)
        return changes

    def tombstone(
        self, identity: str, chat_id: str, *, reason: str, via: str = ""
    ) -> Change | None:
        absent = self._absent.get(identity)
        if absent:
            absent.pop(chat_id, None)
        old = self._by_identity.get(identity, {}).get(chat_id)
        if old is None:
            return None
        return self._remove(identity, old, reason=reason, via=via)


def says_nothing_new(
    rec: ChatRecord, *, status: str, updated_at: float | None, title: str, queued: bool | None
) -> bool:
    """The one rule for "is this sighting news": the same status and ``updated_at``, no
    other title (an empty one says nothing) and no other capacity flag (None says
    nothing). Shared by every observation and by a listing's rows read only in part."""
    return (
        status == rec.status
        and updated_at == rec.updated_at
        and (not title or title == rec.title)
        and (queued is None or queued is rec.queued_for_capacity)
    )
