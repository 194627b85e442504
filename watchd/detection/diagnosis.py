"""Turning what we know about a stuck chat into a hint a person can act on.

Follows the seed README's troubleshooting table. Pure: the facts (chat
record, workspace build, quota headroom) are gathered by the caller.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from watchd.coder.models import WorkspaceBuild
from watchd.coder.observing import Quota
from watchd.detection.failures import error_hint, retry_hint, retrying
from watchd.store.records import ChatRecord


class Reading(Protocol):
    """What the watcher's reads for a stuck chat found (its Confirmer port's answer)."""

    @property
    def build(self) -> WorkspaceBuild | None: ...

    @property
    def quota(self) -> Quota | None: ...

    @property
    def build_checked(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Facts:
    record: ChatRecord
    build: WorkspaceBuild | None = None
    quota: Quota | None = None
    # False when the chat has a workspace whose build was not read (the bulk of a burst).
    build_checked: bool = True


INVALID_HINT = (
    "execution state invalid: coderd refuses every mutation of this chat (interrupt, "
    "archive) with 409 until POST …/reconcile-invalid moves it to error; enable "
    "sweep.reconcile_invalid or reconcile it by hand, then resend the turn"
)


def hint(
    facts: Facts, *, burst: int = 1, invalid_state: str | None = None, now: float | None = None
) -> str:
    """``burst``: how many chats went past their budget in the same confirmation;
    ``invalid_state``: coderd's message when a mutation found the state invalid; ``now``:
    the server time the chat was judged at (without it, no retry-loop reading)."""
    rec = facts.record
    if invalid_state is not None:
        return INVALID_HINT
    if rec.status == "error":
        return error_hint(rec.last_error)
    if rec.status == "requires_action":
        return stranded_hint(rec)
    said = workspace_hint(facts)
    if said is not None:
        return said
    if rec.queued_for_capacity:
        return (
            "deployment concurrency cap reached: the chat is queued for capacity "
            "(unlicensed deployments run 5 root + 10 subagent chats at once); finish or "
            "interrupt other chats, or raise the cap"
        )
    if rec.status == "interrupting":
        return (
            "interrupt has not completed: the owning runner may be dead; the server "
            "prioritises interrupting chats on re-acquisition; if it persists, stop the "
            "workspace"
        )
    if rec.status == "pending":
        return (
            "chat never got a worker: check chatd workers and the workspace build; "
            "older servers had 'pending never scheduling' races"
        )
    if facts.quota is not None and facts.quota.headroom is not None and facts.quota.headroom <= 0:
        return (
            "workspace quota is exhausted "
            f"({facts.quota.credits_consumed}/{facts.quota.budget} credits): new builds "
            "will fail; reclaim credits by deleting workspaces"
        )
    if now is not None and retrying(rec, now):
        return retry_hint(rec, now)
    if not facts.build_checked and burst > 1:
        return (
            f"{burst} chats went past their budget together: look for a shared cause "
            "(deployment, provisioners, quota, the model provider) before acting on single "
            "chats; this chat's workspace build was not read (only a few per burst are)"
        )
    return (
        "no progress signal explains it: a genuinely slow turn (raise the budget or "
        "requestTimeoutMs) or a wedged run (interrupt it; if that fails, stop the "
        "workspace)"
    )


def stranded_hint(rec: ChatRecord) -> str:
    """A chat in requires_action: its stranded client-tool pause, and what not to do."""
    pending = (
        f" (pending: {pending_text(rec)}; client ledger keys: {ledger_keys(rec)})"
        if rec.pending
        else " (which tool calls are pending was not seen: the action_required event "
        "came before watchd watched)"
    )
    return (
        f"a client tool pause is stranded{pending}: submit the stranded tool results "
        "or reconcile the client's ledger first; do not interrupt blindly (the pause "
        "may be the only record of a committed client-tool effect)"
    )


def workspace_hint(facts: Facts) -> str | None:
    """What the chat's workspace build says, when it explains the chat: a build that
    cannot be scheduled (quota, provisioners) or an unhealthy agent; else None."""
    build = facts.build
    if build is not None and (build.status in ("pending", "failed") or build.quota_failed):
        quota_note = ""
        if facts.quota is not None and not facts.quota.unlimited:
            quota_note = (
                f" (quota: {facts.quota.credits_consumed}/{facts.quota.budget} credits used)"
            )
        if build.quota_failed:
            return (
                "workspace cannot be scheduled: its build failed for insufficient quota "
                "(INSUFFICIENT_QUOTA)"
                f"{quota_note}; reclaim credits by deleting workspaces (stopping only "
                "frees stop-scoped costs) or raise the group allowance"
            )
        return (
            f"workspace cannot be scheduled: latest build is {build.status}{quota_note}; "
            "check quota headroom and the provisioners"
        )
    sick = [a for a in build.agents if a.unhealthy] if build is not None else []
    if sick:
        a = sick[0]
        return (
            f"workspace agent {a.name or '?'} is unhealthy (status {a.status or '?'}, "
            f"lifecycle {a.lifecycle_state or '?'}): the build succeeded but the chat cannot "
            "reach its workspace; check the agent's logs and startup script, or restart "
            "the workspace"
        )
    return None


def pending_text(rec: ChatRecord) -> str:
    """A stranded chat's pending tool calls as ``tool_name (tool_call_id)``."""
    return ", ".join(f"{c.tool_name or '?'} ({c.tool_call_id or '?'})" for c in rec.pending)


def ledger_keys(rec: ChatRecord) -> str:
    """The client-tool ledger's keys for them: ``chatId/toolCallId``, as the seeds'
    crash-safe ledger keys its entries."""
    return ", ".join(f"{rec.chat_id}/{c.tool_call_id}" for c in rec.pending)


def agents_text(build: WorkspaceBuild) -> str:
    """A build's agents as ``name: status/lifecycle_state``."""
    return ", ".join(f"{a.name}: {a.status}/{a.lifecycle_state}" for a in build.agents)


def to_read(records: Iterable[ChatRecord], *, limit: int) -> frozenset[str]:
    """The workspaces whose builds a burst reads: the ``limit`` its chats are bound to most
    (the first bound to, among equals). A burst on at most ``limit`` workspaces has every
    chat's build read; a larger one leaves unread the chats of the workspaces with fewest
    chats."""
    bound = Counter(rec.workspace_id for rec in records if rec.workspace_id)
    return frozenset(ws for ws, _ in bound.most_common(limit))
