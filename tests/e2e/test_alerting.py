"""Alert delivery end to end: the real daemon, the simulator, real or faithful receivers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.e2e.harness import DaemonProcess, SimProcess, eventually, free_port
from tests.fakes.receivers import FakePagerDuty, FakeSlack, FakeWebhook

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]
FAST_ROUTE = {
    "group_wait": "1s",
    "group_interval": "1s",
    "repeat_interval": "1h",
    "group_by": ["identity", "alertname", "status"],
}
PD_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"


def secret(tmp: Path, name: str, value: str) -> str:
    p = tmp / name
    p.write_text(value)
    p.chmod(0o600)
    return str(p)


@pytest.fixture
async def hook() -> AsyncIterator[FakeWebhook]:
    h = await FakeWebhook().start()
    yield h
    await h.stop()


async def run_cli(*cmd: str) -> subprocess.CompletedProcess[str]:
    """Run a CLI command off the loop (the fake receivers live on it)."""
    return await asyncio.to_thread(
        subprocess.run, list(cmd), capture_output=True, text=True, check=True
    )


def posted_chats(hook: FakeWebhook, status: str) -> list[str]:
    return [
        a["labels"]["chat_id"]
        for body in hook.received
        for a in body["alerts"]
        if a["status"] == status and "chat_id" in a["labels"]
    ]


async def test_200_stuck_chats_make_a_handful_of_notifications(
    start_sim: StartSim, start_daemon: StartDaemon, hook: FakeWebhook
) -> None:
    """200 chats stuck at once produce a few grouped notifications carrying all 200 (with
    incidents off: one page per chat, grouped)."""
    sim = start_sim()
    for i in range(200):
        await sim.add_chat("alice", status="running", age=600, title=f"wedged {i}")
    d = start_daemon(
        sim,
        extra={
            "incidents": {"enabled": False},
            "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
            "route": {"receiver": "hook", **FAST_ROUTE, "group_wait": "3s"},
        },
    )
    await d.wait_ready()
    await eventually(lambda: len(set(posted_chats(hook, "firing"))) == 200, within=20)
    await asyncio.sleep(2)
    assert len(hook.received) <= 3, f"{len(hook.received)} notifications for one outage"
    doc = await d.status()
    assert doc["counters"]["confirm_listing"] >= 1 and doc["counters"]["confirm_get"] < 20


async def test_six_capacity_queued_chats_make_one_page_the_incident(
    start_sim: StartSim, start_daemon: StartDaemon, hook: FakeWebhook
) -> None:
    """With the defaults, six chats queued behind the concurrency cap page once: the
    FleetIncident (cause capacity, count 6); their ChatStuck alerts fire, held back."""
    sim = start_sim()
    await sim.admin("POST", "/faults", {"capacity_roots": 0})
    for i in range(6):
        await sim.add_chat("alice", status="running", age=600, title=f"queued {i}")
    d = start_daemon(
        sim,
        identities=[("team-a", "alice")],
        extra={
            "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
            "route": {"receiver": "hook", **FAST_ROUTE, "group_wait": "5s"},
        },
    )
    await d.wait_ready()
    stuck = await eventually(lambda: _at_least(d.firing("ChatStuck"), 6), within=20)
    assert {a["labels"]["cause"] for a in stuck} == {"capacity"}
    await eventually(lambda: len(hook.received) >= 1, within=15)
    await asyncio.sleep(3)  # a member page would follow within a group_interval
    posted = [a for body in hook.received for a in body["alerts"]]
    assert [a["labels"]["alertname"] for a in posted] == ["FleetIncident"], posted
    assert posted[0]["labels"]["cause"] == "capacity"
    assert posted[0]["annotations"]["count"] == "6"


async def _at_least(value: Any, n: int) -> Any:
    v = await value
    return v if len(v) >= n else None


async def test_receiver_down_then_everything_once(
    start_sim: StartSim, start_daemon: StartDaemon, hook: FakeWebhook
) -> None:
    """While the receiver is down nothing is lost; afterwards each change arrives exactly once.

    (The outage is seconds here, not minutes: delivery does not depend on its length,
    only on flushes retrying until the receiver answers.)"""
    sim = start_sim()
    hook.script.down = True
    d = start_daemon(
        sim,
        extra={
            "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
            "route": {"receiver": "hook", **FAST_ROUTE},
        },
    )
    await d.wait_ready()
    chats = [await sim.add_chat("alice", status="running") for _ in range(3)]

    async def failing() -> bool:
        return int((await d.status())["receivers"]["hook"]["failed"]) >= 2

    await eventually(failing, within=20)
    await sim.set_status(chats[0], "waiting")
    await asyncio.sleep(2)
    hook.script.down = False
    await eventually(lambda: len(hook.received) >= 1, within=15)
    await asyncio.sleep(4)
    assert len(hook.received) == 1, [b["status"] for b in hook.received]
    assert sorted(posted_chats(hook, "firing")) == sorted(chats[1:])
    # As in Alertmanager, the group's notification also carries what resolved meanwhile.
    assert posted_chats(hook, "resolved") == [chats[0]]


async def test_kill9_mid_flush_no_duplicate_page_resolve_arrives(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A daemon killed while PagerDuty is answering re-sends on restart under the same
    dedup_key: one incident, and the resolve still arrives."""
    pd = await FakePagerDuty().start()
    try:
        sim = start_sim()
        extra = {
            "receivers": [
                {
                    "name": "pager",
                    "pagerduty": {
                        "routing_key_file": secret(tmp_path, "pd", PD_KEY),
                        "url": pd.events_url,
                    },
                }
            ],
            "route": {"receiver": "pager", **FAST_ROUTE},
        }
        pd.script.delay = 3.0
        d1 = start_daemon(sim, extra=extra)
        await d1.wait_ready()
        chat = await sim.add_chat("alice", status="running")
        await eventually(lambda: d1.firing("ChatStuck"), within=10)
        await asyncio.sleep(2.0)  # the trigger is in flight now
        d1.kill9()
        await eventually(lambda: pd.pages == 1, within=5)
        pd.script.delay = 0
        d2 = start_daemon(sim, extra=extra, state_dir=d1.tmp / "state")
        await d2.wait_ready()
        await asyncio.sleep(3)
        assert pd.pages == 1, "restart paged a second time"
        await sim.set_status(chat, "waiting")
        await eventually(lambda: pd.resolves == 1, within=10)
        assert pd.open == {} and pd.rejected == []
    finally:
        await pd.stop()


