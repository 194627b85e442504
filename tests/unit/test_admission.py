"""GET /v1/admission on a daemon that is not running: every answer comes from memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from watchd.alerting.model import Alert, fingerprint
from watchd.coder.observing import Quota
from watchd.config.loading import parse_config
from watchd.config.secrets import resolve_secrets
from watchd.daemon.app import Daemon
from watchd.daemon.status import status_document
from watchd.daemon.status_page import status_html
from watchd.kits.clock import ServerClock
from watchd.store.health import IdentityHealth, QuotaOutlook

DEPLOYMENT = "https://coder.example.com"
TOKEN = "ingest-secret-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Daemon]:
    """A daemon (not running: no Coder session at all) with two seeded identities."""
    monkeypatch.setenv("WATCHD_TEST_TOKEN", "token-value-0123456789")
    monkeypatch.setenv("WATCHD_INGEST", TOKEN)
    config = parse_config(
        {
            "identities": [
                {"name": n, "url": DEPLOYMENT, "token_env": "WATCHD_TEST_TOKEN"}
                for n in ("team-a", "team-b")
            ],
            "state_dir": str(tmp_path),
            "telemetry": {"exporter": "none"},
            "server": {"ingest_token_env": "WATCHD_INGEST"},
            "admission": {"min_headroom": 5},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    for name in ("team-a", "team-b"):
        h = IdentityHealth(
            name=name, deployment=DEPLOYMENT, server_clock=ServerClock(), unhealthy_after=60
        )
        h.set_state("ready")
        h.quota = Quota(credits_consumed=40, budget=100)
        d.health[name] = h
    yield d
    d.db.close()


def fire(d: Daemon, name: str, alertname: str, *parts: str) -> None:
    fp = fingerprint(*parts, alertname)
    d.detector.firing[fp] = Alert(fp, {"alertname": alertname, "identity": name}, {}, 0.0)


async def ask(
    d: Daemon, query: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with TestClient(TestServer(d.server.app)) as client:
        resp = await client.get(f"/v1/admission{query}", headers=headers or BEARER)
        return resp.status, await resp.json()


async def test_a_healthy_identity_with_headroom_is_admitted(daemon: Daemon) -> None:
    """Seeded, 60 credits left, nothing firing: admit, with the spec's fields."""
    status, body = await ask(daemon, "?identity=team-a")
    assert status == 200
    assert body == {
        "identity": "team-a",
        "admit": True,
        "reasons": [],
        "headroom": 60,
        "running": 0,
        "queued_for_capacity": 0,
        "forecast_eta": None,
    }


async def test_token_and_unknown_identity(daemon: Daemon) -> None:
    """Without the bearer token: 401 (no answer leaks); an unknown identity: 404."""
    status, body = await ask(daemon, "?identity=team-a", headers={"Authorization": "Bearer no"})
    assert status == 401 and "admit" not in body
    status, body = await ask(daemon, "?identity=nobody")
    assert status == 404 and TOKEN not in str(body)


async def test_each_reason_refuses_admission(daemon: Daemon) -> None:
    """Each of the four conditions refuses admission with its own reason code."""
    h = daemon.health["team-a"]
    h.forecast = QuotaOutlook(
        at=0.0, readings=5, span_seconds=1200, headroom=60, firing=True,
        rate_per_hour=90.0, eta=1_800_002_400.0, eta_seconds=2400.0,
    )  # fmt: skip
    fire(daemon, "team-a", "QuotaExhaustionForecast", DEPLOYMENT, "team-a")
    _, body = await ask(daemon, "?identity=team-a")
    assert body["admit"] is False and body["forecast_eta"] == "2027-01-15T08:40:00Z"
    assert [r.split(":")[0] for r in body["reasons"]] == ["quota_forecast"]
    h.quota = Quota(credits_consumed=96, budget=100)
    fire(daemon, "team-a", "IdentityUnhealthy", DEPLOYMENT, "team-a")
    fire(daemon, "team-a", "FleetIncident", DEPLOYMENT, "capacity")
    _, body = await ask(daemon, "?identity=team-a")
    codes = [r.split(":")[0] for r in body["reasons"]]
    assert codes == ["identity_unhealthy", "quota_headroom", "fleet_incident", "quota_forecast"]
    _, other = await ask(daemon, "?identity=team-b")
    assert [r.split(":")[0] for r in other["reasons"]] == ["fleet_incident"]


async def test_status_shows_the_forecast_and_the_answer(daemon: Daemon) -> None:
    """/status JSON and HTML show each identity's forecast (rate, eta) and admission."""
    h = daemon.health["team-a"]
    h.forecast = QuotaOutlook(
        at=0.0, readings=5, span_seconds=1200, headroom=60, firing=True,
        rate_per_hour=90.0, eta=1_800_002_400.0, eta_seconds=2400.0,
    )  # fmt: skip
    fire(daemon, "team-a", "QuotaExhaustionForecast", DEPLOYMENT, "team-a")
    doc = await status_document(daemon)
    by_name = {i["name"]: i for i in doc["identities"]}
    fc = by_name["team-a"]["quota"]["forecast"]
    assert (fc["rate_per_hour"], fc["eta_seconds"], fc["firing"]) == (90.0, 2400, True)
    assert by_name["team-a"]["admission"]["admit"] is False
    assert by_name["team-b"]["quota"]["forecast"] is None
    page = status_html(doc)
    assert "<b>FORECAST</b> 60 of 100 left; +90.0/h; runs out in 40m" in page
    assert "<b>hold</b>: quota_forecast: the quota runs out in about 40m" in page
