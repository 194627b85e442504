"""What a verdict says: the labels and annotations of the detector's alerts.

Pure rendering (docs/alerting.md): given a chat record, its verdict and the facts
gathered about it, build the :class:`Alert`. It reads no clock of its own (the caller
says when it measured) and fires nothing; the ledger does that. Its caches only
remember text a burst repeats (label names, durations).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import NamedTuple

from watchd.alerting.model import Alert
from watchd.config.fields import duration_text
from watchd.detection.budgets import ChatVerdict
from watchd.detection.causes import ABOVE_CAPACITY, cause
from watchd.detection.diagnosis import (
    INVALID_HINT,
    Facts,
    agents_text,
    hint,
    ledger_keys,
    pending_text,
)
from watchd.kits.clock import utc_second
from watchd.store.records import (
    CLOCK_LOWER_BOUND,
    CLOCK_SYNTHESIZED,
    LABEL_VALUE_MAX,
    MAX_LABELS,
    ChatRecord,
)

CLOCK_TEXT = {
    "transition": "transition seen on the watch stream (exact)",
    CLOCK_SYNTHESIZED: "transition found by a listing; clock from updated_at (a lower bound)",
    CLOCK_LOWER_BOUND: "first seen in a listing; clock from updated_at (a lower bound: the "
    "true time in status is at least this)",
}
# A burst's running chat whose capacity flag is being read (a listing never carries it):
# its cause may still become ``capacity``, so it joins no FleetIncident until then.
CAUSE_PENDING = "queued_for_capacity not read yet (a listing never carries it): reading it"
SEVERITY = {
    "ChatStuck": "warning",
    "ChatStranded": "warning",
    "ChatStalled": "warning",
    "ChatFailed": "info",
    "IdentityUnhealthy": "critical",
}
_LABEL_KEY = re.compile(r"[^a-zA-Z0-9_]")


def iso(ts: float) -> str:
    """``datetime.fromtimestamp(ts, UTC).isoformat()`` with a ``Z``, the whole seconds
    remembered: a burst formats ten thousand stamps of a few seconds."""
    # Split as datetime does (modf, microseconds rounded half to even, carried into the
    # seconds), so the text is the same to the microsecond.
    frac, whole = math.modf(ts)
    us = round(frac * 1e6)
    if us >= 1_000_000:
        us -= 1_000_000
        whole += 1.0
    elif us < 0:
        us += 1_000_000
        whole -= 1.0
    head = utc_second(int(whole))
    return f"{head}.{us:06d}Z" if us else f"{head}Z"


class Renderer:
    """Builds chat and identity alerts; remembers the label names a burst of ten
    thousand alerts would otherwise format ten thousand times (durations are remembered
    by :func:`watchd.config.fields.duration_text`)."""

    def __init__(self, *, link_template: str, external_url: str = "") -> None:
        self.link_template = link_template
        # With server.external_url, every chat alert links the chat's timeline.
        self.external_url = external_url
        self._label_keys: dict[str, str] = {}  # chat label key -> alert label name

    def chat_alert(
        self,
        rec: ChatRecord,
        *,
        deployment: str,
        labels: Mapping[str, str],
        name: ChatVerdict,
        age: float,
        limit: float,
        since: float,
        facts: Facts,
        fp: str,
        clock: str,
        measured_at: float,
        invalid: str | None = None,
        burst: int = 1,
        cause_pending: bool = False,
    ) -> Alert:
        """``labels``: the identity's own; ``invalid``: coderd's message when a mutation
        found the chat's execution state invalid; ``burst``: chats confirmed together;
        ``cause_pending``: its capacity flag is being read (the cause may still move)."""
        d = self.draft(
            rec, deployment=deployment, labels=labels, name=name, limit=limit, since=since
        )
        return self.finish(
            d,
            age=age,
            facts=facts,
            fp=fp,
            clock=clock,
            measured_at=measured_at,
            invalid=invalid,
            burst=burst,
            cause_pending=cause_pending,
        )

    def draft(
        self,
        rec: ChatRecord,
        *,
        deployment: str,
        labels: Mapping[str, str],
        name: ChatVerdict,
        limit: float,
        since: float,
    ) -> Draft:
        """The part of a chat alert that the record alone decides (no clock, no facts, no
        burst); :meth:`finish` adds the rest."""
        out: dict[str, str] = {}
        keys = self._label_keys
        cut = _labels_cut(rec.labels)
        for k, v in rec.labels[:MAX_LABELS] if cut else rec.labels:
            key = keys.get(k)
            if key is None:
                key = keys[k] = f"chat_label_{_LABEL_KEY.sub('_', k)}"
                if len(keys) > 10_000:
                    keys.clear()
            out[key] = v
        out.update(labels)
        out["alertname"] = name
        out["identity"] = rec.identity
        out["deployment"] = deployment
        out["status"] = rec.status
        out["severity"] = SEVERITY[name]
        out["owner"] = rec.owner
        out["chat_id"] = rec.chat_id
        tail: list[tuple[str, str]] = []
        if rec.mode:
            tail.append(("mode", rec.mode))
        if rec.client_type:
            tail.append(("client_type", rec.client_type))
        if rec.context_error:
            tail.append(("context_error", rec.context_error))
        if rec.warnings:
            tail.append(("warnings", "; ".join(rec.warnings)))
        if rec.parent_id:
            tail.append(("parent_chat_id", rec.parent_id))
        if rec.pending:
            tail.append(("pending_tool_calls", pending_text(rec)))
            tail.append(("client_ledger_keys", ledger_keys(rec)))
        if cut:
            tail.append(("labels_cut", cut))
        if rec.last_error is not None:
            e = rec.last_error
            tail.append(
                (
                    "last_error",
                    f"{e.message} (kind={e.kind}, provider={e.provider or '-'}, "
                    f"status={e.status_code if e.status_code is not None else '-'}, "
                    f"retryable={'yes' if e.retryable else 'no'})",
                )
            )
        return Draft(
            rec=rec,
            name=name,
            labels=out,
            title=rec.title or "(untitled)",
            limit_text=duration_text(limit),
            since_text=iso(since),
            link=self.link_template.format(deployment=deployment, chat_id=rec.chat_id),
            tail=tail,
            starts_at=since + limit,
        )

    def finish(
        self,
        d: Draft,
        *,
        age: float,
        facts: Facts,
        fp: str,
        clock: str,
        measured_at: float,
        invalid: str | None = None,
        burst: int = 1,
        cause_pending: bool = False,
    ) -> Alert:
        """The alert of a draft, with what only the confirmation's end knows: the time in
        status as measured then, the facts, the burst and an invalid execution state;
        ``cause_pending``: its capacity flag is being read (the cause may still move)."""
        rec = d.rec
        name = d.name
        title = d.title
        # The diagnosis as a label (fleet.md §1); not part of the fingerprint.
        d.labels["cause"] = cause(facts)
        age_text = duration_text(age)
        limit_text = d.limit_text
        if name == "ChatStalled":
            summary = (
                f'Chat "{title}" has made no server-side progress for '
                f"{age_text} while running (budget {limit_text})"
            )
            clock_text = "stalled: time since updated_at last moved"
        elif name == "ChatFailed":
            summary = f'Chat "{title}" failed'
            clock_text = CLOCK_TEXT.get(rec.clock, rec.clock)
        else:
            summary = f'Chat "{title}" has been {rec.status} for {age_text} (budget {limit_text})'
            clock_text = CLOCK_TEXT.get(rec.clock, rec.clock)
        annotations = {
            "summary": summary,
            "title": title,
            "time_in_status": age_text,
            "time_in_status_seconds": f"{age:.0f}",
            "budget": limit_text,
            "since": d.since_text,
            "clock": rec.clock if clock == "status" else "stalled",
            "clock_description": clock_text,
            "link": d.link,
            **(
                {"timeline": f"{self.external_url}/status/chats/{rec.chat_id}"}
                if self.external_url
                else {}
            ),
            # Server time: the clock start plus the time in status measured on it.
            "hint": hint(
                facts,
                burst=burst,
                invalid_state=invalid,
                now=rec.since + age if clock == "status" else None,
            ),
        }
        _add_evidence(annotations, rec, facts, invalid)
        if cause_pending:
            annotations["cause_pending"] = CAUSE_PENDING
        for k, v in d.tail:
            annotations[k] = v
        # startsAt from what the server said (the clock start plus the budget: when the
        # chat went past it), never from this replica's clock: every replica owning the
        # identity sends the same one, as it sends the same fingerprint (docs/kubernetes.md).
        return Alert(
            fingerprint=fp,
            labels=d.labels,
            annotations=annotations,
            starts_at=d.starts_at,
            measured_at=measured_at,
        )


def _add_evidence(
    annotations: dict[str, str], rec: ChatRecord, facts: Facts, invalid: str | None
) -> None:
    """What the diagnosis read, as annotations: workspace, build, agents, quota, capacity
    flag and an invalid execution state (each where known)."""
    if rec.workspace_id:
        annotations["workspace_id"] = rec.workspace_id
    if facts.build is not None:
        annotations["workspace_build"] = facts.build.status + (
            f" ({facts.build.error_code})" if facts.build.error_code else ""
        )
        if facts.build.agents:
            annotations["workspace_agents"] = agents_text(facts.build)
    if facts.quota is not None:
        annotations["quota"] = (
            "unlimited"
            if facts.quota.unlimited
            else f"{facts.quota.credits_consumed}/{facts.quota.budget}"
        )
    if rec.queued_for_capacity:
        annotations["queued_for_capacity"] = "true"
    if invalid is not None:
        annotations["execution_state"] = f"invalid: {invalid}"


class Draft(NamedTuple):
    """A chat alert's record-only part (:meth:`Renderer.draft`); its labels become the
    alert's own. A tuple: a burst drafts ten thousand, and a frozen dataclass costs a
    microsecond more each to build."""

    rec: ChatRecord
    name: ChatVerdict
    labels: dict[str, str]
    title: str
    limit_text: str
    since_text: str
    link: str
    tail: list[tuple[str, str]]
    starts_at: float


def _labels_cut(labels: tuple[tuple[str, str], ...]) -> str:
    """What of a chat's labels its alerts leave out, in words ("" when nothing)."""
    if not labels:
        return ""
    parts = []
    if len(labels) > MAX_LABELS:
        parts.append(f"only the first {MAX_LABELS} labels by name are copied")
    cut = [k for k, v in labels[:MAX_LABELS] if len(v) > LABEL_VALUE_MAX]
    if cut:
        parts.append(f"cut to {LABEL_VALUE_MAX} characters: {', '.join(cut)}")
    return "; ".join(parts)


