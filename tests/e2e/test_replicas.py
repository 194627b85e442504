"""Many replicas end to end: HA pairs agree on every alert, an Alertmanager cluster (two
real peers) pages once, and shards watch disjoint identities."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.e2e.harness import DaemonProcess, SimProcess, eventually, free_port
from tests.fakes.receivers import FakeWebhook
from watchd.kits.sharding import assignment

StartSim = Callable[..., SimProcess]
AM_BINARY = "/usr/bin/prometheus-alertmanager"
FAST_ROUTE = {
    "group_wait": "1s",
    "group_interval": "1s",
    "repeat_interval": "1h",
    "group_by": ["identity", "alertname", "status"],
}
HA = {"replicas": 2, "replication_factor": 2}


class Replicas:
    """watchd replicas, each with its own directory (config, state, logs)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[DaemonProcess] = []

    def start(
        self,
        sim: SimProcess,
        name: str,
        *,
        identities: list[tuple[str, str]],
        extra: dict[str, Any],
        fresh_state: bool = False,
    ) -> DaemonProcess:
        home = self.tmp / name
        home.mkdir(exist_ok=True)
        state = home / ("state-fresh" if fresh_state else "state")
        d = DaemonProcess(home, sim, identities=identities, extra=extra, state_dir=state)
        d.start()
        self.started.append(d)
        return d

    def stop(self) -> None:
        for d in self.started:
            d.stop()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    r = Replicas(tmp_path)
    yield r
    r.stop()


def by_fingerprint(alerts: list[dict[str, Any]]) -> dict[str, tuple[dict[str, str], float]]:
    return {a["fingerprint"]: (a["labels"], a["starts_at"]) for a in alerts}


async def all_firing(d: DaemonProcess, n: int) -> list[dict[str, Any]] | None:
    alerts = [a for a in await d.firing() if "chat_id" in a["labels"]]
    return alerts if len(alerts) == n else None


async def test_two_replicas_compute_identical_fingerprints_labels_and_starts(
    start_sim: StartSim, replicas: Replicas
) -> None:
    """Two HA replicas on one deployment (one started late, one restarted with no state)
    fire the same fingerprint, labels and startsAt for every stuck chat."""
    sim = start_sim()
    idents = [("team-a", "alice"), ("team-b", "bob")]
    early = [
        await sim.add_chat("alice", status="running", title="old run", age=1.5),
        await sim.add_chat("bob", status="requires_action", title="old ask"),
    ]
    a = replicas.start(sim, "a", identities=idents, extra={"sharding": HA})
    await a.wait_ready()
    late = [
        await sim.add_chat("alice", status="running", title="new run"),
        await sim.add_chat("bob", status="running", title="bob run"),
    ]
    moved = await sim.add_chat("alice", status="waiting", title="moves")
    await sim.set_status(moved, "running")
    # The second replica arrives after every transition: it sees them only in listings.
    b = replicas.start(sim, "b", identities=idents, extra={"sharding": HA})
    await b.wait_ready()
    stuck = [*early, *late, moved]
    fa = await eventually(lambda: all_firing(a, len(stuck)), within=30)
    fb = await eventually(lambda: all_firing(b, len(stuck)), within=30)
    assert sorted(x["labels"]["chat_id"] for x in fa) == sorted(stuck)
    assert by_fingerprint(fa) == by_fingerprint(fb)
    # A restart that lost its state (a new pod without its volume) agrees too.
    b.stop()
    c = replicas.start(sim, "b", identities=idents, extra={"sharding": HA}, fresh_state=True)
    await c.wait_ready()
    fc = await eventually(lambda: all_firing(c, len(stuck)), within=30)
    assert by_fingerprint(fc) == by_fingerprint(fa)


# -- a real Alertmanager cluster: two peers gossiping over loopback ------------------------


