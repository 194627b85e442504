"""The dispatcher: grouping, silences, inhibition, retries, the log, restarts.

On a virtual loop clock (looptime): every send is noted at its loop time, so the
schedule (group_wait, group_interval, repeat_interval, backoff) is asserted exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.receivers import FakeWebhook
from watchd.alerting import dispatch as dispatch_module
from watchd.alerting import routing
from watchd.alerting.dispatch import Dispatcher
from watchd.alerting.grouprows import GroupRows
from watchd.alerting.model import Alert
from watchd.alerting.nflog import NotificationLog
from watchd.alerting.receivers.base import Notification, NotifyError, Rate
from watchd.alerting.receivers.simple import WebhookNotifier
from watchd.alerting.silencing import Inhibitor, Silence, Silencer
from watchd.config.alerting import InhibitRule, RouteConfig, default_inhibit
from watchd.kits.matchers import parse_matchers
from watchd.store.sqlite import StateFile

pytestmark = pytest.mark.looptime

# group_wait 30s, group_interval 5m, repeat_interval 4h: the defaults, in virtual time.
WAIT, INTERVAL, REPEAT = 30.0, 300.0, 4 * 3600.0


class LoopWall:
    """A wall clock that follows the loop's (virtual) clock, so repeat_interval moves."""

    def now(self) -> float:
        return 1_000.0 + asyncio.get_running_loop().time()


class Recorder:
    kind = "test"
    send_resolved = True
    resend_every: float | None = None

    def __init__(self, name: str = "r") -> None:
        self.name = name
        self.rate = Rate(per_second=1000, burst=1000)
        self.sent: list[Notification] = []
        self.fail: list[NotifyError] = []
        self.attempts: list[float] = []  # loop time of every attempt
        self.at: list[float] = []  # loop time of every accepted send

    async def notify(self, n: Notification) -> None:
        now = round(asyncio.get_running_loop().time(), 6)
        self.attempts.append(now)
        if self.fail:
            raise self.fail.pop(0)
        self.sent.append(n)
        self.at.append(now)


def alert(
    chat: str,
    *,
    identity: str = "a",
    name: str = "ChatStuck",
    status: str = "running",
    resolved: bool = False,
) -> Alert:
    return Alert(
        fingerprint=f"fp-{identity}-{chat}-{name}",
        labels={"alertname": name, "identity": identity, "status": status, "chat_id": chat},
        annotations={"summary": f"chat {chat}"},
        starts_at=1.0,
        ends_at=2.0 if resolved else None,
    )


@contextlib.asynccontextmanager
async def dispatcher(
    tmp: Path,
    *,
    route: dict[str, object] | None = None,
    silences: list[Silence] | None = None,
    rules: list[InhibitRule] | None = None,
    db: StateFile | None = None,
    rec: Recorder | None = None,
    crash: bool = False,
) -> AsyncIterator[tuple[Dispatcher, Recorder, StateFile]]:
    rec = rec or Recorder()
    db = db or StateFile(tmp / "state.sqlite3")
    cfg = RouteConfig.model_validate(
        route or {"receiver": "r", "group_wait": "30s", "group_interval": "5m"}
    )
    d = Dispatcher(
        route=routing.build(cfg),
        notifiers={"r": rec},
        db=db,
        silencer=Silencer(silences or []),
        inhibitor=Inhibitor(rules or []),
        wall=LoopWall(),
    )
    try:
        yield d, rec, db
    finally:
        if crash:  # no last flush: tasks just die with the process
            for g in d.groups.values():
                if g.task is not None:
                    g.task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await g.task
        else:
            await d.close(deadline=5.0)


