"""The guard for every long-lived task: named, crash logged with its traceback,
restarted with backoff that resets after a healthy interval, counted.

Nothing long-lived is started with a bare ``asyncio.create_task``: a coroutine that
raised would die silently, and with it an identity's confirmations or an aggregation
group's notifications. :func:`spawn` wraps the coroutine factory in :func:`guard`, and
the process-wide :data:`TASKS` keeps what metrics and health need: restarts per task
kind, whether each named task is up, and which tasks keep crashing.

Imports nothing of watchd: the detector, the dispatcher and the supervisor all use it.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from watchd.kits.backoff import Backoff

log = structlog.get_logger("watchd.tasks")

CoroFactory = Callable[[], Awaitable[None]]

# A task that ran this long without crashing is healthy again: its backoff starts over.
HEALTHY_AFTER = 60.0
# This many crashes without a healthy interval between them is a crash loop.
CRASH_LOOP = 3


@dataclass
class TaskState:
    name: str
    kind: str
    up: bool = True
    restarts: int = 0
    crashes_in_a_row: int = 0
    last_error: str = ""


@dataclass
class TaskRegistry:
    """What every guarded task is doing, for /metrics and health."""

    tasks: dict[str, TaskState] = field(default_factory=dict)
    restarts: Counter[str] = field(default_factory=Counter)  # by kind
    kinds: set[str] = field(default_factory=set)

    def state(self, name: str, kind: str) -> TaskState:
        st = self.tasks.get(name)
        if st is None:
            st = self.tasks[name] = TaskState(name=name, kind=kind)
            self.kinds.add(kind)
        return st

    def crash_looping(self) -> list[str]:
        """Tasks that crashed CRASH_LOOP times without a healthy interval between."""
        return sorted(n for n, s in self.tasks.items() if s.crashes_in_a_row >= CRASH_LOOP)

    def up_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(self.kinds, 0)
        for s in self.tasks.values():
            if s.up:
                out[s.kind] += 1
        return out


TASKS = TaskRegistry()


async def guard(
    name: str,
    factory: CoroFactory,
    *,
    kind: str | None = None,
    eternal: bool = True,
    restart: bool = True,
    base: float = 1.0,
    cap: float = 60.0,
    healthy_after: float = HEALTHY_AFTER,
    registry: TaskRegistry = TASKS,
    rng: random.Random | None = None,
) -> None:
    """Run ``factory()`` under the guard. A crash is logged with its traceback and, with
    ``restart``, retried after a backoff (``base`` doubling to ``cap``, reset once a run
    lasted ``healthy_after``). An ``eternal`` task that returns is logged (and restarted);
    a finite one may simply end. Cancellation always ends the guard."""
    st = registry.state(name, kind or name)
    st.up = True
    # One policy for the crash streak (doubling, reset by a healthy run), kits.backoff's.
    backoff = Backoff(base=base, cap=cap, rng=rng)
    loop = asyncio.get_running_loop()
    try:
        while True:
            started = loop.time()
            try:
                await factory()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if loop.time() - started >= healthy_after:
                    st.crashes_in_a_row = 0
                    backoff.reset()
                st.crashes_in_a_row += 1
                st.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.exception("task.crashed", task=name, crashes_in_a_row=st.crashes_in_a_row)
                if not restart:
                    return
                st.restarts += 1
                registry.restarts[st.kind] += 1
                st.up = False
                await asyncio.sleep(backoff.next())
                st.up = True
                continue
            if not eternal:
                return
            log.error("task.returned", task=name, note="an eternal task returned normally")
            if not restart:
                return
            st.up = False
            # Not a crash: wait one base delay, and leave the crash streak as it is.
            await asyncio.sleep(Backoff(base=base, cap=cap, rng=rng).next())
            st.up = True
    finally:
        st.up = False
        if not eternal:
            registry.tasks.pop(name, None)


def spawn(
    name: str,
    factory: CoroFactory,
    *,
    kind: str | None = None,
    eternal: bool = True,
    restart: bool = True,
    registry: TaskRegistry = TASKS,
) -> asyncio.Task[None]:
    """Start ``factory`` under :func:`guard` as a named task."""
    return asyncio.create_task(
        guard(name, factory, kind=kind, eternal=eternal, restart=restart, registry=registry),
        name=name,
    )
