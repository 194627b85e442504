"""The sweep's audit trail: every decision and action as one JSON line.

Appended to the audit file (one line per decision, written before the next),
kept in memory for ``/status`` (the last :data:`AUDIT_KEEP`), and logged. A
file that cannot be written is logged as an error and the sweep goes on: the
audit must never stop remediation half-way through a chat.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

from watchd.kits import logs
from watchd.remediation.progress import SweepEntry
from watchd.store.records import ChatRecord

log = logs.get("watchd.sweep")

# Enough for the status page's last 50 with room for a reload's carry-over.
AUDIT_KEEP = 200


class AuditLog:
    """JSON lines at ``path``; ``recent`` is what the status page shows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.recent: deque[dict[str, Any]] = deque(maxlen=AUDIT_KEEP)

    def write(
        self,
        entry: SweepEntry,
        *,
        action: str,
        rec: ChatRecord | None,
        policy: str,
        dry_run: bool,
        detail: str,
    ) -> None:
        line = {
            "time": time.time(),
            "identity": entry.identity,
            "chat_id": entry.chat_id,
            "title": rec.title if rec else "",
            "policy": policy,
            "action": action,
            "state": entry.state,
            "dry_run": dry_run,
            "detail": detail,
        }
        self.recent.append(line)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as exc:
            log.error("sweep.audit_failed", path=str(self.path), error=str(exc))
        log.warning("sweep.action" if not dry_run else "sweep.dry_run", **line)
