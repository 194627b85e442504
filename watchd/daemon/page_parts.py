"""Parts of the status page that stand alone: the readiness word in the header, a fleet
incident expandable into its members, and the link from a chat to its timeline."""

from __future__ import annotations

import html
import urllib.parse
from typing import Any


def readiness(doc: dict[str, Any]) -> str:
    """The header's word on readiness, and for "not ready" what blocks it: /readyz means
    every identity has been seeded once; each one that has not is named with its state."""
    if doc["ready"]:
        return "ready"
    waiting = [i for i in doc["identities"] if not i["seeded"]]
    names = ", ".join(
        f"{html.escape(i['name'])} ({html.escape(i['state'])}"
        + (f": {html.escape(i['last_error'][:120])}" if i["last_error"] else "")
        + ")"
        for i in waiting[:5]
    )
    more = f" and {len(waiting) - 5} more" if len(waiting) > 5 else ""
    return (
        "<span class='notready' title='/readyz answers 200 once every identity has been "
        "seeded (listed once); until then verdicts for the others still fire'>not ready: "
        f"not yet seeded {names}{more}</span>"
    )


def incident_block(inc: dict[str, Any]) -> str:
    """One FleetIncident, expandable into its members."""
    e = html.escape
    badge = " <span class='badge silenced'>silenced</span>" if inc["state"] == "silenced" else ""
    rows = "".join(
        f"<tr><td>{_member_chat(m)}</td><td>{e(m['identity'])}</td><td>{e(m['alertname'])}"
        f"</td><td>{e(m['status'])}</td><td>{e(m['time_in_status'])}</td></tr>"
        for m in inc["members"]
    )
    more = inc["count"] - inc["members_shown"]
    more_row = (
        f"<tr><td colspan=5>+{more} more (the JSON lists the first ones)</td></tr>"
        if more > 0
        else ""
    )
    return (
        f"<details class='incident' data-cause='{e(inc['cause'])}'><summary>"
        f"<b>{e(inc['summary'] or inc['cause'])}</b>{badge} · cause <code>{e(inc['cause'])}</code>"
        f" · {inc['count']} chats · {e(', '.join(inc['identities']))} · since "
        f"<time datetime='{e(inc['since'])}'>{e(inc['since'])}</time> ({e(inc['firing_for'])})"
        f"</summary><p class='fix'>Fix: {e(inc['hint'])}</p>"
        f"<table class='members'><tr><th>chat</th><th>identity</th><th>alert</th>"
        f"<th>status</th><th>time in status</th></tr>{rows}{more_row}</table></details>"
    )


def _member_chat(m: dict[str, Any]) -> str:
    e = html.escape
    text = e(m["title"] or m["chat_id"])
    if m["link"].startswith(("http://", "https://")):
        text = f"<a class='chat' href='{e(m['link'])}'>{text}</a>"
    return text + timeline_link(m["chat_id"])


def timeline_link(chat_id: str) -> str:
    """Every chat on the page links to its timeline (``/status/chats/{id}``)."""
    if not chat_id:
        return ""
    href = f"/status/chats/{urllib.parse.quote(chat_id, safe='')}?format=html"
    return f" <a class='timeline' href='{html.escape(href)}'>timeline</a>"
