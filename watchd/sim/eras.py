"""What differs between the API eras (``coder-chats-api.md`` §0)."""

from __future__ import annotations

from dataclasses import dataclass

LEGACY = frozenset({"waiting", "pending", "running", "paused", "completed", "error"})
CURRENT = frozenset({"waiting", "running", "error", "requires_action", "interrupting"})


@dataclass(frozen=True)
class Era:
    name: str
    prefixes: tuple[str, ...]
    # {type, data} envelopes and JSON {"type":"ping"} keepalives (era A).
    envelope: bool
    statuses: frozenset[str]
    # Interrupt/archive go through the state machine and answer 409 (C and later);
    # earlier servers set `waiting` directly and always answer 200/204.
    state_machine: bool
    # Archive is POST …/archive (era A) rather than PATCH {"archived": true}.
    archive_post: bool
    # Listing pages root chats only, children embedded (PR #24404); else flat.
    embed_children: bool
    # POST …/chats/{id}/reconcile-invalid exists (newest servers only).
    reconcile_invalid: bool
    # Watch payload carries the full chat (newest) or a minimal one (older eras).
    full_watch_chat: bool
    # PublishChatWatchEvent refuses payloads over 6000 bytes (newest).
    publish_limit: int | None
    # GET …/chats/{chat}/cost exists (getChatCost, the v2.37 line on).
    chat_cost: bool = False


# No era caps the page size: ``limit`` is any non-negative int32, 0/absent meaning 50
# (``ParsePagination``; ``MaxPaginationLimit`` exists nowhere in coder/coder).
ERAS: dict[str, Era] = {
    "A": Era("A", ("/api/experimental",), True, LEGACY, False, True, False, False, False, None),
    "B": Era(
        "B",
        ("/api/experimental",),
        False,
        LEGACY | CURRENT,
        False,
        False,
        False,
        False,
        False,
        None,
    ),
    "C": Era("C", ("/api/experimental",), False, CURRENT, True, False, True, False, True, 6000),
    "D": Era(
        "D",
        ("/api/v2", "/api/experimental"),
        False,
        CURRENT,
        True,
        False,
        True,
        False,
        True,
        6000,
        chat_cost=True,
    ),
    "E": Era(
        "E",
        ("/api/v2",),
        False,
        CURRENT | {"paused"},
        True,
        False,
        True,
        True,
        True,
        6000,
        chat_cost=True,
    ),
}
