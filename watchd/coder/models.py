"""Coder's vocabulary beside the chats themselves, and the tolerant frame reader.

The status vocabulary, users, workspace builds, quota payloads, and
:func:`parse_watch_frame`, which reads a watch frame of any era (bare events and
era-A envelopes) when the fast decoder (:mod:`watchd.coder.wire`) cannot. A chat
inside any payload is read by :mod:`watchd.coder.observing`, the one place that
turns a chat payload into what the store accepts. Plain functions over dicts, not
pydantic: readers here stay cheap per payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, get_args

import orjson
from msgspec.structs import replace

from watchd.coder.errors import PayloadError
from watchd.coder.observing import Quota, ToolCall, WatchEvent, as_text, from_json

# The one status vocabulary. The wire keeps ``str`` (Chat.status, ChatRecord.status): a
# server may send a status this build does not know, and it is kept, armed with the
# default budget and counted as ``status="other"``; code that names a status uses these.
ActiveStatus = Literal["running", "pending", "interrupting"]
BlockedStatus = Literal["requires_action"]
IdleStatus = Literal["waiting", "completed", "paused", "error"]
ChatStatus = Literal[ActiveStatus, BlockedStatus, IdleStatus]

ACTIVE_STATUSES: frozenset[ChatStatus] = frozenset(get_args(ActiveStatus))
BLOCKED_STATUSES: frozenset[ChatStatus] = frozenset(get_args(BlockedStatus))
IDLE_STATUSES: frozenset[ChatStatus] = frozenset(get_args(IdleStatus))
KNOWN_STATUSES: frozenset[ChatStatus] = ACTIVE_STATUSES | BLOCKED_STATUSES | IDLE_STATUSES


def is_known(status: str) -> TypeGuard[ChatStatus]:
    """Whether this build knows ``status`` (the rest are kept as strings, as ``other``)."""
    return status in KNOWN_STATUSES


@dataclass(frozen=True, slots=True)
class User:
    id: str
    username: str
    organization_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Agent:
    """A workspace agent as the workspace's latest build reports it (codersdk
    ``WorkspaceAgent``): ``status`` connecting | connected | disconnected | timeout;
    ``lifecycle_state`` created | starting | start_timeout | start_error | ready | …"""

    name: str
    status: str
    lifecycle_state: str

    @property
    def unhealthy(self) -> bool:
        return self.status in ("disconnected", "timeout") or self.lifecycle_state in (
            "start_error",
            "start_timeout",
        )


@dataclass(frozen=True, slots=True)
class WorkspaceBuild:
    workspace_id: str
    status: str
    job_status: str = ""
    error_code: str = ""
    # The provisioner job's error text (cut to 300 characters): coderd may fail a build
    # for quota with only this ("insufficient quota") and no error_code.
    error: str = ""
    # Read from the same response (latest_build.resources[].agents[]): no extra call.
    agents: tuple[Agent, ...] = ()

    @property
    def quota_failed(self) -> bool:
        """Failed for quota, in either of coderd's shapes: the code, or only the text."""
        return self.error_code == "INSUFFICIENT_QUOTA" or "insufficient quota" in self.error.lower()


MAX_AGENTS = 16  # of one workspace's agents, read for diagnosis


class MalformedFrame(ValueError):
    """A watch frame that cannot be understood; the connection should resync."""


class ServerFrameError(Exception):
    """An era-A ``{"type":"error"}`` envelope: the server reports a subscription failure."""


