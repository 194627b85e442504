"""Notifiers against protocol-faithful fake Slack, PagerDuty and webhook servers."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import pytest
from structlog.testing import capture_logs

from tests.fakes.receivers import SLACK_PATH, FakePagerDuty, FakeSlack, FakeWebhook
from watchd.alerting.model import Alert, fingerprint, resolution
from watchd.alerting.receivers.base import Notification, NotifyError
from watchd.alerting.receivers.pagerduty import PagerDutyNotifier, dedup_key
from watchd.alerting.receivers.simple import AlertmanagerNotifier, WebhookNotifier
from watchd.alerting.receivers.slack import SlackNotifier
from watchd.detection.incidents import Incidents

KEY = "R0UT1NGKEY0123456789abcdefABCDEF"
HOSTILE = "Deploy <!channel> & <script>alert(1)</script> <@U123> <#C1|x>"


def chat_alert(
    i: int, *, title: str = "chat", resolved: bool = False, severity: str = "warning"
) -> Alert:
    return Alert(
        fingerprint=f"fp{i}",
        labels={
            "alertname": "ChatStuck",
            "identity": "team-a",
            "status": "running",
            "severity": severity,
            "chat_id": f"chat-{i}",
            "owner": "alice",
            "deployment": "https://coder.example.com",
        },
        annotations={
            "summary": f'Chat "{title}" has been running for 35m (budget 30m)',
            "title": title,
            "time_in_status": "35m",
            "budget": "30m",
            "hint": "check quota <now>",
            "link": f"https://coder.example.com/agents/{i}",
        },
        starts_at=1_800_000_000.0 + i,
        ends_at=1_800_000_500.0 if resolved else None,
    )


def note(*alerts: Alert) -> Notification:
    return Notification(
        receiver="r",
        group_key="root:{identity='team-a'}",
        group_labels={"identity": "team-a", "alertname": "ChatStuck"},
        alerts=alerts,
        external_url="http://watchd.local:9310",
    )


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    s = await FakeSlack().start()
    yield s
    await s.stop()


@pytest.fixture
async def pd() -> AsyncIterator[FakePagerDuty]:
    p = await FakePagerDuty().start()
    yield p
    await p.stop()


@pytest.fixture
async def hook() -> AsyncIterator[FakeWebhook]:
    h = await FakeWebhook().start()
    yield h
    await h.stop()


async def test_slack_escapes_hostile_titles(
    slack: FakeSlack, session: aiohttp.ClientSession
) -> None:
    """<!channel>, & and <script> in a title arrive escaped; the fake accepts the message."""
    n = SlackNotifier("chat", webhook_url=slack.webhook_url, session=session, timeout=5)
    await n.notify(note(chat_alert(1, title=HOSTILE)))
    assert slack.rejected == [] and len(slack.received) == 1
    text = json.dumps(slack.received[0])
    assert "&lt;!channel&gt; &amp; &lt;script&gt;" in text
    assert "<!channel>" not in text and "<script>" not in text
    assert slack.received[0]["text"].startswith("[FIRING:1] ChatStuck")


async def test_slack_many_chats_fit_the_limits(
    slack: FakeSlack, session: aiohttp.ClientSession
) -> None:
    """200 chats become one message within 50 blocks with a '+N more' line."""
    n = SlackNotifier(
        "chat", webhook_url=slack.webhook_url, session=session, timeout=5, max_chats=10
    )
    await n.notify(note(*[chat_alert(i, title="x" * 5000) for i in range(200)]))
    msg = slack.received[0]
    assert len(msg["blocks"]) <= 50
    assert any(e["text"] == "+190 more" for b in msg["blocks"] for e in b.get("elements", []))
    assert all(len(b["text"]["text"]) <= 3000 for b in msg["blocks"] if b["type"] == "section")


@pytest.mark.parametrize(
    ("status", "body", "retryable"),
    [
        (404, "channel_not_found", False),
        (410, "channel_is_archived", False),
        (403, "action_prohibited", False),
        (400, "invalid_payload", False),
        (500, "rollup_error", True),
        (503, "", True),
    ],
)
async def test_slack_error_classification(
    slack: FakeSlack, session: aiohttp.ClientSession, status: int, body: str, retryable: bool
) -> None:
    """Slack's documented error strings are permanent; rollup_error and 5xx are transient."""
    slack.script.answers.append((status, body, {}))
    n = SlackNotifier("chat", webhook_url=slack.webhook_url, session=session, timeout=5)
    with pytest.raises(NotifyError) as err:
        await n.notify(note(chat_alert(1)))
    assert err.value.retryable is retryable
    assert slack.webhook_url not in str(err.value) and "XXXX" not in str(err.value)


