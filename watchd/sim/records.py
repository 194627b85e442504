"""The simulator's records: users, workspaces, chats, scripted steps, faults, watch
subscribers, the error answer, and Go's RFC 3339 timestamps.

Plain data: the behaviour that moves them lives in :mod:`watchd.sim.state`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

ACTIVE = frozenset({"running", "pending", "interrupting"})
ARCHIVABLE = frozenset({"waiting", "error"})


def iso(ts: float, *, offset_minutes: int = 0) -> str:
    """Go's ``time.RFC3339Nano``, as coderd's ``encoding/json`` writes a ``time.Time``:
    0–9 fraction digits with trailing zeros trimmed (none at all on a whole second), and
    ``Z`` for UTC or ``±hh:mm`` for a time carried in another zone."""
    zone = UTC if not offset_minutes else timezone(timedelta(minutes=offset_minutes))
    whole = int(ts // 1)
    nanos = round((ts - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, 0
    dt = datetime.fromtimestamp(whole, tz=zone)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    if not offset_minutes:
        return text + "Z"
    sign = "+" if offset_minutes > 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    return f"{text}{sign}{hours:02d}:{minutes:02d}"


@dataclass
class Step:
    """Stay in ``status`` for ``after`` seconds, then move to the next step (None: forever)."""

    status: str
    after: float | None = None
    silent: bool = False  # the transition into this step is never published on the stream
    last_error: dict[str, Any] | None = None


@dataclass
class SimUser:
    id: str
    username: str
    token: str
    org_id: str
    revoked: bool = False
    quota_budget: int = -1
    credits_consumed: int = 0  # at rise_since (sim/quota.py adds the rise since then)
    rise_per_minute: float = 0.0
    rise_since: float = 0.0


# What coderd's provisioner server writes to a job it fails for quota (no error_code).
QUOTA_JOB_ERROR = "insufficient quota"


@dataclass
class SimWorkspace:
    id: str
    owner_id: str
    name: str
    build_status: str = "running"  # pending | starting | running | failed | stopped
    job_status: str = "succeeded"
    error_code: str = ""
    # The provisioner job's error text. coderd's real shape for a quota failure is this
    # text ("insufficient quota") with no error_code; the scenarios use it.
    job_error: str = ""
    cost: int = 10
    # Its one agent (codersdk.WorkspaceAgent): connecting | connected | disconnected |
    # timeout, and created | starting | start_timeout | start_error | ready | ….
    agent_status: str = "connected"
    agent_lifecycle: str = "ready"


@dataclass
class SimChat:
    id: str
    owner_id: str
    org_id: str
    title: str
    status: str
    created_at: float
    updated_at: float
    entered_at: float
    parent_id: str | None = None
    # Its family root (a subagent's spawning chat; a root's own id). Under the chat-tree
    # experiment a named chat has none (coderd leaves root_chat_id NULL and omits it).
    root_id: str | None = None
    # chat | subagent | root (the chat-tree experiment's per-owner root); on the wire only
    # while the experiment is on.
    kind: str = "chat"
    workspace_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    last_error: Any = None
    archived: bool = False
    pin_order: int = 0
    queued_for_capacity: bool = False
    # computer_use | explore | orchestrator, or None (omitted on the wire).
    mode: str | None = None
    client_type: str = "api"
    warnings: list[str] = field(default_factory=list)
    context_error: str | None = None
    # The execution state is inconsistent: every mutation answers 409 "Chat is in an
    # invalid state." until POST …/reconcile-invalid moves the chat to `error`.
    invalid_state: bool = False
    script: deque[Step] = field(default_factory=deque)
    # While running, bump updated_at this often (CommitStep); None: no progress at all.
    progress_every: float | None = None
    # Interrupt never completes (a wedged runner): stays `interrupting`.
    wedged: bool = False
    interrupt_settle: float = 1.0
    messages: list[dict[str, Any]] = field(default_factory=list)
    # What AI Gateway attributes to this chat (its own requests and those of the subagents
    # it spawned): GET …/chats/{chat}/cost answers the family root's.
    spend_micros: int = 0
    spend_requests: int = 0
    spend_unpriced: int = 0


@dataclass
class Faults:
    event_loss: float = 0.0  # fraction of watch events silently not delivered
    error_rate: float = 0.0  # fraction of REST requests answered with error_status
    error_status: int = 500
    latency: float = 0.0  # seconds added to every REST response
    throttle_next: int = 0  # the next N REST requests answer 429
    throttle_retry_after: float = 1.0
    malformed_next: int = 0  # the next N watch frames are garbage
    unavailable_until: float = 0.0  # monotonic; 503 for everything until then (restart)
    subscribe_fail: bool = False  # the watch handler's pubsub subscribe fails (HTTP 500)
    chatd_enabled: bool = True  # False: mutations answer 503 "AI Gateway must be enabled"
    enterprise: bool = True  # False: quota routes 404 (OSS build)
    # Pooled admission (PR #27902): at most this many root / subagent chats generate at
    # once; the rest stay `running`, unowned, queued_for_capacity, without progress.
    capacity_roots: int | None = None
    capacity_children: int | None = None
    # Every error body quotes the request's token (a proxy or a debug build that echoes
    # the request): the client must keep it out of everything it shows.
    echo_token: bool = False
    # A proxy in front with its own clock: every Date header this far off the server's.
    date_skew: float = 0.0


@dataclass(eq=False)
class Subscriber:
    user_id: str
    queue: asyncio.Queue[dict[str, Any] | None]
    dropped: int = 0
    agent: str = ""  # the watching client's User-Agent


class SimError(Exception):
    """An error answer: status and Coder's ``{message, detail}`` body."""

    def __init__(
        self,
        status: int,
        message: str,
        detail: str = "",
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        self.status = status
        self.headers = headers or {}
        self.body: dict[str, Any] = {"message": message, **extra}
        if detail:
            self.body["detail"] = detail
        super().__init__(message)
