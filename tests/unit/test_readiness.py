"""What READY=1 and /readyz wait for (every identity's first seed attempt, not its seed),
and what /healthz calls live."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from watchd.daemon.supervisor import Supervisor
from watchd.daemon.view import liveness_problems
from watchd.kits.clock import ServerClock
from watchd.kits.tasks import CRASH_LOOP, TaskRegistry
from watchd.store.health import IdentityHealth


def _health() -> IdentityHealth:
    return IdentityHealth(
        name="a",
        deployment="https://coder.test",
        server_clock=ServerClock(),
        unhealthy_after=60.0,
    )


@pytest.mark.parametrize("state", ["starting", "seeding", "reconnecting"])
def test_an_attempt_under_way_is_not_an_attempt_made(state: str) -> None:
    """Before the first attempt ends conclusively (connecting, seeding, a stream that
    closed mid-seed and is retried at once) readiness waits."""
    h = _health()
    h.set_state(state)
    assert not h.attempted_once and not h.seeded_once


@pytest.mark.parametrize("state", ["auth_failed", "not_found", "unreachable"])
def test_a_failed_first_attempt_counts_and_stays_counted(state: str) -> None:
    """A first attempt that fails conclusively counts, and a later retry does not undo it."""
    h = _health()
    h.set_state("seeding")
    h.set_state(state)
    assert h.attempted_once and not h.seeded_once
    h.set_state("seeding")
    assert h.attempted_once


def test_a_seed_is_an_attempt() -> None:
    """Seeded once means attempted once."""
    h = _health()
    h.set_state("ready")
    assert h.attempted_once and h.seeded_once


def _live_view() -> Any:
    return SimpleNamespace(last_beat=time.monotonic(), supervisor=Supervisor())


def test_a_process_wide_crash_loop_fails_liveness_and_an_identitys_does_not() -> None:
    """/healthz names a crash-looping process-wide task; an identity's own crash loop is
    IdentityUnhealthy's business and leaves liveness alone."""
    registry = TaskRegistry()
    view_ = _live_view()
    assert liveness_problems(view_, registry) == []
    registry.state("watch:team-a", "watch").crashes_in_a_row = CRASH_LOOP
    assert liveness_problems(view_, registry) == []
    registry.state("dispatch-housekeeping", "dispatch-housekeeping").crashes_in_a_row = CRASH_LOOP
    assert liveness_problems(view_, registry) == ["tasks crash-looping: dispatch-housekeeping"]


def test_a_stale_heartbeat_fails_liveness() -> None:
    """A loop heartbeat older than STALE_HEARTBEAT is reported with its age."""
    view_ = _live_view()
    view_.last_beat -= 7.0
    [problem] = liveness_problems(view_, TaskRegistry())
    assert problem.startswith("event loop heartbeat is 7.")
