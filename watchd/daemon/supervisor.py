"""Named, guarded long-lived tasks under one supervisor (after kopf).

Every task is started through a guard that logs a crash, and also logs an
"eternal" task that returned normally (a bug: it should have run forever).
*Root* tasks end the daemon when they end. *Restartable* tasks (one per
identity) are restarted after a backoff when they crash, so one identity's
bug cannot take the others down. Shutdown cancels in a fixed order with a
deadline per group, and is safe against a second cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from watchd.kits import logs
from watchd.kits.tasks import guard

log = logs.get("watchd.supervisor")

CoroFactory = Callable[[], Coroutine[Any, Any, None]]


@dataclass
class Supervised:
    name: str
    group: str
    task: asyncio.Task[None]
    root: bool


class Supervisor:
    def __init__(self) -> None:
        self.tasks: dict[str, Supervised] = {}
        self.root_ended = asyncio.Event()
        self.ended_by: str | None = None

    def spawn(
        self,
        name: str,
        factory: CoroFactory,
        *,
        group: str,
        root: bool = False,
        restart: bool = False,
    ) -> None:
        if name in self.tasks and not self.tasks[name].task.done():
            raise RuntimeError(f"task {name} already running")
        task = asyncio.create_task(
            self._guard(name, factory, root=root, restart=restart), name=name
        )
        self.tasks[name] = Supervised(name=name, group=group, task=task, root=root)

    async def _guard(self, name: str, factory: CoroFactory, *, root: bool, restart: bool) -> None:
        try:
            await guard(name, factory, kind=_kind(name), restart=restart)
        finally:
            if root and not self.root_ended.is_set():
                self.ended_by = name
                self.root_ended.set()

    def dead_roots(self) -> list[str]:
        return [n for n, s in self.tasks.items() if s.root and s.task.done()]

    async def stop(self, name: str, *, deadline: float = 5.0) -> None:
        sup = self.tasks.pop(name, None)
        if sup is None:
            return
        await _cancel([sup.task], deadline=deadline)

    async def stop_group(self, group: str, *, deadline: float) -> list[str]:
        """Cancel one group and wait up to ``timeout``; returns the names that hung."""
        members = [s for s in self.tasks.values() if s.group == group]
        for s in members:
            self.tasks.pop(s.name, None)
        hung = await _cancel([s.task for s in members], deadline=deadline)
        return [s.name for s in members if s.task in hung]


async def _cancel(tasks: list[asyncio.Task[None]], *, deadline: float) -> set[asyncio.Task[None]]:
    for t in tasks:
        t.cancel()
    if not tasks:
        return set()
    # A second cancellation (another SIGTERM) must not abandon the wait half-way.
    waiter = asyncio.ensure_future(asyncio.wait(tasks, timeout=deadline))
    while not waiter.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(waiter)
    _done, pending = waiter.result()
    return pending


def _kind(name: str) -> str:
    """The task's kind for metrics: ``watch:team-a`` is ``watch`` (bounded labels)."""
    return name.split(":", 1)[0]
