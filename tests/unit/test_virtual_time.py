"""Time-dependent loops on a virtual loop clock (looptime): exact times, no real sleeps."""

from __future__ import annotations

import asyncio
import random

import pytest

from watchd.daemon.sdnotify import SdNotifier, keep_informed
from watchd.kits.backoff import Backoff
from watchd.kits.tasks import CRASH_LOOP, TaskRegistry, guard

pytestmark = pytest.mark.looptime


class Recorder(SdNotifier):
    """An sd_notify socket that records (loop time, message) instead of sending."""

    def __init__(self, watchdog_usec: int | None) -> None:
        env = {"WATCHDOG_USEC": str(watchdog_usec)} if watchdog_usec else {}
        super().__init__(env)
        self.address = "@recorded"
        self.sent: list[tuple[float, dict[str, str]]] = []

    def notify(self, **fields: str) -> bool:
        self.sent.append((asyncio.get_running_loop().time(), fields))
        return True

    def at(self, key: str) -> list[float]:
        return [round(t, 6) for t, f in self.sent if key in f]


def _expected_delays(seed: int, steps: list[str], base: float, cap: float) -> list[float]:
    """The delays the guard's backoff gives for these steps ("next" or "reset"), drawn
    from the same seeded RNG in the same order."""
    b = Backoff(base=base, cap=cap, rng=random.Random(seed))
    out = []
    for step in steps:
        if step == "reset":
            b.reset()
        else:
            out.append(b.next())
    return out


async def test_a_crashing_task_restarts_after_exactly_its_backoff() -> None:
    """Crashes at t=0 are retried after base, 2×base, 4×base (jittered, seeded): the
    restart times are exact, and the third crash in a row is a crash loop."""
    loop = asyncio.get_running_loop()
    starts: list[float] = []

    async def crashes() -> None:
        starts.append(round(loop.time(), 6))
        raise RuntimeError("boom")

    registry = TaskRegistry()
    task = asyncio.create_task(
        guard("flaky", crashes, base=2.0, cap=60.0, registry=registry, rng=random.Random(7))
    )
    await asyncio.sleep(100)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    delays = _expected_delays(7, ["next"] * (len(starts) - 1), base=2.0, cap=60.0)
    assert delays[:3] == pytest.approx([2.0, 4.0, 8.0], rel=0.2)  # doubling, jittered ±20 %
    expected = [0.0]
    for d in delays:
        expected.append(round(expected[-1] + d, 6))
    assert starts == pytest.approx(expected, abs=1e-5)
    assert len(starts) >= 5  # 0, ~2, ~6, ~14, ~30, ~62 within 100 s
    assert registry.restarts["flaky"] == len(starts)  # the last one was waiting to restart
    assert registry.crash_looping() == ["flaky"]


async def test_a_healthy_run_resets_the_backoff() -> None:
    """A run that lasted healthy_after before crashing starts the count over: the next
    restart waits base again (not double the last delay), and it is no crash loop."""
    loop = asyncio.get_running_loop()
    starts: list[float] = []

    async def crashes_late_once() -> None:
        starts.append(round(loop.time(), 6))
        if len(starts) == 3:
            await asyncio.sleep(60)  # healthy for healthy_after, then crash
        raise RuntimeError("boom")

    registry = TaskRegistry()
    task = asyncio.create_task(
        guard(
            "resets",
            crashes_late_once,
            base=1.0,
            cap=60.0,
            healthy_after=60.0,
            registry=registry,
            rng=random.Random(3),
        )
    )
    await asyncio.sleep(64.5)
    state = registry.tasks["resets"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    d1, d2, d3 = _expected_delays(3, ["next", "next", "reset", "next"], base=1.0, cap=60.0)
    assert d3 == pytest.approx(1.0, rel=0.2)  # base again, not double the last delay
    assert starts[:4] == pytest.approx([0.0, d1, d1 + d2, d1 + d2 + 60.0 + d3], abs=1e-5)
    assert state.crashes_in_a_row < CRASH_LOOP


async def test_watchdog_pings_every_interval_and_ready_once_settled() -> None:
    """WATCHDOG=1 goes out at once and then every half WATCHDOG_USEC exactly; READY=1
    once, at the first tick after the daemon settled."""
    n = Recorder(watchdog_usec=4_000_000)  # a ping every 2 s
    settled_at = 3.0
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(
        keep_informed(
            n,
            status_line=lambda: "ok",
            settled=lambda: loop.time() >= settled_at,
            progressing=lambda: True,
        )
    )
    await asyncio.sleep(9.9)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert n.at("WATCHDOG") == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert n.at("READY") == [3.0]


async def test_no_watchdog_ping_while_the_loop_is_not_progressing() -> None:
    """While progress stops (t=3..7) no WATCHDOG=1 goes out, so systemd's timer runs out;
    pings resume at the first tick after it is back."""
    n = Recorder(watchdog_usec=2_000_000)  # a ping every 1 s, ticks every 0.5 s
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(
        keep_informed(
            n,
            status_line=lambda: "ok",
            settled=lambda: True,
            progressing=lambda: not 3.0 <= loop.time() < 7.0,
        )
    )
    await asyncio.sleep(9.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert n.at("WATCHDOG") == [0.0, 1.0, 2.0, 7.0, 8.0, 9.0]
