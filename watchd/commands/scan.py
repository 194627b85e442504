"""``watchd scan``: one listing pass per identity, and what would alert.

Read-only: nothing is sent to receivers and nothing is written. Chats past budget
are grouped by their ``cause`` (the label a chat alert would carry: fleet.md §1), each
cause with its fix once, in the order of precedence. Without the
daemon's history, every clock is a lower bound from ``updated_at`` (a scan
can under-report how long a chat has been stuck, never over-report). Each
identity's quota is read once and shown; one reading cannot fit a trend, so
the scan says so instead of guessing a rate or a forecast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.models import ACTIVE_STATUSES, BLOCKED_STATUSES, WorkspaceBuild
from watchd.coder.transport import Transport
from watchd.commands.configuring import load_config_or_report
from watchd.config.fields import format_duration
from watchd.config.model import Config
from watchd.config.secrets import ResolvedSecrets, resolve_secrets
from watchd.config.watching import IdentityConfig, QuotaConfig
from watchd.detection.budgets import past_budget
from watchd.detection.causes import CAUSES, cause
from watchd.detection.diagnosis import Facts, hint
from watchd.detection.incidents import WORDS
from watchd.kits.clock import ServerClock
from watchd.kits.redaction import REGISTRY
from watchd.remediation.policies import compile_policies, match_policy
from watchd.store.chats import ChatStore
from watchd.store.records import ChatRecord
from watchd.watching.costs import scan_costs

# Diagnosis costs up to three requests per chat; past this many stuck chats per
# identity the scan reports them without a hint rather than hammer Coder.
DIAGNOSE_LIMIT = 25
NO_TREND = (
    "one pass cannot fit a trend: no rate or forecast from a scan "
    "(the daemon fits one over forecast.window)"
)


@dataclass
class ScanResult:
    identity: str
    deployment: str
    chats: int = 0
    error: str = ""
    quota: dict[str, Any] | None = None
    stuck: list[dict[str, Any]] = field(default_factory=list)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    # cause -> chats past budget with it, in the order of precedence (CAUSES).
    by_cause: dict[str, int] = field(default_factory=dict)
    # With --cost: what each stuck chat's tree has cost (None: not asked).
    costs: list[dict[str, Any]] | None = None


async def read_quota(client: CoderClient, config: QuotaConfig) -> dict[str, Any] | None:
    """The identity's quota, read once (None when quota watching is off)."""
    if not config.enabled:
        return None
    try:
        org = config.organization
        if org is None:
            me = await client.me()
            if not me.organization_ids:
                return {"state": "unavailable", "note": "the token's user belongs to no org"}
            org = me.organization_ids[0]
        quota = await client.workspace_quota(org, config.user)
    except (CoderError, PayloadError) as exc:
        return {"state": "error", "error": str(exc)}
    if quota is None:
        return {"state": "unavailable", "note": "no workspace quota on this deployment"}
    if quota.unlimited:
        return {"state": "unlimited", "budget": -1, "consumed": quota.credits_consumed}
    return {
        "state": "ok",
        "budget": quota.budget,
        "consumed": quota.credits_consumed,
        "headroom": quota.headroom,
        "rate_per_hour": None,
        "forecast": None,
        "note": NO_TREND,
    }


def quota_line(q: dict[str, Any]) -> str:
    if q["state"] == "ok":
        return (
            f"  quota: {q['consumed']} of {q['budget']} credits used, {q['headroom']} left; "
            f"{q['note']}"
        )
    if q["state"] == "unlimited":
        return f"  quota: no budget (-1), {q['consumed']} credits used"
    return f"  quota: {q['state']}: {q.get('error') or q.get('note', '')}"


