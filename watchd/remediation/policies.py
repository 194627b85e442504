"""Which sweep policy applies to a chat now: pure, shared by the sweeper and ``scan``.

First match wins, on the server's clock. ``requires_action`` chats never match
(the pause may be the only record of a committed client-tool effect), nor does a
chat-tree root (``kind: root``: coderd never archives it), and an ``orchestrator``
chat (one long-lived chat per user) matches only a policy that names it with a
``mode`` matcher.
"""

from __future__ import annotations

from collections.abc import Mapping

from watchd.config.sweep import SweepConfig, SweepPolicy
from watchd.kits.matchers import Matcher, all_match, parse_matchers
from watchd.store.records import ChatRecord

# A policy with its matchers parsed once, not once per chat per pass.
Compiled = list[tuple[SweepPolicy, tuple[Matcher, ...]]]


def compile_policies(config: SweepConfig) -> Compiled:
    return [(p, parse_matchers(p.matchers)) for p in config.policies]


# A client-tool pause may be the only record of a committed effect; a paused chat's
# owner is editing a queued message.
LEFT_ALONE = frozenset({"requires_action", "paused"})


def match_policy(
    policies: Compiled,
    rec: ChatRecord,
    *,
    now: float,
    labels: Mapping[str, str],
) -> SweepPolicy | None:
    """The first policy that applies to a chat now (never for requires_action or
    paused, never a chat-tree root). Pure."""
    if rec.status in LEFT_ALONE or rec.kind == "root":
        return None
    all_labels = {
        **labels,
        "identity": rec.identity,
        "owner": rec.owner,
        "status": rec.status,
        "chat_id": rec.chat_id,
        "mode": rec.mode,
        **{f"chat_label_{k}": v for k, v in rec.labels},
    }
    orchestrator = rec.mode == "orchestrator"
    for policy, matchers in policies:
        if orchestrator and not any(m.name == "mode" for m in matchers):
            continue  # an orchestrator is swept only by a policy that names it
        if (
            rec.status in policy.status
            and now - rec.since >= policy.older_than
            and all_match(matchers, all_labels)
        ):
            return policy
    return None
