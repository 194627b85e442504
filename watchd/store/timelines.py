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
bound; the oldest timelines go first). An entry reads as a tuple of the server time,
the source, the words and the status (:data:`Entry`), and the words never hold a
token: transport events are summarised from their typed fields (kind, attempt, code,
status, duration), never copied.

Kept compact, since every chat that moves has one: a chat with a few entries is one
flat tuple whose entries share their (source, words, status) per kind of transition;
a busier one keeps its times and entries in two lists. A transport event is kept as
its typed fields (a path's query and an error's text dropped at once) and put in
words only when the timeline is read: most entries age out unread.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol

from watchd.store.records import Change

Source = Literal["stream", "listing", "confirmation", "diagnosis", "alert", "sweep", "transport"]
Entry = tuple[float, str, str, str | None]  # (server time, source, what, status)
# What an entry says, without its time: (source, what, status), one shared object per
# kind of transition; or a transport event's typed fields (_FIELDS), put in words only
# when the timeline is read (most entries never are: they age out unread).
Said = tuple[Any, ...]


class Clock(Protocol):
    def now(self) -> float: ...


MAX_ENTRIES = 200
KEEP = 24 * 3600.0
VIA: dict[str, Source] = {"watch": "stream", "listing": "listing", "confirm": "confirmation"}
# A chat with at most this many entries, none dropped and no stream frame heard, is one
# flat tuple (identity, at, said, at, said, ...): most chats move a few times a day, and
# a tuple of a few items costs less than any object holding lists. Past it, _Busy.
SMALL = 8
_SHARED = 1000  # at most this many shared Said (statuses, sources and reasons are few)


class _Busy:
    """A chat past SMALL entries (or with drops, or a frame heard): the times (sorted,
    for bisect) and what each entry says, side by side."""

    __slots__ = ("dropped", "heard", "identity", "said", "times")

    def __init__(self, identity: str, times: list[float], said: list[Said]) -> None:
        self.identity = identity
        self.times = times
        self.said = said
        self.dropped = 0
        self.heard = 0.0  # the agent's last stream frame (ws:event: not an entry)


def _entry(at: float, said: Said) -> Entry:
    return (at, *said) if len(said) == 3 else (at, "transport", _words(said), None)


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
        # A chat's timeline: a flat tuple while small (see SMALL), else a _Busy.
        self._by_chat: dict[str, tuple[Any, ...] | _Busy] = {}
        self._small = 1 + 2 * min(SMALL, max_entries)  # the longest flat tuple
        self._said: dict[tuple[str, ...], Said] = {}  # shared by entries that say the same
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
        self._put(chat_id, identity, at, (source, what, status))

    def _put(self, chat_id: str, identity: str, at: float, said: Said) -> None:
        """The one place an entry is kept (every transition and forwarded event comes
        here): a new chat's flat tuple, a small one grown in order, else a _Busy."""
        by_chat = self._by_chat
        t = by_chat.get(chat_id)
        if t is None:
            if len(by_chat) >= self.max_chats:  # the oldest timeline goes
                del by_chat[next(iter(by_chat))]
                self.chats_dropped += 1
            by_chat[chat_id] = (identity, at, said)
            return
        if t.__class__ is tuple:
            if at >= t[-2] and len(t) < self._small:
                by_chat[chat_id] = t + (at, said)  # noqa: RUF005 (a third faster)
                return
            t = self._busy(chat_id)
        assert isinstance(t, _Busy)
        times = t.times
        if at >= times[-1]:
            times.append(at)
            t.said.append(said)
        else:  # a late stamp (a listing's) where it belongs, after its equals
            i = bisect_right(times, at)
            times.insert(i, at)
            t.said.insert(i, said)
        if len(times) > self.max_entries:
            del times[0], t.said[0]
            t.dropped += 1
            self.entries_dropped += 1

    def _busy(self, chat_id: str) -> _Busy:
        """The chat's flat tuple as a _Busy, in its place."""
        flat = self._by_chat[chat_id]
        if isinstance(flat, _Busy):
            return flat
        self._by_chat[chat_id] = busy = _Busy(flat[0], list(flat[1::2]), list(flat[2::2]))
        return busy

    def _shared(self, key: tuple[str, ...], said: tuple[str, str, str | None]) -> Said:
        """``said``, kept to be shared by every entry with the same ``key`` (while there is
        room: the keys are statuses, sources and reasons, which are few)."""
        return self._said.setdefault(key, said) if len(self._said) < _SHARED else said

    def changes(self, identity: str, changes: Iterable[Change], *, clock: Clock) -> None:
        """The store's changes: transitions (and re-entries), chats created on the
        stream, chats gone. A chat first seen in a listing adds nothing (its record says
        it); refreshes (progress, a title) add nothing. ``clock``: the identity's server
        clock, read only for what has no stamp of its own (a chat gone)."""
        shared = self._said
        for change in changes:
            kind = change.kind
            rec = change.record
            source = VIA.get(change.via, "listing")
            if kind == "transition":
                prev = change.previous
                key = (source, prev.status if prev is not None else "?", rec.status, rec.clock)
                said = shared.get(key)
                if said is None:
                    said = self._shared(key, _moved(*key))
                self._put(rec.chat_id, identity, rec.since, said)
            elif kind == "new" and source == "stream":
                status = rec.status
                said = self._shared(("new", status), (source, f"created: {status}", status))
                self._put(rec.chat_id, identity, rec.since, said)
            elif kind == "tombstone":
                what = f"gone: {change.reason}"
                said = self._shared(("gone", source, what), (source, what, None))
                self._put(rec.chat_id, identity, clock.now(), said)

    def transport(self, event: dict[str, object], at: float) -> None:
        """A forwarded transport event: one entry on the timeline of the chat it names
        (``chatId``, or ``/chats/<id>`` in an ``http:*`` path), if watchd knows that chat.
        Two kinds are not entries: ``ws:event`` (a stream's frames, hundreds a turn: only
        the last one's time is kept, for the silence evidence) and ``http:request`` (its
        ``http:response`` or ``http:error`` says the same, with the outcome)."""
        # Runs for every forwarded event (the pipeline's hook): written for the common
        # cases, a stream frame and an entry for a chat already talking, in order.
        get = event.get
        kind = get("type")
        chat_id = get("chatId")
        if kind == "ws:event":
            t = self._by_chat.get(chat_id) if chat_id.__class__ is str else None
            if t.__class__ is _Busy:
                if at > t.heard:  # noqa: PLR1730 (no call)
                    t.heard = at
            elif t is not None:
                self._busy(chat_id).heard = at  # type: ignore[arg-type]
            return
        if kind == "http:request":
            return
        if chat_id.__class__ is not str or not chat_id:
            chat_id = _chat_in_path(get("path"))
            if chat_id is None:
                return
        t = self._by_chat.get(chat_id)
        if t is None:
            identity = self.identity_of(chat_id) if self.identity_of is not None else None
            if identity is None:
                return
        # _FIELDS, read one by one (a third cheaper than through map).
        fields = (
            kind, get("attempt"), get("segment"), get("code"), get("status"),
            get("finishReason"), get("method"), get("path"), get("durationMs"), get("error"),
        )  # fmt: skip
        if fields[_PATH] is not None or fields[_ERROR] is not None:
            fields = _tame(fields)
        self._put(chat_id, identity if t is None else "", at, fields)  # type: ignore[arg-type]

    def get(self, chat_id: str) -> tuple[str, list[Entry], int] | None:
        """(identity, entries oldest first, entries dropped), or None."""
        t = self._by_chat.get(chat_id)
        if t is None:
            return None
        if isinstance(t, _Busy):
            return (t.identity, list(map(_entry, t.times, t.said)), t.dropped)
        return (t[0], list(map(_entry, t[1::2], t[2::2])), 0)

    def agent_said(self, chat_id: str, *, now: float) -> str:
        """:func:`agent_evidence` for one chat ("" for a chat with no timeline)."""
        found = self.get(chat_id)
        if found is None:
            return ""
        t = self._by_chat[chat_id]
        return agent_evidence(found[1], now, heard=t.heard if isinstance(t, _Busy) else 0.0)

    def prune(self, now: float) -> int:
        """Forget the timelines whose last entry is older than ``keep`` (server time)."""
        cutoff = now - self.keep
        old = [
            c
            for c, t in self._by_chat.items()
            if (t[-2] if t.__class__ is tuple else t.times[-1]) < cutoff  # type: ignore[union-attr]
        ]
        for c in old:
            del self._by_chat[c]
        return len(old)

    def snapshot(self) -> dict[str, int]:
        return {
            "chats": len(self._by_chat),
            "entries_dropped": self.entries_dropped,
            "chats_dropped": self.chats_dropped,
        }


