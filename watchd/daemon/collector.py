"""The live collector behind ``/metrics``: families computed on every scrape from the
daemon's snapshot (:class:`~watchd.daemon.snapshot.Snapshot`), identity health and the
firing alerts (through :class:`~watchd.daemon.view.DaemonView`), so there is no second
copy of any number to drift.

Every labelled series exists from start-up (at 0): per identity for each known
status and alert name, per receiver for each outcome, per guarded task kind, so
``rate()`` and ``increase()`` see the first event. Label spaces stay bounded (an
unknown status is one ``other`` series). It registers nothing itself and reads no
secret; :mod:`watchd.daemon.metrics` owns the registry.
"""

from __future__ import annotations

import math
import platform
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from watchd.coder.models import ACTIVE_STATUSES, BLOCKED_STATUSES, IDLE_STATUSES
from watchd.daemon.snapshot import DispatchSnapshot, Snapshot
from watchd.daemon.view import DaemonView
from watchd.detection.alerts import SEVERITY
from watchd.kits.tasks import TASKS

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

# Every kind of guarded task, so each series exists (at 0) from start-up.
TASK_KINDS = frozenset(
    {
        "watch",
        "reconcile",
        "quota",
        "confirm",
        "group",
        "detector",
        "state-flusher",
        "heartbeat",
        "status-history",
        "systemd-notify",
        "spans",
        "sweep",
        "file-source",
        "dispatch-housekeeping",
        "deadman-switch",
    }
)
STATUSES = sorted(ACTIVE_STATUSES | BLOCKED_STATUSES | IDLE_STATUSES)
KNOWN = frozenset(STATUSES)
OTHER = "other"
ALERT_NAMES = sorted({*SEVERITY, "QuotaLow", "ChatSwept"})
OUTCOMES = ("sent", "failed", "retried", "dropped")