async def scan_identity(
    config: Config,
    secrets: ResolvedSecrets,
    name: str,
    session: aiohttp.ClientSession,
    *,
    cost: bool = False,
) -> ScanResult:
    ident = next(i for i in config.identities if i.name == name)
    result = ScanResult(identity=name, deployment=ident.url)
    if name not in secrets.tokens:
        problem = next((p for p in secrets.problems if f"({name})" in p), "token unavailable")
        result.error = problem
        return result
    clock = ServerClock()
    transport = Transport(
        base_url=ident.url,
        token=secrets.tokens[name].get_secret_value(),
        session=session,
        identity=name,
        server_clock=clock,
    )
    client = CoderClient(transport, attempts=3, deadline=30.0, page_size=ident.page_size)
    budgets = config.budgets_for(ident)
    store = ChatStore()
    builds: dict[str, WorkspaceBuild] = {}  # one read per workspace, shared by its chats
    try:
        chats = await client.list_chats()
    except (CoderError, PayloadError) as exc:
        result.error = str(exc)
        return result
    result.chats = len(chats)
    result.quota = await read_quota(client, config.quota)
    now = clock.now()
    store.apply_listing(name, chats, now=now, started=now)
    for rec in store.records(name):
        over = past_budget(budgets, rec, now=now)
        if over is None:
            continue
        age, limit = over.age, over.budget
        entry: dict[str, Any] = {
            "chat_id": rec.chat_id,
            "title": rec.title,
            "status": rec.status,
            "alertname": over.alert,
            "time_in_status_seconds": round(age),
            "time_in_status": format_duration(age),
            "budget": format_duration(limit),
            "clock": "lower_bound",
            "owner": rec.owner,
            "workspace_id": rec.workspace_id,
            "link": config.chat_link_template.format(deployment=ident.url, chat_id=rec.chat_id),
        }
        facts = Facts(record=rec)
        if len(result.stuck) < DIAGNOSE_LIMIT:
            try:
                facts = await _diagnose(client, store, name, rec, clock=clock, builds=builds)
                entry["hint"] = hint(facts)
                entry["queued_for_capacity"] = bool(facts.record.queued_for_capacity)
            except (CoderError, PayloadError) as exc:
                entry["hint"] = f"(diagnosis unavailable: {exc})"
        else:
            entry["diagnosed"] = False
        entry["cause"] = cause(facts)
        result.stuck.append(entry)
    rank = {c: i for i, c in enumerate(CAUSES)}
    result.stuck.sort(
        key=lambda e: (rank.get(e["cause"], len(rank)), -int(e["time_in_status_seconds"]))
    )
    counts = Counter(e["cause"] for e in result.stuck)
    result.by_cause = {c: counts[c] for c in CAUSES if counts[c]}
    if cost:
        threshold = config.cost.threshold_micros if config.cost.enabled else None
        past = [e["chat_id"] for e in result.stuck]
        result.costs = await scan_costs(
            client, store, name, past, limit=DIAGNOSE_LIMIT, threshold_micros=threshold
        )
    result.sweep = sweep_preview(config, ident, store, now=now)
    return result


async def _diagnose(
    client: CoderClient,
    store: ChatStore,
    name: str,
    rec: ChatRecord,
    *,
    clock: ServerClock,
    builds: dict[str, WorkspaceBuild],
) -> Facts:
    """A stuck chat's GET (for ``queued_for_capacity``) and its workspace's latest build
    (read once per workspace)."""
    chat = await client.get_chat(rec.chat_id)
    store.observe(name, chat, now=clock.now(), via="confirm")
    fresh = store.get(name, rec.chat_id) or rec
    ws = fresh.workspace_id
    build = None
    if ws and fresh.status not in BLOCKED_STATUSES:
        build = builds.get(ws)
        if build is None:
            build = builds[ws] = await client.workspace(ws)
    return Facts(record=fresh, build=build)


def sweep_preview(
    config: Config, ident: IdentityConfig, store: ChatStore, *, now: float
) -> list[dict[str, Any]]:
    """What the sweep would do to the identity's chats (nothing is done)."""
    policies = compile_policies(config.sweep)
    out: list[dict[str, Any]] = []
    for rec in store.records(ident.name):
        policy = match_policy(policies, rec, now=now, labels=ident.labels)
        if policy is not None:
            action = (
                policy.action
                if rec.status in ACTIVE_STATUSES or policy.action == "archive"
                else "archive"
            )
            out.append(
                {
                    "chat_id": rec.chat_id,
                    "title": rec.title,
                    "status": rec.status,
                    "policy": policy.name,
                    "would": action,
                }
            )
    return out


