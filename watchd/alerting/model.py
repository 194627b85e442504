"""The alert record, its deterministic fingerprint, and the sink seam.

An :class:`Alert` is a state, not a message: the detector puts it firing and
later puts it resolved (``ends_at`` set); whatever sits behind the
:class:`AlertSink` decides what to send, when and to whom.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TextIO


@dataclass(frozen=True)
class Alert:
    fingerprint: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    starts_at: float = 0.0
    ends_at: float | None = None

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


def fingerprint(*parts: str | float) -> str:
    """hash(deployment, chat id, alert name, status, clock start): the same on every
    replica and across restarts, so a second daemon or a restart cannot double-page."""
    norm = [f"{p:.3f}" if isinstance(p, float) else str(p) for p in parts]
    return hashlib.sha256("\x00".join(norm).encode()).hexdigest()[:16]


class AlertSink(Protocol):
    """Where alert state changes go. ``put`` never blocks."""

    def put(self, alert: Alert) -> None: ...


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