class AlertmanagerCluster:
    """Two (or more) prometheus-alertmanager peers on loopback, one webhook behind them."""

    def __init__(self, tmp: Path, webhook_url: str, peers: int = 2) -> None:
        assert os.path.exists(AM_BINARY), "run tests/setup/system-deps (make test does)"
        self.tmp = tmp
        self.cfg = tmp / "am.yml"
        self.cfg.write_text(
            yaml.safe_dump(
                {
                    # One group per chat: each stuck chat is one notification, one resolve.
                    "route": {
                        "receiver": "hook",
                        "group_by": ["identity", "alertname", "chat_id"],
                        "group_wait": "1s",
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
        self.web = [free_port() for _ in range(peers)]
        self.gossip = [free_port() for _ in range(peers)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * peers

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.web]

    def start(self) -> AlertmanagerCluster:
        for i in range(len(self.web)):
            others = [f"--cluster.peer=127.0.0.1:{p}" for j, p in enumerate(self.gossip) if j != i]
            log = (self.tmp / f"am-{i}.log").open("wb")
            self.procs[i] = subprocess.Popen(
                [
                    AM_BINARY,
                    f"--config.file={self.cfg}",
                    f"--storage.path={self.tmp / f'am-data-{i}'}",
                    f"--web.listen-address=127.0.0.1:{self.web[i]}",
                    f"--cluster.listen-address=127.0.0.1:{self.gossip[i]}",
                    f"--cluster.advertise-address=127.0.0.1:{self.gossip[i]}",
                    *others,
                    # Test timings (defaults: 15s, 200ms, 1m, 1m): a peer waits its
                    # position × peer-timeout for the others' notification log before it
                    # sends; gossip and the settle wait are kept short.
                    "--cluster.peer-timeout=1s",
                    "--cluster.gossip-interval=50ms",
                    "--cluster.pushpull-interval=1s",
                    "--cluster.settle-timeout=3s",
                    "--cluster.probe-interval=200ms",
                    "--cluster.reconnect-interval=1s",
                ],
                stdout=log,
                stderr=log,
            )
            log.close()
        return self

    async def peers_seen(self, i: int) -> int:
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(self.urls[i] + "/api/v2/status") as r,
            ):
                if r.status != 200:
                    return 0
                doc = await r.json()
        except (aiohttp.ClientError, OSError):
            return 0
        cluster = doc.get("cluster") or {}
        return len(cluster.get("peers") or []) if cluster.get("status") == "ready" else 0

    async def wait_formed(self) -> None:
        n = len(self.web)
        for i in range(n):
            await eventually(lambda i=i: self._formed(i, n), within=20)  # type: ignore[misc]

    async def _formed(self, i: int, n: int) -> bool:
        proc = self.procs[i]
        assert proc is not None and proc.poll() is None, self.logs()
        return await self.peers_seen(i) == n

    def stop_peer(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.tmp.glob("am-*.log")))


@pytest.fixture
async def hook() -> AsyncIterator[FakeWebhook]:
    h = await FakeWebhook().start()
    yield h
    await h.stop()


@pytest.fixture
def am_cluster(tmp_path: Path, hook: FakeWebhook) -> Iterator[AlertmanagerCluster]:
    home = tmp_path / "am"
    home.mkdir()
    cluster = AlertmanagerCluster(home, hook.hook_url).start()
    yield cluster
    cluster.stop()


def notifications(hook: FakeWebhook, status: str) -> Counter[str]:
    """chat id → how many notifications said it was `status`."""
    return Counter(
        a["labels"]["chat_id"]
        for body in hook.received
        for a in body["alerts"]
        if a["status"] == status and "chat_id" in a["labels"]
    )


async def exactly_once(hook: FakeWebhook, status: str, chats: list[str], *, quiet: float) -> None:
    """Every chat reaches the receiver as `status` once; then, after `quiet` seconds (longer
    than a second peer's wait plus the group interval), still once."""
    await eventually(lambda: all(notifications(hook, status)[c] >= 1 for c in chats), within=25)
    await asyncio.sleep(quiet)
    counts = notifications(hook, status)
    assert {c: counts[c] for c in chats} == dict.fromkeys(chats, 1), hook.received


async def test_ha_pair_through_an_alertmanager_cluster_pages_exactly_once(
    start_sim: StartSim,
    replicas: Replicas,
    hook: FakeWebhook,
    am_cluster: AlertmanagerCluster,
) -> None:
    """Two watchd replicas (replication factor 2) → two peered Alertmanagers → one webhook:
    each stuck chat is one firing and one resolve notification — also after kill -9 of a
    replica, its restart, and with one Alertmanager peer stopped."""
    t0 = time.monotonic()
    await am_cluster.wait_formed()
    sim = start_sim()
    idents = [("team-a", "alice"), ("team-b", "bob")]
    extra = {
        "sharding": HA,
        "receivers": [{"name": "am", "alertmanager": {"urls": am_cluster.urls}}],
        "route": {"receiver": "am", **FAST_ROUTE},
    }
    r0 = replicas.start(sim, "r0", identities=idents, extra=extra)
    r1 = replicas.start(sim, "r1", identities=idents, extra=extra)
    await r0.wait_ready()
    await r1.wait_ready()

    first = [
        await sim.add_chat("alice", status="running", title="one"),
        await sim.add_chat("bob", status="requires_action", title="two"),
        await sim.add_chat("alice", status="running", title="three"),
    ]
    await eventually(lambda: all_firing(r1, 3), within=20)
    await exactly_once(hook, "firing", first, quiet=3)

    # kill -9 one replica mid-run: the other alone still pages for new chats, once.
    r1.kill9()
    second = [await sim.add_chat("bob", status="running", title="four")]
    await exactly_once(hook, "firing", second, quiet=2)
    for chat in first[:2]:
        await sim.set_status(chat, "waiting")
    await exactly_once(hook, "resolved", first[:2], quiet=2)

    # The killed replica comes back on its state: it re-sends what it had firing (and
    # resolves what ended meanwhile); Alertmanager's notification log keeps it silent.
    r1 = replicas.start(sim, "r1", identities=idents, extra=extra)
    await r1.wait_ready()
    await eventually(lambda: all_firing(r1, 2), within=20)
    await asyncio.sleep(3)
    assert all(n == 1 for n in notifications(hook, "firing").values()), hook.received
    assert all(n == 1 for n in notifications(hook, "resolved").values()), hook.received

    # One Alertmanager peer stopped: the survivor notifies, once.
    am_cluster.stop_peer(1)
    third = [await sim.add_chat("alice", status="running", title="five")]
    await exactly_once(hook, "firing", third, quiet=3)
    rest = [first[2], *second, *third]
    for chat in rest:
        await sim.set_status(chat, "waiting")
    await exactly_once(hook, "resolved", [*first[:2], *rest], quiet=2)
    assert set(notifications(hook, "firing")) == set(first + second + third)
    assert time.monotonic() - t0 < 110  # bounded, not a performance assertion: a hang guard


# -- shards -------------------------------------------------------------------------------


async def sim_state(sim: SimProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/__sim/state") as r:
        doc = await r.json()
        assert isinstance(doc, dict)
        return doc


def replica_of(agent: str) -> int:
    """The replica number a watchd User-Agent names (…replica/2-of-3)."""
    return int(agent.rsplit("replica/", 1)[1].split("-of-", 1)[0])


async def test_three_shards_watch_disjoint_identities_and_a_fourth_takes_about_a_quarter(
    start_sim: StartSim, replicas: Replicas
) -> None:
    """Three replicas (factor 1), nine identities: each identity is watched, listed and read
    by exactly its owner (the simulator's request log); with a fourth replica only the
    identities rendezvous hashing gives it move, and their old owners let go."""
    sim = start_sim(scenario="bulk_9")
    idents = [(i["name"], i["username"]) for i in sim.identities]
    user_of = dict(idents)
    assert len(idents) == 9
    three = assignment(user_of, replicas=3)
    daemons = [
        replicas.start(
            sim, f"s{i}", identities=idents, extra={"sharding": {"replicas": 3, "index": i}}
        )
        for i in range(3)
    ]
    for d in daemons:
        await d.wait_ready()

    async def watched_by(table: dict[str, list[int]]) -> bool:
        doc = await sim_state(sim)
        return all(
            [replica_of(a) for a in doc["watching"].get(user_of[n], [])] == owners
            for n, owners in table.items()
        )

    await eventually(lambda: watched_by(three), within=20)
    log = (await sim_state(sim))["requests_by_user"]
    for name, (owner,) in three.items():
        kinds = log[user_of[name]]
        assert set(kinds) >= {"watch", "list"}
        asked_by = {replica_of(agent) for agents in kinds.values() for agent in agents}
        assert asked_by == {owner}, (name, kinds)
    for i, d in enumerate(daemons):
        sh = (await d.status())["sharding"]
        assert sh["replica"] == i and sh["owned"] == sorted(n for n, o in three.items() if i in o)
        assert sh["others"] == {n: o for n, o in sorted(three.items()) if i not in o}
        _, metrics = await d.get("/metrics")
        assert f'watchd_shard_info{{replica="{i}",replicas="3",replication_factor="1"}} 1.0' in (
            metrics
        )
        assert f"watchd_identities_owned {float(len(sh['owned']))}" in metrics
        for name, (owner,) in three.items():
            assert f'watchd_identity_owner{{identity="{name}",replica="{owner}"}} 1.0' in metrics

    # Four replicas: the fourth starts, the three reload (SIGHUP) with replicas: 4.
    four = assignment(user_of, replicas=4)
    moved = sorted(n for n in user_of if four[n] != three[n])
    assert all(four[n] == [3] for n in moved)  # only towards the new replica
    assert 1 <= len(moved) <= 4  # ~9/4; the exact set is fixed by the hash
    for i, d in enumerate(daemons):
        d.config["sharding"] = {"replicas": 4, "index": i}
        d.rewrite(d.config)
        d.signal(signal.SIGHUP)
    fourth = replicas.start(
        sim, "s3", identities=idents, extra={"sharding": {"replicas": 4, "index": 3}}
    )
    await fourth.wait_ready()
    await eventually(lambda: watched_by(four), within=20)
    sh = (await fourth.status())["sharding"]
    assert sh["owned"] == moved


async def test_resharding_hands_alerts_over_without_a_page_or_a_resolve(
    start_sim: StartSim,
    replicas: Replicas,
    hook: FakeWebhook,
    am_cluster: AlertmanagerCluster,
) -> None:
    """One replica grows to two (SIGHUP + a new pod): the identity that moves is handed
    over — no resolve, no second page through Alertmanager — and its new owner resolves it
    once when the chat moves on."""
    await am_cluster.wait_formed()
    sim = start_sim()
    idents = [("team-a", "alice"), ("team-b", "bob")]
    two = assignment([n for n, _ in idents], replicas=2)
    moving = next(n for n, owners in two.items() if owners == [1])
    staying = next(n for n, owners in two.items() if owners == [0])
    routing = {
        "receivers": [{"name": "am", "alertmanager": {"urls": am_cluster.urls}}],
        "route": {"receiver": "am", **FAST_ROUTE},
    }
    r0 = replicas.start(sim, "r0", identities=idents, extra=routing)
    await r0.wait_ready()
    user = dict(idents)
    chats = {n: await sim.add_chat(user[n], status="running", title=n) for n in (moving, staying)}
    await exactly_once(hook, "firing", list(chats.values()), quiet=2)

    r0.config["sharding"] = {"replicas": 2, "index": 0}
    r0.rewrite(r0.config)
    r0.signal(signal.SIGHUP)
    r1 = replicas.start(
        sim, "r1", identities=idents, extra={**routing, "sharding": {"replicas": 2, "index": 1}}
    )
    await r1.wait_ready()
    await eventually(lambda: all_firing(r1, 1), within=20)
    await eventually(lambda: all_firing(r0, 1), within=20)
    (kept,) = await r0.firing()
    assert kept["labels"]["identity"] == staying
    await asyncio.sleep(3)
    assert notifications(hook, "resolved") == Counter(), hook.received
    assert notifications(hook, "firing") == Counter(dict.fromkeys(chats.values(), 1))

    await sim.set_status(chats[moving], "waiting")
    await exactly_once(hook, "resolved", [chats[moving]], quiet=2)
    assert notifications(hook, "resolved")[chats[staying]] == 0
