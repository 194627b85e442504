"""What chatd's own failure handling means for an operator: the advice for an ``error``
chat by ``last_error.kind``, and for a ``running`` chat that is probably in chatd's retry
loop (docs/alerting.md, "Hints"; the coderd facts behind them: docs/coder-api.md).

Pure text from a record and a time; it must never advise interrupting an ``error`` chat
(it is not running: coderd answers 409) nor reading the per-chat ``/stream`` (it marks
the chat read for its owner).
"""

from __future__ import annotations

from datetime import UTC, datetime

from watchd.coder.observing import ChatError
from watchd.config.fields import format_duration
from watchd.store.records import ChatRecord

# codersdk.ChatErrorKind (AllChatErrorKinds, 13 values) -> what to do about it. An unknown
# kind reads as generic, as coderd's own UI does.
KIND_ADVICE: dict[str, str] = {
    "overloaded": "the provider is overloaded: wait for it to recover (its status page), "
    "then the owner resends the message",
    "rate_limit": "the provider is rate limiting the deployment's key: lower the number of "
    "chats running at once or raise the provider account's limits, then resend",
    "timeout": "the provider was unavailable or the request timed out: check the provider's "
    "status and the network path from coderd to it, then resend",
    "stream_silence_timeout": "the provider stopped sending response data mid-answer: check "
    "the provider's status, then resend",
    "auth": "the provider refused the deployment's credentials: fix the API key and its "
    "permissions in the deployment's model configuration",
    "config": "the provider rejected the model configuration: fix the model and provider "
    "settings in the deployment's model configuration",
    "usage_limit": "the AI Gateway budget (or the provider account's quota) is spent: raise "
    "the group's budget (/api/v2/groups/{group}/ai/budget) or the provider's quota; chatd "
    "never retries this",
    "missing_key": "the API key the chat was started with is gone: the owner sends the "
    "message again to continue with a current key",
    "provider_disabled": "an administrator disabled the provider: re-enable it or move the "
    "chat to another model",
    "content_filter": "the provider's content filter blocked the response: the owner "
    "rephrases; nothing to fix in the deployment",
    "hook_dispatch_failed": "a lifecycle hook could not be delivered: check the agent-hooks "
    "consumer the deployment dispatches to",
    "hook_denied": "a lifecycle hook denied the prompt by policy: the owner changes the "
    "prompt, or the policy is changed",
    "generic": "an unexpected provider or chatd error: read last_error's detail and coderd's logs",
}

# chatretry.Retry: 25 attempts, backoff 1 s doubling to 60 s (a provider Retry-After as a
# floor): about 20 min of waits, 20-45 min with the attempts themselves.
RETRY_ATTEMPTS = 25
RETRY_SPAN = 45 * 60.0
# A running chat whose updated_at moved this recently (and after it entered running) is
# still being written to: the retry loop bumps it on every attempt (at most 60 s apart,
# plus the attempt), so two missed bumps' worth.
RETRY_FRESH = 150.0


def error_hint(err: ChatError | None) -> str:
    """The hint for an ``error`` chat: its kind's advice, the provider, whether chatd
    retried it, and that it is not to be interrupted."""
    if err is None:
        return (
            "the chat ended in error without a last_error: read coderd's logs; it is not "
            "running, so do not interrupt it (coderd answers 409): the owner resends"
        )
    kind = err.kind if err.kind in KIND_ADVICE else "generic"
    retried = (
        f"transient: chatd retried it (up to {RETRY_ATTEMPTS} attempts) before giving up"
        if err.retryable
        else "not transient: chatd did not retry it"
    )
    return (
        f"{kind} from {err.provider or 'the model provider'} ({retried}): "
        f"{KIND_ADVICE[kind]}; the chat is not running, so do not interrupt it (coderd "
        "answers 409)"
    )


def retrying(rec: ChatRecord, now: float) -> bool:
    """Whether a ``running`` chat's ``updated_at`` is still moving: it moved after the
    chat entered ``running`` and recently (RETRY_FRESH)."""
    u = rec.updated_at
    return rec.status == "running" and u is not None and u > rec.since and now - u <= RETRY_FRESH


def retry_hint(rec: ChatRecord, now: float) -> str:
    """The hint for a running chat past budget that chatd is still writing to (server
    time ``now``): chatd gives up within RETRY_SPAN of its first retry, which is no later
    than now."""
    assert rec.updated_at is not None
    moved = format_duration(max(0.0, now - rec.updated_at))
    by = datetime.fromtimestamp(now + RETRY_SPAN, tz=UTC).isoformat(timespec="seconds")
    iso = by.replace("+00:00", "Z")
    return (
        f"probably chatd's retry loop: updated_at keeps moving (last {moved} ago) while "
        f"the turn does not finish; chatd retries a failing provider call up to "
        f"{RETRY_ATTEMPTS} times (about 20-45 min) and then ends the chat in error with "
        f"last_error saying why, so by {iso} at the latest; check the provider's status "
        "rather than interrupting; if it is still running after that, the run is wedged"
    )
