"""ChatSwept: what the sweep did (or would do), told through the alert pipeline.

An announcement is an alert raised in the detector's ledger of firing alerts
(:class:`Ledger`), not a timer: the ledger persists, so an announcement fires
once per episode and resolves after ``announce_for`` even across a restart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from watchd.alerting.model import Alert, fingerprint
from watchd.remediation.progress import SweepEntry
from watchd.store.records import ChatRecord


class Ledger(Protocol):
    """What the sweep needs of the detector's firing-alert ledger."""

    @property
    def firing(self) -> Mapping[str, Alert]: ...

    def raise_alert(self, alert: Alert, *, identity: str) -> None: ...

    def clear_alert(self, fp: str, *, why: str) -> None: ...


def announcement(
    entry: SweepEntry,
    *,
    rec: ChatRecord | None,
    policy: str,
    action: str,
    dry_run: bool,
    detail: str,
    deployment: str,
    labels: Mapping[str, str],
) -> Alert:
    """The ChatSwept alert for one decision; its fingerprint is one per chat episode."""
    verb = f"would {action}" if dry_run else entry.state.replace("_", " ")
    return Alert(
        fingerprint=fingerprint(deployment, entry.chat_id, "ChatSwept", policy, entry.since),
        labels={
            **labels,
            "alertname": "ChatSwept",
            "identity": entry.identity,
            "deployment": deployment,
            "chat_id": entry.chat_id,
            "policy": policy,
            "action": action,
            "dry_run": "true" if dry_run else "false",
            "severity": "info",
            "status": entry.state,
        },
        starts_at=time.time(),
        annotations={
            "summary": f'Sweep {verb}: chat "{rec.title if rec else entry.chat_id}" '
            f"(policy {policy})",
            "title": rec.title if rec else "",
            "detail": detail,
        },
    )


def expire_announcements(ledger: Ledger, *, announce_for: float) -> None:
    """ChatSwept announcements resolve after ``announce_for`` (checked every pass, on
    firing alerts the detector persisted: a restart in between resolves them too)."""
    cutoff = time.time() - announce_for
    for fp, alert in list(ledger.firing.items()):
        if alert.name == "ChatSwept" and alert.starts_at <= cutoff:
            ledger.clear_alert(fp, why="announced long enough")
