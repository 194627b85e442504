"""Families and chat trees in the sweep: which chat an archive goes to, and whether the
family lets it through now.

coderd archives a family atomically (``chatstate.SetFamilyArchived``): while any member
is not ``waiting``/``error`` it refuses the whole PATCH with 409 "Cannot archive an
active chat.", and its answer does not say which member. So the sweep looks at the
family first and names the member that holds it up, instead of sending a PATCH it knows
will be refused (three times, before giving up).

Which chat the archive goes to (:func:`archive_target`): a subagent's archive goes to its
root (coderd refuses a subagent's own with 400); every other chat is archived itself,
with or without a parent: under the ``chat-tree`` experiment (in flight upstream) a
named chat's parent is its owner's tree root or another named chat, and archiving it
covers its own subtree. The tree root itself (``kind: root``) is never archived (coderd:
400 "Chat tree root cannot be archived."). ``GET …/chats/tree`` is never called: it
creates the root and re-parents chats (it writes).

The family of the chat archived is what coderd's cascade covers: the chat and everything
under it by ``parent_chat_id`` (subagents; under the experiment named descendants too).
It is read from the chat store (kept current by the watch stream and the listings) and
from the target's own GET (its embedded ``children``); a member the store says is busy is
read again before it is named (at most :data:`MAX_MEMBER_READS` per look). Reads only:
this module never mutates a chat.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.observing import Observation, flatten
from watchd.store.chats import ChatStore
from watchd.store.records import title_of

# What coderd archives (its state machine allows W, E0, E1; `completed` is an older
# era's idle status). Anything else in the family refuses the archive.
ARCHIVABLE = frozenset({"waiting", "error", "completed"})
# Members the store says are busy that one look reads again, at most.
MAX_MEMBER_READS = 8


@dataclass(frozen=True, slots=True)
class Member:
    """A family member that holds the archive up."""

    chat_id: str
    title: str
    status: str

    @property
    def paused(self) -> bool:
        return self.status == "paused"

    def says(self) -> str:
        title = f' "{self.title[:80]}"' if self.title else ""
        return f"family member {self.chat_id}{title} is {self.status}"


@dataclass(frozen=True, slots=True)
class Look:
    """What the family says: where the archive goes (None: never, a tree root), the
    member that holds it up now (None: nothing seen does), and whether the target is
    archived already (another chat's archive took it)."""

    target: str | None
    blocker: Member | None
    archived: bool = False


def kind_of(kind: str | None, parent: str | None) -> str:
    """root | chat | subagent; a server that does not say (before the experiment) makes
    every chat with a parent a subagent."""
    return kind or ("subagent" if parent else "chat")


def archive_target(chat: Observation) -> str | None:
    """The chat an archive of ``chat`` is sent to (None: never, the tree root)."""
    kind = kind_of(chat.kind, chat.parent_chat_id)
    if kind == "root":
        return None
    if kind == "subagent":
        return chat.root_chat_id or chat.parent_chat_id
    return chat.id


class Kin:
    """The parent links of one identity's chats as the store holds them, indexed once:
    make one per sweep pass (the store moves between passes, and a pass may ask about
    many chats)."""

    def __init__(self, store: ChatStore, identity: str) -> None:
        self.store, self.identity = store, identity
        self.children: dict[str, list[tuple[str, str, str]]] = {}
        for rec in store.records(identity):
            if rec.parent_id:
                member = (rec.chat_id, rec.title, rec.status)
                self.children.setdefault(rec.parent_id, []).append(member)

    def descendants(self, top: str) -> Iterator[tuple[str, str, str]]:
        """(chat id, title, status) of every chat under ``top``, by parent."""
        queue, seen = [top], {top}
        while queue:
            for member in self.children.get(queue.pop(), ()):
                if member[0] not in seen:
                    seen.add(member[0])
                    queue.append(member[0])
                    yield member

    def blocker(self, chat_id: str) -> Member | None:
        """The first member of the family an archive of ``chat_id`` would cover that the
        store shows busy (no reads; a subagent's family is its parent's)."""
        rec = self.store.get(self.identity, chat_id)
        if rec is None:
            return None
        kind = kind_of(rec.kind, rec.parent_id)
        if kind == "root":
            return None
        top = rec.parent_id if kind == "subagent" and rec.parent_id else chat_id
        rec = self.store.get(self.identity, top)
        if rec is not None and rec.status not in ARCHIVABLE:
            return Member(rec.chat_id, rec.title, rec.status)
        for member in self.descendants(top):
            if member[2] not in ARCHIVABLE:
                return Member(*member)
        return None


async def look(client: CoderClient, store: ChatStore, identity: str, chat: Observation) -> Look:
    """Where an archive of ``chat`` (just read) goes and what holds it up now. Reads the
    target when it is not ``chat`` and re-reads the members the store shows busy (a 404
    one is gone); CoderError or PayloadError when the target cannot be read."""
    target = archive_target(chat)
    if target is None:
        return Look(None, None)
    top = chat if target == chat.id else await client.get_chat(target)
    if top.archived:
        return Look(target, None, archived=True)
    if top.status not in ARCHIVABLE:
        return Look(target, Member(top.id, title_of(top.title), top.status))
    # The target's own GET embeds its subagents with their statuses now.
    fresh = {c.id: c for c in flatten([top]) if c.id != top.id}
    for c in fresh.values():
        if c.status not in ARCHIVABLE and not c.archived:
            return Look(target, Member(c.id, title_of(c.title), c.status))
    reads = 0
    for chat_id, title, status in Kin(store, identity).descendants(target):
        if status in ARCHIVABLE or chat_id in fresh:
            continue
        if reads >= MAX_MEMBER_READS:
            return Look(target, Member(chat_id, title, status))  # as last seen
        reads += 1
        try:
            now = await client.get_chat(chat_id)
        except (CoderError, PayloadError) as exc:
            if isinstance(exc, CoderError) and exc.status == 404:
                continue  # gone: not in the family any more
            return Look(target, Member(chat_id, title, status))  # as last seen
        if now.status not in ARCHIVABLE and not now.archived:
            return Look(target, Member(now.id, title_of(now.title) or title, now.status))
    return Look(target, None)
