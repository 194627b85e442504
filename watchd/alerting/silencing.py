"""Silences and inhibition: the two ways an alert is muted.

A silence mutes alerts whose labels match all its matchers during its time
window; silences come from config and from the runtime API (persisted in the
state file's ``silences`` table by :class:`SilenceRows`, written by the flush).
An inhibition rule mutes a *target* alert while a firing *source* alert
matches and the two agree on the ``equal`` labels (by default,
IdentityUnhealthy mutes that identity's ChatStuck/ChatStranded).
"""

from __future__ import annotations

import secrets as pysecrets
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from watchd.alerting.model import Alert
from watchd.config.alerting import InhibitRule, SilenceConfig
from watchd.kits.matchers import Matcher, all_match, parse_matchers
from watchd.store.sqlite import Part, StateFile, dumps

SCHEMA = "CREATE TABLE IF NOT EXISTS silences (id TEXT PRIMARY KEY, body TEXT NOT NULL);"


@dataclass(frozen=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    comment: str = ""
    created_by: str = ""
    source: str = "api"  # api | config

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def mutes(self, labels: Mapping[str, str], now: float) -> bool:
        return self.active(now) and all_match(self.matchers, labels)

    def to_json(self, now: float) -> dict[str, object]:
        state = "active" if self.active(now) else ("pending" if now < self.starts_at else "expired")
        return {
            "id": self.id,
            "matchers": [str(m) for m in self.matchers],
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "comment": self.comment,
            "created_by": self.created_by,
            "source": self.source,
            "state": state,
        }


def parse_time(value: str, *, field: str) -> float:
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{field}: {value!r} is not an ISO 8601 time") from None
    if dt.tzinfo is None:
        raise ValueError(f"{field}: {value!r} needs a timezone (e.g. Z)")
    return dt.timestamp()


def from_config(cfgs: Iterable[SilenceConfig], *, now: float) -> list[Silence]:
    out = []
    for i, c in enumerate(cfgs):
        out.append(
            Silence(
                id=f"config-{i}",
                matchers=parse_matchers(c.matchers),
                starts_at=parse_time(c.starts_at, field=f"silences.{i}.starts_at")
                if c.starts_at
                else now,
                ends_at=parse_time(c.ends_at, field=f"silences.{i}.ends_at"),
                comment=c.comment,
                created_by=c.created_by,
                source="config",
            )
        )
    return out


def silence_from_json(body: dict[str, Any]) -> Silence:
    """A persisted runtime silence (see :meth:`Silence.to_json`)."""
    return Silence(
        id=str(body["id"]),
        matchers=parse_matchers([str(m) for m in body["matchers"]]),
        starts_at=float(body["starts_at"]),
        ends_at=float(body["ends_at"]),
        comment=str(body.get("comment", "")),
        created_by=str(body.get("created_by", "")),
        source="api",
    )


def new_id() -> str:
    return pysecrets.token_hex(8)


class Silencer:
    """Silences in force; runtime ones are persisted by the caller (see the dispatcher)."""

    def __init__(self, silences: Iterable[Silence] = ()) -> None:
        self.silences: dict[str, Silence] = {s.id: s for s in silences}

    def replace_config(self, silences: Iterable[Silence]) -> None:
        """Swap the config-defined silences (on reload); runtime ones stay."""
        self.silences = {k: s for k, s in self.silences.items() if s.source != "config"}
        for s in silences:
            self.silences[s.id] = s

    def add(self, silence: Silence) -> None:
        self.silences[silence.id] = silence

    def expire(self, silence_id: str, *, now: float) -> Silence | None:
        s = self.silences.get(silence_id)
        if s is None:
            return None
        ended = Silence(**{**s.__dict__, "ends_at": min(s.ends_at, now)})
        self.silences[silence_id] = ended
        return ended

    def muted_by(self, labels: Mapping[str, str], now: float) -> list[str]:
        return [s.id for s in self.silences.values() if s.mutes(labels, now)]

    def gc(self, now: float, *, keep: float = 86400.0) -> None:
        """Forget silences expired for longer than ``keep``."""
        for sid in [sid for sid, s in self.silences.items() if s.ends_at < now - keep]:
            del self.silences[sid]


@dataclass(frozen=True)
class Inhibition:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]