@pytest.mark.parametrize(
    ("status", "body", "word"),
    [
        (404, "channel_not_found:" + SLACK_PATH, "channel_not_found"),
        (403, "invalid_token" + SLACK_PATH[10:], "invalid_token"),
        (404, "no_service_id/T0000/B0000/XXXXX", "no_service_id"),
        (400, "T0000/B0000/XXXXX-is-not-a-webhook", "unrecognised answer"),
        (200, "B0000/XXXXX", "unrecognised answer"),
    ],
)
async def test_slack_errors_quote_only_slacks_error_word(
    slack: FakeSlack, session: aiohttp.ClientSession, status: int, body: str, word: str
) -> None:
    """An answer quoting the webhook path leaves only Slack's error word in the error: no
    workspace or channel id, no fragment of the key."""
    slack.script.answers.append((status, body, {}))
    n = SlackNotifier("chat", webhook_url=slack.webhook_url, session=session, timeout=5)
    with pytest.raises(NotifyError) as err:
        await n.notify(note(chat_alert(1)))
    text = str(err.value)
    assert f": {word} (HTTP {status})" in text
    assert "T0000" not in text and "B0000" not in text and "XXXXX" not in text


async def test_slack_429_carries_retry_after(
    slack: FakeSlack, session: aiohttp.ClientSession
) -> None:
    """A 429 is retryable with the server's Retry-After."""
    slack.script.answers.append((429, "rate_limited", {"Retry-After": "7"}))
    n = SlackNotifier("chat", webhook_url=slack.webhook_url, session=session, timeout=5)
    with pytest.raises(NotifyError) as err:
        await n.notify(note(chat_alert(1)))
    assert err.value.retryable and err.value.retry_after == 7


async def test_pagerduty_trigger_and_resolve_share_the_dedup_key(
    pd: FakePagerDuty, session: aiohttp.ClientSession
) -> None:
    """Trigger then resolve use one dedup_key and routing key; the incident opens once."""
    n = PagerDutyNotifier("pager", routing_key=KEY, url=pd.events_url, session=session, timeout=5)
    await n.notify(note(chat_alert(1), chat_alert(2)))
    await n.notify(note(chat_alert(1), chat_alert(2)))  # a re-send after a crash
    await n.notify(note(chat_alert(1, resolved=True), chat_alert(2, resolved=True)))
    assert pd.rejected == []
    keys = {ev["dedup_key"] for ev in pd.received}
    assert keys == {dedup_key("root:{identity='team-a'}")}
    assert pd.pages == 1 and pd.resolves == 1
    trigger = pd.received[0]
    assert trigger["payload"]["severity"] == "warning"
    assert [link["href"] for link in trigger["links"]][:2] == [
        "https://coder.example.com/agents/1",
        "https://coder.example.com/agents/2",
    ]
    assert len(trigger["payload"]["custom_details"]["chats"]) == 2


async def test_pagerduty_summary_and_size_limits(
    pd: FakePagerDuty, session: aiohttp.ClientSession
) -> None:
    """Long summaries are cut to 1024 and huge groups shrink under 512 KB."""
    n = PagerDutyNotifier("pager", routing_key=KEY, url=pd.events_url, session=session, timeout=5)
    await n.notify(note(*[chat_alert(i, title="t" * 3000) for i in range(400)]))
    assert pd.rejected == [] and len(pd.received) == 1
    ev = pd.received[0]
    assert len(ev["payload"]["summary"]) <= 1024
    assert len(json.dumps(ev)) <= 512 * 1024


@pytest.mark.parametrize(
    ("status", "retryable"), [(400, False), (429, True), (500, True), (502, True)]
)
async def test_pagerduty_answers(
    pd: FakePagerDuty, session: aiohttp.ClientSession, status: int, retryable: bool
) -> None:
    """400 is permanent; 429 and 5xx are retried; the routing key never shows."""
    pd.script.answers.append((status, json.dumps({"status": "invalid", "key": KEY}), {}))
    n = PagerDutyNotifier("pager", routing_key=KEY, url=pd.events_url, session=session, timeout=5)
    with pytest.raises(NotifyError) as err:
        await n.notify(note(chat_alert(1)))
    assert err.value.retryable is retryable and KEY not in str(err.value)


