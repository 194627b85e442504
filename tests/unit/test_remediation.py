"""Quota thresholds, sweep policy matching, and the simulator's concurrency cap."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import Sim
from watchd.coder.observing import ChatId, Observation
from watchd.config.fields import ConfigError
from watchd.config.loading import parse_config
from watchd.config.sweep import SweepConfig
from watchd.config.watching import QuotaConfig
from watchd.remediation.policies import compile_policies, match_policy
from watchd.store.chats import ChatStore


@pytest.mark.parametrize(
    ("low", "budget", "threshold"),
    [("10%", 200, 20.0), ("25", 200, 25.0), ("10%", -1, None), (None, 100, None)],
)
def test_quota_threshold(low: str | None, budget: int, threshold: float | None) -> None:
    """Thresholds are credits or a percentage of the budget; budget -1 has none."""
    assert QuotaConfig(low=low).threshold(budget) == threshold


def test_quota_threshold_validation() -> None:
    """A threshold that is neither a number nor a percentage is rejected at load."""
    with pytest.raises(ConfigError, match=r"quota\.low"):
        parse_config(
            {
                "identities": [{"name": "a", "url": "http://x", "token_env": "T"}],
                "quota": {"low": "lots"},
            }
        )


def test_policies_can_never_target_requires_action() -> None:
    """A sweep policy naming requires_action is refused with the reason."""
    with pytest.raises(ConfigError, match="never swept"):
        parse_config(
            {
                "identities": [{"name": "a", "url": "http://x", "token_env": "T"}],
                "sweep": {
                    "policies": [
                        {
                            "name": "p",
                            "status": ["requires_action"],
                            "older_than": "1h",
                            "action": "interrupt",
                        }
                    ]
                },
            }
        )


def test_sweep_is_off_and_dry_by_default() -> None:
    """Without configuration nothing is swept, and turning it on still only reports."""
    c = SweepConfig()
    assert c.enabled is False and c.dry_run is True


def test_policy_matching_first_match_wins() -> None:
    """Status, age on the server clock and label matchers select the first policy."""
    cfg = SweepConfig.model_validate(
        {
            "policies": [
                {
                    "name": "orphans",
                    "status": ["waiting"],
                    "older_than": "7d",
                    "action": "archive",
                    "matchers": ['chat_label_ephemeral="true"'],
                },
                {
                    "name": "wedged",
                    "status": ["running"],
                    "older_than": "2h",
                    "action": "interrupt_then_archive",
                },
            ]
        }
    )
    policies = compile_policies(cfg)
    store = ChatStore()
    now = 1_800_000_000.0
    for cid, status, age, labels in [
        ("run-old", "running", 3 * 3600, {}),
        ("run-new", "running", 600, {}),
        ("idle-eph", "waiting", 8 * 86400, {"ephemeral": "true"}),
        ("idle-keep", "waiting", 8 * 86400, {}),
        ("stranded", "requires_action", 10 * 86400, {}),
    ]:
        store.observe(
            "a",
            Observation(id=ChatId(cid), status=status, updated_at=now - age, labels=labels),
            now=now,
            via="listing",
        )
    got = {}
    for rec in store.records("a"):
        p = match_policy(policies, rec, now=now, labels={})
        got[rec.chat_id] = p.name if p else None
    assert got == {
        "run-old": "wedged",
        "run-new": None,
        "idle-eph": "orphans",
        "idle-keep": None,
        "stranded": None,
    }


async def test_simulator_concurrency_cap(sim: Sim, session: aiohttp.ClientSession) -> None:
    """Over the cap, running chats are queued_for_capacity and make no progress until admitted."""
    alice = sim.state.add_user("alice")
    sim.state.faults.capacity_roots = 1
    from watchd.sim.records import Step

    first = sim.state.add_chat(
        alice, status="running", script=[Step("running", 0.3), Step("waiting")]
    )
    second = sim.state.add_chat(
        alice, status="running", script=[Step("running", 0.3), Step("waiting")]
    )
    await asyncio.sleep(0.15)
    assert (first.queued_for_capacity, second.queued_for_capacity) == (False, True)
    updated = second.updated_at
    await asyncio.sleep(0.4)
    assert first.status == "waiting" and second.queued_for_capacity is False
    assert second.status == "running" and second.updated_at == updated
    await asyncio.sleep(0.5)
    assert second.status == "waiting"


def test_orchestrator_chats_are_swept_only_by_a_policy_that_names_them() -> None:
    """A chat in mode orchestrator matches no policy unless the policy has a mode matcher;
    every policy can match on mode."""
    store = ChatStore()
    for cid, mode in (("orc", "orchestrator"), ("exp", "explore")):
        store.observe(
            "a",
            Observation(id=ChatId(cid), status="running", updated_at=0.0, mode=mode),
            now=0.0,
            via="listing",
        )
    plain = SweepConfig.model_validate(
        {
            "policies": [
                {"name": "p", "status": ["running"], "older_than": "1s", "action": "interrupt"}
            ]
        }
    )
    named = SweepConfig.model_validate(
        {
            "policies": [
                {
                    "name": "orc",
                    "status": ["running"],
                    "older_than": "1s",
                    "matchers": ['mode="orchestrator"'],
                    "action": "interrupt",
                }
            ]
        }
    )
    orc, exp = store.get("a", "orc"), store.get("a", "exp")
    assert orc is not None and exp is not None
    assert match_policy(compile_policies(plain), orc, now=10.0, labels={}) is None
    assert match_policy(compile_policies(plain), exp, now=10.0, labels={}) is not None
    assert match_policy(compile_policies(named), orc, now=10.0, labels={}) is not None
    assert match_policy(compile_policies(named), exp, now=10.0, labels={}) is None


async def test_chat_swept_resolves_through_the_ledger_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    """A ChatSwept announcement fires through the detector's persisted ledger (not a timer),
    leaves the chat's own clock alone, and resolves after announce_for — also when the
    daemon restarted in between."""
    from watchd.alerting.model import Alert
    from watchd.config.watching import Budgets
    from watchd.detection.detector import Detector
    from watchd.kits.clock import ServerClock
    from watchd.remediation.sweeper import Sweeper
    from watchd.store.health import IdentityHealth
    from watchd.store.sqlite import StateFile

    class Sink:
        def __init__(self) -> None:
            self.alerts: list[Alert] = []

        def put(self, alert: Alert) -> None:
            self.alerts.append(alert)

    def build(db: StateFile, store: ChatStore, sink: Sink) -> tuple[Detector, Sweeper]:
        det = Detector(store=store, sink=sink, db=db)
        health = IdentityHealth(
            name="a", deployment="http://x", server_clock=ServerClock(), unhealthy_after=60
        )
        health.set_state("ready")
        config = SweepConfig.model_validate(
            {
                "enabled": True,
                "announce_for": "1s",
                "policies": [
                    {"name": "p", "status": ["running"], "older_than": "1s", "action": "interrupt"}
                ],
            }
        )
        sweeper = Sweeper(
            config=config,
            store=store,
            health={"a": health},
            clients=lambda _n: None,
            db=db,
            ledger=det.ledger,
            audit_path=tmp_path / "audit.jsonl",
            labels=lambda _n: {},
        )
        det.register(health, confirmer=None, budgets=Budgets(running=3600), labels={})  # type: ignore[arg-type]
        return det, sweeper

    db = StateFile(tmp_path / "state.db")
    store = ChatStore()
    store.observe(
        "a", Observation(id=ChatId("c1"), status="running", updated_at=1.0), now=2.0, via="listing"
    )
    sink = Sink()
    det, sweeper = build(db, store, sink)
    await sweeper.sweep_once()  # dry run: plans, announces
    assert [(a.name, a.status) for a in sink.alerts] == [("ChatSwept", "firing")]
    assert ("a", "c1", "status") in det.timers, "the chat's own clock still runs"
    await det.unregister("a", reason="restart", resolve=False)
    db.flush()
    db.close()

    db = StateFile(tmp_path / "state.db")
    sink = Sink()
    det, sweeper = build(db, store, sink)
    assert any(a.name == "ChatSwept" for a in det.firing.values())
    await asyncio.sleep(1.1)
    await sweeper.sweep_once()
    assert ("ChatSwept", "resolved") in [(a.name, a.status) for a in sink.alerts]
    await det.unregister("a", reason="test over")
    db.close()
