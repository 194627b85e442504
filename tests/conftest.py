"""Shared fixtures: an in-process simulator, and a guard that no test leaks a task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from watchd.kits.clock import LoopClock
from watchd.sim.server import SimServer
from watchd.sim.state import SimState


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves tasks running on its loop (async, so it runs on the test's
    own loop; a sync fixture found no running loop and checked nothing)."""
    yield
    me = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    if pending:
        # Tasks cancelled in the test's own teardown (a server's handlers) get to finish.
        await asyncio.wait(pending, timeout=0.2)
    leaked = [t for t in pending if not t.done()]
    for t in leaked:
        t.cancel()
    assert not leaked, f"leaked tasks: {sorted(t.get_name() for t in leaked)}"


class Sim:
    def __init__(self, state: SimState, server: SimServer) -> None:
        self.state = state
        self.server = server

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture
def era() -> str:
    return "E"


@pytest.fixture
async def sim(era: str) -> AsyncIterator[Sim]:
    # The simulated server's clock follows the loop's (virtual under looptime).
    state = SimState(era=era, seed=3, ping_interval=15.0, wall=LoopClock().now)
    server = SimServer(state, tick_interval=0.05)
    await server.start()
    try:
        yield Sim(state, server)
    finally:
        await server.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s
