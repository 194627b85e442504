"""The identities this replica watches: add, remove, and re-plan on reload.

Each identity gets its own health, server clock, rate-limited transport, client
and watcher, and its supervised tasks (watch, reconcile, and when configured quota
and cost). Removing one
stops its tasks *first*, then unregisters it from the detector, so a changed
identity is restarted stop-then-start and never runs twice. A reload computes a
plan (removed, added, changed) from the old and new configuration; applying it
keeps clocks and firing alerts for identities whose deployment stays the same.
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from watchd.alerting.dispatch import Dispatcher
from watchd.coder.client import CoderClient
from watchd.coder.transport import USER_AGENT, Transport
from watchd.config import secrets
from watchd.config.model import Config
from watchd.config.secrets import ResolvedSecrets
from watchd.config.watching import IdentityConfig
from watchd.daemon.metrics import Metrics
from watchd.daemon.supervisor import Supervisor
from watchd.detection.detector import Detector
from watchd.kits import logs, tls
from watchd.kits.clock import ServerClock, WallClock
from watchd.kits.ratelimit import RateLimiter
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.rows import ChatRows
from watchd.store.sqlite import StateFile
from watchd.telemetry.events import EventSink, own_source
from watchd.watching.costs import ALERTNAME as TREE_COST
from watchd.watching.costs import TreeCosts
from watchd.watching.forecasting import QuotaForecast, forecast_fingerprint
from watchd.watching.quota import QuotaWatcher
from watchd.watching.readings import ReadingBook
from watchd.watching.settings import WatchSettings
from watchd.watching.watcher import IdentityWatcher

log = logs.get("watchd.daemon")

# How many identities may list at once: after a Coder restart, 50 watchers must not
# all list in the same second.
CONCURRENT_LISTINGS = 4


def reread_token(ident: IdentityConfig) -> str:
    """The identity's token read again from its reference (a rotated file, a new env)."""
    return secrets.resolve(
        file=ident.token_file,
        env=ident.token_env,
        credential=ident.token_credential,
        what=f"identity {ident.name}",
    )


def announce_owned(config: Config, index: int, owned: list[IdentityConfig]) -> None:
    """Log which identities replica ``index`` watches, at start."""
    log.info(
        "sharding.owned",
        replica=index,
        replicas=config.sharding.replicas,
        replication_factor=config.sharding.replication_factor,
        identities=[i.name for i in owned],
        others=len(config.identities) - len(owned),
    )


def user_agent(replicas: int, index: int) -> str:
    """The Coder-facing User-Agent; with replicas it names this one, so Coder's logs
    (and the simulator's request log) say which replica asked."""
    if replicas == 1:
        return USER_AGENT
    return f"{USER_AGENT} replica/{index}-of-{replicas}"


@dataclass(frozen=True)
class Plan:
    """What a reload does to the running identities."""

    removed: list[str]
    added: list[str]
    changed: list[str]
    handed_over: frozenset[str]  # removed here but still configured: another replica's now


def plan(
    old: tuple[Config, ResolvedSecrets, list[IdentityConfig]],
    new: tuple[Config, ResolvedSecrets, list[IdentityConfig]],
) -> Plan:
    """Compare the owned identities before and after a reload (config, secrets, owned)."""
    (old_cfg, old_sec, old_owned), (new_cfg, new_sec, new_owned) = old, new
    before = {i.name: i for i in old_owned}
    after = {i.name: i for i in new_owned}
    removed = sorted(before.keys() - after.keys())
    changed = sorted(
        n
        for n in before.keys() & after.keys()
        if before[n] != after[n]
        or old_cfg.budgets_for(before[n]) != new_cfg.budgets_for(after[n])
        or old_sec.tokens[n].get_secret_value() != new_sec.tokens[n].get_secret_value()
    )
    configured = {i.name for i in new_cfg.identities}
    return Plan(
        removed=removed,
        added=sorted(after.keys() - before.keys()),
        changed=changed,
        handed_over=frozenset(n for n in removed if n in configured),
    )