def parse_watch_frame(text: str | bytes) -> WatchEvent | None:
    """One watch-socket message → an event, or None for a keepalive.

    Bare ``ChatWatchEvent`` objects (eras B–E) and ``{type, data}`` envelopes
    (era A) are both accepted.
    """
    try:
        obj = orjson.loads(text)
    except ValueError as exc:
        raise MalformedFrame(f"not JSON: {exc}") from None
    if type(obj) is not dict:
        raise MalformedFrame(f"expected a JSON object, got {type(obj).__name__}")
    if "kind" not in obj and "type" in obj:
        frame_type = obj.get("type")
        if frame_type == "ping":
            return None
        if frame_type == "error":
            data = obj.get("data")
            message = data.get("message") if isinstance(data, dict) else data
            raise ServerFrameError(str(message)[:300])
        if frame_type != "data":
            raise MalformedFrame(f"unknown envelope type {str(frame_type)[:40]!r}")
        obj = obj.get("data")
        if not isinstance(obj, dict):
            raise MalformedFrame("envelope data is not an object")
    kind = obj.get("kind")
    if type(kind) is not str or not kind:
        raise MalformedFrame("event.kind missing or not a string")
    try:
        chat = from_json(obj.get("chat"), where="event.chat")
    except PayloadError as exc:
        raise MalformedFrame(str(exc)) from None
    raw_calls = obj.get("tool_calls")
    if not raw_calls or type(raw_calls) is not list:
        return WatchEvent(kind, chat)
    calls = tuple(
        ToolCall(as_text(c, "tool_call_id"), as_text(c, "tool_name"))
        for c in raw_calls
        if isinstance(c, dict)
    )
    return WatchEvent(kind, replace(chat, tool_calls=calls))


def parse_user(obj: Any) -> User:
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise PayloadError("user.id", "missing or not a string")
    orgs = obj.get("organization_ids")
    return User(
        id=obj["id"],
        username=as_text(obj, "username"),
        organization_ids=tuple(o for o in orgs if isinstance(o, str))
        if isinstance(orgs, list)
        else (),
    )


def parse_quota(obj: Any) -> Quota:
    if not isinstance(obj, dict):
        raise PayloadError("quota", "expected an object")
    consumed = obj.get("credits_consumed")
    budget = obj.get("budget")
    if not isinstance(consumed, int) or isinstance(consumed, bool):
        raise PayloadError("quota.credits_consumed", "missing or not an integer")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise PayloadError("quota.budget", "missing or not an integer")
    return Quota(credits_consumed=consumed, budget=budget)


def parse_workspace_build(obj: Any) -> WorkspaceBuild:
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise PayloadError("workspace.id", "missing or not a string")
    build = obj.get("latest_build")
    if not isinstance(build, dict):
        raise PayloadError("workspace.latest_build", "missing or not an object")
    job = build.get("job") if isinstance(build.get("job"), dict) else {}
    assert isinstance(job, dict)
    return WorkspaceBuild(
        workspace_id=obj["id"],
        status=as_text(build, "status"),
        job_status=as_text(job, "status"),
        error_code=as_text(job, "error_code"),
        error=as_text(job, "error")[:300],
        agents=_agents(build),
    )


def _agents(build: dict[str, Any]) -> tuple[Agent, ...]:
    """The build's agents (at most MAX_AGENTS), tolerating what is missing or malformed."""
    found: list[Agent] = []
    resources = build.get("resources")
    for res in resources if isinstance(resources, list) else ():
        agents = res.get("agents") if isinstance(res, dict) else None
        for a in agents if isinstance(agents, list) else ():
            if isinstance(a, dict) and len(found) < MAX_AGENTS:
                found.append(
                    Agent(as_text(a, "name"), as_text(a, "status"), as_text(a, "lifecycle_state"))
                )
    return tuple(found)


@dataclass(frozen=True, slots=True)
class ChatCost:
    """``GET …/chats/{chat}/cost`` (``getChatCost``): AI Gateway's spend for the chat's tree
    (its root and the subagents beneath it), in millionths of a US dollar. Requests on an
    unpriced model are counted but not in the total."""

    chat_id: str
    total_cost_micros: int
    request_count: int
    unpriced_request_count: int

    @property
    def usd(self) -> float:
        return self.total_cost_micros / 1_000_000


def parse_chat_cost(obj: Any) -> ChatCost:
    if not isinstance(obj, dict):
        raise PayloadError("cost", "expected an object")
    counts = []
    for key in ("total_cost_micros", "request_count", "unpriced_request_count"):
        value = obj.get(key, 0 if key == "unpriced_request_count" else None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PayloadError(f"cost.{key}", "missing or not a non-negative integer")
        counts.append(value)
    return ChatCost(as_text(obj, "chat_id"), *counts)
