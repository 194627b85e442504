"""The alert record, its deterministic fingerprint, and the sink seam.

An :class:`Alert` is a state, not a message: the detector puts it firing and
later puts it resolved (``ends_at`` set); whatever sits behind the
:class:`AlertSink` decides what to send, when and to whom.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from hashlib import sha256
from typing import Protocol, TextIO, runtime_checkable

from watchd.config.fields import duration_text, format_duration


@dataclass(frozen=True)
class Alert:
    fingerprint: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    starts_at: float = 0.0
    ends_at: float | None = None
    # Host time the annotations' time in status was measured (None: at starts_at). Chat
    # alerts start at a server time (clock start + budget, the same on every replica);
    # their age moves on from when this daemon measured it, so skew never enters.
    measured_at: float | None = None

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def firing(self) -> bool:
        return self.ends_at is None

    @property
    def status(self) -> str:
        return "firing" if self.ends_at is None else "resolved"

    def resolved(self, at: float) -> Alert:
        return replace(self, ends_at=at)

    def to_json(self) -> dict[str, object]:
        return {
            "fingerprint": self.fingerprint,
            "status": self.status,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
        }


def _age_at(alert: Alert, at: float) -> float | None:
    """Time in status at ``at``: the age measured when it fired (on the server's clock)
    plus the host time since, so host/server skew never enters the difference."""
    base = alert.annotations.get("time_in_status_seconds")
    if base is None:
        return None
    try:
        fired_age = float(base)
    except ValueError:
        return None
    anchor = alert.measured_at
    if anchor is None:
        anchor = _measured_from_annotations(alert, fired_age)
    return fired_age + max(0.0, at - anchor)


def _measured_from_annotations(alert: Alert, fired_age: float) -> float:
    """When an alert restored from disk (which keeps no ``measured_at``) was measured:
    its clock start plus the age it had then. Without a clock start (IdentityUnhealthy,
    QuotaLow: their ``starts_at`` is the host time they fired) it is ``starts_at``."""
    since = alert.annotations.get("since")
    if not since:
        return alert.starts_at
    try:
        return datetime.fromisoformat(since).timestamp() + fired_age
    except ValueError:
        return alert.starts_at


def live(alert: Alert, now: float) -> Alert:
    """The alert as of ``now``: time in status computed when rendered or sent, not frozen
    at fire time. A resolved alert's age stopped at its end."""
    if not alert.firing:  # resolution() already fixed how long it lasted
        return alert
    age = _age_at(alert, now)
    if age is None:
        return alert
    old, new = alert.annotations.get("time_in_status", ""), duration_text(age)
    seconds = f"{age:.0f}"
    if old == new and alert.annotations.get("time_in_status_seconds") == seconds:
        # Sent within the same second it was measured (a burst's first notification):
        # nothing to say anew, and no copy of ten thousand alerts to make.
        return alert
    ann = dict(alert.annotations)
    ann["time_in_status"] = new
    ann["time_in_status_seconds"] = seconds
    if alert.firing and old and old != new and "summary" in ann:
        ann["summary"] = ann["summary"].replace(f"for {old}", f"for {new}", 1)
    return replace(alert, annotations=ann)


def resolution(alert: Alert, *, at: float, why: str) -> Alert:
    """The resolved alert, saying how long the condition lasted and why it ended
    ("left running for waiting", "chat archived", "chat gone", "identity recovered")."""
    ann = dict(alert.annotations)
    age = _age_at(alert, at)
    lasted = format_duration(age if age is not None else max(0.0, at - alert.starts_at))
    labels = alert.labels
    title = ann.get("title")
    if alert.name == "ChatStalled" and title is not None:
        what = f'Chat "{title}" made no server-side progress for {lasted}'
    elif title is not None and age is not None:
        what = f'Chat "{title}" was {labels.get("status", "?")} for {lasted}'
        if ann.get("budget"):
            what += f" (budget {ann['budget']})"
    elif alert.name == "IdentityUnhealthy":
        what = f"Identity {labels.get('identity', '?')} could not watch for {lasted}"
    else:
        what = f"{alert.name} fired for {lasted}"
    ann["summary"] = f"{what}; resolved: {why}"
    ann["resolved_reason"] = why
    ann["lasted"] = lasted
    if age is not None:
        ann["time_in_status"] = lasted
        ann["time_in_status_seconds"] = f"{age:.0f}"
    return replace(alert, annotations=ann, ends_at=at)


def fingerprint(*parts: str | float) -> str:
    """hash(deployment, chat id, alert name, status, clock start): the same on every
    replica and across restarts, so a second daemon or a restart cannot double-page."""
    # Strings as they are (most parts): the per-part conversion was half the cost of a
    # fingerprint, and a burst computes ten thousand of them.
    norm = [p if type(p) is str else f"{p:.3f}" if isinstance(p, float) else str(p) for p in parts]
    return sha256("\x00".join(norm).encode()).hexdigest()[:16]


class AlertSink(Protocol):
    """Where alert state changes go. ``put`` never blocks."""

    def put(self, alert: Alert) -> None: ...


@runtime_checkable
class HoldingSink(Protocol):
    """A sink that can hold what it sends while a burst is put piece by piece (the
    dispatcher: :meth:`watchd.alerting.dispatch.Dispatcher.holding`)."""

    def put(self, alert: Alert) -> None: ...

    def holding(self) -> AbstractContextManager[None]: ...


class ConsoleSink:
    """Human-readable lines, for the demo and debugging (also a receiver kind)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.count = 0

    def put(self, alert: Alert) -> None:
        self.count += 1
        a = alert.annotations
        stamp = time.strftime("%H:%M:%S")
        mark = "FIRING  " if alert.firing else "RESOLVED"
        name = alert.labels.get("alertname", "?")
        who = alert.labels.get("identity", "")
        chat = alert.labels.get("chat_id", "")
        line = f"{stamp} {mark} {name} [{who}] {a.get('summary', '')}"
        if chat:
            line += f" chat={chat[:8]}"
        if alert.firing and a.get("hint"):
            line += f"\n           hint: {a['hint']}"
        print(line, file=self.stream, flush=True)
