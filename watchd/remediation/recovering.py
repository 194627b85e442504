"""Recovering a chat whose execution state coderd found invalid: ``POST
…/reconcile-invalid`` (only when the operator opted in), and what each of its answers
means (docs/coder-api.md, "The invalid execution state").

It decides an outcome for one chat; the sweeper records it (progress, audit, ChatSwept).
It must never turn one chat's answer into a verdict on the identity's server: a 404 is
about the chat (missing, or hidden from the caller), not about the route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError

NOT_INVALID = "not in an invalid state"


@dataclass(frozen=True, slots=True)
class Outcome:
    """``state``: invalid (left for the operator) | reconciled (now ``error``: handled
    normally by later passes) | healed (the chat is consistent again: stop) | gave_up
    (gone) | retry (a failure to try again)."""

    state: str
    detail: str


async def recover(
    client: CoderClient,
    chat_id: str,
    *,
    said: str,
    opted_in: bool,
    acquire: Callable[[], Awaitable[object]],
) -> Outcome:
    """What became of a chat whose mutation answered 409 "Chat is in an invalid state."
    (``said`` describes that answer); ``acquire`` waits for the identity's action rate."""
    if not opted_in:
        return Outcome("invalid", f"{said}; left alone (sweep.reconcile_invalid is off)")
    await acquire()
    try:
        await client.reconcile_invalid(chat_id)
    except CoderError as err:
        if err.status == 409 and NOT_INVALID in err.message.lower():
            healed = f"{said}; reconcile-invalid answered 409 {err.message!r}: it healed"
            return await _reread(client, chat_id, "healed", healed)
        if err.status == 404:
            # The chat is missing or hidden, or (when it can still be read) this server
            # lacks the route: either way about this chat only.
            unsure = f"{said}; reconcile-invalid answered 404 for a chat this token can read"
            return await _reread(client, chat_id, "invalid", unsure)
        return Outcome("retry", f"reconcile-invalid failed: {err}")
    return Outcome("reconciled", f"{said}; reconcile-invalid accepted (the chat moves to error)")


async def _reread(client: CoderClient, chat_id: str, state: str, detail: str) -> Outcome:
    """Read the chat again after an answer about it: gone (404) or archived, else
    ``state`` with ``detail`` and its status now."""
    try:
        chat = await client.get_chat(chat_id)
    except CoderError as err:
        if err.status == 404:
            return Outcome("gave_up", "chat is gone (404), or hidden from this token")
        return Outcome("retry", f"read failed: {err}")
    except PayloadError as err:
        return Outcome("retry", f"read failed: {err}")
    if chat.archived:
        return Outcome("gave_up", "left alone: chat is archived")
    return Outcome(state, f"{detail} (now {chat.status})")
