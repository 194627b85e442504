"""The daemon's state as data: the ``/status`` document (``status_page`` renders it).

Computed at request time from the daemon's snapshot (``daemon.snapshot``: identity
health among the rest) and the detector's alerts, so there is no second copy of any
number to drift; time in status is as of the request. Alerts are classified (active,
silenced, inhibited) in bounded chunks that yield to the event loop, and only one
page of them is rendered, so 20 000 firing alerts make neither a huge response nor a
late ``/healthz``. Nothing here reads a secret: identities are shown by name and URL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from watchd.alerting.model import Alert, live
from watchd.config.fields import format_duration
from watchd.daemon.admission import Counts, admission
from watchd.daemon.heartbeat import HeartbeatSnapshot
from watchd.daemon.snapshot import DispatchSnapshot
from watchd.daemon.view import HISTORY_WINDOW, DaemonView, sharding_summary
from watchd.detection.incidents import incident_fingerprint
from watchd.store.health import HealthSnapshot, QuotaOutlook

JSON_LIMIT = 500  # alerts per /status JSON page by default (counts always cover all)
JSON_MAX_LIMIT = 2000
HTML_PAGE = 200  # alert rows per HTML page: ~150 KB at most
CHUNK = 1000  # alerts classified between yields to the event loop
PAGE_CHUNK = 100  # alerts rendered into the page between yields
RESOLVED_SHOWN = 50
MEMBERS_SHOWN = 200  # member chats listed per incident (its count covers all)
_STARTS = operator.attrgetter("starts_at")
_RANK = {"critical": 0, "warning": 1, "info": 2}


def _severity_rank(a: Alert) -> int:
    return _RANK.get(a.labels.get("severity", ""), 3)


@dataclass
class StatusQuery:
    """Filters and the page of alerts asked for (``?identity=&alertname=&state=&page=``)."""

    identity: str = ""
    alertname: str = ""
    state: str = ""  # active | silenced | inhibited | "" (all)
    offset: int = 0
    limit: int = JSON_LIMIT

    @classmethod
    def from_query(cls, q: Mapping[str, str], *, html_page: bool) -> StatusQuery:
        def number(key: str, default: int) -> int:
            try:
                return max(0, int(q.get(key, default)))
            except ValueError:
                return default

        limit = HTML_PAGE if html_page else min(number("limit", JSON_LIMIT), JSON_MAX_LIMIT)
        offset = number("offset", 0)
        if "page" in q:
            offset = max(0, number("page", 1) - 1) * limit
        state = q.get("state", "")
        return cls(
            identity=q.get("identity", ""),
            alertname=q.get("alertname", ""),
            state=state if state in ("active", "silenced", "inhibited") else "",
            offset=offset,
            limit=max(1, limit),
        )


def _forecast(out: QuotaOutlook | None) -> dict[str, Any] | None:
    if out is None:
        return None
    return {
        "rate_per_hour": None if out.rate_per_hour is None else round(out.rate_per_hour, 2),
        "eta": None if out.eta is None else iso(out.eta),
        "eta_seconds": None if out.eta_seconds is None else round(out.eta_seconds),
        "firing": out.firing,
        "readings": out.readings,
        "span_seconds": round(out.span_seconds),
        "outlier_dropped": out.outlier,
        "note": out.note,
    }


def _identity(
    d: DaemonView, h: HealthSnapshot, by_status: Mapping[str, int], counts: Counts
) -> dict[str, Any]:
    return {
        "name": h.name,
        "deployment": h.deployment,
        "state": h.state,
        "ready": h.ready,
        "seeded": h.seeded,
        "prefix": h.prefix,
        "last_list": h.last_list_ok,
        "last_list_age_seconds": None
        if h.last_list_ok is None
        else round(h.server_now - h.last_list_ok, 1),
        "last_list_seconds": h.last_list_seconds,
        "last_list_pages": h.last_list_pages,
        "incomplete_listings": h.incomplete_listings,
        "absent": h.absent,
        "absent_confirms": h.absent_confirms,
        "capacity_reads_dropped": h.capacity_reads_dropped,
        "refused": h.refused,
        "chats": sum(by_status.values()),
        "chats_by_status": dict(sorted(by_status.items())),
        "last_error": h.last_error,
        "reconnects": h.reconnects,
        "relists": h.relists,
        "events": h.events,
        "server_clock_offset_seconds": round(h.server_clock_offset, 3),
        "quota": {
            "state": h.quota_state,
            "budget": h.quota.budget if h.quota else None,
            "consumed": h.quota.credits_consumed if h.quota else None,
            "headroom": h.quota.headroom if h.quota else None,
            "error": h.quota_error,
            "forecast": _forecast(h.forecast),
        },
        "admission": admission(d, h.name, counts),
    }


def incidents_json(d: DaemonView, now: float) -> list[dict[str, Any]]:
    """The FleetIncidents firing now, largest first, each with its first MEMBERS_SHOWN
    members (chat id, identity, status, time in status, link, fingerprint)."""
    firing = d.detector.firing
    muted_by = d.silencer.muted_by
    out = []
    for inc in sorted(
        d.detector.ledger.incidents.firing(), key=lambda i: (-len(i.members), i.cause)
    ):
        assert inc.since is not None
        alert = firing.get(incident_fingerprint(inc.deployment, inc.cause))
        members = [
            {
                "chat_id": a.labels.get("chat_id", ""),
                "identity": a.labels.get("identity", ""),
                "alertname": a.name,
                "status": a.labels.get("status", ""),
                "title": a.annotations.get("title", ""),
                "time_in_status": a.annotations.get("time_in_status", ""),
                "link": a.annotations.get("link", ""),
                "fingerprint": a.fingerprint,
            }
            for a in islice(inc.members.values(), MEMBERS_SHOWN)
        ]
        out.append(
            {
                "deployment": inc.deployment,
                "cause": inc.cause,
                "count": len(inc.members),
                "since": iso(inc.since),
                "firing_for": format_duration(max(0.0, now - inc.since)),
                "identities": sorted(inc.identities),
                "fingerprint": incident_fingerprint(inc.deployment, inc.cause),
                "state": "silenced"
                if alert is not None and muted_by(alert.labels, now)
                else "active",
                "summary": alert.annotations.get("summary", "") if alert else "",
                "hint": alert.annotations.get("hint", "") if alert else "",
                "members": members,
                "members_shown": len(members),
            }
        )
    return out


def _alert_json(a: Alert, state: str, now: float) -> dict[str, Any]:
    doc = live(a, now).to_json()
    doc["state"] = state
    doc["firing_since"] = iso(a.starts_at)
    doc["firing_for"] = format_duration(max(0.0, now - a.starts_at))
    return doc


@dataclass
class Classified:
    """Firing alerts as the status page needs them: counts over all, the filtered list."""

    total: int = 0
    by_state: Counter[str] = field(default_factory=Counter)
    by_name: Counter[str] = field(default_factory=Counter)
    by_identity: Counter[str] = field(default_factory=Counter)
    # Selected alerts and their states side by side, not as 20 000 (alert, state) tuples:
    # tuples are GC-tracked, survive the request's young collections and make the next
    # full collection (a loop stall) come sooner.
    selected: list[Alert] = field(default_factory=list)
    states: list[str] = field(default_factory=list)


async def classify(d: DaemonView, now: float, q: StatusQuery | None = None) -> Classified:
    """Every firing alert's state (active, silenced, inhibited), counted, and those the
    query selects, oldest first per identity. ``CHUNK`` alerts at a time with a yield in
    between, so a big request never holds up the loop (and /healthz) for long."""
    q = q or StatusQuery()
    # Bucketed by identity in chunks, then each bucket ordered by a C-level key: one big
    # sort with a Python key function would hold the loop for tens of milliseconds.
    everything = list(d.detector.firing.values())
    buckets: dict[str, list[Alert]] = {}
    for start in range(0, len(everything), CHUNK):
        await asyncio.sleep(0)
        for a in everything[start : start + CHUNK]:
            buckets.setdefault(a.labels.get("identity", ""), []).append(a)
    # Most severe first, then oldest first (the one on call reads down the page).
    alerts: list[Alert] = []
    for ident in sorted(buckets):
        await asyncio.sleep(0)
        alerts.extend(sorted(buckets[ident], key=_STARTS))
    alerts.sort(key=_severity_rank)  # stable: each severity keeps its age order
    inhibited = d.inhibitor.index()
    for start in range(0, len(alerts), CHUNK):
        await asyncio.sleep(0)
        for a in alerts[start : start + CHUNK]:
            inhibited.add(a)
    out = Classified(total=len(alerts))
    muted_by = d.silencer.muted_by
    for start in range(0, len(alerts), CHUNK):
        await asyncio.sleep(0)
        for a in alerts[start : start + CHUNK]:
            labels = a.labels
            if muted_by(labels, now):
                state = "silenced"
            elif inhibited(a):
                state = "inhibited"
            else:
                state = "active"
            ident = labels.get("identity", "")
            name = labels.get("alertname", "")
            out.by_state[state] += 1
            out.by_name[name] += 1
            out.by_identity[ident] += 1
            if (
                (not q.identity or ident == q.identity)
                and (not q.alertname or name == q.alertname)
                and (not q.state or state == q.state)
            ):
                out.selected.append(a)
                out.states.append(state)
    return out


async def status_document(
    d: DaemonView, query: StatusQuery | None = None, counts: Counts | None = None
) -> dict[str, Any]:
    """The document; ``counts`` (the server's) lets chat counts for admission answers be
    reused within their second."""
    q = query or StatusQuery()
    now = time.time()
    c = await classify(d, now, q)
    alerts = await _alerts(d, c, q, now)
    snap = d.snapshot()
    det = d.detector
    counts = counts or Counts()
    identities = [
        _identity(d, h, snap.chats_by_status[name], counts) for name, h in snap.health.items()
    ]
    disp = snap.dispatch
    return {
        "version": d.version,
        "uptime_seconds": round(time.monotonic() - d.started, 1),
        "ready": d.ready(),
        "identities": identities,
        "sharding": sharding_summary(d),
        "incidents": incidents_json(d, now),
        "alerts": alerts,
        "silences": [s.to_json(now) for s in d.silencer.silences.values()],
        "receivers": {} if disp is None else _receivers(disp),
        "groups": disp.groups if disp else 0,
        # Alerts refused a new group at the limit (also in each receiver's `dropped`).
        "group_overflow": disp.group_overflow if disp else 0,
        "telemetry": dict(snap.telemetry),
        "sweep": None
        if snap.sweep is None
        else {
            "dry_run": snap.sweep.dry_run,
            "counts": dict(snap.sweep.counts),
            "recent": list(snap.sweep.recent),
        },
        "reload": {**snap.reloads, "last": snap.last_reload},
        "counters": dict(det.counters),
        "timelines": det.timelines.snapshot(),
        "store": dataclasses.asdict(snap.store),
        "state": dataclasses.asdict(snap.state),
        "limits": dict(snap.limits),
        "heartbeat": None if snap.heartbeat is None else _heartbeat(snap.heartbeat),
        # Sampled every HISTORY_EVERY, plus this moment: the chart always ends at "now".
        "history": {
            i["name"]: [
                *({"t": t, "chats": c} for t, c in d.history.series(i["name"], now)),
                {"t": now, "chats": i["chats_by_status"]},
            ]
            for i in identities
        },
        "chart_window_seconds": HISTORY_WINDOW,
        "generated_at": now,
    }


async def _alerts(d: DaemonView, c: Classified, q: StatusQuery, now: float) -> dict[str, Any]:
    """The page of firing alerts the query selects, their counts, and the last changes."""
    selected = c.selected
    firing: list[dict[str, Any]] = []
    end = min(len(selected), q.offset + q.limit)
    for start in range(q.offset, end, PAGE_CHUNK):
        await asyncio.sleep(0)  # rendering a full page is ~20 ms of work: in steps
        stop = min(end, start + PAGE_CHUNK)
        firing.extend(
            _alert_json(a, s, now)
            for a, s in zip(selected[start:stop], c.states[start:stop], strict=True)
        )
    history = d.detector.history
    resolved = [a for a in reversed(history) if not a.firing][:RESOLVED_SHOWN]
    return {
        "firing": firing,
        "firing_total": c.total,
        "matching": len(selected),
        "offset": q.offset,
        "limit": q.limit,
        "next_offset": q.offset + q.limit if q.offset + q.limit < len(selected) else None,
        "filters": {"identity": q.identity, "alertname": q.alertname, "state": q.state},
        "counts": {
            "by_state": {k: c.by_state.get(k, 0) for k in ("active", "silenced", "inhibited")},
            "by_alertname": dict(sorted(c.by_name.items())),
            "by_identity": dict(sorted(c.by_identity.items())),
        },
        "resolved": [a.to_json() for a in resolved],
        # Kept for scripts written against 0.1: the last 50 state changes.
        "recent": [a.to_json() for a in list(history)[-RESOLVED_SHOWN:]],
    }


def _receivers(disp: DispatchSnapshot) -> dict[str, Any]:
    # An Alertmanager cluster's receiver delivers while one peer does: each peer's own state.
    return {
        name: {
            "kind": st.kind,
            "sent": st.sent,
            "failed": st.failed,
            "retried": st.retried,
            "dropped": st.dropped,
            "last_error": st.last_error,
            "last_success": st.last_success,
            "last_failure": st.last_failure,
            "retries_pending": st.retries_pending,
            **({"peers": disp.peers[name]} if name in disp.peers else {}),
        }
        for name, st in disp.receivers.items()
    }


def _heartbeat(hb: HeartbeatSnapshot) -> dict[str, Any]:
    return {
        "interval_seconds": hb.interval_seconds,
        "sent": hb.sent,
        "failed": hb.failed,
        "withheld": hb.withheld,
        "withheld_because": hb.withheld_because,
        "last_sent": hb.last_sent,
    }


def iso(t: float | None) -> str:
    """An epoch time as UTC RFC3339 (seconds), or "" for none."""
    if t is None:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
