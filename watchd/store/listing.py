"""What a listing page does to the chat store: each row compared with its record without
being read in full when it says nothing new, the rest observed.

Functions over :class:`~watchd.store.chats.ChatStore`'s public face (``get``,
``observe``, ``note_listed``): whether a row is news is the store's one rule
(:func:`~watchd.store.chats.says_nothing_new`), asked here of the few fields a
:class:`~watchd.coder.pages.ListedRow` holds. What a *complete* listing lacked is the
store's to judge (:meth:`~watchd.store.chats.ChatStore.finish_listing`).
"""

from __future__ import annotations

from typing import Any

from watchd.coder.observing import flatten, from_json, timestamp
from watchd.coder.pages import ListingPage
from watchd.store.chats import ChatStore, says_nothing_new
from watchd.store.records import Change, title_of


def observe_page(
    store: ChatStore, identity: str, page: ListingPage, *, now: float, present: set[str]
) -> list[Change]:
    """One page of a listing (raises PayloadError naming a bad row).

    A row that says nothing new about a chat the store holds is only noted as seen,
    without being read in full. That is most rows of most reconciles; a page whose
    compared fields were decoded alone is decoded in full only if a row is news, and a
    page the fast decoder could not read is read row by row by the tolerant reader.
    """
    compared = page.rows
    if compared is None:
        return _observe_rows(store, identity, page.full(), now=now, present=present)
    changes: list[Change] = []
    get = store.get
    unchanged: list[str] = []
    full: list[Any] | None = None
    try:
        for i, row in enumerate(compared):
            # What is noted is keyed by the record's own id string (shared), not the row's.
            rec = get(identity, row.id)  # type: ignore[arg-type]  # ids are checked strings
            if rec is not None and not row.archived and not row.children:
                stamp = _stamp(row.updated_at)
                if says_nothing_new(
                    rec,
                    status=row.status or "",
                    updated_at=stamp,
                    title=title_of(row.title),
                    queued=row.queued_for_capacity,
                ) and (stamp is not None or row.updated_at is None):
                    unchanged.append(rec.chat_id)
                    continue
            if full is None:
                full = page.full()
            changes.extend(_observe_row(store, identity, full[i], i, now=now, present=present))
    finally:
        # Even when a later row is refused: what was read before it was seen.
        if unchanged:
            present.update(unchanged)
            store.note_listed(identity, unchanged, now=now)
    return changes


def _observe_rows(
    store: ChatStore, identity: str, rows: list[Any], *, now: float, present: set[str]
) -> list[Change]:
    changes: list[Change] = []
    for i, row in enumerate(rows):
        changes.extend(_observe_row(store, identity, row, i, now=now, present=present))
    return changes


def _observe_row(
    store: ChatStore, identity: str, row: Any, i: int, *, now: float, present: set[str]
) -> list[Change]:
    """A listing row that may say something new: read (raises PayloadError naming it),
    then observed with its children."""
    chat = from_json(row, where=f"chats[{i}]")
    changes: list[Change] = []
    for c in flatten([chat]) if chat.children else (chat,):
        present.add(c.id)
        change = store.observe(identity, c, now=now, via="listing")
        if change is not None:
            changes.append(change)
    return changes


def _stamp(text: str | None) -> float | None:
    """A row's ``updated_at`` as the store holds stamps; None when absent or unreadable
    (an unreadable one is news: the tolerant reader will say what is wrong with it)."""
    if not text:
        return None
    try:
        return timestamp(text)
    except ValueError:
        return None
