"""The sweep against the simulator: what coderd's answers to its mutations mean
(reconcile-invalid's; a family's refusals are tests/unit/test_sweep_families.py's)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from pydantic import ValidationError

from tests.conftest import Sim
from tests.unit.test_client import client_for
from watchd.coder.client import CoderClient
from watchd.coder.observing import ChatId, Observation
from watchd.config.sweep import SweepConfig, SweepPolicy
from watchd.config.watching import Budgets
from watchd.detection.detector import Detector
from watchd.kits.clock import ServerClock
from watchd.remediation.recovering import recover
from watchd.remediation.sweeper import Sweeper
from watchd.sim.records import SimChat
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.sqlite import StateFile

SAID = "execution state invalid: coderd answered 409 'Chat is in an invalid state.'"


async def _now() -> None:
    return None


async def test_a_chat_that_healed_is_reread_and_left_not_given_up(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """409 "Chat is not in an invalid state." means the chat healed: it is read again and
    the outcome is healed, naming its status now, not gave_up."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    client = client_for(sim, alice, session)
    out = await recover(client, chat.id, said=SAID, opted_in=True, acquire=_now)
    assert out.state == "healed" and "now running" in out.detail
    assert sim.state.mutations == [("reconcile_invalid", chat.id, 409)]


async def test_a_404_is_about_the_chat(sim: Sim, session: aiohttp.ClientSession) -> None:
    """A 404 from reconcile-invalid for a chat hidden from the caller ends that chat's
    recovery as gone or hidden."""
    alice, bob = sim.state.add_user("alice"), sim.state.add_user("bob")
    chat = sim.state.add_chat(bob, status="running")
    chat.invalid_state = True
    out = await recover(
        client_for(sim, alice, session), chat.id, said=SAID, opted_in=True, acquire=_now
    )
    assert out.state == "gave_up" and "hidden" in out.detail


@pytest.mark.parametrize("era", ["D"])
async def test_one_404_never_switches_recovery_off_for_the_identity(
    sim: Sim, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """On a server that answers 404 for chats it can read, every invalid chat gets its own
    reconcile-invalid call and its own 'reconcile it by hand' record."""
    alice = sim.state.add_user("alice")
    chats = [sim.state.add_chat(alice, status="running", age=60) for _ in range(2)]
    for c in chats:
        c.invalid_state = True
    det, db, sweeper = _sweeper(sim, client_for(sim, alice, session), tmp_path, chats, "interrupt")
    try:
        await sweeper.sweep_once()
    finally:
        await det.unregister("alice", reason="test over")
        db.close()
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert sorted(x["chat_id"] for x in lines) == sorted(c.id for c in chats)
    for line in lines:
        assert line["state"] == "invalid"
        assert "reconcile-invalid answered 404 for a chat this token can read" in line["detail"]


def test_paused_chats_are_never_swept() -> None:
    """A policy naming paused is refused, with the reason."""
    with pytest.raises(ValidationError, match="never swept"):
        SweepPolicy.model_validate(
            {"name": "p", "status": ["paused"], "older_than": "1h", "action": "archive"}
        )


def _sweeper(
    sim: Sim, client: CoderClient, tmp: Path, chats: list[SimChat], action: str
) -> tuple[Detector, StateFile, Sweeper]:
    """A real sweep (not dry, reconcile_invalid on) over ``chats`` as alice's store holds
    them, with one policy: ``action`` on chats in their status for over a second."""
    store = ChatStore()
    for c in chats:
        seen = Observation(id=ChatId(c.id), status=c.status, updated_at=1.0)
        store.observe("alice", seen, now=2.0, via="listing")
    health = IdentityHealth(
        name="alice", deployment=sim.url, server_clock=ServerClock(), unhealthy_after=60
    )
    health.set_state("ready")
    db = StateFile(tmp / "state.db")
    det = Detector(store=store, sink=None, db=db)  # type: ignore[arg-type]
    det.register(health, confirmer=None, budgets=Budgets(running=3600), labels={})  # type: ignore[arg-type]
    statuses = sorted({c.status for c in chats})
    config = SweepConfig.model_validate(
        {
            "enabled": True,
            "dry_run": False,
            "reconcile_invalid": True,
            "policies": [{"name": "p", "status": statuses, "older_than": "1s", "action": action}],
        }
    )
    sweeper = Sweeper(
        config=config,
        store=store,
        health={"alice": health},
        clients=lambda _n: client,
        db=db,
        ledger=det.ledger,
        audit_path=tmp / "audit.jsonl",
        labels=lambda _n: {},
    )
    return det, db, sweeper