async def test_pagerduty_critical_wins(pd: FakePagerDuty, session: aiohttp.ClientSession) -> None:
    """The group's severity is its most severe alert's, mapped to PagerDuty's set."""
    n = PagerDutyNotifier("pager", routing_key=KEY, url=pd.events_url, session=session, timeout=5)
    await n.notify(note(chat_alert(1), chat_alert(2, severity="critical")))
    assert pd.received[0]["payload"]["severity"] == "critical"


async def test_webhook_v4_body_and_signature(
    hook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    """The webhook body is Alertmanager's v4 format, signed with HMAC-SHA256."""
    n = WebhookNotifier(
        "ops", url=hook.hook_url, session=session, timeout=5, hmac_secret="sekrit-hmac-key"
    )
    await n.notify(note(chat_alert(1), chat_alert(2, resolved=True)))
    body = hook.received[0]
    assert body["version"] == "4" and body["status"] == "firing"
    assert body["groupLabels"] == {"identity": "team-a", "alertname": "ChatStuck"}
    assert body["commonLabels"]["identity"] == "team-a" and "chat_id" not in body["commonLabels"]
    assert [a["status"] for a in body["alerts"]] == ["firing", "resolved"]
    assert body["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert body["alerts"][1]["fingerprint"] == "fp2"
    expected = hmac.new(b"sekrit-hmac-key", hook.raw[0], hashlib.sha256).hexdigest()
    assert hook.headers[0]["X-Watchd-Signature"] == f"sha256={expected}"


async def test_webhook_failures_classified(
    hook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    """4xx is permanent, 5xx and network errors are transient."""
    n = WebhookNotifier("ops", url=hook.hook_url, session=session, timeout=5)
    hook.script.answers.append((404, "nope", {}))
    with pytest.raises(NotifyError) as err:
        await n.notify(note(chat_alert(1)))
    assert not err.value.retryable
    hook.script.answers.append((503, "busy", {}))
    with pytest.raises(NotifyError) as err:
        await n.notify(note(chat_alert(1)))
    assert err.value.retryable
    dead = WebhookNotifier("ops", url="http://127.0.0.1:9/alerts", session=session, timeout=2)
    with pytest.raises(NotifyError) as err:
        await dead.notify(note(chat_alert(1)))
    assert err.value.retryable


async def test_alertmanager_body(hook: FakeWebhook, session: aiohttp.ClientSession) -> None:
    """Alertmanager pushes carry endsAt ENDS_AT_HORIZON ahead while firing (so only a
    real resolve ends the alert there, never resolve_timeout) and the resolve time after."""
    from datetime import datetime

    from watchd.alerting.receivers.simple import ENDS_AT_HORIZON

    am = await FakeWebhook(path="/api/v2/alerts").start()
    try:
        n = AlertmanagerNotifier("am", urls=[am.url], session=session, timeout=5)
        before = time.time()
        await n.notify(note(chat_alert(1), chat_alert(2, resolved=True)))
        firing, resolved = am.received[0]
        ends = datetime.fromisoformat(firing["endsAt"].replace("Z", "+00:00")).timestamp()
        assert before + ENDS_AT_HORIZON - 1 <= ends <= time.time() + ENDS_AT_HORIZON + 1
        assert resolved["endsAt"].endswith("Z") and resolved["endsAt"] != firing["endsAt"]
        assert firing["labels"]["chat_id"] == "chat-1"
        assert n.resend_every is not None and n.resend_every < 300
    finally:
        await am.stop()


async def test_alertmanager_cluster_gets_every_alert_at_every_peer(
    session: aiohttp.ClientSession,
) -> None:
    """With urls (a cluster's peers) each push goes to every peer; one peer down is still a
    delivery; every peer down is a retryable failure."""
    peers = [await FakeWebhook(path="/api/v2/alerts").start() for _ in range(2)]
    try:
        n = AlertmanagerNotifier("am", urls=[p.url for p in peers], session=session, timeout=5)
        await n.notify(note(chat_alert(1)))
        assert [len(p.received) for p in peers] == [1, 1]
        assert peers[0].received[0] == peers[1].received[0]
        peers[1].script.answers.append((503, "busy", {}))
        await n.notify(note(chat_alert(2)))  # no error: peer 0 took it
        assert [len(p.received) for p in peers] == [2, 1]
        assert n.peer_errors[1]
        for p in peers:
            p.script.answers.append((503, "busy", {}))
        with pytest.raises(NotifyError) as err:
            await n.notify(note(chat_alert(3)))
        assert err.value.retryable and "every peer failed" in str(err.value)
    finally:
        for p in peers:
            await p.stop()


async def test_a_failing_alertmanager_peer_is_visible_and_logged_once(
    session: aiohttp.ClientSession,
) -> None:
    """A peer that fails while the cluster still delivers shows as down (host, error) in
    peers(), is logged once when it starts failing and once when it recovers."""
    peers = [await FakeWebhook(path="/api/v2/alerts").start() for _ in range(2)]
    try:
        n = AlertmanagerNotifier("am", urls=[p.url for p in peers], session=session, timeout=5)
        assert [p["up"] for p in n.peers()] == [None, None]
        peers[1].script.answers += [(503, "busy", {})] * 3
        with capture_logs() as lines:
            for i in range(3):
                await n.notify(note(chat_alert(i)))
            down = n.peers()
            await n.notify(note(chat_alert(9)))
        assert [p["up"] for p in down] == [True, False]
        assert down[1]["host"] == peers[1].url.removeprefix("http://")
        assert "HTTP 503: busy" in down[1]["last_error"] and down[0]["last_error"] == ""
        assert [p["up"] for p in n.peers()] == [True, True]
        events = [(e["event"], e.get("peer")) for e in lines if "peer" in e["event"]]
        assert events == [("alertmanager.peer_failing", 1), ("alertmanager.peer_recovered", 1)]
    finally:
        for p in peers:
            await p.stop()


async def test_alertmanager_api_path_goes_before_the_query(
    session: aiohttp.ClientSession,
) -> None:
    """An Alertmanager URL with a query string gets /api/v2/alerts on its path, the query
    kept after it."""
    am = await FakeWebhook(path="/am/api/v2/alerts").start()
    try:
        n = AlertmanagerNotifier("am", urls=[am.url + "/am/?tenant=t1"], session=session, timeout=5)
        assert n.url == am.url + "/am/api/v2/alerts?tenant=t1"
        await n.notify(note(chat_alert(1)))
        assert len(am.received) == 1
    finally:
        await am.stop()


def test_common_labels_and_annotations_keep_the_first_alerts_order() -> None:
    """Common pairs are those every alert has with the same value, in the first's order."""
    from types import MappingProxyType

    a = Alert("1", {"z": "1", "a": "2", "m": "3"}, {"s": "x", "t": "y"})
    b = Alert("2", {"m": "3", "z": "1", "a": "9"}, {"t": "y"})
    c = Alert("3", MappingProxyType({"a": "2", "m": "3", "z": "1"}), {"s": "x", "t": "y"})
    n = Notification("r", "k", {}, (a, b, c))
    assert list(n.common_labels().items()) == [("z", "1"), ("m", "3")]
    assert n.common_annotations() == {"t": "y"}
    assert Notification("r", "k", {}, (a,)).common_labels() == {"z": "1", "a": "2", "m": "3"}
    assert Notification("r", "k", {}, ()).common_labels() == {}
    assert Notification("r", "k", {}, (a, Alert("4", {}))).common_labels() == {}


def test_webhook_json_is_the_v4_body_of_each_alert() -> None:
    """The encoded webhook body lists each alert as am_alert renders it, firing or resolved."""
    from watchd.alerting.receivers.base import dumps
    from watchd.alerting.receivers.simple import am_alert, webhook_body, webhook_json

    alerts = tuple(
        Alert(
            f"f{i}",
            {"alertname": "ChatStuck", "identity": "a", "chat_id": str(i)},
            {"summary": f"s{i}", "clock": "transition"},
            starts_at=1764600000.5 + i,
            ends_at=None if i % 3 else 1764600100.25,
        )
        for i in range(7)
    )
    n = Notification("r", "k", {"identity": "a"}, alerts, "http://watchd")
    body = orjson_loads(webhook_json(n))
    assert body == orjson_loads(dumps(webhook_body(n)))
    each = [am_alert(a, generator_url="http://watchd/status") for a in alerts]
    assert webhook_json(n) == dumps({**webhook_body(n), "alerts": each})  # byte for byte
    assert body["commonLabels"] == {"alertname": "ChatStuck", "identity": "a"}
    assert body["commonAnnotations"] == {"clock": "transition"}


def orjson_loads(raw: bytes) -> object:
    return json.loads(raw)


def incident_alert(members: int = 212, *, cause: str = "capacity", resolved: bool = False) -> Alert:
    """A FleetIncident as the ledger renders it over ``members`` chat alerts."""
    inc = Incidents(min_chats=5)
    for i in range(members):
        a = chat_alert(i)
        inc.join(replace(a, labels={**a.labels, "cause": cause}))
    fired, _ = inc.settle()
    alert = fired[0]
    return resolution(alert, at=alert.starts_at + 600, why="test") if resolved else alert


def incident_note(*alerts: Alert) -> Notification:
    return Notification(
        receiver="r",
        group_key="root:{alertname='FleetIncident'}",
        group_labels={"alertname": "FleetIncident"},
        alerts=alerts,
        external_url="http://watchd.local:9310",
    )


async def test_slack_shows_an_incidents_cause_count_fix_and_first_members_linked(
    slack: FakeSlack, session: aiohttp.ClientSession
) -> None:
    """A 212-chat FleetIncident is one section: the cause, the count, the identities, the
    fix, the first max_chats members each linked to its chat, and "+202 more"."""
    n = SlackNotifier("chat", webhook_url=slack.webhook_url, session=session, timeout=5)
    await n.notify(incident_note(incident_alert()))
    assert slack.rejected == []
    msg = slack.received[0]
    sections = [b["text"]["text"] for b in msg["blocks"] if b["type"] == "section"]
    assert len(sections) == 1
    text = sections[0]
    assert "212 chats stuck: deployment concurrency cap reached" in text
    assert "cause `capacity` · 212 chats · identities team-a" in text
    assert "*Fix:* _the deployment runs as many chats as it may at once" in text
    assert "<https://coder.example.com/agents/0|chat-0>" in text
    assert "<https://coder.example.com/agents/9|chat-9>" in text
    assert "chat-10" not in text and text.endswith("(+202 more)")
    assert msg["text"].startswith("[FIRING:1] FleetIncident: 212 chats stuck")


async def test_slack_incident_members_stay_within_the_section_limit(
    slack: FakeSlack, session: aiohttp.ClientSession
) -> None:
    """With max_chats 50 and long links, the members listed stop before Slack's 3000
    characters, and the rest are counted, never cut mid-link."""
    a = incident_alert(60)
    long_links = " ".join(f"https://coder.example.com/{'x' * 180}/{i}" for i in range(20))
    a = replace(a, annotations={**a.annotations, "links": long_links})
    n = SlackNotifier(
        "chat", webhook_url=slack.webhook_url, session=session, timeout=5, max_chats=50
    )
    await n.notify(incident_note(a))
    assert slack.rejected == []
    text = next(b["text"]["text"] for b in slack.received[0]["blocks"] if b["type"] == "section")
    assert len(text) <= 3000 and not text.endswith("…")
    listed = text.count("<https://coder.example.com/")
    assert 0 < listed < 20 and text.endswith(f"(+{60 - listed} more)")


async def test_pagerduty_gets_one_incident_per_fleet_incident_keyed_by_its_fingerprint(
    pd: FakePagerDuty, session: aiohttp.ClientSession
) -> None:
    """Two FleetIncidents and a chat alert in one group are three PagerDuty incidents: each
    FleetIncident's dedup_key is its fingerprint (trigger, re-send and resolve alike),
    custom_details carry the count, identities and member ids; the chat alert keeps the
    group's key."""
    cap, quota = incident_alert(), incident_alert(50, cause="quota")
    assert cap.fingerprint == fingerprint("https://coder.example.com", "capacity", "FleetIncident")
    n = PagerDutyNotifier("pager", routing_key=KEY, url=pd.events_url, session=session, timeout=5)
    await n.notify(incident_note(cap, quota, chat_alert(1)))
    await n.notify(incident_note(cap, quota, chat_alert(1)))  # a re-send after a crash
    await n.notify(incident_note(incident_alert(resolved=True), quota, chat_alert(1)))
    assert pd.rejected == []
    keys = [ev["dedup_key"] for ev in pd.received]
    group = dedup_key("root:{alertname='FleetIncident'}")
    assert keys == [cap.fingerprint, quota.fingerprint, group] * 3
    assert pd.pages == 3 and pd.resolves == 1
    assert pd.received[6] == {
        "routing_key": KEY,
        "event_action": "resolve",
        "dedup_key": cap.fingerprint,
    }
    details = pd.received[0]["payload"]["custom_details"]
    assert details["count"] == 212 and details["identities"] == ["team-a"]
    assert details["cause"] == "capacity" and len(details["chats"]) == 20
    assert details["fix"].startswith("the deployment runs as many chats")
    assert pd.received[0]["payload"]["summary"].startswith("212 chats stuck")
    assert pd.received[0]["links"][0] == {
        "href": "https://coder.example.com/agents/0",
        "text": "chat-0",
    }
    assert len(pd.received[0]["links"]) == 10
