"""Slack incoming webhooks: a Block Kit message per group, with a ``text`` fallback.

A FleetIncident reads as one line: its cause, how many chats, the identities, since
when, the fix, and its first ``max_chats`` members each linked to its chat.

Untrusted strings (chat titles, errors, hints) escape ``&``, ``<`` and ``>``
only — Slack's mrkdwn control characters — so ``<!channel>`` in a title can
never ping a channel. Section text is cut below Slack's 3000-character limit
and a message never exceeds 50 blocks; past ``max_chats`` the rest is a
"+N more" line. Success is a plain ``ok`` body; Slack's documented error
strings are permanent (configuration problems) except ``rollup_error``/5xx
and 429, which are retried (429 with its ``Retry-After``).

Of an error answer only Slack's documented error word is ever quoted: the rest of
the text may carry the workspace and channel ids and part of the webhook's key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from watchd.alerting.model import Alert
from watchd.alerting.receivers.base import (
    Notification,
    NotifyError,
    Rate,
    dumps,
    post,
    retry_after,
)

SECTION_LIMIT = 3000
MAX_BLOCKS = 50
TEXT_LIMIT = 3000
PERMANENT = {
    "invalid_payload",
    "no_text",
    "channel_not_found",
    "channel_is_archived",
    "action_prohibited",
    "user_not_found",
    "invalid_token",
    "no_service",
    "no_service_id",
    "no_team",
    "team_disabled",
    "posting_to_general_channel_denied",
    "too_many_attachments",
    "invalid_blocks",
    "invalid_blocks_format",
}
# Every error word an incoming webhook answers with; longest first, so a word that
# begins another (no_service, no_service_id) is matched whole.
ERROR_WORDS = sorted(
    PERMANENT | {"rollup_error", "missing_text_or_fallback_or_attachments", "rate_limited"},
    key=len,
    reverse=True,
)


def error_word(body: str) -> str:
    """Slack's error word at the start of ``body``, else "unrecognised answer": nothing
    else of the answer, which may quote the webhook URL, leaves this module."""
    return next((w for w in ERROR_WORDS if body.startswith(w)), "unrecognised answer")


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _members(ann: Mapping[str, str], *, shown: int, room: int) -> str:
    """An incident's first ``shown`` members, each linked to its chat, within ``room``
    characters, then how many more there are."""
    ids = [c for c in ann.get("chats", "").split(",") if c]
    links = ann.get("links", "").split(" ")
    total = int(ann["count"]) if ann.get("count", "").isdigit() else len(ids)
    parts: list[str] = []
    used = 0
    for i, chat in enumerate(ids[:shown]):
        link = links[i] if i < len(links) else "-"
        text = escape(cut(chat, 40))
        part = f"<{link}|{text}>" if link != "-" and _linkable(link) else text
        if used + len(part) + 2 > room - 20:
            break
        parts.append(part)
        used += len(part) + 2
    more = total - len(parts)
    return ", ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def _linkable(link: str) -> bool:
    # A link's URL must not contain '|' or '>' (it would break out of the <url|text> form).
    return not any(c in link for c in "|<> ")


def _incident(a: Alert, *, shown: int) -> str:
    """A FleetIncident: the cause, the count, the fix and the first members, linked."""
    ann, lab = a.annotations, a.labels
    title = escape(cut(ann.get("summary", "FleetIncident"), 150))
    detail = (
        f"cause `{escape(lab.get('cause', '?'))}` · {escape(ann.get('count', '?'))} chats"
        f" · identities {escape(ann.get('identities', '') or '-')}"
        f" · since {escape(ann.get('since', '?'))}"
    )
    if not a.firing:
        return f"• *{title}* — resolved · {detail}"
    head = f"• *{title}* — {detail}\n   *Fix:* _{escape(cut(ann.get('hint', ''), 600))}_"
    members = _members(ann, shown=shown, room=SECTION_LIMIT - len(head) - 20)
    return f"{head}\n   *Chats:* {members}" if members else head


def _line(a: Alert, *, shown: int = 10) -> str:
    if a.name == "FleetIncident":
        return _incident(a, shown=shown)
    ann, lab = a.annotations, a.labels
    title = escape(ann.get("title") or ann.get("summary") or lab.get("alertname", "alert"))
    link = ann.get("link", "")
    head = f"<{link}|{cut(title, 150)}>" if link and _linkable(link) else f"*{cut(title, 150)}*"
    if lab.get("chat_id"):
        detail = (
            f"{escape(lab.get('status', ''))} for {escape(ann.get('time_in_status', '?'))}"
            f" (budget {escape(ann.get('budget', '?'))}) · {escape(lab.get('owner', ''))}"
        )
    else:
        detail = escape(ann.get("summary", ""))
    if not a.firing:
        detail = "resolved · " + detail
    timeline = ann.get("timeline", "")
    if timeline and _linkable(timeline):
        detail += f" · <{timeline}|timeline>"
    line = f"• {head} — {detail}"
    if a.firing and ann.get("hint"):
        line += f"\n   _{escape(cut(ann['hint'], 300))}_"
    return line


def message(n: Notification, *, max_chats: int) -> dict[str, Any]:
    firing, resolved = n.firing, n.resolved
    gl = n.group_labels
    name = escape(gl.get("alertname", "") or n.common_labels().get("alertname", "alerts"))
    where = ", ".join(escape(f"{k}={v}") for k, v in gl.items() if k != "alertname" and v)
    head = f"[FIRING:{len(firing)}] {name}" if firing else f"[RESOLVED] {name}"
    if where:
        head += f" ({where})"
    shown = (firing + resolved)[:max_chats]
    more = len(firing) + len(resolved) - len(shown) + n.truncated
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {
                "type": "plain_text",
                "text": cut(
                    head.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"), 150
                ),
            },
        },
    ]
    for a in shown:
        if len(blocks) >= MAX_BLOCKS - 2:
            more += 1
            continue
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": cut(_line(a, shown=max_chats), SECTION_LIMIT)},
            }
        )
    if more > 0:
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"+{more} more"}]}
        )
    if n.status_url:
        blocks.append(
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": f"<{n.status_url}|watchd status>"}],
            }
        )
    shown_alerts = firing or resolved
    if shown_alerts and all(a.name == "FleetIncident" for a in shown_alerts):
        text = f"{head}: " + "; ".join(a.annotations.get("summary", "") for a in shown_alerts)
    else:
        noun = "chat" if len(shown_alerts) == 1 else "chats"
        text = f"{head}: {len(shown_alerts)} {noun}"
    return {"text": cut(text, TEXT_LIMIT), "blocks": blocks[:MAX_BLOCKS]}


class SlackNotifier:
    kind = "slack"
    send_resolved = True
    resend_every: float | None = None

    def __init__(
        self,
        name: str,
        *,
        webhook_url: str,
        session: aiohttp.ClientSession,
        timeout: float,
        max_chats: int = 10,
    ) -> None:
        self.name = name
        self._url = webhook_url
        self.session = session
        self.timeout = timeout
        self.max_chats = max_chats
        # Slack: about one message per second per incoming webhook.
        self.rate = Rate(per_second=1.0, burst=1)

    async def notify(self, n: Notification) -> None:
        who = f"slack receiver {self.name!r}"
        answer = await post(
            self.session,
            self._url,
            body=dumps(message(n, max_chats=self.max_chats)),
            headers={},
            deadline=self.timeout,
            who=who,
        )
        body = answer.text.strip()
        if answer.status == 200 and body == "ok":
            return
        if answer.status == 429:
            raise NotifyError(
                f"{who}: rate limited (429)",
                retryable=True,
                retry_after=retry_after(answer.headers),
            )
        code = error_word(body)
        if answer.status >= 500 or code == "rollup_error":
            raise NotifyError(f"{who}: {code} (HTTP {answer.status})", retryable=True)
        if code in PERMANENT or 400 <= answer.status < 500:
            raise NotifyError(
                f"{who}: {code} (HTTP {answer.status}): check the webhook and its channel",
                retryable=False,
            )
        raise NotifyError(
            f"{who}: unexpected answer: {code} (HTTP {answer.status})", retryable=True
        )