async def test_hostile_title_arrives_escaped_in_slack(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A chat title full of <!channel> & <script> reaches Slack escaped and accepted."""
    slack = await FakeSlack().start()
    try:
        sim = start_sim()
        d = start_daemon(
            sim,
            extra={
                "receivers": [
                    {
                        "name": "chat",
                        "slack": {"webhook_url_file": secret(tmp_path, "slack", slack.webhook_url)},
                    }
                ],
                "route": {"receiver": "chat", **FAST_ROUTE},
            },
        )
        await d.wait_ready()
        await sim.add_chat("alice", status="running", title="<!channel> & <script>x</script>")
        await eventually(lambda: slack.received, within=15)
        text = json.dumps(slack.received[0])
        assert "&lt;!channel&gt; &amp; &lt;script&gt;" in text and "<!channel>" not in text
        assert slack.rejected == []
        d.terminate()
        assert "XXXXXXXX" not in d.logs(), "the webhook URL (a secret) leaked into logs"
    finally:
        await slack.stop()


async def test_silence_api_and_cli(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon, hook: FakeWebhook
) -> None:
    """`watchd silence add` mutes matching alerts until `expire`; the API needs the token."""
    sim = start_sim()
    token_file = secret(tmp_path, "admin", "admin-token-1234567890")
    d = start_daemon(
        sim,
        extra={
            "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
            "route": {"receiver": "hook", **FAST_ROUTE},
            "server": {"admin_token_file": token_file},
        },
    )
    await d.wait_ready()
    cli = [sys.executable, "-m", "watchd", "silence", "-c", str(d.config_path)]
    out = await run_cli(
        *cli, "add", 'identity="team-a"', "--duration", "1h", "--comment", "maintenance"
    )
    sid = out.stdout.strip()  # as amtool: the new silence's id alone
    assert sid and "\n" not in sid, out.stdout
    await sim.add_chat("alice", status="running")
    await eventually(lambda: d.firing("ChatStuck"), within=10)
    await asyncio.sleep(2.5)
    assert hook.received == [], "a silenced alert was delivered"
    listing = await run_cli(*cli, "list")
    assert sid in listing.stdout and "maintenance" in listing.stdout
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"http://{d.listen}/api/v1/silences", json={"matchers": ['a="b"'], "duration": "1h"}
        ) as r,
    ):
        assert r.status == 401
    await run_cli(*cli, "expire", sid)
    await eventually(lambda: hook.received, within=10)


async def test_test_alert_command(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon, hook: FakeWebhook
) -> None:
    """`watchd test-alert` sends a firing and a resolved alert; exit 1 when refused."""
    sim = start_sim()
    d = DaemonProcess(
        tmp_path,
        sim,
        identities=[("team-a", "alice")],
        extra={
            "receivers": [{"name": "hook", "webhook": {"url": hook.hook_url}}],
            "route": {"receiver": "hook"},
        },
    )
    cmd = [sys.executable, "-m", "watchd", "test-alert", "hook", "-c", str(d.config_path)]
    ok = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert [b["status"] for b in hook.received] == ["firing", "resolved"]
    hook.script.answers.append((404, "no such hook", {}))
    bad = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
    assert bad.returncode == 1 and "permanent" in bad.stderr


# -- a real Alertmanager (Debian's prometheus-alertmanager) --------------------------------

AM_BINARY = "/usr/bin/prometheus-alertmanager"


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Start a real Alertmanager on loopback, routing to the given webhook URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        webhook_url: str,
        *,
        resolve_timeout: str = "5m",
        group_wait: str = "1s",
        rules: Path | None = None,
    ) -> str:
        """``rules``: a YAML file whose ``inhibit_rules`` the Alertmanager gets."""
        assert os.path.exists(AM_BINARY), "run tests/setup/system-deps (make test does)"
        port = free_port()
        cfg = tmp_path / "alertmanager.yml"
        inhibit = yaml.safe_load(rules.read_text()) if rules is not None else {}
        cfg.write_text(
            yaml.safe_dump(
                {
                    **inhibit,
                    "global": {"resolve_timeout": resolve_timeout},
                    "route": {
                        "receiver": "hook",
                        "group_by": ["identity", "alertname"],
                        "group_wait": group_wait,
                        "group_interval": "1s",
                        "repeat_interval": "1h",
                    },
                    "receivers": [
                        {
                            "name": "hook",
                            "webhook_configs": [{"url": webhook_url, "send_resolved": True}],
                        }
                    ],
                }
            )
        )
        log = (tmp_path / "am.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    AM_BINARY,
                    f"--config.file={cfg}",
                    f"--storage.path={tmp_path / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=log,
            )
        )
        log.close()
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


async def _am_ready(am_url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(am_url + "/-/ready") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def test_real_alertmanager_resolves_only_what_ended(
    start_sim: StartSim,
    start_daemon: StartDaemon,
    hook: FakeWebhook,
    alertmanager: Callable[..., str],
) -> None:
    """Through a real Alertmanager with a 3 s resolve_timeout: a ChatStuck that watchd
    inhibits itself keeps firing there past it, and so does every alert while watchd is
    stopped past it and after its restart; only the chat's real resolve ends it."""
    am_url = alertmanager(hook.hook_url, resolve_timeout="3s")
    await eventually(lambda: _am_ready(am_url), within=20)
    sim = start_sim()
    extra = {
        "receivers": [{"name": "am", "alertmanager": {"url": am_url}}],
        "route": {"receiver": "am", **FAST_ROUTE},
        "inhibit_rules": [
            {
                "source_matchers": ['chat_label_role="source"'],
                "target_matchers": ['chat_label_role="target"'],
                "equal": ["identity"],
            }
        ],
    }
    d = start_daemon(sim, extra=extra)
    await d.wait_ready()
    target = await sim.add_chat("alice", status="running", labels={"role": "target"})
    await eventually(lambda: target in posted_chats(hook, "firing"), within=20)
    source = await sim.add_chat("alice", status="running", labels={"role": "source"})
    await eventually(lambda: source in posted_chats(hook, "firing"), within=20)
    doc = await d.status()
    states = {a["labels"].get("chat_id"): a["state"] for a in doc["alerts"]["firing"]}
    assert states[target] == "inhibited" and states[source] == "active"
    await asyncio.sleep(8)  # past resolve_timeout, the target inhibited in watchd
    assert posted_chats(hook, "resolved") == []
    d.stop()
    await asyncio.sleep(8)  # watchd down past resolve_timeout
    assert posted_chats(hook, "resolved") == []
    d2 = start_daemon(sim, extra=extra, state_dir=d.tmp / "state")
    await d2.wait_ready()
    await asyncio.sleep(4)
    assert posted_chats(hook, "resolved") == []
    await sim.set_status(target, "waiting")
    await eventually(lambda: posted_chats(hook, "resolved") == [target], within=20)


SHIPPED_RULES = Path(__file__).parents[2] / "deploy" / "alertmanager" / "watchd-inhibit-rules.yml"


async def test_real_alertmanager_with_the_shipped_rules_pages_the_incident_only(
    start_sim: StartSim,
    start_daemon: StartDaemon,
    hook: FakeWebhook,
    alertmanager: Callable[..., str],
) -> None:
    """Through a real Alertmanager given deploy/alertmanager's inhibit rules, six chats
    queued behind the concurrency cap are one notification: the FleetIncident, none of
    its members (watchd forwards them, the Alertmanager holds them back)."""
    # group_wait longer than the incident takes to form (its members are confirmed one
    # GET after another): a member notified before its incident exists is paged.
    am_url = alertmanager(hook.hook_url, group_wait="10s", rules=SHIPPED_RULES)
    await eventually(lambda: _am_ready(am_url), within=20)
    sim = start_sim()
    await sim.admin("POST", "/faults", {"capacity_roots": 0})
    d = start_daemon(
        sim,
        identities=[("team-a", "alice")],
        extra={
            "receivers": [{"name": "am", "alertmanager": {"url": am_url}}],
            "route": {"receiver": "am", **FAST_ROUTE},
        },
    )
    await d.wait_ready()
    # Chats that go stuck now: an Alertmanager flushes a new group at once for an alert
    # that started more than group_wait ago (docs/alerting.md).
    for i in range(6):
        await sim.add_chat("alice", status="running", title=f"queued {i}")
    await eventually(lambda: len(hook.received) >= 1, within=30)
    await asyncio.sleep(4)  # a member's notification would follow within group_interval
    posted = [a for body in hook.received for a in body["alerts"]]
    for e in d.log_events():
        if e.get("event", "").startswith(("alert", "confirm")):
            print(
                "DEBUG",
                e.get("timestamp"),
                e.get("event"),
                e.get("alertname"),
                e.get("chat_id"),
                e.get("count"),
            )
    assert [a["labels"]["alertname"] for a in posted] == ["FleetIncident"], posted
    assert posted[0]["labels"]["cause"] == "capacity"
    assert posted[0]["annotations"]["count"] == "6"


async def test_real_alertmanager_receives_and_resolves(
    start_sim: StartSim,
    start_daemon: StartDaemon,
    hook: FakeWebhook,
    alertmanager: Callable[[str], str],
) -> None:
    """watchd → Alertmanager → Alertmanager's webhook: labels, annotations, then the resolve."""
    am_url = alertmanager(hook.hook_url)

    async def am_ready() -> bool:
        try:
            async with aiohttp.ClientSession() as s, s.get(am_url + "/-/ready") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(am_ready, within=20)
    sim = start_sim()
    d = start_daemon(
        sim,
        extra={
            "receivers": [{"name": "am", "alertmanager": {"url": am_url}}],
            "route": {"receiver": "am", **FAST_ROUTE},
        },
    )
    await d.wait_ready()
    chat = await sim.add_chat("alice", status="running", title="wedged in AM")
    await eventually(lambda: posted_chats(hook, "firing"), within=20)
    body = hook.received[0]
    alert: dict[str, Any] = body["alerts"][0]
    assert body["version"] == "4" and alert["status"] == "firing"
    assert alert["labels"]["alertname"] == "ChatStuck"
    assert alert["labels"]["identity"] == "team-a" and alert["labels"]["chat_id"] == chat
    assert alert["annotations"]["title"] == "wedged in AM" and alert["annotations"]["hint"]
    await sim.set_status(chat, "waiting")
    await eventually(lambda: posted_chats(hook, "resolved") == [chat], within=20)
