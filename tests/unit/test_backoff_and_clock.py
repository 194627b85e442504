"""Backoff policy, retry hints, and the server-clock estimate."""

from __future__ import annotations

import random

import pytest

from watchd.kits.backoff import Backoff, retry_hint
from watchd.kits.clock import ServerClock


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    """Without jitter: 1, 2, 4, 8, 16, 30, 30; reset starts again at 1."""
    b = Backoff(base=1.0, cap=30.0, jitter=0.0)
    assert [b.next() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    b.reset()
    assert b.next() == 1


def test_backoff_jitter_stays_within_its_band() -> None:
    """Jittered delays stay within ±20% of the nominal step."""
    b = Backoff(base=1.0, cap=30.0, jitter=0.2, rng=random.Random(5))
    for nominal in (1, 2, 4, 8, 16, 30, 30, 30):
        assert nominal * 0.8 <= b.next() <= nominal * 1.2


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After": "Thu, 01 Jan 2026 00:01:00 GMT"}, 60.0),
        ({"X-RateLimit-Reset": "1767225630"}, 30.0),
        ({"Retry-After": "garbage"}, None),
        ({}, None),
    ],
)
def test_retry_hints(headers: dict[str, str], expected: float | None) -> None:
    """Retry-After (seconds or HTTP-date), retry-after-ms and X-RateLimit-Reset, on server time."""
    server_now = 1767225600.0  # 2026-01-01T00:00:00Z
    assert retry_hint(headers, server_now=server_now) == expected


class FakeWall:
    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t


def test_server_clock_learns_skew_from_date_headers() -> None:
    """A host 10 minutes behind the server still reads the server's time."""
    wall = FakeWall(1767225600.0)
    clock = ServerClock(wall)
    for i in range(5):
        wall.t = 1767225600.0 + i
        server = wall.t + 600
        date = __import__("email.utils").utils.formatdate(int(server), usegmt=True)
        clock.observe(date, sent_at=wall.t, received_at=wall.t)
    assert clock.now() - wall.now() == pytest.approx(600, abs=1.0)


def test_server_clock_ignores_garbage_dates() -> None:
    """A missing or unparseable Date leaves the estimate untouched."""
    clock = ServerClock(FakeWall(100.0))
    clock.observe(None, sent_at=100, received_at=100)
    clock.observe("not a date", sent_at=100, received_at=100)
    assert clock.offset == 0.0 and clock.now() == 100.0


@pytest.mark.parametrize("true_offset", [0.1, 0.3717, 0.8])
def test_server_clock_converges_below_the_date_resolution(true_offset: float) -> None:
    """A burst of responses straddling one second boundary pins the offset to ~the round trip."""
    import email.utils

    wall = FakeWall(1767225600.0)
    clock = ServerClock(wall)
    for i in range(15):  # 15 requests 50 ms apart, as in one listing
        sent = 1767225600.6 + i * 0.05
        received = sent + 0.01
        server_time = (sent + received) / 2 + true_offset
        date = email.utils.formatdate(int(server_time), usegmt=True)
        clock.observe(date, sent_at=sent, received_at=received)
    # Centring each sample (+0.5 s) and taking the median was 0.1-0.15 s off here.
    assert clock.offset == pytest.approx(true_offset, abs=0.03)


def test_server_clock_outvotes_a_stray_sample() -> None:
    """One response from a proxy with its own clock does not move a settled estimate."""
    import email.utils

    wall = FakeWall(0.0)
    clock = ServerClock(wall)
    for i in range(10):
        t = 1767225600.0 + i * 0.41
        clock.observe(email.utils.formatdate(int(t + 5.0), usegmt=True), sent_at=t, received_at=t)
    settled = clock.offset
    clock.observe(
        email.utils.formatdate(int(1767225700.0), usegmt=True),
        sent_at=1767225604.0,
        received_at=1767225604.0,
    )
    assert clock.offset == settled and settled == pytest.approx(5.0, abs=0.1)


def _sample(clock: ServerClock, host: float, offset: float) -> None:
    import email.utils

    date = email.utils.formatdate(int(host + offset), usegmt=True)
    clock.observe(date, sent_at=host, received_at=host + 0.01)


@pytest.mark.parametrize("step", [3.0, -3.0, 3600.0])
def test_a_clock_step_every_new_sample_agrees_on_is_followed_within_three(step: float) -> None:
    """A server (or host) clock that steps is followed after STEP_SAMPLES samples that
    all agree on the step, not after half the 15-sample window (8 samples); two stray
    samples before it are still outvoted."""
    from watchd.kits.clock import STEP_SAMPLES

    clock = ServerClock(FakeWall(0.0))
    host = 1767225600.0
    for _ in range(15):
        host += 0.37
        _sample(clock, host, 5.0)
    assert clock.offset == pytest.approx(5.0, abs=0.6)
    for _ in range(STEP_SAMPLES - 1):
        host += 0.37
        _sample(clock, host, 5.0 + step)
        assert clock.offset == pytest.approx(5.0, abs=0.6)
    host += 0.37
    _sample(clock, host, 5.0 + step)
    assert clock.offset == pytest.approx(5.0 + step, abs=1.0) and clock.steps == 1


def test_fresh_stamps_far_behind_the_estimate_are_believed_instead() -> None:
    """A Date an hour ahead of the server's own stamps (a proxy's clock), or no Date from
    a server an hour behind: three stamps written just now, agreeing, correct the
    estimate (one stale stamp, or stamps that disagree, never do), and the correction goes
    when a fresh stamp agrees with the Date samples again."""
    wall = FakeWall(1767225600.0)
    clock = ServerClock(wall)
    for i in range(5):
        _sample(clock, wall.t + i * 0.3, 3600.0)
    wall.t += 2.0
    assert clock.now() == pytest.approx(wall.t + 3600.0, abs=1.0)
    assert clock.fresh_stamp(wall.t - 7200.0) is False  # one stale stamp: nothing moves
    assert clock.fresh_stamp(wall.t - 120.0) is False  # nor two that disagree
    assert clock.now() == pytest.approx(wall.t + 3600.0, abs=1.0)
    assert [clock.fresh_stamp(wall.t + 0.2) for _ in range(3)] == [False, False, True]
    assert clock.now() == pytest.approx(wall.t + 0.2, abs=0.01) and clock.contradicted == 1
    assert clock.offset == pytest.approx(0.2, abs=0.01)
    assert clock.fresh_stamp(wall.t + 3600.0) is False  # they agree again
    assert clock.now() == pytest.approx(wall.t + 3600.0, abs=1.0)


def test_the_collector_is_paused_only_inside_and_only_if_it_was_on() -> None:
    """collector_paused turns the cyclic GC off inside the block and back on after it,
    also when the block raises; it leaves a collector that was already off off, and does
    nothing when told not to."""
    import gc

    from watchd.kits.heap import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError
    assert gc.isenabled()
    with collector_paused(False):
        assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
