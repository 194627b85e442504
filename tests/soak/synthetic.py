"""Runs made by hand for the oracle's own tests: chats moved at chosen server times, and
the notifications a model watchd sends for them — a correct one, or one with shorter
budgets, behind a receiver that loses every other notification, or with one mistake
put in on purpose."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.soak.record import Run
from tests.soak.shape import ALERTNAME, VARIANTS

T0 = 1_900_000_000.0  # the runs' start (host and server clock agree: no steps)
USER, IDENTITY = "bulk000", "team-0"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


def fingerprint(chat: str, status: str, since: float) -> str:
    return hashlib.sha256(f"{chat}/{status}/{since:.3f}".encode()).hexdigest()[:16]


@dataclass
class Synthetic:
    minutes: float = 10.0
    journal: list[dict[str, Any]] = field(default_factory=list)
    chats: int = 0

    def _entry(self, at: float, kind: str, **fields: Any) -> None:
        self.journal.append(
            {"seq": len(self.journal) + 1, "kind": kind, "at": at, "wall": at, **fields}
        )

    def chat(self, moves: list[tuple[float, str]], *, unheard: tuple[int, ...] = ()) -> str:
        """A chat created in ``moves[0]``'s status, then moved (times in seconds after T0);
        the moves numbered in ``unheard`` are written without their event."""
        self.chats += 1
        cid = f"{self.chats:08d}-0000-4000-8000-000000000000"
        for i, (t, status) in enumerate(moves):
            heard = i not in unheard
            self._entry(
                T0 + t,
                "created" if i == 0 else "status",
                chat=cid,
                owner=USER,
                status=status,
                updated_at=T0 + t,
                archived=False,
                heard=1 if heard else 0,
                silent=not heard,
            )
        return cid

    def run(self, deliveries: list[list[Any]] | None = None) -> Run:
        end = T0 + self.minutes * 60
        return Run(
            seed=0,
            minutes=self.minutes,
            identities={USER: IDENTITY},
            variants=[VARIANTS[0].as_dict()],
            budget_scale=1.0,
            max_clock_step=0.0,
            receiver_retry_after=2.0,
            started=T0,
            ended=end,
            observed_until=end + 30,
            journal=self.journal,
            watch_gaps={USER: []},
            configs=[[T0 - 10, 0]],
            deliveries=deliveries if deliveries is not None else self.notifications(),
        )

    def stays(self) -> list[tuple[str, str, float, float | None]]:
        """(chat, status, entered, left) of every stay in a watched status."""
        out = []
        by_chat: dict[str, list[dict[str, Any]]] = {}
        for e in self.journal:
            by_chat.setdefault(e["chat"], []).append(e)
        for chat, entries in by_chat.items():
            for i, e in enumerate(entries):
                if e["status"] in ALERTNAME:
                    left = entries[i + 1]["at"] if i + 1 < len(entries) else None
                    out.append((chat, e["status"], e["at"], left))
        return out

    def notifications(self, *, budget_scale: float = 1.0, delay: float = 0.5) -> list[list[Any]]:
        """What a correct watchd with these budgets (× ``budget_scale``) sends: each page
        ``delay`` after its due time, each resolve ``delay`` after the chat left, one
        notification per change of a group with every alert the group holds."""
        events: list[tuple[float, str, dict[str, Any]]] = []
        for chat, status, entered, left in self.stays():
            due = entered + VARIANTS[0].budget(status) * budget_scale
            if left is not None and left <= due:
                continue
            alert = self.alert(chat, status, entered)
            events.append((due + delay, "firing", alert))
            if left is not None:
                events.append((left + delay, "resolved", alert))
        return self.grouped(sorted(events, key=lambda e: e[0]))

    def alert(self, chat: str, status: str, since: float) -> dict[str, Any]:
        budget = VARIANTS[0].budget(status)
        return {
            "labels": {
                "alertname": ALERTNAME[status],
                "identity": IDENTITY,
                "status": status,
                "chat_id": chat,
            },
            "annotations": {"since": iso(since)},
            "startsAt": iso(since + budget),
            "generatorURL": "",
            "fingerprint": fingerprint(chat, status, since),
        }

    @staticmethod
    def grouped(events: list[tuple[float, str, dict[str, Any]]]) -> list[list[Any]]:
        """One webhook body per event, carrying its group's firing alerts and the alert
        it resolves (as Alertmanager's notification of a changed group does)."""
        firing: dict[str, dict[str, dict[str, Any]]] = {}
        out: list[list[Any]] = []
        for t, what, alert in events:
            labels = alert["labels"]
            key = f"{labels['identity']}/{labels['alertname']}/{labels['status']}"
            group = firing.setdefault(key, {})
            resolved = []
            if what == "firing":
                group[alert["fingerprint"]] = alert
            else:
                group.pop(alert["fingerprint"], None)
                resolved = [{**alert, "status": "resolved", "endsAt": iso(t)}]
            body_alerts = [
                {**a, "status": "firing", "endsAt": "0001-01-01T00:00:00Z"} for a in group.values()
            ] + resolved
            out.append([t, {"groupKey": key, "alerts": body_alerts}])
        return out