class Live(Collector):
    """Families computed from the live objects on every scrape: no second copy to drift."""

    def __init__(self, daemon: DaemonView) -> None:
        self.d = daemon

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families depend on the config; collected fresh each scrape

    def collect(self) -> Iterator[Metric]:
        d = self.d
        snap = d.snapshot()
        info = InfoMetricFamily("watchd_build", "watchd's version and runtime.")
        info.add_metric(
            [],
            {
                "version": d.version,
                "python_version": platform.python_version(),
                "implementation": platform.python_implementation(),
            },
        )
        yield info
        yield from self._sharding()
        yield from _chats(snap)
        yield from _state_and_tasks(snap)
        yield from self._identities()
        yield from self._activity(snap)
        yield from self._quota()
        yield from self._forecast()
        if snap.sweep is not None:
            sweep = _counter(
                "watchd_sweep_total",
                "Sweep decisions and actions by outcome.",
                ["outcome", "dry_run"],
            )
            for k, v in sorted(snap.sweep.counts.items()):
                sweep.add_metric([k, str(snap.sweep.dry_run).lower()], v)
            yield sweep
        yield from _telemetry(snap.telemetry)
        if snap.dispatch is not None:
            yield from _dispatch(snap.dispatch)

    def _identities(self) -> Iterator[Metric]:
        """Alerts firing per identity and alert name, and each identity's watch."""
        d = self.d
        ident = list(d.health.items())
        firing = Counter((a.labels.get("identity", ""), a.name) for a in d.detector.firing.values())
        alerts = _gauge(
            "watchd_alerts_firing",
            "Alerts firing, by identity and alert name.",
            ["identity", "alertname"],
        )
        keys = {(i, n) for i, _ in ident for n in ALERT_NAMES} | firing.keys()
        for i, n in sorted(keys):
            alerts.add_metric([i, n], firing.get((i, n), 0))
        yield alerts

        yield _per_identity(
            _gauge("watchd_identity_ready", "1 when the identity is seeded and streaming."),
            ident,
            lambda h: 1.0 if h.ready else 0.0,
        )
        yield _per_identity(
            _counter("watchd_watch_reconnects_total", "Watch stream redials."),
            ident,
            lambda h: h.reconnects,
        )
        yield _per_identity(
            _counter("watchd_relists_total", "Complete listings applied."),
            ident,
            lambda h: h.relists,
        )
        yield _per_identity(
            _counter("watchd_watch_events_total", "Watch events applied."),
            ident,
            lambda h: h.events,
        )
        # No sample before the first listing: an age of 0 would claim a fresh one.
        age = _gauge(
            "watchd_last_list_age_seconds",
            "Age of the last complete listing (absent until the first).",
            ["identity"],
        )
        for n, h in ident:
            if h.last_list_ok is not None:
                age.add_metric([n], round(h.server_clock.now() - h.last_list_ok, 3))
        yield age

    def _activity(self, snap: Snapshot) -> Iterator[Metric]:
        """The store's and the detector's counters, reloads and writes pending."""
        yield _single(
            _counter(
                "watchd_synthesized_transitions_total",
                "Transitions found by a listing that the stream never delivered.",
                [],
            ),
            snap.store.synthesized,
        )
        det = _counter("watchd_detector_events_total", "Detector activity by kind.", ["kind"])
        for k, v in sorted(self.d.detector.counters.items()):
            det.add_metric([k], v)
        yield det
        yield _single(
            _gauge("watchd_timers", "Armed chat clocks.", []), len(self.d.detector.timers)
        )
        yield _single(
            _counter("watchd_store_overflow_total", "Chats not stored: store at capacity.", []),
            snap.store.overflow,
        )
        reloads = _counter("watchd_config_reloads_total", "SIGHUP reloads by outcome.", ["outcome"])
        for k, v in sorted(snap.reloads.items()):
            reloads.add_metric([k], v)
        yield reloads
        yield _single(
            _gauge("watchd_state_pending_writes", "Chat records not yet flushed to disk.", []),
            snap.state.pending,
        )

    def _quota(self) -> Iterator[Metric]:
        quota = [
            (n, h.quota)
            for n, h in self.d.health.items()
            if h.quota is not None and not h.quota.unlimited
        ]
        headroom = _gauge(
            "watchd_quota_headroom_credits", "Workspace quota budget minus consumed.", ["identity"]
        )
        budget = _gauge("watchd_quota_budget_credits", "Workspace quota budget.", ["identity"])
        for n, q in quota:
            headroom.add_metric([n], float(q.headroom or 0))
            budget.add_metric([n], float(q.budget))
        yield headroom
        yield budget

    def _forecast(self) -> Iterator[Metric]:
        """Per identity: the fitted rate, and the seconds until the line reaches the budget
        (+Inf while it does not rise; both absent before the first reading)."""
        rate = _gauge("watchd_quota_consumption_rate", "Quota use, credits/h.", ["identity"])
        eta = _gauge("watchd_quota_exhaustion_eta_seconds", "Quota projected out in.", ["identity"])
        for n, h in sorted(self.d.health.items()):
            if (out := h.forecast) is not None:
                if out.rate_per_hour is not None:
                    rate.add_metric([n], out.rate_per_hour)
                left = math.inf if out.eta is None else max(0.0, out.eta - h.server_clock.now())
                eta.add_metric([n], left)
        yield rate
        yield eta

    def _sharding(self) -> Iterator[Metric]:
        d = self.d
        sh = d.config.sharding
        shard = InfoMetricFamily("watchd_shard", "This replica's place among its peers.")
        shard.add_metric(
            [],
            {
                "replica": str(d.shard_index),
                "replicas": str(sh.replicas),
                "replication_factor": str(sh.replication_factor),
            },
        )
        yield shard
        owned = _gauge("watchd_identities_owned", "Identities this replica watches.")
        owned.add_metric([], float(len(d.health)))
        yield owned
        # Bounded by the identities in the config times the replication factor.
        owner = _gauge(
            "watchd_identity_owner",
            "1 for each (identity, replica) that owns it, as every replica computes it.",
            ["identity", "replica"],
        )
        watched = _gauge(
            "watchd_identity_watched",
            "1 for each configured identity this replica watches, else 0 (alerts/: more or "
            "fewer replicas than its owners watching one is an overlap or a gap).",
        )
        for name, reps in sorted(d.config.identity_owners().items()):
            for r in reps:
                owner.add_metric([name, str(r)], 1.0)
            watched.add_metric([name], 1.0 if name in d.health else 0.0)
        yield owner
        yield watched


def _chats(snap: Snapshot) -> Iterator[Metric]:
    chats = _gauge("watchd_chats", "Chats known, by identity and status.", ["identity", "status"])
    unknown = 0
    for name, by_status in snap.chats_by_status.items():
        counts: Counter[str] = Counter()
        for status, n in by_status.items():
            # A status this build does not know is one series, `other`, however many
            # distinct strings a server sends: the label space stays bounded.
            if status in KNOWN:
                counts[status] += n
            else:
                counts[OTHER] += n
                unknown += n
        for status in (*sorted(STATUSES), OTHER):
            chats.add_metric([name, status], counts.get(status, 0))
    yield chats
    yield _single(
        _gauge(
            "watchd_chats_unknown_status",
            "Chats whose status this build does not know (in watchd_chats as status=other).",
            [],
        ),
        unknown,
    )


