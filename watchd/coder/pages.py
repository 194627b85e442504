"""A listing page as the store reads it: the few fields of each row that say whether it
is news (:class:`ListedRow`, decoded by msgspec without building the rest), and the
rows in full only when someone asks (:meth:`ListingPage.full`), each news row then read
by :func:`~watchd.coder.observing.from_json`.

It never rejects a page itself: a body that does not fit the well-typed shape coderd
sends is decoded in full and judged by the tolerant reader, which names the bad row.
One difference is deliberate: a page whose rows are all unchanged is accepted even when
a field watchd never reads holds what orjson refuses (a number out of double range),
since the full decode is never asked for; coderd's encoder cannot write one.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec
import orjson

from watchd.coder.errors import PayloadError
from watchd.coder.observing import from_json


class ListedRow(msgspec.Struct, gc=False):
    """What the store compares to decide that a listing row says nothing new about a chat
    it holds (``watchd.store.chats``): the rest of the row is skipped, not built."""

    id: str | None = None
    status: str | None = None
    updated_at: str | None = None
    title: str | None = None
    archived: bool | None = None
    queued_for_capacity: bool | None = None
    # Only whether there are any: a row with children is always read in full.
    children: list[msgspec.Raw] | None = None


_listing_decoder = msgspec.json.Decoder(list[ListedRow])


class ListingPage:
    """One page of a listing: its ``ids`` (checked: non-empty strings), the compared
    fields of each row (``rows``, or None when only the tolerant reader can judge the
    page), and the rows in full, decoded from ``body`` only if someone asks."""

    __slots__ = ("_full", "body", "ids", "rows")

    def __init__(
        self,
        body: bytes,
        *,
        rows: list[ListedRow] | None,
        ids: list[str],
        full: list[Any] | None = None,
    ) -> None:
        self.body = body
        self.rows = rows
        self.ids = ids
        self._full = full

    def __len__(self) -> int:
        return len(self.ids)

    def full(self) -> list[Any]:
        """The rows as the tolerant reader takes them (decoded dicts, for ``from_json``)."""
        if self._full is None:
            # As Response.json() has it: no body is None, a body not JSON is its text.
            decoded: Any = None
            if self.body:
                try:
                    decoded = orjson.loads(self.body)
                except ValueError:
                    decoded = self.body.decode("utf-8", "replace")
            if not isinstance(decoded, list):
                raise PayloadError("chats", f"expected a JSON array, got {type(decoded).__name__}")
            self._full = decoded
        return self._full


def decode_listing(body: bytes) -> list[ListedRow] | None:
    """A listing page's compared fields, or None when only the tolerant reader can judge
    the page (not an array of objects, a compared field of another type, malformed)."""
    if not body.isascii():
        # msgspec skips an ignored string without checking its UTF-8; orjson refuses the
        # whole body. Checking here keeps the two paths agreeing on every byte string.
        try:
            body.decode()
        except UnicodeDecodeError:
            return None
    try:
        return _listing_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None


def read_page(body: bytes, *, compared: bool = True) -> ListingPage:
    """A listing response body as a page; raises PayloadError naming a bad row (or the
    listing, when the body is not an array). With ``compared`` the rows are decoded as
    :class:`ListedRow` where msgspec can, else (and without it) in full."""
    rows = decode_listing(body) if compared else None
    if rows is not None:
        ids = [r.id for r in rows]
        if not all(ids):  # an id that is None or ""
            i = next(i for i, cid in enumerate(ids) if not cid)
            raise PayloadError(f"chats[{i}].id", "missing or not a string")
        return ListingPage(body, rows=rows, ids=cast("list[str]", ids))
    page = ListingPage(body, rows=None, ids=[])
    checked: list[str] = []
    for i, row in enumerate(page.full()):
        chat_id = row.get("id") if isinstance(row, dict) else None
        if not isinstance(chat_id, str) or not chat_id:
            from_json(row, where=f"chats[{i}]")  # raises, naming what is wrong
            raise PayloadError(f"chats[{i}].id", "missing or not a string")
        checked.append(chat_id)
    page.ids = checked
    return page
