"""The daemon's state as data: the ``/status`` document and its HTML view for on-call.

Computed at request time from the live objects (store, health, detector,
dispatcher), so there is no second copy of any number to drift; time in status
is as of the request. Alerts are classified (active, silenced, inhibited) in
bounded chunks that yield to the event loop, and only one page of them is
rendered, so 20 000 firing alerts make neither a huge response nor a late
``/healthz``. Nothing here reads a secret: identities are shown by name and URL.
"""

from __future__ import annotations

import asyncio
import html
import operator
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from watchd.alerting.model import Alert, live
from watchd.alerting.receivers.base import READ_CAPS
from watchd.config.fields import format_duration

if TYPE_CHECKING:
    from watchd.daemon.app import Daemon

JSON_LIMIT = 500  # alerts per /status JSON page by default (counts always cover all)
JSON_MAX_LIMIT = 2000
HTML_PAGE = 200  # alert rows per HTML page: ~150 KB at most
CHUNK = 1000  # alerts classified between yields to the event loop
RESOLVED_SHOWN = 50
_STARTS = operator.attrgetter("starts_at")
HISTORY_WINDOW = 3600.0  # the chart's span: the last hour
HISTORY_EVERY = 30.0  # one sample of chats-by-status per identity this often


@dataclass
class StatusQuery:
    """Filters and the page of alerts asked for (``?identity=&alertname=&state=&page=``)."""

    identity: str = ""
    alertname: str = ""
    state: str = ""  # active | silenced | inhibited | "" (all)
    offset: int = 0
    limit: int = JSON_LIMIT

    @classmethod
    def from_query(cls, q: Mapping[str, str], *, html_page: bool) -> StatusQuery:
        def number(key: str, default: int) -> int:
            try:
                return max(0, int(q.get(key, default)))
            except ValueError:
                return default

        limit = HTML_PAGE if html_page else min(number("limit", JSON_LIMIT), JSON_MAX_LIMIT)
        offset = number("offset", 0)
        if "page" in q:
            offset = max(0, number("page", 1) - 1) * limit
        state = q.get("state", "")
        return cls(
            identity=q.get("identity", ""),
            alertname=q.get("alertname", ""),
            state=state if state in ("active", "silenced", "inhibited") else "",
            offset=offset,
            limit=max(1, limit),
        )


@dataclass
class ChatHistory:
    """Chats by status per identity, sampled every ``HISTORY_EVERY`` over the last hour."""

    samples: deque[tuple[float, dict[str, dict[str, int]]]] = field(
        default_factory=lambda: deque(maxlen=int(HISTORY_WINDOW / HISTORY_EVERY) + 1)
    )

    def sample(self, d: Daemon, now: float) -> None:
        self.samples.append(
            (now, {n: dict(Counter(r.status for r in d.store.records(n))) for n in d.health})
        )

    def series(self, identity: str, now: float) -> list[tuple[float, dict[str, int]]]:
        return [(t, s.get(identity, {})) for t, s in self.samples if now - t <= HISTORY_WINDOW]


