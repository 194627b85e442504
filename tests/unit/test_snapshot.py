"""The daemon's snapshot: frozen plain data gathered from each subsystem's snapshot(),
which no later change of the live objects reaches; and the ingest port the server gets
instead of the daemon."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from watchd.config.loading import parse_config
from watchd.config.secrets import resolve_secrets
from watchd.daemon.app import Daemon
from watchd.daemon.ingesting import IngestPort
from watchd.kits.clock import ServerClock
from watchd.store.health import IdentityHealth
from watchd.telemetry.events import QueueSink

DEPLOYMENT = "https://coder.example.com"


@pytest.fixture
async def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Daemon]:
    """A daemon (not running) with one identity's health in place."""
    monkeypatch.setenv("WATCHD_TEST_TOKEN", "token-value-0123456789")
    config = parse_config(
        {
            "identities": [{"name": "team-a", "url": DEPLOYMENT, "token_env": "WATCHD_TEST_TOKEN"}],
            "state_dir": str(tmp_path),
            "telemetry": {"exporter": "none"},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    d.health["team-a"] = IdentityHealth(
        name="team-a", deployment=DEPLOYMENT, server_clock=ServerClock(), unhealthy_after=60
    )
    yield d
    d.db.close()


async def test_the_snapshot_is_frozen_plain_data(daemon: Daemon) -> None:
    """The snapshot and every part of it are frozen dataclasses: a reader cannot change
    the daemon through them."""
    snap = daemon.snapshot()
    parts = [snap, snap.store, snap.state, *snap.health.values()]
    for part in parts:
        assert dataclasses.is_dataclass(part)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, dataclasses.fields(part)[0].name, None)
    # Not started: no dispatcher, no dead man's switch, no sweep to show.
    assert snap.dispatch is None and snap.heartbeat is None and snap.sweep is None


async def test_a_snapshot_stays_as_it_was_taken(daemon: Daemon) -> None:
    """Counters moving after a snapshot reach the next one, not the one already taken."""
    before = daemon.snapshot()
    daemon.store.overflow += 1
    daemon.health["team-a"].reconnects += 1
    daemon.ingest.count("rejected")
    daemon.reloads.counts["applied"] += 1
    assert before.store.overflow == 0 and before.health["team-a"].reconnects == 0
    assert before.telemetry["ingest"]["rejected"] == 0 and before.reloads["applied"] == 0
    after = daemon.snapshot()
    assert after.store.overflow == 1 and after.health["team-a"].reconnects == 1
    assert after.telemetry["ingest"]["rejected"] == 1 and after.reloads["applied"] == 1


def test_a_batch_without_room_is_counted_by_the_port_and_its_events_by_the_sink() -> None:
    sink = QueueSink(maxsize=10)
    port = IngestPort(sink=sink, token=lambda: None)
    port.refuse_full(25)
    assert port.snapshot()["refused_full"] == 1 and sink.dropped == 25
    assert sink.queue.qsize() == 0 and sink.accepted == 0


def test_the_port_checks_the_current_token() -> None:
    """Any request passes without a token; with one, only its bearer does, and a reload's
    new token applies at once (the port reads it on each check)."""
    token: list[SecretStr | None] = [None]
    port = IngestPort(sink=QueueSink(1), token=lambda: token[0])
    assert port.authorized("")
    token[0] = SecretStr("first")
    assert port.authorized("Bearer first")
    assert not port.authorized("Bearer nope") and not port.authorized("")
    token[0] = SecretStr("second")
    assert port.authorized("Bearer second") and not port.authorized("Bearer first")
