"""The sweep's archive step: look at the family (:mod:`watchd.remediation.families`),
then ``PATCH {"archived": true}`` the chat it goes to, and what each answer means.

It decides an outcome for one chat; the sweeper records it (progress, audit, ChatSwept),
as it does :mod:`watchd.remediation.recovering`'s. coderd's answers (docs/coder-api.md):
204 archived (the family with it); 400 "already archived" is done; 409 "paused at a
queued message under edit" is the owner editing, not a failure; 409 "Chat is in an
invalid state." goes to the invalid-state path; any other 409 is a member the look could
not see still active (tried again on later passes, three times at most); 400 "Chat tree
root cannot be archived." is never tried again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.observing import Observation
from watchd.remediation.families import look
from watchd.store.chats import ChatStore

# The sweep's word for a paused chat, or a family coderd will not archive because one is.
OWNER_EDITING = "owner editing"
WAITS = "archive waits for the family (coderd archives it whole, never while a member is busy)"


@dataclass(frozen=True, slots=True)
class Archival:
    """``state``: archived | blocked (a member is busy: looked at again on later passes) |
    owner_editing | gave_up | retry | invalid (``error`` is coderd's answer, ``target``
    the chat it was about)."""

    state: str
    detail: str
    target: str | None = None
    error: CoderError | None = None


async def archive(
    client: CoderClient,
    store: ChatStore,
    identity: str,
    chat: Observation,
    *,
    acquire: Callable[[], Awaitable[object]],
) -> Archival:
    """Archive ``chat`` (just read, settled) through the chat its archive goes to, unless
    its family holds it up; ``acquire`` waits for the identity's action rate."""
    try:
        seen = await look(client, store, identity, chat)
    except (CoderError, PayloadError) as exc:
        return Archival("retry", f"family read failed: {exc}")
    target = seen.target
    if target is None:
        return Archival("gave_up", "left alone: a chat-tree root is never archived")
    if seen.archived:
        return Archival("archived", f"archived already (its root {target})", target)
    member = seen.blocker
    if member is not None and member.paused:
        return Archival("owner_editing", f"archive left ({OWNER_EDITING}): {member.says()}")
    if member is not None:
        return Archival("blocked", f"{WAITS}: {member.says()}", target)
    await acquire()
    try:
        await client.archive(target)
    except CoderError as exc:
        return _answer(exc, target)
    via = f" via its root {target}" if target != chat.id else ""
    return Archival("archived", "archived" + via, target)


def _answer(exc: CoderError, target: str) -> Archival:
    """What a refused archive of ``target`` means."""
    said = exc.message.lower()
    if exc.invalid_state:
        return Archival("invalid", "", target, exc)
    if exc.status == 400 and "already archived" in said:
        return Archival("archived", "archived (it already was)", target)
    if exc.status == 409 and "paused" in said:
        return Archival("owner_editing", f"archive refused ({OWNER_EDITING}): {exc.message}")
    if exc.status == 400 and "tree root" in said:
        return Archival("gave_up", f"left alone: coderd answered 400 {exc.message!r}")
    if exc.status == 409:
        return Archival(
            "retry",
            f"archive refused: {exc.message} (a family member watchd does not see is busy)",
        )
    if exc.status == 400 and "root chat" in exc.message:
        return Archival("retry", f"archive refused: {exc.message}")
    return Archival("retry", f"archive failed: {exc}")
