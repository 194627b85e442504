"""What READY=1 and /readyz wait for: every identity's first seed attempt, not its seed."""

from __future__ import annotations

import pytest

from watchd.detection.health import IdentityHealth
from watchd.kits.clock import ServerClock


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