def said_invalid(alert: Alert, message: str) -> Alert:
    """A firing chat alert re-said with its execution state found invalid."""
    annotations = dict(alert.annotations)
    annotations["execution_state"] = f"invalid: {message}"
    annotations["hint"] = INVALID_HINT
    return dataclasses.replace(alert, annotations=annotations)


def recaused(alert: Alert, rec: ChatRecord) -> Alert:
    """A firing chat alert as it stands once its chat's capacity flag is known (read by
    GET after a listing confirmed the burst it came due in): queued, its cause becomes
    ``capacity`` with the capacity hint; admitted after all, a ``capacity`` cause goes
    back to ``unknown`` (what a listing's evidence shows); either way its cause is no
    longer pending. Unchanged otherwise (the same object). The fingerprint never moves
    (fleet.md §1)."""
    old = alert.labels.get("cause")
    pending = "cause_pending" in alert.annotations
    if old is None or old in ABOVE_CAPACITY or "execution_state" in alert.annotations:
        return alert
    if rec.queued_for_capacity and old != "capacity":
        new = "capacity"
    elif not rec.queued_for_capacity and old == "capacity":
        new = "unknown"
    elif pending:
        new = old
    else:
        return alert
    labels = dict(alert.labels)
    labels["cause"] = new
    annotations = dict(alert.annotations)
    annotations.pop("cause_pending", None)
    if new != old:
        annotations["hint"] = hint(Facts(record=rec))
    if rec.queued_for_capacity:
        annotations["queued_for_capacity"] = "true"
    else:
        annotations.pop("queued_for_capacity", None)
    return dataclasses.replace(alert, labels=labels, annotations=annotations)


def with_agent_evidence(alert: Alert, said: str) -> Alert:
    """A chat alert with what the agent's forwarded events say (a redial storm, a silent
    open stream): the ``agent_evidence`` annotation, and the hint ends with it."""
    annotations = dict(alert.annotations)
    annotations["agent_evidence"] = said
    annotations["hint"] = f"{annotations.get('hint', '')} (agent events: {said})".strip()
    return dataclasses.replace(alert, annotations=annotations)


def unconfirmed_alert(alert: Alert, error: str) -> Alert:
    """A chat alert fired without its confirming re-read (which kept failing): it says so,
    with the error, so the page is read as the evidence at hand, not a fresh read."""
    annotations = dict(alert.annotations)
    annotations["unconfirmed"] = error
    annotations["hint"] = (
        f"{alert.annotations.get('hint', '')} (unconfirmed: re-reading this chat keeps "
        f"failing: {error}; check what answers GET /chats/<id> for this token)"
    ).strip()
    return dataclasses.replace(alert, annotations=annotations)