async def test_many_alerts_one_notification_at_exactly_group_wait(tmp_path: Path) -> None:
    """200 chats stuck at once in one group produce one notification, at exactly group_wait;
    the flushes every group_interval after it send nothing new until repeat_interval."""
    async with dispatcher(tmp_path) as (d, rec, _):
        for i in range(200):
            d.put(alert(str(i)))
        await asyncio.sleep(REPEAT + 2 * INTERVAL)
        assert len(rec.sent[0].alerts) == 200
        # The first flush after sent_at + repeat_interval repeats it: 30 s + 49 × 5 m.
        assert rec.at == [WAIT, WAIT + 49 * INTERVAL]


async def test_a_change_waits_for_the_next_group_interval(tmp_path: Path) -> None:
    """An alert joining a group that has already sent goes out at the group's next
    group_interval tick, not at once and not after a new group_wait."""
    async with dispatcher(tmp_path) as (d, rec, _):
        d.put(alert("1"))
        await asyncio.sleep(WAIT + 10)
        d.put(alert("2"))
        await asyncio.sleep(INTERVAL)
        assert rec.at == [WAIT, WAIT + INTERVAL]
        assert [len(n.alerts) for n in rec.sent] == [1, 2]


async def test_resolve_is_sent_once(tmp_path: Path) -> None:
    """A resolved alert is notified once, at the next group_interval, and then leaves the group."""
    async with dispatcher(tmp_path) as (d, rec, _):
        d.put(alert("1"))
        await asyncio.sleep(WAIT + 1)
        d.put(alert("1", resolved=True))
        await asyncio.sleep(3 * INTERVAL)
        assert [n.status for n in rec.sent] == ["firing", "resolved"]
        assert rec.at == [WAIT, WAIT + INTERVAL]
        assert d.groups == {}


async def test_silenced_alerts_are_not_sent(tmp_path: Path) -> None:
    """An active silence mutes matching alerts; others still go out."""
    s = Silence(id="s1", matchers=parse_matchers(['identity="a"']), starts_at=0, ends_at=1e12)
    async with dispatcher(
        tmp_path,
        route={"receiver": "r", "group_wait": "30s", "group_by": ["alertname"]},
        silences=[s],
    ) as (d, rec, _):
        d.put(alert("1", identity="a"))
        d.put(alert("2", identity="b"))
        await asyncio.sleep(WAIT + 1)
        assert [a.labels["identity"] for a in rec.sent[0].alerts] == ["b"]
        assert d.muted["silenced"] == 1


async def test_identity_unhealthy_inhibits_its_chat_alerts(tmp_path: Path) -> None:
    """While IdentityUnhealthy fires for an identity, its ChatStuck is held back."""
    rule = InhibitRule(
        source_matchers=['alertname="IdentityUnhealthy"'],
        target_matchers=['alertname="ChatStuck"'],
        equal=["identity"],
    )
    async with dispatcher(tmp_path, rules=[rule]) as (d, rec, _):
        d.put(
            Alert(
                fingerprint="u",
                labels={"alertname": "IdentityUnhealthy", "identity": "a"},
                starts_at=1.0,
            )
        )
        d.put(alert("1", identity="a"))
        d.put(alert("2", identity="b"))
        await asyncio.sleep(WAIT + 1)
        sent = {(a.labels["alertname"], a.labels["identity"]) for n in rec.sent for a in n.alerts}
        assert sent == {("IdentityUnhealthy", "a"), ("ChatStuck", "b")}


async def test_by_default_a_fleet_incident_holds_back_its_members_pages(tmp_path: Path) -> None:
    """With the default inhibit rules, while a FleetIncident fires for (deployment, cause)
    its member chats' ChatStuck/ChatStranded are held back; another cause still pages."""

    def member(chat: str, cause: str, name: str = "ChatStuck") -> Alert:
        a = alert(chat, name=name)
        return Alert(a.fingerprint, {**a.labels, "deployment": "d", "cause": cause}, starts_at=1)

    incident = Alert(
        fingerprint="inc",
        labels={"alertname": "FleetIncident", "deployment": "d", "cause": "capacity"},
        starts_at=1.0,
    )
    async with dispatcher(tmp_path, rules=default_inhibit()) as (d, rec, _):
        d.put(incident)
        for i in range(5):
            d.put(member(str(i), "capacity"))
        d.put(member("s", "capacity", name="ChatStranded"))
        d.put(member("q", "quota"))
        await asyncio.sleep(WAIT + 1)
        sent = {a.labels.get("chat_id", a.name) for n in rec.sent for a in n.alerts}
        assert sent == {"FleetIncident", "q"}
        assert d.muted["inhibited"] == 6


