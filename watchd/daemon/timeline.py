"""One chat's timeline as data and as a page: ``GET /status/chats/{chat_id}``.

The document (fleet.md §4) puts the chat's current state on top (status, clock start,
the alerts firing for it with their cause and hint: the verdict), then the entries
oldest first (:mod:`watchd.store.timelines`). The page is a vertical timeline readable
at 3 a.m.: server times in one format, the verdict first, each entry's source marked.
Computed per request from the store, the ledger and the timelines; no secret is in
any of them, and the server scrubs the output once more.
"""

from __future__ import annotations

import html
import time
from typing import Any

from watchd.config.fields import format_duration
from watchd.daemon.status import iso
from watchd.daemon.view import DaemonView


def iso_ms(t: float) -> str:
    """An epoch time as UTC RFC 3339 with milliseconds: a timeline's entries a few
    milliseconds apart keep their order and their spacing when read back."""
    whole = int(t)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((t - whole) * 1000):03d}Z"
    )


def timeline_document(d: DaemonView, chat_id: str) -> dict[str, Any] | None:
    """The chat's timeline, or None when watchd knows nothing of it (404)."""
    det = d.detector
    found = det.timelines.get(chat_id)
    identity = found[0] if found is not None else d.store.identity_of(chat_id)
    rec = d.store.get(identity, chat_id) if identity is not None else None
    if rec is None and found is None:
        return None
    entries, dropped = (found[1], found[2]) if found is not None else ([], 0)
    health = d.health.get(identity or "")
    server_now = health.server_clock.now() if health is not None else None
    firing = [
        det.firing[fp]
        for fp in det.ledger.by_chat.get((identity or "", chat_id), ())
        if fp in det.firing
    ]
    template = d.config.chat_link_template
    deployment = health.deployment if health is not None else ""
    return {
        "chat_id": chat_id,
        "identity": identity,
        "title": rec.title if rec is not None else "",
        "status": rec.status if rec is not None else None,
        "since": iso(rec.since) if rec is not None else None,
        "clock": rec.clock if rec is not None else None,
        "time_in_status_seconds": None
        if rec is None or server_now is None
        else round(max(0.0, server_now - rec.since)),
        "link": template.format(deployment=deployment, chat_id=chat_id) if deployment else "",
        "verdict": [
            {
                "alertname": a.name,
                "fingerprint": a.fingerprint,
                "cause": a.labels.get("cause"),
                "hint": a.annotations.get("hint", ""),
                "firing_since": iso(a.starts_at),
            }
            for a in firing
        ],
        "entries": [
            {"at": iso_ms(at), "source": source, "what": what, **({"status": st} if st else {})}
            for at, source, what, st in entries
        ],
        "dropped": dropped,
        "generated_at": iso(server_now) if server_now is not None else None,
    }


_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 1em; color: #222; max-width: 60em; }
h1 { font-size: 1.3em; margin: .2em 0; } h1 small { color: #777; font-weight: normal; }
.verdict { border: 2px solid #dc2626; background: #fef2f2; padding: .5em .8em;
  margin: .8em 0; border-radius: 4px; }
.verdict.ok { border-color: #16a34a; background: #f0fdf4; }
ol.timeline { list-style: none; padding: 0; border-left: 3px solid #ccc; margin-left: .6em; }
ol.timeline li { position: relative; padding: .3em 0 .5em 1.2em; }
ol.timeline li::before { content: ""; position: absolute; left: -.55em; top: .75em;
  width: .8em; height: .8em; border-radius: 50%; background: #999; }
ol.timeline li.alert::before { background: #dc2626; } ol.timeline li.sweep::before
  { background: #7c3aed; } ol.timeline li.transport::before { background: #2563eb; }
ol.timeline li.diagnosis::before { background: #ca8a04; }
time { font-family: ui-monospace, monospace; color: #444; }
.src { font-size: 80%; padding: 0 .4em; border-radius: 3px; background: #eee; }
@media (max-width: 600px) { body { margin: .5em; font-size: 14px; } }
"""


def timeline_html(doc: dict[str, Any]) -> str:
    e = html.escape
    title = e(doc["title"] or doc["chat_id"])
    status = e(doc["status"] or "gone")
    age = (
        format_duration(doc["time_in_status_seconds"])
        if doc["time_in_status_seconds"] is not None
        else "?"
    )
    link = doc["link"]
    coder = f" · <a href='{e(link)}'>open in Coder</a>" if link.startswith("http") else ""
    if doc["verdict"]:
        verdict = "".join(
            f"<div class='verdict'><b>{e(v['alertname'])}</b> firing since "
            f"<time>{e(v['firing_since'])}</time> · cause <code>{e(v['cause'] or '-')}</code>"
            f"<br>{e(v['hint'])}<br><small>fingerprint {e(v['fingerprint'])}</small></div>"
            for v in doc["verdict"]
        )
    else:
        verdict = "<div class='verdict ok'>No alert is firing for this chat.</div>"
    items = (
        "".join(
            f"<li class='{e(x['source'])}'><time datetime='{e(x['at'])}'>{e(x['at'])}</time> "
            f"<span class='src'>{e(x['source'])}</span> {e(x['what'])}</li>"
            for x in doc["entries"]
        )
        or "<li>No events recorded for this chat yet (it has not moved since watchd saw it).</li>"
    )
    dropped = (
        f"<p><small>{doc['dropped']} older entries were dropped (at most 200 are kept).</small></p>"
        if doc["dropped"]
        else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}: timeline</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{_CSS}</style></head><body>
<p><a href="/status?format=html">← status</a></p>
<h1>{title} <small>{e(doc["chat_id"])} · {e(doc["identity"] or "")}{coder}</small></h1>
<p>Now <b>{status}</b> for {e(age)} (since <time>{e(doc["since"] or "?")}</time>, clock
{e(doc["clock"] or "?")}) · times are the server's, UTC</p>
{verdict}
<h2>Timeline (oldest first)</h2>
{dropped}<ol class="timeline" id="timeline">{items}</ol>
</body></html>"""