async def scan(config: Config, secrets: ResolvedSecrets, *, cost: bool = False) -> list[ScanResult]:
    async with aiohttp.ClientSession() as session:
        return list(
            await asyncio.gather(
                *(
                    scan_identity(config, secrets, i.name, session, cost=cost)
                    for i in config.identities
                )
            )
        )


def exit_code(results: list[ScanResult]) -> int:
    """1 when anything is stuck (even if another identity failed: that one is reported),
    2 only when no identity could be scanned, else 0."""
    if any(r.stuck for r in results):
        return 1
    if results and all(r.error for r in results):
        return 2
    return 0


def render(results: list[ScanResult]) -> str:
    lines = [f"watchd scan at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"]
    for r in results:
        if r.error:
            lines.append(f"\n{r.identity} ({r.deployment}): COULD NOT SCAN: {r.error}")
            continue
        lines.append(
            f"\n{r.identity} ({r.deployment}): {r.chats} chats, {len(r.stuck)} past budget"
        )
        if r.quota is not None:
            lines.append(quota_line(r.quota))
        group = None
        for s in r.stuck:
            if s["cause"] != group:
                group = s["cause"]
                what, fix = WORDS.get(group, WORDS["unknown"])
                lines.append(f"  cause {group} ({r.by_cause[group]}): {what}")
                lines.append(f"    fix: {fix}")
            lines.append(
                f"    {s['alertname']:<13} {s['status']:<16} {s['time_in_status']:>8} "
                f"(budget {s['budget']})  {s['title'][:60]!r}  {s['chat_id']}"
            )
            if s.get("hint"):
                lines.append(f"        hint: {s['hint']}")
            elif s.get("diagnosed") is False:
                lines.append(f"        (not diagnosed: only the first {DIAGNOSE_LIMIT} are)")
        lines.extend(cost_lines(r.costs))
        for w in r.sweep:
            lines.append(
                f"  sweep would {w['would']:<22} {w['status']:<12} "
                f"{w['title'][:50]!r} (policy {w['policy']})  {w['chat_id']}"
            )
    return "\n".join(lines)


def cost_lines(costs: list[dict[str, Any]] | None) -> list[str]:
    """``--cost``'s lines: each stuck tree's spend, or why it was not read."""
    out = []
    for c in costs or []:
        if "error" in c:
            out.append(f"  tree cost     {c['error']}  {c['tree']}")
            continue
        over = "  OVER cost.threshold_usd" if c["over_threshold"] else ""
        out.append(
            f"  tree cost     ${c['total_cost_usd']:,.2f} ({c['request_count']} requests, "
            f"{c['unpriced_request_count']} unpriced){over}  {c['tree']}"
        )
    return out


def main(args: argparse.Namespace) -> int:
    config = load_config_or_report(args)
    if config is None:
        return 2
    # Tokens only: a receiver's secret has nothing to do with listing chats, and an
    # identity whose token is unavailable is reported while the others are scanned.
    secrets = resolve_secrets(config, receivers=(), server=False, strict=False)
    results = asyncio.run(scan(config, secrets, cost=getattr(args, "cost", False)))
    # Last line of defence: whatever a server echoed (a token in an error) is scrubbed.
    if args.json:
        fleet: Counter[str] = Counter()
        for r in results:
            fleet.update(r.by_cause)
        doc = {
            "results": [asdict(r) for r in results],
            "causes": {c: fleet[c] for c in CAUSES if fleet[c]},
        }
        print(REGISTRY.scrub(json.dumps(doc, indent=1)))
    else:
        print(REGISTRY.scrub(render(results)))
    return exit_code(results)