def test_a_rule_whose_source_names_no_alertname_still_inhibits() -> None:
    """An inhibit rule whose source is matched by another label than alertname (beside
    one that names it) still finds its sources: the index passes over by alertname only
    when every rule names one."""
    rules = [
        *default_inhibit(),
        InhibitRule(
            source_matchers=['severity="critical"', 'team=~"a.*"'],
            target_matchers=['alertname="ChatStuck"'],
            equal=["identity"],
        ),
    ]
    source = Alert(
        "s", {"alertname": "Anything", "severity": "critical", "team": "ab", "identity": "a"}
    )
    named = Alert("u", {"alertname": "IdentityUnhealthy", "identity": "b"})
    inhibited = Inhibitor(rules).prepare([source, named, alert("x", identity="c")])
    assert inhibited(alert("1", identity="a")) and inhibited(alert("2", identity="b"))
    assert not inhibited(alert("3", identity="c"))
    only_named = Inhibitor(default_inhibit()).prepare([source, named])
    assert not only_named(alert("1", identity="a")) and only_named(alert("2", identity="b"))


async def test_transient_failure_retries_after_exactly_retry_after(tmp_path: Path) -> None:
    """A retryable failure is retried after max(backoff, Retry-After) — here exactly the
    server's 3 s — then recorded in the notification log."""
    rec = Recorder()
    rec.fail = [NotifyError("429", retryable=True, retry_after=3.0)]
    async with dispatcher(
        tmp_path, rec=rec, route={"receiver": "r", "group_wait": "30s", "group_interval": "1m"}
    ) as (d, _, db):
        d.put(alert("1"))
        await asyncio.sleep(WAIT + 10)
        assert rec.attempts == [WAIT, WAIT + 3.0] and rec.at == [WAIT + 3.0]
        assert d.stats["r"].retried == 1 and d.stats["r"].sent == 1
        assert db.part(NotificationLog).get("r", next(iter(d.groups))[1]) is not None


async def test_retry_after_holds_across_flushes(tmp_path: Path) -> None:
    """Two 429s with Retry-After: 3 in a row: the second wait is honoured too, though it
    ends past the flush's budget (the next flush waits for it, not group_interval)."""
    rec = Recorder()
    rec.fail = [NotifyError("429", retryable=True, retry_after=3.0) for _ in range(2)]
    async with dispatcher(
        tmp_path, rec=rec, route={"receiver": "r", "group_wait": "30s", "group_interval": "2s"}
    ) as (d, _, _db):
        d.put(alert("1"))
        await asyncio.sleep(WAIT + 20)
        assert rec.attempts == [WAIT, WAIT + 3.0, WAIT + 6.0] and rec.at == [WAIT + 6.0]
        assert d.stats["r"].failed == 1 and d.stats["r"].sent == 1


class TimedWebhook(Recorder):
    """A real webhook notifier whose attempts are noted at their loop time."""

    def __init__(self, notifier: WebhookNotifier) -> None:
        super().__init__()
        self.notifier = notifier

    async def notify(self, n: Notification) -> None:
        self.attempts.append(round(asyncio.get_running_loop().time(), 6))
        await self.notifier.notify(n)
        self.at.append(self.attempts[-1])


