"""A chat tree's cost: read from coderd's GET …/chats/{chat}/cost for trees past budget
only, through a chat that resolves to the tree's root, bounded (count, rate, size, time),
off unless configured; ChatTreeCostHigh fires over the threshold and resolves when the
tree is no longer past budget."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from tests.conftest import Sim
from tests.fakes.hostile import endless, never_upgrades, serving
from tests.unit.test_client import client_for
from watchd.alerting.model import Alert
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError
from watchd.coder.observing import ChatId, Observation
from watchd.coder.transport import OversizeResponse, Transport
from watchd.config.model import Config
from watchd.config.watching import CostConfig
from watchd.kits.clock import ServerClock
from watchd.kits.redaction import REGISTRY
from watchd.sim.records import SimUser
from watchd.sim.scenarios import trees as tree_scenario
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.watching import costs
from watchd.watching.costs import TreeCosts, trees


class Alerts:
    """The ledger's side TreeCosts uses: firing alerts, raise once, clear."""

    def __init__(self) -> None:
        self.alerts: dict[str, Alert] = {}
        self.cleared: list[str] = []

    @property
    def firing(self) -> Mapping[str, Alert]:
        return self.alerts

    def raise_alert(self, alert: Alert, *, identity: str) -> None:
        self.alerts.setdefault(alert.fingerprint, alert)

    def clear_alert(self, fp: str, *, why: str) -> None:
        if self.alerts.pop(fp, None) is not None:
            self.cleared.append(why)

    def stuck(self, identity: str, chat_id: str) -> None:
        labels = {"alertname": "ChatStuck", "identity": identity, "chat_id": chat_id}
        self.alerts[f"stuck-{chat_id}"] = Alert(
            fingerprint=f"stuck-{chat_id}", labels=labels, starts_at=0.0
        )

    def costly(self) -> list[Alert]:
        return [a for a in self.alerts.values() if a.name == "ChatTreeCostHigh"]


def test_the_cost_alert_is_off_unless_configured_and_bad_values_say_why() -> None:
    """No threshold, no cost reads; "$2.50" is $2.50; a threshold that is not a positive
    dollar amount, and bounds out of range, are refused with the reason."""
    assert not Config.model_validate({"watching": False}).cost.enabled
    c = CostConfig.model_validate({"threshold_usd": "$2.50"})
    assert c.enabled and c.threshold_micros == 2_500_000
    for bad, said in (
        (-3, "must be more than $0"),
        (0, "must be more than $0"),
        (2_000_000, "at most $1,000,000"),
        ("abc", "not an amount of US dollars"),
        (True, "not an amount of US dollars"),
    ):
        with pytest.raises(ValidationError, match=re.escape(said)):
            CostConfig.model_validate({"threshold_usd": bad})
    with pytest.raises(ValidationError, match="below the minimum of 1s"):
        CostConfig.model_validate({"threshold_usd": 1, "interval": "100ms"})
    for key in ("max_trees", "reads_per_minute"):
        with pytest.raises(ValidationError, match=key):
            CostConfig.model_validate({"threshold_usd": 1, key: 0})


async def test_a_cost_read_is_one_small_attempt(sim: Sim, session: aiohttp.ClientSession) -> None:
    """The client reads a tree's four numbers; a 503 is not retried (one request)."""
    tree_scenario(sim.state)
    bob = sim.state.user("bob")
    pricey = next(c for c in sim.state.chats_of(bob.id) if c.title == "bob: pricey")
    client = client_for(sim, bob, session)
    got = await client.chat_cost(pricey.id)
    assert (got.chat_id, got.total_cost_micros, got.request_count) == (pricey.id, 12_000_000, 90)
    before = sim.state.requests
    sim.state.faults.error_rate, sim.state.faults.error_status = 1.0, 503
    with pytest.raises(CoderError, match="503"):
        await client.chat_cost(pricey.id)
    assert sim.state.requests == before + 1


def _hostile(url: str, session: aiohttp.ClientSession) -> CoderClient:
    return CoderClient(Transport(base_url=url, token="t", session=session), prefix="/api/v2")


async def test_a_cost_answer_that_never_ends_is_cut_small(session: aiohttp.ClientSession) -> None:
    """A cost answer is read to 4 KiB at most, then refused."""
    async with serving({"/api/v2/chats/{id}/cost": endless}) as url:
        with pytest.raises(OversizeResponse, match="4096-byte bound"):
            await _hostile(url, session).chat_cost("0b7c0000-0000-4000-8000-000000000001")


@pytest.mark.looptime
async def test_a_cost_read_that_never_answers_gives_up_in_ten_seconds(
    session: aiohttp.ClientSession,
) -> None:
    """A server that never answers a cost read is given up on after READ_TIMEOUT (virtual
    clock)."""
    async with serving({"/api/v2/chats/{id}/cost": never_upgrades}) as url:
        tree = costs.Tree("r", "0b7c0000-0000-4000-8000-000000000001", ("r",))
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await costs.read(_hostile(url, session), tree)
        assert loop.time() - start == pytest.approx(costs.READ_TIMEOUT, abs=0.1)


def _seen(store: ChatStore, chat_id: str, **fields: Any) -> None:
    obs = Observation(id=ChatId(chat_id), status="running", updated_at=1.0, **fields)
    store.observe("alice", obs, now=2.0, via="listing")


