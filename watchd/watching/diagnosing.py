"""The reads that explain a stuck chat: its workspace's latest build and the quota.

One per identity, beside its watcher: it shares the identity's client (and so its
rate limit) and remembers what it read for ``quota_ttl``, so the verdicts of a
burst share one build read per workspace. It returns what it read; turning that
into a hint is detection's job (:mod:`watchd.detection.diagnosis`), and the daemon
hands one to the other (this package must not import detection).
"""

from __future__ import annotations

from dataclasses import dataclass

from watchd.coder.client import CoderClient
from watchd.coder.models import BLOCKED_STATUSES, WorkspaceBuild
from watchd.coder.observing import Quota
from watchd.kits.clock import loop_time
from watchd.store.health import IdentityHealth
from watchd.store.records import ChatRecord

BUILD_CACHE = 1_000  # workspace builds remembered for diagnosis (oldest dropped first)


@dataclass(frozen=True, slots=True)
class Readings:
    """What was read about one chat: ``build_checked`` is False when the chat has a
    workspace whose build was not read (the bulk of a burst)."""

    build: WorkspaceBuild | None
    quota: Quota | None
    build_checked: bool


class Diagnosing:
    def __init__(self, *, health: IdentityHealth, client: CoderClient, quota_ttl: float) -> None:
        self.health = health
        self.client = client
        self.quota_ttl = quota_ttl
        self._quota: tuple[float, Quota | None] | None = None
        # workspace id -> (loop time read, latest build): shared by a burst's verdicts.
        self._builds: dict[str, tuple[float, WorkspaceBuild]] = {}

    async def read(self, record: ChatRecord, *, lookup: bool = True) -> Readings:
        """What explains a stuck chat. ``lookup=False`` (the bulk of a burst) uses only
        what is cached, so ten thousand verdicts never queue ten thousand GETs."""
        build = None
        ws = record.workspace_id
        checked = True
        # A client tool pause waits on the client, not on the workspace: its build explains nothing.
        if ws and record.status not in BLOCKED_STATUSES:
            cached = self._builds.get(ws)
            if cached is not None and loop_time() - cached[0] < self.quota_ttl:
                build = cached[1]
            elif lookup:
                build = await self.client.workspace(ws)
                if len(self._builds) >= BUILD_CACHE:
                    self._builds.pop(next(iter(self._builds)))
                self._builds[ws] = (loop_time(), build)
            else:
                checked = False
        quota = await self._quota_now()
        return Readings(build=build, quota=quota, build_checked=checked)

    async def _quota_now(self) -> Quota | None:
        """The quota watcher's reading while it is fresh; otherwise one read of our own."""
        now = loop_time()
        h = self.health
        if h.quota_state in ("unavailable", "unlimited") and h.quota_checked is not None:
            return h.quota
        if (
            h.quota is not None
            and h.quota_checked is not None
            and now - h.quota_checked < 2 * self.quota_ttl
        ):
            return h.quota
        if self._quota is not None and now - self._quota[0] < self.quota_ttl:
            return self._quota[1]
        quota = None
        me = await self.client.me()
        if me.organization_ids:
            quota = await self.client.workspace_quota(me.organization_ids[0], "me")
        self._quota = (now, quota)
        return quota