async def test_a_webhooks_two_429s_are_both_waited_for(tmp_path: Path) -> None:
    """A webhook answering 429 Retry-After: 3 twice is posted to again 3 s after each."""
    hook = await FakeWebhook().start()
    hook.script.answers = [(429, "slow down", {"Retry-After": "3"}) for _ in range(2)]
    try:
        async with aiohttp.ClientSession() as session:
            rec = TimedWebhook(WebhookNotifier("r", url=hook.hook_url, session=session, timeout=5))
            route = {"receiver": "r", "group_wait": "30s", "group_interval": "2s"}
            async with dispatcher(tmp_path, rec=rec, route=route) as (d, _, _db):
                d.put(alert("1"))
                await asyncio.sleep(WAIT + 20)
                gaps = [b - a for a, b in zip(rec.attempts, rec.attempts[1:], strict=False)]
                assert len(hook.received) == 1 and len(gaps) == 2
                assert all(g >= 3.0 for g in gaps), gaps
    finally:
        await hook.stop()


async def test_retries_back_off_and_give_up_at_the_flush_budget(tmp_path: Path) -> None:
    """Retryable failures back off (1 s doubling, jittered ±20 %) within one flush's budget
    (group_interval, at least 5 s, at most 60 s); the next flush, a group_interval later,
    delivers."""
    rec = Recorder()
    rec.fail = [NotifyError("503", retryable=True) for _ in range(4)]
    async with dispatcher(
        tmp_path, rec=rec, route={"receiver": "r", "group_wait": "30s", "group_interval": "10s"}
    ) as (d, _, _db):
        d.put(alert("1"))
        await asyncio.sleep(WAIT + 60)
        t = rec.attempts
        assert t[0] == WAIT and len(t) == 5
        for gap, base in zip((t[1] - t[0], t[2] - t[1], t[3] - t[2]), (1.0, 2.0, 4.0), strict=True):
            assert 0.8 * base <= gap <= 1.2 * base
        # The 4th failure's next backoff (≈ 8 s) would pass the 10 s budget: the flush gives
        # up at once, and the next flush runs exactly group_interval after it.
        assert rec.at == [round(t[3] + 10.0, 6)]
        st = d.stats["r"]
        assert (st.retried, st.failed, st.sent, st.retrying) == (3, 1, 1, set())


async def test_permanent_failure_is_a_config_error(tmp_path: Path) -> None:
    """A permanent failure is counted and remembered, not retried within the flush; the
    next flush (exactly group_interval later) tries again."""
    rec = Recorder()
    rec.fail = [NotifyError("channel_not_found", retryable=False)]
    async with dispatcher(tmp_path, rec=rec) as (d, _, _db):
        d.put(alert("1"))
        await asyncio.sleep(WAIT + 1)
        st = d.stats["r"]
        assert (st.failed, st.sent, st.retried) == (1, 0, 0)
        assert "channel_not_found" in st.last_error
        await asyncio.sleep(INTERVAL)
        assert rec.attempts == [WAIT, WAIT + INTERVAL] and rec.at == [WAIT + INTERVAL]


async def test_restart_neither_repages_nor_loses_a_resolve(tmp_path: Path) -> None:
    """Groups and the notification log survive a restart: no second page, the resolve arrives."""
    db = StateFile(tmp_path / "state.sqlite3")
    async with dispatcher(tmp_path, db=db, crash=True) as (d, rec, _):
        d.put(alert("1"))
        d.put(alert("2"))
        await asyncio.sleep(WAIT + 1)
        assert len(rec.sent) == 1
        d.put(alert("2", resolved=True))  # resolved, not yet flushed: then the crash
    rec2 = Recorder()
    async with dispatcher(tmp_path, db=db, rec=rec2) as (d2, _, _):
        t0 = asyncio.get_running_loop().time()
        assert d2.restore() == 2
        await asyncio.sleep(WAIT + 3 * INTERVAL)
        n = rec2.sent[0]
        assert [a.labels["chat_id"] for a in n.resolved] == ["2"]
        # Alert 1 was already paged before the restart: only the resolve is sent.
        assert rec2.at == [round(t0 + WAIT, 6)]
    db.close()


