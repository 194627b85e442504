"""The dead man's switch on a virtual loop clock (looptime): its cadence, exact."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from watchd.alerting.receivers.base import Notification, Rate
from watchd.config.process import HeartbeatConfig
from watchd.daemon.heartbeat import Heartbeat

pytestmark = pytest.mark.looptime


class BeatRecorder:
    """A receiver that notes the loop time of every Watchdog alert it gets."""

    kind = "webhook"
    name = "deadman"
    rate = Rate(per_second=100.0, burst=100)
    send_resolved = True
    resend_every: float | None = None

    def __init__(self) -> None:
        self.at: list[float] = []

    async def notify(self, n: Notification) -> None:
        self.at.append(round(asyncio.get_running_loop().time(), 6))


@contextlib.asynccontextmanager
async def hanging_ping() -> AsyncIterator[tuple[str, list[float]]]:
    """A push monitor that takes every GET and never answers."""
    arrived: list[float] = []

    async def hang(request: web.Request) -> web.Response:
        arrived.append(round(asyncio.get_running_loop().time(), 6))
        await asyncio.sleep(3600)
        return web.Response(text="OK")

    # A client that gives up cancels its handler: nothing is left hanging at the end.
    app = web.Application(handler_args={"handler_cancellation": True})
    app.router.add_get("/ping/{key}", hang)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/ping/0123456789abcdef", arrived
    finally:
        await runner.cleanup()


async def test_a_hanging_ping_url_does_not_stretch_the_beats(
    session: aiohttp.ClientSession,
) -> None:
    """With a ping URL that never answers (timeout 5 s), Watchdog alerts still go out every
    2 s exactly, and a ping still in flight when the next is due is skipped, not stacked."""
    recorder = BeatRecorder()
    async with hanging_ping() as (url, pings):
        beat = Heartbeat(
            config=HeartbeatConfig(interval=2.0, receivers=["deadman"], timeout=5.0),
            url=url,
            notifiers={"deadman": recorder},
            session=session,
            healthy=lambda: None,
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        task = asyncio.create_task(beat.run())
        await asyncio.sleep(10.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [round(t - start, 6) for t in recorder.at] == [0, 2, 4, 6, 8, 10]
    # Pings start at 0, 6 (the first timed out at 5) and 12 would be next: 2 and 4, 8
    # and 10 found one in flight.
    assert [round(t - start, 6) for t in pings] == [0, 6]
    assert beat.pings_skipped == 4 and beat.failed == 1 and beat.sent == 6


async def test_a_slow_receiver_keeps_the_cadence_of_the_next_beats(
    session: aiohttp.ClientSession,
) -> None:
    """A send that takes 3 s of a 2 s interval costs that one slot: the next beat is at the
    next slot of the original cadence (4 s), not 2 s after the send returned."""
    slow = BeatRecorder()
    original = slow.notify

    async def notify(n: Notification) -> None:
        await original(n)
        if len(slow.at) == 1:
            await asyncio.sleep(3.0)

    slow.notify = notify  # type: ignore[method-assign]
    beat = Heartbeat(
        config=HeartbeatConfig(interval=2.0, receivers=["deadman"], timeout=5.0),
        url=None,
        notifiers={"deadman": slow},
        session=session,
        healthy=lambda: None,
    )
    start = asyncio.get_running_loop().time()
    task = asyncio.create_task(beat.run())
    await asyncio.sleep(8.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [round(t - start, 6) for t in slow.at] == [0, 4, 6, 8]
