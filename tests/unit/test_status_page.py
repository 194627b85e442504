"""The /status document and page at scale: paginated, capped with counts, classified in
chunks that yield to the loop; silenced and inhibited alerts marked; chats linked."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from watchd.alerting.model import Alert
from watchd.alerting.silencing import Silence
from watchd.config.loading import parse_config
from watchd.config.secrets import resolve_secrets
from watchd.daemon import status
from watchd.daemon.app import Daemon
from watchd.daemon.status import StatusQuery, status_document
from watchd.daemon.status_page import chart_svg, status_html
from watchd.kits.clock import ServerClock
from watchd.kits.matchers import parse_matchers
from watchd.store.health import IdentityHealth

N = 20_000
DEPLOYMENT = "https://coder.example.com"


@contextlib.contextmanager
def _two_identities(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A daemon (not running) over identities team-a and team-b, both with a health."""
    monkeypatch.setenv("WATCHD_TEST_TOKEN", "token-value-0123456789")
    config = parse_config(
        {
            "identities": [
                {"name": n, "url": DEPLOYMENT, "token_env": "WATCHD_TEST_TOKEN"}
                for n in ("team-a", "team-b")
            ],
            "state_dir": str(tmp_path),
            "telemetry": {"exporter": "none"},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    for name in ("team-a", "team-b"):
        d.health[name] = IdentityHealth(
            name=name, deployment=DEPLOYMENT, server_clock=ServerClock(), unhealthy_after=60
        )
    try:
        yield d
    finally:
        d.db.close()


@pytest.fixture
async def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Daemon]:
    """A daemon (not running) holding 20 000 firing ChatStuck alerts over two identities."""
    with _two_identities(tmp_path, monkeypatch) as d:
        _fill(d)
        yield d


def _fill(d: Daemon) -> None:
    """20 000 firing alerts, one in ten a ChatStranded, team-b's ChatStranded silenced."""
    now = 1_800_000_000.0
    for i in range(N):
        ident = "team-a" if i % 2 else "team-b"
        chat = f"chat-{i:05d}"
        d.detector.firing[f"fp{i}"] = Alert(
            fingerprint=f"fp{i}",
            labels={
                "alertname": "ChatStuck" if i % 10 else "ChatStranded",
                "identity": ident,
                "status": "running",
                "chat_id": chat,
            },
            annotations={
                "summary": f'Chat "t{i}" has been running for 40m (budget 30m)',
                "title": f"turn <{i}>",
                "time_in_status": "40m",
                "time_in_status_seconds": "2400",
                "budget": "30m",
                "link": f"{DEPLOYMENT}/agents/{chat}",
                "hint": "deployment concurrency cap reached",
            },
            starts_at=now + i,
        )
    d.silencer.add(
        Silence(
            id="s1",
            matchers=parse_matchers(['identity="team-b"', 'alertname="ChatStranded"']),
            starts_at=0,
            ends_at=4e9,
        )
    )


async def test_json_is_capped_with_counts_for_everything(daemon: Daemon) -> None:
    """/status JSON carries one page of alerts and counts for all 20 000."""
    doc = await status_document(daemon)
    al = doc["alerts"]
    assert len(al["firing"]) == status.JSON_LIMIT and al["firing_total"] == N
    assert al["next_offset"] == status.JSON_LIMIT
    assert al["counts"]["by_state"] == {"active": N - 2000, "silenced": 2000, "inhibited": 0}
    assert al["counts"]["by_identity"] == {"team-a": N // 2, "team-b": N // 2}
    assert len(json.dumps(doc)) < 1_000_000


async def test_json_pages_and_filters(daemon: Daemon) -> None:
    """offset/limit page through; identity, alertname and state filter before paging."""
    doc = await status_document(
        daemon, StatusQuery(identity="team-b", alertname="ChatStranded", offset=1900, limit=200)
    )
    al = doc["alerts"]
    assert al["matching"] == 2000 and len(al["firing"]) == 100 and al["next_offset"] is None
    assert {a["state"] for a in al["firing"]} == {"silenced"}
    assert all(a["labels"]["identity"] == "team-b" for a in al["firing"])


async def test_html_page_at_20000_alerts_is_under_a_megabyte_and_paginates(
    daemon: Daemon,
) -> None:
    """The HTML view renders one page (≤ 1 MB), links the next, and links each chat."""
    doc = await status_document(daemon, StatusQuery(limit=status.HTML_PAGE))
    page = status_html(doc)
    assert len(page.encode()) <= 1_000_000
    assert page.count("<tr class='alert") == status.HTML_PAGE
    assert "rel='next' href='status?format=html&amp;page=2'" in page
    assert f"href='{DEPLOYMENT}/agents/chat-00001'" in page
    assert "turn &lt;1&gt;" in page and "turn <1>" not in page
    assert "token-value-0123456789" not in page


async def test_classification_yields_to_the_loop(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Classifying 20 000 alerts hands the loop back every CHUNK alerts (so /healthz runs)."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    got = await status.classify(daemon, 1_900_000_000.0)
    during = ticks - before
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert during >= N // status.CHUNK - 1
    assert got.total == N and len(got.selected) == N


def test_chart_is_server_rendered_svg_per_status() -> None:
    """The last-hour chart is an inline SVG with one polyline per status seen."""
    now = 10_000.0
    series = [
        {"t": now - 3000, "chats": {"running": 2, "waiting": 1}},
        {"t": now - 60, "chats": {"running": 5}},
    ]
    svg = chart_svg("team-a", series, now, 3600.0)
    assert svg.startswith("<svg class='chart' data-identity='team-a'")
    assert svg.count("<polyline") == 2
    assert "data-status='running'" in svg and "running 5" in svg
    assert "<script" not in svg


async def test_inhibited_alerts_are_classified_and_counted(daemon: Daemon) -> None:
    """An IdentityUnhealthy for team-a marks team-a's chat alerts inhibited (not active)."""
    daemon.detector.firing["unhealthy"] = Alert(
        fingerprint="unhealthy",
        labels={"alertname": "IdentityUnhealthy", "identity": "team-a"},
        starts_at=1_800_000_000.0,
    )
    doc = await status_document(daemon, StatusQuery(state="inhibited", limit=10))
    al = doc["alerts"]
    assert al["counts"]["by_state"] == {"active": 8001, "silenced": 2000, "inhibited": N // 2}
    assert al["matching"] == N // 2
    assert {a["state"] for a in al["firing"]} == {"inhibited"}
    assert {a["labels"]["identity"] for a in al["firing"]} == {"team-a"}


class _Sink:
    def put(self, alert: Alert) -> None:
        pass


def _member(i: int, *, cause: str, identity: str) -> Alert:
    chat = f"m-{cause}-{i:03d}"
    return Alert(
        fingerprint=f"{cause}{i}",
        labels={
            "alertname": "ChatStuck",
            "identity": identity,
            "deployment": DEPLOYMENT,
            "status": "running",
            "chat_id": chat,
            "cause": cause,
            "severity": "warning",
        },
        annotations={
            "title": f"turn {i}",
            "time_in_status": "40m",
            "link": f"{DEPLOYMENT}/agents/{chat}",
        },
        starts_at=1_800_000_000.0 + i,
    )


async def test_incidents_lead_the_status_json_page_and_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Firing FleetIncidents are in /status JSON (deployment, cause, count, since, the
    first 200 members), shown above the per-chat alerts in the HTML page, each
    expandable into its members, and in watchd_fleet_incidents{deployment,cause}."""
    with _two_identities(tmp_path, monkeypatch) as d:
        members = [
            _member(i, cause="capacity", identity="team-a" if i % 2 else "team-b")
            for i in range(250)
        ] + [_member(i, cause="quota", identity="team-a") for i in range(6)]
        d.detector.ledger.sink = _Sink()  # no dispatcher: the daemon is not running
        d.detector.ledger.fire_all(
            ((a, a.labels["identity"], a.labels["chat_id"]) for a in members), quiet=True
        )
        doc = await status_document(d)
        got = [(i["cause"], i["count"], i["members_shown"]) for i in doc["incidents"]]
        assert got == [("capacity", 250, 200), ("quota", 6, 6)]
        cap = doc["incidents"][0]
        assert cap["deployment"] == DEPLOYMENT and cap["identities"] == ["team-a", "team-b"]
        assert cap["since"] == "2027-01-15T08:00:04Z"  # the fifth member's budget crossing
        assert cap["members"][0]["chat_id"] == "m-capacity-000"
        assert cap["summary"] == "250 chats stuck: deployment concurrency cap reached"
        page = status_html(doc)
        assert page.index("id='incidents'") < page.index('id="alerts"')
        assert page.count("<details class='incident'") == 2
        assert "+50 more" in page
        assert f"href='{DEPLOYMENT}/agents/m-quota-005'" in page
        metrics = d.metrics.render().decode()
        assert (
            f'watchd_fleet_incidents{{cause="capacity",deployment="{DEPLOYMENT}"}} 250.0' in metrics
        )
        assert f'watchd_fleet_incidents{{cause="quota",deployment="{DEPLOYMENT}"}} 6.0' in metrics


async def test_alerts_are_sorted_most_severe_first_then_oldest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Critical before warning before info, each oldest first; the page shows each row's
    severity, has a phone viewport, and says which identity keeps it "not ready"."""
    with _two_identities(tmp_path, monkeypatch) as d:
        d.health["team-a"].set_state("ready")
        d.health["team-b"].set_state("unreachable", error="connection refused")
        for i, (severity, start) in enumerate(
            [("warning", 30.0), ("info", 10.0), ("critical", 50.0), ("warning", 20.0),
             ("critical", 40.0)]
        ):  # fmt: skip
            d.detector.firing[f"fp{i}"] = Alert(
                f"fp{i}",
                {"alertname": "ChatStuck", "identity": "team-a", "severity": severity,
                 "chat_id": f"c{i}"},
                {"time_in_status": "1m"},
                starts_at=start,
            )  # fmt: skip
        doc = await status_document(d)
        order = [(a["labels"]["severity"], a["firing_since"]) for a in doc["alerts"]["firing"]]
        assert [s for s, _ in order] == ["critical", "critical", "warning", "warning", "info"]
        assert order[0][1] < order[1][1] and order[2][1] < order[3][1]
        page = status_html(doc)
        assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
        assert "<td class='sev'>critical</td>" in page
        assert "not ready: not yet seeded team-b (unreachable: connection refused)" in page
