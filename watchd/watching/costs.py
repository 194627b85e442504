"""What chat trees past their budgets have cost, and the ChatTreeCostHigh alert.

coderd answers ``GET …/chats/{chat}/cost`` (``getChatCost``) with AI Gateway's spend
for the chat's whole tree (its root and every subagent beneath it), resolving the chat
asked about to its ``root_chat_id``, else its parent, else itself. So a tree is read
once, through a chat that resolves to its root: a subagent (coderd resolves it to its
root), or the root itself when it has no parent. Under the ``chat-tree`` experiment (in
flight upstream) a named chat has a parent, its tree root or the named chat above, and
coderd's resolution would answer for that parent instead: such a tree is read through
one of its subagents, or not at all (said, never guessed).

Only trees with a chat past its budget (ChatStuck, ChatStranded or ChatStalled firing)
are read, and boundedly: ``cost.max_trees`` per pass, ``cost.reads_per_minute`` per
identity, one attempt each with a deadline and a small answer (the client's cap), every
``cost.interval``. A tree over ``cost.threshold_usd`` fires ChatTreeCostHigh; the alert
resolves when none of its chats is past budget any more. Off unless a threshold is
configured. Nothing here is secret: the answer is four numbers and an id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.models import ChatCost
from watchd.config.watching import CostConfig
from watchd.kits import logs
from watchd.kits.ratelimit import RateLimiter
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.records import ChatRecord
from watchd.watching.forecasting import AlertLedger

log = logs.get("watchd.cost")

ALERTNAME = "ChatTreeCostHigh"
# Chats past a budget: what a cost read is spent on, and nothing else.
PAST_BUDGET = frozenset({"ChatStuck", "ChatStranded", "ChatStalled"})
# One cost read may take this long (it is one attempt; a slow one waits for a later pass).
READ_TIMEOUT = 10.0
# Chats named in an alert's annotation, at most.
NAMED = 10
RUNBOOK = "docs/runbooks.md#chattreecosthigh"
UNREADABLE = (
    "a chat-tree named chat's own cost read answers for its parent (coderd resolves "
    "root_chat_id, else parent_chat_id), and no subagent of it is known to read it through"
)


@dataclass(frozen=True, slots=True)
class Tree:
    """A tree to read: its root (the alert's chat), the chat to ask (None: unreadable,
    ``why``), and its chats past budget."""

    root: str
    ask: str | None
    stuck: tuple[str, ...]
    why: str = ""


def trees(store: ChatStore, identity: str, chat_ids: Iterable[str]) -> dict[str, Tree]:
    """The trees ``chat_ids`` belong to, each with the chat its cost is read through."""
    records = {r.chat_id: r for r in store.records(identity)}
    stuck: dict[str, list[str]] = {}
    for chat_id in chat_ids:
        rec = records.get(chat_id)
        if rec is not None and rec.kind != "root":  # a tree root spends nothing
            stuck.setdefault(_root(records, rec), []).append(chat_id)
    out = {}
    for root, ids in stuck.items():
        ask = _ask(records, root, ids)
        out[root] = Tree(root, ask, tuple(ids), "" if ask else UNREADABLE)
    return out


def _ask(records: Mapping[str, ChatRecord], root: str, stuck: list[str]) -> str | None:
    """The chat coderd resolves to ``root``: the root itself when it has no parent, else
    a subagent of it (a stuck one first), else none."""
    rec = records.get(root)
    if rec is not None and rec.parent_id is None:
        return root
    sub = next((c for c in stuck if c != root), None)
    if sub is not None:
        return sub
    return next((r.chat_id for r in records.values() if r.parent_id == root and _subagent(r)), None)


def _subagent(rec: ChatRecord) -> bool:
    return rec.kind == "subagent" or (not rec.kind and rec.parent_id is not None)


def _root(records: Mapping[str, ChatRecord], rec: ChatRecord) -> str:
    """The chat a subagent's tree hangs off (its parent, up through subagents); any
    other chat is its own tree's root."""
    node = rec
    for _ in range(8):  # subagents nest shallowly; a cycle in stale data ends here
        if not _subagent(node) or node.parent_id is None:
            break
        parent = records.get(node.parent_id)
        if parent is None:
            return node.parent_id
        node = parent
    return node.chat_id


async def read(client: CoderClient, tree: Tree) -> ChatCost:
    """One tree's cost: one attempt, READ_TIMEOUT at most (CoderError, PayloadError or
    TimeoutError otherwise)."""
    assert tree.ask is not None
    async with asyncio.timeout(READ_TIMEOUT):
        return await client.chat_cost(tree.ask)