class Identities:
    """Health and watcher per running identity, and the tasks that run them."""

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        store: ChatStore,
        db: StateFile,
        detector: Detector,
        metrics: Metrics,
        events: EventSink,
        clock: WallClock,
    ) -> None:
        self.supervisor = supervisor
        self.clock = clock
        self.store = store
        self.db = db
        self.readings = db.part(ReadingBook)
        self.detector = detector
        self.metrics = metrics
        self.events = events
        self.health: dict[str, IdentityHealth] = {}
        self.watchers: dict[str, IdentityWatcher] = {}
        self.session: aiohttp.ClientSession | None = None
        self.dispatcher: Dispatcher | None = None
        self._gate = asyncio.Semaphore(CONCURRENT_LISTINGS)
        self._contexts: dict[tuple[str, int, int], ssl.SSLContext] = {}

    def add(
        self,
        ident: IdentityConfig,
        *,
        token: str,
        config: Config,
        settings: WatchSettings,
        user_agent: str,
    ) -> None:
        """Start watching ``ident``: its watch, reconcile and (if enabled) quota tasks."""
        assert self.session is not None, "identities start after the HTTP session opens"
        name = ident.name
        clock = ServerClock(self.clock)
        self.metrics.identity_added(name)
        health = IdentityHealth(
            name=name,
            deployment=ident.url,
            server_clock=clock,
            unhealthy_after=ident.unhealthy_after,
            on_listing=self.metrics.listing.labels(name).observe,
            on_confirmation=self.metrics.confirmation.labels(name).observe,
        )
        transport = self._transport(ident, token=token, clock=clock, user_agent=user_agent)
        client = CoderClient(transport, page_size=ident.page_size)
        watcher = IdentityWatcher(
            health=health,
            client=client,
            store=self.store,
            changes=self.detector,
            listing_gate=self._gate,
            settings=settings,
            token_provider=lambda: reread_token(ident),
            rng=random.Random(),
        )
        self.health[name] = health
        self.watchers[name] = watcher
        self.detector.register(
            health,
            confirmer=watcher.rereads,
            budgets=config.budgets_for(ident),
            labels=ident.labels,
        )
        sup = self.supervisor
        sup.spawn(f"watch:{name}", watcher.watch_forever, group="watchers", restart=True)
        sup.spawn(f"reconcile:{name}", watcher.reconcile_forever, group="watchers", restart=True)
        if config.quota.enabled:
            self._start_quota(name, health, client, config, ident)
        if config.cost.enabled:
            costs = TreeCosts(
                health=health,
                client=client,
                store=self.store,
                alerts=self.detector.ledger,
                config=config.cost,
                labels=ident.labels,
            )
            sup.spawn(f"cost:{name}", costs.run, group="watchers", restart=True)
        else:
            # Turned off (perhaps while the daemon was down): nothing would resolve them.
            for fp, alert in self.detector.ledger.of_identity(name):
                if alert.name == TREE_COST:
                    self.detector.ledger.clear_alert(fp, why="the cost alert is turned off")
        if not (config.quota.enabled and config.forecast.enabled):
            # Turned off (perhaps while the daemon was down): a forecast firing from
            # before would otherwise never resolve.
            fp = forecast_fingerprint(ident.url, name)
            self.detector.ledger.clear_alert(fp, why="the quota forecast is turned off")

    def _transport(
        self, ident: IdentityConfig, *, token: str, clock: ServerClock, user_agent: str
    ) -> Transport:
        """The identity's way to Coder: the shared session, its own limiter and trust."""
        assert self.session is not None
        return Transport(
            base_url=ident.url,
            token=token,
            session=self.session,
            identity=ident.name,
            events=self.events,
            source=own_source(ident.name),
            server_clock=clock,
            limiter=RateLimiter(
                rate=ident.requests_per_minute / 60.0, burst=max(5, ident.requests_per_minute // 10)
            ),
            user_agent=user_agent,
            meter=self.metrics.coder,
            ssl=self._trust(ident.ca_file) if ident.ca_file else None,
        )

    def _trust(self, ca_file: str) -> ssl.SSLContext:
        """The context for ``ca_file`` (checked when the config was read): one per file
        and content, so identities trusting the same CA share the pool's connections
        (the context is part of its key), and a CA rotated in place is read anew."""
        try:
            st = os.stat(ca_file)
        except OSError:
            return tls.trust(ca_file)  # raises, naming the file and why
        key = (ca_file, st.st_mtime_ns, st.st_size)
        if key not in self._contexts:
            self._contexts = {k: v for k, v in self._contexts.items() if k[0] != ca_file}
            self._contexts[key] = tls.trust(ca_file)
        return self._contexts[key]

    def _start_quota(
        self,
        name: str,
        health: IdentityHealth,
        client: CoderClient,
        config: Config,
        ident: IdentityConfig,
    ) -> None:
        forecast = (
            QuotaForecast(
                health=health,
                alerts=self.detector.ledger,
                config=config.forecast,
                labels=ident.labels,
                book=self.readings,
            )
            if config.forecast.enabled
            else None
        )
        poller = QuotaWatcher(
            health=health,
            client=client,
            alerts=self.detector.ledger,
            config=config.quota,
            labels=dict(ident.labels),
            forecast=forecast,
        )
        self.supervisor.spawn(f"quota:{name}", poller.run, group="watchers", restart=True)

    async def remove(self, name: str, *, forget: bool, hand_over: bool = False) -> None:
        """Stop the identity's tasks, then unregister it (its alerts resolve only when it
        is forgotten here and not handed over to another replica)."""
        await self.supervisor.stop(f"watch:{name}")
        await self.supervisor.stop(f"reconcile:{name}")
        await self.supervisor.stop(f"quota:{name}")
        await self.supervisor.stop(f"cost:{name}")
        await self.detector.unregister(
            name, reason="identity removed from config", resolve=forget and not hand_over
        )
        if hand_over:
            dropped = self.detector.ledger.hand_over(name)
            if self.dispatcher is not None:
                self.dispatcher.hand_over(dropped)
            log.info("sharding.handed_over", identity=name, alerts=len(dropped))
        self.health.pop(name, None)
        self.watchers.pop(name, None)
        if forget:
            self.store.drop_identity(name)
            self.db.part(ChatRows).forget(name)
            self.readings.forget(name)

    async def apply(
        self,
        p: Plan,
        *,
        before: dict[str, IdentityConfig],
        after: dict[str, IdentityConfig],
        restart_all: bool,
        start: Callable[[IdentityConfig], None],
    ) -> None:
        """Carry out a reload's plan; ``restart_all`` restarts the unchanged ones too
        (settings every watcher reads at start changed). Same deployment: clocks and
        firing alerts are kept."""
        for name in p.removed:
            await self.remove(name, forget=True, hand_over=name in p.handed_over)
            self.metrics.identity_removed(name)
        for name in p.changed:
            await self.remove(name, forget=before[name].url != after[name].url)
            start(after[name])
        for name in p.added:
            start(after[name])
        if restart_all:
            for name in sorted(before.keys() & after.keys()):
                if name not in p.changed:
                    await self.remove(name, forget=False)
                    start(after[name])
