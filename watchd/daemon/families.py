"""``/metrics`` families computed from a :class:`~watchd.daemon.snapshot.Snapshot` alone:
chats by status, state persistence, guarded tasks, the dead man's switch, the span
pipeline and the alert pipeline's receivers. The collector (:mod:`watchd.daemon.collector`)
yields them beside the families it reads from identity health and firing alerts.

Every labelled series exists from start-up (at 0), and label spaces stay bounded (an
unknown status is one ``other`` series). Nothing here reads a secret.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from watchd.coder.models import ACTIVE_STATUSES, BLOCKED_STATUSES, IDLE_STATUSES
from watchd.daemon.snapshot import DispatchSnapshot, Snapshot
from watchd.kits.histogram import le
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
# The statuses a chat can be stuck in, and one series for those this build does not know.
NON_TERMINAL = (*sorted(ACTIVE_STATUSES | BLOCKED_STATUSES), OTHER)
OUTCOMES = ("sent", "failed", "retried", "dropped")


def chat_families(snap: Snapshot) -> Iterator[Metric]:
    chats = gauge("watchd_chats", "Chats known, by identity and status.", ["identity", "status"])
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
    oldest = gauge(
        "watchd_chat_oldest_status_age_seconds",
        "Age in status of the oldest chat now in each non-terminal status (0: none), "
        "on the server's clock.",
        ["identity", "status"],
    )
    for name, since_by_status in snap.oldest_since.items():
        health = snap.health.get(name)
        if health is None:
            continue
        ages: dict[str, float] = {}
        for status, since in since_by_status.items():
            key = status if status in KNOWN else OTHER
            if key in IDLE_STATUSES:
                continue
            ages[key] = max(ages.get(key, 0.0), health.server_now - since)
        for status in NON_TERMINAL:
            oldest.add_metric([name, status], round(max(0.0, ages.get(status, 0.0)), 3))
    yield oldest
    yield single(
        gauge(
            "watchd_chats_unknown_status",
            "Chats whose status this build does not know (in watchd_chats as status=other).",
            [],
        ),
        unknown,
    )


def state_families(snap: Snapshot) -> Iterator[Metric]:
    """State persistence, reads cut at their bound, guarded tasks, the dead man's switch."""
    yield single(
        gauge("watchd_state_persisting", "1 while state writes succeed, else 0.", []),
        1 if snap.state.persisting else 0,
    )
    yield single(
        counter("watchd_state_write_failures", "State writes that failed.", []),
        snap.state.write_failures,
    )
    cut = counter(
        "watchd_reads_cut",
        "Reads from outside that hit their bound (docs/limits.md), by kind.",
        ["kind"],
    )
    for cap_kind, cap_hits in snap.limits.items():
        cut.add_metric([cap_kind], cap_hits)
    yield cut
    restarts = counter(
        "watchd_task_restarts",
        "Restarts of guarded long-lived tasks after a crash, by task kind.",
        ["task"],
    )
    up = gauge("watchd_task_up", "Guarded long-lived tasks running, by task kind.", ["task"])
    running = TASKS.up_by_kind()
    for kind in sorted(TASK_KINDS | TASKS.kinds):
        restarts.add_metric([kind], TASKS.restarts.get(kind, 0))
        up.add_metric([kind], running.get(kind, 0))
    yield restarts
    yield up
    beats = counter("watchd_heartbeats", "Dead man's switch beats, by outcome.", ["outcome"])
    hb = snap.heartbeat
    for beat, beat_count in (
        ("sent", hb.sent if hb else 0),
        ("failed", hb.failed if hb else 0),
        ("withheld", hb.withheld if hb else 0),
        ("ping_skipped", hb.pings_skipped if hb else 0),
    ):
        beats.add_metric([beat], beat_count)
    yield beats