def _source_name(rule: Inhibition) -> str | None:
    """The alertname a rule's sources must have (an equality matcher on it), if any."""
    for m in rule.source:
        if m.name == "alertname" and m.op == "=":
            return m.value
    return None


class InhibitionIndex:
    """Firing sources indexed per rule by their ``equal`` values; called, it answers
    whether an alert is inhibited."""

    def __init__(self, rules: list[Inhibition]) -> None:
        self.rules = rules
        self._by_equal: list[dict[tuple[str, ...], set[str]]] = [{} for _ in rules]
        # The rules by the alertname their sources must have, when every rule names one
        # (the defaults do): a flush indexes every firing alert, and the bulk of them (a
        # burst's chat alerts) is then passed over in one look-up instead of one match
        # per rule.
        names = [_source_name(rule) for rule in rules]
        self._by_name: dict[str, list[int]] | None = None
        if None not in names:
            self._by_name = {}
            for i, name in enumerate(names):
                self._by_name.setdefault(name or "", []).append(i)

    def add(self, src: Alert) -> None:
        if not src.firing:
            return
        picked: Iterable[int] = range(len(self.rules))
        if self._by_name is not None:
            named = self._by_name.get(src.labels.get("alertname", ""))
            if named is None:
                return
            picked = named
        for i in picked:
            rule = self.rules[i]
            if all_match(rule.source, src.labels):
                key = tuple(src.labels.get(k, "") for k in rule.equal)
                self._by_equal[i].setdefault(key, set()).add(src.fingerprint)

    @property
    def sources(self) -> bool:
        """Whether any firing alert is a source of a rule (else nothing is inhibited)."""
        return any(self._by_equal)

    def __call__(self, alert: Alert) -> bool:
        for rule, by_equal in zip(self.rules, self._by_equal, strict=True):
            if not by_equal or not all_match(rule.target, alert.labels):
                continue
            fps = by_equal.get(tuple(alert.labels.get(k, "") for k in rule.equal))
            if fps and (len(fps) > 1 or alert.fingerprint not in fps):
                return True
        return False


class Inhibitor:
    def __init__(self, rules: Iterable[InhibitRule]) -> None:
        self.rules = [
            Inhibition(
                parse_matchers(r.source_matchers), parse_matchers(r.target_matchers), tuple(r.equal)
            )
            for r in rules
        ]

    def prepare(self, firing: Iterable[Alert]) -> InhibitionIndex:
        """A checker for one flush: sources are matched once and indexed by their ``equal``
        label values, so checking N targets costs O(N), not O(N × firing)."""
        index = self.index()
        for src in firing:
            index.add(src)
        return index

    def index(self) -> InhibitionIndex:
        """An empty index to fill source by source (e.g. in chunks, yielding in between)."""
        return InhibitionIndex(self.rules)

    def inhibited(self, alert: Alert, firing: Iterable[Alert]) -> bool:
        return self.prepare(firing)(alert)


class SilenceRows(Part):
    """Runtime silences on disk: each saved body (JSON), written by the flush (the
    silencer in memory is what mutes; this is what the next start reads)."""

    schema = SCHEMA

    def __init__(self, file: StateFile) -> None:
        super().__init__(file)
        self._pending: dict[str, dict[str, Any]] = {}

    def load(self) -> list[dict[str, Any]]:
        return [orjson.loads(b) for (b,) in self.file.read("SELECT body FROM silences")]

    def save(self, silence_id: str, body: dict[str, Any]) -> None:
        self._pending[silence_id] = body

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self) -> dict[str, dict[str, Any]] | None:
        if not self._pending:
            return None
        batch, self._pending = self._pending, {}
        return batch

    def restore(self, batch: dict[str, dict[str, Any]]) -> None:
        for k, b in batch.items():
            self._pending.setdefault(k, b)

    def write(self, db: sqlite3.Connection, batch: dict[str, dict[str, Any]]) -> int:
        db.executemany(
            "INSERT OR REPLACE INTO silences VALUES (?,?)",
            [(k, dumps(b)) for k, b in batch.items()],
        )
        return len(batch)
