"""The simulated workspace quota, as coderd's ``workspace-quota`` route reports it.

coderd sums the daily cost of the user's workspaces (``credits_consumed``) against the
allowance of their groups (``budget``, -1 without the licensed feature). A fleet that
keeps starting workspaces shows as consumption that rises between reads: the admin
route can set a steady rise (``rise_per_minute``), which this module turns into whole
credits at each read, on the simulated server's clock, and never past the budget (a
build that would pass it fails with INSUFFICIENT_QUOTA instead).
"""

from __future__ import annotations

import math
from typing import Any

from watchd.sim.records import SimUser


def consumed(user: SimUser, now: float) -> int:
    """``credits_consumed`` as a read at ``now`` would see it."""
    if not user.rise_per_minute:
        return user.credits_consumed
    grown = user.credits_consumed + math.floor(user.rise_per_minute * (now - user.rise_since) / 60)
    if user.quota_budget >= 0:
        grown = min(grown, max(user.quota_budget, user.credits_consumed))
    return max(0, grown)


def configure(user: SimUser, body: dict[str, Any], now: float) -> dict[str, Any]:
    """Apply an admin body (``budget``, ``consumed``, ``rise_per_minute``); what a read
    sees now. A rise starts from the consumption of this moment."""
    user.credits_consumed = consumed(user, now)
    user.rise_since = now
    if "budget" in body:
        user.quota_budget = int(body["budget"])
    if "consumed" in body:
        user.credits_consumed = int(body["consumed"])
    if "rise_per_minute" in body:
        user.rise_per_minute = float(body["rise_per_minute"])
    return {
        "budget": user.quota_budget,
        "consumed": consumed(user, now),
        "rise_per_minute": user.rise_per_minute,
    }
