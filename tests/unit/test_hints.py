"""The hint a chat alert carries: what chatd's own failure handling means for an operator."""

from __future__ import annotations

import re

import pytest

from watchd.coder.observing import ChatError
from watchd.detection.diagnosis import Facts, hint
from watchd.detection.failures import KIND_ADVICE
from watchd.store.records import ChatRecord

# codersdk.AllChatErrorKinds
KINDS = (
    "generic",
    "overloaded",
    "rate_limit",
    "timeout",
    "stream_silence_timeout",
    "auth",
    "config",
    "usage_limit",
    "missing_key",
    "provider_disabled",
    "content_filter",
    "hook_dispatch_failed",
    "hook_denied",
)
# "interrupt it" as advice; "do not interrupt it" is the opposite.
ADVISES_INTERRUPT = re.compile(r"(?<!not )interrupt (it|the chat)\b")


def failed(kind: str, *, provider: str = "anthropic", retryable: bool = False) -> ChatRecord:
    err = ChatError("boom", kind=kind, provider=provider, retryable=retryable)
    return ChatRecord("a", "c1", "error", 0.0, "transition", 0.0, 0.0, last_error=err)


def test_every_chat_error_kind_has_its_own_advice() -> None:
    """All 13 codersdk.ChatErrorKind values have advice, each different."""
    assert set(KIND_ADVICE) == set(KINDS)
    assert len(set(KIND_ADVICE.values())) == len(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_chats_hint_follows_its_kind_and_never_says_interrupt(kind: str) -> None:
    """An error chat's hint is its kind's advice with the provider, and never advises
    interrupting it (coderd answers 409: it is not running)."""
    text = hint(Facts(record=failed(kind)))
    assert KIND_ADVICE[kind] in text and "anthropic" in text and kind in text
    assert "do not interrupt it" in text and not ADVISES_INTERRUPT.search(text)


def test_usage_limit_points_at_the_ai_gateway_budget() -> None:
    """usage_limit names the AI Gateway budget and says chatd did not retry it."""
    text = hint(Facts(record=failed("usage_limit")))
    assert "AI Gateway budget" in text and "chatd did not retry it" in text


def test_a_retried_kind_says_chatd_retried_it() -> None:
    """A retryable last_error says chatd retried it before giving up; an unknown kind
    reads as generic."""
    text = hint(Facts(record=failed("overloaded", provider="", retryable=True)))
    assert "chatd retried it" in text and "the model provider" in text
    assert KIND_ADVICE["generic"] in hint(Facts(record=failed("brand_new_kind")))
