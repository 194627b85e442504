"""The dispatcher: grouping, silences, inhibition, retries, the log, restarts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from watchd.alerting import routing
from watchd.alerting.dispatch import Dispatcher
from watchd.alerting.model import Alert
from watchd.alerting.receivers.base import Notification, NotifyError, Rate
from watchd.alerting.silencing import Inhibitor, Silence, Silencer
from watchd.config.alerting import InhibitRule, RouteConfig
from watchd.kits.matchers import parse_matchers
from watchd.store.persistence import StateDB


class Recorder:
    kind = "test"
    send_resolved = True
    resend_every: float | None = None

    def __init__(self, name: str = "r") -> None:
        self.name = name
        self.rate = Rate(per_second=1000, burst=1000)
        self.sent: list[Notification] = []
        self.fail: list[NotifyError] = []

    async def notify(self, n: Notification) -> None:
        if self.fail:
            raise self.fail.pop(0)
        self.sent.append(n)


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
    db: StateDB | None = None,
    rec: Recorder | None = None,
    crash: bool = False,
) -> AsyncIterator[tuple[Dispatcher, Recorder, StateDB]]:
    rec = rec or Recorder()
    db = db or StateDB(tmp / "state.sqlite3")
    cfg = RouteConfig.model_validate(
        route or {"receiver": "r", "group_wait": "50ms", "group_interval": "200ms"}
    )
    d = Dispatcher(
        route=routing.build(cfg),
        notifiers={"r": rec},
        db=db,
        silencer=Silencer(silences or []),
        inhibitor=Inhibitor(rules or []),
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
            await d.close(deadline=0.5)


async def test_many_alerts_one_notification(tmp_path: Path) -> None:
    """200 chats stuck at once in one group produce one notification, not 200."""
    async with dispatcher(tmp_path) as (d, rec, _):
        for i in range(200):
            d.put(alert(str(i)))
        await asyncio.sleep(0.15)
        assert len(rec.sent) == 1 and len(rec.sent[0].alerts) == 200
        await asyncio.sleep(0.5)
        assert len(rec.sent) == 1, "nothing changed: no repeat before repeat_interval"


async def test_resolve_is_sent_once(tmp_path: Path) -> None:
    """A resolved alert is notified once and then leaves the group."""
    async with dispatcher(tmp_path) as (d, rec, _):
        d.put(alert("1"))
        await asyncio.sleep(0.15)
        d.put(alert("1", resolved=True))
        await asyncio.sleep(0.5)
        assert [n.status for n in rec.sent] == ["firing", "resolved"]
        assert d.groups == {}


async def test_silenced_alerts_are_not_sent(tmp_path: Path) -> None:
    """An active silence mutes matching alerts; others still go out."""
    s = Silence(id="s1", matchers=parse_matchers(['identity="a"']), starts_at=0, ends_at=1e12)
    async with dispatcher(
        tmp_path,
        route={"receiver": "r", "group_wait": "50ms", "group_by": ["alertname"]},
        silences=[s],
    ) as (d, rec, _):
        d.put(alert("1", identity="a"))
        d.put(alert("2", identity="b"))
        await asyncio.sleep(0.15)
        assert [a.labels["identity"] for a in rec.sent[0].alerts] == ["b"]
        assert d.muted["silenced"] >= 1


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
        await asyncio.sleep(0.15)
        sent = {(a.labels["alertname"], a.labels["identity"]) for n in rec.sent for a in n.alerts}
        assert sent == {("IdentityUnhealthy", "a"), ("ChatStuck", "b")}


async def test_transient_failure_retries_with_retry_after(tmp_path: Path) -> None:
    """A retryable failure is retried no sooner than Retry-After, then recorded."""
    rec = Recorder()
    rec.fail = [NotifyError("429", retryable=True, retry_after=0.3)]
    async with dispatcher(
        tmp_path, rec=rec, route={"receiver": "r", "group_wait": "10ms", "group_interval": "10s"}
    ) as (d, _, db):
        d.put(alert("1"))
        await asyncio.sleep(0.2)
        assert rec.sent == []
        await asyncio.sleep(1.5)
        assert len(rec.sent) == 1
        assert d.stats["r"].retried == 1 and d.stats["r"].sent == 1
        assert db.nflog_get("r", next(iter(d.groups))[1]) is not None


async def test_permanent_failure_is_a_config_error(tmp_path: Path) -> None:
    """A permanent failure is counted, remembered, and not retried within the flush."""
    rec = Recorder()
    rec.fail = [NotifyError("channel_not_found", retryable=False)]
    async with dispatcher(tmp_path, rec=rec) as (d, _, _db):
        d.put(alert("1"))
        await asyncio.sleep(0.15)
        st = d.stats["r"]
        assert (st.failed, st.permanent_failures, st.sent) == (1, 1, 0)
        assert "channel_not_found" in st.last_error
        await asyncio.sleep(0.3)
        assert st.sent == 1, "the next flush tries again (the config may have been fixed)"


async def test_restart_neither_repages_nor_loses_a_resolve(tmp_path: Path) -> None:
    """Groups and the notification log survive a restart: no second page, the resolve arrives."""
    db = StateDB(tmp_path / "state.sqlite3")
    async with dispatcher(tmp_path, db=db, crash=True) as (d, rec, _):
        d.put(alert("1"))
        d.put(alert("2"))
        await asyncio.sleep(0.15)
        assert len(rec.sent) == 1
        d.put(alert("2", resolved=True))  # resolved, not yet flushed: then the crash
    rec2 = Recorder()
    async with dispatcher(tmp_path, db=db, rec=rec2) as (d2, _, _):
        assert d2.restore() == 2
        await asyncio.sleep(0.15)
        assert len(rec2.sent) == 1
        n = rec2.sent[0]
        assert [a.labels["chat_id"] for a in n.resolved] == ["2"]
        await asyncio.sleep(0.4)
        assert len(rec2.sent) == 1, "alert 1 was already paged before the restart"
    db.close()


async def test_a_notifier_raising_anything_is_retried_and_the_group_survives(
    tmp_path: Path,
) -> None:
    """A notifier that raises ValueError (a bug, not a NotifyError) counts as a retryable
    failure: the group stays, the next flush delivers, and nothing wedges."""

    class Buggy(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.bugs = 1

        async def notify(self, n: Notification) -> None:
            if self.bugs:
                self.bugs -= 1
                raise ValueError("a notifier bug")
            await super().notify(n)

    rec = Buggy()
    async with dispatcher(
        tmp_path, rec=rec, route={"receiver": "r", "group_wait": "10ms", "group_interval": "10s"}
    ) as (d, _, _db):
        d.put(alert("1"))
        for _ in range(60):
            if rec.sent:
                break
            await asyncio.sleep(0.05)
        assert len(rec.sent) == 1
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
        await asyncio.sleep(0.15)
        assert [len(n.alerts) for n in rec.sent] == [2]
        assert d.hand_over(["fp-a-1-ChatStuck"]) == 1
        await asyncio.sleep(0.5)
        assert [n.status for n in rec.sent] == ["firing"]
        assert "fp-a-1-ChatStuck" not in d.alerts
        (group,) = d.groups.values()
        assert list(group.alerts) == ["fp-a-2-ChatStuck"]
        db.flush()
        assert [b["fingerprint"] for _, _, b in db.dispatch_load()] == ["fp-a-2-ChatStuck"]
