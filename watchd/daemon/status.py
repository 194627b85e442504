"""The daemon's state as data: the ``/status`` document and ``/metrics`` text.

Both are computed at request time from the live objects (store, health,
detector), so there is no second copy of any number to drift. Nothing here
reads a secret: identities are shown by name and URL only.
"""

from __future__ import annotations

import html
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from watchd.alerting.model import live
from watchd.config import format_duration

if TYPE_CHECKING:
    from watchd.daemon.app import Daemon


def status_document(d: Daemon) -> dict[str, Any]:
    identities = []
    for name, h in d.health.items():
        by_status = Counter(r.status for r in d.store.records(name))
        identities.append(
            {
                "name": name,
                "deployment": h.deployment,
                "state": h.state,
                "ready": h.ready,
                "seeded": h.seeded_once,
                "prefix": h.prefix,
                "last_list": h.last_list_ok,
                "last_list_age_seconds": None
                if h.last_list_ok is None
                else round(h.server_clock.now() - h.last_list_ok, 1),
                "last_list_seconds": h.last_list_seconds,
                "chats": sum(by_status.values()),
                "chats_by_status": dict(sorted(by_status.items())),
                "last_error": h.last_error,
                "reconnects": h.reconnects,
                "relists": h.relists,
                "events": h.events,
                "server_clock_offset_seconds": round(h.server_clock.offset, 3),
                "quota": {
                    "state": h.quota_state,
                    "budget": h.quota.budget if h.quota else None,
                    "consumed": h.quota.credits_consumed if h.quota else None,
                    "headroom": h.quota.headroom if h.quota else None,
                    "error": h.quota_error,
                },
            }
        )
    det = d.detector
    now = time.time()
    # Time in status as of this request, not as of when each alert fired.
    firing = [
        live(a, now).to_json()
        for a in sorted(
            det.firing.values(), key=lambda a: (a.labels.get("identity", ""), a.starts_at)
        )
    ]
    return {
        "version": d.version,
        "uptime_seconds": round(time.monotonic() - d.started, 1),
        "ready": d.ready(),
        "identities": identities,
        "alerts": {"firing": firing, "recent": [a.to_json() for a in list(det.history)[-50:]]},
        "silences": [s.to_json(time.time()) for s in d.silencer.silences.values()],
        "receivers": {
            name: {
                "sent": st.sent,
                "failed": st.failed,
                "retried": st.retried,
                "dropped": st.dropped,
                "last_error": st.last_error,
                "last_success": st.last_success,
            }
            for name, st in (d.dispatcher.stats.items() if d.dispatcher else [])
        },
        "groups": len(d.dispatcher.groups) if d.dispatcher else 0,
        "telemetry": telemetry_summary(d),
        "sweep": None
        if d.sweeper is None
        else {
            "dry_run": d.config.sweep.dry_run,
            "counts": dict(d.sweeper.counts),
            "recent": list(d.sweeper.recent)[-50:],
        },
        "reload": {**d.reloads, "last": d.last_reload},
        "counters": dict(det.counters),
        "store": {
            "chats": len(d.store),
            "stale_ignored": d.store.stale_ignored,
            "synthesized": d.store.synthesized,
            "overflow": d.store.overflow,
        },
    }


