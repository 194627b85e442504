"""What watchd knows of one chat, oldest first: its timeline (fleet.md §4).

Entries come from every part that learns something about a chat: the store's changes
(a transition and how it was learned: stream, listing or confirmation read), the
ledger (alerts fired and resolved, with fingerprints; a cause that moved), the sweep
(its actions) and the agents' forwarded transport events that name the chat. The
chat's current state (status, clock, verdict) is not an entry: the endpoint reads it
from the store and the ledger when asked, so a chat that never moved costs nothing here.

Bounded three ways, every drop counted: at most ``MAX_ENTRIES`` per chat (the oldest
go, counted in the chat's ``dropped``), chats whose last entry is older than ``KEEP``
are forgotten (:meth:`Timelines.prune`), and at most ``max_chats`` chats (the store's
bound; the oldest timelines go first). An entry is a tuple of the server time,
the source, the words and the status, and the words never hold a token: transport
events are summarised from their typed fields (kind, attempt, code, status, duration),
never copied.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable
from typing import Literal, Protocol

from watchd.store.records import Change

Source = Literal["stream", "listing", "confirmation", "diagnosis", "alert", "sweep", "transport"]
Entry = tuple[float, str, str, str | None]  # (server time, source, what, status)


class Clock(Protocol):
    def now(self) -> float: ...


MAX_ENTRIES = 200
KEEP = 24 * 3600.0
VIA: dict[str, Source] = {"watch": "stream", "listing": "listing", "confirm": "confirmation"}


class _Timeline:
    __slots__ = ("dropped", "entries", "heard", "identity", "last")

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.entries: list[Entry] = []
        self.dropped = 0
        self.last = 0.0
        self.heard = 0.0  # the agent's last stream frame (ws:event: not an entry)


class Timelines:
    """Every chat's timeline, by chat id (chat ids are unique across identities)."""

    def __init__(
        self,
        *,
        max_chats: int = 1_000_000,
        max_entries: int = MAX_ENTRIES,
        keep: float = KEEP,
        identity_of: Callable[[str], str | None] | None = None,
    ) -> None:
        """``identity_of(chat_id)``: the identity a chat watchd knows belongs to (the
        store's answer), else None: transport events name only the chat."""
        self.max_chats = max_chats
        self.max_entries = max_entries
        self.keep = keep
        self.identity_of = identity_of
        self._by_chat: dict[str, _Timeline] = {}
        self._said: dict[tuple[str, str, bool], str] = {}  # a transition's words, shared
        self.entries_dropped = 0  # cut from a chat's timeline at MAX_ENTRIES
        self.chats_dropped = 0  # whole timelines forgotten at max_chats

    def __len__(self) -> int:
        return len(self._by_chat)

    def add(
        self,
        chat_id: str,
        identity: str,
        at: float,
        source: Source,
        what: str,
        *,
        status: str | None = None,
    ) -> None:
        by_chat = self._by_chat
        t = by_chat.get(chat_id)
        if t is None:
            if len(by_chat) >= self.max_chats:  # the oldest timeline goes
                del by_chat[next(iter(by_chat))]
                self.chats_dropped += 1
            t = by_chat[chat_id] = _Timeline(identity)
        entries = t.entries
        entry = (at, source, what, status)
        if entries and at < entries[-1][0]:
            insort(entries, entry, key=_at)  # a late stamp (a listing's) where it belongs
        else:
            entries.append(entry)
        if len(entries) > self.max_entries:
            del entries[0]
            t.dropped += 1
            self.entries_dropped += 1
        t.last = max(t.last, at)

    def changes(self, identity: str, changes: Iterable[Change], *, clock: Clock) -> None:
        """The store's changes: transitions (and re-entries), chats created on the
        stream, chats gone. A chat first seen in a listing adds nothing (its record says
        it); refreshes (progress, a title) add nothing. ``clock``: the identity's server
        clock, read only for what has no stamp of its own (a chat gone)."""
        by_chat, said, most = self._by_chat, self._said, self.max_entries
        for change in changes:
            kind = change.kind
            rec = change.record
            source = VIA.get(change.via, "listing")
            if kind == "transition":
                prev = change.previous
                was = prev.status if prev is not None else "?"
                key = (was, rec.status, rec.clock == "synthesized")
                what = said.get(key)
                if what is None:
                    what = _moved(*key)
                    if len(said) < 1000:  # statuses are few: the words are shared
                        said[key] = what
                # The watch path's common case inline (a known chat, in order, room left):
                # this runs once per transition of every chat.
                t = by_chat.get(rec.chat_id)
                at = rec.since
                if t is not None and (e := t.entries) and at >= e[-1][0] and len(e) < most:
                    e.append((at, source, what, rec.status))
                    t.last = at  # entries are in time order: the last is the latest
                    continue
                self.add(rec.chat_id, identity, at, source, what, status=rec.status)
            elif kind == "new" and source == "stream":
                what = f"created: {rec.status}"
                self.add(rec.chat_id, identity, rec.since, source, what, status=rec.status)
            elif kind == "tombstone":
                self.add(rec.chat_id, identity, clock.now(), source, f"gone: {change.reason}")

    def transport(self, event: dict[str, object], at: float) -> None:
        """A forwarded transport event: one entry on the timeline of the chat it names
        (``chatId``, or ``/chats/<id>`` in an ``http:*`` path), if watchd knows that chat.
        Two kinds are not entries: ``ws:event`` (a stream's frames, hundreds a turn: only
        the last one's time is kept, for the silence evidence) and ``http:request`` (its
        ``http:response`` or ``http:error`` says the same, with the outcome)."""
        kind = event.get("type")
        chat_id = event.get("chatId")
        if kind == "ws:event":
            t = self._by_chat.get(chat_id) if chat_id.__class__ is str else None
            if t is not None and at > t.heard:
                t.heard = at
            return
        if kind == "http:request":
            return
        if chat_id.__class__ is not str or not chat_id:
            chat_id = _chat_in_path(event.get("path"))
            if chat_id is None:
                return
        assert isinstance(chat_id, str)
        t = self._by_chat.get(chat_id)
        identity = t.identity if t is not None else None
        if identity is None and self.identity_of is not None:
            identity = self.identity_of(chat_id)
        if identity is None:
            return
        self.add(chat_id, identity, at, "transport", describe(event))

    def get(self, chat_id: str) -> tuple[str, list[Entry], int] | None:
        """(identity, entries oldest first, entries dropped), or None."""
        t = self._by_chat.get(chat_id)
        return None if t is None else (t.identity, list(t.entries), t.dropped)

    def agent_said(self, chat_id: str, *, now: float) -> str:
        """:func:`agent_evidence` for one chat ("" for a chat with no timeline)."""
        t = self._by_chat.get(chat_id)
        return agent_evidence(t.entries, now, heard=t.heard) if t is not None else ""

    def prune(self, now: float) -> int:
        """Forget the timelines whose last entry is older than ``keep`` (server time)."""
        cutoff = now - self.keep
        old = [c for c, t in self._by_chat.items() if t.last < cutoff]
        for c in old:
            del self._by_chat[c]
        return len(old)

    def snapshot(self) -> dict[str, int]:
        return {
            "chats": len(self._by_chat),
            "entries_dropped": self.entries_dropped,
            "chats_dropped": self.chats_dropped,
        }


