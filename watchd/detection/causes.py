"""The ``cause`` label of a chat alert: the diagnosis as one word of a closed vocabulary.

fleet.md §1: the ``hint`` annotation keeps the words for people; this label is for
routing, grouping, inhibition and counting (FleetIncident groups by it). Pure: the
facts are gathered by the caller, as for :func:`watchd.detection.diagnosis.hint`. The
evidence each cause rests on is in docs/alerting.md ("Causes").
"""

from __future__ import annotations

from typing import Literal, get_args

from watchd.detection.diagnosis import Facts

Cause = Literal[
    "stranded_tool",
    "provider",
    "usage_limit",
    "capacity",
    "quota",
    "build_failed",
    "build_pending",
    "agent_unhealthy",
    "interrupt_stuck",
    "unknown",
]
# In the order of precedence: the first that matches a chat is its cause.
CAUSES: tuple[Cause, ...] = get_args(Cause)

# The causes a chat's record alone decides ahead of ``capacity``: a capacity flag learned
# after an alert fired (a listing never carries it) does not move them.
ABOVE_CAPACITY: frozenset[Cause] = frozenset({"stranded_tool", "provider", "usage_limit"})

# last_error kinds that come from the model provider's side (chaterror.Classify; the
# older startup_timeout too). usage_limit is its own cause; hook_* and generic are not
# the provider's doing as far as coderd can tell, so they fall through.
PROVIDER_KINDS = frozenset(
    {
        "overloaded",
        "rate_limit",
        "timeout",
        "startup_timeout",
        "stream_silence_timeout",
        "auth",
        "config",
        "missing_key",
        "provider_disabled",
        "content_filter",
    }
)
# A workspace build still queued in (or held by) the provisioner: the build's own status
# (pending, starting) or its job's (pending, running). A build whose status is "running"
# is a started workspace, not a running job.
PENDING_BUILD = frozenset({"pending", "starting"})
PENDING_JOB = frozenset({"pending", "running"})


def cause(facts: Facts) -> Cause:
    """The chat's cause, the first row of fleet.md §1's table that matches."""
    rec = facts.record
    if rec.status == "requires_action":
        return "stranded_tool"
    if rec.status == "error" and rec.last_error is not None:
        kind = rec.last_error.kind
        if kind in PROVIDER_KINDS:
            return "provider"
        if kind == "usage_limit":
            return "usage_limit"
    if rec.queued_for_capacity:
        return "capacity"
    build = facts.build
    failed = build is not None and (build.status == "failed" or build.job_status == "failed")
    pending = build is not None and (
        build.status in PENDING_BUILD or (not failed and build.job_status in PENDING_JOB)
    )
    if build is not None and build.quota_failed:
        return "quota"
    quota = facts.quota
    if pending and quota is not None and quota.headroom is not None and quota.headroom <= 0:
        return "quota"
    if failed:
        return "build_failed"
    if pending:
        return "build_pending"
    if build is not None and any(a.unhealthy for a in build.agents):
        return "agent_unhealthy"
    if rec.status == "interrupting":
        return "interrupt_stuck"
    return "unknown"