def _identity(d: Daemon, name: str) -> dict[str, Any]:
    h = d.health[name]
    by_status = Counter(r.status for r in d.store.records(name))
    return {
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
        "last_list_pages": h.last_list_pages,
        "incomplete_listings": h.incomplete_listings,
        "absent": h.absent,
        "absent_confirms": h.absent_confirms,
        "refused": h.refused,
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


def _alert_json(a: Alert, state: str, now: float) -> dict[str, Any]:
    doc = live(a, now).to_json()
    doc["state"] = state
    doc["firing_since"] = _iso(a.starts_at)
    doc["firing_for"] = format_duration(max(0.0, now - a.starts_at))
    return doc


@dataclass
class Classified:
    """Firing alerts as the status page needs them: counts over all, the filtered list."""

    total: int = 0
    by_state: Counter[str] = field(default_factory=Counter)
    by_name: Counter[str] = field(default_factory=Counter)
    by_identity: Counter[str] = field(default_factory=Counter)
    selected: list[tuple[Alert, str]] = field(default_factory=list)


async def classify(d: Daemon, now: float, q: StatusQuery | None = None) -> Classified:
    """Every firing alert's state (active, silenced, inhibited), counted, and those the
    query selects, oldest first per identity. ``CHUNK`` alerts at a time with a yield in
    between, so a big request never holds up the loop (and /healthz) for long."""
    q = q or StatusQuery()
    # Bucketed by identity in chunks, then each bucket ordered by a C-level key: one big
    # sort with a Python key function would hold the loop for tens of milliseconds.
    everything = list(d.detector.firing.values())
    buckets: dict[str, list[Alert]] = {}
    for start in range(0, len(everything), CHUNK):
        await asyncio.sleep(0)
        for a in everything[start : start + CHUNK]:
            buckets.setdefault(a.labels.get("identity", ""), []).append(a)
    alerts: list[Alert] = []
    for ident in sorted(buckets):
        await asyncio.sleep(0)
        alerts.extend(sorted(buckets[ident], key=_STARTS))
    inhibited = d.inhibitor.index()
    for start in range(0, len(alerts), CHUNK):
        await asyncio.sleep(0)
        for a in alerts[start : start + CHUNK]:
            inhibited.add(a)
    out = Classified(total=len(alerts))
    muted_by = d.silencer.muted_by
    for start in range(0, len(alerts), CHUNK):
        await asyncio.sleep(0)
        for a in alerts[start : start + CHUNK]:
            labels = a.labels
            if muted_by(labels, now):
                state = "silenced"
            elif inhibited(a):
                state = "inhibited"
            else:
                state = "active"
            ident = labels.get("identity", "")
            name = labels.get("alertname", "")
            out.by_state[state] += 1
            out.by_name[name] += 1
            out.by_identity[ident] += 1
            if (
                (not q.identity or ident == q.identity)
                and (not q.alertname or name == q.alertname)
                and (not q.state or state == q.state)
            ):
                out.selected.append((a, state))
    return out


def read_caps(d: Daemon) -> dict[str, int]:
    """Every bounded read that hit its bound, summed over identities."""
    transports = [w.client.transport for w in d.watchers.values()]
    return {
        "coder_bodies_cut": sum(t.oversize for t in transports),
        "watch_handshake_timeouts": sum(t.handshake_timeouts for t in transports),
        "incomplete_listings": sum(h.incomplete_listings for h in d.health.values()),
        "event_buffer_overflows": sum(h.overflow for h in d.health.values()),
        "receiver_answers_cut": READ_CAPS["receiver_answers"],
    }


async def status_document(d: Daemon, query: StatusQuery | None = None) -> dict[str, Any]:
    q = query or StatusQuery()
    now = time.time()
    c = await classify(d, now, q)
    by_state, by_name, by_identity, selected = c.by_state, c.by_name, c.by_identity, c.selected
    page = selected[q.offset : q.offset + q.limit]
    resolved = [a for a in reversed(d.detector.history) if not a.firing][:RESOLVED_SHOWN]
    det = d.detector
    identities = [_identity(d, name) for name in d.health]
    kinds = {n: x.kind for n, x in d.dispatcher.notifiers.items()} if d.dispatcher else {}
    return {
        "version": d.version,
        "uptime_seconds": round(time.monotonic() - d.started, 1),
        "ready": d.ready(),
        "identities": identities,
        "sharding": sharding_summary(d),
        "alerts": {
            "firing": [_alert_json(a, s, now) for a, s in page],
            "firing_total": c.total,
            "matching": len(selected),
            "offset": q.offset,
            "limit": q.limit,
            "next_offset": q.offset + q.limit if q.offset + q.limit < len(selected) else None,
            "filters": {"identity": q.identity, "alertname": q.alertname, "state": q.state},
            "counts": {
                "by_state": {k: by_state.get(k, 0) for k in ("active", "silenced", "inhibited")},
                "by_alertname": dict(sorted(by_name.items())),
                "by_identity": dict(sorted(by_identity.items())),
            },
            "resolved": [a.to_json() for a in resolved],
            # Kept for scripts written against 0.1: the last 50 state changes.
            "recent": [a.to_json() for a in list(det.history)[-RESOLVED_SHOWN:]],
        },
        "silences": [s.to_json(now) for s in d.silencer.silences.values()],
        "receivers": {
            name: {
                "kind": kinds.get(name, ""),
                "sent": st.sent,
                "failed": st.failed,
                "retried": st.retried,
                "dropped": st.dropped,
                "last_error": st.last_error,
                "last_success": st.last_success,
                "last_failure": st.last_failure,
                "retries_pending": len(st.retrying),
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
            "future_clamped": sum(d.store.future_clamped.values()),
            "before_created": sum(d.store.before_created.values()),
        },
        "state": {
            "persisting": d.db.persisting,
            "failing_since": d.db.failing_since,
            "write_failures": d.db.write_failures,
            "last_write_error": d.db.last_write_error,
            "pending": d.db.pending,
            "reset_from": str(d.db.reset_from[0]) if d.db.reset_from else None,
        },
        "limits": read_caps(d),
        "heartbeat": None
        if d.deadman is None
        else {
            "interval_seconds": d.deadman.config.interval,
            "sent": d.deadman.sent,
            "failed": d.deadman.failed,
            "withheld": d.deadman.withheld,
            "withheld_because": d.deadman.withheld_because,
            "last_sent": d.deadman.last_sent,
        },
        # Sampled every HISTORY_EVERY, plus this moment: the chart always ends at "now".
        "history": {
            i["name"]: [
                *({"t": t, "chats": c} for t, c in d.history.series(i["name"], now)),
                {"t": now, "chats": i["chats_by_status"]},
            ]
            for i in identities
        },
        "chart_window_seconds": HISTORY_WINDOW,
        "generated_at": now,
    }


def _iso(t: float | None) -> str:
    if t is None:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "never"
    return f"{format_duration(max(0.0, now - t))} ago"


_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
tr.bad td { background: #fde8e8; }
#identities tr.ok td:nth-child(3) { color: #080; }
tr.muted td { color: #777; background: #f7f7f7; }
.badge { font-size: 80%; padding: 0 4px; border-radius: 3px; background: #ddd; }
.badge.silenced { background: #e0e7ff; } .badge.inhibited { background: #fef3c7; }
h1 small { font-weight: normal; color: #777; font-size: 60%; }
form.filters { margin: .5em 0 1em; } nav.pages a { margin-right: 1em; }
svg.chart { background: #fafafa; border: 1px solid #ddd; }
.legend span { margin-right: .6em; font-size: 85%; }
"""

# Status colours for the chart (unknown statuses grey).
_COLOURS = {
    "running": "#2563eb",
    "pending": "#7c3aed",
    "interrupting": "#db2777",
    "requires_action": "#dc2626",
    "waiting": "#16a34a",
    "completed": "#65a30d",
    "paused": "#ca8a04",
    "error": "#ea580c",
}


def chart_svg(name: str, series: list[dict[str, Any]], now: float, window: float) -> str:
    """A small line chart of chats by status over the last hour, as inline SVG."""
    e = html.escape
    w, h, pad = 240, 56, 2
    statuses = sorted({s for point in series for s in point["chats"]})
    peak = max((n for point in series for n in point["chats"].values()), default=0) or 1
    lines = []
    for status in statuses:
        pts = []
        for point in series:
            x = pad + (w - 2 * pad) * (1 - min(window, max(0.0, now - point["t"])) / window)
            y = h - pad - (h - 2 * pad) * point["chats"].get(status, 0) / peak
            pts.append(f"{x:.1f},{y:.1f}")
        colour = _COLOURS.get(status, "#888")
        lines.append(
            f"<polyline data-status='{e(status)}' fill='none' stroke='{colour}' "
            f"stroke-width='1.5' points='{' '.join(pts)}'/>"
        )
    latest = series[-1]["chats"] if series else {}
    legend = "".join(
        f"<span style='color:{_COLOURS.get(s, '#888')}'>{e(s)} {latest.get(s, 0)}</span>"
        for s in statuses
    )
    return (
        f"<svg class='chart' data-identity='{e(name)}' width='{w}' height='{h}' "
        f"viewBox='0 0 {w} {h}' role='img' aria-label='chats by status, last hour'>"
        f"<title>{e(name)}: chats by status over the last hour (peak {peak})</title>"
        f"{''.join(lines)}</svg><div class='legend'>{legend}</div>"
    )


def _alert_row(a: dict[str, Any]) -> str:
    e = html.escape
    lab, ann = a["labels"], a["annotations"]
    chat = _chat_cell(a)
    state = a["state"]
    badge = f" <span class='badge {state}'>{state}</span>" if state != "active" else ""
    return (
        f"<tr class='alert {'muted' if state != 'active' else ''}' data-state='{state}' "
        f"data-identity='{e(lab.get('identity', ''))}' "
        f"data-alertname='{e(lab.get('alertname', ''))}'>"
        f"<td>{e(lab.get('alertname', ''))}{badge}</td><td>{e(lab.get('identity', ''))}</td>"
        f"<td>{e(lab.get('status', ''))}</td><td>{chat}</td>"
        f"<td>{e(ann.get('time_in_status', ''))}</td><td>{e(ann.get('budget', ''))}</td>"
        f"<td><time datetime='{a['firing_since']}'>{a['firing_since']}</time> "
        f"({e(a['firing_for'])} ago)</td>"
        f"<td>{e(ann.get('hint', ''))}</td></tr>"
    )


_ALERT_HEAD = (
    "<tr><th>alert</th><th>identity</th><th>status</th><th>chat</th><th>time in status</th>"
    "<th>budget</th><th>firing since</th><th>hint</th></tr>"
)


def status_html(doc: dict[str, Any]) -> str:
    e = html.escape
    now = float(doc["generated_at"])
    al = doc["alerts"]
    rows = []
    for i in doc["identities"]:
        statuses = ", ".join(f"{e(k)}: {v}" for k, v in i["chats_by_status"].items()) or "—"
        age = i["last_list_age_seconds"]
        chart = chart_svg(
            i["name"], doc["history"].get(i["name"], []), now, doc["chart_window_seconds"]
        )
        rows.append(
            f"<tr class='{'ok' if i['ready'] else 'bad'}'><td>{e(i['name'])}</td>"
            f"<td>{e(i['deployment'])}</td><td>{e(i['state'])}</td>"
            f"<td>{'—' if age is None else e(format_duration(age)) + ' ago'}</td>"
            f"<td>{i['chats']}</td><td>{statuses}</td><td>{chart}</td>"
            f"<td>{e(i['last_error'] or '')}</td></tr>"
        )
    active = [a for a in al["firing"] if a["state"] == "active"]
    muted = [a for a in al["firing"] if a["state"] != "active"]
    counts = al["counts"]["by_state"]
    f = al["filters"]

    def options(values: list[str], chosen: str) -> str:
        out = ["<option value=''>all</option>"]
        for v in values:
            sel = " selected" if v == chosen else ""
            out.append(f"<option value='{e(v)}'{sel}>{e(v)}</option>")
        return "".join(out)

    idents = sorted({i["name"] for i in doc["identities"]} | set(al["counts"]["by_identity"]))
    names = sorted(al["counts"]["by_alertname"])
    filters = (
        "<form class='filters' method='get' action='status'>"
        "<input type='hidden' name='format' value='html'>"
        f"<label>identity <select name='identity'>{options(idents, f['identity'])}"
        "</select></label> "
        f"<label>alert <select name='alertname'>{options(names, f['alertname'])}"
        "</select></label> "
        "<button type='submit'>filter</button></form>"
    )
    pages = []
    base = {k: v for k, v in (("identity", f["identity"]), ("alertname", f["alertname"])) if v}
    page_no = al["offset"] // al["limit"] + 1
    last_page = max(1, -(-al["matching"] // al["limit"]))
    if page_no > 1:
        query = urlencode({**base, "format": "html", "page": page_no - 1})
        pages.append(f"<a rel='prev' href='status?{e(query)}'>← newer page</a>")
    if al["next_offset"] is not None:
        query = urlencode({**base, "format": "html", "page": page_no + 1})
        pages.append(f"<a rel='next' href='status?{e(query)}'>next page →</a>")
    nav = (
        f"<nav class='pages'>page {page_no} of {last_page} ({al['matching']} matching, "
        f"{al['firing_total']} firing) {''.join(pages)}</nav>"
    )
    no_alerts = "<tr><td colspan=8>No alerts firing.</td></tr>"
    muted_block = (
        f"<details id='muted'><summary>Silenced or inhibited ({counts['silenced']} silenced, "
        f"{counts['inhibited']} inhibited)</summary>"
        f"<table id='muted-alerts'>{_ALERT_HEAD}"
        f"{''.join(_alert_row(a) for a in muted) or no_alerts}</table></details>"
    )

    def failing(r: dict[str, Any]) -> bool:
        return bool(r["retries_pending"]) or (r["last_failure"] or 0) > (r["last_success"] or 0)

    receivers = (
        "".join(
            f"<tr class='receiver {'bad' if failing(r) else 'ok'}'"
            f" data-receiver='{e(name)}'><td>{e(name)}</td><td>{e(r['kind'])}</td>"
            f"<td>{e(_ago(r['last_success'], now))}</td>"
            f"<td>{e(_ago(r['last_failure'], now))}</td><td>{e(r['last_error'] or '')}</td>"
            f"<td>{r['retries_pending']}</td><td>{r['sent']}</td><td>{r['failed']}</td></tr>"
            for name, r in doc["receivers"].items()
        )
        or "<tr><td colspan=8>No receivers.</td></tr>"
    )
    resolved = (
        "".join(
            f"<tr class='resolved'><td>{e(a['labels'].get('alertname', ''))}</td>"
            f"<td>{e(a['labels'].get('identity', ''))}</td>"
            f"<td>{_chat_cell(a)}</td><td>{e(a['annotations'].get('lasted', ''))}</td>"
            f"<td>{e(a['annotations'].get('resolved_reason', ''))}</td>"
            f"<td>{e(_iso(a['ends_at']))}</td></tr>"
            for a in al["resolved"]
        )
        or "<tr><td colspan=6>Nothing resolved yet.</td></tr>"
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
    reload_note = ""
    last = doc["reload"]["last"]
    if last and last["needs_restart"]:
        reload_note = (
            "<p class='bad' id='restart-needed'>Changed in the config but needing a restart: "
            f"{e(', '.join(last['needs_restart']))}</p>"
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>watchd status</title>
<meta http-equiv="refresh" content="30">
<style>{_CSS}</style></head><body>
<h1>watchd <small>v{e(doc["version"])} · up {e(format_duration(doc["uptime_seconds"]))}
 · {"ready" if doc["ready"] else "not ready"} · as of {_iso(now)}</small></h1>
{_shard_note(doc["sharding"])}{reload_note}
<h2>Firing alerts ({counts["active"]} active, {counts["silenced"]} silenced,
 {counts["inhibited"]} inhibited)</h2>
{filters}{nav}
<table id="alerts">{_ALERT_HEAD}{"".join(_alert_row(a) for a in active) or no_alerts}</table>
{muted_block}
<h2>Receivers</h2>
<table id="receivers"><tr><th>receiver</th><th>kind</th><th>last success</th>
<th>last failure</th><th>last error</th><th>retries pending</th><th>sent</th><th>failed</th></tr>
{receivers}</table>
<h2>Identities</h2>
<table id="identities"><tr><th>identity</th><th>deployment</th><th>watch</th><th>last list</th>
<th>chats</th><th>by status</th><th>last hour</th><th>last error</th></tr>{"".join(rows)}</table>
<h2>Recently resolved (last {RESOLVED_SHOWN})</h2>
<table id="resolved"><tr><th>alert</th><th>identity</th><th>chat</th><th>lasted</th>
<th>why it ended</th><th>resolved at</th></tr>{resolved}</table>
<h2>Silences</h2>
<table id="silences"><tr><th>id</th><th>state</th><th>matchers</th><th>ends</th><th>by</th>
<th>comment</th></tr>{silences}</table>
</body></html>"""


def _chat_cell(a: dict[str, Any]) -> str:
    e = html.escape
    ann, lab = a["annotations"], a["labels"]
    text = e(ann.get("title", "") or lab.get("chat_id", ""))
    link = ann.get("link", "")
    if link.startswith(("http://", "https://")):
        return f"<a class='chat' href='{e(link)}'>{text or e(link)}</a>"
    return text


def _shard_note(sh: dict[str, Any]) -> str:
    """One line saying which replica this is, when there are several."""
    if sh["replicas"] == 1:
        return ""
    others = len(sh["others"])
    return (
        f"<p>replica {sh['replica']} of {sh['replicas']} (each identity on "
        f"{sh['replication_factor']}): watching {len(sh['owned'])} identities; "
        f"{others} owned by other replicas (see <code>sharding</code> in the JSON)</p>\n"
    )


def sharding_summary(d: Daemon) -> dict[str, Any]:
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