def _moved(was: str, status: str, synthesized: bool) -> str:
    what = (
        f"{was} → {status}"
        if was != status
        else f"left and re-entered {status} (a round trip the stream did not send)"
    )
    if synthesized:
        what += "; found by a listing, clock from updated_at (a lower bound)"
    return what


def _at(e: Entry) -> float:
    return e[0]


def _chat_in_path(path: object) -> str | None:
    if not isinstance(path, str):
        return None
    _, sep, rest = path.partition("/chats/")
    if not sep:
        return None
    chat = rest.split("/", 1)[0].split("?", 1)[0]
    return chat or None


_SAID = ("attempt", "segment", "code", "status", "finishReason")
_PLAIN = (int, float, str)


def describe(event: dict[str, object]) -> str:
    """An event in words, from its typed fields only (never a header, body or URL's
    query: a token must not reach a timeline)."""
    get = event.get
    kind = get("type")
    parts = [kind if kind.__class__ is str else "?"]
    for key in _SAID:
        value = get(key)
        if value is not None and value.__class__ in _PLAIN:
            parts.append(f"{key}={value}"[:60])
    method, path = get("method"), get("path")
    if method.__class__ is str and path.__class__ is str:
        parts.append(f"{method} {path.partition('?')[0]}"[:130])
    ms = get("durationMs")
    if ms is not None and ms.__class__ in (int, float):
        parts.append(f"{ms / 1000:.1f}s")
    error = get("error")
    if error:
        parts.append(_error_words(error))
    return " ".join(parts)


# The SDK's error classes a timeline may name (a closed set: never free text).
_ERROR_NAMES = frozenset({"CoderChatError", "CoderStreamError", "AbortError", "TimeoutError"})
TIMED_OUT = "ran into requestTimeoutMs"


def _error_words(error: object) -> str:
    """``error``, with the SDK's class name when it is one of its own, and whether the
    segment ran into its ``requestTimeoutMs`` (the message is read for that one word,
    never copied)."""
    if not isinstance(error, dict):
        return "error"
    name = error.get("name")
    words = f"error {name}" if name in _ERROR_NAMES else "error"
    message = error.get("message")
    if isinstance(message, str) and "requestTimeoutMs" in message:
        words += f" ({TIMED_OUT})"
    return words


SILENT_AFTER = 120.0  # an open stream quiet this long is worth saying
REDIALS_WINDOW = 300.0
REDIALS_SAID = 3
_OPEN = ("ws:open", "ws:event", "segment:start")


def agent_evidence(entries: list[Entry], now: float, *, heard: float = 0.0) -> str:
    """What the agent's forwarded events say about a stuck chat, in words ("" when they
    say nothing): a storm of redials, or a stream open and silent (``heard``: the time of
    its last frame, which is not an entry). Evidence for the hint and the timeline, never a
    ground for firing."""
    transport = [e for e in entries if e[1] == "transport"]
    if not transport:
        return ""
    said = []
    redials = sum(
        1
        for at, _, what, _ in transport
        if what.startswith("ws:redial") and now - at <= REDIALS_WINDOW
    )
    if redials >= REDIALS_SAID:
        said.append(f"the agent redialled its stream {redials} times in the last 5 min")
    settles = [e for e in transport if e[2].startswith("segment:settle")]
    if settles and TIMED_OUT in settles[-1][2]:
        said.append("the agent's last segment ran into its requestTimeoutMs")
    at, _, what, _ = transport[-1]
    quiet = now - max(at, heard)
    if what.startswith(_OPEN) and quiet >= SILENT_AFTER:
        minutes = int(quiet // 60)
        said.append(
            f"the agent's stream has been open and silent for {minutes} min "
            f"(last event: {what.split(' ', 1)[0]})"
        )
    return "; ".join(said)
