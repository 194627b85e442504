"""What the ledger tells a chat's timeline (fleet.md §4): a verdict fired, with its
fingerprint and the diagnosis behind it; a cause that moved; a verdict resolved and why;
a sweep's action (its ChatSwept). Alert entries are at the alert's own times (when the
chat went past its budget, when it resolved)."""

from __future__ import annotations

from watchd.alerting.model import Alert
from watchd.store.records import ChatRecord
from watchd.store.timelines import Timelines


def fired(timelines: Timelines, alert: Alert, identity: str, chat_id: str) -> None:
    ann, lab = alert.annotations, alert.labels
    at = alert.starts_at
    if alert.name == "ChatSwept":
        timelines.add(chat_id, identity, at, "sweep", ann.get("summary", "swept"))
        return
    timelines.add(
        chat_id,
        identity,
        at,
        "alert",
        f"{alert.name} fired (fingerprint {alert.fingerprint}): {ann.get('summary', '')}",
        status=lab.get("status"),
    )
    if lab.get("cause"):
        pending = " (pending its capacity read)" if "cause_pending" in ann else ""
        what = f"cause {lab['cause']}{pending}: {ann.get('hint', '')}"
        timelines.add(chat_id, identity, at, "diagnosis", what)


def recaused(timelines: Timelines, was: Alert, now: Alert, rec: ChatRecord, *, at: float) -> None:
    what = (
        f"queued_for_capacity read: {bool(rec.queued_for_capacity)}; cause "
        f"{was.labels.get('cause')} → {now.labels.get('cause')}"
    )
    timelines.add(rec.chat_id, rec.identity, at, "diagnosis", what)


def resolved(timelines: Timelines, alert: Alert, *, why: str) -> None:
    chat = alert.labels.get("chat_id")
    if not chat or alert.name == "ChatSwept":
        return
    what = f"{alert.name} resolved (fingerprint {alert.fingerprint}): {why}"
    at = alert.ends_at if alert.ends_at is not None else alert.starts_at
    timelines.add(chat, alert.labels.get("identity", ""), at, "alert", what)