def test_a_tree_is_read_through_a_chat_coderd_resolves_to_its_root() -> None:
    """A parentless root is asked itself; a subagent's tree is its parent's, asked through
    the subagent; a chat-tree named chat (it has a parent) only through a subagent of it,
    else it is unreadable; a tree root is never read."""
    store = ChatStore()
    _seen(store, "root")
    _seen(store, "sub", parent_chat_id="root", root_chat_id="root")
    _seen(store, "named", parent_chat_id="treeroot", kind="chat")
    _seen(store, "named-sub", parent_chat_id="named", kind="subagent")
    _seen(store, "lonely", parent_chat_id="treeroot", kind="chat")
    _seen(store, "treeroot", kind="root")
    got = trees(store, "alice", ["root", "sub", "named", "lonely", "treeroot"])
    assert {k: (t.ask, t.stuck) for k, t in got.items()} == {
        "root": ("root", ("root", "sub")),
        "named": ("named-sub", ("named",)),
        "lonely": (None, ("lonely",)),
    }
    assert "answers for its parent" in got["lonely"].why


def _costs(sim: Sim, session: aiohttp.ClientSession, user: SimUser, **config: Any) -> TreeCosts:
    store = ChatStore()
    health = IdentityHealth(
        name="alice", deployment=sim.url, server_clock=ServerClock(), unhealthy_after=60
    )
    health.set_state("ready")
    return TreeCosts(
        health=health,
        client=client_for(sim, user, session),
        store=store,
        alerts=Alerts(),
        config=CostConfig.model_validate({"threshold_usd": 10, **config}),
        labels={"team": "b"},
    )


async def _listed(tc: TreeCosts) -> None:
    chats = await tc.client.list_chats()
    tc.store.apply_listing("alice", chats, now=time.time(), started=time.time())


@pytest.mark.looptime
async def test_a_costly_stuck_tree_fires_once_and_resolves_when_no_longer_stuck(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """bob's $12 stuck tree fires ChatTreeCostHigh (with description, runbook and totals),
    his $1 one does not; a firing tree is not read again; when its chat is no longer past
    budget the alert resolves. Chats not past budget are never read."""
    tree_scenario(sim.state)
    bob = sim.state.user("bob")
    by_title = {c.title: c for c in sim.state.chats_of(bob.id)}
    tc = _costs(sim, session, bob)
    await _listed(tc)
    alerts = tc.alerts
    assert isinstance(alerts, Alerts)
    cost_reads = sim.state.requests_by_user["bob"]
    await tc.check()
    assert "other" not in cost_reads  # nothing past budget: nothing read
    for title in ("bob: pricey", "bob: cheap"):
        alerts.stuck("alice", by_title[title].id)
    await tc.check()
    (alert,) = alerts.costly()
    assert alert.labels["chat_id"] == by_title["bob: pricey"].id
    assert alert.labels["team"] == "b" and alert.labels["severity"] == "warning"
    ann = alert.annotations
    assert ann["total_cost_usd"] == "12.00" and ann["request_count"] == "90"
    assert ann["runbook_url"] == "docs/runbooks.md#chattreecosthigh" and ann["description"]
    assert "bob: pricey" in ann["summary"] and "$12.00" in ann["summary"]
    reads = sum(cost_reads["other"].values())
    await tc.check()
    assert sum(cost_reads["other"].values()) == reads + 1  # the cheap one only
    del alerts.alerts[f"stuck-{by_title['bob: pricey'].id}"]
    await tc.check()
    assert alerts.costly() == [] and alerts.cleared == ["no chat of the tree is past its budget"]


@pytest.mark.looptime
async def test_cost_reads_are_bounded_per_pass_and_per_minute(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Five stuck trees with max_trees 2 and 60 reads a minute: a pass reads two, a second
    apart on the virtual clock, the least recently read first."""
    user = sim.state.add_user("carol")
    chats = [sim.state.add_chat(user, status="running", age=600) for _ in range(5)]
    for c in chats:
        c.spend_micros = 1_000_000
    tc = _costs(sim, session, user, max_trees=2, reads_per_minute=60)
    await _listed(tc)
    assert isinstance(tc.alerts, Alerts)
    for c in chats:
        tc.alerts.stuck("alice", c.id)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await tc.check()
    first = dict(tc.read_at)
    assert len(first) == 2 and loop.time() - start >= 1.0
    await tc.check()
    assert len(tc.read_at) == 4 and not set(first) & (set(tc.read_at) - set(first))


async def test_a_failed_cost_read_says_why_without_the_token(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A server that echoes the request's token into its error: scan --cost's entry says
    the read failed, and the token (registered, as resolving the config does) is not in
    it."""
    tree_scenario(sim.state)
    bob = sim.state.user("bob")
    REGISTRY.add(bob.token)
    client = client_for(sim, bob, session)
    store = ChatStore()
    store.apply_listing("alice", await client.list_chats(), now=time.time(), started=time.time())
    sim.state.faults.echo_token, sim.state.faults.error_rate = True, 1.0
    ids = [c.id for c in sim.state.chats_of(bob.id)]
    got = await costs.scan_costs(client, store, "alice", ids, limit=1, threshold_micros=None)
    assert [e["error"] for e in got][1] == "not read: a scan reads at most 1 trees"
    said = str(got[0]["error"])
    assert said.startswith("read failed: GET /api/v2/chats/") and "500" in said
    assert bob.token not in said