def telemetry_families(t: Mapping[str, Any]) -> Iterator[Metric]:
    events = counter(
        "watchd_transport_events_total",
        "Transport events into the span pipeline, accepted or dropped (queue full).",
        ["outcome"],
    )
    events.add_metric(["accepted"], t["events_accepted"])
    events.add_metric(["dropped"], t["events_dropped"])
    yield events
    ingest = counter("watchd_ingest_requests_total", "Ingest requests by outcome.", ["outcome"])
    for k, v in sorted(t["ingest"].items()):
        ingest.add_metric([k], v)
    yield ingest
    yield single(
        gauge("watchd_event_queue_depth", "Transport events waiting for conversion.", []),
        t["event_queue_depth"],
    )
    yield single(
        gauge(
            "watchd_span_open_pairs",
            "Requests, connections and segments awaiting their end event.",
            [],
        ),
        t["open_pairs"],
    )
    yield from agent_families(t["agents"])
    lines = counter(
        "watchd_file_source_lines_total",
        "Lines read from telemetry.sources files, and those rejected (bad or too long).",
        ["path", "outcome"],
    )
    rotations = counter(
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
    conv = counter("watchd_span_converter_total", "Converter activity by kind.", ["kind"])
    for k, v in sorted(t["converter"].items()):
        conv.add_metric([k], v)
    yield conv
    export = t["export"]
    if export is not None:
        spans = counter("watchd_spans_total", "Spans by export outcome.", ["outcome"])
        for k in ("exported", "failed", "dropped"):
            spans.add_metric([k], export[k])
        yield spans
        yield single(
            gauge("watchd_span_export_in_flight", "Spans queued for the exporter.", []),
            export["in_flight"],
        )


def dispatch_families(disp: DispatchSnapshot) -> Iterator[Metric]:
    stats = sorted(disp.receivers.items())
    sent = counter(
        "watchd_notifications_total",
        "Notifications by receiver and outcome (sent, failed, retried, dropped).",
        ["receiver", "outcome"],
    )
    for n, st in stats:
        for o in OUTCOMES:
            sent.add_metric([n, o], getattr(st, o))
    yield sent
    last = gauge(
        "watchd_receiver_last_success_timestamp_seconds",
        "When the receiver last accepted a notification (absent until the first).",
        ["receiver"],
    )
    for n, st in stats:
        if st.last_success is not None:
            last.add_metric([n], st.last_success)
    yield last
    # Bounded by the configured receivers' peers (`urls:`); the peer is its index.
    failing = gauge(
        "watchd_receiver_peer_failing",
        "1 while an Alertmanager peer's last push failed, by receiver and peer index.",
        ["receiver", "peer"],
    )
    for n, errors in sorted(disp.peer_errors.items()):
        for i, err in enumerate(errors):
            failing.add_metric([n, str(i)], 1.0 if err else 0.0)
    yield failing
    muted = counter(
        "watchd_alerts_muted_total",
        "Alerts held back by silences or inhibition at flush time.",
        ["reason"],
    )
    for k, v in sorted(disp.muted.items()):
        muted.add_metric([k], v)
    yield muted
    yield single(gauge("watchd_alert_groups", "Aggregation groups alive.", []), disp.groups)
    yield single(
        counter(
            "watchd_alert_group_overflow_total",
            "Alerts not grouped because the aggregation-group limit (docs/limits.md) was hit.",
            [],
        ),
        disp.group_overflow,
    )


def agent_families(a: Mapping[str, Any]) -> Iterator[Metric]:
    """The agents' forwarded transport events (fleet.md §5): closed label sets only."""
    segments = counter(
        "watchd_agent_segments_total",
        "Settled turn segments forwarded by agents, by outcome.",
        ["outcome"],
    )
    for k, v in a["segments"].items():
        segments.add_metric([k], v)
    yield segments
    h = a["segment_seconds"]
    hist = HistogramMetricFamily(
        "watchd_agent_segment_duration_seconds",
        "Duration of settled segments that carried durationMs.",
        labels=[],
    )
    hist.add_metric(
        [],
        [(le(b), float(c)) for b, c in zip(h["buckets"], h["counts"], strict=True)],
        sum_value=h["sum"],
    )
    yield hist
    yield single(
        counter("watchd_agent_redials_total", "Stream redials (ws:redial) agents forwarded.", []),
        a["redials"],
    )
    http = counter(
        "watchd_agent_http_responses_total",
        "HTTP answers agents forwarded, by status class (error: no answer).",
        ["code_class"],
    )
    for k, v in a["http"].items():
        http.add_metric([k], v)
    yield http


def gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["identity"] if labels is None else labels)


def counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=["identity"] if labels is None else labels)


def per_identity(family: Any, ident: list[tuple[str, Any]], value: Any) -> Any:
    for n, h in ident:
        family.add_metric([n], value(h))
    return family


def single(family: Any, value: float) -> Any:
    family.add_metric([], value)
    return family
