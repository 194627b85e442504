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
    # MaxPaginationLimit = 100 (omitted → 100, >100 or <1 → 400); else default 50, uncapped.
    max_limit: int | None
    # Watch payload carries the full chat (newest) or a minimal one (older eras).
    full_watch_chat: bool
    # PublishChatWatchEvent refuses payloads over 6000 bytes (newest).
    publish_limit: int | None


ERAS: dict[str, Era] = {
    "A": Era("A", ("/api/experimental",), True, LEGACY, False, True, False, None, False, None),
    "B": Era(
        "B", ("/api/experimental",), False, LEGACY | CURRENT, False, False, False, None, False, None
    ),
    "C": Era("C", ("/api/experimental",), False, CURRENT, True, False, True, None, True, 6000),
    "D": Era(
        "D", ("/api/v2", "/api/experimental"), False, CURRENT, True, False, True, 100, True, 6000
    ),
    "E": Era("E", ("/api/v2",), False, CURRENT | {"paused"}, True, False, True, 100, True, 6000),
}