_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 2em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
tr.bad td { background: #fde8e8; }
tr.ok td:nth-child(3) { color: #080; }
h1 small { font-weight: normal; color: #777; font-size: 60%; }
"""


def status_html(doc: dict[str, Any]) -> str:
    e = html.escape
    rows = []
    for i in doc["identities"]:
        statuses = ", ".join(f"{e(k)}: {v}" for k, v in i["chats_by_status"].items()) or "—"
        age = i["last_list_age_seconds"]
        rows.append(
            f"<tr class='{'ok' if i['ready'] else 'bad'}'><td>{e(i['name'])}</td>"
            f"<td>{e(i['deployment'])}</td><td>{e(i['state'])}</td>"
            f"<td>{'—' if age is None else e(format_duration(age)) + ' ago'}</td>"
            f"<td>{i['chats']}</td><td>{statuses}</td><td>{e(i['last_error'] or '')}</td></tr>"
        )
    alerts = []
    for a in doc["alerts"]["firing"]:
        lab, ann = a["labels"], a["annotations"]
        alerts.append(
            f"<tr><td>{e(lab.get('alertname', ''))}</td><td>{e(lab.get('identity', ''))}</td>"
            f"<td>{e(lab.get('status', ''))}</td><td>{e(ann.get('title', ''))}</td>"
            f"<td>{e(ann.get('time_in_status', ''))}</td><td>{e(ann.get('budget', ''))}</td>"
            f"<td>{e(ann.get('clock', ''))}</td><td>{e(ann.get('hint', ''))}</td></tr>"
        )
    silences = (
        "".join(
            f"<tr><td>{e(str(si['id']))}</td><td>{e(str(si['state']))}</td>"
            f"<td>{e(', '.join(si['matchers']))}</td>"
            f"<td>{e(time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(float(si['ends_at']))))}</td>"
            f"<td>{e(str(si['created_by']))}</td><td>{e(str(si['comment']))}</td></tr>"
            for si in doc["silences"]
            if si["state"] != "expired"
        )
        or "<tr><td colspan=6>No silences.</td></tr>"
    )
    no_alerts = "<tr><td colspan=8>No alerts firing.</td></tr>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>watchd status</title>
<meta http-equiv="refresh" content="10">
<style>{_CSS}</style></head><body>
<h1>watchd <small>v{e(doc["version"])} · up {e(format_duration(doc["uptime_seconds"]))}
 · {"ready" if doc["ready"] else "not ready"}</small></h1>
<h2>Identities</h2>
<table id="identities"><tr><th>identity</th><th>deployment</th><th>watch</th><th>last list</th>
<th>chats</th><th>by status</th><th>last error</th></tr>{"".join(rows)}</table>
<h2>Firing alerts ({len(doc["alerts"]["firing"])})</h2>
<table id="alerts"><tr><th>alert</th><th>identity</th><th>status</th><th>chat</th>
<th>time in status</th><th>budget</th><th>clock</th><th>hint</th></tr>
{"".join(alerts) or no_alerts}</table>
<h2>Silences</h2>
<table id="silences"><tr><th>id</th><th>state</th><th>matchers</th><th>ends</th><th>by</th>
<th>comment</th></tr>{silences}</table>
</body></html>"""


def telemetry_summary(d: Daemon) -> dict[str, Any]:
    t = d.telemetry
    export = t.export
    return {
        "events_accepted": t.sink.accepted,
        "events_dropped": t.sink.dropped,
        "event_queue_depth": t.sink.queue.qsize(),
        "open_pairs": t.converter.open_pairs,
        "converter": dict(t.converter.counters),
        "spans_by_name": dict(t.by_name.most_common(20)),
        "export": None
        if export is None
        else {
            "submitted": export.submitted,
            "exported": export.exported,
            "failed": export.failed,
            "dropped": export.dropped,
            "in_flight": export.in_flight,
        },
        "ingest": dict(d.server.ingest_counts),
    }


def _escape(value: str) -> str:
    """Prometheus label-value escaping: backslash, double quote, newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(name: str, labels: dict[str, str], value: float) -> str:
    if labels:
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        return f"{name}{{{inner}}} {value}"
    return f"{name} {value}"


def metrics_text(d: Daemon) -> str:
    out: list[str] = []

    def family(
        name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]
    ) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(_fmt(name, labels, value) for labels, value in samples)

    chats: list[tuple[dict[str, str], float]] = []
    for name in d.health:
        for status, n in sorted(Counter(r.status for r in d.store.records(name)).items()):
            chats.append(({"identity": name, "status": status}, n))
    family("watchd_chats", "gauge", "Chats known, by identity and status.", chats)
    firing = Counter((a.labels.get("identity", ""), a.name) for a in d.detector.firing.values())
    family(
        "watchd_alerts_firing",
        "gauge",
        "Alerts firing, by identity and alert name.",
        [({"identity": i, "alertname": n}, c) for (i, n), c in sorted(firing.items())],
    )
    ident = list(d.health.items())
    family(
        "watchd_identity_ready",
        "gauge",
        "1 when the identity is seeded and streaming.",
        [({"identity": n}, 1.0 if h.ready else 0.0) for n, h in ident],
    )
    family(
        "watchd_watch_reconnects_total",
        "counter",
        "Watch stream redials.",
        [({"identity": n}, h.reconnects) for n, h in ident],
    )
    family(
        "watchd_relists_total",
        "counter",
        "Complete listings applied.",
        [({"identity": n}, h.relists) for n, h in ident],
    )
    family(
        "watchd_watch_events_total",
        "counter",
        "Watch events applied.",
        [({"identity": n}, h.events) for n, h in ident],
    )
    family(
        "watchd_last_list_age_seconds",
        "gauge",
        "Age of the last complete listing.",
        [
            ({"identity": n}, round(h.server_clock.now() - h.last_list_ok, 3))
            for n, h in ident
            if h.last_list_ok is not None
        ],
    )
    family(
        "watchd_synthesized_transitions_total",
        "counter",
        "Transitions found by a listing that the stream never delivered.",
        [({}, d.store.synthesized)],
    )
    family(
        "watchd_detector_events_total",
        "counter",
        "Detector activity by kind.",
        [({"kind": k}, v) for k, v in sorted(d.detector.counters.items())],
    )
    family("watchd_timers", "gauge", "Armed chat clocks.", [({}, len(d.detector.timers))])
    family(
        "watchd_store_overflow_total",
        "counter",
        "Chats not stored: store at capacity.",
        [({}, d.store.overflow)],
    )
    family(
        "watchd_config_reloads_total",
        "counter",
        "SIGHUP reloads by outcome.",
        [({"outcome": k}, v) for k, v in sorted(d.reloads.items())],
    )
    family(
        "watchd_state_pending_writes",
        "gauge",
        "Chat records not yet flushed to disk.",
        [({}, d.db.pending if d.db else 0)],
    )
    quota = [(n, h.quota) for n, h in ident if h.quota is not None and not h.quota.unlimited]
    family(
        "watchd_quota_headroom_credits",
        "gauge",
        "Workspace quota budget minus consumed.",
        [({"identity": n}, float(q.headroom or 0)) for n, q in quota],
    )
    family(
        "watchd_quota_budget_credits",
        "gauge",
        "Workspace quota budget.",
        [({"identity": n}, float(q.budget)) for n, q in quota],
    )
    if d.sweeper is not None:
        family(
            "watchd_sweep_total",
            "counter",
            "Sweep decisions and actions by outcome.",
            [
                ({"outcome": k, "dry_run": str(d.config.sweep.dry_run).lower()}, v)
                for k, v in sorted(d.sweeper.counts.items())
            ],
        )
    t = telemetry_summary(d)
    family(
        "watchd_transport_events_total",
        "counter",
        "Transport events into the span pipeline, accepted or dropped (queue full).",
        [
            ({"outcome": "accepted"}, t["events_accepted"]),
            ({"outcome": "dropped"}, t["events_dropped"]),
        ],
    )
    family(
        "watchd_ingest_requests_total",
        "counter",
        "Ingest requests by outcome.",
        [({"outcome": k}, v) for k, v in sorted(t["ingest"].items())],
    )
    family(
        "watchd_event_queue_depth",
        "gauge",
        "Transport events waiting for conversion.",
        [({}, t["event_queue_depth"])],
    )
    family(
        "watchd_span_open_pairs",
        "gauge",
        "Requests, connections and segments awaiting their end event.",
        [({}, t["open_pairs"])],
    )
    family(
        "watchd_span_converter_total",
        "counter",
        "Converter activity by kind.",
        [({"kind": k}, v) for k, v in sorted(t["converter"].items())],
    )
    if t["export"] is not None:
        family(
            "watchd_spans_total",
            "counter",
            "Spans by export outcome.",
            [({"outcome": k}, t["export"][k]) for k in ("exported", "failed", "dropped")],
        )
        family(
            "watchd_span_export_in_flight",
            "gauge",
            "Spans queued for the exporter.",
            [({}, t["export"]["in_flight"])],
        )
    if d.dispatcher is not None:
        stats = sorted(d.dispatcher.stats.items())
        family(
            "watchd_notifications_total",
            "counter",
            "Notifications by receiver and outcome (sent, failed, retried, dropped).",
            [
                ({"receiver": n, "outcome": o}, getattr(st, o))
                for n, st in stats
                for o in ("sent", "failed", "retried", "dropped")
            ],
        )
        family(
            "watchd_receiver_last_success_timestamp_seconds",
            "gauge",
            "When the receiver last accepted a notification.",
            [({"receiver": n}, st.last_success) for n, st in stats if st.last_success is not None],
        )
        family(
            "watchd_alerts_muted_total",
            "counter",
            "Alerts held back by silences or inhibition at flush time.",
            [({"reason": k}, v) for k, v in sorted(d.dispatcher.muted.items())],
        )
        family(
            "watchd_alert_groups",
            "gauge",
            "Aggregation groups alive.",
            [({}, len(d.dispatcher.groups))],
        )
    return "\n".join(out) + "\n"
