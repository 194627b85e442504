"""A fleet's bad hour end to end: 200 chats behind the deployment's concurrency cap over
two identities, 50 on workspaces whose builds failed for quota, 3 with no visible cause.
The real daemon against the simulator, a faithful webhook and PagerDuty, and the status
page in headless Chromium (screenshot kept in test-artifacts/status-incidents.png)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import browser
from tests.e2e.harness import DaemonProcess, SimProcess, eventually
from tests.e2e.test_alerting import PD_KEY, secret
from tests.fakes.receivers import FakePagerDuty, FakeWebhook

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


@pytest.fixture
async def receivers() -> AsyncIterator[tuple[FakeWebhook, FakePagerDuty]]:
    hook, pd = await FakeWebhook().start(), await FakePagerDuty().start()
    yield hook, pd
    await hook.stop()
    await pd.stop()


def posted(hook: FakeWebhook, status: str) -> list[dict[str, Any]]:
    return [a for body in hook.received for a in body["alerts"] if a["status"] == status]


async def test_one_page_per_cause_for_a_fleet_of_253_stuck_chats(
    tmp_path: Path,
    start_sim: StartSim,
    start_daemon: StartDaemon,
    receivers: tuple[FakeWebhook, FakePagerDuty],
) -> None:
    """Exactly one page per incident cause (capacity: 200 over two identities, their
    flags learned by paced GETs after one listing; quota: 50 on 10 workspaces whose
    builds carry only coderd's error text), the 3 without a cause paged as themselves,
    no member ever posted, /status and its page show it all; the capacity chats
    finishing resolve their incident exactly once."""
    hook, pd = receivers
    sim = start_sim()
    # The 53 oldest running chats hold the deployment's slots; the 200 after them queue.
    await sim.admin("POST", "/faults", {"capacity_roots": 53})
    workspaces = [
        (
            await sim.admin(
                "POST",
                "/workspaces",
                {
                    "owner": "alice",
                    "build_status": "failed",
                    "job_status": "failed",
                    "job_error": "insufficient quota: this build costs 10 credits, 0 left",
                },
            )
        )["id"]
        for _ in range(10)
    ]
    quota = [
        await sim.add_chat(
            "alice", status="running", age=900, title=f"quota {i}", workspace_id=workspaces[i % 10]
        )
        for i in range(50)
    ]
    plain = [
        await sim.add_chat("bob", status="running", age=900, title=f"plain {i}") for i in range(3)
    ]
    capacity = [
        await sim.add_chat(
            "alice" if i % 2 else "bob", status="running", age=600, title=f"queued {i}"
        )
        for i in range(200)
    ]
    await asyncio.sleep(1.5)  # the simulator's tick applies the cap
    d = start_daemon(
        sim,
        identities=[("team-a", "alice"), ("team-b", "bob")],
        extra={
            "budgets": {"running": "5m"},
            "receivers": [
                {"name": "hook", "webhook": {"url": hook.hook_url}},
                {
                    "name": "pager",
                    "pagerduty": {
                        "routing_key_file": secret(tmp_path, "pd", PD_KEY),
                        "url": pd.events_url,
                    },
                },
            ],
            # group_wait above the time the capacity reads take (150 GETs on team-a within
            # its default 300 requests a minute: ~25 s): a member is held back only if its
            # incident forms before its group is first notified (docs/alerting.md).
            "route": {
                "receiver": "hook",
                "group_wait": "35s",
                "group_interval": "2s",
                "repeat_interval": "1h",
                "routes": [
                    {"matchers": ['alertname=~".+"'], "receiver": "hook", "continue": True},
                    {"matchers": ['alertname=~".+"'], "receiver": "pager"},
                ],
            },
        },
    )  # fmt: skip
    await d.wait_ready()

    async def both_incidents() -> dict[str, Any] | None:
        doc = await d.status()
        got = {i["cause"]: i for i in doc["incidents"]}
        return got if got.keys() == {"capacity", "quota"} else None

    await eventually(both_incidents, within=50)
    await eventually(lambda: pd.pages >= 3, within=50)
    await asyncio.sleep(4)  # a member page would follow within two group_intervals
    # One page per cause, the three as themselves.
    fired = posted(hook, "firing")
    incident_fps = {a["fingerprint"] for a in fired if a["labels"]["alertname"] == "FleetIncident"}
    causes = {a["labels"]["cause"] for a in fired if a["labels"]["alertname"] == "FleetIncident"}
    assert causes == {"capacity", "quota"} and len(incident_fps) == 2
    members = {a["labels"]["chat_id"] for a in fired if a["labels"]["alertname"] == "ChatStuck"}
    assert members == set(plain), sorted(members)[:10]
    assert {a["labels"]["cause"] for a in fired if a["labels"].get("chat_id")} == {"unknown"}
    assert pd.pages == 3, pd.received
    keys = Counter(ev["dedup_key"] for ev in pd.received if ev["event_action"] == "trigger")
    assert incident_fps <= keys.keys()
    doc = await d.status()
    incidents = {i["cause"]: i for i in doc["incidents"]}
    cap = incidents["capacity"]
    assert cap["count"] == 200 and cap["identities"] == ["team-a", "team-b"]
    assert {m["chat_id"] for m in cap["members"]} <= set(capacity)
    assert incidents["quota"]["count"] == 50 and incidents["quota"]["identities"] == ["team-a"]
    last = [a for a in fired if a["labels"]["alertname"] == "FleetIncident"]
    assert {a["annotations"]["count"] for a in last if a["labels"]["cause"] == "quota"} == {"50"}
    counts = doc["alerts"]["counts"]
    assert counts["by_state"]["inhibited"] == 250 and counts["by_state"]["active"] == 5
    assert {i["cause"]: i["count"] for i in doc["incidents"]} == {"capacity": 200, "quota": 50}
    # The status page in Chromium: the incidents first, each expandable into its members.
    url = f"http://{d.listen}/status?format=html"
    page = await browser.dom(tmp_path, url)
    assert page.index('id="incidents"') < page.index('id="alerts"')
    assert page.count('<details class="incident"') == 2
    assert "200 chats stuck: deployment concurrency cap reached" in page
    assert f'href="{sim.url}/agents/{quota[0]}"' in page
    assert sim.token("alice") not in page and PD_KEY not in page
    await browser.screenshot(tmp_path, url, "status-incidents.png", size="1440,900")
    # The capacity chats finish: their incident resolves, once.
    for chat in capacity:
        await sim.set_status(chat, "waiting")
    cap_fp = cap["fingerprint"]

    def resolved_incident() -> int:
        return sum(1 for a in posted(hook, "resolved") if a["fingerprint"] == cap_fp)

    await eventually(lambda: resolved_incident() >= 1, within=30)
    await asyncio.sleep(4)
    assert resolved_incident() == 1
    assert [ev["dedup_key"] for ev in pd.received if ev["event_action"] == "resolve"] == [cap_fp]
    assert [i["cause"] for i in (await d.status())["incidents"]] == ["quota"]
    assert pd.rejected == []
