"""The ordered stop: intake, watchers, core, the last flush, state, sessions.

SIGTERM must end the process well inside Kubernetes' and systemd's grace period, so each
step has its own deadline and a step that hangs is named in the ``daemon.stopped`` log
line rather than holding up the next. The order is what keeps nothing accepted from
being lost: intake stops first (no new events or silences), then the watchers (no new
changes), then the core tasks; the dispatcher's groups get a last flush, spans are
exported, and only then is the database closed and its lock released.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Mapping

import aiohttp

from watchd.alerting.dispatch import Dispatcher
from watchd.daemon.sdnotify import SdNotifier
from watchd.daemon.server import Server
from watchd.daemon.supervisor import Supervisor
from watchd.detection.detector import Detector
from watchd.kits import logs
from watchd.store.health import IdentityHealth
from watchd.store.lock import StateLock
from watchd.store.sqlite import StateFile
from watchd.telemetry.pipeline import SpanPipeline

log = logs.get("watchd.daemon")

DEADLINES = {"server": 1.0, "watchers": 2.0, "core": 1.0, "flush": 2.0, "spans": 2.0}


async def stop_in_order(
    *,
    notifier: SdNotifier,
    server: Server,
    supervisor: Supervisor,
    health: Mapping[str, IdentityHealth],
    detector: Detector,
    dispatcher: Dispatcher | None,
    telemetry: SpanPipeline,
    db: StateFile,
    lock: StateLock,
    session: aiohttp.ClientSession | None,
) -> None:
    """Stop everything, each step bounded by its deadline."""
    t0 = time.monotonic()
    notifier.stopping()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(server.stop(), DEADLINES["server"])
    hung = await supervisor.stop_group("watchers", deadline=DEADLINES["watchers"])
    for h in health.values():
        h.set_state("stopped")
    hung += await supervisor.stop_group("core", deadline=DEADLINES["core"])
    for w in detector.watched.values():
        if w.task is not None:
            w.task.cancel()
    if dispatcher is not None:
        await dispatcher.close(deadline=DEADLINES["flush"])
    with contextlib.suppress(Exception):
        await telemetry.close(deadline=DEADLINES["spans"])
    with contextlib.suppress(sqlite3.Error, OSError):
        db.close()
    lock.release()
    if session is not None:
        await session.close()
    log.info("daemon.stopped", seconds=round(time.monotonic() - t0, 2), hung=hung)
