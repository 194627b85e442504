"""One moment of the daemon as plain data: what ``/status`` and ``/metrics`` iterate.

Each subsystem offers its own read-only ``snapshot()`` (the store, each identity's
health, the state file, the dead man's switch, the span pipeline and its file
sources, the ingest port, the sweep slot); :func:`take` gathers them, and copies the
dispatcher's receiver statistics, into one frozen :class:`Snapshot`. Taken on each
request or scrape, so there is no second copy of any number to drift; nothing
reading a snapshot can change the daemon through it. Nothing here reads a secret.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from watchd.alerting.dispatch import Dispatcher
from watchd.alerting.receivers.base import READ_CAPS
from watchd.daemon.heartbeat import Heartbeat, HeartbeatSnapshot
from watchd.daemon.ingesting import IngestPort
from watchd.daemon.reloading import Reloads
from watchd.daemon.sweeping import SweepSlot, SweepSnapshot
from watchd.store.chats import ChatStore, StoreSnapshot
from watchd.store.health import HealthSnapshot, IdentityHealth
from watchd.store.sqlite import StateFile, StateSnapshot
from watchd.telemetry.filesource import FileSource
from watchd.telemetry.pipeline import SpanPipeline
from watchd.watching.watcher import IdentityWatcher

if TYPE_CHECKING:  # loaded only where one is configured (receivers/build.py)
    from watchd.alerting.receivers.simple import AlertmanagerNotifier


@dataclass(frozen=True, slots=True)
class ReceiverSnapshot:
    """One receiver's delivery record."""

    kind: str
    sent: int
    failed: int
    retried: int
    dropped: int
    last_error: str
    last_success: float | None
    last_failure: float | None
    retries_pending: int


@dataclass(frozen=True, slots=True)
class DispatchSnapshot:
    """The alert pipeline's receivers and aggregation groups."""

    receivers: Mapping[str, ReceiverSnapshot]
    # Alertmanager clusters only: each peer's own state, and its last push's error.
    peers: Mapping[str, list[dict[str, Any]]]
    peer_errors: Mapping[str, tuple[str | None, ...]]
    muted: Mapping[str, int]
    groups: int
    group_overflow: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything ``/status`` and ``/metrics`` show besides alerts and identity health."""

    store: StoreSnapshot
    health: Mapping[str, HealthSnapshot]  # per owned identity, in the order they started
    chats_by_status: Mapping[str, Mapping[str, int]]  # per owned identity
    # Per owned identity, per status: the oldest chat's clock start (server time).
    oldest_since: Mapping[str, Mapping[str, float]]
    state: StateSnapshot
    heartbeat: HeartbeatSnapshot | None
    sweep: SweepSnapshot | None
    dispatch: DispatchSnapshot | None
    telemetry: Mapping[str, Any]
    limits: Mapping[str, int]  # every bounded read that hit its bound
    reloads: Mapping[str, int]  # by outcome
    last_reload: Mapping[str, Any] | None  # the last applied reload
    reload_successful: bool  # the last reload (or the start-up load) succeeded
    reload_success_at: float  # when a reload (or the start-up load) last succeeded


def take(
    *,
    store: ChatStore,
    health: Mapping[str, IdentityHealth],
    watchers: Mapping[str, IdentityWatcher],
    db: StateFile,
    deadman: Heartbeat | None,
    sweep: SweepSlot,
    dispatcher: Dispatcher | None,
    telemetry: SpanPipeline,
    ingest: IngestPort,
    file_sources: Sequence[FileSource],
    reloads: Reloads,
) -> Snapshot:
    census = {name: store.census(name) for name in health}
    return Snapshot(
        store=store.snapshot(),
        health={name: h.snapshot() for name, h in health.items()},
        chats_by_status={
            name: {status: n for status, (n, _) in c.items()} for name, c in census.items()
        },
        oldest_since={
            name: {status: since for status, (_, since) in c.items()} for name, c in census.items()
        },
        state=db.snapshot(),
        heartbeat=None if deadman is None else deadman.snapshot(),
        sweep=sweep.snapshot(),
        dispatch=None if dispatcher is None else dispatch(dispatcher),
        telemetry={
            **telemetry.snapshot(),
            "ingest": dict(ingest.snapshot()),
            "file_sources": [f.snapshot() for f in file_sources],
        },
        limits=read_caps(health, watchers),
        reloads=dict(reloads.counts),
        last_reload=reloads.last,
        reload_successful=reloads.successful,
        reload_success_at=reloads.success_at,
    )


def dispatch(d: Dispatcher) -> DispatchSnapshot:
    kinds = {n: x.kind for n, x in d.notifiers.items()}
    cluster = {
        n: cast("AlertmanagerNotifier", x)
        for n, x in d.notifiers.items()
        if x.kind == "alertmanager"
    }
    return DispatchSnapshot(
        receivers={
            name: ReceiverSnapshot(
                kind=kinds.get(name, ""),
                sent=st.sent,
                failed=st.failed,
                retried=st.retried,
                dropped=st.dropped,
                last_error=st.last_error,
                last_success=st.last_success,
                last_failure=st.last_failure,
                retries_pending=len(st.retrying),
            )
            for name, st in d.stats.items()
        },
        peers={n: x.peers() for n, x in cluster.items()},
        peer_errors={n: tuple(x.peer_errors) for n, x in cluster.items()},
        muted=dict(d.muted),
        groups=len(d.groups),
        group_overflow=d.group_overflow,
    )


def read_caps(
    health: Mapping[str, IdentityHealth], watchers: Mapping[str, IdentityWatcher]
) -> dict[str, int]:
    """Every bounded read that hit its bound, summed over identities."""
    transports = [w.client.transport for w in watchers.values()]
    return {
        "coder_bodies_cut": sum(t.oversize for t in transports),
        "watch_handshake_timeouts": sum(t.handshake_timeouts for t in transports),
        "incomplete_listings": sum(h.incomplete_listings for h in health.values()),
        "event_buffer_overflows": sum(h.overflow for h in health.values()),
        "receiver_answers_cut": READ_CAPS["receiver_answers"],
    }
