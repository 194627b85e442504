"""The daemon's state as data: the ``/status`` document and its HTML view.

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