def _state_and_tasks(snap: Snapshot) -> Iterator[Metric]:
    """State persistence, reads cut at their bound, guarded tasks, the dead man's switch."""
    yield _single(
        _gauge("watchd_state_persisting", "1 while state writes succeed, else 0.", []),
        1 if snap.state.persisting else 0,
    )
    yield _single(
        _counter("watchd_state_write_failures", "State writes that failed.", []),
        snap.state.write_failures,
    )
    cut = _counter(
        "watchd_reads_cut",
        "Reads from outside that hit their bound (docs/limits.md), by kind.",
        ["kind"],
    )
    for cap_kind, cap_hits in snap.limits.items():
        cut.add_metric([cap_kind], cap_hits)
    yield cut
    restarts = _counter(
        "watchd_task_restarts",
        "Restarts of guarded long-lived tasks after a crash, by task kind.",
        ["task"],
    )
    up = _gauge("watchd_task_up", "Guarded long-lived tasks running, by task kind.", ["task"])
    running = TASKS.up_by_kind()
    for kind in sorted(TASK_KINDS | TASKS.kinds):
        restarts.add_metric([kind], TASKS.restarts.get(kind, 0))
        up.add_metric([kind], running.get(kind, 0))
    yield restarts
    yield up
    beats = _counter("watchd_heartbeats", "Dead man's switch beats, by outcome.", ["outcome"])
    hb = snap.heartbeat
    for beat, beat_count in (
        ("sent", hb.sent if hb else 0),
        ("failed", hb.failed if hb else 0),
        ("withheld", hb.withheld if hb else 0),
        ("ping_skipped", hb.pings_skipped if hb else 0),
    ):
        beats.add_metric([beat], beat_count)
    yield beats


def _telemetry(t: Mapping[str, Any]) -> Iterator[Metric]:
    events = _counter(
        "watchd_transport_events_total",
        "Transport events into the span pipeline, accepted or dropped (queue full).",
        ["outcome"],
    )
    events.add_metric(["accepted"], t["events_accepted"])
    events.add_metric(["dropped"], t["events_dropped"])
    yield events
    ingest = _counter("watchd_ingest_requests_total", "Ingest requests by outcome.", ["outcome"])
    for k, v in sorted(t["ingest"].items()):
        ingest.add_metric([k], v)
    yield ingest
    yield _single(
        _gauge("watchd_event_queue_depth", "Transport events waiting for conversion.", []),
        t["event_queue_depth"],
    )
    yield _single(
        _gauge(
            "watchd_span_open_pairs",
            "Requests, connections and segments awaiting their end event.",
            [],
        ),
        t["open_pairs"],
    )
    lines = _counter(
        "watchd_file_source_lines_total",
        "Lines read from telemetry.sources files, and those rejected (bad or too long).",
        ["path", "outcome"],
    )
    rotations = _counter(
        "watchd_file_source_rotations_total",
        "Times a telemetry.sources file was rotated or truncated under watchd.",
        ["path"],
    )
    for f in t["file_sources"]:
        lines.add_metric([f["path"], "read"], f["lines"])
        lines.add_metric([f["path"], "bad"], f["bad_lines"])
        rotations.add_metric([f["path"]], f["rotations"])
    yield lines
    yield rotations
    conv = _counter("watchd_span_converter_total", "Converter activity by kind.", ["kind"])
    for k, v in sorted(t["converter"].items()):
        conv.add_metric([k], v)
    yield conv
    export = t["export"]
    if export is not None:
        spans = _counter("watchd_spans_total", "Spans by export outcome.", ["outcome"])
        for k in ("exported", "failed", "dropped"):
            spans.add_metric([k], export[k])
        yield spans
        yield _single(
            _gauge("watchd_span_export_in_flight", "Spans queued for the exporter.", []),
            export["in_flight"],
        )


def _dispatch(disp: DispatchSnapshot) -> Iterator[Metric]:
    stats = sorted(disp.receivers.items())
    sent = _counter(
        "watchd_notifications_total",
        "Notifications by receiver and outcome (sent, failed, retried, dropped).",
        ["receiver", "outcome"],
    )
    for n, st in stats:
        for o in OUTCOMES:
            sent.add_metric([n, o], getattr(st, o))
    yield sent
    last = _gauge(
        "watchd_receiver_last_success_timestamp_seconds",
        "When the receiver last accepted a notification (absent until the first).",
        ["receiver"],
    )
    for n, st in stats:
        if st.last_success is not None:
            last.add_metric([n], st.last_success)
    yield last
    # Bounded by the configured receivers' peers (`urls:`); the peer is its index.
    failing = _gauge(
        "watchd_receiver_peer_failing",
        "1 while an Alertmanager peer's last push failed, by receiver and peer index.",
        ["receiver", "peer"],
    )
    for n, errors in sorted(disp.peer_errors.items()):
        for i, err in enumerate(errors):
            failing.add_metric([n, str(i)], 1.0 if err else 0.0)
    yield failing
    muted = _counter(
        "watchd_alerts_muted_total",
        "Alerts held back by silences or inhibition at flush time.",
        ["reason"],
    )
    for k, v in sorted(disp.muted.items()):
        muted.add_metric([k], v)
    yield muted
    yield _single(_gauge("watchd_alert_groups", "Aggregation groups alive.", []), disp.groups)
    yield _single(
        _counter(
            "watchd_alert_group_overflow_total",
            "Alerts not grouped because the aggregation-group limit (docs/limits.md) was hit.",
            [],
        ),
        disp.group_overflow,
    )


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["identity"] if labels is None else labels)


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=["identity"] if labels is None else labels)


def _per_identity(family: Any, ident: list[tuple[str, Any]], value: Any) -> Any:
    for n, h in ident:
        family.add_metric([n], value(h))
    return family


def _single(family: Any, value: float) -> Any:
    family.add_metric([], value)
    return family
