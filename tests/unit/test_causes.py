"""The ``cause`` label (fleet.md §1): one row of the spec's table each, in its precedence."""

from __future__ import annotations

from typing import Any

import pytest

from watchd.coder.models import Agent, WorkspaceBuild, parse_workspace_build
from watchd.coder.observing import ChatError, Quota
from watchd.detection.alerts import Renderer
from watchd.detection.causes import CAUSES, PROVIDER_KINDS, cause
from watchd.detection.diagnosis import Facts, hint
from watchd.store.records import ChatRecord

EXHAUSTED = Quota(credits_consumed=100, budget=100)
QUOTA_TEXT = WorkspaceBuild("w1", "failed", "failed", error="Insufficient Quota")
QUOTA_CODE = WorkspaceBuild("w1", "failed", "failed", error_code="INSUFFICIENT_QUOTA")
FAILED = WorkspaceBuild("w1", "failed", "failed", error="terraform apply: exit 1")
PENDING = WorkspaceBuild("w1", "pending", "pending")
SICK = WorkspaceBuild("w1", "running", "succeeded", agents=(Agent("main", "timeout", "ready"),))
HEALTHY = WorkspaceBuild(
    "w1", "running", "succeeded", agents=(Agent("main", "connected", "ready"),)
)


def chat(status: str = "running", **kw: Any) -> ChatRecord:
    return ChatRecord("a", "c1", status, 0.0, "transition", 0.0, 0.0, workspace_id="w1", **kw)


def err(kind: str) -> ChatError:
    return ChatError("boom", kind=kind, provider="anthropic")


ROWS: list[tuple[str, Facts]] = [
    # requires_action wins over everything, even a queued flag and a failed quota build.
    (
        "stranded_tool",
        Facts(record=chat("requires_action", queued_for_capacity=True), build=QUOTA_CODE),
    ),
    ("provider", Facts(record=chat("error", last_error=err("overloaded")), build=QUOTA_CODE)),
    ("usage_limit", Facts(record=chat("error", last_error=err("usage_limit")), build=QUOTA_CODE)),
    ("capacity", Facts(record=chat(queued_for_capacity=True), build=QUOTA_CODE)),
    ("quota", Facts(record=chat(), build=QUOTA_CODE)),
    ("quota", Facts(record=chat(), build=QUOTA_TEXT)),
    ("quota", Facts(record=chat(), build=PENDING, quota=EXHAUSTED)),
    ("build_failed", Facts(record=chat(), build=FAILED, quota=EXHAUSTED)),
    ("build_pending", Facts(record=chat(), build=PENDING, quota=Quota(10, 100))),
    ("agent_unhealthy", Facts(record=chat("interrupting"), build=SICK)),
    ("interrupt_stuck", Facts(record=chat("interrupting"), build=HEALTHY)),
    ("unknown", Facts(record=chat(), build=HEALTHY, quota=EXHAUSTED)),
    # Its build not read (the bulk of a burst): unknown until it can be.
    ("unknown", Facts(record=chat(), build_checked=False)),
]


@pytest.mark.parametrize(
    ("expected", "facts"), ROWS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(ROWS)]
)
def test_each_row_of_the_table_gives_its_cause(expected: str, facts: Facts) -> None:
    """Each row of fleet.md §1's table, with the rows below it also true, gives its cause."""
    assert cause(facts) == expected


def test_every_cause_of_the_vocabulary_is_reached() -> None:
    """The closed vocabulary is the spec's, in its order, and every value is tested above."""
    assert CAUSES == (
        "stranded_tool",
        "provider",
        "usage_limit",
        "capacity",
        "quota",
        "build_failed",
        "build_pending",
        "agent_unhealthy",
        "interrupt_stuck",
        "unknown",
    )
    assert {c for c, _ in ROWS} == set(CAUSES)


@pytest.mark.parametrize("kind", sorted(PROVIDER_KINDS))
def test_provider_side_error_kinds_are_provider(kind: str) -> None:
    """Every provider-side last_error kind reads as ``provider``."""
    assert cause(Facts(record=chat("error", last_error=err(kind)))) == "provider"


@pytest.mark.parametrize("kind", ["generic", "hook_denied", "hook_dispatch_failed", "made_up"])
def test_other_error_kinds_are_not_the_providers(kind: str) -> None:
    """An error chat of a kind that is not the provider's falls through (here: unknown)."""
    assert cause(Facts(record=chat("error", last_error=err(kind)))) == "unknown"


@pytest.mark.parametrize(
    "job",
    [
        {"status": "failed", "error_code": "INSUFFICIENT_QUOTA"},
        {"status": "failed", "error": "insufficient quota"},
    ],
    ids=["code", "text-only"],
)
def test_both_quota_shapes_are_read_from_the_workspace(job: dict[str, str]) -> None:
    """coderd's job may say quota by error_code or only by its error text: both read as
    quota, and the hint says so."""
    build = parse_workspace_build({"id": "w1", "latest_build": {"status": "failed", "job": job}})
    facts = Facts(record=chat(), build=build)
    assert build.quota_failed and cause(facts) == "quota"
    assert "insufficient quota" in hint(facts)


def test_the_cause_is_a_label_and_leaves_the_fingerprint_alone() -> None:
    """A chat alert carries ``cause`` as a label; the fingerprint is the chat's as given."""
    r = Renderer(link_template="{deployment}/agents/{chat_id}")
    alert = r.chat_alert(
        chat(queued_for_capacity=True),
        deployment="https://coder.example",
        labels={},
        name="ChatStuck",
        age=700.0,
        limit=600.0,
        since=0.0,
        facts=Facts(record=chat(queued_for_capacity=True)),
        fp="fp-of-the-chat",
        clock="status",
        measured_at=700.0,
    )
    assert alert.labels["cause"] == "capacity" and alert.fingerprint == "fp-of-the-chat"