class TreeCosts:
    """ChatTreeCostHigh for one identity: a pass every ``cost.interval`` while it is
    ready."""

    def __init__(
        self,
        *,
        health: IdentityHealth,
        client: CoderClient,
        store: ChatStore,
        alerts: AlertLedger,
        config: CostConfig,
        labels: Mapping[str, str],
    ) -> None:
        self.health = health
        self.client = client
        self.store = store
        self.alerts = alerts
        self.config = config
        self.labels = dict(labels)
        self.limiter = RateLimiter(rate=config.reads_per_minute / 60.0, burst=1)
        # Tree root → when it was last read (server clock), so the oldest read goes first.
        self.read_at: dict[str, float] = {}
        # Trees said unreadable (said once per episode).
        self.said: set[str] = set()

    async def run(self) -> None:
        while True:
            if self.health.ready:
                await self.check()
            await asyncio.sleep(self.config.interval)

    def _mine(self) -> list[tuple[str, Alert]]:
        name = self.health.name
        return [(fp, a) for fp, a in self.alerts.firing.items() if a.labels.get("identity") == name]

    async def check(self) -> None:
        """One pass: resolve trees no longer past budget, read the rest (bounded)."""
        mine = self._mine()
        past = {a.labels.get("chat_id", "") for _, a in mine if a.name in PAST_BUDGET}
        found = trees(self.store, self.health.name, sorted(past))
        firing = {a.labels.get("chat_id", ""): fp for fp, a in mine if a.name == ALERTNAME}
        for root, fp in firing.items():
            if root not in found:
                self.alerts.clear_alert(fp, why="no chat of the tree is past its budget")
        for gone in set(self.read_at) - found.keys():
            del self.read_at[gone]
        self.said &= found.keys()
        due = [t for t in found.values() if t.root not in firing]
        due.sort(key=lambda t: self.read_at.get(t.root, 0.0))
        for tree in due[: self.config.max_trees]:
            await self._one(tree)

    async def _one(self, tree: Tree) -> None:
        h = self.health
        if tree.ask is None:
            if tree.root not in self.said:
                self.said.add(tree.root)
                log.info("cost.unreadable", identity=h.name, chat_id=tree.root, why=tree.why)
            return
        await self.limiter.acquire()
        self.read_at[tree.root] = h.server_clock.now()
        try:
            cost = await read(self.client, tree)
        except (CoderError, PayloadError, TimeoutError) as exc:
            log.info("cost.read_failed", identity=h.name, chat_id=tree.root, error=str(exc))
            return
        if cost.total_cost_micros > self.config.threshold_micros:
            self.alerts.raise_alert(self.alert(tree, cost), identity=h.name)

    def alert(self, tree: Tree, cost: ChatCost) -> Alert:
        h = self.health
        rec = self.store.get(h.name, tree.root)
        title = rec.title if rec else ""
        limit = self.config.threshold_usd or 0.0
        named = ", ".join(tree.stuck[:NAMED]) + (" …" if len(tree.stuck) > NAMED else "")
        return Alert(
            fingerprint=fingerprint(h.deployment, tree.root, ALERTNAME),
            labels={
                **self.labels,
                "alertname": ALERTNAME,
                "identity": h.name,
                "deployment": h.deployment,
                "chat_id": tree.root,
                "severity": "warning",
                "status": "cost",
            },
            starts_at=time.time(),
            annotations={
                "summary": f'Chat tree "{title or tree.root}" has cost ${cost.usd:,.2f} '
                f"(over ${limit:,.2f}) while a chat in it is past its budget",
                "description": "A chat tree (a root chat and its subagents) has cost more "
                "than cost.threshold_usd in AI Gateway spend, and at least one of its chats "
                "is past its status budget: it may be spending on a turn that is not "
                "getting anywhere.",
                "runbook_url": RUNBOOK,
                "title": title,
                "total_cost_usd": f"{cost.usd:.2f}",
                "total_cost_micros": str(cost.total_cost_micros),
                "request_count": str(cost.request_count),
                "unpriced_request_count": str(cost.unpriced_request_count),
                "threshold_usd": f"{limit:.2f}",
                "past_budget": named,
                "hint": "interrupt the stuck chat (or let the sweep) before it spends more; "
                "requests on unpriced models are not in the total",
            },
        )


async def scan_costs(
    client: CoderClient,
    store: ChatStore,
    identity: str,
    chat_ids: Iterable[str],
    *,
    limit: int,
    threshold_micros: int | None,
) -> list[dict[str, object]]:
    """``watchd scan --cost``: the tree of each chat in ``chat_ids`` (those past budget),
    read once each, ``limit`` trees at most (the rest said, not read)."""
    out: list[dict[str, object]] = []
    for i, tree in enumerate(trees(store, identity, chat_ids).values()):
        entry: dict[str, object] = {"tree": tree.root, "past_budget": list(tree.stuck)}
        if i >= limit:
            entry["error"] = f"not read: a scan reads at most {limit} trees"
        elif tree.ask is None:
            entry["error"] = f"unreadable: {tree.why}"
        else:
            try:
                cost = await read(client, tree)
            except (CoderError, PayloadError, TimeoutError) as exc:
                entry["error"] = f"read failed: {exc or 'timed out'}"
            else:
                entry.update(
                    total_cost_usd=round(cost.usd, 6),
                    request_count=cost.request_count,
                    unpriced_request_count=cost.unpriced_request_count,
                    over_threshold=threshold_micros is not None
                    and cost.total_cost_micros > threshold_micros,
                )
        out.append(entry)
    return out
