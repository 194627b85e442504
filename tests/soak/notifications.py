"""What reached the receiver, read for the oracle: each chat alert's story (first firing,
first resolve, firing again after it), the other alerts, and group notifications that
told the receiver nothing new.

Plain data out; :mod:`tests.soak.oracle` judges it. Times are host times of arrival.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from tests.soak.record import Run
from tests.soak.shape import ALERTNAME

CHAT_ALERTS = frozenset(ALERTNAME.values())


@dataclass
class Page:
    """One chat alert's story at the receiver: its clock start (the server's stamp) and
    when notifications carrying it arrived (host clock)."""

    fingerprint: str
    chat: str
    status: str
    identity: str
    since: float  # its clock start
    fired: float | None = None  # first notification with it firing
    resolved: float | None = None  # first with it resolved
    refired: list[float] = field(default_factory=list)  # firing again after the resolve


@dataclass(frozen=True)
class Other:
    """An alert that is not a chat alert, the first time it arrived firing."""

    name: str
    labels: dict[str, str]
    at: float


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def read(run: Run) -> tuple[dict[str, Page], list[Other]]:
    """Every chat alert by fingerprint, and the other alerts that fired."""
    pages: dict[str, Page] = {}
    others: dict[str, Other] = {}
    for t, body in run.deliveries:
        for a in body["alerts"]:
            labels, fp = a["labels"], a["fingerprint"]
            name = labels.get("alertname", "")
            if name not in CHAT_ALERTS:
                if a["status"] == "firing" and fp not in others:
                    others[fp] = Other(name, labels, t)
                continue
            p = pages.get(fp)
            if p is None:
                since = _ts(a["annotations"]["since"])
                p = pages[fp] = Page(
                    fp, labels["chat_id"], labels["status"], labels["identity"], since
                )
            if a["status"] == "firing":
                if p.fired is None:
                    p.fired = t
                elif p.resolved is not None and t > p.resolved:
                    p.refired.append(t)
            elif p.resolved is None:
                p.resolved = t
    return pages, list(others.values())


def unchanged(run: Run) -> Iterator[tuple[str, float, float]]:
    """Group notifications with no new firing and no new resolved alert since the group's
    previous one: (group key, the previous one's arrival, this one's)."""
    last: dict[str, tuple[float, frozenset[str], frozenset[str]]] = {}
    for wall, body in run.deliveries:
        firing = frozenset(a["fingerprint"] for a in body["alerts"] if a["status"] == "firing")
        resolved = frozenset(a["fingerprint"] for a in body["alerts"] if a["status"] != "firing")
        key = body["groupKey"]
        prev = last.get(key)
        last[key] = (wall, firing, resolved)
        if prev is not None and not firing - prev[1] and not resolved - prev[2]:
            yield key, prev[0], wall