async def test_a_notifier_raising_anything_is_retried_and_the_group_survives(
    tmp_path: Path,
) -> None:
    """A notifier that raises ValueError (a bug, not a NotifyError) counts as a retryable
    failure: retried after the first backoff within the flush, the group stays, and
    nothing wedges."""

    class Buggy(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.bugs = 1

        async def notify(self, n: Notification) -> None:
            if self.bugs:
                self.bugs -= 1
                self.attempts.append(round(asyncio.get_running_loop().time(), 6))
                raise ValueError("a notifier bug")
            await super().notify(n)

    rec = Buggy()
    async with dispatcher(
        tmp_path, rec=rec, route={"receiver": "r", "group_wait": "30s", "group_interval": "1m"}
    ) as (d, _, _db):
        d.put(alert("1"))
        await asyncio.sleep(WAIT + 5)
        assert len(rec.sent) == 1 and rec.attempts[0] == WAIT
        assert 0.8 <= rec.at[0] - WAIT <= 1.2  # the first backoff step, jittered
        stats = d.stats["r"]
        assert stats.retried == 1 and "ValueError: a notifier bug" in stats.last_error
        assert len(d.groups) == 1
        d.put(alert("2"))
        d.put(alert("1", resolved=True))
        assert all(g.task is not None and not g.task.done() for g in d.groups.values())


async def test_handed_over_alerts_leave_their_groups_without_a_notification(
    tmp_path: Path,
) -> None:
    """Resharding: alerts of an identity handed to another replica are dropped from their
    groups (and from the persisted state) with no resolve sent; other alerts stay."""
    async with dispatcher(tmp_path) as (d, rec, db):
        d.put(alert("1"))
        d.put(alert("2"))
        await asyncio.sleep(WAIT + 1)
        assert [len(n.alerts) for n in rec.sent] == [2]
        assert d.hand_over(["fp-a-1-ChatStuck"]) == 1
        await asyncio.sleep(3 * INTERVAL)
        assert [n.status for n in rec.sent] == ["firing"]
        assert "fp-a-1-ChatStuck" not in d.alerts
        (group,) = d.groups.values()
        assert list(group.alerts) == ["fp-a-2-ChatStuck"]
        db.flush()
        assert [b["fingerprint"] for _, _, b in db.part(GroupRows).load()] == ["fp-a-2-ChatStuck"]


async def test_an_alert_past_the_group_limit_is_counted_not_lost_silently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the aggregation-group limit an alert needing a new group is counted (group
    overflow and the receiver's dropped), and the groups that exist still deliver."""
    monkeypatch.setattr(dispatch_module, "MAX_GROUPS", 1)
    route: dict[str, object] = {"receiver": "r", "group_wait": "30s", "group_by": ["alertname"]}
    async with dispatcher(tmp_path, route=route) as (d, rec, _):
        d.put(alert("1", name="ChatStuck"))
        d.put(alert("2", name="ChatErrored"))
        await asyncio.sleep(WAIT + 1)
        assert (d.group_overflow, d.stats["r"].dropped) == (1, 1)
        assert rec.at == [WAIT] and rec.sent[0].alerts[0].labels["alertname"] == "ChatStuck"


async def test_a_large_notification_holds_the_state_flush_while_it_is_sent(
    tmp_path: Path,
) -> None:
    """A notification of HOLD_WRITES_AT alerts or more is sent with the state file's flush
    held (not one of fewer): nothing is written while it is on the wire, everything
    pending goes with the first flush after the send, or after HOLD_MAX if it never
    ends."""
    from watchd.alerting.dispatch import HOLD_WRITES_AT
    from watchd.store.records import ChatRecord
    from watchd.store.rows import ChatRows
    from watchd.store.sqlite import HOLD_MAX

    held: list[bool] = []
    rec = Recorder()
    notify = rec.notify

    async def slow_notify(n: Notification) -> None:
        held.append(db.held)
        await asyncio.sleep(0.5)  # the POST of a burst's body
        await notify(n)

    rec.notify = slow_notify  # type: ignore[method-assign]
    route: dict[str, object] = {
        "receiver": "r",
        "group_by": ["chat_id"],
        "group_wait": "0s",
        "group_interval": "1m",
    }
    async with dispatcher(tmp_path, rec=rec, route=route) as (d, _, db):
        rows, chats = db.part(GroupRows), db.part(ChatRows)
        d.put(alert("small"))
        await asyncio.sleep(1)
        route_all = {"receiver": "r", "group_wait": "0s", "group_interval": "1m"}
        d.route = routing.build(RouteConfig.model_validate(route_all))
        for i in range(HOLD_WRITES_AT):
            d.put(alert(f"big-{i}"))
        for _ in range(10):  # a few loop turns: the group's flush starts sending the body
            await asyncio.sleep(0)
        assert db.held
        chats.mark(ChatRecord("a", "c1", "running", 1.0, "transition", 1.0, 1.0))
        assert await db.flush_async() == 0  # held: nothing, not even the chat
        assert rows.pending == HOLD_WRITES_AT + 1 and chats.pending == 1
        await asyncio.sleep(0.5)  # the send ends
        assert held == [False, True] and not db.held
        assert await db.flush_async() == HOLD_WRITES_AT + 2
        with db.holding():  # a send that never ends: the rows go after HOLD_MAX
            rows.delete("r", "gone", ["fp"])
            assert await db.flush_async() == 0
            await asyncio.sleep(HOLD_MAX)
            assert await db.flush_async() == 1


# -- holding a burst that is fired piece by piece -------------------------------------


async def test_a_burst_put_during_a_hold_is_one_notification_when_it_ends(tmp_path: Path) -> None:
    """With group_wait 0, alerts put over two seconds under a hold reach the receiver as
    one notification when the hold ends; one resolved before the end is in it as
    resolved (as Alertmanager sends a group's resolved alerts with it), never as firing;
    a group no held alert reached flushes meanwhile."""
    route = {
        "receiver": "r",
        "group_by": ["identity"],
        "group_wait": "0s",
        "group_interval": "1s",
    }
    async with dispatcher(tmp_path, route=route) as (d, rec, _):
        loop = asyncio.get_running_loop()
        d.put(alert("o1", identity="other"))
        with d.holding():
            for i in range(20):
                d.put(alert(f"c{i}"))
                await asyncio.sleep(0.1)
            d.put(alert("c3", resolved=True))
            assert [[a.labels["chat_id"] for a in n.alerts] for n in rec.sent] == [["o1"]]
            ended = loop.time()
        await asyncio.sleep(0.01)
        assert len(rec.sent) == 2 and rec.at[1] == round(ended, 6)
        said = sorted((a.labels["chat_id"], a.status) for a in rec.sent[1].alerts)
        assert said == sorted((f"c{i}", "resolved" if i == 3 else "firing") for i in range(20))
        await asyncio.sleep(5)
        assert len(rec.sent) == 2


async def test_a_hold_never_keeps_a_group_quiet_past_its_bound(tmp_path: Path) -> None:
    """A hold that is never released (a burst whose listing hangs) delays its groups'
    first notification by HOLD_FLUSH_MAX at most."""
    route = {"receiver": "r", "group_wait": "0s", "group_interval": "1s"}
    async with dispatcher(tmp_path, route=route) as (d, rec, _):
        loop = asyncio.get_running_loop()
        with d.holding():
            started = loop.time()
            d.put(alert("c1"))
            await asyncio.sleep(dispatch_module.HOLD_FLUSH_MAX + 1)
            assert [round(t - started, 3) for t in rec.at] == [dispatch_module.HOLD_FLUSH_MAX]
