"""The ``/status`` page for on-call: the status document rendered as one HTML page.

Plain HTML and inline CSS, no script: it renders the same document ``/status``
serves as JSON (``daemon.status``), one page of alert rows at a time, with an
SVG chart of chats by status over the last hour. Every value is escaped.
"""

from __future__ import annotations

import html
import time
from typing import Any
from urllib.parse import urlencode

from watchd.config.fields import format_duration
from watchd.daemon.page_parts import incident_block, readiness, timeline_link
from watchd.daemon.status import RESOLVED_SHOWN, iso


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
details.incident { border: 1px solid #f0b429; background: #fffbeb; padding: 4px 8px;
  margin-bottom: .6em; } details.incident p.fix { margin: .3em 0; }
td.sev { font-weight: bold; } tr.sev-critical td.sev { color: #b91c1c; }
tr.sev-warning td.sev { color: #b45309; } tr.sev-info td.sev { color: #1d4ed8; }
.notready { color: #b91c1c; }
.scroll { overflow-x: auto; }
/* A phone (412 px): alert, chat, time in status and hint; the rest is in the JSON. */
@media (max-width: 700px) {
  body { margin: .5em; font-size: 13px; }
  #alerts .ident, #alerts .status, #alerts .budget, #alerts .since,
  #muted-alerts .ident, #muted-alerts .status, #muted-alerts .budget,
  #muted-alerts .since { display: none; }
  table { width: 100%; }
  #alerts, #muted-alerts { table-layout: fixed; }
  #alerts td, #muted-alerts td { overflow-wrap: anywhere; }
  #alerts .sev, #muted-alerts .sev { width: 5.6em; } #alerts .name { width: 6.5em; }
  #alerts .chat { width: 6.5em; } #alerts .age { width: 3.8em; }
  #identities, #receivers, #resolved, #silences { display: block; overflow-x: auto; }
}
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
    severity = lab.get("severity", "")
    badge = f" <span class='badge {state}'>{state}</span>" if state != "active" else ""
    return (
        f"<tr class='alert sev-{e(severity)} {'muted' if state != 'active' else ''}' "
        f"data-state='{state}' data-identity='{e(lab.get('identity', ''))}' "
        f"data-alertname='{e(lab.get('alertname', ''))}' data-severity='{e(severity)}'>"
        f"<td class='sev'>{e(severity)}</td>"
        f"<td class='name'>{e(lab.get('alertname', ''))}{badge}</td>"
        f"<td class='ident'>{e(lab.get('identity', ''))}</td>"
        f"<td class='status'>{e(lab.get('status', ''))}</td><td class='chat'>{chat}</td>"
        f"<td class='age'>{e(ann.get('time_in_status', ''))}</td>"
        f"<td class='budget'>{e(ann.get('budget', ''))}</td>"
        f"<td class='since'><time datetime='{a['firing_since']}'>{a['firing_since']}</time> "
        f"({e(a['firing_for'])} ago)</td>"
        f"<td class='hint'>{e(ann.get('hint', ''))}</td></tr>"
    )


_ALERT_HEAD = (
    "<tr><th class='sev'>severity</th><th class='name'>alert</th><th class='ident'>identity"
    "</th><th class='status'>status</th><th class='chat'>chat</th><th class='age'>time in "
    "status</th><th class='budget'>budget</th><th class='since'>firing since</th>"
    "<th class='hint'>hint</th></tr>"
)


def status_html(doc: dict[str, Any]) -> str:
    e = html.escape
    now = float(doc["generated_at"])
    al = doc["alerts"]
    rows = _identity_rows(doc, now)
    active = [a for a in al["firing"] if a["state"] == "active"]
    muted = [a for a in al["firing"] if a["state"] != "active"]
    counts = al["counts"]["by_state"]
    filters, nav = _filters(doc), _nav(al)
    no_alerts = "<tr><td colspan=9>No alerts firing.</td></tr>"
    muted_block = (
        f"<details id='muted'><summary>Silenced or inhibited ({counts['silenced']} silenced, "
        f"{counts['inhibited']} inhibited)</summary>"
        f"<table id='muted-alerts'>{_ALERT_HEAD}"
        f"{''.join(_alert_row(a) for a in muted) or no_alerts}</table></details>"
    )
    receivers = _receiver_rows(doc, now)
    resolved = _resolved_rows(al)
    silences = _silence_rows(doc)
    reload_note = _reload_note(doc)
    fleet = doc.get("incidents") or []
    incidents = (
        f"<h2>Fleet incidents ({len(fleet)})</h2><div id='incidents'>"
        + "".join(incident_block(i) for i in fleet)
        + "</div>\n"
        if fleet
        else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>watchd status</title>
<meta http-equiv="refresh" content="30">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{_CSS}</style></head><body>
<h1>watchd <small>v{e(doc["version"])} · up {e(format_duration(doc["uptime_seconds"]))}
 · {readiness(doc)} · as of {iso(now)}</small></h1>
{_shard_note(doc["sharding"])}{reload_note}
{incidents}<h2>Firing alerts ({counts["active"]} active, {counts["silenced"]} silenced,
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
<th>chats</th><th>by status</th><th>last hour</th><th>quota and forecast</th><th>admission</th>
<th>last error</th></tr>{"".join(rows)}</table>
<h2>Recently resolved (last {RESOLVED_SHOWN})</h2>
<table id="resolved"><tr><th>alert</th><th>identity</th><th>chat</th><th>lasted</th>
<th>why it ended</th><th>resolved at</th></tr>{resolved}</table>
<h2>Silences</h2>
<table id="silences"><tr><th>id</th><th>state</th><th>matchers</th><th>ends</th><th>by</th>
<th>comment</th></tr>{silences}</table>
</body></html>"""


def _identity_rows(doc: dict[str, Any], now: float) -> list[str]:
    e = html.escape
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
            f"<td class='quota'>{_quota_cell(i['quota'])}</td>"
            f"<td class='admission'>{_admission_cell(i.get('admission'))}</td>"
            f"<td>{e(i['last_error'] or '')}</td></tr>"
        )
    return rows


def _options(values: list[str], chosen: str) -> str:
    e = html.escape
    out = ["<option value=''>all</option>"]
    for v in values:
        sel = " selected" if v == chosen else ""
        out.append(f"<option value='{e(v)}'{sel}>{e(v)}</option>")
    return "".join(out)


def _filters(doc: dict[str, Any]) -> str:
    """The identity and alert name pickers."""
    al = doc["alerts"]
    f = al["filters"]
    idents = sorted({i["name"] for i in doc["identities"]} | set(al["counts"]["by_identity"]))
    names = sorted(al["counts"]["by_alertname"])
    return (
        "<form class='filters' method='get' action='status'>"
        "<input type='hidden' name='format' value='html'>"
        f"<label>identity <select name='identity'>{_options(idents, f['identity'])}"
        "</select></label> "
        f"<label>alert <select name='alertname'>{_options(names, f['alertname'])}"
        "</select></label> "
        "<button type='submit'>filter</button></form>"
    )


def _nav(al: dict[str, Any]) -> str:
    """Which page of alert rows this is, with links to its neighbours."""
    e = html.escape
    f = al["filters"]
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
    return (
        f"<nav class='pages'>page {page_no} of {last_page} ({al['matching']} matching, "
        f"{al['firing_total']} firing) {''.join(pages)}</nav>"
    )


def _failing(r: dict[str, Any]) -> bool:
    return bool(r["retries_pending"]) or (r["last_failure"] or 0) > (r["last_success"] or 0)


def _receiver_rows(doc: dict[str, Any], now: float) -> str:
    e = html.escape
    return (
        "".join(
            f"<tr class='receiver {'bad' if _failing(r) else 'ok'}'"
            f" data-receiver='{e(name)}'><td>{e(name)}</td><td>{e(r['kind'])}</td>"
            f"<td>{e(_ago(r['last_success'], now))}</td>"
            f"<td>{e(_ago(r['last_failure'], now))}</td><td>{e(r['last_error'] or '')}</td>"
            f"<td>{r['retries_pending']}</td><td>{r['sent']}</td><td>{r['failed']}</td></tr>"
            for name, r in doc["receivers"].items()
        )
        or "<tr><td colspan=8>No receivers.</td></tr>"
    )


def _resolved_rows(al: dict[str, Any]) -> str:
    e = html.escape
    return (
        "".join(
            f"<tr class='resolved'><td>{e(a['labels'].get('alertname', ''))}</td>"
            f"<td>{e(a['labels'].get('identity', ''))}</td>"
            f"<td>{_chat_cell(a)}</td><td>{e(a['annotations'].get('lasted', ''))}</td>"
            f"<td>{e(a['annotations'].get('resolved_reason', ''))}</td>"
            f"<td>{e(iso(a['ends_at']))}</td></tr>"
            for a in al["resolved"]
        )
        or "<tr><td colspan=6>Nothing resolved yet.</td></tr>"
    )


def _silence_rows(doc: dict[str, Any]) -> str:
    e = html.escape
    return (
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


def _reload_note(doc: dict[str, Any]) -> str:
    last = doc["reload"]["last"]
    if not (last and last["needs_restart"]):
        return ""
    return (
        "<p class='bad' id='restart-needed'>Changed in the config but needing a restart: "
        f"{html.escape(', '.join(last['needs_restart']))}</p>"
    )


def _quota_cell(q: dict[str, Any]) -> str:
    """Headroom, the fitted rate and the eta (or why there is none yet)."""
    e = html.escape
    if q["headroom"] is None:
        return e(q["state"])
    text = f"{q['headroom']} of {q['budget']} left"
    fc = q.get("forecast")
    if fc is None:
        return e(text)
    if fc["rate_per_hour"] is not None:
        text += f"; {fc['rate_per_hour']:+.1f}/h"
    if fc["eta"]:
        text += f"; runs out in {format_duration(fc['eta_seconds'])} ({fc['eta']})"
    else:
        text += f"; {fc['note']}"
    return ("<b>FORECAST</b> " if fc["firing"] else "") + e(text)


def _admission_cell(a: dict[str, Any] | None) -> str:
    e = html.escape
    if a is None:
        return "—"
    if a["admit"]:
        return "admit"
    return "<b>hold</b>: " + e("; ".join(a["reasons"]))


def _chat_cell(a: dict[str, Any]) -> str:
    e = html.escape
    ann, lab = a["annotations"], a["labels"]
    text = e(ann.get("title", "") or lab.get("chat_id", ""))
    link = ann.get("link", "")
    cell = (
        f"<a class='chat' href='{e(link)}'>{text or e(link)}</a>"
        if link.startswith(("http://", "https://"))
        else text
    )
    return cell + timeline_link(lab.get("chat_id", ""))


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
