"""The sweep as the daemon runs it: built from ``sweep:`` only when it is enabled,
started under the supervisor, and replaced on a reload that changes it.

The sweep code itself (``watchd.remediation``) is imported only when a sweep is
configured: most daemons never sweep, and a sidecar should not pay for it. A
replacement carries the old sweeper's counts and recent actions over, so /status and
/metrics do not start again from zero after a reload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from watchd.config.sweep import SweepConfig
from watchd.daemon.supervisor import Supervisor
from watchd.detection.detector import Detector
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.sqlite import StateFile
from watchd.watching.watcher import IdentityWatcher

if TYPE_CHECKING:
    from watchd.remediation.sweeper import Sweeper

TASK = "sweep"


@dataclass(frozen=True, slots=True)
class SweepSnapshot:
    """The sweeper's counts and its last actions, as plain data."""

    dry_run: bool
    counts: Mapping[str, int]
    recent: tuple[Any, ...]  # the last RECENT_SHOWN actions, oldest first


RECENT_SHOWN = 50


class SweepSlot:
    """Where the one sweeper lives (or none), and how it is built and replaced."""

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        store: ChatStore,
        health: Mapping[str, IdentityHealth],
        watchers: Mapping[str, IdentityWatcher],
        db: StateFile,
        detector: Detector,
        audit_path: Path,
        labels: Callable[[str], dict[str, str]],
        config: SweepConfig,
    ) -> None:
        self.supervisor = supervisor
        self.store = store
        self.health = health
        self.watchers = watchers
        self.db = db
        self.detector = detector
        self.audit_path = audit_path
        self.labels = labels
        self.sweeper: Sweeper | None = self.build(config)

    def build(self, config: SweepConfig) -> Sweeper | None:
        """The sweeper ``config`` asks for (not started), or None when sweeping is off."""
        if not config.enabled:
            return None
        from watchd.remediation.sweeper import Sweeper

        watchers = self.watchers
        return Sweeper(
            config=config,
            store=self.store,
            health=self.health,
            clients=lambda n: watchers[n].client if n in watchers else None,
            db=self.db,
            ledger=self.detector.ledger,
            audit_path=self.audit_path,
            labels=self.labels,
            on_invalid=self.detector.ledger.note_invalid,
        )

    def snapshot(self) -> SweepSnapshot | None:
        """None when sweeping is off."""
        s = self.sweeper
        if s is None:
            return None
        return SweepSnapshot(
            dry_run=s.config.dry_run,
            counts=dict(s.counts),
            recent=tuple(list(s.recent)[-RECENT_SHOWN:]),
        )

    def start(self) -> None:
        if self.sweeper is not None:
            self.supervisor.spawn(TASK, self.sweeper.run, group="watchers", restart=True)

    async def replace(self, config: SweepConfig) -> None:
        """Sweep settings changed: a new sweeper, the old one's counts and trail kept."""
        await self.supervisor.stop(TASK)
        old, self.sweeper = self.sweeper, self.build(config)
        if self.sweeper is not None and old is not None:
            self.sweeper.counts.update(old.counts)
            self.sweeper.recent.extend(old.recent)
        self.start()
