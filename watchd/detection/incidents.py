"""FleetIncident: one alert per (deployment, cause) over the firing chat alerts.

fleet.md §2. The ledger tells this module every chat alert it fires (:meth:`join`) and
every one it resolves or hands over (:meth:`leave`); :meth:`settle` answers what that
changed: incident alerts to fire (new, or re-raised with the new count, identities and
chats, so the group's next notification carries them: Alertmanager semantics, no new
page) and incidents to resolve (no member fires any more). The ledger fires and
resolves those like any other alert, so they persist and reach the dispatcher the same
way. Pure: no clock, no I/O, nothing fired from here. After a restart the membership is
rebuilt from the ledger's firing alerts (:meth:`restore`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice

from watchd.alerting.model import Alert, fingerprint
from watchd.detection.alerts import iso

NAME = "FleetIncident"
MEMBERS = frozenset({"ChatStuck", "ChatStranded", "ChatStalled", "ChatFailed"})
MAX_CHATS = 20  # member chat ids in the ``chats`` annotation
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
Key = tuple[str, str]  # (deployment, cause)

# cause -> (what the members are, for the summary; the fix, once).
WORDS: dict[str, tuple[str, str]] = {
    "stranded_tool": (
        "stranded at a client-tool pause",
        "the clients stopped answering their tool calls: check the dispatcher or agent "
        "runtime that owns them, reconcile its ledger, then submit the tool results; do "
        "not interrupt blindly",
    ),
    "provider": (
        "failed: the model provider's errors",
        "check the model provider's status and the deployment's model configuration "
        "(each member's last_error names the kind); the owners resend once it is fixed",
    ),
    "usage_limit": (
        "failed: an AI Gateway budget ran out",
        "raise the group's AI Gateway budget (/api/v2/groups/{group}/ai/budget) or the "
        "provider account's quota; chatd never retries this",
    ),
    "capacity": (
        "stuck: deployment concurrency cap reached",
        "the deployment runs as many chats as it may at once (unlicensed: 5 root + 10 "
        "subagent chats): finish or interrupt other chats, start fewer at a time "
        "(GET /v1/admission), or raise the cap",
    ),
    "quota": (
        "stuck: workspace builds fail for insufficient quota",
        "reclaim credits by deleting workspaces (stopping only frees stop-scoped costs) "
        "or raise the group allowance; hold new chats until there is headroom",
    ),
    "build_failed": (
        "stuck: their workspace builds failed",
        "read the failed builds' logs (template, provisioner, cloud credentials) and "
        "rebuild the workspaces",
    ),
    "build_pending": (
        "stuck: their workspace builds wait in the provisioner",
        "check the provisioner daemons (count, health, tags) and the build queue",
    ),
    "agent_unhealthy": (
        "stuck: their workspace agents are unhealthy",
        "check the agents' logs and startup scripts, and the network between coderd "
        "and the workspaces; restart the workspaces once fixed",
    ),
    "interrupt_stuck": (
        "stuck interrupting",
        "the runners that own these chats may be dead: check chatd's replicas; if it "
        "persists, stop the workspaces",
    ),
    "unknown": (
        "stuck with no visible cause",
        "look for a shared cause (the deployment, chatd, the provisioners, the model "
        "provider) before acting on single chats",
    ),
}


def incident_fingerprint(deployment: str, cause: str) -> str:
    """A function of (deployment, cause) alone: the same on every replica and across
    restarts (and what the admission endpoint looks up)."""
    return fingerprint(deployment, cause, NAME)


@dataclass(slots=True)
class Incident:
    deployment: str
    cause: str
    # Member chat alerts by fingerprint, in the order they joined.
    members: dict[str, Alert] = field(default_factory=dict)
    identities: Counter[str] = field(default_factory=Counter)
    severities: Counter[str] = field(default_factory=Counter)
    since: float | None = None  # None: not firing


class Incidents:
    def __init__(self, *, enabled: bool = True, min_chats: int = 5) -> None:
        self.enabled = enabled
        self.min_chats = min_chats
        self.by_key: dict[Key, Incident] = {}
        # Member fingerprint -> the incident it counts in: a member whose cause moved (its
        # capacity flag learned after it fired) leaves the old incident as it joins the new.
        self._key_of: dict[str, Key] = {}
        self._dirty: set[Key] = set()

    def join(self, alert: Alert) -> None:
        """A chat alert fired (or was re-said, perhaps with another cause)."""
        key = _key(alert)
        if key is None or not self.enabled:
            return
        was = self._key_of.get(alert.fingerprint)
        if was is not None and was != key:
            self.leave(alert)
        self._key_of[alert.fingerprint] = key
        inc = self.by_key.get(key)
        if inc is None:
            inc = self.by_key[key] = Incident(*key)
        old = inc.members.get(alert.fingerprint)
        if old is not None:
            _count(inc, old, -1)
        inc.members[alert.fingerprint] = alert
        _count(inc, alert, +1)
        self._dirty.add(key)

    def leave(self, alert: Alert) -> None:
        """A chat alert resolved (or was handed over to another replica)."""
        key = self._key_of.pop(alert.fingerprint, None)
        inc = self.by_key.get(key) if key is not None else None
        if inc is None or key is None:
            return
        old = inc.members.pop(alert.fingerprint, None)
        if old is not None:
            _count(inc, old, -1)
            self._dirty.add(key)

    def restore(self, firing: Mapping[str, Alert]) -> None:
        """Rebuild from the alerts the ledger has firing (after a restart, or when turned
        on by a reload): a stored incident keeps its ``since`` and is re-sent only if its
        members changed meanwhile; one whose members are all gone resolves at the next
        settle; members enough for a new one fire it."""
        self.by_key.clear()
        self._key_of.clear()
        self._dirty.clear()
        if not self.enabled:
            return
        for alert in firing.values():
            self.join(alert)
        self._dirty = {k for k, inc in self.by_key.items() if len(inc.members) >= self.min_chats}
        for alert in firing.values():
            if alert.name != NAME:
                continue
            key = (alert.labels.get("deployment", ""), alert.labels.get("cause", ""))
            inc = self.by_key.setdefault(key, Incident(*key))
            inc.since = alert.starts_at
            if not inc.members or render(inc).annotations != alert.annotations:
                self._dirty.add(key)
            else:
                self._dirty.discard(key)

    def retune(self, *, enabled: bool, min_chats: int, firing: Mapping[str, Alert]) -> None:
        """A reload's settings: turned off, every firing incident resolves at the next
        settle; turned on, the membership is rebuilt from what fires."""
        if min_chats != self.min_chats:
            self.min_chats = min_chats
            self._dirty.update(self.by_key)  # a lower threshold may fire one now
        if enabled == self.enabled:
            return
        self.enabled = enabled
        if enabled:
            self.restore(firing)
            return
        self._key_of.clear()
        for key, inc in self.by_key.items():
            inc.members.clear()
            self._dirty.add(key)

    def settle(self) -> tuple[list[Alert], list[str]]:
        """What the joins and leaves since the last settle changed: (incident alerts to
        fire, fingerprints of incidents to resolve)."""
        fire: list[Alert] = []
        resolve: list[str] = []
        for key in self._dirty:
            inc = self.by_key.get(key)
            if inc is None:
                continue
            if not inc.members:
                if inc.since is not None:
                    resolve.append(incident_fingerprint(*key))
                del self.by_key[key]
                continue
            if inc.since is None:
                if len(inc.members) < self.min_chats:
                    continue
                # When the min_chats-th member went past its budget (server time): the
                # same on every replica that sees the same members, whatever their order.
                starts = sorted(a.starts_at for a in inc.members.values())
                inc.since = starts[self.min_chats - 1]
            fire.append(render(inc))
        self._dirty.clear()
        return fire, resolve

    def firing(self) -> Iterable[Incident]:
        """The incidents firing now."""
        return (i for i in self.by_key.values() if i.since is not None)


def _key(alert: Alert) -> Key | None:
    # A member whose cause is still being read joins once it is known (or never, if the
    # read fails: it then pages as itself, the safe side).
    if alert.name not in MEMBERS or "cause_pending" in alert.annotations:
        return None
    cause = alert.labels.get("cause")
    return (alert.labels.get("deployment", ""), cause) if cause else None


def _count(inc: Incident, alert: Alert, n: int) -> None:
    labels = alert.labels
    for counts, key in (
        (inc.identities, labels.get("identity", "")),
        (inc.severities, labels.get("severity", "warning")),
    ):
        counts[key] += n
        if counts[key] <= 0:
            del counts[key]


def render(inc: Incident) -> Alert:
    """The FleetIncident alert of a firing incident, as its members stand now."""
    assert inc.since is not None
    count = len(inc.members)
    what, fix = WORDS.get(inc.cause, WORDS["unknown"])
    severity = max(inc.severities, key=lambda s: SEVERITY_RANK.get(s, 1), default="warning")
    first = list(islice(inc.members.values(), MAX_CHATS))
    return Alert(
        fingerprint=incident_fingerprint(inc.deployment, inc.cause),
        labels={
            "alertname": NAME,
            "deployment": inc.deployment,
            "cause": inc.cause,
            "severity": severity,
        },
        annotations={
            "summary": f"{count} {'chat' if count == 1 else 'chats'} {what}",
            "count": str(count),
            "identities": ",".join(sorted(inc.identities)),
            "chats": ",".join(a.labels.get("chat_id", "") for a in first),
            # The same members' links to Coder, space-separated, in the same order ("-"
            # for a member without one), so a receiver can link each member.
            "links": " ".join(a.annotations.get("link") or "-" for a in first),
            "hint": fix,
            "since": iso(inc.since),
        },
        starts_at=inc.since,
    )
