"""The read-only face of the running daemon that the server, status page and metrics see.

``DaemonView`` names exactly what they read, so none of them imports ``daemon.app``
(no import circle, and nothing there can rewire the daemon by reaching into it): the
numbers come as a plain-data :class:`~watchd.daemon.snapshot.Snapshot` taken per
request, so there is no second copy to drift. Liveness, the systemd status line and
the chart's history live here too. Nothing here reads a secret.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from watchd.alerting.silencing import Inhibitor, Silencer
from watchd.config.model import Config
from watchd.daemon.snapshot import Snapshot
from watchd.daemon.supervisor import Supervisor
from watchd.detection.detector import Detector
from watchd.detection.identity_alerts import unhealthy_fingerprint
from watchd.kits.tasks import TASKS, TaskRegistry
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth

# The heartbeat ticks every second; missing 5 means the loop or the supervisor is wedged.
STALE_HEARTBEAT = 5.0
# Task kinds that belong to one identity: their crash loops make the identity unhealthy
# (IdentityUnhealthy); any other task's crash loop makes the process unhealthy.
IDENTITY_TASKS = frozenset({"watch", "reconcile", "quota", "confirm"})

HISTORY_WINDOW = 3600.0  # the status chart's span: the last hour
HISTORY_EVERY = 30.0  # one sample of chats-by-status per identity this often


class DaemonView(Protocol):
    """What the HTTP face reads from the daemon (``daemon.app.Daemon`` satisfies it).

    Counters and settings come as one plain-data :class:`Snapshot` per request; the few
    live objects left are those a request must iterate or match against (identity
    health, firing alerts, silences and inhibitions, the store for admission counts)."""

    @property
    def config(self) -> Config: ...
    @property
    def version(self) -> str: ...
    @property
    def started(self) -> float: ...
    @property
    def last_beat(self) -> float: ...
    @property
    def shard_index(self) -> int: ...
    @property
    def supervisor(self) -> Supervisor: ...
    @property
    def store(self) -> ChatStore: ...
    @property
    def detector(self) -> Detector: ...
    @property
    def silencer(self) -> Silencer: ...
    @property
    def inhibitor(self) -> Inhibitor: ...
    @property
    def health(self) -> Mapping[str, IdentityHealth]: ...
    @property
    def history(self) -> ChatHistory: ...

    def snapshot(self) -> Snapshot: ...
    def ready(self) -> bool: ...
    def settled(self) -> bool: ...


def liveness_problems(d: DaemonView, registry: TaskRegistry = TASKS) -> list[str]:
    """Why the process is not live (``/healthz`` 503, no WATCHDOG=1), or nothing: the
    loop's heartbeat is fresh, no root task ended, no process-wide task crash-loops."""
    problems = []
    age = time.monotonic() - d.last_beat
    if age > STALE_HEARTBEAT:
        problems.append(f"event loop heartbeat is {age:.1f}s old")
    dead = d.supervisor.dead_roots()
    if dead:
        problems.append(f"root tasks ended: {', '.join(sorted(dead))}")
    looping = [n for n in registry.crash_looping() if n.split(":", 1)[0] not in IDENTITY_TASKS]
    if looping:
        problems.append(f"tasks crash-looping: {', '.join(looping)}")
    return problems


def not_seeing(d: DaemonView, *, persisting: bool) -> str | None:
    """None when the dead man's switch may say "alive": the process is live, every
    identity is ready or its IdentityUnhealthy is firing, and state ``persisting``.
    Otherwise why not."""
    if liveness_problems(d):
        return "the event loop or a root task is not making progress"
    for name, h in d.health.items():
        if h.ready:
            continue
        if unhealthy_fingerprint(h) not in d.detector.firing:
            return f"identity {name} is {h.state} and not yet alerted"
    if not persisting:
        return "state is not persisting"
    return None


def status_line(d: DaemonView) -> str:
    """systemd's STATUS=: each identity's state and the number of alerts firing."""
    parts = []
    for name, h in d.health.items():
        parts.append(f"{name} {h.state}" + (f" ({h.last_list_chats})" if h.ready else ""))
    return f"{'; '.join(parts)}; {len(d.detector.firing)} alerts firing"


@dataclass
class ChatHistory:
    """Chats by status per identity, sampled every ``HISTORY_EVERY`` over the last hour."""

    samples: deque[tuple[float, dict[str, dict[str, int]]]] = field(
        default_factory=lambda: deque(maxlen=int(HISTORY_WINDOW / HISTORY_EVERY) + 1)
    )

    def sample(self, store: ChatStore, identities: list[str], now: float) -> None:
        self.samples.append((now, {n: store.by_status(n) for n in identities}))

    async def keep(self, store: ChatStore, health: Mapping[str, IdentityHealth]) -> None:
        """Sample every ``HISTORY_EVERY`` for the status page's last-hour chart."""
        while True:
            self.sample(store, list(health), time.time())
            await asyncio.sleep(HISTORY_EVERY)

    def series(self, identity: str, now: float) -> list[tuple[float, dict[str, int]]]:
        return [(t, s.get(identity, {})) for t, s in self.samples if now - t <= HISTORY_WINDOW]


def sharding_summary(d: DaemonView) -> dict[str, Any]:
    """Which identities this replica watches and which replicas own the others."""
    sh = d.config.sharding
    owners = d.config.identity_owners()
    return {
        "replica": d.shard_index,
        "replicas": sh.replicas,
        "replication_factor": sh.replication_factor,
        "watching": d.config.watching,
        "owned": sorted(d.health),
        "others": {name: reps for name, reps in sorted(owners.items()) if name not in d.health},
        "owners": owners,
    }
