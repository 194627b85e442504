"""What a listing does to the chat store: each page's rows compared with the records
without being parsed when they say nothing new, the rest observed, and, once a listing
is complete, what it lacked noted as *absent* (never deleted: see
:mod:`watchd.store.chats`).

:class:`Listings` is the listing half of :class:`watchd.store.chats.ChatStore`, which
it is mixed into; it reads the store's records and sightings and calls its ``observe``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from watchd.coder.models import TITLE_MAX, Chat, flatten, parse_chat, timestamp
from watchd.coder.wire import ListedRow, ListingPage
from watchd.store.records import Change, ChatRecord


class Listings:
    """Listing pages into the store (mixed into ChatStore, whose state it shares)."""

    _by_identity: dict[str, dict[str, ChatRecord]]
    _seen: dict[tuple[str, str], float]
    _listed: dict[str, dict[str, float]]
    _absent: dict[str, dict[str, int]]

    def observe(
        self, identity: str, chat: Chat, *, now: float, via: str, kind: str = ""
    ) -> Change | None:
        raise NotImplementedError  # ChatStore.observe

    def apply_listing(
        self, identity: str, chats: Iterable[Chat], *, now: float, started: float
    ) -> list[Change]:
        """A complete listing of parsed chats: upsert every row and note what it lacks
        as absent. (The watcher applies raw pages with :meth:`observe_rows`.)"""
        present: set[str] = set()
        changes: list[Change] = []
        for chat in chats:
            present.add(chat.id)
            change = self.observe(identity, chat, now=now, via="listing")
            if change is not None:
                changes.append(change)
        self.finish_listing(identity, present, started=started)
        return changes

    def observe_rows(
        self, identity: str, rows: ListingPage | list[Any], *, now: float, present: set[str]
    ) -> list[Change]:
        """One page of a listing (raises PayloadError naming a bad row): a
        :class:`ListingPage`, or rows decoded in full.

        A row that says nothing new about a chat we hold (the same status, updated_at,
        title and capacity flag: what :meth:`observe` would ignore) is only noted as
        seen, without being parsed. That is most rows of most reconciles; a page whose
        compared fields were decoded alone is decoded in full only if a row is news.
        """
        if not isinstance(rows, ListingPage):
            return self._observe_full(identity, rows, now=now, present=present)
        page = rows
        compared = page.rows
        if compared is None:
            return self._observe_full(identity, page.full(), now=now, present=present)
        changes: list[Change] = []
        recs = self._by_identity.get(identity) or {}
        listed = self._listed.setdefault(identity, {})
        full: list[Any] | None = None
        # What is noted is keyed by the record's own id string (shared), not the row's.
        for i, row in enumerate(compared):
            rec = recs.get(row.id)  # type: ignore[arg-type]  # ids are checked strings
            if rec is not None and _listed_unchanged(row, rec):
                present.add(rec.chat_id)
                listed[rec.chat_id] = now
                continue
            if full is None:
                full = page.full()
            self._news(identity, full[i], i, now=now, present=present, changes=changes)
        return changes

    def _observe_full(
        self, identity: str, rows: list[Any], *, now: float, present: set[str]
    ) -> list[Change]:
        """:meth:`observe_rows` for rows decoded in full (dicts, or whatever the page held)."""
        changes: list[Change] = []
        recs = self._by_identity.get(identity) or {}
        listed = self._listed.setdefault(identity, {})
        for i, row in enumerate(rows):
            cid = row.get("id") if type(row) is dict else None
            rec = recs.get(cid) if type(cid) is str else None
            if rec is not None and _unchanged(row, rec):
                present.add(rec.chat_id)
                listed[rec.chat_id] = now
                continue
            self._news(identity, row, i, now=now, present=present, changes=changes)
        return changes

    def _news(
        self,
        identity: str,
        row: Any,
        i: int,
        *,
        now: float,
        present: set[str],
        changes: list[Change],
    ) -> None:
        """A listing row that may say something new: parsed (raises PayloadError naming
        it), then observed with its children."""
        chat = parse_chat(row, where=f"chats[{i}]")
        for c in flatten([chat]) if chat.children else (chat,):
            present.add(c.id)
            change = self.observe(identity, c, now=now, via="listing")
            if change is not None:
                changes.append(change)

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


def _unchanged(row: dict[str, Any], rec: ChatRecord) -> bool:
    """True when :meth:`ChatStore.observe` would find nothing new in this listing row."""
    if row.get("status") != rec.status or row.get("archived") is True or row.get("children"):
        return False
    ts = row.get("updated_at")
    if type(ts) is not str or not _same_stamp(ts, rec):
        return False
    title = row.get("title")
    if title and (type(title) is not str or title[:TITLE_MAX] != rec.title):
        return False
    queued = row.get("queued_for_capacity")
    return queued is None or queued is rec.queued_for_capacity


def _listed_unchanged(row: ListedRow, rec: ChatRecord) -> bool:
    """:func:`_unchanged` for a row decoded as :class:`ListedRow` (its fields are of the
    types coderd sends; a page with any other was decoded in full instead)."""
    if row.status != rec.status or row.archived or row.children:
        return False
    ts = row.updated_at
    if not ts or not _same_stamp(ts, rec):
        return False
    title = row.title
    if title and title[:TITLE_MAX] != rec.title:
        return False
    queued = row.queued_for_capacity
    return queued is None or queued is rec.queued_for_capacity


def _same_stamp(ts: str, rec: ChatRecord) -> bool:
    """Whether a row's ``updated_at`` text is the record's stamp (a stamp that does not
    parse is news: the parser will say what is wrong with it)."""
    if rec.updated_at is None:
        return False
    try:
        return timestamp(ts) == rec.updated_at
    except ValueError:
        return False