def _moved(source: Source, was: str, status: str, clock: str) -> tuple[str, str, str | None]:
    what = (
        f"{was} → {status}"
        if was != status
        else f"left and re-entered {status} (a round trip the stream did not send)"
    )
    if clock == "synthesized":
        what += "; found by a listing, clock from updated_at (a lower bound)"
    return (source, what, status)


def _chat_in_path(path: object) -> str | None:
    if not isinstance(path, str):
        return None
    _, sep, rest = path.partition("/chats/")
    if not sep:
        return None
    chat = rest.split("/", 1)[0].split("?", 1)[0]
    return chat or None


# A transport event's fields that its words are made of, in their order (the typed
# fields only: never a header, body, URL, reason or error text).
_FIELDS = (
    "type", "attempt", "segment", "code", "status", "finishReason",
    "method", "path", "durationMs", "error",
)  # fmt: skip
_PATH, _ERROR = 7, 9
_SAID = ((1, " attempt="), (2, " segment="), (3, " code="), (4, " status="), (5, " finishReason="))
_PLAIN = (int, float, str)


def _tame(fields: Said) -> Said:
    """A path without its query and an error as its words: what is kept of an event
    holds no token and no free text (a query or an error message may carry either)."""
    path, error = fields[_PATH], fields[_ERROR]
    if path.__class__ is str:
        path = path.partition("?")[0]
    return (*fields[:_PATH], path, fields[_PATH + 1], _error_words(error) if error else None)


def _words(fields: Said) -> str:
    """A transport event's kept fields in words: its type, then each of attempt, segment,
    code, status and finishReason it has (``key=value``, at most 60 characters), method
    and path, duration, error."""
    kind = fields[0]
    words = kind if kind.__class__ is str else "?"
    for i, key in _SAID:
        value = fields[i]
        if value is not None and value.__class__ in _PLAIN:
            words += f"{key}{value}"[:61]
    method, path, ms, error = fields[_PATH - 1 :]
    if method.__class__ is str and path.__class__ is str:
        words += f" {method} {path}"[:131]
    if ms.__class__ is int or ms.__class__ is float:
        words += f" {ms / 1000:.1f}s"
    if error:
        words += " " + error
    return words


def describe(event: dict[str, object]) -> str:
    """An event in words, from its typed fields only (never a header, body or URL's
    query: a token must not reach a timeline)."""
    return _words(_tame(tuple(map(event.get, _FIELDS))))


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
